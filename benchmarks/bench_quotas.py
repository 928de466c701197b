"""Client quotas measured with a real client: how close a throttled client stays to its
byte rate, and whether a client beside it notices (issue 28: "a producer over its quota
gets its rate within 10% of the quota, others on the broker are unaffected").

1. **produce**: a confluent-kafka producer with ``client.id`` under a
   ``producer_byte_rate`` produces 10 KB records as fast as librdkafka lets it, while
   another client id without a quota produces at a paced rate beside it.
2. **consume**: a confluent-kafka consumer under a ``consumer_byte_rate`` reads a topic
   holding more than it may read in the run.

Each client samples the bytes acknowledged (produce) or received (consume) every half
second; the report gives the rate over the whole run, over the run after the first
``quota.window.num`` windows (Kafka lets a client's first windows' worth through before
it throttles), the spread over every 30 s and 60 s cut of that part, and the throttle
events librdkafka reported. One broker, PLAINTEXT, Kafka's default windows (11 of 1 s).

    python benchmarks/bench_quotas.py [--seconds 90] [--quota 1000000] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness import BrokerProcess  # noqa: E402

WINDOWS_S = 11  # Kafka's quota.window.num x quota.window.size.seconds, the defaults

# argv: bootstrap, client id, topic, seconds, paced bytes/s (0: as fast as it may).
PRODUCER = textwrap.dedent(
    """
    import json, sys, time
    from confluent_kafka import Producer
    bootstrap, client, topic = sys.argv[1:4]
    seconds, paced = float(sys.argv[4]), int(sys.argv[5])
    acked, throttles = [0], []
    def delivered(err, msg):
        if err is None:
            acked[0] += len(msg.value())
    p = Producer({"bootstrap.servers": bootstrap, "client.id": client, "linger.ms": 5,
                  "batch.size": 100_000, "queue.buffering.max.kbytes": 1024,
                  "throttle_cb": lambda e: throttles.append(e.throttle_time)})
    value = b"x" * 10_000
    samples, sent = [], 0
    start = time.monotonic()
    next_sample = 0.0
    while (now := time.monotonic() - start) < seconds:
        if now >= next_sample:
            samples.append((now, acked[0]))
            next_sample += 0.5
        if paced and sent > paced * now:
            p.poll(0.005)
            continue
        try:
            p.produce(topic, value, on_delivery=delivered)
            sent += len(value)
        except BufferError:
            p.poll(0.02)
        p.poll(0)
    samples.append((time.monotonic() - start, acked[0]))
    p.flush(60)
    print(json.dumps({"samples": samples, "throttles": len(throttles),
                      "throttle_ms_max": max(throttles, default=0)}))
    """
)

# argv: bootstrap, client id, topic, seconds.
CONSUMER = textwrap.dedent(
    """
    import json, sys, time
    from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING
    bootstrap, client, topic, seconds = *sys.argv[1:4], float(sys.argv[4])
    throttles = []
    c = Consumer({"bootstrap.servers": bootstrap, "client.id": client, "group.id": client,
                  "enable.auto.commit": False,
                  "throttle_cb": lambda e: throttles.append(e.throttle_time)})
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got, samples = 0, []
    start = time.monotonic()
    next_sample = 0.0
    while (now := time.monotonic() - start) < seconds:
        if now >= next_sample:
            samples.append((now, got))
            next_sample += 0.5
        for m in c.consume(1000, 0.1):
            if m.error() is None:
                got += len(m.value())
    samples.append((time.monotonic() - start, got))
    c.close()
    print(json.dumps({"samples": samples, "throttles": len(throttles),
                      "throttle_ms_max": max(throttles, default=0)}))
    """
)


def client(script: str, *args: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"client failed: {err.strip()[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


def bytes_at(samples: list[list[float]], t: float) -> float:
    """Bytes counted by time ``t`` (linear between samples)."""
    prev_t, prev_b = samples[0]
    for st, sb in samples:
        if st >= t:
            if st == prev_t:
                return sb
            return prev_b + (sb - prev_b) * (t - prev_t) / (st - prev_t)
        prev_t, prev_b = st, sb
    return samples[-1][1]


def rate(samples: list[list[float]], a: float, b: float) -> float:
    return (bytes_at(samples, b) - bytes_at(samples, a)) / (b - a)


def spread(samples: list[list[float]], start: float, width: float) -> tuple[float, float] | None:
    """Lowest and highest rate over every ``width`` s cut (steps of 1 s) from ``start``."""
    end = samples[-1][0]
    if end - start < width:
        return None
    rates = []
    t = start
    while t + width <= end:
        rates.append(rate(samples, t, t + width))
        t += 1.0
    return min(rates), max(rates)


def summary(name: str, quota: float | None, run: dict[str, Any]) -> dict[str, Any]:
    samples = run["samples"]
    end = samples[-1][0]
    row: dict[str, Any] = {
        "case": name,
        "quota": quota,
        "seconds": end,
        "rate_all": rate(samples, 0, end),
        "rate_after_windows": rate(samples, WINDOWS_S, end) if end > WINDOWS_S + 5 else None,
        "throttles": run["throttles"],
        "throttle_ms_max": run["throttle_ms_max"],
    }
    for width in (30, 60):
        cut = spread(samples, WINDOWS_S, width)
        row[f"rate_{width}s_min"], row[f"rate_{width}s_max"] = cut if cut else (None, None)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=90.0, help="length of each case")
    ap.add_argument("--quota", type=int, default=1_000_000, help="bytes/s of both quotas")
    ap.add_argument("--json", action="store_true")
    opts = ap.parse_args()
    quota, seconds = opts.quota, opts.seconds
    from logmq.client import Admin
    from logmq.client.admin import NewTopic
    from logmq.client.security_admin import QuotaAlteration

    rows = []
    with tempfile.TemporaryDirectory(prefix="logmq-bench-quotas-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", log_level="warning")
        broker.start()
        try:
            with Admin(broker.bootstrap) as admin:
                admin.create_topics([NewTopic(t, 1) for t in ("throttled", "free", "read")])
                admin.alter_client_quotas(
                    [
                        QuotaAlteration({"client-id": "throttled-producer"},
                                        {"producer_byte_rate": quota}),
                        QuotaAlteration({"client-id": "throttled-consumer"},
                                        {"consumer_byte_rate": quota}),
                    ]
                )  # fmt: skip
            kafka = broker.kafka_bootstrap
            # the client beside it asks for three times the quota, paced
            slow = client(PRODUCER, kafka, "throttled-producer", "throttled", seconds, 0)
            free = client(PRODUCER, kafka, "free-producer", "free", seconds, 3 * quota)
            rows.append(summary("produce, over its quota", quota, result(slow)))
            rows.append(summary("produce beside it, 3x the quota, paced", None, result(free)))
            # the topic to read holds more than the consumer may read in the run
            fill = client(PRODUCER, kafka, "filler", "read", seconds / 4, 0)
            result(fill)
            reader = client(CONSUMER, kafka, "throttled-consumer", "read", seconds)
            rows.append(summary("consume, over its quota", quota, result(reader)))
        finally:
            broker.stop()
    if opts.json:
        print(json.dumps(rows))
        return
    report(rows)


def report(rows: list[dict[str, Any]]) -> None:
    def mb(v: float | None) -> str:
        return "-" if v is None else f"{v / 1e6:.3f}"

    print("| case | quota MB/s | whole run | after the first 11 s | 30 s cuts | 60 s cuts"
          " | throttles (longest, s) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        cut30 = f"{mb(r['rate_30s_min'])} to {mb(r['rate_30s_max'])}"
        cut60 = f"{mb(r['rate_60s_min'])} to {mb(r['rate_60s_max'])}"
        print(f"| {r['case']} | {mb(r['quota'])} | {mb(r['rate_all'])}"
              f" | {mb(r['rate_after_windows'])} | {cut30} | {cut60}"
              f" | {r['throttles']} ({r['throttle_ms_max']}) |")  # fmt: skip


if __name__ == "__main__":
    main()
