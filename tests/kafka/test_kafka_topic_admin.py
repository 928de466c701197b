"""Kafka's admin tools against one real broker: manual replica assignments in
CreateTopics, and Kafka topic configs logmq keeps without acting on them.

confluent-kafka (librdkafka) and kafka-python send the requests; the one thing neither
client will send (a partition assigned twice) goes as a hand-encoded CreateTopics v2.
"""

from __future__ import annotations

import socket
import struct

import pytest
from click.testing import CliRunner

from logmq.client import Admin
from logmq_cli.main import cli
from tests.harness import BrokerProcess

INVALID_REPLICA_ASSIGNMENT, INVALID_REQUEST = 39, 42


def _string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


def raw_create_topic(
    broker: BrokerProcess, name: str, assignments: list[tuple[int, list[int]]]
) -> tuple[int, str]:
    """CreateTopics v2 with the assignment entries as given; (error code, message)."""
    body = struct.pack(">i", 1) + _string(name) + struct.pack(">ih", -1, -1)
    body += struct.pack(">i", len(assignments))
    for p, brokers in assignments:
        body += struct.pack(f">ii{len(brokers)}i", p, len(brokers), *brokers)
    body += struct.pack(">i", 0) + struct.pack(">ib", 30_000, 0)  # no configs; not dry
    frame = struct.pack(">hhi", 19, 2, 7) + _string("raw-test") + body
    with socket.create_connection((broker.host, broker.kafka_port), timeout=30) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + struct.unpack(">i", buf[:4])[0]:
            chunk = sock.recv(65536)
            assert chunk, "connection closed"
            buf += chunk
    # size, correlation id, throttle, topic count, name, error, message
    pos = 4 + 4 + 4 + 4
    (n,) = struct.unpack_from(">h", buf, pos)
    pos += 2 + n
    code, mlen = struct.unpack_from(">hh", buf, pos)
    message = buf[pos + 4 : pos + 4 + mlen].decode() if mlen >= 0 else ""
    return code, message


# -- manual replica assignments ----------------------------------------------------------
def test_confluent_creates_a_topic_on_the_replicas_it_names(kbroker):
    pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kbroker.kafka_bootstrap})
    # librdkafka wants the count beside the lists, and sends -1 for both counts
    dry = NewTopic("ra-dry", 2, replica_assignment=[[1], [1]])
    admin.create_topics([dry], validate_only=True)["ra-dry"].result(30)
    assert "ra-dry" not in admin.list_topics(timeout=10).topics
    made = NewTopic("ra-one", 2, replica_assignment=[[1], [1]])
    admin.create_topics([made])["ra-one"].result(30)
    parts = admin.list_topics("ra-one", timeout=10).topics["ra-one"].partitions
    assert {p: (m.leader, m.replicas, m.isrs) for p, m in parts.items()} == {
        0: (1, [1], [1]),
        1: (1, [1], [1]),
    }
    with Admin(kbroker.bootstrap) as native:
        desc = native.describe_topics(["ra-one"])["ra-one"]
    assert [list(p.replicas) for p in sorted(desc.partitions, key=lambda p: p.partition)] == [
        [1],
        [1],
    ]


@pytest.mark.parametrize(
    ("name", "assignment", "error"),
    [
        ("ra-unknown", [[1], [7]], "broker 7, which is not registered"),
        ("ra-twice", [[1, 1]], "broker 1 more than once"),
    ],
)
def test_confluent_assignment_refusals_are_invalid_replica_assignment(
    kbroker, name, assignment, error
):
    pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kbroker.kafka_bootstrap})
    fut = admin.create_topics([NewTopic(name, len(assignment), replica_assignment=assignment)])
    with pytest.raises(Exception, match="INVALID_REPLICA_ASSIGNMENT") as e:
        fut[name].result(30)
    assert error in str(e.value)
    assert name not in admin.list_topics(timeout=10).topics


def test_kafka_python_assignment_checks_follow_kafka(kbroker):
    pytest.importorskip("kafka")
    from kafka.admin import KafkaAdminClient
    from kafka.errors import InvalidReplicationAssignmentError, InvalidRequestError

    admin = KafkaAdminClient(bootstrap_servers=kbroker.kafka_bootstrap)
    try:
        with pytest.raises(InvalidRequestError, match="partition count must be -1"):
            admin.create_topics({"kp-ra-n": {"num_partitions": 2, "assignments": {0: [1]}}})
        with pytest.raises(InvalidRequestError, match="replication factor must be -1"):
            admin.create_topics({"kp-ra-r": {"replication_factor": 1, "assignments": {0: [1]}}})
        with pytest.raises(InvalidReplicationAssignmentError, match="empty replica list"):
            admin.create_topics({"kp-ra-empty": {"assignments": {0: [1], 1: []}}})
        with pytest.raises(InvalidReplicationAssignmentError, match="partition 1 missing"):
            admin.create_topics({"kp-ra-gap": {"assignments": {0: [1], 2: [1]}}})
        made = admin.create_topics({"kp-ra": {"assignments": {0: [1], 1: [1], 2: [1]}}})
        (topic,) = made["topics"]
        assert (topic["error_code"], topic["num_partitions"], topic["replication_factor"]) == (
            0,
            3,
            1,
        )
        (desc,) = admin.describe_topics(["kp-ra"])
        assert [p["replica_nodes"] for p in desc["partitions"]] == [[1], [1], [1]]
    finally:
        admin.close()


