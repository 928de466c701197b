"""ListOffsets by timestamp answers the first record (in offset order) at or after it."""

from __future__ import annotations

import random

from logmq.storage import batch as b
from tests.net.raw_client import RawClient


def batch_with_times(times: list[int]) -> bytes:
    return b.encode_batch([(ts, None, b"r%d" % i, None) for i, ts in enumerate(times)])


def expected(records: list[int], target: int) -> tuple[int, int]:
    for offset, ts in enumerate(records):
        if ts >= target:
            return offset, ts
    return -1, -1


async def lookup(client: RawClient, target: int) -> tuple[int, int]:
    r = await client.list_offset("t", 0, target)
    assert r["error"] == 0, r
    return r["offset"], r["timestamp"]


async def test_finds_the_record_not_the_batch(inproc_broker):
    async with await RawClient.connect(inproc_broker.port) as c:
        await c.create_topic("t", 1)
        # offsets 0-3 (non-monotonic CreateTime), then 4-6 whose first records are older
        await c.produce("t", 0, batch_with_times([100, 50, 300, 200]))
        await c.produce("t", 0, batch_with_times([10, 20, 1_000]))
        assert await lookup(c, 60) == (0, 100)
        assert await lookup(c, 100) == (0, 100)
        assert await lookup(c, 150) == (2, 300)
        assert await lookup(c, 250) == (2, 300)
        assert await lookup(c, 301) == (6, 1_000)
        assert await lookup(c, 1_000) == (6, 1_000)
        assert await lookup(c, 1_001) == (-1, -1)
        assert await lookup(c, 0) == (0, 100)


async def test_matches_a_model_over_many_segments(inproc_broker):
    rng = random.Random(7)
    records: list[int] = []
    async with await RawClient.connect(inproc_broker.port) as c:
        await c.create_topic("t", 1, {"segment.bytes": "2048", "index.interval.bytes": "256"})
        clock = 1_000
        for _ in range(60):
            times = []
            for _ in range(rng.randint(1, 8)):
                clock += rng.randint(0, 50)
                times.append(clock - rng.randint(0, 200))  # producers' clocks disagree
            r = await c.produce("t", 0, batch_with_times(times))
            assert r["error"] == 0 and r["base_offset"] == len(records)
            records.extend(times)
        targets = [rng.randint(min(records) - 10, max(records) + 10) for _ in range(80)]
        for target in [*targets, min(records), max(records)]:
            assert await lookup(c, target) == expected(records, target), target


async def test_log_append_time_topics_answer_the_append_time(inproc_broker):
    async with await RawClient.connect(inproc_broker.port) as c:
        await c.create_topic("t", 1, {"message.timestamp.type": "LogAppendTime"})
        r = await c.produce("t", 0, batch_with_times([5, 1, 3]))
        appended = r["log_append_time"]
        assert appended > 1_000_000
        assert await lookup(c, 2) == (0, appended)
        assert await lookup(c, appended) == (0, appended)
        assert await lookup(c, appended + 1) == (-1, -1)
