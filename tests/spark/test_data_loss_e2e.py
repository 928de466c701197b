"""Offsets removed by retention before the query read them: failOnDataLoss decides.

The broker runs in this process (see threaded_broker.py) so the test can run a
retention pass at once; Spark's workers reach it over 127.0.0.1 as usual.
"""

from __future__ import annotations

import json
import time

import pytest
from pyspark.errors import StreamingQueryException

from logmq import Admin
from tests.spark.records import from_rows, produce

TIMEOUT = 120
HOUR_AGO = int(time.time() * 1000) - 3_600_000


def stream_to_parquet(spark, bootstrap: str, topic: str, out: str, checkpoint: str, **options):
    reader = (
        spark.readStream.format("logmq")
        .option("bootstrap", bootstrap)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
    )
    for k, v in options.items():
        reader = reader.option(k, v)
    return (
        reader.load()
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )


def test_retention_deleted_offsets_fail_or_are_skipped(
    spark, threaded_broker, topic_name, tmp_path
) -> None:
    bootstrap = threaded_broker.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, configs={"segment.bytes": "1024"})
    small = {"linger_ms": 0, "batch_size": 1024}  # many small batches: many segments
    first = produce(bootstrap, topic_name, 100, timestamp=HOUR_AGO, value_size=100, **small)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    q = stream_to_parquet(spark, bootstrap, topic_name, out, ckpt)
    assert q.awaitTermination(TIMEOUT)
    assert spark.read.parquet(out).count() == 100

    second = produce(
        bootstrap, topic_name, 100, first=100, timestamp=HOUR_AGO, value_size=100, **small
    )
    with Admin(bootstrap) as admin:
        admin.alter_configs(topic_name, set={"retention.ms": "60000"})
        assert threaded_broker.run_retention() > 0
        log_start = admin.list_offsets({(topic_name, 0): -2})[(topic_name, 0)][0]
    assert 100 < log_start < 200, "retention should have removed unread records"

    # failOnDataLoss=true (the default): the query stops with a clear error
    q = stream_to_parquet(spark, bootstrap, topic_name, out, ckpt)
    with pytest.raises(StreamingQueryException) as failure:
        q.awaitTermination(TIMEOUT)
    message = str(failure.value)
    assert f"offsets 100..{log_start - 1} of {topic_name}-0 were removed" in message
    assert "failOnDataLoss" in message
    assert spark.read.parquet(out).count() == 100  # nothing of the failed batch was written

    # failOnDataLoss=false: the same checkpoint carries on from the log start
    q = stream_to_parquet(spark, bootstrap, topic_name, out, ckpt, failOnDataLoss="false")
    assert q.awaitTermination(TIMEOUT)
    kept = {k: v for k, v in second.items() if k[1] >= log_start}
    assert from_rows(spark.read.parquet(out).collect()) == {**first, **kept}

    # a batch read from offset 0 meets the same rule at planning time
    frm_zero = json.dumps({topic_name: {"0": 0}})
    batch = (
        spark.read.format("logmq")
        .option("bootstrap", bootstrap)
        .option("topic", topic_name)
        .option("startingOffsets", frm_zero)
    )
    with pytest.raises(Exception, match="failOnDataLoss"):
        batch.load().collect()
    rows = batch.option("failOnDataLoss", "false").load().collect()
    assert from_rows(rows) == kept
