"""Spark sink: exactly-once (transactions) vs at-least-once throughput (issue 29).

Starts its own ``logmq-server`` on a free 127.0.0.1 port with a temp data dir, then on a
local[2] SparkSession writes the same DataFrame (``spark.range(N)`` as 100-byte values
in 4 Spark partitions) into a fresh 4-partition topic, alternating

- at-least-once: the default sink (idempotent producer, acks=all);
- exactly-once: ``exactlyOnce=true`` (one transaction per task, prepared by the task and
  committed by the driver; the time includes the driver's commits);

after one warm-up write of each (JVM JIT, Python worker start). Every write is checked:
a read_committed count of the topic's records must equal N. Usage:

    python benchmarks/bench_spark_sink.py [--records N] [--runs K] [--json]

Speed goals live here, never in tests; this one has none: it measures what the
transaction costs.
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

from benchmarks.bench_spark import session as spark_session  # noqa: E402

from tests.harness import BrokerProcess  # noqa: E402

VALUE_SIZE = 100
PARTITIONS = 4


def committed_count(bootstrap: str, topic: str) -> int:
    """Records visible to read_committed (markers take offsets, so offsets do not count)."""
    from logmq import Consumer

    tps = [(topic, p) for p in range(PARTITIONS)]
    with Consumer(bootstrap, isolation_level="read_committed") as c:
        ends = c.end_offsets(tps)
        c.assign(tps)
        c.seek_to_beginning()
        n = 0
        deadline = time.monotonic() + 120
        while any(c.position(t, p) < ends[(t, p)] for t, p in tps):
            if time.monotonic() > deadline:
                raise SystemExit(f"could not read {topic} to its end")
            n += sum(len(b.rows) for b in c.poll_batches(1.0))
        return n


def timed_write(spark, bootstrap: str, topic: str, records: int, exactly_once: bool) -> float:
    from pyspark.sql import functions as F

    from logmq import Admin

    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=PARTITIONS)
    df = spark.range(0, records, numPartitions=PARTITIONS).select(
        F.rpad(F.col("id").cast("string"), VALUE_SIZE, "x").cast("binary").alias("value")
    )
    writer = df.write.format("logmq").option("bootstrap", bootstrap).option("topic", topic)
    writer = writer.option("exactlyOnce", str(exactly_once).lower()).mode("append")
    t0 = time.perf_counter()
    writer.save()
    elapsed = time.perf_counter() - t0
    written = committed_count(bootstrap, topic)
    if written != records:
        raise SystemExit(f"{topic}: {written} records visible to read_committed, not {records}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="also print raw results as JSON")
    args = parser.parse_args()

    results: dict[str, list[float]] = {"at-least-once": [], "exactly-once": []}
    with BrokerProcess(log_level="warning") as broker:
        bs = broker.bootstrap
        spark = spark_session("logmq-bench-spark-sink")
        try:
            timed_write(spark, bs, "warmup-alo", 100_000, False)
            timed_write(spark, bs, "warmup-eos", 100_000, True)
            for i in range(args.runs):  # alternate, so load changes hit both alike
                for name, eos in (("at-least-once", False), ("exactly-once", True)):
                    secs = timed_write(spark, bs, f"bench-{name}-{i}", args.records, eos)
                    results[name].append(args.records / secs)
        finally:
            spark.stop()

    load = os.getloadavg()[0]
    print(
        f"\n{args.records:,} records x {VALUE_SIZE} B, {PARTITIONS} Spark partitions into a "
        f"{PARTITIONS}-partition topic, local[2], load average {load:.1f} at the end\n"
    )
    print("| sink | median records/s | runs (records/s) | vs at-least-once |")
    print("|---|---|---|---|")
    base = statistics.median(results["at-least-once"])
    for name, values in results.items():
        med = statistics.median(values)
        runs = ", ".join(f"{v:,.0f}" for v in values)
        print(f"| {name} | {med:,.0f} | {runs} | {med / base:.2f}x |")
    if args.json:
        print(json.dumps({"records": args.records, "load": load, **results}))


if __name__ == "__main__":
    main()
