"""Tiered storage end to end: a real broker copies closed segments to the remote tier,
local retention deletes the copied ones, and real Kafka clients read every record from
offset 0 across both tiers, at both isolation levels."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.harness import BrokerProcess

confluent_kafka = pytest.importorskip("confluent_kafka")

SEGMENT_BYTES = 64 * 1024
LOCAL_RETENTION_BYTES = 2 * SEGMENT_BYTES
FS_RSM = "io.aiven.kafka.tieredstorage.storage.filesystem.FileSystemStorage"
TIER_ARGS = (
    "remote.log.storage.system.enable=true",
    "remote.log.storage.manager.class.name=io.aiven.kafka.tieredstorage.RemoteStorageManager",
    f"rsm.config.storage.backend.class={FS_RSM}",
    "remote.log.manager.task.interval.ms=100",
    "rsm.config.chunk.size=16384",
)


def tier_args(root: Path, *extra: str) -> list[str]:
    out: list[str] = []
    for kv in (*TIER_ARGS, f"rsm.config.storage.root={root}", *extra):
        out += ["--override", kv]
    return out


def wait_for(cond, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def local_log_files(broker: BrokerProcess, topic: str, partition: int = 0) -> list[int]:
    d = broker.data_dir / f"{topic}-{partition}"
    return sorted(int(p.name[:20]) for p in d.glob("*.log"))


def remote_objects(root: Path, suffix: str = ".manifest") -> list[Path]:
    return sorted(root.rglob(f"*{suffix}"))


def create_tiered_topic(broker: BrokerProcess, name: str, **configs: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.kafka_bootstrap})
    config = {
        "remote.storage.enable": "true",
        "segment.bytes": str(SEGMENT_BYTES),
        "local.retention.bytes": str(LOCAL_RETENTION_BYTES),
        **configs,
    }
    admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(30)


def produce(broker: BrokerProcess, topic: str, count: int, size: int = 100) -> list[bytes]:
    p = confluent_kafka.Producer(
        {
            "bootstrap.servers": broker.kafka_bootstrap,
            "linger.ms": 5,
            "acks": "all",
            "batch.size": 16384,
        }
    )
    values = [b"%08d" % i + b"x" * (size - 8) for i in range(count)]
    for v in values:
        while True:
            try:
                p.produce(topic, v, partition=0)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    return values


def consume_confluent(broker: BrokerProcess, topic: str, count: int, isolation: str) -> list[bytes]:
    c = confluent_kafka.Consumer(
        {
            "bootstrap.servers": broker.kafka_bootstrap,
            "group.id": f"g-{topic}-{isolation}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    c.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    out: list[bytes] = []
    deadline = time.monotonic() + 90
    try:
        while len(out) < count and time.monotonic() < deadline:
            for m in c.consume(1000, 1.0):
                assert m.error() is None, m.error()
                out.append(m.value())
    finally:
        c.close()
    return out


def consume_kafka_python(broker: BrokerProcess, topic: str, count: int) -> list[bytes]:
    kafka = pytest.importorskip("kafka")
    c = kafka.KafkaConsumer(
        bootstrap_servers=broker.kafka_bootstrap, enable_auto_commit=False,
        consumer_timeout_ms=20_000, fetch_max_bytes=1 << 20,
    )  # fmt: skip
    tp = kafka.TopicPartition(topic, 0)
    c.assign([tp])
    c.seek(tp, 0)
    out = []
    for m in c:
        out.append(m.value)
        if len(out) >= count:
            break
    c.close()
    return out


def consume_kcat(broker: BrokerProcess, topic: str) -> list[bytes]:
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (.ci/run installs it)")
    proc = subprocess.run(
        ["kcat", "-b", broker.kafka_bootstrap, "-C", "-t", topic, "-p", "0", "-o", "beginning",
         "-e", "-q", "-f", "%s\\n"],
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc.stdout.split(b"\n")[:-1]


def start_tiered_broker(base: Path, *extra: str, **kwargs) -> BrokerProcess:
    """A started broker under ``base`` tiering to the directory ``base/remote``
    (``broker.remote_root``); ``extra`` are more --override KEY=VALUE settings."""
    root = base / "remote"
    root.mkdir()
    broker = BrokerProcess(base / "data", extra_args=tier_args(root, *extra), **kwargs)
    broker.start()
    broker.remote_root = root  # type: ignore[attr-defined]
    return broker


def spark_session(tmp_path: Path, app: str):
    """A local Spark session with the logmq source registered, and whether this call
    made it (the spark tests' session may be running); skips without Spark or Java."""
    import os
    import sys

    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("Spark needs Java 17: no java on PATH or in JAVA_HOME")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from logmq_spark import LogMQDataSource

    mine = SparkSession.getActiveSession() is None
    session = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", str(tmp_path / "local"))
        .config("spark.sql.warehouse.dir", str(tmp_path / "warehouse"))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(LogMQDataSource)
    return session, mine


@pytest.fixture(scope="module")
def tiered_broker(tmp_path_factory):
    broker = start_tiered_broker(tmp_path_factory.mktemp("tiered"))
    yield broker
    broker.stop()


def test_copied_segments_leave_the_disk_and_every_client_reads_from_zero(tiered_broker):
    broker = tiered_broker
    root: Path = broker.remote_root  # type: ignore[attr-defined]
    topic = "tiered-all"
    create_tiered_topic(broker, topic)
    values = produce(broker, topic, 20_000)
    # local retention lets copied segments go: two closed ones stay, and the active one
    wait_for(lambda: len(local_log_files(broker, topic)) <= 4, what="local segments to go")
    assert len(remote_objects(root)) >= 10
    assert consume_confluent(broker, topic, len(values), "read_committed") == values
    assert consume_confluent(broker, topic, len(values), "read_uncommitted") == values
    assert consume_kcat(broker, topic) == values
    assert consume_kafka_python(broker, topic, len(values)) == values


def test_list_offsets_over_both_tiers(tiered_broker):
    from confluent_kafka import TopicPartition

    broker = tiered_broker
    topic = "tiered-offsets"
    create_tiered_topic(broker, topic)
    values = produce(broker, topic, 10_000)
    wait_for(lambda: local_log_files(broker, topic)[0] > 0, what="local segments to go")
    c = confluent_kafka.Consumer({"bootstrap.servers": broker.kafka_bootstrap, "group.id": "lo"})
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        assert (low, high) == (0, len(values))  # earliest: the remote tier's start
    finally:
        c.close()


def remote_segment_files(root: Path, topic: str) -> list[Path]:
    return sorted(p for p in root.rglob("*.log") if p.parent.parent.name.startswith(f"{topic}-"))


def test_delete_records_and_topic_deletion_reach_the_remote_tier(tiered_broker):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    broker = tiered_broker
    root: Path = broker.remote_root  # type: ignore[attr-defined]
    topic = "tiered-delete"
    create_tiered_topic(broker, topic)
    values = produce(broker, topic, 10_000)
    wait_for(lambda: len(local_log_files(broker, topic)) <= 4, what="local segments to go")
    copied = remote_segment_files(root, topic)
    assert len(copied) >= 5
    # DeleteRecords below the local log start: offsets below it are gone from both tiers
    cut = 3_333
    admin = AdminClient({"bootstrap.servers": broker.kafka_bootstrap})
    fut = admin.delete_records([TopicPartition(topic, 0, cut)])
    (result,) = fut.values()
    assert result.result(30).low_watermark == cut
    c = confluent_kafka.Consumer({"bootstrap.servers": broker.kafka_bootstrap, "group.id": "d"})
    try:
        low, _high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        c.close()
    assert low == cut
    got = consume_confluent(broker, topic, len(values) - cut, "read_committed")
    assert got == values[cut:]
    # the remote segments wholly below the cut are deleted by the next pass
    wait_for(
        lambda: len(remote_segment_files(root, topic)) < len(copied),
        what="remote segments below the cut to go",
    )
    # deleting the topic deletes its remote data (the controller's broker does it)
    admin.delete_topics([topic])[topic].result(30)
    wait_for(lambda: not remote_segment_files(root, topic), what="the topic's remote data to go")
