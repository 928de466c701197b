"""Three real ``logmq-server`` processes forming one metadata quorum (issue 5, step A).

The quorum forms, metadata changes made through any broker reach every broker, the
controller's death elects another one, and the CLI describes and runs a cluster. Every
wait is a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from logmq.client import Admin
from logmq.errors import ErrorCode
from logmq.net.codec import ApiKey
from tests.broker.test_api import values_batch
from tests.harness import BrokerCluster, BrokerProcess, BrokerStartError
from tests.net.raw_client import RawClient

DEADLINE_S = 20.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[BrokerCluster]:
    c = BrokerCluster(3, extra_args=["--broker-session-timeout-ms", "3000"])
    try:
        c.start()
        yield c
    finally:
        c.close()


async def metadata(port: int, topics: list[str] | None = None) -> dict:
    async with await RawClient.connect(port) as c:
        return (await c.call(ApiKey.METADATA, {"topics": topics})).body


def view(body: dict) -> tuple:
    """What every broker must agree on: brokers, and topics with their assignments."""
    brokers = sorted((b["node_id"], b["port"]) for b in body["brokers"])
    topics = sorted(
        (
            t["topic"],
            tuple(
                (p["partition"], p["leader"], p["leader_epoch"], tuple(p["replicas"]))
                for p in t["partitions"]
            ),
        )
        for t in body["topics"]
    )
    return body["cluster_id"], body["controller_id"], tuple(brokers), tuple(topics)


async def consistent_view(cluster: BrokerCluster, topics: list[str]) -> tuple:
    """Wait until every running broker answers Metadata alike; return that answer."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        views = [view(await metadata(b.port, topics)) for b in cluster.nodes.values() if b.running]
        if all(v == views[0] for v in views):
            return views[0]
        assert time.monotonic() < deadline, f"brokers disagree: {views}"
        await asyncio.sleep(0.05)


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "logmq_cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def test_quorum_forms_and_topics_created_anywhere_appear_everywhere(cluster):
    nodes = list(cluster.nodes.values())
    async with await RawClient.connect(nodes[1].port) as c:
        entry = await c.create_topic("everywhere", 3, replication_factor=3)
        assert entry["error"] == 0, entry
    async with await RawClient.connect(nodes[2].port) as c:
        entry = await c.create_topic("two", 2, replication_factor=2)
        assert entry["error"] == 0, entry
        entry = await c.create_topic("toobig", 1, replication_factor=4)
        assert entry["error"] == ErrorCode.INVALID_REPLICATION_FACTOR
        assert "available broker" in entry["message"]
    _cid, controller, brokers, topics = await consistent_view(cluster, ["everywhere", "two"])
    assert controller in (1, 2, 3) and [b for b, _ in brokers] == [1, 2, 3]
    parts = dict(topics)
    assert {p[1] for p in parts["everywhere"]} == {1, 2, 3}  # leaders spread
    assert all(sorted(p[3]) == [1, 2, 3] for p in parts["everywhere"])
    assert all(len(p[3]) == 2 for p in parts["two"])

    # produce goes to the leader; the others say NOT_LEADER_OR_FOLLOWER (retriable)
    leader = parts["everywhere"][0][1]
    follower = next(n for n in (1, 2, 3) if n != leader)
    async with await RawClient.connect(cluster.nodes[follower].port) as c:
        r = await c.produce("everywhere", 0, values_batch(2, b"x"))
        assert r["error"] == ErrorCode.NOT_LEADER_OR_FOLLOWER
    async with await RawClient.connect(cluster.nodes[leader].port) as c:
        r = await c.produce("everywhere", 0, values_batch(2, b"x"), acks=-1)
        assert r["error"] == 0 and r["base_offset"] == 0
        # acks=all answered: the followers (step B's replica fetchers) hold the records
        meta, _ = await c.fetch("everywhere", 0, 0)
        assert meta["high_watermark"] == 2

    # deletes go through the controller too
    async with await RawClient.connect(nodes[0].port) as c:
        resp = await c.call(ApiKey.DELETE_TOPICS, {"topics": ["two"]})
        assert resp.body["topics"][0]["error"] == 0
    body = await metadata(nodes[0].port, ["two"])  # the forwarding broker has caught up
    assert body["topics"][0]["error"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    deadline = time.monotonic() + DEADLINE_S
    while (await metadata(nodes[2].port, ["two"]))["topics"][0]["error"] == 0:
        assert time.monotonic() < deadline, "the deletion did not reach broker 3"
        await asyncio.sleep(0.05)


async def test_cluster_describe_json(cluster):
    out = cli("-b", cluster.bootstrap, "cluster", "describe", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [b["node_id"] for b in doc["brokers"]] == [1, 2, 3]
    assert not any(b["fenced"] for b in doc["brokers"])
    assert doc["controller_id"] == doc["quorum"]["leader_id"] in (1, 2, 3)
    assert [v["node_id"] for v in doc["quorum"]["voters"]] == [1, 2, 3]
    assert doc["offline"] == []
    table = cli("-b", cluster.bootstrap, "cluster", "describe")
    assert table.returncode == 0 and "Brokers" in table.stdout and "Offline" in table.stdout


def test_consumer_groups_find_their_coordinator_in_the_cluster(cluster):
    """__consumer_offsets is created through the controller, each partition's shard
    loads on its leader, and FindCoordinator sends members there."""
    b = cluster.bootstrap
    assert cli("-b", b, "topic", "create", "grouped", "-p", "3", "-r", "2").returncode == 0
    lines = "".join(f"k{i}:v{i}\n" for i in range(30))
    out = subprocess.run(
        [sys.executable, "-m", "logmq_cli.main", "-b", b, "produce", "grouped"],
        input=lines,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    out = cli("-b", b, "consume", "grouped", "--group", "gg", "--from-beginning", "--timeout", "3")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 30
    described = cli("-b", b, "group", "describe", "gg", "--json")
    assert described.returncode == 0, described.stderr
    offsets = json.loads(described.stdout)["partitions"]
    assert sum(o["committed_offset"] for o in offsets) == 30


def test_a_foreign_data_dir_is_refused(cluster, tmp_path):
    # node 1's identity in a dir of its own: node 1's live dir would be refused by its
    # lock first (tests/broker/test_data_dir_lock.py)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    shutil.copy(cluster.nodes[1].data_dir / "meta.properties", foreign)
    intruder = BrokerProcess(foreign, node_id=7, extra_args=["--quorum-voters", cluster.voters])
    with pytest.raises(BrokerStartError) as err:
        intruder.start()
    assert "node.id=1" in str(err.value) and intruder.returncode == 2


def test_another_clusters_data_dir_is_refused(cluster, tmp_path):
    # a single-node broker's data dir belongs to a cluster of its own
    with BrokerProcess(tmp_path / "solo", node_id=4):
        pass
    stray = BrokerProcess(
        tmp_path / "solo", node_id=4, extra_args=["--quorum-voters", cluster.voters]
    )
    with pytest.raises(BrokerStartError) as err:
        stray.start()
    assert "cluster" in str(err.value) and stray.returncode == 2


async def test_controller_kill_elects_a_new_one_and_admin_still_works(cluster):
    _, controller, _, _ = await consistent_view(cluster, [])
    victim = cluster.nodes[controller]
    victim.kill()
    survivor = next(b for n, b in cluster.nodes.items() if n != controller)

    async def new_controller() -> int:
        body = await metadata(survivor.port, [])
        return body["controller_id"]

    deadline = time.monotonic() + DEADLINE_S
    while (c := await new_controller()) in (controller, -1):
        assert time.monotonic() < deadline, "no new controller"
        await asyncio.sleep(0.05)
    async with await RawClient.connect(survivor.port) as client:
        entry = await client.create_topic("after-failover", 2, replication_factor=2)
        assert entry["error"] == 0, entry
    # the killed broker is fenced after its session and loses its leaderships
    deadline = time.monotonic() + DEADLINE_S
    while True:
        body = await metadata(survivor.port, None)
        live = {b["node_id"] for b in body["brokers"]}
        leaders = {p["leader"] for t in body["topics"] for p in t["partitions"]}
        if controller not in live and controller not in leaders:
            break
        assert time.monotonic() < deadline, body
        await asyncio.sleep(0.1)
    # it comes back with its data dir and rejoins
    victim.start()
    await consistent_view(cluster, ["after-failover"])
    body = await metadata(victim.port, ["after-failover"])
    assert body["controller_id"] == c
    assert {b["node_id"] for b in body["brokers"]} == {1, 2, 3}


def test_dev_cluster_starts_and_stops_cleanly(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "logmq_cli.main",
            "dev",
            "cluster",
            "--brokers",
            "3",
            "--base-port",
            "0",
            "--data-dir",
            str(tmp_path / "dev"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until ready (or the command fails)
        assert line.startswith("logmq dev cluster ready "), line + proc.stderr.read()
        bootstrap = line.split()[-1]
        assert len(bootstrap.split(",")) == 3
        out = cli("-b", bootstrap, "topic", "create", "dev-t", "-p", "2", "-r", "3")
        assert out.returncode == 0, out.stderr
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "cluster stopped" in rest
        for n in (1, 2, 3):
            log = (tmp_path / "dev" / f"node-{n}.log").read_text()
            assert "broker stopped cleanly" in log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_a_broker_outside_the_voters_joins_as_an_observer(cluster):
    """It follows the metadata log without voting, registers and can hold replicas."""
    observer = BrokerProcess(
        cluster.base_dir / "node-4", node_id=4, extra_args=["--quorum-voters", cluster.voters]
    )
    with observer:
        body = await metadata(observer.port, None)
        assert {b["node_id"] for b in body["brokers"]} == {1, 2, 3, 4}
        async with await RawClient.connect(observer.port) as c:
            entry = await c.create_topic("four", 4, replication_factor=4)
            assert entry["error"] == 0, entry
            quorum = (await c.call(ApiKey.DESCRIBE_QUORUM, {})).body
            assert [v["node_id"] for v in quorum["voters"]] == [1, 2, 3]
        _, _, brokers, topics = await consistent_view(cluster, ["four"])
        assert [b for b, _ in brokers] == [1, 2, 3, 4]
        assert all(sorted(p[3]) == [1, 2, 3, 4] for p in dict(topics)["four"])


def test_kafka_clients_find_every_brokers_kafka_listener(cluster):
    """Each broker registers its Kafka endpoint: Metadata from any broker names them all,
    and a Kafka producer and consumer reach each partition's leader through them."""
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient

    running = {n: node for n, node in cluster.nodes.items() if node.running}
    first = next(iter(running.values()))
    admin = AdminClient({"bootstrap.servers": first.kafka_bootstrap})
    deadline = time.monotonic() + DEADLINE_S
    while True:
        brokers = admin.list_topics(timeout=10).brokers
        got = {b.id: (b.host, b.port) for b in brokers.values()}
        want = {n: ("127.0.0.1", node.kafka_port) for n, node in running.items()}
        if got == want:
            break
        assert time.monotonic() < deadline, f"Metadata brokers {got}, want {want}"
        time.sleep(0.1)
    with Admin(cluster.bootstrap) as native:
        native.create_topic("kafka-rf3", 3, replication_factor=len(running))
    producer = ck.Producer({"bootstrap.servers": first.kafka_bootstrap, "acks": "all"})
    for i in range(300):
        producer.produce("kafka-rf3", value=f"v{i}".encode(), partition=i % 3)
    assert producer.flush(30) == 0
    consumer = ck.Consumer({"bootstrap.servers": first.kafka_bootstrap, "group.id": "unused"})
    consumer.assign([ck.TopicPartition("kafka-rf3", p, ck.OFFSET_BEGINNING) for p in range(3)])
    values = set()
    deadline = time.monotonic() + 30
    while len(values) < 300 and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is not None:
            assert msg.error() is None, msg.error()
            values.add(msg.value())
    consumer.close()
    assert values == {f"v{i}".encode() for i in range(300)}


def test_kafka_admin_deletes_records_moves_and_elects_across_brokers(cluster):
    """DeleteRecords waits for every in-sync replica's log start offset; kafka-python
    moves a partition's replicas, lists the move, and elects the preferred leader."""
    ck = pytest.importorskip("confluent_kafka")
    pytest.importorskip("kafka")
    from confluent_kafka.admin import AdminClient
    from kafka.admin import KafkaAdminClient
    from kafka.structs import TopicPartition

    topic, tp = "kafka-admin-rf3", ("kafka-admin-rf3", 0)
    running = {n: node for n, node in cluster.nodes.items() if node.running}
    kafka_bootstrap = ",".join(node.kafka_bootstrap for node in running.values())
    with Admin(cluster.bootstrap) as native:
        native.create_topic(topic, 1, replication_factor=3)
    producer = ck.Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    for i in range(100):
        producer.produce(topic, value=f"v{i}".encode(), partition=0)
    assert producer.flush(30) == 0

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    [future] = admin.delete_records([ck.TopicPartition(topic, 0, 60)]).values()
    assert future.result(30).low_watermark == 60  # every in-sync replica got there
    with Admin(cluster.bootstrap) as native:
        replicas = native.describe_topics([topic])[topic].partitions[0].replicas
        starts = {b: native.describe_log_dirs(b)[tp].log_start_offset for b in replicas}
    assert starts == dict.fromkeys(replicas, 60)

    kp = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)

    def settled(want: list[int]) -> list[int]:
        """Wait until the move is over and the metadata shows ``want``; returns the ISR."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            with Admin(cluster.bootstrap) as native:
                part = native.describe_topics([topic])[topic].partitions[0]
            if not kp.list_partition_reassignments() and list(part.replicas) == want:
                return list(part.isr)
            assert time.monotonic() < deadline, (part, kp.list_partition_reassignments())
            time.sleep(0.1)

    try:
        # shrink to two replicas, the second of them first: the leader may stay put
        target = [replicas[1], replicas[0]]
        assert kp.alter_partition_reassignments({TopicPartition(topic, 0): target}) == {
            TopicPartition(topic, 0): None
        }
        assert sorted(settled(target)) == sorted(target)
        with Admin(cluster.bootstrap) as native:
            leader = native.describe_topics([topic])[topic].partitions[0].leader
        out = kp.elect_leaders(0, {topic: [0]}, raise_errors=False)
        [result] = out.replica_election_results
        code = result.partition_result[0].error_code
        assert code == (84 if leader == target[0] else 0)  # ELECTION_NOT_NEEDED or elected
        deadline = time.monotonic() + DEADLINE_S
        while True:
            with Admin(cluster.bootstrap) as native:
                if native.describe_topics([topic])[topic].partitions[0].leader == target[0]:
                    break
            assert time.monotonic() < deadline, "the preferred replica did not become leader"
            time.sleep(0.1)
        # every broker reports its own copy: the one dropped has none left
        dirs = kp.describe_log_dirs(topic_partitions={topic: [0]})
    finally:
        kp.close()
    holders = {
        d["broker"]
        for d in dirs
        for log_dir in d["log_dirs"]
        for t in log_dir["topics"]
        if t["name"] == topic and t["partitions"]
    }
    assert holders == set(target)


def test_controller_mutation_rate_is_metered_for_the_cluster_on_the_controller(cluster):
    """KIP-599's quota is the controller's: a client's topic creations through any broker
    draw on one bucket, because each broker forwards its client's identity with them."""
    pytest.importorskip("confluent_kafka")
    from tests.security.test_kafka_quotas import alter, create_topics

    running = [node for node in cluster.nodes.values() if node.running]
    assert len(running) >= 2
    assert (
        int(alter(running[0], "spread", "controller_mutation_rate", 1.0).entries[0].error_code) == 0
    )
    # 11 credits (1/s for quota.window.num windows), whichever broker a request reaches
    assert create_topics(running[0], 6, "spread", {"spread-a": 8})[1] == {"spread-a": 0}
    assert create_topics(running[1], 6, "spread", {"spread-b": 5})[1] == {"spread-b": 0}
    answer, codes = create_topics(running[-1], 6, "spread", {"spread-c": 1})
    assert codes == {"spread-c": 89}
    assert answer.throttle_time.total_seconds() > 1