def test_a_partition_assigned_twice_is_refused(kbroker):
    code, message = raw_create_topic(kbroker, "raw-twice", [(0, [1]), (0, [1])])
    assert code == INVALID_REPLICA_ASSIGNMENT and "partition 0" in message
    code, message = raw_create_topic(kbroker, "raw-ok", [(1, [1]), (0, [1])])
    assert (code, message) == (0, "")
    with Admin(kbroker.bootstrap) as native:
        assert len(native.describe_topics(["raw-ok"])["raw-ok"].partitions) == 2


def test_cli_and_native_admin_take_a_replica_assignment(kbroker):
    res = CliRunner().invoke(
        cli,
        [
            "--bootstrap",
            kbroker.bootstrap,
            "topic",
            "create",
            "cli-ra",
            "--replica-assignment",
            "1,1,1",
        ],
    )
    assert res.exit_code == 0, res.output
    with Admin(kbroker.bootstrap) as native:
        assert len(native.describe_topics(["cli-ra"])["cli-ra"].partitions) == 3
    res = CliRunner().invoke(
        cli,
        [
            "--bootstrap",
            kbroker.bootstrap,
            "topic",
            "create",
            "cli-ra2",
            "-p",
            "2",
            "--replica-assignment",
            "1",
        ],
    )
    assert res.exit_code != 0 and "replaces --partitions" in res.output
    res = CliRunner().invoke(
        cli,
        [
            "--bootstrap",
            kbroker.bootstrap,
            "topic",
            "create",
            "cli-ra3",
            "--replica-assignment",
            "1:9",
        ],
    )
    assert res.exit_code != 0 and "broker 9" in res.output


