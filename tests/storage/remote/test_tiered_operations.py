"""What an operator of a tiered broker sees besides the CLI: the remote tier's Prometheus
metrics on ``--metrics-port``, and DescribeLogDirs on the Kafka door reporting local
sizes only (as Kafka does: the remote tier's bytes are not on that disk)."""

from __future__ import annotations

import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from logmq.client import Admin
from tests.harness import BrokerProcess, free_port
from tests.storage.remote.test_tiered_broker import (
    LOCAL_RETENTION_BYTES,
    SEGMENT_BYTES,
    consume_confluent,
    create_tiered_topic,
    local_log_files,
    produce,
    tier_args,
    wait_for,
)

Families = dict[str, list[tuple[dict[str, str], float]]]


def scrape(port: int) -> Families:
    """Family name (a counter's without ``_total``) -> its samples' labels and values."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: Families = {}
    for family in text_string_to_metric_families(text):
        samples = [
            (dict(s.labels), s.value) for s in family.samples if not s.name.endswith("_created")
        ]
        out[family.name] = samples
    return out


def value(families: Families, name: str) -> float:
    [(labels, v)] = families[name]
    assert labels == {}, (name, labels)
    return v


@pytest.fixture(scope="module")
def metered(tmp_path_factory):
    base = tmp_path_factory.mktemp("tiered-ops")
    root = base / "remote"
    root.mkdir()
    port = free_port()
    broker = BrokerProcess(
        base / "data", extra_args=[*tier_args(root), "--metrics-port", str(port)]
    )
    broker.start()
    broker.metrics_port = port  # type: ignore[attr-defined]
    yield broker
    broker.stop()


def test_the_remote_tier_metrics_count_copies_reads_and_lag(metered):
    port = metered.metrics_port  # type: ignore[attr-defined]
    before = scrape(port)
    for name in (
        "logmq_remote_copy_segments",
        "logmq_remote_copy_bytes",
        "logmq_remote_fetch_requests",
        "logmq_remote_fetch_bytes",
        "logmq_remote_errors",
        "logmq_remote_cache_hits",
        "logmq_remote_cache_misses",
        "logmq_remote_copy_lag_bytes",
        "logmq_remote_copy_lag_segments",
    ):
        assert name in before, name  # exposed from the start, zero or not
    assert value(before, "logmq_remote_fetch_requests") == 0

    topic = "metered"
    create_tiered_topic(metered, topic)
    values = produce(metered, topic, 10_000)
    wait_for(lambda: local_log_files(metered, topic)[0] > 0, what="local segments to go")
    copied = scrape(port)
    assert value(copied, "logmq_remote_copy_segments") > 0
    assert value(copied, "logmq_remote_copy_bytes") >= SEGMENT_BYTES / 2
    assert value(copied, "logmq_remote_copy_lag_bytes") >= 0
    assert value(copied, "logmq_remote_copy_lag_segments") >= 0

    # a read from offset 0 goes to the remote tier for what the local log no longer has
    assert consume_confluent(metered, topic, len(values), "read_uncommitted") == values
    read = scrape(port)
    assert value(read, "logmq_remote_fetch_requests") > 0
    assert value(read, "logmq_remote_fetch_bytes") > 0
    assert value(read, "logmq_remote_cache_misses") > 0  # the first reads fetch chunks
    assert value(read, "logmq_remote_cache_hits") >= 0
    errors = {labels["kind"]: v for labels, v in read["logmq_remote_errors"]}
    assert errors.get("corrupt", 0) == 0 and errors.get("fetch", 0) == 0
    assert errors.get("copy", 0) == 0


def test_describe_log_dirs_reports_the_local_size_of_a_tiered_partition(metered):
    kafka_admin = pytest.importorskip("kafka.admin")
    topic = "dirs-tiered"
    create_tiered_topic(metered, topic)
    produce(metered, topic, 10_000)  # about 1.1 MB, of which the disk keeps a few segments
    # copied and let go down to local retention: two closed segments and the active one
    wait_for(lambda: len(local_log_files(metered, topic)) <= 4, what="local segments to go")
    admin = kafka_admin.KafkaAdminClient(bootstrap_servers=metered.kafka_bootstrap)
    try:
        [answer] = admin.describe_log_dirs(topic_partitions={topic: [0]})
    finally:
        admin.close()
    [log_dir] = answer["log_dirs"]
    [entry] = log_dir["topics"]
    [part] = entry["partitions"]
    size = part["partition_size"]
    with Admin(metered.bootstrap) as native:
        local = native.describe_log_dirs(1, [(topic, 0)])[(topic, 0)]
    # the same local figure on both doors, and it is the local segments' only: well
    # under what was produced, bounded by local retention plus the segments it keeps
    assert size == local.size
    assert 0 < size <= LOCAL_RETENTION_BYTES + 3 * SEGMENT_BYTES
    on_disk = sum(p.stat().st_size for p in (metered.data_dir / f"{topic}-0").glob("*.log"))
    assert size <= on_disk + SEGMENT_BYTES  # a segment may roll or go between the two
    assert local.log_start_offset > 0  # DescribeLogDirs' log start is the local one


def test_a_native_consumer_reads_a_tiered_topic_from_zero(metered):
    from logmq.client import Consumer

    topic = "native-from-zero"
    create_tiered_topic(metered, topic)
    values = produce(metered, topic, 10_000)
    wait_for(lambda: local_log_files(metered, topic)[0] > 0, what="local segments to go")
    got: list[bytes] = []
    with Consumer(metered.bootstrap) as consumer:
        consumer.assign([(topic, 0)])
        consumer.seek_to_beginning()
        end = time.monotonic() + 60
        while len(got) < len(values) and time.monotonic() < end:
            got += [r.value for r in consumer.poll(timeout=1.0)]
    assert got == values
