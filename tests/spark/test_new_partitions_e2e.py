"""A streaming query finds partitions added to its topic between two availableNow runs."""

from __future__ import annotations

import json

from logmq import Admin
from tests.spark.records import from_rows, produce

TIMEOUT = 120  # seconds a streaming query may take before the test fails


def run_available_now(spark, bootstrap: str, topic: str, out: str, checkpoint: str):
    query = (
        spark.readStream.format("logmq")
        .option("bootstrap", bootstrap)
        .option("topic", topic)
        .option("startingOffsets", "latest")
        .load()
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(TIMEOUT), "the availableNow query did not finish"
    return query


def test_partitions_added_between_runs_are_read_from_their_start(
    spark, spark_broker, topic_name, tmp_path
) -> None:
    bootstrap = spark_broker.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    produce(bootstrap, topic_name, 50)  # before the query: "latest" skips these
    run_available_now(spark, bootstrap, topic_name, out, ckpt)

    first = produce(bootstrap, topic_name, 300, first=50)
    run_available_now(spark, bootstrap, topic_name, out, ckpt)
    assert from_rows(spark.read.parquet(out).collect()) == first

    with Admin(bootstrap) as admin:
        admin.create_partitions({topic_name: 4})
    # a new producer sees four partitions: the keys spread over the new ones too
    second = produce(bootstrap, topic_name, 300, first=350)
    assert {p for p, _ in second} == {0, 1, 2, 3}
    query = run_available_now(spark, bootstrap, topic_name, out, ckpt)

    # every record exactly once, the new partitions from offset 0 (not from "latest")
    assert from_rows(spark.read.parquet(out).collect()) == {**first, **second}
    assert min(o for p, o in second if p >= 2) == 0
    ends = [p["sources"][0]["endOffset"] for p in query.recentProgress if p["numInputRows"]]
    end = ends[-1] if isinstance(ends[-1], dict) else json.loads(ends[-1])
    assert set(end[topic_name]) == {"0", "1", "2", "3"}
