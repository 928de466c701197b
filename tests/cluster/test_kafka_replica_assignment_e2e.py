"""CreateTopics and CreatePartitions with manual replica assignments on three real
brokers: the lists are checked against the registered brokers (and, for new partitions,
the topic's replication factor), the first replica of each leads, and records go
through the leaders the assignment chose. Through confluent-kafka, kafka-python, logmq's
Admin and `logmq topic alter --replica-assignment`."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from logmq.client import Admin
from logmq.client.admin import NewTopic
from logmq.errors import ErrorCode, LogMQError
from tests.harness import BrokerCluster

DEADLINE_S = 20.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[BrokerCluster]:
    c = BrokerCluster(3)
    try:
        c.start()
        yield c
    finally:
        c.close()


def kafka_bootstrap(cluster: BrokerCluster) -> str:
    return ",".join(b.kafka_bootstrap for b in cluster.nodes.values())


def test_confluent_assignment_places_replicas_and_preferred_leaders(cluster):
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewTopic

    # through broker 3, which forwards to the controller unless it is the controller
    admin = AdminClient({"bootstrap.servers": cluster.nodes[3].kafka_bootstrap})
    topic = NewTopic("placed", 2, replica_assignment=[[2, 3], [3, 1]])
    admin.create_topics([topic])["placed"].result(30)
    cluster.wait_for_topic("placed", 2)
    want = {0: (2, [2, 3]), 1: (3, [3, 1])}
    deadline = time.monotonic() + DEADLINE_S
    while True:
        got = {
            p: (m.leader, m.replicas)
            for p, m in admin.list_topics("placed", timeout=10).topics["placed"].partitions.items()
        }
        if got == want:
            break
        assert time.monotonic() < deadline, f"partitions {got}, want {want}"
        time.sleep(0.05)
    with Admin(cluster.bootstrap) as native:
        desc = native.describe_topics(["placed"])["placed"]
    assert {p.partition: (p.leader, list(p.replicas)) for p in desc.partitions} == want
    producer = ck.Producer({"bootstrap.servers": kafka_bootstrap(cluster), "acks": "all"})
    for i in range(20):
        producer.produce("placed", value=f"v{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0


@pytest.mark.parametrize(
    ("name", "assignment", "error"),
    [
        ("bad-unknown", [[4, 1], [1, 2]], "broker 4, which is not registered"),
        ("bad-uneven", [[1, 2], [3]], "same replication factor"),
        ("bad-twice", [[1, 2], [3, 3]], "broker 3 more than once"),
    ],
)
def test_confluent_bad_assignments_get_invalid_replica_assignment(cluster, name, assignment, error):
    pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap(cluster)})
    futures = admin.create_topics([NewTopic(name, len(assignment), replica_assignment=assignment)])
    with pytest.raises(Exception, match="INVALID_REPLICA_ASSIGNMENT") as e:
        futures[name].result(30)
    assert error in str(e.value)


# -- CreatePartitions ---------------------------------------------------------------------


def placement(cluster: BrokerCluster, topic: str, want: dict[int, tuple[int, list[int]]]) -> None:
    """Wait until every partition of ``topic`` has the (leader, replicas) of ``want`` as
    Kafka clients and logmq's Admin see them."""
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient

    cluster.wait_for_topic(topic, len(want))
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap(cluster)})
    deadline = time.monotonic() + DEADLINE_S
    while True:
        parts = admin.list_topics(topic, timeout=10).topics[topic].partitions
        got = {p: (m.leader, m.replicas) for p, m in parts.items()}
        if got == want:
            break
        assert time.monotonic() < deadline, f"partitions {got}, want {want}"
        time.sleep(0.05)
    with Admin(cluster.bootstrap) as native:
        desc = native.describe_topics([topic])[topic]
    assert {p.partition: (p.leader, list(p.replicas)) for p in desc.partitions} == want
    producer = ck.Producer({"bootstrap.servers": kafka_bootstrap(cluster), "acks": "all"})
    for p in want:
        producer.produce(topic, value=b"v", partition=p)
    assert producer.flush(30) == 0


def partition_count(cluster: BrokerCluster, topic: str) -> int:
    with Admin(cluster.bootstrap) as native:
        return len(native.describe_topics([topic])[topic].partitions)


def test_confluent_create_partitions_places_them_where_asked(cluster):
    pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

    admin = AdminClient({"bootstrap.servers": cluster.nodes[3].kafka_bootstrap})
    admin.create_topics([NewTopic("grow", 1, replica_assignment=[[1, 2]])])["grow"].result(30)
    cluster.wait_for_topic("grow", 1)
    grow = NewPartitions("grow", 3, replica_assignment=[[2, 3], [3, 1]])
    admin.create_partitions([grow], validate_only=True)["grow"].result(30)
    assert partition_count(cluster, "grow") == 1  # validated, nothing changed
    admin.create_partitions([grow])["grow"].result(30)
    placement(cluster, "grow", {0: (1, [1, 2]), 1: (2, [2, 3]), 2: (3, [3, 1])})


@pytest.fixture(scope="module")
def two_by_two(cluster) -> str:
    """A topic of 2 partitions with replication factor 2, for the refusals."""
    with Admin(cluster.bootstrap) as native:
        native.create_topic("refuse", 2, 2)
    cluster.wait_for_topic("refuse", 2)
    return "refuse"


