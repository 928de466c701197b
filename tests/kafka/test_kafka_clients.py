"""Real Kafka clients against a real ``logmq-server``'s Kafka listener.

kcat (librdkafka 2.0, from apt), confluent-kafka (librdkafka 2.x), kafka-python and
aiokafka (PyPI) produce and read records; the native client reads what they wrote and
the reverse, record for record (keys, values, headers, timestamps).
"""

from __future__ import annotations

import subprocess
import time

import pytest

from logmq.client import Admin, Consumer, Producer
from tests.harness import BrokerProcess


@pytest.fixture(scope="module")
def kbroker(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("kafka") / "data")
    broker.start()
    yield broker
    broker.stop()


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
