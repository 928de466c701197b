"""CreateTopics with manual replica assignments on three real brokers: the lists are
checked against the registered brokers, the first replica of each leads, and records
go through the leaders the assignment chose."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from logmq.client import Admin
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
