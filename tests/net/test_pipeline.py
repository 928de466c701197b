"""The request pipeline both front doors share: versions, guards, error mapping, counts."""

from __future__ import annotations

import logging

import pytest

from logmq.errors import ErrorCode, LogMQError
from logmq.net.codec import Request
from logmq.net.pipeline import ConnectionContext, FrontDoor, RequestPipeline
from logmq.net.reply import Reply


class Counts:
    def __init__(self) -> None:
        self.errors: list[tuple[int, int, str]] = []
        self.failures: list[tuple[str, int]] = []

    def error(self, api_key: int, code: int, listener: str = "native") -> None:
        self.errors.append((api_key, int(code), listener))

    def handler_failed(self, listener: str, api_key: int) -> None:
        self.failures.append((listener, api_key))


def request(api_key: int, version: int = 0) -> Request:
    req = Request(api_key, version, 9, "test-client", {}, memoryview(b""), "127.0.0.1")
    req.context = ConnectionContext("127.0.0.1:5", "127.0.0.1", "door")
    return req


def pipeline(handlers, versions=None, unknown_api=ErrorCode.UNSUPPORTED_VERSION):
    counts = Counts()
    door = FrontDoor(
        "door",
        handlers,
        versions if versions is not None else dict.fromkeys(handlers, (0, 2)),
        lambda req, code, message: Reply({"error": int(code), "message": message}),
        unknown_api=unknown_api,
    )
    return RequestPipeline(door, counts), counts


async def ok(req: Request) -> Reply:
    return Reply({"error": 0, "who": req.context.principal})


async def test_a_served_request_reaches_its_handler_with_its_context():
    p, counts = pipeline({1: ok})
    reply = await p(request(1, 2))
    assert reply.body == {"error": 0, "who": "User:ANONYMOUS"}
    assert counts.errors == []


@pytest.mark.parametrize(
    ("api_key", "version", "code"),
    [(7, 0, ErrorCode.UNKNOWN_API), (1, 3, ErrorCode.UNSUPPORTED_VERSION)],
)
async def test_unserved_apis_and_versions_are_refused_and_counted(api_key, version, code):
    p, counts = pipeline({1: ok}, unknown_api=ErrorCode.UNKNOWN_API)
    reply = await p(request(api_key, version))
    assert reply.body["error"] == code
    assert counts.errors == [(api_key, int(code), "door")]


async def test_guards_run_in_order_for_their_apis_and_may_answer():
    seen = []

    async def prepare(req):
        seen.append(("prepare", req.api_key))

    async def forward(req):
        seen.append(("forward", req.api_key))
        return Reply({"error": 0, "forwarded": True})

    p, _ = pipeline({1: ok, 2: ok})
    p.add_guard(prepare)
    p.add_guard(forward, [2])
    assert (await p(request(1))).body["who"] == "User:ANONYMOUS"
    assert (await p(request(2))).body == {"error": 0, "forwarded": True}
    assert seen == [("prepare", 1), ("prepare", 2), ("forward", 2)]


async def test_a_logmq_error_is_the_doors_answer_with_its_code():
    async def refuse(req):
        raise LogMQError("no such topic", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)

    p, counts = pipeline({1: refuse})
    reply = await p(request(1))
    assert reply.body == {"error": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "message": "no such topic"}
    assert counts.errors == [(1, int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), "door")]
    assert counts.failures == []


async def test_a_handler_fault_is_logged_with_its_traceback_counted_and_answered(caplog):
    async def broken(req):
        raise KeyError("oops")

    p, counts = pipeline({1: broken})
    with caplog.at_level(logging.ERROR, logger="logmq.net"):
        reply = await p(request(1))
    assert reply.body["error"] == ErrorCode.UNKNOWN_SERVER_ERROR
    assert counts.failures == [("door", 1)]
    record = next(r for r in caplog.records if r.levelno == logging.ERROR)
    assert record.exc_info is not None and "test-client" in record.getMessage()


class Measured:
    """An after-step that records what it was given."""

    def __init__(self, on: bool = True) -> None:
        self.on = on
        self.seen: list[float] = []

    def active(self) -> bool:
        return self.on

    def __call__(self, req, reply, seconds):
        self.seen.append(seconds)
        return reply


async def test_the_after_step_gets_the_handlers_time_on_the_loop_not_its_waits():
    import asyncio
    import time

    async def parked(req: Request) -> Reply:
        deadline = time.perf_counter() + 0.02
        while time.perf_counter() < deadline:  # 20 ms of work
            pass
        await asyncio.sleep(0.3)  # a long poll: waiting, not working
        return Reply({"error": 0})

    p, _ = pipeline({1: parked})
    p.door.after = Measured()
    await p(request(1))
    [seconds] = p.door.after.seen
    assert 0.02 <= seconds < 0.3


async def test_a_cancelled_handler_is_cancelled_through_the_measurement():
    import asyncio

    started = asyncio.Event()
    cancelled = []

    async def slow(req: Request) -> Reply:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return Reply({"error": 0})

    p, _ = pipeline({1: slow})
    p.door.after = Measured()
    task = asyncio.ensure_future(p(request(1)))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled == [True] and p.door.after.seen == []


async def test_an_inactive_after_step_is_skipped():
    p, _ = pipeline({1: ok})
    p.door.after = Measured(on=False)
    await p(request(1))
    assert p.door.after.seen == []
