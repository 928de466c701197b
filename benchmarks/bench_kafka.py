"""Kafka clients against logmq's Kafka listener, beside the native client (issue 14).

Starts its own ``logmq-server`` (temp data dir, free ports) and measures, each in its
own process so client and broker compete for the cores as real ones would:

* a confluent-kafka (librdkafka) producer of 100-byte records, one partition and four,
  and kcat producing the same from a file (librdkafka without Python in the loop);
* a confluent-kafka consumer (``assign()``) of those records, and of 10 KB records,
  timed from its first record (librdkafka's start-up, about half a second here, apart);
* the native ``logmq bench`` produce and consume of the same sizes;
* the broker's CPU seconds per GB served for each consumer (from /proc/PID/stat).

Usage: ``python benchmarks/bench_kafka.py [--records N] [--json]``. Speed goals are
reported here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness import BrokerProcess  # noqa: E402

PRODUCER = textwrap.dedent(
    """
    import json, sys, time
    from confluent_kafka import Producer
    bootstrap, topic, n, size, partitions = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    p = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 5,
                  "batch.size": 1 << 20, "queue.buffering.max.messages": 2_000_000,
                  "compression.type": "none"})
    value = b"x" * size
    start = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.01)
    p.flush(120)
    secs = time.perf_counter() - start
    print(json.dumps({"records_per_sec": n / secs, "mb_per_sec": n * size / secs / 1e6}))
    """
)

CONSUMER = textwrap.dedent(
    """
    import json, sys, time
    from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING
    bootstrap, topic, n, size, partitions = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                  "enable.auto.commit": False, "fetch.max.bytes": 64 << 20,
                  "max.partition.fetch.bytes": 16 << 20, "queued.max.messages.kbytes": 1 << 20,
                  "queued.min.messages": 1_000_000, "fetch.queue.backoff.ms": 10})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    got = nbytes = 0
    start = None  # from the first record: librdkafka's start-up (offset lookup) apart
    while got < n:
        for m in c.consume(10000, 1.0):
            if m.error() is None:
                if start is None:
                    start = time.perf_counter()
                got += 1
                nbytes += len(m.value())
    secs = time.perf_counter() - start
    c.close()
    print(json.dumps({"records_per_sec": got / secs, "mb_per_sec": nbytes / secs / 1e6}))
    """
)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(cmd: list[str]) -> dict[str, Any]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def kafka(script: str, broker: BrokerProcess, topic: str, n: int, size: int, parts: int):
    args = [broker.kafka_bootstrap, topic, str(n), str(size), str(parts)]
    return run([sys.executable, "-c", script, *args])


def kcat_produce(broker: BrokerProcess, topic: str, n: int, tmp: Path) -> dict[str, Any]:
    """kcat -P from a file of n 100-byte lines; checked against the partition's end."""
    path = tmp / "lines.txt"
    path.write_bytes((b"x" * 100 + b"\n") * n)
    start = time.perf_counter()
    subprocess.run(
        ["kcat", "-P", "-b", broker.kafka_bootstrap, "-t", topic, "-p", "0", "-l", str(path),
         "-X", "linger.ms=5", "-X", "batch.size=1000000",
         "-X", "queue.buffering.max.messages=2000000"],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    secs = time.perf_counter() - start
    from logmq.client import Consumer

    with Consumer(broker.bootstrap) as c:
        end = c.end_offsets([(topic, 0)])[(topic, 0)]
    if end != n:
        raise RuntimeError(f"kcat produced {end} records, not {n}")
    return {"records_per_sec": n / secs, "mb_per_sec": n * 100 / secs / 1e6}


def native(broker: BrokerProcess, *args: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "logmq_cli.main", "-b", broker.bootstrap, "bench", *args,
           "--json", "--no-progress"]  # fmt: skip
    return run(cmd)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--json", action="store_true")
    opts = ap.parse_args()
    n = opts.records
    big = max(1000, n // 10)
    rows: list[tuple[str, str, float, float, float | None]] = []
    with BrokerProcess(log_level="warning") as broker:
        from logmq.client import Admin

        with Admin(broker.bootstrap) as admin:
            for name, parts in (
                ("k1", 1),
                ("k4", 4),
                ("kc1", 1),
                ("k10k", 1),
                ("n1", 1),
                ("n10k", 1),
            ):
                admin.create_topic(name, parts)
        pid = broker.pid
        assert pid is not None

        def measure(label: str, proto: str, fn, served_bytes: int | None = None) -> None:
            before = cpu_seconds(pid)
            result = fn()
            cpu = cpu_seconds(pid) - before
            per_gb = cpu / (served_bytes / 1e9) if served_bytes else None
            rows.append((label, proto, result["records_per_sec"], result["mb_per_sec"], per_gb))

        measure(
            "produce 100 B, 1 partition", "kafka", lambda: kafka(PRODUCER, broker, "k1", n, 100, 1)
        )
        measure(
            "produce 100 B, 4 partitions", "kafka", lambda: kafka(PRODUCER, broker, "k4", n, 100, 4)
        )
        measure(
            "produce 100 B, 1 partition (kcat -P from a file)",
            "kafka",
            lambda: kcat_produce(broker, "kc1", n, broker.data_dir.parent),
        )
        measure(
            "produce 100 B, 1 partition (send_batch)",
            "native",
            lambda: native(broker, "produce", "--topic", "n1", "--records", str(n)),
        )
        measure(
            "consume 100 B, 1 partition",
            "kafka",
            lambda: kafka(CONSUMER, broker, "k1", n, 100, 1),
            n * 170,
        )
        measure(
            "consume 100 B, 4 partitions",
            "kafka",
            lambda: kafka(CONSUMER, broker, "k4", n, 100, 4),
            n * 170,
        )
        measure(
            "consume 100 B, 1 partition (poll)",
            "native",
            lambda: native(broker, "consume", "--topic", "n1", "--records", str(n)),
            n * 170,
        )
        measure(
            "produce 10 KB, 1 partition",
            "kafka",
            lambda: kafka(PRODUCER, broker, "k10k", big, 10_000, 1),
        )
        measure("produce 10 KB, 1 partition", "native",
                lambda: native(broker, "produce", "--topic", "n10k", "--records", str(big),
                               "--record-size", "10000"))  # fmt: skip
        measure(
            "consume 10 KB, 1 partition",
            "kafka",
            lambda: kafka(CONSUMER, broker, "k10k", big, 10_000, 1),
            big * 10_070,
        )
        measure("consume 10 KB, 1 partition (poll)", "native",
                lambda: native(broker, "consume", "--topic", "n10k", "--records", str(big),
                               "--record-size", "10000", "--fetch-bytes", str(16 << 20)),
                big * 10_070)  # fmt: skip
    if opts.json:
        keys = ("case", "protocol", "records_per_sec", "mb_per_sec", "broker_cpu_s_per_gb")
        print(json.dumps([dict(zip(keys, r, strict=True)) for r in rows]))
        return
    print("| case | protocol | records/s | MB/s | broker CPU s per GB served |")
    print("|---|---|---:|---:|---:|")
    for label, proto, rps, mbps, per_gb in rows:
        cpu = f"{per_gb:.2f}" if per_gb is not None else ""
        print(f"| {label} | {proto} | {rps:,.0f} | {mbps:,.1f} | {cpu} |")


if __name__ == "__main__":
    main()
