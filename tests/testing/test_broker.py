"""logmq.testing.LogmqBroker: real brokers that real Kafka clients use, and that leave
nothing behind (no process, no temp dir) however the test ends."""

from __future__ import annotations

import ast
import os
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from logmq.testing import BrokerStartError, KafkaError, LogmqBroker

ck = pytest.importorskip("confluent_kafka")


@pytest.fixture(scope="module")
def broker():
    with LogmqBroker() as b:
        yield b


def _consume_all(bootstrap: str, topic: str, partitions: int, count: int) -> list:
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        consumer.assign(
            [ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(partitions)]
        )
        out = []
        while len(out) < count:
            msg = consumer.poll(10)
            assert msg is not None, f"only {len(out)} of {count} records arrived"
            assert msg.error() is None, msg.error()
            out.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
        return out
    finally:
        consumer.close()


def test_single_broker_serves_confluent_kafka(broker):
    assert broker.bootstrap_servers.startswith("127.0.0.1:")
    assert "," not in broker.bootstrap_servers
    topic = broker.create_topic("greetings", partitions=2)
    producer = ck.Producer({"bootstrap.servers": broker.bootstrap_servers, "acks": "all"})
    for i in range(10):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % 2)
    assert producer.flush(10) == 0
    records = _consume_all(broker.bootstrap_servers, topic, 2, 10)
    assert sorted(r[3] for r in records) == sorted(b"v%d" % i for i in range(10))
    for p in (0, 1):  # each partition's records in order, offsets from 0
        assert [r[1] for r in records if r[0] == p] == list(range(5))


def test_topics_are_auto_created_as_on_a_kafka_dev_broker(broker):
    producer = ck.Producer({"bootstrap.servers": broker.bootstrap_servers})
    producer.produce("never-created", value=b"hello")
    assert producer.flush(10) == 0
    assert _consume_all(broker.bootstrap_servers, "never-created", 1, 1)[0][3] == b"hello"


def test_a_subscribed_consumer_gets_every_partition(broker):
    """The group defaults (one __consumer_offsets partition, no initial rebalance delay)
    serve Kafka's classic group protocol."""
    topic = broker.create_topic("subscribed", partitions=3)
    producer = ck.Producer({"bootstrap.servers": broker.bootstrap_servers})
    for i in range(6):
        producer.produce(topic, value=b"%d" % i, partition=i % 3)
    assert producer.flush(10) == 0
    consumer = ck.Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": "subscribed-group",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe([topic])
        values = []
        while len(values) < 6:
            msg = consumer.poll(15)
            assert msg is not None, f"only {len(values)} of 6 records arrived"
            assert msg.error() is None, msg.error()
            values.append(msg.value())
        assert sorted(values) == [b"%d" % i for i in range(6)]
        assert {tp.partition for tp in consumer.assignment()} == {0, 1, 2}
    finally:
        consumer.close()


def test_create_topic_sets_configs_and_refuses_a_second_create(broker):
    from confluent_kafka.admin import AdminClient, ConfigResource

    broker.create_topic("compacted", config={"segment.bytes": "1048576"}, cleanup_policy="compact")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    resource = ConfigResource(ConfigResource.Type.TOPIC, "compacted")
    configs = admin.describe_configs([resource])[resource].result(10)
    assert configs["cleanup.policy"].value == "compact"
    assert configs["segment.bytes"].value == "1048576"
    with pytest.raises(KafkaError, match="TOPIC_ALREADY_EXISTS"):
        broker.create_topic("compacted")


def test_native_bootstrap_serves_logmq_clients(broker):
    from logmq import Admin

    broker.create_topic("seen-natively")
    with Admin(broker.native_bootstrap) as admin:
        assert "seen-natively" in admin.list_topics()


