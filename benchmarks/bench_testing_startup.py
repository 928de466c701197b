"""Start-up and teardown time of ``logmq.testing.LogmqBroker`` (issue 15): what a test
suite waits for before its first test with the ``logmq_broker`` / ``logmq_cluster``
fixtures, and after its last.

Per run: spawn the brokers, wait for every ready line, then a Kafka Metadata round trip
with each broker until it lists them all (``start()`` returns); then ``stop()`` (SIGTERM,
wait, remove the temp dir). Prints the median (and min/max) over ``--runs`` runs, after
one unmeasured warm-up run (the page cache, and Python's bytecode cache where writable).
Usage:

    python benchmarks/bench_testing_startup.py [--runs 5] [--brokers 1 3] [--json]

Python compiles every module it has no cached bytecode for: with PYTHONDONTWRITEBYTECODE
set and the sources installed editable (no ``__pycache__``), each broker start compiles
logmq anew, which the output reports as ``bytecode cache: off``.
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
sys.path.insert(0, str(ROOT / "src"))

from logmq.testing import LogmqBroker  # noqa: E402


class TimedBroker(LogmqBroker):
    """Notes when the last ready line arrived: the rest of start() is the Kafka check."""

    ready_lines_at = 0.0

    def _wait_ready_lines(self, deadline: float) -> None:
        super()._wait_ready_lines(deadline)
        self.ready_lines_at = time.perf_counter()


def measure(brokers: int, runs: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"start": [], "ready_lines": [], "stop": []}
    for i in range(runs + 1):
        broker = TimedBroker(brokers)
        t0 = time.perf_counter()
        broker.start()
        t1 = time.perf_counter()
        broker.stop()
        t2 = time.perf_counter()
        if i == 0:
            continue  # warm-up
        out["start"].append(t1 - t0)
        out["ready_lines"].append(broker.ready_lines_at - t0)
        out["stop"].append(t2 - t1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--brokers", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {n: measure(n, args.runs) for n in args.brokers}
    # did the brokers (after the warm-up) find logmq's bytecode cached?
    import importlib.util

    import logmq.testing

    server_module = Path(logmq.testing.__file__).parents[1] / "broker" / "broker.py"
    cached = Path(importlib.util.cache_from_source(str(server_module))).exists()
    if args.json:
        print(json.dumps({"bytecode_cache": cached, "results": results}))
        return
    print(f"bytecode cache: {'on' if cached else 'off'}; {os.cpu_count()} cores; {args.runs} runs")
    print(f"{'brokers':>7}  {'start (median, min-max)':>26}  {'ready lines':>11}  {'stop':>6}")
    for n, r in results.items():
        s = r["start"]
        print(
            f"{n:>7}  {statistics.median(s):>9.3f} s ({min(s):.3f}-{max(s):.3f})"
            f"  {statistics.median(r['ready_lines']):>9.3f} s"
            f"  {statistics.median(r['stop']):>4.2f} s"
        )


if __name__ == "__main__":
    main()
