"""Pipelined produces to a topic that does not exist yet keep their order (issue 12).

The first produce to an unknown topic auto-creates it on the controller; produces that
arrive while that runs must wait behind it and append in arrival order. (Before the
fix, each request raced its own CreateTopics: some were answered TOPIC_ALREADY_EXISTS
before the topic reached the broker's image and failed with UNKNOWN_TOPIC_OR_PARTITION,
and the others resumed in whatever order their creations returned.)
"""

from __future__ import annotations

from logmq.net.codec import ApiKey
from logmq.storage import batch as b
from tests.harness import inprocess_broker
from tests.net.raw_client import RawClient, fetch_body, produce_body

REQUESTS = 60


def values(data: bytes) -> list[bytes]:
    out = []
    for pos, _h in b.iter_headers(data):
        out.extend(val for _off, _ts, _k, val, _hd in b.decode_records(data, pos))
    return out


async def test_pipelined_produces_to_an_auto_created_topic_append_in_arrival_order(tmp_path):
    async with (
        inprocess_broker(tmp_path / "d", auto_create_topics=True, default_partitions=1) as br,
        await RawClient.connect(br.port) as c,
    ):
        sent = []
        for i in range(REQUESTS):
            batch = b.encode_values([b"%d" % i], timestamp=1_000)
            sent.append(c.send(ApiKey.PRODUCE, produce_body("fresh", {0: batch}), [batch]))
        acked = []
        for corr in sent:
            resp = await c.recv()
            assert resp.correlation_id == corr
            (part,) = resp.body["topics"][0]["partitions"]
            assert part["error"] == 0, part
            acked.append(part["base_offset"])
        assert acked == list(range(REQUESTS))  # offsets in the order the requests came
        resp = await c.call(ApiKey.FETCH, fetch_body({"fresh": [(0, 0, 1 << 20)]}))
        assert values(bytes(resp.tail)) == [b"%d" % i for i in range(REQUESTS)]


async def test_pending_topics_release_waiters_in_order_and_skip_cancelled_ones():
    import asyncio

    from logmq.broker.metadata.topic_creation import PendingTopics

    created = asyncio.Event()

    async def create(topic: str) -> None:
        await created.wait()

    pending = PendingTopics(create)
    order: list[int] = []

    async def produce(i: int) -> None:
        await pending.wait("t")
        order.append(i)

    tasks = [asyncio.create_task(produce(i)) for i in range(5)]
    await asyncio.sleep(0)  # all five queued behind the creation
    assert pending.waiting("t")
    tasks[2].cancel()
    created.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert order == [0, 1, 3, 4]
    assert not pending.waiting("t")


async def test_a_request_to_a_new_and_an_existing_topic_keeps_both_in_order(tmp_path):
    """The existing topic's appends are written at once and the new topic's wait for
    its creation (produce_path.append_all): each topic's records stay in arrival order,
    and idempotent sequences on the existing one prove no append overtook another."""
    async with (
        inprocess_broker(tmp_path / "d", auto_create_topics=True, default_partitions=1) as br,
        await RawClient.connect(br.port) as c,
    ):
        await c.create_topic("old", 1)
        resp = await c.call(ApiKey.INIT_PRODUCER_ID, {"producer_id": -1, "producer_epoch": -1})
        pid = resp.body["producer_id"]
        sent = []
        for i in range(REQUESTS):
            fresh = b.encode_values([b"%d" % i], timestamp=1_000)
            old = b.encode_values(
                [b"%d" % i], timestamp=1_000, producer_id=pid, producer_epoch=0, base_sequence=i
            )
            body = produce_body("fresh", {0: fresh})
            body["topics"].append(
                {"topic": "old", "partitions": [{"partition": 0, "size": len(old)}]}
            )
            sent.append(c.send(ApiKey.PRODUCE, body, [fresh, old]))
        acked: dict[str, list[int]] = {"fresh": [], "old": []}
        for corr in sent:
            resp = await c.recv()
            assert resp.correlation_id == corr
            for t in resp.body["topics"]:
                (part,) = t["partitions"]
                assert part["error"] == 0, (t["topic"], part)
                acked[t["topic"]].append(part["base_offset"])
        assert acked == {"fresh": list(range(REQUESTS)), "old": list(range(REQUESTS))}
        for topic in ("fresh", "old"):
            resp = await c.call(ApiKey.FETCH, fetch_body({topic: [(0, 0, 1 << 20)]}))
            assert values(bytes(resp.tail)) == [b"%d" % i for i in range(REQUESTS)]
