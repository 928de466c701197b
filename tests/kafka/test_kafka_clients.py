"""Real Kafka clients against a real ``logmq-server``'s Kafka listener.

kcat (librdkafka 2.0, from apt), confluent-kafka (librdkafka 2.x), kafka-python and
aiokafka (PyPI) produce and read records; the native client reads what they wrote and
the reverse, record for record (keys, values, headers, timestamps).
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from click.testing import CliRunner

from logmq.client import Admin, Consumer, Producer
from logmq_cli.main import cli
from tests.harness import BrokerProcess


def create(broker: BrokerProcess, name: str, partitions: int = 1, **configs: str) -> None:
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(name, partitions, configs=configs or None)


def native_read(broker: BrokerProcess, topic: str, partitions: int, count: int) -> list:
    with Consumer(broker.bootstrap) as c:
        c.assign([(topic, p) for p in range(partitions)])
        c.seek_to_beginning(*[(topic, p) for p in range(partitions)])
        out: list = []
        deadline = time.monotonic() + 30
        while len(out) < count:
            assert time.monotonic() < deadline, f"read {len(out)} of {count}"
            out += c.poll(1.0)
    return out


def kcat(broker: BrokerProcess, *args: str, stdin: bytes | None = None) -> str:
    proc = subprocess.run(
        ["kcat", "-b", broker.kafka_bootstrap, *args],
        input=stdin,
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc.stdout.decode()


# -- kcat ------------------------------------------------------------------------------
def test_kcat_lists_brokers_and_topics(kbroker):
    create(kbroker, "kcat-meta", 3)
    out = kcat(kbroker, "-L", "-t", "kcat-meta")
    assert f"broker 1 at {kbroker.kafka_bootstrap}" in out
    assert 'topic "kcat-meta" with 3 partitions' in out
    for p in range(3):
        assert f"partition {p}, leader 1, replicas: 1, isrs: 1" in out


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_kcat_produces_in_every_codec_and_reads_back(kbroker, codec):
    topic = f"kcat-{codec}"
    create(kbroker, topic)
    lines = [f"k{i}:value-{i}" for i in range(200)]
    kcat(kbroker, "-P", "-t", topic, "-K:", "-z", codec, stdin="\n".join(lines).encode())
    out = kcat(kbroker, "-C", "-t", topic, "-o", "beginning", "-e", "-f", "%k:%s\\n")
    assert out.splitlines() == lines
    # the native client reads the same records
    got = native_read(kbroker, topic, 1, 200)
    assert [(r.key, r.value) for r in got] == [
        (f"k{i}".encode(), f"value-{i}".encode()) for i in range(200)
    ]


def test_kcat_reads_from_the_end_and_relative_offsets(kbroker):
    topic = "kcat-offsets"
    create(kbroker, topic)
    kcat(kbroker, "-P", "-t", topic, stdin="\n".join(str(i) for i in range(10)).encode())
    tail = kcat(kbroker, "-C", "-t", topic, "-o", "-3", "-e", "-f", "%o:%s\\n")
    assert tail.splitlines() == ["7:7", "8:8", "9:9"]
    at_end = kcat(kbroker, "-C", "-t", topic, "-o", "end", "-e", "-f", "%s\\n")
    assert at_end == ""


def test_kcat_queries_offsets_by_timestamp(kbroker):
    topic = "kcat-times"
    create(kbroker, topic)
    with Producer(kbroker.bootstrap) as p:
        for i, ts in enumerate([1_000, 2_000, 3_000]):
            p.send(topic, f"v{i}", partition=0, timestamp=ts)
        p.flush()
    out = kcat(kbroker, "-Q", "-t", f"{topic}:0:2000")
    assert out.strip().endswith("offset 1")  # the first record at or after 2000 ms


# -- confluent-kafka -------------------------------------------------------------------
@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_confluent_producer_and_assigned_consumer(kbroker, acks):
    ck = pytest.importorskip("confluent_kafka")
    topic = f"ck-acks-{acks}"
    create(kbroker, topic, 2)
    conf = {"bootstrap.servers": kbroker.kafka_bootstrap, "acks": acks, "linger.ms": 5}
    if acks == "all":
        conf["enable.idempotence"] = True
    producer = ck.Producer(conf)
    errors: list = []
    for i in range(1000):
        producer.produce(
            topic,
            value=f"v{i}".encode(),
            key=f"k{i % 7}".encode(),
            partition=i % 2,
            headers=[("h", f"{i}".encode())],
            timestamp=1_700_000_000_000 + i,
            on_delivery=lambda err, msg: err and errors.append(err),
        )
    assert producer.flush(30) == 0 and not errors
    consumer = ck.Consumer(
        {
            "bootstrap.servers": kbroker.kafka_bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(2)])
    seen = {}
    deadline = time.monotonic() + 30
    while len(seen) < 1000 and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        seen[msg.value()] = msg
    consumer.close()
    assert len(seen) == 1000
    for i in range(1000):
        msg = seen[f"v{i}".encode()]
        assert msg.key() == f"k{i % 7}".encode() and msg.partition() == i % 2
        assert msg.headers() == [("h", f"{i}".encode())]
        assert msg.timestamp() == (ck.TIMESTAMP_CREATE_TIME, 1_700_000_000_000 + i)
    # and the native client reads the same records
    native = native_read(kbroker, topic, 2, 1000)
    assert sorted(r.value for r in native) == sorted(seen)


def test_native_records_reach_confluent_consumer_record_for_record(kbroker):
    ck = pytest.importorskip("confluent_kafka")
    topic = "native-to-ck"
    create(kbroker, topic)
    with Producer(kbroker.bootstrap) as p:
        for i in range(300):
            p.send(
                topic,
                f"v{i}",
                key=f"k{i}",
                partition=0,
                headers=[("n", str(i))],
                timestamp=5_000 + i,
            )
        p.flush()
    consumer = ck.Consumer({"bootstrap.servers": kbroker.kafka_bootstrap, "group.id": "unused"})
    consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 300 and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is not None:
            assert msg.error() is None, msg.error()
            got.append(msg)
    consumer.close()
    assert [(m.offset(), m.key(), m.value(), m.headers(), m.timestamp()[1]) for m in got] == [
        (i, f"k{i}".encode(), f"v{i}".encode(), [("n", str(i).encode())], 5_000 + i)
        for i in range(300)
    ]


# -- kafka-python and aiokafka ---------------------------------------------------------
def test_kafka_python_produces_and_reads_with_assign(kbroker):
    kafka = pytest.importorskip("kafka")
    topic = "kp-topic"
    create(kbroker, topic)
    producer = kafka.KafkaProducer(bootstrap_servers=kbroker.kafka_bootstrap, acks="all")
    for i in range(100):
        producer.send(topic, value=f"v{i}".encode(), key=b"k", headers=[("h", b"x")])
    producer.flush(30)
    producer.close()
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=kbroker.kafka_bootstrap,
        enable_auto_commit=False,
        consumer_timeout_ms=10_000,
    )
    tp = kafka.TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    got = []
    for msg in consumer:
        got.append(msg)
        if len(got) == 100:
            break
    consumer.close()
    assert [m.value for m in got] == [f"v{i}".encode() for i in range(100)]
    assert all(m.key == b"k" and list(m.headers) == [("h", b"x")] for m in got)


async def test_aiokafka_produces_and_reads_with_assign(kbroker):
    aiokafka = pytest.importorskip("aiokafka")
    topic = "aio-topic"
    create(kbroker, topic)
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=kbroker.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(100):
            await producer.send_and_wait(topic, f"v{i}".encode(), key=b"k", partition=0)
    finally:
        await producer.stop()
    consumer = aiokafka.AIOKafkaConsumer(
        bootstrap_servers=kbroker.kafka_bootstrap, enable_auto_commit=False
    )
    await consumer.start()
    try:
        tp = aiokafka.TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        got = []
        while len(got) < 100:
            batch = await consumer.getmany(tp, timeout_ms=10_000)
            assert batch, f"no records after {len(got)}"
            got += batch[tp]
    finally:
        await consumer.stop()
    assert [m.value for m in got] == [f"v{i}".encode() for i in range(100)]


# -- offsets without a group protocol ----------------------------------------------------
def test_confluent_assign_commit_resume_and_native_sees_the_offsets(kbroker):
    ck = pytest.importorskip("confluent_kafka")
    topic, group = "ck-commit", "ck-assign-group"
    create(kbroker, topic, 2)
    producer = ck.Producer({"bootstrap.servers": kbroker.kafka_bootstrap})
    for i in range(100):
        producer.produce(topic, value=f"v{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0
    conf = {
        "bootstrap.servers": kbroker.kafka_bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    consumer = ck.Consumer(conf)
    consumer.assign([ck.TopicPartition(topic, p) for p in range(2)])
    seen = 0
    deadline = time.monotonic() + 30
    while seen < 60 and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            seen += 1
    consumer.commit(
        offsets=[ck.TopicPartition(topic, 0, 30), ck.TopicPartition(topic, 1, 20)],
        asynchronous=False,
    )
    committed = consumer.committed([ck.TopicPartition(topic, p) for p in range(2)], timeout=10)
    assert [(tp.partition, tp.offset) for tp in committed] == [(0, 30), (1, 20)]
    consumer.close()
    # the native protocol reads the same commits, and `logmq group describe` shows them
    with Admin(kbroker.bootstrap) as admin:
        offsets = admin.group_offsets(group)
    assert {tp: o.offset for tp, o in offsets.items()} == {(topic, 0): 30, (topic, 1): 20}
    shown = CliRunner().invoke(cli, ["-b", kbroker.bootstrap, "group", "describe", group, "--json"])
    assert shown.exit_code == 0, shown.output
    rows = json.loads(shown.stdout)["partitions"]
    assert {(r["partition"], r["committed_offset"], r["log_end_offset"]) for r in rows} == {
        (0, 30, 50),
        (1, 20, 50),
    }
    # a new consumer of the group resumes where the commits say
    consumer = ck.Consumer(conf)
    consumer.assign([ck.TopicPartition(topic, 0)])
    first = None
    deadline = time.monotonic() + 30
    while first is None and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            first = msg
    consumer.close()
    assert first is not None and first.offset() == 30


def test_native_commits_are_visible_to_kafka_python_and_back(kbroker):
    kafka = pytest.importorskip("kafka")
    from kafka.structs import OffsetAndMetadata

    topic, group = "kp-commit", "kp-group"
    create(kbroker, topic)
    with Admin(kbroker.bootstrap) as admin:
        admin.alter_group_offsets(group, {(topic, 0): 7})
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=kbroker.kafka_bootstrap, group_id=group, enable_auto_commit=False
    )
    tp = kafka.TopicPartition(topic, 0)
    consumer.assign([tp])
    assert consumer.committed(tp) == 7
    consumer.commit({tp: OffsetAndMetadata(9, "kp", -1)})
    consumer.close()
    with Admin(kbroker.bootstrap) as admin:
        got = admin.group_offsets(group)[(topic, 0)]
    assert (got.offset, got.metadata) == (9, "kp")


# -- topic admin ---------------------------------------------------------------------------
def test_confluent_admin_creates_grows_and_deletes_topics(kbroker):
    pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

    admin = AdminClient({"bootstrap.servers": kbroker.kafka_bootstrap})
    # validate-only creates nothing
    dry = admin.create_topics([NewTopic("ck-admin", 2, 1)], validate_only=True)
    dry["ck-admin"].result(30)
    assert "ck-admin" not in admin.list_topics(timeout=10).topics
    made = admin.create_topics(
        [NewTopic("ck-admin", 2, 1, config={"retention.ms": "60000", "cleanup.policy": "delete"})]
    )
    made["ck-admin"].result(30)
    again = admin.create_topics([NewTopic("ck-admin", 2, 1)])
    with pytest.raises(Exception, match=r"TOPIC_ALREADY_EXISTS|already exists"):
        again["ck-admin"].result(30)
    bad = admin.create_topics([NewTopic("ck-bad", 1, 1, config={"retention.ms": "soon"})])
    with pytest.raises(Exception, match=r"INVALID_CONFIG|retention"):
        bad["ck-bad"].result(30)
    with Admin(kbroker.bootstrap) as native:  # what the native side sees
        assert native.describe_configs(["ck-admin"])["ck-admin"]["retention.ms"].value == "60000"
    admin.create_partitions([NewPartitions("ck-admin", 5)])["ck-admin"].result(30)
    assert len(admin.list_topics("ck-admin", timeout=10).topics["ck-admin"].partitions) == 5
    admin.delete_topics(["ck-admin"])["ck-admin"].result(30)
    gone = admin.delete_topics(["ck-admin"])
    with pytest.raises(Exception, match="UNKNOWN_TOPIC"):
        gone["ck-admin"].result(30)


def test_kafka_python_admin_creates_and_deletes(kbroker):
    pytest.importorskip("kafka")
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=kbroker.kafka_bootstrap)
    cluster = admin.describe_cluster()
    assert cluster["controller_id"] == 1
    assert [(b["broker_id"], b["port"]) for b in cluster["brokers"]] == [(1, kbroker.kafka_port)]
    admin.create_topics([NewTopic("kp-admin", 3, 1)])
    assert "kp-admin" in admin.list_topics()
    admin.delete_topics(["kp-admin"])
    assert "kp-admin" not in admin.list_topics()
    admin.close()


def test_confluent_configs_both_ways(kbroker):
    pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    topic = "ck-configs"
    create(kbroker, topic, 1, **{"retention.ms": "60000", "segment.bytes": "1048576"})
    admin = AdminClient({"bootstrap.servers": kbroker.kafka_bootstrap})
    res = ConfigResource(ResourceType.TOPIC, topic)
    described = admin.describe_configs([res])[res].result(30)
    assert described["retention.ms"].value == "60000" and not described["retention.ms"].is_default
    assert described["cleanup.policy"].is_default
    # incremental: only what is named changes
    change = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.ms", "120000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry(
                "cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND
            ),
        ],
    )
    admin.incremental_alter_configs([change])[change].result(30)
    with Admin(kbroker.bootstrap) as native:
        got = native.describe_configs([topic])[topic]
    assert got["retention.ms"].value == "120000" and got["segment.bytes"].value == "1048576"
    assert set(got["cleanup.policy"].value.split(",")) == {"delete", "compact"}
    # AlterConfigs replaces every override: segment.bytes and cleanup.policy go back
    replace = ConfigResource(ResourceType.TOPIC, topic, set_config={"retention.ms": "90000"})
    admin.alter_configs([replace])[replace].result(30)
    with Admin(kbroker.bootstrap) as native:
        got = native.describe_configs([topic])[topic]
    assert got["retention.ms"].value == "90000"
    assert got["segment.bytes"].default and got["cleanup.policy"].default
    broker = ConfigResource(ResourceType.BROKER, "1")
    assert admin.describe_configs([broker])[broker].result(30)["node.id"].value == "1"


# -- group admin -------------------------------------------------------------------------
def test_kafka_admin_lists_describes_and_deletes_native_groups(kbroker):
    pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient

    topic, group = "grp-admin", "native-group"
    create(kbroker, topic, 2)
    with Producer(kbroker.bootstrap) as p:
        for i in range(20):
            p.send(topic, f"v{i}", partition=i % 2)
        p.flush()
    with Consumer(kbroker.bootstrap, group_id=group, auto_offset_reset="earliest") as c:
        c.subscribe([topic])
        got: list = []
        deadline = time.monotonic() + 30
        while len(got) < 20:
            assert time.monotonic() < deadline, f"read {len(got)} of 20"
            got += c.poll(1.0)
        c.commit()
        admin = AdminClient({"bootstrap.servers": kbroker.kafka_bootstrap})
        listed = admin.list_consumer_groups().result(30)
        assert group in {g.group_id for g in listed.valid}
        described = admin.describe_consumer_groups([group])[group].result(30)
        assert str(described.state).lower().endswith("stable")
        owned = {
            (tp.topic, tp.partition)
            for member in described.members
            for tp in member.assignment.topic_partitions
        }
        assert owned == {(topic, 0), (topic, 1)}
        # the group consumes: its offsets cannot be deleted, nor the group
        refused = admin.delete_consumer_groups([group])[group]
        with pytest.raises(Exception, match=r"NON_EMPTY_GROUP|not empty|has members"):
            refused.result(30)
    # the native consumer left: now both go
    admin.delete_consumer_groups([group])[group].result(30)
    listed = admin.list_consumer_groups().result(30)
    assert group not in {g.group_id for g in listed.valid}


def test_kafka_python_deletes_committed_offsets(kbroker):
    pytest.importorskip("kafka")
    from kafka.admin import KafkaAdminClient
    from kafka.structs import TopicPartition as KpTp

    topic, group = "kp-offdel", "kp-offdel-group"
    create(kbroker, topic, 2)
    with Admin(kbroker.bootstrap) as admin:
        admin.alter_group_offsets(group, {(topic, 0): 3, (topic, 1): 4})
    kp = KafkaAdminClient(bootstrap_servers=kbroker.kafka_bootstrap)
    offsets = kp.list_group_offsets({group: None})[group]
    assert {tp.partition: o.offset for tp, o in offsets.items()} == {0: 3, 1: 4}
    kp.delete_group_offsets(group, [KpTp(topic, 0)])
    with Admin(kbroker.bootstrap) as admin:
        left = admin.group_offsets(group)
    assert {tp: o.offset for tp, o in left.items()} == {(topic, 1): 4}
    kp.close()


# -- kafka-python and aiokafka admin, more broadly --------------------------------------
def test_kafka_python_admin_partitions_topics_and_configs(kbroker):
    pytest.importorskip("kafka")
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewPartitions

    topic = "kp-admin-more"
    create(kbroker, topic, 1, **{"retention.ms": "60000"})
    admin = KafkaAdminClient(bootstrap_servers=kbroker.kafka_bootstrap)
    try:
        admin.create_partitions({topic: NewPartitions(3)})
        [described] = admin.describe_topics([topic])
        assert described["error_code"] == 0 and not described["is_internal"]
        assert sorted(p["partition_index"] for p in described["partitions"]) == [0, 1, 2]
        res = ConfigResource(ConfigResourceType.TOPIC, topic)
        described = admin.describe_configs([res])["topic"][topic]
        assert described["retention.ms"]["value"] == "60000"
        assert described["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        # by default kafka-python alters incrementally: retention.ms stays
        change = ConfigResource(ConfigResourceType.TOPIC, topic, {"segment.ms": "1000"})
        admin.alter_configs([change])
        with Admin(kbroker.bootstrap) as native:
            got = native.describe_configs([topic])[topic]
            assert native.describe_topics([topic])[topic].partitions[2].leader == 1
        assert got["segment.ms"].value == "1000" and got["retention.ms"].value == "60000"
        # forced to AlterConfigs (which replaces every override), it sends the other
        # overrides along, having read them with DescribeConfigs
        replace = ConfigResource(ConfigResourceType.TOPIC, topic, {"segment.ms": "2000"})
        admin.alter_configs([replace], incremental=False)
    finally:
        admin.close()
    with Admin(kbroker.bootstrap) as native:
        got = native.describe_configs([topic])[topic]
    assert got["segment.ms"].value == "2000" and got["retention.ms"].value == "60000"


async def test_aiokafka_admin_topics_configs_cluster_and_groups(kbroker):
    aio_admin = pytest.importorskip("aiokafka.admin")
    from aiokafka.admin import NewPartitions, NewTopic
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    topic, group = "aio-admin", "aio-admin-group"
    admin = aio_admin.AIOKafkaAdminClient(bootstrap_servers=kbroker.kafka_bootstrap)
    await admin.start()
    try:
        cluster = await admin.describe_cluster()
        assert cluster["controller_id"] == 1
        assert [(b["node_id"], b["port"]) for b in cluster["brokers"]] == [(1, kbroker.kafka_port)]
        await admin.create_topics([NewTopic(topic, 2, 1, topic_configs={"retention.ms": "5000"})])
        assert topic in await admin.list_topics()
        await admin.create_partitions({topic: NewPartitions(4)})
        [described] = await admin.describe_topics([topic])
        assert len(described["partitions"]) == 4
        res = ConfigResource(ConfigResourceType.TOPIC, topic)
        [resp] = await admin.describe_configs([res])
        configs = {c[0]: c[1] for c in resp.resources[0][4]}
        assert configs["retention.ms"] == "5000"
        await admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, {"retention.ms": "7000"})]
        )
        [resp] = await admin.describe_configs([res])
        assert {c[0]: c[1] for c in resp.resources[0][4]}["retention.ms"] == "7000"
        with Admin(kbroker.bootstrap) as native:
            native.alter_group_offsets(group, {(topic, 0): 1})
        groups = await admin.list_consumer_groups()
        assert group in {g[0] for g in groups}
        await admin.delete_topics([topic])
        assert topic not in await admin.list_topics()
    finally:
        await admin.close()


def test_kafka_produce_refusals_are_per_partition_and_lose_nothing(kbroker):
    """Keyless records on a compacted topic and a batch over max.message.bytes are refused
    with Kafka's errors; the producer's later records land."""
    ck = pytest.importorskip("confluent_kafka")
    create(kbroker, "ck-compacted", 1, **{"cleanup.policy": "compact"})
    create(kbroker, "ck-small", 1, **{"max.message.bytes": "2000"})
    producer = ck.Producer({"bootstrap.servers": kbroker.kafka_bootstrap, "linger.ms": 0})
    outcomes: dict[str, object] = {}

    def report(name):
        return lambda err, msg: outcomes.__setitem__(name, err)

    # one batch each: a refused batch is refused whole, as on Kafka
    producer.produce("ck-compacted", value=b"no key", on_delivery=report("keyless"))
    producer.produce("ck-small", value=b"x" * 5000, on_delivery=report("big"))
    assert producer.flush(30) == 0
    producer.produce("ck-compacted", key=b"k", value=b"keyed", on_delivery=report("keyed"))
    producer.produce("ck-small", value=b"small", on_delivery=report("small"))
    assert producer.flush(30) == 0
    assert outcomes["keyless"].code() == ck.KafkaError.INVALID_RECORD
    assert outcomes["big"].code() == ck.KafkaError.MSG_SIZE_TOO_LARGE
    assert outcomes["keyed"] is None and outcomes["small"] is None
    got = native_read(kbroker, "ck-compacted", 1, 1) + native_read(kbroker, "ck-small", 1, 1)
    assert [(r.key, r.value) for r in got] == [(b"k", b"keyed"), (None, b"small")]
