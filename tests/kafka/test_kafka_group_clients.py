"""Kafka clients that ``subscribe()``: the classic group protocol with real clients.

confluent-kafka consumers run in their own processes so that one can be killed with
SIGKILL mid-stream; kafka-python, aiokafka and kcat (-G) groups join, rebalance, commit
and resume. Every check is on outcomes: every record consumed, the committed offsets at
the end of the log, nothing left to read for a restarted group.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

from logmq.client import Admin, Producer
from tests.harness import BrokerProcess
from tests.kafka.test_kafka_clients import create, kcat

ck = pytest.importorskip("confluent_kafka")
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def gbroker(tmp_path_factory):
    """A broker whose classic groups rebalance at once (no initial delay) and whose
    consumer-protocol members expire 6 s after they die (KIP-848 sessions are the
    broker's), as in tests."""
    broker = BrokerProcess(
        tmp_path_factory.mktemp("kafka-groups") / "data",
        extra_args=[
            "--group-initial-rebalance-delay-ms", "0", "--group-session-timeout-ms", "6000",
            "--group-heartbeat-interval-ms", "500",
        ],
    )  # fmt: skip
    broker.start()
    yield broker
    broker.stop()


def produce(broker: BrokerProcess, topic: str, partitions: int, values: list[str]) -> None:
    with Producer(broker.bootstrap) as p:
        for i, v in enumerate(values):
            p.send(topic, v, partition=i % partitions)
        p.flush()


def wait_for(condition: Callable[[], bool], what: str, deadline_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class ConsumerProcess:
    """tests/kafka/group_consumer.py in a subprocess; its lines collected by a thread."""

    def __init__(self, broker: BrokerProcess, group: str, topic: str, strategy: str) -> None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.kafka.group_consumer", broker.kafka_bootstrap, group,
             topic, strategy],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=root,
            text=True,
        )  # fmt: skip
        self.values: list[str] = []
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())
            parts = line.split()
            if len(parts) == 3 and parts[0].isdigit():
                self.values.append(parts[2])

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        self._reader.join(10)
        assert code == 0, (code, self.lines[-5:])
        assert self.lines[-1] == "closed", self.lines[-5:]


def committed(broker: BrokerProcess, group: str) -> dict[int, int]:
    with Admin(broker.bootstrap) as admin:
        return {p: o.offset for (_, p), o in admin.group_offsets(group).items()}


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky", "consumer"])
def test_confluent_group_survives_a_kill_and_a_new_member(gbroker, strategy):
    topic, group, parts = f"grp-{strategy}", f"grp-{strategy}", 6
    create(gbroker, topic, parts)
    first = [f"a{i}" for i in range(600)]
    produce(gbroker, topic, parts, first)
    consumers = [ConsumerProcess(gbroker, group, topic, strategy) for _ in range(3)]
    try:
        wait_for(lambda: sum(len(c.values) for c in consumers) >= 200, "records before the kill")
        consumers[0].kill()  # mid-stream, with uncommitted records: they are read again
        second = [f"b{i}" for i in range(600)]
        produce(gbroker, topic, parts, second)
        consumers.append(ConsumerProcess(gbroker, group, topic, strategy))
        everything = set(first + second)
        wait_for(
            lambda: everything <= {v for c in consumers for v in c.values},
            "every record consumed",
        )
        wait_for(lambda: _owns(consumers[3]), "partitions for the member that joined late")
        # the members' auto-commits reach the end of every partition: lag 0
        end = dict.fromkeys(range(parts), 200)
        wait_for(lambda: committed(gbroker, group) == end, "commits at the end offsets")
    finally:
        for c in consumers[1:]:
            c.stop()
    assert committed(gbroker, group) == end

    def described():
        with Admin(gbroker.bootstrap) as admin:
            return admin.describe_group(group)

    # everyone left; the killed member too, once its session ran out
    wait_for(lambda: not described().members, "an empty group")
    assert [p.lag for p in described().partitions] == [0] * parts
    # a new member of the group resumes from the commits: nothing left to read
    produce(gbroker, topic, parts, ["c0"])
    late = ConsumerProcess(gbroker, group, topic, strategy)
    try:
        wait_for(lambda: "c0" in late.values, "the record produced after")
    finally:
        late.stop()
    assert late.values == ["c0"]


