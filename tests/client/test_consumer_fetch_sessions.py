"""The native consumer's fetch sessions against a real broker (issue 16).

The consumer names every partition once, then only those whose position moved; the
broker answers with only the partitions that have something new. What went over the
wire is read from the consumer's own connection, the broker's side from its metrics.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from typing import Any

from logmq.client import AsyncAdmin, AsyncConsumer, AsyncProducer
from logmq.net.codec import ApiKey
from tests.harness import free_port

PARTS = 300


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def gauge(text: str, name: str, door: str) -> float:
    m = re.search(rf'^{name}\{{door="{door}"\}} (\S+)$', text, re.M)
    assert m is not None, f"{name} missing"
    return float(m.group(1))


class Wiretap:
    """Records the Fetch requests a consumer sends and the partitions answered."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.answered: list[set[tuple[str, int]]] = []

    def install(self, conn: Any) -> None:
        original = conn.request

        async def request(api_key: int, body: Any, **kwargs: Any) -> Any:
            resp = await original(api_key, body, **kwargs)
            if api_key == ApiKey.FETCH:
                self.sent.append(body)
                self.answered.append(
                    {
                        (t["topic"], p["partition"])
                        for t in resp.body["topics"]
                        for p in t["partitions"]
                    }
                )
            return resp

        conn.request = request

    @staticmethod
    def named(body: dict[str, Any]) -> set[tuple[str, int]]:
        return {(t["topic"], p["partition"]) for t in body["topics"] for p in t["partitions"]}


async def read(consumer: AsyncConsumer, n: int) -> list[tuple[int, int, bytes]]:
    out: list[tuple[int, int, bytes]] = []
    async with asyncio.timeout(30):
        while len(out) < n:
            out += [(r.partition, r.offset, r.value) for r in await consumer.poll(0.5)]
    return out


async def test_a_consumer_of_many_partitions_sends_and_hears_only_what_changed(broker_factory):
    mport = free_port()
    broker = broker_factory(extra_args=["--metrics-port", str(mport)])
    topic = "many"
    async with AsyncAdmin(broker.bootstrap) as admin:
        await admin.create_topic(topic, PARTS)
    async with AsyncProducer(broker.bootstrap, linger_ms=5) as producer:
        for p in range(PARTS):
            producer.send(topic, b"first-%d" % p, partition=p)
        await producer.flush()
    tap = Wiretap()
    async with AsyncConsumer(broker.bootstrap, fetch_max_wait_ms=200) as consumer:
        consumer.assign([(topic, p) for p in range(PARTS)])
        for p in range(PARTS):
            consumer.seek(topic, p, 0)
        conn = await consumer._cluster.connection(1)
        tap.install(conn)
        got = await read(consumer, PARTS)
        assert sorted(got) == [(p, 0, b"first-%d" % p) for p in range(PARTS)]
        text = await asyncio.get_running_loop().run_in_executor(None, scrape, mport)
        assert gauge(text, "logmq_fetch_sessions", "native") == 1
        assert gauge(text, "logmq_fetch_session_partitions", "native") == PARTS

        # Three appends: the fetches name at most the partitions that moved, and the
        # answers carry only the three with records. (The fetch in flight now is the
        # one naming the 300 new positions: skip it.)
        start = len(tap.sent) + 1
        async with AsyncProducer(broker.bootstrap) as producer:
            for p in (7, 150, 299):
                await producer.send(topic, b"second-%d" % p, partition=p)
        got = await read(consumer, 3)
        assert sorted(got) == [(p, 1, b"second-%d" % p) for p in (7, 150, 299)]
        for body, answered in zip(tap.sent[start:], tap.answered[start:], strict=True):
            assert body["session_id"] != 0 and body["session_epoch"] > 0
            assert len(Wiretap.named(body)) <= PARTS // 10
            assert answered <= {(topic, p) for p in (7, 150, 299)}

        # Idle: fetches that name nothing and hear nothing (at least three of them; the
        # first may still carry the last positions).
        start = len(tap.sent)
        async with asyncio.timeout(30):
            while len(tap.sent) < start + 4:
                assert await consumer.poll(0.2) == []
        assert all(not Wiretap.named(b) for b in tap.sent[start + 1 :])
        assert all(not a for a in tap.answered[start + 1 :])


