"""logmq next to Redis Streams on the same machine, same record size, same record count.

Redis side: pipelined XADD (one pipeline round trip per ``--pipeline`` records) into one
stream, then XREAD COUNT ``--read-count`` from the start until every entry is read. logmq
side: ``logmq bench produce`` (send_batch, acks=1) and ``logmq bench consume`` (poll) on a
one-partition topic. Both servers run on 127.0.0.1 with their data in temp dirs; Redis
with persistence off (its default configuration keeps the stream in memory only, which
favours Redis: logmq writes every record to its log files).

    apt-get install -y redis-server   # once; redis-py comes with '.[dev]'
    python benchmarks/bench_vs_redis.py [--records N] [--record-size B]

Prints a markdown table with records/s for both and the logmq/Redis ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness import BrokerProcess, free_port  # noqa: E402


class RedisServer:
    """A throwaway redis-server: no persistence, free port, temp dir."""

    def __init__(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("redis-server not found: apt-get install -y redis-server")
        self.dir = tempfile.TemporaryDirectory(prefix="logmq-redis-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir.name,
             "--save", "", "--appendonly", "no", "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self._wait_ready(10.0)

    def _wait_ready(self, timeout: float) -> None:
        import redis

        deadline = time.monotonic() + timeout
        while True:
            try:
                redis.Redis(port=self.port).ping()
                return
            except (OSError, redis.ConnectionError):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)  # polling a foreign process's port: no event to wait on

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.dir.cleanup()


def redis_produce(port: int, records: int, size: int, pipeline: int) -> float:
    import redis

    r = redis.Redis(port=port)
    value = os.urandom(size)
    start = time.perf_counter()
    sent = 0
    while sent < records:
        n = min(pipeline, records - sent)
        pipe = r.pipeline(transaction=False)
        for _ in range(n):
            pipe.xadd("bench", {"v": value})
        pipe.execute()
        sent += n
    return time.perf_counter() - start


def redis_consume(port: int, records: int, count: int) -> float:
    import redis

    r = redis.Redis(port=port)
    last = "0-0"
    got = 0
    start = time.perf_counter()
    while got < records:
        resp = r.xread({"bench": last}, count=count)
        if not resp:
            raise RuntimeError(f"stream ended after {got} entries")
        entries = resp[0][1]
        got += len(entries)
        last = entries[-1][0]
    return time.perf_counter() - start


def logmq_bench(bootstrap: str, args: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "logmq_cli.main", "-b", bootstrap, "bench", *args,
           "--json", "--no-progress"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--pipeline", type=int, default=1000, help="XADDs per round trip")
    parser.add_argument("--read-count", type=int, default=10_000, help="XREAD COUNT")
    opts = parser.parse_args()
    n, size = opts.records, opts.record_size

    redis_server = RedisServer()
    try:
        r_prod = n / redis_produce(redis_server.port, n, size, opts.pipeline)
        r_cons = n / redis_consume(redis_server.port, n, opts.read_count)
    finally:
        redis_server.close()

    common = ["--topic", "vs-redis", "--records", str(n), "--record-size", str(size)]
    with BrokerProcess(log_level="warning") as broker:
        l_prod = logmq_bench(broker.bootstrap, ["produce", *common])["records_per_sec"]
        l_cons = logmq_bench(broker.bootstrap, ["consume", *common])["records_per_sec"]

    print(f"Command: `python benchmarks/bench_vs_redis.py --records {n} --record-size {size}` "
          f"(XADD pipeline {opts.pipeline}, XREAD COUNT {opts.read_count}; "
          f"{os.cpu_count()} CPUs)\n")  # fmt: skip
    print("| operation | logmq records/s | Redis Streams records/s | logmq / Redis |")
    print("|---|---|---|---|")
    print(f"| produce (send_batch vs pipelined XADD) | {l_prod:,.0f} | {r_prod:,.0f} | "
          f"{l_prod / r_prod:.2f}x |")  # fmt: skip
    print(f"| consume (poll vs XREAD) | {l_cons:,.0f} | {r_cons:,.0f} | "
          f"{l_cons / r_cons:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
