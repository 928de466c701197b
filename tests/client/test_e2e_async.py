"""Async clients against a real logmq-server."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import uvloop

from logmq import AsyncAdmin, AsyncConsumer, AsyncProducer, Record
from logmq.errors import (
    CorruptRecordError,
    LogMQError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)


async def make_topic(broker, name, partitions=1):
    async with AsyncAdmin(broker.bootstrap) as admin:
        await admin.create_topic(name, partitions=partitions)


async def consume(consumer, n, timeout=20.0, batches=False):
    """Poll until ``n`` records arrived (deadline, not sleeps)."""
    out = []
    async with asyncio.timeout(timeout):
        while len(out) < n:
            if batches:
                for b in await consumer.poll_batches(timeout=1.0):
                    out.extend(b.records())
            else:
                out.extend(await consumer.poll(timeout=1.0))
    return out


async def test_round_trip_keeps_keys_headers_timestamps(shared_broker, topic_name):
    await make_topic(shared_broker, topic_name, partitions=3)
    async with AsyncProducer(shared_broker.bootstrap, linger_ms=2) as producer:
        handles = [
            producer.send(
                topic_name,
                f"value-{i}",
                key=f"key-{i % 7}",
                headers=[("h", b"%d" % i), ("s", "text")],
                timestamp=1_700_000_000_000 + i,
            )
            for i in range(300)
        ]
        handles.append(producer.send(topic_name, None, key=b"tombstone", partition=1))
        metas = [await h for h in handles]
    assert len({(m.partition, m.offset) for m in metas}) == 301
    by_pos = {(m.partition, m.offset): i for i, m in enumerate(metas)}
    # the same key always goes to the same partition
    for i in range(300):
        assert metas[i].partition == metas[i % 7].partition
        assert metas[i].timestamp == 1_700_000_000_000 + i

    async with AsyncConsumer(shared_broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic_name, p) for p in range(3)])
        records = await consume(consumer, 301)
    assert len(records) == 301
    for r in records:
        assert isinstance(r, Record) and r.topic == topic_name
        i = by_pos[(r.partition, r.offset)]
        if i == 300:
            assert r.value is None and r.key == b"tombstone"
            continue
        assert r.value == f"value-{i}".encode() and r.key == f"key-{i % 7}".encode()
        assert r.headers == [("h", b"%d" % i), ("s", b"text")]
        assert r.timestamp == 1_700_000_000_000 + i
    for p in range(3):  # per-partition order is send order
        offs = [r.offset for r in records if r.partition == p]
        assert offs == sorted(offs)


async def test_send_batch_and_poll_batches(shared_broker, topic_name):
    await make_topic(shared_broker, topic_name, partitions=2)
    values = [b"v%05d" % i for i in range(20_000)]
    async with AsyncProducer(shared_broker.bootstrap, bulk_batch_bytes=64 << 10) as producer:
        chunks = await producer.send_batch(topic_name, values, partition=1)
        keyed = await producer.send_batch(topic_name, values[:100], keys=[b"k"] * 100)
    assert sum(c[2] for c in chunks) == 20_000 and len(chunks) > 1
    assert all(c[0] == 1 for c in chunks)
    assert [c[1] for c in chunks] == sorted(c[1] for c in chunks)
    assert len({c[0] for c in keyed}) == 1  # one key, one partition
    async with AsyncConsumer(shared_broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic_name, 1)])
        consumer.seek(topic_name, 1, 0)
        records = await consume(consumer, 20_000 + (100 if keyed[0][0] == 1 else 0), batches=True)
    assert [r.value for r in records[:20_000]] == values
    assert [r.offset for r in records] == list(range(len(records)))


async def test_seek_position_and_offsets_for_times(shared_broker, topic_name):
    await make_topic(shared_broker, topic_name)
    base = 1_800_000_000_000
    async with AsyncProducer(shared_broker.bootstrap) as producer:
        for i in range(10):  # one batch: the exact record is found inside it
            producer.send(topic_name, b"%d" % i, timestamp=base + 1000 * i)
        await producer.flush()
    tp = (topic_name, 0)
    async with AsyncConsumer(
        shared_broker.bootstrap, auto_offset_reset="latest", fetch_max_wait_ms=50
    ) as consumer:
        consumer.assign([tp])
        assert await consumer.position(*tp) == 10  # latest
        await consumer.seek_to_beginning()
        assert await consumer.position(*tp) == 0
        consumer.seek(topic_name, 0, 7)
        got = await consume(consumer, 3)
        assert [r.value for r in got] == [b"7", b"8", b"9"]
        assert await consumer.position(*tp) == 10
        found = await consumer.offsets_for_times({tp: base + 4500})
        assert found[tp][0] == 5 and found[tp][1] == base + 5000
        assert (await consumer.offsets_for_times({tp: base + 10**6}))[tp] is None
        consumer.seek(topic_name, 0, found[tp][0])
        assert [r.offset for r in await consume(consumer, 5)] == [5, 6, 7, 8, 9]
        await consumer.seek_to_end()
        assert await consumer.position(*tp) == 10
        assert await consumer.end_offsets([tp]) == {tp: 10}


async def test_long_poll_wakes_on_new_data(shared_broker, topic_name):
    await make_topic(shared_broker, topic_name)
    async with (
        AsyncConsumer(
            shared_broker.bootstrap, auto_offset_reset="latest", fetch_max_wait_ms=20_000
        ) as consumer,
        AsyncProducer(shared_broker.bootstrap, linger_ms=0) as producer,
    ):
        consumer.assign([(topic_name, 0)])
        assert await consumer.position(topic_name, 0) == 0
        waiting = asyncio.create_task(consumer.poll(timeout=30))
        await asyncio.sleep(0)  # let the poll start; it waits on an event, not a timer
        md = await producer.send(topic_name, b"wake up")
        records = await asyncio.wait_for(waiting, 30)
    assert [r.value for r in records] == [b"wake up"] and records[0].offset == md.offset


async def test_auto_offset_reset(shared_broker, topic_name):
    await make_topic(shared_broker, topic_name)
    async with AsyncProducer(shared_broker.bootstrap) as producer:
        await producer.send_batch(topic_name, [b"a", b"b", b"c"])
    tp = (topic_name, 0)
    async with AsyncConsumer(shared_broker.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([tp])
        c.seek(topic_name, 0, 1000)  # past the end: OFFSET_OUT_OF_RANGE, reset to earliest
        assert [r.value for r in await consume(c, 3)] == [b"a", b"b", b"c"]
    async with AsyncConsumer(shared_broker.bootstrap, auto_offset_reset="none") as c:
        c.assign([tp])
        c.seek(topic_name, 0, 1000)
        with pytest.raises(OffsetOutOfRangeError):
            async with asyncio.timeout(20):
                while True:
                    await c.poll(timeout=1)
    async with AsyncConsumer(shared_broker.bootstrap, auto_offset_reset="none") as c:
        c.assign([tp])
        with pytest.raises(OffsetOutOfRangeError):
            await c.position(topic_name, 0)


async def test_async_iteration(shared_broker, topic_name):
    await make_topic(shared_broker, topic_name)
    async with AsyncProducer(shared_broker.bootstrap) as producer:
        await producer.send_batch(topic_name, [b"%d" % i for i in range(5)])
    async with AsyncConsumer(shared_broker.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([(topic_name, 0)])
        seen = []
        async with asyncio.timeout(20):
            async for record in c:
                seen.append(record.value)
                if len(seen) == 5:
                    break
    assert seen == [b"0", b"1", b"2", b"3", b"4"]


async def test_send_to_unknown_topic_fails_after_max_block(shared_broker):
    async with AsyncProducer(shared_broker.bootstrap, max_block_ms=300) as producer:
        handle = producer.send("no-such-topic", b"x")
        with pytest.raises(UnknownTopicOrPartitionError):
            await handle
        with pytest.raises(UnknownTopicOrPartitionError):
            await producer.send_batch("no-such-topic-2", [b"x"])


def missing_topic_warnings(caplog, topic):
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "logmq.client.producer" and repr(topic) in r.getMessage()
    ]


async def test_a_send_to_a_missing_topic_says_why_it_waits_once(shared_broker, topic_name, caplog):
    """Issue 35: a send to a missing topic was silent for max_block_ms (60 s)."""
    caplog.set_level(logging.INFO, logger="logmq.client.producer")
    async with AsyncProducer(shared_broker.bootstrap, max_block_ms=30_000) as producer:
        refreshes = 0
        refresh = producer._cluster.refresh_metadata

        async def counting_refresh(topics=None):
            nonlocal refreshes
            refreshes += 1
            return await refresh(topics)

        producer._cluster.refresh_metadata = counting_refresh  # type: ignore[method-assign]
        handles = [producer.send(topic_name, b"%d" % i) for i in range(5)]
        bulk = producer.send_batch(topic_name, [b"b"])
        async with asyncio.timeout(20):
            while refreshes < 4:  # several retries, every one of them unanswered
                await asyncio.sleep(0.01)
        assert missing_topic_warnings(caplog, topic_name) == [
            f"sends to topic {topic_name!r} wait: UNKNOWN_TOPIC_OR_PARTITION (the topic "
            "does not exist, and this producer does not ask brokers to create topics "
            "(allow_auto_create_topics=False): create it first); retrying for up to 30 s "
            "(max_block_ms), then they fail"
        ]
        assert [r.levelname for r in caplog.records if r.name == "logmq.client.producer"] == [
            "WARNING"
        ]
        await make_topic(shared_broker, topic_name)
        assert [(await h).offset for h in handles] == list(range(5))
        assert await bulk == [(0, 5, 1)]
    assert len(missing_topic_warnings(caplog, topic_name)) == 1


async def test_a_producer_that_asks_for_auto_create_blames_the_broker(
    shared_broker, topic_name, caplog
):
    async with AsyncProducer(
        shared_broker.bootstrap, max_block_ms=300, allow_auto_create_topics=True
    ) as producer:
        with pytest.raises(UnknownTopicOrPartitionError):
            await producer.send(topic_name, b"x")
    (warning,) = missing_topic_warnings(caplog, topic_name)
    assert "the broker did not create it (auto-create off?)" in warning
    assert "0.3 s (max_block_ms)" in warning


async def test_a_topic_deleted_under_a_producer_is_named_once(shared_broker, topic_name, caplog):
    """A producer that had the topic's metadata when it was deleted used to retry
    UNKNOWN_TOPIC_OR_PARTITION in silence until delivery_timeout_ms."""
    await make_topic(shared_broker, topic_name)
    async with AsyncProducer(
        shared_broker.bootstrap, delivery_timeout_ms=3000, max_block_ms=3000
    ) as producer:
        assert (await producer.send(topic_name, b"before")).offset == 0
        async with AsyncAdmin(shared_broker.bootstrap) as admin:
            await admin.delete_topics([topic_name])
        caplog.set_level(logging.INFO, logger="logmq.client.producer")
        handles = [producer.send(topic_name, b"%d" % i) for i in range(5)]
        async with asyncio.timeout(30):  # they expire (they used to wait forever)
            for h in handles:
                with pytest.raises(LogMQError):
                    await h
            with pytest.raises(LogMQError):  # and once the producer knows it is gone
                await producer.send(topic_name, b"later")
    assert missing_topic_warnings(caplog, topic_name) == [
        f"batches for topic {topic_name!r} wait: UNKNOWN_TOPIC_OR_PARTITION (the broker does "
        "not know the topic: deleted since this producer learned it?); retrying for up to "
        "3 s (delivery_timeout_ms), then they fail"
    ]
    assert [r.levelname for r in caplog.records if r.name == "logmq.client.producer"] == ["WARNING"]


async def test_send_before_metadata_keeps_order(shared_broker, topic_name):
    async with AsyncProducer(shared_broker.bootstrap, max_block_ms=20_000) as producer:
        futs = [producer.send(topic_name, b"%d" % i) for i in range(20)]  # topic unknown yet
        await make_topic(shared_broker, topic_name)
        metas = [await f for f in futs]
    assert [m.offset for m in metas] == list(range(20))


async def test_acks_zero_and_all(shared_broker, topic_name):
    await make_topic(shared_broker, topic_name)
    async with AsyncProducer(shared_broker.bootstrap, acks=0) as p0:
        md = await p0.send(topic_name, b"fire")
        assert md.offset == -1
        # acks=0: nothing tells us when it landed; look, keeping the connection open
        async with AsyncAdmin(shared_broker.bootstrap) as admin, asyncio.timeout(20):
            while (await admin.list_offsets({(topic_name, 0): -1}))[(topic_name, 0)][0] < 1:
                pass
    async with AsyncProducer(shared_broker.bootstrap, acks="all", compression="gzip") as pall:
        md = await pall.send(topic_name, b"sure")
    assert md.offset == 1
    async with AsyncConsumer(shared_broker.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([(topic_name, 0)])
        assert [r.value for r in await consume(c, 2)] == [b"fire", b"sure"]


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
async def test_compressed_round_trip(shared_broker, topic_name, codec):
    await make_topic(shared_broker, topic_name)
    values = [b"abc" * (i % 50) for i in range(500)]
    async with AsyncProducer(shared_broker.bootstrap, compression=codec) as p:
        for v in values:
            p.send(topic_name, v)
        await p.send_batch(topic_name, values)
    async with AsyncConsumer(shared_broker.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([(topic_name, 0)])
        assert [r.value for r in await consume(c, 1000)] == values + values


def test_timestamps_default_to_now(shared_broker, topic_name):
    async def run():
        await make_topic(shared_broker, topic_name)
        before = time.time_ns() // 1_000_000
        async with AsyncProducer(shared_broker.bootstrap) as p:
            md = await p.send(topic_name, b"x")
        after = time.time_ns() // 1_000_000
        assert before <= md.timestamp <= after

    asyncio.run(run())


async def test_corrupt_batch_on_disk_raises_and_is_never_returned(broker, topic_name):
    await make_topic(broker, topic_name)
    async with AsyncProducer(broker.bootstrap) as p:
        await p.send(topic_name, b"good-one")
        await p.send(topic_name, b"will-be-corrupted")
        await p.send(topic_name, b"after")
    log = next((broker.data_dir / f"{topic_name}-0").glob("*.log"))
    data = bytearray(log.read_bytes())
    at = data.find(b"will-be-corrupted")
    assert at > 0
    data[at] ^= 0xFF
    log.write_bytes(bytes(data))
    async with AsyncConsumer(broker.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([(topic_name, 0)])
        got = []
        with pytest.raises(CorruptRecordError):
            async with asyncio.timeout(20):
                while True:
                    got.extend(await c.poll(timeout=1))
        assert [r.value for r in got] == [b"good-one"]
        assert await c.position(topic_name, 0) == 1  # stuck before the bad batch
        c.seek(topic_name, 0, 2)  # the application may skip it
        assert [r.value for r in await consume(c, 1)] == [b"after"]


async def test_many_partitions_with_a_small_fetch_budget_all_progress(shared_broker, topic_name):
    await make_topic(shared_broker, topic_name, partitions=6)
    async with AsyncProducer(shared_broker.bootstrap) as p:
        for part in range(6):
            p.send_batch(topic_name, [b"%d" % part] * 50, partition=part)
        await p.flush()
    async with AsyncConsumer(
        shared_broker.bootstrap,
        auto_offset_reset="earliest",
        fetch_max_bytes=2048,
        max_partition_fetch_bytes=1024,  # room for two partitions per fetch
    ) as c:
        c.assign([(topic_name, part) for part in range(6)])
        records = await consume(c, 300)
    assert sorted({r.partition for r in records}) == list(range(6))
    assert len(records) == 300


def test_sub_millisecond_linger_does_not_spin_the_sender(shared_broker, topic_name):
    """uvloop rounds timers to whole milliseconds, so a sender sleeping 0.4 ms toward a
    linger deadline would wake at once and spin; it must wait a whole tick instead."""

    async def main() -> int:
        await make_topic(shared_broker, topic_name)
        async with AsyncProducer(shared_broker.bootstrap, linger_ms=0.4) as producer:
            sender = producer._sender
            original = sender._send_ready
            rounds = 0

            async def counting(now: float) -> int:
                nonlocal rounds
                rounds += 1
                return await original(now)

            sender._send_ready = counting  # type: ignore[method-assign]
            for i in range(20):
                await producer.send(topic_name, b"%d" % i)
            return rounds

    rounds = uvloop.run(main())
    assert rounds <= 20 * 6  # a few rounds per record; a spinning sender makes hundreds
