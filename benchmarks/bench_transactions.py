"""Transactions measured with confluent-kafka (issue 29), against one broker:

1. **produce**: records/s of a transactional producer committing transactions of 1, 100
   and 10,000 records of 100 B, against an idempotent producer (the same librdkafka
   settings, acks=all) writing as many records.
2. **consume**: read_committed against read_uncommitted, 100 B and 10 KB records, on a
   topic written in transactions of 1,000 records of which one in 100 aborted.

Each client runs in its own process; the broker's CPU seconds are read from /proc.
Targets (the issue's): transactions of 10,000 records >= 80% of idempotent throughput;
read_committed consume >= 95% of read_uncommitted when few transactions abort.

    python benchmarks/bench_transactions.py [--records 200000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness import BrokerProcess  # noqa: E402

# argv: bootstrap, topic, records, size, transaction size (0: idempotent, no transactions),
# abort one transaction in N (0: never)
PRODUCER = textwrap.dedent(
    """
    import json, sys, time
    from confluent_kafka import Producer
    bootstrap, topic = sys.argv[1:3]
    n, size, per_txn, abort_every = map(int, sys.argv[3:7])
    conf = {"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1 << 20,
            "queue.buffering.max.messages": 1_000_000, "enable.idempotence": True,
            "acks": "all"}
    if per_txn:
        conf["transactional.id"] = f"bench-{topic}"
    p = Producer(conf)
    if per_txn:
        p.init_transactions(30)
    value = b"x" * size
    start = time.perf_counter()
    sent = txns = 0
    while sent < n:
        batch = min(per_txn or n, n - sent)
        if per_txn:
            p.begin_transaction()
        for _ in range(batch):
            while True:
                try:
                    p.produce(topic, value, partition=0)
                    break
                except BufferError:
                    p.poll(0.005)
        sent += batch
        if per_txn:
            txns += 1
            if abort_every and txns % abort_every == 0:
                p.flush(60)  # else librdkafka's abort purges what it has not sent yet
                p.abort_transaction(60)
            else:
                p.commit_transaction(60)
    if p.flush(120):
        sys.exit("records not delivered within 120 s")
    secs = time.perf_counter() - start
    print(json.dumps({"records_per_sec": n / secs, "transactions": txns, "seconds": secs}))
    """
)

# argv: bootstrap, topic, isolation level, records expected
CONSUMER = textwrap.dedent(
    """
    import json, sys, time
    from confluent_kafka import Consumer, KafkaError, TopicPartition, OFFSET_BEGINNING
    bootstrap, topic, isolation, n = *sys.argv[1:4], int(sys.argv[4])
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                  "enable.auto.commit": False, "isolation.level": isolation,
                  "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20,
                  "queued.max.messages.kbytes": 1 << 20, "fetch.queue.backoff.ms": 10,
                  "enable.partition.eof": True})
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got = nbytes = 0
    start = None
    done = False
    while not done:
        for m in c.consume(10000, 1.0):
            if m.error() is None:
                if start is None:
                    start = time.perf_counter()
                got += 1
                nbytes += len(m.value())
            elif m.error().code() == KafkaError._PARTITION_EOF:
                done = got >= n
    secs = time.perf_counter() - start
    c.close()
    print(json.dumps({"records_per_sec": got / secs, "mb_per_sec": nbytes / secs / 1e6,
                      "records": got}))
    """
)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(script: str, *args: Any) -> dict[str, Any]:
    print("running", *args[1:], file=sys.stderr, flush=True)  # progress
    proc = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip()[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000, help="100 B records per case")
    ap.add_argument("--json", action="store_true")
    opts = ap.parse_args()
    n = opts.records
    from logmq.client import Admin
    from logmq.client.admin import NewTopic

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="logmq-bench-txn-") as tmp:
        broker = BrokerProcess(
            Path(tmp) / "data",
            log_level="warning",
            extra_args=["--transaction-state-partitions", "1", "--offsets-topic-partitions", "1"],
        )
        broker.start()
        pid = broker.pid
        assert pid is not None
        kafka = broker.kafka_bootstrap
        try:
            cases = [("idempotent", 0), ("txn of 10,000", 10_000), ("txn of 100", 100)]
            cases.append(("txn of 1", 0))  # fewer records: one round trip each
            with Admin(broker.bootstrap) as admin:
                admin.create_topics(
                    [NewTopic(f"p{i}", 1) for i in range(len(cases))]
                    + [NewTopic(f"c{size}", 1) for size in (100, 10_000)]
                    + [NewTopic("warm-up", 1)]
                )
            # untimed: the broker's first produce and first transaction (the coordinator
            # topic's creation) would otherwise count against whichever case runs first
            run(PRODUCER, kafka, "warm-up", 20_000, 100, 0, 0)
            run(PRODUCER, kafka, "warm-up", 20_000, 100, 10_000, 0)
            for i, (label, per_txn) in enumerate(cases):
                records, per = (n, per_txn) if label != "txn of 1" else (min(n, 2_000), 1)
                before = cpu_seconds(pid)
                r = run(PRODUCER, kafka, f"p{i}", records, 100, per, 0)
                cpu = cpu_seconds(pid) - before
                rows.append({"kind": "produce", "case": label, "records": records,
                             "records_per_sec": r["records_per_sec"],
                             "broker_cpu_us_per_record": cpu / records * 1e6})  # fmt: skip
            for size in (100, 10_000):
                count = n if size == 100 else max(10_000, n // 10)
                per = 1_000 if size == 100 else 100
                run(PRODUCER, kafka, f"c{size}", count, size, per, 100)
                committed = count - count // per // 100 * per  # one in 100 txns aborted
                for isolation in ("read_uncommitted", "read_committed"):
                    expect = count if isolation == "read_uncommitted" else committed
                    before = cpu_seconds(pid)
                    r = run(CONSUMER, kafka, f"c{size}", isolation, expect)
                    cpu = cpu_seconds(pid) - before
                    rows.append({"kind": "consume", "case": f"{size} B", "isolation": isolation,
                                 "records": r["records"], "records_per_sec": r["records_per_sec"],
                                 "mb_per_sec": r["mb_per_sec"],
                                 "broker_cpu_s": cpu})  # fmt: skip
        finally:
            broker.stop()
    if opts.json:
        print(json.dumps(rows))
        return
    report(rows)


def report(rows: list[dict[str, Any]]) -> None:
    produce = [r for r in rows if r["kind"] == "produce"]
    base = next((r["records_per_sec"] for r in produce if r["case"] == "idempotent"), None)
    print("| producer (100 B records, acks=all) | records | records/s | vs idempotent "
          "| broker CPU µs/record |")  # fmt: skip
    print("|---|---:|---:|---:|---:|")
    for r in produce:
        pct = f"{100 * r['records_per_sec'] / base:.0f} %" if base else "-"
        print(f"| {r['case']} | {r['records']:,} | {r['records_per_sec']:,.0f} | {pct}"
              f" | {r['broker_cpu_us_per_record']:.1f} |")  # fmt: skip
    print()
    consume = [r for r in rows if r["kind"] == "consume"]
    print("| records | isolation | records read | records/s | MB/s | vs read_uncommitted |")
    print("|---|---|---:|---:|---:|---:|")
    for r in consume:
        other = next(
            x for x in consume if x["case"] == r["case"] and x["isolation"] == "read_uncommitted"
        )
        pct = 100 * r["mb_per_sec"] / other["mb_per_sec"]
        print(f"| {r['case']} | {r['isolation']} | {r['records']:,} | {r['records_per_sec']:,.0f}"
              f" | {r['mb_per_sec']:,.1f} | {pct:.0f} % |")  # fmt: skip


if __name__ == "__main__":
    main()