# -- Kafka topic configs logmq keeps without acting on them -------------------------------
def test_confluent_stores_and_describes_kafka_only_topic_configs(kbroker):
    pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ConfigSource,
        NewTopic,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": kbroker.kafka_bootstrap})
    topic = "ck-kafka-configs"
    kept = {"message.format.version": "2.8", "preallocate": "true", "retention.ms": "60000"}
    admin.create_topics([NewTopic(topic, 1, 1, config=kept)])[topic].result(30)
    res = ConfigResource(ResourceType.TOPIC, topic)
    described = admin.describe_configs([res])[res].result(30)
    for key, value in kept.items():
        assert described[key].value == value, key
        assert described[key].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value, key
    # the rest of Kafka's topic configs are described with Kafka's defaults
    assert described["segment.jitter.ms"].value == "0" and described["segment.jitter.ms"].is_default
    assert described["message.downconversion.enable"].value == "true"

    def incremental(*entries):
        change = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=list(entries))
        return admin.incremental_alter_configs([change])[change]

    incremental(
        ConfigEntry("segment.jitter.ms", "250", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry(
            "leader.replication.throttled.replicas",
            "0:1",
            incremental_operation=AlterConfigOpType.APPEND,
        ),
    ).result(30)
    described = admin.describe_configs([res])[res].result(30)
    assert described["segment.jitter.ms"].value == "250"
    assert described["leader.replication.throttled.replicas"].value == "0:1"
    assert described["message.format.version"].value == "2.8"  # untouched
    refusals = [
        ConfigEntry("segment.jitter.ms", "soon", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("no.such.config", "1", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("log.retention.ms", "1", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", "5", incremental_operation=AlterConfigOpType.APPEND),
    ]
    for entry in refusals:
        with pytest.raises(Exception, match="INVALID_CONFIG"):
            incremental(entry).result(30)
    # AlterConfigs replaces every override, the kept ones included
    replace = ConfigResource(ResourceType.TOPIC, topic, set_config={"preallocate": "false"})
    admin.alter_configs([replace])[replace].result(30)
    described = admin.describe_configs([res])[res].result(30)
    assert described["message.format.version"].is_default
    assert described["message.format.version"].value == "3.0-IV1"
    assert described["preallocate"].value == "false" and not described["preallocate"].is_default
    assert described["retention.ms"].is_default


def test_remote_storage_enable_is_refused_while_the_brokers_tier_is_off(kbroker):
    """The test broker runs with remote.log.storage.system.enable=false (the default),
    so remote.storage.enable=true is INVALID_CONFIG on create and on alter, as on Kafka."""
    pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": kbroker.kafka_bootstrap})
    with pytest.raises(Exception, match="INVALID_CONFIG"):
        topic = "ck-tiered-create"
        config = {"remote.storage.enable": "true"}
        admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(30)
    topic = "ck-tiered-alter"
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    entry = ConfigEntry(
        "remote.storage.enable", "true", incremental_operation=AlterConfigOpType.SET
    )
    change = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    with pytest.raises(Exception, match="INVALID_CONFIG"):
        admin.incremental_alter_configs([change])[change].result(30)


def test_kafka_python_alters_and_describes_kafka_only_topic_configs(kbroker):
    pytest.importorskip("kafka")
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    topic = "kp-kafka-configs"
    with Admin(kbroker.bootstrap) as native:
        native.create_topic(topic, 1)
    admin = KafkaAdminClient(bootstrap_servers=kbroker.kafka_bootstrap)
    try:
        for incremental in (False, True):
            version = "3.0" if incremental else "2.1"
            res = ConfigResource(
                ConfigResourceType.TOPIC,
                topic,
                configs={"message.format.version": version, "compression.zstd.level": "7"},
            )
            assert admin.alter_configs([res], incremental=incremental) == {"topic": {topic: "OK"}}
            got = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
            configs = got["topic"][topic]
            assert configs["message.format.version"]["value"] == version
            assert configs["message.format.version"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
            assert configs["compression.zstd.level"]["value"] == "7"
        for bad in ({"compression.zstd.level": "high"}, {"no.such.config": "1"}):
            res = ConfigResource(ConfigResourceType.TOPIC, topic, configs=bad)
            out = admin.alter_configs([res], raise_on_unknown=False, incremental=True)
            assert "InvalidConfigurationError" in str(out["topic"][topic]), bad
    finally:
        admin.close()
    with Admin(kbroker.bootstrap) as native:  # the native door sees the same
        assert native.describe_configs([topic])[topic]["compression.zstd.level"].value == "7"


def test_kafka_only_configs_survive_a_restart(tmp_path):
    with BrokerProcess(tmp_path / "data") as broker:
        with Admin(broker.bootstrap) as native:
            native.create_topic("kept", 1, configs={"message.format.version": "2.8"})
            native.alter_configs("kept", set={"segment.jitter.ms": "5"})
        broker.restart()
        with Admin(broker.bootstrap) as native:
            got = native.describe_configs(["kept"])["kept"]
    assert (
        got["message.format.version"].value == "2.8" and not got["message.format.version"].default
    )
    assert got["segment.jitter.ms"].value == "5"


# -- CreatePartitions at the door ---------------------------------------------------------


async def test_create_partitions_door_passes_assignments_and_refuses_a_topic_twice():
    """Null assignments are the controller's placement, a list (even empty) is a manual
    one for the controller to check; a topic named twice runs neither entry (as Kafka)."""
    import datetime
    from types import SimpleNamespace

    from kio.schema.create_partitions.v3 import request as cp

    from logmq.broker.metadata.topic_admin import TopicOutcome, TopicOutcomes
    from logmq.kafka.topics import KafkaTopicApis

    class Recording:
        specs: list = []

        async def create_partitions(self, specs, *, validate_only, caller):
            self.specs = list(specs)
            return TopicOutcomes(TopicOutcome(s.name) for s in specs)

    def topic(name, count, lists):
        assignments = (
            None
            if lists is None
            else tuple(cp.CreatePartitionsAssignment(broker_ids=tuple(b)) for b in lists)
        )
        return cp.CreatePartitionsTopic(name=name, count=count, assignments=assignments)

    body = cp.CreatePartitionsRequest(
        topics=(
            topic("a", 3, [[1, 2], [2, 3]]),
            topic("b", 2, None),
            topic("c", 2, []),
            topic("d", 2, None),
            topic("d", 3, None),
        ),
        timeout=datetime.timedelta(seconds=5),
        validate_only=False,
    )
    admin = Recording()
    req = SimpleNamespace(api_key=37, api_version=3, body=body, context=None, client_id="t")
    reply = await KafkaTopicApis(admin).create_partitions(req)
    assert [(s.name, s.count, s.assignments) for s in admin.specs] == [
        ("a", 3, [(1, 2), (2, 3)]),
        ("b", 2, None),
        ("c", 2, []),
    ]
    answers = [(r.name, r.error_code.value, r.error_message) for r in reply.body.results]
    assert answers[:3] == [("a", 0, None), ("b", 0, None), ("c", 0, None)]
    assert answers[3:] == [("d", INVALID_REQUEST, "topic 'd' named more than once")] * 2
