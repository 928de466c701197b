"""Kafka admin clients on partitions: DeleteRecords, DescribeLogDirs, ElectLeaders and the
reassignment APIs, against a real single ``logmq-server`` (the 3-broker versions are in
tests/cluster/test_cluster_e2e.py).

Each outcome is checked through another door too: what confluent-kafka deletes, the
native client and kcat no longer read; what kafka-python reports, the native admin agrees.
"""

from __future__ import annotations

import asyncio

import pytest

from logmq.client import Admin, Producer
from tests.harness import BrokerProcess
from tests.kafka.test_kafka_clients import create, kcat, native_read

ck = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")


def fill(broker: BrokerProcess, topic: str, partitions: int, per_partition: int) -> None:
    with Producer(broker.bootstrap) as p:
        for i in range(per_partition * partitions):
            p.send(topic, f"v{i}", key=f"k{i}", partition=i % partitions)
        p.flush()


def earliest(broker: BrokerProcess, topic: str, partitions: int) -> list[int]:
    with Admin(broker.bootstrap) as admin:
        found = admin.list_offsets({(topic, p): -2 for p in range(partitions)})
    return [found[(topic, p)][0] for p in range(partitions)]


def test_confluent_deletes_records_and_every_door_reads_from_the_new_start(kbroker):
    from confluent_kafka.admin import AdminClient

    create(kbroker, "del-ck", 2)
    fill(kbroker, "del-ck", 2, 50)
    admin = AdminClient({"bootstrap.servers": kbroker.kafka_bootstrap})
    futures = admin.delete_records(
        [ck.TopicPartition("del-ck", 0, 20), ck.TopicPartition("del-ck", 1, ck.OFFSET_END)]
    )
    lows = {tp.partition: f.result(30).low_watermark for tp, f in futures.items()}
    assert lows == {0: 20, 1: 50}  # OFFSET_END (-1): everything below the high watermark
    assert earliest(kbroker, "del-ck", 2) == [20, 50]
    # kcat reads from the new start; the native consumer too
    out = kcat(kbroker, "-C", "-t", "del-ck", "-p", "0", "-o", "beginning", "-e", "-f", "%o\\n")
    assert [int(x) for x in out.split()] == list(range(20, 50))
    got = native_read(kbroker, "del-ck", 2, 30)
    assert sorted((r.partition, r.offset) for r in got) == [(0, o) for o in range(20, 50)]
    # a second, lower delete changes nothing; the answer is the current start
    again = admin.delete_records([ck.TopicPartition("del-ck", 0, 5)])
    assert next(iter(again.values())).result(30).low_watermark == 20


def test_delete_records_refusals_use_kafkas_errors(kbroker):
    from confluent_kafka.admin import AdminClient

    create(kbroker, "del-bad", 1)
    create(kbroker, "del-compacted", 1, **{"cleanup.policy": "compact"})
    fill(kbroker, "del-bad", 1, 10)
    fill(kbroker, "del-compacted", 1, 10)
    admin = AdminClient({"bootstrap.servers": kbroker.kafka_bootstrap})
    cases = {
        ("del-bad", 11): ck.KafkaError.OFFSET_OUT_OF_RANGE,  # past the high watermark
        ("del-compacted", 5): ck.KafkaError.POLICY_VIOLATION,
    }
    for (topic, offset), code in cases.items():
        [future] = admin.delete_records([ck.TopicPartition(topic, 0, offset)]).values()
        with pytest.raises(ck.KafkaException) as err:
            future.result(30)
        assert err.value.args[0].code() == code, (topic, offset)
    assert earliest(kbroker, "del-bad", 1) == [0]
    assert earliest(kbroker, "del-compacted", 1) == [0]


def test_deleted_records_stay_deleted_after_kill_9(tmp_path):
    """The leader writes its log-start checkpoint before it answers."""
    from kafka.admin import KafkaAdminClient
    from kafka.structs import TopicPartition

    with BrokerProcess(tmp_path / "data") as broker:  # started by the with
        create(broker, "del-durable", 1, **{"segment.bytes": "1024"})
        fill(broker, "del-durable", 1, 200)
        admin = KafkaAdminClient(bootstrap_servers=broker.kafka_bootstrap)
        try:
            result = admin.delete_records({TopicPartition("del-durable", 0): 123})
        finally:
            admin.close()
        assert result[TopicPartition("del-durable", 0)]["low_watermark"] == 123
        with Admin(broker.bootstrap) as native:
            before = native.describe_log_dirs(1)[("del-durable", 0)]
        broker.kill()
        broker.start()
        assert earliest(broker, "del-durable", 1) == [123]
        with Admin(broker.bootstrap) as native:
            after = native.describe_log_dirs(1)[("del-durable", 0)]
        assert after.log_start_offset == 123
        assert after.size == before.size  # the segments below it were gone already