async def test_assigning_the_same_partitions_again_rereads_from_the_position(shared_broker):
    """The assignment is the same set, so the session stays: the re-seek still goes out."""
    topic = "again"
    async with AsyncAdmin(shared_broker.bootstrap) as admin:
        await admin.create_topic(topic, 2)
    async with AsyncProducer(shared_broker.bootstrap) as producer:
        await producer.send(topic, b"a", partition=0)
    async with AsyncConsumer(
        shared_broker.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100
    ) as consumer:
        consumer.assign([(topic, 0), (topic, 1)])
        assert await read(consumer, 1) == [(0, 0, b"a")]
        consumer.assign([(topic, 0), (topic, 1)])
        consumer.seek(topic, 0, 0)
        assert await read(consumer, 1) == [(0, 0, b"a")]
        async with AsyncProducer(shared_broker.bootstrap) as producer:
            await producer.send(topic, b"b", partition=1)
        assert await read(consumer, 1) == [(1, 0, b"b")]


async def test_a_spent_budget_ends_an_incremental_read_and_every_partition_gets_its_turn(
    inproc_broker,
):
    """With ``fetch_max_bytes`` far below what is there, an incremental fetch stops
    reading at the partition that finds the budget spent (the rest wait in the session
    for the next fetch), and still every record arrives, once and in order."""
    topic, parts, per_part = "budget", 60, 8
    bootstrap = f"127.0.0.1:{inproc_broker.port}"
    async with AsyncAdmin(bootstrap) as admin:
        await admin.create_topic(topic, parts)
    value = b"v" * 1000
    async with AsyncProducer(bootstrap, linger_ms=5) as producer:
        for p in range(parts):
            for i in range(per_part):
                producer.send(topic, value + b"%d" % i, partition=p)
        await producer.flush()

    reads = inproc_broker.reads
    original = reads._read_for_consumer
    # per read: (partial, partitions visited, of them with records to read, bytes)
    visited: list[tuple[bool, int, int, int]] = []

    def counting(wanted, max_bytes, *, partial=False, **kw):
        topics, total, any_error = original(wanted, max_bytes, partial=partial, **kw)
        offsets = {(name, p[0]): p[1] for name, parts in wanted for p in parts}
        answered = [(name, p) for name, parts in topics for p in parts]
        behind = sum(offsets[(name, p.partition)] < p.high_watermark for name, p in answered)
        visited.append((partial, len(answered), behind, total))
        return topics, total, any_error

    reads._read_for_consumer = counting
    got: list[tuple[int, int]] = []
    async with AsyncConsumer(bootstrap, fetch_max_bytes=20_000, fetch_max_wait_ms=100) as consumer:
        consumer.assign([(topic, p) for p in range(parts)])
        for p in range(parts):
            consumer.seek(topic, p, 0)
        async with asyncio.timeout(60):
            while len(got) < parts * per_part:
                got += [(r.partition, r.offset) for r in await consumer.poll(0.5)]
    assert sorted(got) == [(p, o) for p in range(parts) for o in range(per_part)]
    for p in range(parts):  # in order within each partition
        offsets = [o for q, o in got if q == p]
        assert offsets == sorted(offsets)
    full = [n for partial, n, _, _ in visited if not partial]
    incremental = [(behind, total) for partial, _, behind, total in visited if partial]
    assert full and full[0] == parts  # the opening fetch answers for every partition
    # A partition's batches are ~8 KB: 20 KB holds two of them, and the read stops at
    # the third partition with records (its batch waits for the next fetch); partitions
    # that caught up before are passed over without a read.
    assert incremental and max(behind for behind, _ in incremental) <= 3, incremental
    assert max(total for _, total in incremental) <= 20_000, incremental