def _owns(consumer: ConsumerProcess) -> bool:
    return any(line.startswith("assigned") and len(line.split()) > 1 for line in consumer.lines)


def test_kafka_python_group_rebalances_commits_and_resumes(gbroker):
    kafka = pytest.importorskip("kafka")
    topic, group = "kp-group-sub", "kp-group-sub"
    create(gbroker, topic, 4)
    produce(gbroker, topic, 4, [f"v{i}" for i in range(200)])
    seen: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def run() -> None:
        consumer = kafka.KafkaConsumer(
            topic,
            bootstrap_servers=gbroker.kafka_bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
            # kafka-python can join before its first metadata for the topic arrives and
            # get an empty assignment ("No partition metadata for topic"); it rejoins
            # when its metadata changes, which a refresh every second brings soon.
            metadata_max_age_ms=1000,
        )
        while not stop.is_set():
            # A poll that times out while the leader's SyncGroup is in flight leaves
            # kafka-python 3.0 (join_group_async) with a join it never finishes: its
            # need_rejoin() already compares the new assignment as done, so the next
            # poll skips the pending join, and the member never takes its assignment or
            # heartbeats (seen with 100 ms polls, about one run in five; the broker's
            # SyncGroup answer carried the assignment). A poll outlasts a join here.
            for records in consumer.poll(timeout_ms=1000).values():
                with lock:
                    seen.extend(r.value.decode() for r in records)
                consumer.commit()
        consumer.close()  # LeaveGroup: the other member takes over

    threads = [threading.Thread(target=run) for _ in range(2)]
    threads[0].start()
    wait_for(lambda: len(seen) > 0, "the first member's records")
    threads[1].start()  # joins: a rebalance
    wait_for(lambda: set(seen) >= {f"v{i}" for i in range(200)}, "every record")
    stop.set()
    for t in threads:
        t.join(30)
    assert committed(gbroker, group) == dict.fromkeys(range(4), 50)


async def test_aiokafka_group_rebalances_commits_and_resumes(gbroker):
    """Two aiokafka members split the partitions (a rebalance on join), one leaves (a
    rebalance on leave: the other takes its partitions over), and a restarted group
    resumes from the commits."""
    aiokafka = pytest.importorskip("aiokafka")
    topic, group = "aio-group-sub", "aio-group-sub"
    create(gbroker, topic, 2)
    await asyncio.to_thread(produce, gbroker, topic, 2, [f"v{i}" for i in range(100)])

    def member() -> aiokafka.AIOKafkaConsumer:
        return aiokafka.AIOKafkaConsumer(
            topic,
            bootstrap_servers=gbroker.kafka_bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
        )

    async def read(consumer, got: list[str], until) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not until():
            assert time.monotonic() < deadline, f"read {len(got)}"
            for records in (await consumer.getmany(timeout_ms=100)).values():
                got += [r.value.decode() for r in records]
            await consumer.commit()

    a, b = member(), member()
    got_a: list[str] = []
    got_b: list[str] = []
    await a.start()
    try:
        await read(a, got_a, lambda: bool(got_a))
        await b.start()  # joins: the two split the partitions
        everything = {f"v{i}" for i in range(100)}

        def split() -> bool:
            return len(b.assignment()) == 1 and len(a.assignment()) == 1

        await asyncio.gather(
            read(a, got_a, lambda: split() and set(got_a + got_b) >= everything),
            read(b, got_b, lambda: split() and set(got_a + got_b) >= everything),
        )
        await b.stop()  # leaves: a takes its partition over
        await asyncio.to_thread(produce, gbroker, topic, 2, ["x0", "x1"])
        await read(a, got_a, lambda: {"x0", "x1"} <= set(got_a))
        assert len(a.assignment()) == 2
    finally:
        await a.stop()
    assert await asyncio.to_thread(committed, gbroker, group) == {0: 51, 1: 51}
    await asyncio.to_thread(produce, gbroker, topic, 2, ["late"])
    late: list[str] = []
    c = member()
    await c.start()
    try:
        await read(c, late, lambda: bool(late))
    finally:
        await c.stop()
    assert late == ["late"]  # resumed from the commits