async def test_aiokafka_deletes_records(kbroker):
    aiokafka_admin = pytest.importorskip("aiokafka.admin")
    from aiokafka.admin.records_to_delete import RecordsToDelete
    from aiokafka.structs import TopicPartition

    create(kbroker, "del-aio", 1)
    await asyncio.to_thread(fill, kbroker, "del-aio", 1, 30)
    admin = aiokafka_admin.AIOKafkaAdminClient(bootstrap_servers=kbroker.kafka_bootstrap)
    await admin.start()
    try:
        lows = await admin.delete_records({TopicPartition("del-aio", 0): RecordsToDelete(7)})
    finally:
        await admin.close()
    assert lows == {TopicPartition("del-aio", 0): 7}
    assert await asyncio.to_thread(earliest, kbroker, "del-aio", 1) == [7]


def test_native_admin_deletes_records(kbroker):
    create(kbroker, "del-native", 2)
    fill(kbroker, "del-native", 2, 10)
    with Admin(kbroker.bootstrap) as admin:
        assert admin.delete_records({("del-native", 0): 4, ("del-native", 1): -1}) == {
            ("del-native", 0): 4,
            ("del-native", 1): 10,
        }
    out = kcat(kbroker, "-C", "-t", "del-native", "-p", "0", "-o", "beginning", "-e", "-f", "%o\\n")
    assert [int(x) for x in out.split()] == list(range(4, 10))


def test_kafka_python_describes_log_dirs_like_the_native_admin(kbroker):
    from kafka.admin import KafkaAdminClient

    create(kbroker, "dirs", 2)
    fill(kbroker, "dirs", 2, 25)
    admin = KafkaAdminClient(bootstrap_servers=kbroker.kafka_bootstrap)
    try:
        [broker] = admin.describe_log_dirs(topic_partitions={"dirs": [0, 1]})
        everything = admin.describe_log_dirs()
    finally:
        admin.close()
    assert broker["broker"] == 1
    [log_dir] = broker["log_dirs"]
    assert log_dir["error_code"] == 0
    assert log_dir["log_dir"] == str(kbroker.data_dir.resolve())
    assert 0 < log_dir["usable_bytes"] <= log_dir["total_bytes"]
    [topic] = log_dir["topics"]
    with Admin(kbroker.bootstrap) as native:
        sizes = {p: d.size for (t, p), d in native.describe_log_dirs(1).items() if t == "dirs"}
    assert topic["name"] == "dirs"
    assert {p["partition_index"]: p["partition_size"] for p in topic["partitions"]} == sizes
    assert all(p["offset_lag"] == 0 and not p["is_future_key"] for p in topic["partitions"])
    names = {t["name"] for t in everything[0]["log_dirs"][0]["topics"]}
    assert {"dirs", "del-ck"} <= names


def test_kafka_python_elections_and_reassignments_on_one_broker(kbroker):
    from kafka.admin import KafkaAdminClient
    from kafka.errors import InvalidReplicationAssignmentError
    from kafka.structs import TopicPartition

    create(kbroker, "elect", 1)
    admin = KafkaAdminClient(bootstrap_servers=kbroker.kafka_bootstrap)
    try:
        # the only replica already leads: ELECTION_NOT_NEEDED (84) for a named partition
        out = admin.elect_leaders(0, {"elect": [0]}, raise_errors=False)
        [result] = out.replica_election_results
        assert (result.topic, result.partition_result[0].error_code) == ("elect", 84)
        assert admin.list_partition_reassignments() == {}
        # a move to a broker that never registered: refused, nothing starts
        with pytest.raises(InvalidReplicationAssignmentError):
            admin.alter_partition_reassignments({TopicPartition("elect", 0): [7]})
        assert admin.list_partition_reassignments() == {}
    finally:
        admin.close()
    # confluent-kafka's all-partitions election lists nothing when nothing moved
    from confluent_kafka.admin import AdminClient

    ck_admin = AdminClient({"bootstrap.servers": kbroker.kafka_bootstrap})
    assert ck_admin.elect_leaders(ck.ElectionType.PREFERRED, None).result(30) == {}
