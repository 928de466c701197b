"""Issue 36's acceptance run: 200 MB into a tiered topic with small segments and 10 MB of
local retention; the copied segments leave the disk, and kcat, confluent-kafka,
kafka-python and the Spark source read every record from offset 0 exactly once, at both
isolation levels (``LOGMQ_TIER_MB`` sets the size; 200 by default)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.storage.remote.test_tiered_broker import (
    local_log_files,
    spark_session,
    start_tiered_broker,
    wait_for,
)

confluent_kafka = pytest.importorskip("confluent_kafka")

MB = int(os.environ.get("LOGMQ_TIER_MB", "200"))
VALUE = 1024
COUNT = MB * 1_000_000 // VALUE
SEGMENT = 1 << 20
LOCAL_RETENTION = 10_000_000
TOPIC = "tiered-200mb"


def value(i: int) -> bytes:
    return b"%010d" % i + b"v" * (VALUE - 10)


def index_of(v: bytes) -> int:
    return int(v[:10])


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = start_tiered_broker(tmp_path_factory.mktemp("tier200"), log_level="warning")
    try:
        admin = AdminClient({"bootstrap.servers": broker.kafka_bootstrap})
        config = {
            "remote.storage.enable": "true",
            "segment.bytes": str(SEGMENT),
            "local.retention.bytes": str(LOCAL_RETENTION),
        }
        admin.create_topics([NewTopic(TOPIC, 1, 1, config=config)])[TOPIC].result(30)
        p = confluent_kafka.Producer(
            {
                "bootstrap.servers": broker.kafka_bootstrap,
                "linger.ms": 5,
                "batch.size": 256 * 1024,
                "acks": "all",
                "queue.buffering.max.kbytes": 256 * 1024,
            }
        )
        for i in range(COUNT):
            while True:
                try:
                    p.produce(TOPIC, value(i), partition=0)
                    break
                except BufferError:
                    p.poll(0.05)
        assert p.flush(120) == 0
        # every closed segment copied, and local retention down to about 10 MB
        limit = LOCAL_RETENTION // SEGMENT + 2
        wait_for(
            lambda: len(local_log_files(broker, TOPIC)) <= limit,
            timeout=180,
            what="the copied segments to leave the disk",
        )
        yield broker
    finally:
        broker.stop()


def test_the_disk_keeps_only_the_local_retention(loaded):
    on_disk = sum(p.stat().st_size for p in (loaded.data_dir / f"{TOPIC}-0").glob("*.log"))
    assert on_disk <= LOCAL_RETENTION + 2 * SEGMENT
    assert local_log_files(loaded, TOPIC)[0] > COUNT // 2


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_confluent_kafka_reads_every_record_once(loaded, isolation):
    c = confluent_kafka.Consumer(
        {
            "bootstrap.servers": loaded.kafka_bootstrap,
            "group.id": f"g200-{isolation}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "fetch.max.bytes": 8 << 20,
        }
    )
    c.assign([confluent_kafka.TopicPartition(TOPIC, 0, 0)])
    expect = 0
    deadline = time.monotonic() + 180
    try:
        while expect < COUNT and time.monotonic() < deadline:
            for m in c.consume(2000, 1.0):
                assert m.error() is None, m.error()
                assert m.offset() == expect and index_of(m.value()) == expect
                expect += 1
    finally:
        c.close()
    assert expect == COUNT


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_kcat_reads_every_record_once(loaded, isolation):
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (.ci/run installs it)")
    proc = subprocess.run(
        ["kcat", "-b", loaded.kafka_bootstrap, "-C", "-t", TOPIC, "-p", "0", "-o", "beginning",
         "-e", "-q", "-X", f"isolation.level={isolation}", "-f", "%o %S\\n"],
        capture_output=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    lines = proc.stdout.split(b"\n")[:-1]
    assert len(lines) == COUNT
    assert all(line == b"%d %d" % (i, VALUE) for i, line in enumerate(lines))


def test_kafka_python_reads_every_record_once(loaded):
    kafka = pytest.importorskip("kafka")
    c = kafka.KafkaConsumer(
        bootstrap_servers=loaded.kafka_bootstrap, enable_auto_commit=False,
        consumer_timeout_ms=30_000, fetch_max_bytes=8 << 20, max_partition_fetch_bytes=4 << 20,
    )  # fmt: skip
    tp = kafka.TopicPartition(TOPIC, 0)
    c.assign([tp])
    c.seek(tp, 0)
    expect = 0
    try:
        for m in c:
            assert m.offset == expect and index_of(m.value) == expect
            expect += 1
            if expect == COUNT:
                break
    finally:
        c.close()
    assert expect == COUNT


def test_the_spark_source_reads_every_record_once(loaded, tmp_path: Path):
    session, mine = spark_session(tmp_path, "logmq-tiered-200mb")
    from pyspark.sql import functions as F

    df = (
        session.read.format("logmq")
        .option("bootstrap", loaded.bootstrap)
        .option("topic", TOPIC)
        .option("startingOffsets", "earliest")
        .load()
    )
    index = F.substring(F.col("value").cast("string"), 1, 10).cast("long")
    try:
        row = df.agg(
            F.count("*").alias("n"),
            F.countDistinct("offset").alias("distinct"),
            F.min("offset").alias("lo"),
            F.max("offset").alias("hi"),
            F.sum((index != F.col("offset")).cast("int")).alias("misplaced"),
        ).collect()[0]
    finally:
        if mine:
            session.stop()
    assert (row.n, row.distinct, row.lo, row.hi, row.misplaced) == (COUNT, COUNT, 0, COUNT - 1, 0)
