"""The source and sink over Spark Connect, unchanged (issue 29).

A driver in a subprocess (this module run as ``python -m tests.spark.test_spark_connect
BOOTSTRAP SRC OUT``) opens a Spark Connect session (``remote("local[2]")``: PySpark
starts a Connect server in local mode and talks gRPC to it), registers the data source
over Connect, and:

- reads the source topic in a batch (read_committed, the default);
- copies it with the exactly-once sink and with the at-least-once sink;
- copies it in a stream with ``exactlyOnce`` (``trigger(availableNow=True)``);
- defines a read with a bad option: over Connect a DataFrame is a plan the server
  analyses at first use, so the error comes at ``df.schema`` (or an action), not at
  ``load()``; and a stream with a bad option fails at ``start()``.

A subprocess because Connect's local mode and the suite's classic session cannot
share one Python process. The test then reads every output back with logmq's own
read_committed consumer: each record exactly once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from logmq import Admin, Consumer, Producer

ROOT = Path(__file__).resolve().parents[2]
N = 3000
TIMEOUT = 300


def driver(bootstrap: str, src: str, out: str) -> dict:
    """The Connect driver: what it saw, as JSON-able counts and error texts."""
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    from logmq_spark import LogMQDataSource

    base = Path(tempfile.mkdtemp(prefix="logmq-connect-"))
    spark = (
        SparkSession.builder.remote("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", str(base / "local"))
        .config("spark.sql.warehouse.dir", str(base / "warehouse"))
        .getOrCreate()
    )
    seen: dict = {"session": type(spark).__module__}
    try:
        spark.dataSource.register(LogMQDataSource)

        def reader(topic: str):
            return spark.read.format("logmq").option("bootstrap", bootstrap).option("topic", topic)

        df = reader(src).load()
        seen["read"] = df.count()
        rows = df.select("key", "value")
        for name, eos in ((f"{out}-eos", "true"), (f"{out}-alo", "false")):
            rows.write.format("logmq").option("bootstrap", bootstrap).option("topic", name).option(
                "exactlyOnce", eos
            ).mode("append").save()
        stream = (
            spark.readStream.format("logmq")
            .option("bootstrap", bootstrap)
            .option("topic", src)
            .option("startingOffsets", "earliest")
            .load()
            .select("key", "value")
            .writeStream.format("logmq")
            .option("bootstrap", bootstrap)
            .option("topic", f"{out}-stream")
            .option("exactlyOnce", "true")
            .option("checkpointLocation", str(base / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        stream.awaitTermination(TIMEOUT)
        seen["stream_active"] = stream.isActive

        bad = reader(src).option("startingOffsets", "sideways").load()  # a plan only
        try:
            seen["bad_fields"] = bad.schema.fieldNames()  # analysed here: raises
        except PySparkException as e:
            seen["bad_schema"] = str(e)
        try:
            spark.readStream.format("logmq").option("bootstrap", bootstrap).option(
                "topic", src
            ).option("maxRecordsPerTrigger", "-5").load().writeStream.format("console").option(
                "checkpointLocation", str(base / "bad-checkpoint")
            ).start()
        except PySparkException as e:
            seen["bad_start"] = str(e)
    finally:
        spark.stop()
    return seen


def read_back(bootstrap: str, topic: str, partitions: int) -> Counter:
    """Every value of ``topic`` at read_committed, counted."""
    got: Counter = Counter()
    tps = [(topic, p) for p in range(partitions)]
    with Consumer(bootstrap, auto_offset_reset="earliest", isolation_level="read_committed") as c:
        c.assign(tps)
        ends = c.end_offsets(tps)
        for _ in range(400):
            if all(c.position(t, p) >= ends[(t, p)] for t, p in tps):
                break
            got.update(r.value for r in c.poll(0.25))
    return got


@pytest.mark.timeout(TIMEOUT + 60)
def test_source_and_sink_over_spark_connect(spark_broker) -> None:
    pytest.importorskip("grpc", reason="Spark Connect needs pyspark[connect]")
    from tests.spark.conftest import java_available

    if not java_available():
        pytest.skip("Spark needs Java 17")
    bootstrap = spark_broker.bootstrap
    src, out = "connect-src", "connect-out"
    with Admin(bootstrap) as admin:
        admin.create_topic(src, 3)
        for suffix in ("eos", "alo", "stream"):
            admin.create_topic(f"{out}-{suffix}", 2)
    values = [b"v%d" % i for i in range(N)]
    with Producer(bootstrap, acks="all") as producer:
        for i, v in enumerate(values):
            producer.send(src, v, key=b"k%d" % i)
        producer.flush()

    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    run = subprocess.run(
        [sys.executable, "-m", "tests.spark.test_spark_connect", bootstrap, src, out],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])

    assert seen["session"].startswith("pyspark.sql.connect")  # not a classic session
    assert seen["read"] == N
    assert not seen["stream_active"]
    for suffix in ("eos", "alo", "stream"):
        assert read_back(bootstrap, f"{out}-{suffix}", 2) == Counter(values), suffix
    assert "startingOffsets" in seen.get("bad_schema", ""), seen
    assert "maxRecordsPerTrigger" in seen.get("bad_start", ""), seen


if __name__ == "__main__":
    print(json.dumps(driver(*sys.argv[1:4])))