def test_kcat_balanced_consumer_reads_once(gbroker):
    topic, group = "kcat-group", "kcat-group"
    create(gbroker, topic, 3)
    produce(gbroker, topic, 3, [f"k{i}" for i in range(90)])
    # the start comes from the group's commits (-o would override them), else the beginning
    args = ["-G", group, "-e", "-f", "%s\\n", "-X", "auto.offset.reset=earliest"]
    out = kcat(gbroker, *args, topic)
    assert sorted(out.split()) == sorted(f"k{i}" for i in range(90))
    assert committed(gbroker, group) == dict.fromkeys(range(3), 30)
    assert kcat(gbroker, *args, topic).split() == []  # resumes at the end


def test_admin_lists_and_describes_both_kinds_of_group(gbroker):
    """ListGroups v5 tells classic from consumer-protocol groups; librdkafka describes a
    consumer group with ConsumerGroupDescribe and a classic one through its fallback."""
    from confluent_kafka.admin import AdminClient

    topic = "grp-admin-kinds"
    create(gbroker, topic, 2)
    produce(gbroker, topic, 2, [f"v{i}" for i in range(20)])
    classic = ConsumerProcess(gbroker, "kinds-classic", topic, "range")
    modern = ConsumerProcess(gbroker, "kinds-consumer", topic, "consumer")
    try:
        wait_for(lambda: len(classic.values) == 20 and len(modern.values) == 20, "both groups")
        admin = AdminClient({"bootstrap.servers": gbroker.kafka_bootstrap})
        listed = {g.group_id: g for g in admin.list_consumer_groups().result(30).valid}
        assert listed["kinds-classic"].type == ck.ConsumerGroupType.CLASSIC
        assert listed["kinds-consumer"].type == ck.ConsumerGroupType.CONSUMER
        only = admin.list_consumer_groups(types={ck.ConsumerGroupType.CLASSIC}).result(30)
        assert "kinds-consumer" not in {g.group_id for g in only.valid}
        described = admin.describe_consumer_groups(["kinds-classic", "kinds-consumer"])
        for group_id, future in described.items():
            d = future.result(30)
            owned = {
                (tp.topic, tp.partition) for m in d.members for tp in m.assignment.topic_partitions
            }
            assert owned == {(topic, 0), (topic, 1)}, group_id
            assert d.type == listed[group_id].type
        # the native CLI view of the classic group: its type, members and lag
        with Admin(gbroker.bootstrap) as native:
            groups = {g.group_id: g for g in native.list_groups()}
            assert (groups["kinds-classic"].type, groups["kinds-classic"].state) == (
                "classic",
                "stable",
            )
            view = native.describe_group("kinds-classic")
        assert {tp for m in view.members for tp in m.assignment} == {(topic, 0), (topic, 1)}
    finally:
        classic.stop()
        modern.stop()
    # once empty, the native admin (and so `logmq group reset-offsets/delete`) manages it
    with Admin(gbroker.bootstrap) as native:
        native.alter_group_offsets("kinds-classic", {(topic, 0): 3})
        assert native.group_offsets("kinds-classic")[(topic, 0)].offset == 3
        native.delete_group("kinds-classic")
        assert "kinds-classic" not in {g.group_id for g in native.list_groups()}


def test_a_native_group_and_kafka_groups_share_a_topic(gbroker):
    from logmq.client import Consumer

    topic = "grp-mixed"
    create(gbroker, topic, 3)
    values = [f"m{i}" for i in range(90)]
    produce(gbroker, topic, 3, values)
    kafka_group = ConsumerProcess(gbroker, "mixed-kafka", topic, "cooperative-sticky")
    try:
        native = Consumer(gbroker.bootstrap, group_id="mixed-native", auto_offset_reset="earliest")
        with native as c:
            c.subscribe([topic])
            got: list = []
            deadline = time.monotonic() + DEADLINE_S
            while len(got) < 90:
                assert time.monotonic() < deadline, f"native read {len(got)} of 90"
                got += c.poll(0.5)
            c.commit()
        wait_for(lambda: sorted(kafka_group.values) == sorted(values), "the Kafka group")
    finally:
        kafka_group.stop()
    assert sorted(r.value.decode() for r in got) == sorted(values)
    assert committed(gbroker, "mixed-native") == dict.fromkeys(range(3), 30)


