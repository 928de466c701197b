"""AsyncAdmin and its error cases against a real broker."""

from __future__ import annotations

import pytest

from logmq import AsyncAdmin, AsyncProducer, NewTopic
from logmq.errors import (
    ErrorCode,
    InvalidConfigError,
    LogMQError,
    UnknownTopicOrPartitionError,
)


async def test_create_list_describe_delete(shared_broker, topic_name):
    async with AsyncAdmin(shared_broker.bootstrap) as admin:
        await admin.create_topics(
            [NewTopic(topic_name, 3, 1, {"retention.ms": "60000"}), NewTopic(topic_name + "-b")]
        )
        assert {topic_name, topic_name + "-b"} <= set(await admin.list_topics())
        async with AsyncProducer(shared_broker.bootstrap) as p:
            await p.send_batch(topic_name, [b"x"] * 5, partition=2)
        desc = (await admin.describe_topics([topic_name]))[topic_name]
        assert [p.partition for p in desc.partitions] == [0, 1, 2]
        p2 = desc.partitions[2]
        assert p2.leader >= 0 and p2.leader in p2.replicas and p2.isr
        assert (p2.log_start_offset, p2.log_end_offset) == (0, 5)
        assert desc.partitions[0].log_end_offset == 0
        offsets = await admin.list_offsets({(topic_name, 2): -2, (topic_name, 2 - 1): -1})
        assert offsets[(topic_name, 2)][0] == 0 and offsets[(topic_name, 1)][0] == 0

        await admin.delete_topics([topic_name + "-b"])
        assert topic_name + "-b" not in await admin.list_topics()


async def test_create_errors(shared_broker, topic_name):
    async with AsyncAdmin(shared_broker.bootstrap) as admin:
        await admin.create_topic(topic_name)
        with pytest.raises(LogMQError) as e:
            await admin.create_topic(topic_name)
        assert e.value.code == ErrorCode.TOPIC_ALREADY_EXISTS
        with pytest.raises(LogMQError) as e:
            await admin.create_topic("bad/name")
        assert e.value.code == ErrorCode.INVALID_TOPIC_EXCEPTION
        with pytest.raises(LogMQError) as e:
            await admin.create_topic(topic_name + "-p", partitions=0)
        assert e.value.code == ErrorCode.INVALID_PARTITIONS
        with pytest.raises(InvalidConfigError):
            await admin.create_topic(topic_name + "-c", configs={"retention.ms": "soon"})
        await admin.create_topics([NewTopic(topic_name + "-v")], validate_only=True)
        assert topic_name + "-v" not in await admin.list_topics()
        assert topic_name + "-c" not in await admin.list_topics()


async def test_configs(shared_broker, topic_name):
    async with AsyncAdmin(shared_broker.bootstrap) as admin:
        await admin.create_topic(topic_name, configs={"retention.ms": "60000"})
        configs = (await admin.describe_configs([topic_name]))[topic_name]
        assert configs["retention.ms"].value == "60000" and not configs["retention.ms"].default
        await admin.alter_configs(
            topic_name, set={"segment.bytes": 1 << 20}, delete=["retention.ms"]
        )
        configs = (await admin.describe_configs([topic_name]))[topic_name]
        assert configs["segment.bytes"].value == str(1 << 20)
        assert configs["retention.ms"].default
        with pytest.raises(InvalidConfigError):
            await admin.alter_configs(topic_name, set={"no.such.config": "1"})
        with pytest.raises(InvalidConfigError):
            await admin.alter_configs(topic_name, set={"segment.bytes": "-5"})


async def test_unknown_topic_errors(shared_broker):
    async with AsyncAdmin(shared_broker.bootstrap) as admin:
        with pytest.raises(UnknownTopicOrPartitionError):
            await admin.describe_topics(["never-created"])
        with pytest.raises(UnknownTopicOrPartitionError):
            await admin.delete_topics(["never-created"])
        with pytest.raises(UnknownTopicOrPartitionError):
            await admin.describe_configs(["never-created"])
        with pytest.raises(UnknownTopicOrPartitionError):
            await admin.list_offsets({("never-created", 0): -1})