BAD_ASSIGNMENTS = [
    (
        4,
        [[1, 2]],
        "1 replica list(s) given, but growing topic 'refuse' from 2 to 4 partitions adds 2",
    ),
    (3, [[1, 2], [2, 3]], "2 replica list(s) given"),
    (3, [[1, 2, 3]], "3 replica(s) where the topic's replication factor is 2"),
    (3, [[2, 2]], "new partition 2 has broker 2 more than once"),
    (4, [[1, 2], [3, 4]], "new partition 3 has broker 4, which is not registered"),
]


@pytest.mark.parametrize(("total", "lists", "message"), BAD_ASSIGNMENTS)
def test_confluent_bad_new_partitions_get_invalid_replica_assignment(
    cluster, two_by_two, total, lists, message
):
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewPartitions

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap(cluster)})
    for dry in (True, False):  # validate_only refuses them alike
        grow = NewPartitions(two_by_two, total, replica_assignment=lists)
        with pytest.raises(ck.KafkaException) as e:
            admin.create_partitions([grow], validate_only=dry)[two_by_two].result(30)
        error = e.value.args[0]
        assert error.code() == ck.KafkaError.INVALID_REPLICA_ASSIGNMENT, error
        assert message in error.str(), error.str()
    assert partition_count(cluster, two_by_two) == 2


def test_kafka_python_create_partitions_with_assignments(cluster, two_by_two):
    pytest.importorskip("kafka")
    from kafka.admin import KafkaAdminClient
    from kafka.errors import InvalidReplicationAssignmentError

    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap(cluster))
    try:
        with Admin(cluster.bootstrap) as native:
            native.create_topics([NewTopic("grow-kp", assignments=[[3, 2]])])
        cluster.wait_for_topic("grow-kp", 1)
        empty = {"grow-kp": {"count": 2, "assignments": [[]]}}
        with pytest.raises(InvalidReplicationAssignmentError):
            admin.create_partitions(empty)
        [result] = admin.create_partitions(empty, raise_errors=False).results
        assert "new partition 1 has an empty replica list" in result.error_message
        admin.create_partitions({"grow-kp": {"count": 3, "assignments": [[1, 3], [2, 1]]}})
    finally:
        admin.close()
    placement(cluster, "grow-kp", {0: (3, [3, 2]), 1: (1, [1, 3]), 2: (2, [2, 1])})


def test_native_admin_create_partitions_with_assignments(cluster):
    with Admin(cluster.bootstrap) as native:
        native.create_topics([NewTopic("grow-native", assignments=[[2]])])
        cluster.wait_for_topic("grow-native", 1)
        with pytest.raises(LogMQError, match="broker 9, which is not registered") as e:
            native.create_partitions({"grow-native": 2}, assignments={"grow-native": [[9]]})
        assert e.value.code is ErrorCode.INVALID_REPLICA_ASSIGNMENT
        with pytest.raises(LogMQError, match="replication factor is 1") as e:
            native.create_partitions(
                {"grow-native": 2}, assignments={"grow-native": [[1, 3]]}, validate_only=True
            )
        native.create_partitions(
            {"grow-native": 3}, assignments={"grow-native": [[3], [1]]}, validate_only=True
        )
        assert partition_count(cluster, "grow-native") == 1
        native.create_partitions({"grow-native": 3}, assignments={"grow-native": [[3], [1]]})
    placement(cluster, "grow-native", {0: (2, [2]), 1: (3, [3]), 2: (1, [1])})


def test_cli_topic_alter_with_a_replica_assignment(cluster):
    from click.testing import CliRunner

    from logmq_cli.main import cli

    def invoke(*args: str) -> object:
        return CliRunner().invoke(cli, ["-b", cluster.bootstrap, "topic", *args])

    created = invoke("create", "grow-cli", "--replica-assignment", "1:2")
    assert created.exit_code == 0, created.output
    cluster.wait_for_topic("grow-cli", 1)
    bad = invoke("alter", "grow-cli", "-p", "2", "--replica-assignment", "3:3")
    assert bad.exit_code == 1, bad.output
    assert "INVALID_REPLICA_ASSIGNMENT" in bad.stderr and "broker 3 more than once" in bad.stderr
    assert "Traceback" not in bad.output
    dry = invoke("alter", "grow-cli", "-p", "2", "--replica-assignment", "2:3", "--validate-only")
    assert dry.exit_code == 0 and "Valid" in dry.stdout, dry.output
    # only the new partitions' lists
    done = invoke("alter", "grow-cli", "-p", "2", "--replica-assignment", "2:3")
    assert done.exit_code == 0 and "now has 2 partition(s)" in done.stdout, done.output
    # kafka-topics' form: every partition's list, the existing ones' skipped (with a
    # warning when they differ from what the partition has)
    full = invoke("alter", "grow-cli", "-p", "4", "--replica-assignment", "1:2,3:1,3:1,1:3")
    assert full.exit_code == 0, full.output
    assert "partitions [1] differ" in full.stderr
    placement(cluster, "grow-cli", {0: (1, [1, 2]), 1: (2, [2, 3]), 2: (3, [3, 1]), 3: (1, [1, 3])})
