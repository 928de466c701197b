"""The single-broker benchmark set (issue 3), printed as a markdown table.

Starts its own ``logmq-server`` on a free 127.0.0.1 port with a temp data dir, runs
``logmq bench ... --json`` in a separate process for each case (so client and broker
compete for the machine's cores the way real ones would) and reads the broker's
resident memory from /proc. Usage:

    python benchmarks/bench_broker.py [--quick] [--json]

``--quick`` divides the record counts by 10 for a smoke run. Speed goals live here,
never in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness import BrokerProcess  # noqa: E402


@dataclass(slots=True)
class Case:
    name: str
    args: list[str]
    metric: str  # the result field compared with the target
    target: float
    higher_is_better: bool = True


def cases(scale: float) -> list[Case]:
    def n(count: int) -> str:
        return str(max(1000, int(count * scale)))

    return [
        Case("produce send_batch, 100 B, acks=1",
             ["produce", "--topic", "p100", "--records", n(2_000_000)],
             "records_per_sec", 1_000_000),
        Case("produce send() per record, 100 B, acks=1",
             ["produce", "--topic", "p100-send", "--records", n(500_000), "--per-record"],
             "records_per_sec", 250_000),
        Case("consume poll(), 100 B",
             ["consume", "--topic", "p100", "--records", n(2_000_000)],
             "records_per_sec", 1_000_000),
        Case("consume poll_batches(), 100 B",
             ["consume", "--topic", "p100", "--records", n(2_000_000), "--batches"],
             "records_per_sec", 1_000_000),
        Case("consume poll(), 10 KB records",
             ["consume", "--topic", "p10k", "--record-size", "10000", "--records", n(100_000),
              "--fetch-bytes", str(16 << 20)],
             "mb_per_sec", 1000),
        Case("end-to-end latency p50 at 10,000 rec/s",
             ["latency", "--topic", "lat", "--rate", "10000", "--records", n(100_000)],
             "p50_ms", 1.0, higher_is_better=False),
    ]  # fmt: skip


def run_bench(bootstrap: str, args: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "logmq_cli.main", "-b", bootstrap, "bench", *args,
           "--json", "--no-progress"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {proc.stderr.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def idle_partitions_rss(scale: float) -> dict[str, Any]:
    """A fresh broker, 100 partitions each holding some data, then idle: its RSS."""
    with BrokerProcess(log_level="warning") as broker:
        run_bench(broker.bootstrap, ["produce", "--topic", "idle", "--partitions", "100",
                                     "--records", str(max(10_000, int(100_000 * scale))),
                                     "--batch-size", "16384"])  # fmt: skip
        time.sleep(1.0)  # measurement, not synchronisation: let the broker go idle
        return {"rss_mb": round(rss_kib(broker.pid) / 1024, 1)}


def fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:,.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the records")
    parser.add_argument("--json", action="store_true", help="also print raw results as JSON")
    opts = parser.parse_args()
    scale = 0.1 if opts.quick else 1.0
    rows: list[tuple[str, str, str, str, str]] = []
    raw: dict[str, Any] = {}
    with BrokerProcess(log_level="warning") as broker:
        for case in cases(scale):
            result = run_bench(broker.bootstrap, case.args)
            raw[case.name] = result
            value = result[case.metric]
            ok = value >= case.target if case.higher_is_better else value <= case.target
            ratio = value / case.target if case.higher_is_better else case.target / value
            extra = f"{result['records_per_sec']:,.0f} rec/s, {result['mb_per_sec']:,.1f} MB/s"
            if case.metric == "p50_ms":
                extra = (
                    f"p50 {result['p50_ms']:.3f} ms, p99 {result['p99_ms']:.3f} ms, "
                    f"p99.9 {result['p999_ms']:.3f} ms, max {result['max_ms']:.3f} ms"
                )
                p99_ok = result["p99_ms"] <= 5.0
                rows.append(("end-to-end latency p99 at 10,000 rec/s", "p99_ms <= 5",
                             fmt(result["p99_ms"]), "yes" if p99_ok else
                             f"no ({5.0 / result['p99_ms']:.2f}x of target)", ""))  # fmt: skip
            cmp = ">=" if case.higher_is_better else "<="
            verdict = "yes" if ok else f"no ({ratio:.2f}x of target)"
            rows.append((case.name, f"{case.metric} {cmp} {fmt(case.target)}", fmt(value),
                         verdict, extra))  # fmt: skip
    mem = idle_partitions_rss(scale)
    raw["idle partitions"] = mem
    ok = mem["rss_mb"] <= 120
    rows.append(("broker RSS, 100 partitions with data, idle", "rss_mb <= 120",
                 fmt(mem["rss_mb"]), "yes" if ok else f"no ({120 / mem['rss_mb']:.2f}x)",
                 ""))  # fmt: skip
    print(f"Command: `python benchmarks/bench_broker.py{' --quick' if opts.quick else ''}` "
          f"({os.cpu_count()} CPUs, Python {sys.version.split()[0]})\n")  # fmt: skip
    print("| case | target | measured | meets target | details |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if opts.json:
        print("\n" + json.dumps(raw, indent=2))


if __name__ == "__main__":
    main()
