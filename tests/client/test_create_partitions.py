"""Adding partitions from the clients: the admin call, producers that see the new
partitions after their next metadata refresh, and group members that get them assigned."""

from __future__ import annotations

import asyncio

import pytest

from logmq import Admin, AsyncAdmin, AsyncConsumer, AsyncProducer
from logmq.client.cluster import ClusterClient
from logmq.errors import ErrorCode, LogMQError, UnknownTopicOrPartitionError
from tests.harness import BrokerProcess

# a short heartbeat interval: members learn a new assignment on their next heartbeat
GROUP_ARGS = ["--offsets-topic-partitions", "2", "--group-heartbeat-interval-ms", "100"]
DEADLINE = 20.0


@pytest.fixture(scope="module")
def pbroker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("partitions-client") / "data", extra_args=GROUP_ARGS)
    b.start()
    try:
        yield b
    finally:
        b.close()


async def until(condition, what: str) -> None:
    """Await an async ``condition()`` until it holds, failing after DEADLINE seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while not await condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_admin_grows_a_topic_and_reports_refusals(pbroker, topic_name):
    async with AsyncAdmin(pbroker.bootstrap) as admin:
        await admin.create_topic(topic_name, 2)
        await admin.create_partitions({topic_name: 6}, validate_only=True)
        assert len((await admin.describe_topics([topic_name]))[topic_name].partitions) == 2

        await admin.create_partitions({topic_name: 6})
        desc = (await admin.describe_topics([topic_name]))[topic_name]
        assert [p.partition for p in desc.partitions] == list(range(6))
        assert all(p.log_end_offset == 0 for p in desc.partitions)

        with pytest.raises(LogMQError) as err:
            await admin.create_partitions({topic_name: 4})
        assert err.value.code == ErrorCode.INVALID_PARTITIONS
        assert "has 6 partition(s)" in str(err.value)
        with pytest.raises(UnknownTopicOrPartitionError):
            await admin.create_partitions({f"{topic_name}-missing": 3})
        await admin.group_offsets("nobody")  # makes sure __consumer_offsets exists
        with pytest.raises(LogMQError) as err:
            await admin.create_partitions({"__consumer_offsets": 9})
        assert err.value.code == ErrorCode.INVALID_TOPIC_EXCEPTION


def test_blocking_admin(pbroker, topic_name):
    with Admin(pbroker.bootstrap) as admin:
        admin.create_topic(topic_name, 1)
        admin.create_partitions({topic_name: 3})
        assert len(admin.describe_topics([topic_name])[topic_name].partitions) == 3
        with pytest.raises(LogMQError) as err:
            admin.create_partitions({topic_name: 3})
        assert err.value.code == ErrorCode.INVALID_PARTITIONS


async def test_cluster_metadata_refreshes_when_it_reaches_its_max_age(pbroker, topic_name):
    async with AsyncAdmin(pbroker.bootstrap) as admin:
        await admin.create_topic(topic_name, 1)
        cluster = ClusterClient(pbroker.bootstrap, metadata_max_age_ms=50)
        try:
            await cluster.refresh_metadata([topic_name])
            assert cluster.metadata.partition_count(topic_name) == 1
            await admin.create_partitions({topic_name: 3})

            async def grown() -> bool:
                return cluster.metadata.partition_count(topic_name) == 3

            await until(grown, "the periodic metadata refresh")
        finally:
            await cluster.close()
        assert cluster._age_task is None  # close() stopped the refresher


async def test_a_producer_uses_new_partitions_after_its_next_refresh(pbroker, topic_name):
    keys = [b"key-%d" % i for i in range(200)]
    async with (
        AsyncAdmin(pbroker.bootstrap) as admin,
        AsyncProducer(pbroker.bootstrap, metadata_max_age_ms=100, linger_ms=0) as producer,
    ):
        await admin.create_topic(topic_name, 1)
        before = [await producer.send(topic_name, b"v", key=k) for k in keys]
        assert {md.partition for md in before} == {0}
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.send(topic_name, b"v", partition=3)

        await admin.create_partitions({topic_name: 4})

        async def sees_four() -> bool:
            return len(await producer.partitions_for(topic_name)) == 4

        await until(sees_four, "the producer's metadata refresh")
        after = [await producer.send(topic_name, b"v", key=k) for k in keys]
        # keys now hash over four partitions; the same key always lands on one of them
        assert {md.partition for md in after} == {0, 1, 2, 3}
        again = [await producer.send(topic_name, b"v", key=k) for k in keys]
        assert [md.partition for md in again] == [md.partition for md in after]
        md = await producer.send(topic_name, b"explicit", partition=3)
        assert md.partition == 3


async def test_a_group_member_gets_the_new_partitions_and_their_records(pbroker, topic_name):
    async with AsyncAdmin(pbroker.bootstrap) as admin:
        await admin.create_topic(topic_name, 1)
    consumer = AsyncConsumer(
        pbroker.bootstrap,
        group_id=topic_name,
        topics=[topic_name],
        auto_offset_reset="earliest",  # a new partition has no committed offset
        session_timeout_ms=10_000,
        fetch_max_wait_ms=100,
    )
    seen: list[tuple[int, bytes]] = []

    async def received(n: int) -> bool:
        seen.extend((r.partition, r.value) for r in await consumer.poll(0.05))
        return len(seen) >= n

    async with consumer:
        async with AsyncProducer(pbroker.bootstrap) as producer:
            await producer.send(topic_name, b"first", partition=0)
        await until(lambda: received(1), "the record of partition 0")
        assert consumer.assignment() == {(topic_name, 0)}

        async with AsyncAdmin(pbroker.bootstrap) as admin:
            await admin.create_partitions({topic_name: 3})
        # records written before the member owns the new partitions are read too
        async with AsyncProducer(pbroker.bootstrap) as producer:
            for p in (1, 2):
                await producer.send(topic_name, b"new-%d" % p, partition=p)
        await until(lambda: received(3), "the records of the new partitions")
        assert sorted(seen) == [(0, b"first"), (1, b"new-1"), (2, b"new-2")]
        assert consumer.assignment() == {(topic_name, p) for p in range(3)}
