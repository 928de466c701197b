"""The asyncio server shell with a scripted handler: ordering, limits, bad input, sendfile."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any

import pytest

from logmq.errors import ErrorCode, InvalidFrameError
from logmq.net.codec import SIZE, Request, encode_response_head
from logmq.net.connection import UNKNOWN_CORRELATION_ID
from logmq.net.reply import Reply
from logmq.net.server import SENDFILE_MIN_BYTES, SENDFILE_MIN_REGION, ServerOptions, TcpServer
from logmq.net.wire import NativeWire
from logmq.storage.segment import FileSlice
from tests.harness import wait_until
from tests.net.raw_client import RawClient

ECHO, GATED, FILE = 100, 101, 102


@dataclass
class Region:
    file: Any
    position: int
    length: int

    def read(self) -> bytes:
        self.file.seek(self.position)
        return self.file.read(self.length)


class Script:
    """Handler: echo, wait on a gate, or answer with a file region."""

    def __init__(self, path=None):
        self.gate = asyncio.Event()
        self.seen: list[int] = []
        self.file = open(path, "rb") if path else None  # noqa: SIM115

    async def __call__(self, req: Request) -> Reply | None:
        self.seen.append(req.correlation_id)
        if req.api_key == GATED:
            await self.gate.wait()
        if req.api_key == FILE:
            pos, length = req.body["pos"], req.body["len"]
            return Reply({"n": length}, [b"<", Region(self.file, pos, length), b">"])
        if req.body.get("noreply"):
            return None
        return Reply(req.body, [bytes(req.tail)] if len(req.tail) else [])


async def start(handler, **opts) -> TcpServer:
    opts.setdefault("max_frame_size", 1 << 20)
    server = TcpServer(handler, ServerOptions(**opts))
    await server.start("127.0.0.1", 0)
    return server


async def test_pipelined_requests_are_answered_in_order():
    script = Script()
    server = await start(script)
    try:
        async with await RawClient.connect(server.port) as c:
            c.send(GATED, {"i": 0})
            for i in range(1, 20):
                c.send(ECHO, {"i": i}, [bytes([i]) * i])
            c.send(ECHO, {"noreply": True})  # e.g. acks=0: no answer, order unaffected
            c.send(ECHO, {"i": 20})
            await wait_until(lambda: script.seen, what="first request")
            script.gate.set()
            got = [(await c.recv()) for _ in range(21)]
        assert [r.body["i"] for r in got] == list(range(21))
        assert [bytes(r.tail) for r in got[1:20]] == [bytes([i]) * i for i in range(1, 20)]
    finally:
        await server.stop(5)


async def test_stops_reading_when_too_many_requests_are_queued():
    script = Script()
    server = await start(script, max_in_flight=2)
    try:
        async with await RawClient.connect(server.port) as c:
            for i in range(50):
                c.send(GATED, {"i": i}, [b"x" * 10_000])
            await wait_until(lambda: server._connections, what="connection")
            (conn,) = server._connections
            await wait_until(lambda: not conn._reading, what="reading paused")
            assert len(script.seen) == 1  # the worker is blocked on the first one
            script.gate.set()
            got = [(await c.recv()).body["i"] for _ in range(50)]
            assert got == list(range(50))
            await wait_until(lambda: conn._reading, what="reading resumed")
    finally:
        await server.stop(5)


async def test_bad_frame_gets_error_and_connection_keeps_working():
    server = await start(Script())
    try:
        async with await RawClient.connect(server.port) as c:
            # header with correlation id 77 and a client id length running past the frame
            c.send_raw(SIZE.pack(12) + bytes.fromhex("0003 0000 0000004d ffff") + b"xx")
            resp = await c.recv()
            assert resp.correlation_id == 77
            assert resp.body["error"] == ErrorCode.INVALID_FRAME
            assert (await c.call(ECHO, {"ok": 1})).body == {"ok": 1}
    finally:
        await server.stop(5)


async def test_oversize_frame_closes_only_that_connection():
    server = await start(Script())
    try:
        async with await RawClient.connect(server.port) as good:
            async with await RawClient.connect(server.port) as bad:
                bad.send_raw(SIZE.pack(0xFFFFFFFF) + b"\x00" * 16)  # announces 4 GiB
                resp = await bad.recv()
                assert resp.body["error"] == ErrorCode.REQUEST_TOO_LARGE
                assert resp.correlation_id == UNKNOWN_CORRELATION_ID
                async with asyncio.timeout(10):
                    assert await bad.reader.read() == b""  # closed by the broker
            assert (await good.call(ECHO, {"still": "served"})).body == {"still": "served"}
    finally:
        await server.stop(5)


UNANSWERABLE = 103


class _Refused(InvalidFrameError):
    def __init__(self) -> None:
        super().__init__("refused at decode")
        self.api_key, self.api_version = UNANSWERABLE, 0


class UnanswerableWire(NativeWire):
    """A door that cannot encode any answer to an UNANSWERABLE request, neither the
    reply nor the error answer in its place (as the Kafka door's error answers to
    CreateDelegationToken v1+ once could not be)."""

    def decode_request(self, frame: memoryview) -> Request:
        req = super().decode_request(frame)
        if req.api_key == UNANSWERABLE and req.body.get("refuse"):
            raise _Refused()
        return req

    def encode_head(self, request: Request, reply: Reply, tail_len: int) -> bytes:
        if request.api_key == UNANSWERABLE:
            raise TypeError("this reply cannot be encoded")
        return super().encode_head(request, reply, tail_len)

    def encode_error(self, error) -> bytes | None:
        if error.api_key == UNANSWERABLE:
            raise AttributeError("nor can its error answer")
        return super().encode_error(error)


@pytest.mark.parametrize("refused", [True, False], ids=["refused-at-decode", "handler-reply"])
async def test_an_answer_that_cannot_be_encoded_closes_the_connection_cleanly(refused, caplog):
    """The answers before it arrive, then the connection closes (the client retries
    what it has pending); the writer does not die leaving the connection open with the
    requests behind it unanswered, and the server goes on serving."""
    server = TcpServer(Script(), ServerOptions(max_frame_size=1 << 20), wire=UnanswerableWire())
    await server.start("127.0.0.1", 0)
    try:
        with caplog.at_level(logging.ERROR, logger="logmq.net"):
            async with await RawClient.connect(server.port) as c:
                c.send(ECHO, {"i": 1})
                c.send(UNANSWERABLE, {"refuse": refused})
                c.send(ECHO, {"i": 3})
                assert (await c.recv()).body == {"i": 1}
                async with asyncio.timeout(10):
                    assert await c.reader.read() == b""  # closed, not left hanging
        assert "the answer could not be written; closing the connection" in caplog.text
        await wait_until(lambda: server.connection_count == 0, what="connection forgotten")
        async with await RawClient.connect(server.port) as c:
            assert (await c.call(ECHO, {"still": "served"})).body == {"still": "served"}
    finally:
        await server.stop(5)


async def test_idle_connections_are_closed():
    server = await start(Script(), idle_timeout_s=0.2)
    try:
        async with await RawClient.connect(server.port) as c:
            assert (await c.call(ECHO, {"a": 1})).body == {"a": 1}
            async with asyncio.timeout(10):
                assert await c.reader.read() == b""
        await wait_until(lambda: server.connection_count == 0, what="connection forgotten")
    finally:
        await server.stop(5)


async def test_connection_limit():
    server = await start(Script(), max_connections=1)
    try:
        async with await RawClient.connect(server.port) as first:
            assert (await first.call(ECHO, {"a": 1})).body == {"a": 1}
            async with await RawClient.connect(server.port) as second:
                resp = await second.recv()
                assert resp.body["error"] == ErrorCode.TOO_MANY_CONNECTIONS
                async with asyncio.timeout(10):
                    assert await second.reader.read() == b""
            assert (await first.call(ECHO, {"b": 2})).body == {"b": 2}
    finally:
        await server.stop(5)


async def test_stop_answers_queued_requests_first():
    script = Script()
    server = await start(script)
    async with await RawClient.connect(server.port) as c:
        c.send(GATED, {"i": 0})
        c.send(ECHO, {"i": 1})
        await wait_until(lambda: script.seen, what="request started")
        stopping = asyncio.ensure_future(server.stop(10))
        await wait_until(
            lambda: not server._connections or all(x._draining for x in server._connections),
            what="draining",
        )
        script.gate.set()
        assert [(await c.recv()).body["i"] for _ in range(2)] == [0, 1]
        await stopping


@pytest.mark.parametrize("zero_copy", [True, False])
async def test_file_regions_arrive_intact_and_in_order(
    tmp_path, monkeypatch, sendfile_calls, zero_copy
):
    data = os.urandom(6 << 20)
    path = tmp_path / "segment"
    path.write_bytes(data)
    sent = sendfile_calls
    real_read = Region.read
    if zero_copy:
        # the proof: a big region's bytes may never be read into Python on this path
        # (responses under SENDFILE_MIN_BYTES are read and written: cheaper than sendfile)
        def no_read(self):
            if self.length >= SENDFILE_MIN_BYTES:
                raise AssertionError("zero-copy path read the file into Python")
            return real_read(self)

        monkeypatch.setattr(Region, "read", no_read)
    script = Script(path)
    server = await start(script, zero_copy=zero_copy, socket_buffer_bytes=64 << 10)
    try:
        async with await RawClient.connect(server.port) as c:
            for pos, length in [(0, 10), (1000, len(data) - 1000), (5, 1 << 20)]:
                c.send(FILE, {"pos": pos, "len": length})
                c.send(ECHO, {"after": pos})
            for pos, length in [(0, 10), (1000, len(data) - 1000), (5, 1 << 20)]:
                resp = await c.recv()
                assert bytes(resp.tail) == b"<" + data[pos : pos + length] + b">"
                assert (await c.recv()).body == {"after": pos}
    finally:
        await server.stop(5)
        script.file.close()
    if zero_copy:
        assert sum(sent) == len(data) - 1000 + (1 << 20)  # not the 10-byte region
        assert len(sent) > 3  # the socket filled up: the EAGAIN/add_writer path ran
    else:
        assert sent == []


async def test_client_vanishing_mid_sendfile_harms_nobody(tmp_path):
    path = tmp_path / "segment"
    path.write_bytes(os.urandom(16 << 20))
    script = Script(path)
    server = await start(script, socket_buffer_bytes=64 << 10)
    try:
        quitter = await RawClient.connect(server.port)
        quitter.send(FILE, {"pos": 0, "len": 16 << 20})
        await wait_until(lambda: script.seen, what="request started")
        quitter.writer.transport.abort()  # reset, with most of the response unsent
        await wait_until(lambda: server.connection_count == 0, what="connection released")
        async with await RawClient.connect(server.port) as c:
            assert (await c.call(ECHO, {"ok": True})).body == {"ok": True}
    finally:
        await server.stop(5)
        script.file.close()


# Tails mixing encoded bytes and file regions in any order (what a Kafka fetch response,
# struct bytes between partitions' records, needs). ("r", pos, len) is a region of the file.
LAYOUTS = {
    "bytes-region-bytes-region-bytes": [
        b"head",
        ("r", 0, 300_000),
        bytearray(b"between"),
        ("r", 500_000, 200_000),
        memoryview(b"end"),
    ],
    "region-region-bytes": [("r", 7, 100_000), ("r", 0, 100_000), b"only-bytes-last"],
    "small-mix-buffered": [b"a", ("r", 3, 10), b"b", ("r", 20, 5), b"c"],
    # a fetch over many small partitions: small regions copied, the big one sent
    "many-small-regions-and-a-big-one": [
        *(("r", 9_000 * i, 4_000 + i) for i in range(40)),
        b"mid",
        ("r", 400_000, 300_000),
        *(("r", 800_000 + 5_000 * i, 3_000) for i in range(10)),
    ],
}


@pytest.mark.parametrize("zero_copy", [True, False])
@pytest.mark.parametrize("layout", LAYOUTS)
async def test_interleaved_bytes_and_regions_arrive_in_order(
    tmp_path, monkeypatch, sendfile_calls, layout, zero_copy
):
    """The real writer over loopback: the received byte stream is the parts, in order."""
    data = os.urandom(1 << 20)
    path = tmp_path / "segment"
    path.write_bytes(data)
    sent = sendfile_calls
    spec = LAYOUTS[layout]
    with open(path, "rb") as f:
        tail = [FileSlice(f, p[1], p[2]) if isinstance(p, tuple) else p for p in spec]
        expected_tail = b"".join(
            data[p[1] : p[1] + p[2]] if isinstance(p, tuple) else bytes(p) for p in spec
        )
        # regions under SENDFILE_MIN_REGION are read and written with the bytes around
        region_bytes = sum(
            p[2] for p in spec if isinstance(p, tuple) and p[2] >= SENDFILE_MIN_REGION
        )

        async def handler(req: Request) -> Reply:
            return Reply({"layout": layout}, tail)

        server = await start(handler, zero_copy=zero_copy, socket_buffer_bytes=64 << 10)
        try:
            async with await RawClient.connect(server.port) as c:
                for _ in range(2):  # a second response proves the first ended exactly
                    corr = c.send(ECHO, {})
                    head = encode_response_head(corr, {"layout": layout}, len(expected_tail))
                    expected = head + expected_tail
                    async with asyncio.timeout(30):
                        got = await c.reader.readexactly(len(expected))
                    assert got == expected
        finally:
            await server.stop(5)
    if zero_copy and len(expected_tail) >= SENDFILE_MIN_BYTES:
        assert sum(sent) == 2 * region_bytes  # every region went file -> socket
    else:
        assert sent == []