def test_three_brokers_form_one_cluster_and_stop_cleanly():
    kafka = pytest.importorskip("kafka")
    with LogmqBroker(3) as cluster:
        assert len(cluster.bootstrap_servers.split(",")) == 3
        processes = [n.process for n in cluster.nodes]
        base = cluster.data_dir
        cluster.create_topic("replicated", partitions=3, replication_factor=3)
        admin = kafka.KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
        try:
            brokers = admin.describe_cluster()["brokers"]
            assert sorted((b["broker_id"], b["port"]) for b in brokers) == [
                (n.node_id, n.kafka_port) for n in cluster.nodes
            ]
            (topic,) = admin.describe_topics(["replicated"])
            assert [sorted(p["replica_nodes"]) for p in topic["partitions"]] == [[1, 2, 3]] * 3
        finally:
            admin.close()
    assert all(p.returncode == 0 for p in processes)  # SIGTERM: clean shutdowns
    assert not base.exists()


def test_everything_is_cleaned_up_when_the_body_raises():
    with pytest.raises(RuntimeError, match="the test failed"), LogmqBroker() as b:
        processes = [n.process for n in b.nodes]
        base = b.data_dir
        assert base.is_dir()
        raise RuntimeError("the test failed")
    assert all(p.returncode is not None for p in processes)
    for p in processes:
        with pytest.raises(ProcessLookupError):
            os.kill(p.pid, 0)
    assert not base.exists()
    assert b.nodes == [] and b.data_dir is None


def test_a_failed_start_says_why_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp makes its dir
    b = LogmqBroker(server_args=["--no-such-option"])
    with pytest.raises(BrokerStartError, match=r"(?i)no such option"):
        b.start()
    assert b.nodes == []
    assert list(tmp_path.iterdir()) == []


def test_a_given_data_dir_is_kept(tmp_path):
    with LogmqBroker(data_dir=tmp_path / "kept") as b:
        b.create_topic("stays")
    assert (tmp_path / "kept" / "broker-1" / "meta.properties").exists()
    assert (tmp_path / "kept" / "broker-1.log").exists()


async def test_async_context_manager_and_create_topic():
    aiokafka = pytest.importorskip("aiokafka")
    async with LogmqBroker() as b:
        topic = await b.acreate_topic("async-topic")
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=b.bootstrap_servers)
        await producer.start()
        try:
            meta = await producer.send_and_wait(topic, b"hi")
        finally:
            await producer.stop()
        assert (meta.topic, meta.offset) == (topic, 0)


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs os.pidfd_open (Linux)")
def test_a_broker_stops_when_its_parent_is_killed(tmp_path):
    """kill -9 of a test run leaves no broker running: it sees its stdin close."""
    script = textwrap.dedent(
        """
        import sys
        from logmq.testing import LogmqBroker
        b = LogmqBroker(data_dir=sys.argv[1]).start()
        print(*(n.pid for n in b.nodes), flush=True)
        sys.stdin.read()  # until killed
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 1
        pidfds = [os.pidfd_open(pid) for pid in pids]
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        try:
            for fd in pidfds:  # a pidfd turns readable when its process exits
                readable, _, _ = select.select([fd], [], [], 30)
                assert readable, "a broker outlived its parent"
        finally:
            for fd in pidfds:
                os.close(fd)
    finally:
        parent.kill()
        parent.wait()
        parent.stdin.close()
        parent.stdout.close()


def test_importing_the_plugin_loads_no_client_or_server_code():
    """Every pytest session of a project with logmq installed imports the plugin."""
    code = (
        "import sys, logmq.testing.plugin; "
        "print(sorted(m for m in sys.modules if m.startswith(('logmq', 'kio'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path.cwd()
    ).stdout
    assert ast.literal_eval(out) == [
        "logmq",
        "logmq.testing",
        "logmq.testing._kafka",
        "logmq.testing.plugin",
    ]


def test_a_cluster_that_lost_the_race_for_a_raft_port_starts_again_elsewhere(monkeypatch):
    import socket

    import logmq.testing as testing

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    real_free_port = testing._free_port
    ports = iter([taken.getsockname()[1]])  # the first pick is already in use
    monkeypatch.setattr(testing, "_free_port", lambda: next(ports, None) or real_free_port())
    attempts = []
    start_once = LogmqBroker._start_once
    monkeypatch.setattr(
        LogmqBroker, "_start_once", lambda self: (attempts.append(1), start_once(self))[1]
    )
    try:
        with LogmqBroker(2) as cluster:
            assert len(cluster.nodes) == 2 and all(n.running for n in cluster.nodes)
    finally:
        taken.close()
    assert len(attempts) == 2
