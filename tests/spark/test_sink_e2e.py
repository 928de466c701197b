"""The logmq sink end to end: batch and streaming writes round-trip key, value and headers."""

from __future__ import annotations

from collections import Counter

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from logmq import Admin
from tests.spark.records import consume_all

TIMEOUT = 120
HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)


def rows(n: int) -> list[tuple]:
    out = []
    for i in range(n):
        headers = [("seq", str(i).encode()), ("none", None)] if i % 3 == 0 else None
        key = f"user-{i % 17}".encode() if i % 5 else None
        out.append((key, f"click-{i}".encode(), headers))
    return out


def as_counter(records) -> Counter:
    return Counter((r.key, r.value, tuple(r.headers) or None) for r in records)


def expected(data) -> Counter:
    return Counter((k, v, tuple(h) if h else None) for k, v, h in data)


def test_batch_write_round_trips_key_value_and_headers(spark, spark_broker, topic_name) -> None:
    with Admin(spark_broker.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=3)
    data = rows(2000)
    schema = StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("headers", HEADERS),
        ]
    )
    df = spark.createDataFrame(data, schema).repartition(2)
    df.write.format("logmq").option("bootstrap", spark_broker.bootstrap).option(
        "topic", topic_name
    ).mode("append").save()
    got = consume_all(spark_broker.bootstrap, topic_name, 3)
    assert as_counter(got) == expected(data)


def test_batch_write_routes_by_topic_and_partition_columns(spark, spark_broker, topic_name) -> None:
    a, b = f"{topic_name}-a", f"{topic_name}-b"
    with Admin(spark_broker.bootstrap) as admin:
        admin.create_topic(a, partitions=2)
        admin.create_topic(b, partitions=2)
    data = [(a if i % 2 else b, i % 2, f"k{i}", f"v{i}") for i in range(100)]
    schema = StructType(
        [
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("key", StringType()),
            StructField("value", StringType()),
        ]
    )
    spark.createDataFrame(data, schema).write.format("logmq").option(
        "bootstrap", spark_broker.bootstrap
    ).mode("append").save()
    for topic in (a, b):
        got = consume_all(spark_broker.bootstrap, topic, 2)
        want = [(p, k.encode(), v.encode()) for t, p, k, v in data if t == topic]
        assert sorted((r.partition, r.key, r.value) for r in got) == sorted(want)


def test_sink_refuses_bad_columns_and_modes(spark, spark_broker, topic_name) -> None:
    df = spark.createDataFrame([(1,)], "value int")
    with pytest.raises(Exception, match="'value' must be binary or string"):
        df.write.format("logmq").option("bootstrap", spark_broker.bootstrap).option(
            "topic", topic_name
        ).mode("append").save()
    ok = spark.createDataFrame([("x",)], "value string")
    with pytest.raises(Exception, match="needs the option 'topic'"):
        ok.write.format("logmq").option("bootstrap", spark_broker.bootstrap).mode("append").save()
    with pytest.raises(Exception, match="does not exist"):
        ok.write.format("logmq").option("bootstrap", spark_broker.bootstrap).option(
            "topic", topic_name + "-missing"
        ).mode("append").save()
    with pytest.raises(Exception, match="overwrite"):
        ok.write.format("logmq").option("bootstrap", spark_broker.bootstrap).option(
            "topic", topic_name
        ).mode("overwrite").save()


def test_streaming_copy_between_topics(spark, spark_broker, topic_name, tmp_path) -> None:
    """readStream from one topic, writeStream to another: the copy holds the same records."""
    src, dst = f"{topic_name}-src", f"{topic_name}-dst"
    with Admin(spark_broker.bootstrap) as admin:
        admin.create_topic(src, partitions=2)
        admin.create_topic(dst, partitions=3)
    data = rows(500)
    schema = "key binary, value binary, headers array<struct<key: string, value: binary>>"
    spark.createDataFrame(data, schema).write.format("logmq").option(
        "bootstrap", spark_broker.bootstrap
    ).option("topic", src).mode("append").save()

    query = (
        spark.readStream.format("logmq")
        .option("bootstrap", spark_broker.bootstrap)
        .option("topic", src)
        .option("startingOffsets", "earliest")
        .load()
        .select("key", "value", "headers")
        .writeStream.format("logmq")
        .option("bootstrap", spark_broker.bootstrap)
        .option("topic", dst)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(TIMEOUT)
    assert as_counter(consume_all(spark_broker.bootstrap, dst, 3)) == expected(data)
