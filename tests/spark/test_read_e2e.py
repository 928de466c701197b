"""The logmq source end to end: real broker process, local[2] Spark, batch and streaming."""

from __future__ import annotations

import json

import pytest

from logmq import Admin
from tests.spark.records import from_rows, produce

TIMEOUT = 120  # seconds a streaming query may take before the test fails


def read_batch(spark, bootstrap: str, **options: str):
    reader = spark.read.format("logmq").option("bootstrap", bootstrap)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_batch_read_of_four_partitions_equals_what_was_produced(
    spark, spark_broker, topic_name
) -> None:
    with Admin(spark_broker.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=4)
    produced = produce(spark_broker.bootstrap, topic_name, 3000, headers_every=7)
    assert {p for p, _ in produced} == {0, 1, 2, 3}

    df = read_batch(spark, spark_broker.bootstrap, topic=topic_name)
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,headers:array<struct<key:string,value:binary>>>"
    )
    rows = df.collect()
    assert len(rows) == 3000
    assert from_rows(rows) == produced
    assert {r.topic for r in rows} == {topic_name}

    # minPartitions splits the four ranges into more tasks, and changes nothing else
    split = read_batch(spark, spark_broker.bootstrap, topic=topic_name, minPartitions="10")
    assert split.rdd.getNumPartitions() >= 8
    assert from_rows(split.collect()) == produced


def test_batch_read_between_offsets_and_timestamps(spark, spark_broker, topic_name) -> None:
    with Admin(spark_broker.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)
    old = produce(spark_broker.bootstrap, topic_name, 200, timestamp=1_000_000)
    new = produce(spark_broker.bootstrap, topic_name, 200, first=200, timestamp=2_000_000)
    ends = {p: max(o for q, o in new if q == p) + 1 for p in (0, 1)}

    start = {topic_name: {"0": 10, "1": -2}}
    end = {topic_name: {"0": ends[0] - 5, "1": -1}}
    df = read_batch(
        spark,
        spark_broker.bootstrap,
        topics=topic_name,
        startingOffsets=json.dumps(start),
        endingOffsets=json.dumps(end),
    )
    want = {
        k: v
        for k, v in {**old, **new}.items()
        if (k[0] == 0 and 10 <= k[1] < ends[0] - 5) or k[0] == 1
    }
    assert from_rows(df.collect()) == want

    by_time = read_batch(
        spark, spark_broker.bootstrap, topic=topic_name, startingTimestamp="1500000"
    )
    assert from_rows(by_time.collect()) == new


def test_batch_read_refuses_bad_offsets(spark, spark_broker, topic_name) -> None:
    with Admin(spark_broker.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)
    produce(spark_broker.bootstrap, topic_name, 10)
    with pytest.raises(Exception, match="missing"):
        read_batch(
            spark,
            spark_broker.bootstrap,
            topic=topic_name,
            startingOffsets=json.dumps({topic_name: {"0": 0}}),
        ).collect()
    with pytest.raises(Exception, match="beyond the end"):
        read_batch(
            spark,
            spark_broker.bootstrap,
            topic=topic_name,
            endingOffsets=json.dumps({topic_name: {"0": 1000, "1": -1}}),
        ).collect()
    with pytest.raises(Exception, match="does not exist"):
        read_batch(spark, spark_broker.bootstrap, topic=topic_name + "-nope").collect()


def run_available_now(spark, bootstrap: str, out: str, checkpoint: str, **options: str):
    reader = spark.readStream.format("logmq").option("bootstrap", bootstrap)
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(TIMEOUT), "the availableNow query did not finish"
    return query


def test_restart_from_checkpoint_reads_every_record_exactly_once(
    spark, spark_broker, topic_name, tmp_path
) -> None:
    """A pattern subscription, restarted twice; the second run also finds a new topic."""
    first, second = f"{topic_name}-a", f"{topic_name}-b"
    with Admin(spark_broker.bootstrap) as admin:
        admin.create_topic(first, partitions=4)
    produced = produce(spark_broker.bootstrap, first, 1000, headers_every=5)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    options = {"pattern": f"{topic_name}-.*", "startingOffsets": "earliest"}

    run_available_now(spark, spark_broker.bootstrap, out, ckpt, **options)
    assert spark.read.parquet(out).count() == 1000

    produced.update(produce(spark_broker.bootstrap, first, 700, first=1000))
    with Admin(spark_broker.bootstrap) as admin:
        admin.create_topic(second, partitions=2)
    late = produce(spark_broker.bootstrap, second, 300)
    run_available_now(spark, spark_broker.bootstrap, out, ckpt, **options)
    # and a third run with nothing new adds nothing
    run_available_now(spark, spark_broker.bootstrap, out, ckpt, **options)

    rows = spark.read.parquet(out).collect()
    assert len(rows) == 2000  # exactly once: no record twice...
    assert from_rows([r for r in rows if r.topic == first]) == produced  # ...none missing
    assert from_rows([r for r in rows if r.topic == second]) == late


def test_max_records_per_trigger_is_respected(spark, spark_broker, topic_name, tmp_path) -> None:
    with Admin(spark_broker.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=4)
    produced = produce(spark_broker.bootstrap, topic_name, 1000)
    query = run_available_now(
        spark,
        spark_broker.bootstrap,
        str(tmp_path / "out"),
        str(tmp_path / "checkpoint"),
        topic=topic_name,
        startingOffsets="earliest",
        maxRecordsPerTrigger="300",
    )
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [300, 300, 300, 100]
    assert from_rows(spark.read.parquet(str(tmp_path / "out")).collect()) == produced


def test_a_bad_source_option_fails_at_load_naming_it(spark, spark_broker) -> None:
    """docs/spark.md: options are checked when the query is defined, not at its first
    action (Spark calls a source's schema() at load(), batch and streaming alike)."""
    for reader in (lambda: spark.read, lambda: spark.readStream):  # a reader keeps options
        bad = reader().format("logmq").option("bootstrap", spark_broker.bootstrap)
        bad = bad.option("topic", "t").option("maxRecordsPerPartition", "-3")
        with pytest.raises(Exception, match="maxRecordsPerPartition"):
            bad.load()
        with pytest.raises(Exception, match="bootstrap"):
            reader().format("logmq").option("topic", "t").load()


def test_a_bad_sink_option_stops_the_streaming_query_with_its_name(
    spark, spark_broker, tmp_path
) -> None:
    """Spark calls a streaming sink first from the query's own thread, after start()
    returned: the query stops with the option's error (docs/spark.md says so)."""
    query = (
        spark.readStream.format("rate")
        .load()
        .selectExpr("cast(value as string) as value")
        .writeStream.format("logmq")
        .option("bootstrap", spark_broker.bootstrap)
        .option("topic", "sink-bad-option")
        .option("acks", "sometimes")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start()
    )
    with pytest.raises(Exception, match="acks"):
        query.awaitTermination(TIMEOUT)
    assert not query.isActive