def test_one_group_id_refuses_the_other_protocol_while_it_has_members(gbroker):
    """A classic JoinGroup to a live consumer-protocol group, and a KIP-848 heartbeat to
    a live classic group, get Kafka's refusals on the wire."""
    import datetime
    import socket

    from kio.index import load_request_schema, load_response_schema
    from kio.serial import entity_reader

    from tests.kafka.test_kafka_listener import read_frame, request

    topic = "grp-refuse"
    create(gbroker, topic, 1)
    classic = ConsumerProcess(gbroker, "refuse-classic", topic, "range")
    modern = ConsumerProcess(gbroker, "refuse-consumer", topic, "consumer")
    try:
        wait_for(lambda: _owns(classic) and _owns(modern), "both groups formed")

        def call(key: int, version: int, body) -> object:
            with socket.create_connection(("127.0.0.1", gbroker.kafka_port), timeout=10) as s:
                s.sendall(request(key, version, body, 1))
                frame = read_frame(s)
            cls = load_response_schema(key, version)
            _, pos = entity_reader(cls.__header_schema__)(frame, 0)
            return entity_reader(cls)(frame, pos)[0]

        join = load_request_schema(11, 5)
        mod = sys.modules[join.__module__]
        second = datetime.timedelta(seconds=10)
        answer = call(11, 5, join(
            group_id="refuse-consumer", session_timeout=second, rebalance_timeout=second,
            member_id="", group_instance_id=None, protocol_type="consumer",
            protocols=(mod.JoinGroupRequestProtocol(name="range", metadata=b""),),
        ))  # fmt: skip
        assert int(answer.error_code) == 23  # INCONSISTENT_GROUP_PROTOCOL
        beat = load_request_schema(68, 1)
        answer = call(68, 1, beat(
            group_id="refuse-classic", member_id="m-1", member_epoch=0, instance_id=None,
            rack_id=None, rebalance_timeout=second, subscribed_topic_names=(topic,),
            subscribed_topic_regex=None, server_assignor=None, topic_partitions=(),
        ))  # fmt: skip
        assert int(answer.error_code) == 69  # GROUP_ID_NOT_FOUND: not a consumer group
        assert "not a consumer group" in answer.error_message
    finally:
        classic.stop()
        modern.stop()


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_plain_commit_keeps_the_leader_epoch_of_the_positions(gbroker, protocol):
    """OffsetCommit v6+ carries the leader epoch of the last record consumed (KIP-320):
    committed() answers it, and so does logmq's Admin."""
    topic = f"grp-epoch-{protocol}"
    create(gbroker, topic, 2)
    produce(gbroker, topic, 2, [f"e{i}" for i in range(6)])
    c = ck.Consumer(
        {
            "bootstrap.servers": gbroker.kafka_bootstrap,
            "group.id": topic,
            "group.protocol": protocol,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        c.subscribe([topic])
        seen = 0
        deadline = time.monotonic() + DEADLINE_S
        while seen < 6:
            assert time.monotonic() < deadline, f"read {seen} of 6"
            msg = c.poll(0.2)
            if msg is not None and not msg.error():
                seen += 1
        positions = c.position(c.assignment())
        assert sorted((t.partition, t.offset, t.leader_epoch) for t in positions) == [
            (0, 3, 0),
            (1, 3, 0),
        ]
        c.commit(offsets=positions, asynchronous=False)
        got = c.committed([ck.TopicPartition(topic, p) for p in range(2)], 10)
        assert sorted((t.partition, t.offset, t.leader_epoch) for t in got) == [
            (0, 3, 0),
            (1, 3, 0),
        ]
    finally:
        c.close()
    with Admin(gbroker.bootstrap) as admin:
        found = admin.group_offsets(topic)
    assert {p: (o.offset, o.leader_epoch) for (_, p), o in found.items()} == {
        0: (3, 0),
        1: (3, 0),
    }
