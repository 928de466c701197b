"""Spark source and sink throughput (issue 7): records/s read into and written from Spark.

Starts its own ``logmq-server`` on a free 127.0.0.1 port with a temp data dir, fills a
4-partition topic with 100-byte records, then on a local[2] SparkSession measures

- read: ``spark.read.format("logmq")...load().count()`` of the whole topic;
- write: ``spark.range(N)`` turned into 100-byte values, ``df.write.format("logmq")`` to
  another 4-partition topic (idempotent producer, acks=all);

after one warm-up of each on a small topic (JVM JIT, Python worker start). Each
measurement is repeated and every run is printed. Usage:

    python benchmarks/bench_spark.py [--records N] [--runs K] [--json]

Target: read >= 300,000 records/s. Speed goals live here, never in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness import BrokerProcess  # noqa: E402

READ_TARGET = 300_000
VALUE_SIZE = 100
PARTITIONS = 4


def fill(bootstrap: str, topic: str, records: int) -> None:
    from logmq import Admin, Producer

    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=PARTITIONS)
    value = b"x" * VALUE_SIZE
    chunk = 50_000
    with Producer(bootstrap, acks=1) as producer:
        futures = []
        for start in range(0, records, chunk):
            n = min(chunk, records - start)
            p = (start // chunk) % PARTITIONS
            futures.append(producer.send_batch(topic, [value] * n, partition=p))
            if len(futures) >= 8:
                futures.pop(0).result()
        for f in futures:
            f.result()


def log_end(bootstrap: str, topic: str) -> int:
    from logmq import Admin

    with Admin(bootstrap) as admin:
        ends = admin.list_offsets({(topic, p): -1 for p in range(PARTITIONS)})
    return sum(o for o, _ in ends.values())


def session(app_name: str = "logmq-bench-spark"):
    """A local[2] SparkSession with the logmq source and sink registered."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from logmq_spark import LogMQDataSource

    spark = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(LogMQDataSource)
    return spark


def timed_read(spark, bootstrap: str, topic: str) -> tuple[int, float]:
    df = spark.read.format("logmq").option("bootstrap", bootstrap).option("topic", topic).load()
    t0 = time.perf_counter()
    n = df.count()
    return n, time.perf_counter() - t0


def timed_write(spark, bootstrap: str, topic: str, records: int) -> float:
    from pyspark.sql import functions as F

    from logmq import Admin

    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=PARTITIONS)
    df = spark.range(0, records, numPartitions=2).select(
        F.rpad(F.col("id").cast("string"), VALUE_SIZE, "x").cast("binary").alias("value")
    )
    t0 = time.perf_counter()
    df.write.format("logmq").option("bootstrap", bootstrap).option("topic", topic).mode(
        "append"
    ).save()
    elapsed = time.perf_counter() - t0
    written = log_end(bootstrap, topic)
    if written != records:
        raise SystemExit(f"write wrote {written} records, not {records}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="also print raw results as JSON")
    args = parser.parse_args()

    with BrokerProcess(log_level="warning") as broker:
        bs = broker.bootstrap
        fill(bs, "warmup", 100_000)
        fill(bs, "bench-read", args.records)
        spark = session()
        try:
            timed_read(spark, bs, "warmup")
            timed_write(spark, bs, "warmup-out", 100_000)
            reads = []
            for _ in range(args.runs):
                n, secs = timed_read(spark, bs, "bench-read")
                if n != args.records:
                    raise SystemExit(f"read counted {n} records, not {args.records}")
                reads.append(n / secs)
            writes = [
                args.records / timed_write(spark, bs, f"bench-write-{i}", args.records)
                for i in range(args.runs)
            ]
        finally:
            spark.stop()

    load = os.getloadavg()[0]
    rows = [
        ("read: count() of a 4-partition topic, 100 B", reads, READ_TARGET),
        ("write: df.write of 100 B values, acks=all", writes, None),
    ]
    print(f"\n{args.records:,} records, local[2], load average {load:.1f} at the end\n")
    print("| case | target | median | runs (records/s) |")
    print("|---|---|---|---|")
    for name, values, target in rows:
        med = statistics.median(values)
        tgt = f">= {target:,}" if target else "-"
        runs = ", ".join(f"{v:,.0f}" for v in values)
        print(f"| {name} | {tgt} | {med:,.0f} | {runs} |")
    if args.json:
        print(json.dumps({"records": args.records, "read": reads, "write": writes}))


if __name__ == "__main__":
    main()
