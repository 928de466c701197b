"""Consumer-group client benchmark (issue 4): rebalance speed and commit throughput.

Starts its own ``logmq-server`` (free 127.0.0.1 port, temp dir, the heartbeat interval
given by ``--heartbeat-ms``). Then, per trial: 12 partitions, a producer writing at a
steady rate, 3 group consumers; once they are balanced a 4th joins under load, and it
measures

* the time from the 4th consumer's start to a balanced assignment (every consumer owns
  3 partitions, as seen by the consumers themselves);
* the longest gap between record arrivals on partitions that did not move, from the
  join until balanced, next to the longest gap in the second before the join (the
  baseline the production rate and polling give).

Last, offset commit throughput of one member: sequential ``commit()`` and pipelined
``commit_async()``. Usage:

    python benchmarks/bench_groups.py [--trials 5] [--heartbeat-ms 100] [--json]

All clients share one event loop in this process; the broker is a second process.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from logmq import AsyncAdmin, AsyncConsumer, AsyncProducer  # noqa: E402
from tests.harness import BrokerProcess  # noqa: E402

PARTITIONS = 12


class Arrivals:
    """When records of each partition reached a poll(), and who polled them."""

    def __init__(self) -> None:
        self.times: dict[tuple[str, int], list[float]] = {}

    def add(self, records: list[Any], now: float) -> None:
        for tp in {(r.topic, r.partition) for r in records}:
            self.times.setdefault(tp, []).append(now)

    def longest_gap(self, tps: list[tuple[str, int]], start: float, end: float) -> float:
        """Longest time without records on any of ``tps`` within [start, end]."""
        worst = 0.0
        for tp in tps:
            ts = [t for t in self.times.get(tp, []) if t <= end]
            before = [t for t in ts if t < start]
            inside = [t for t in ts if t >= start]
            points = ([before[-1]] if before else []) + inside + [end]
            for a, b in itertools.pairwise(points):
                worst = max(worst, b - a)
        return worst


async def produce(bootstrap: str, topic: str, rate: int, stop: asyncio.Event) -> None:
    """``rate`` records/s spread over every partition, in 5 ms ticks."""
    async with AsyncProducer(bootstrap, linger_ms=0) as p:
        per_tick = max(PARTITIONS, rate // 200)
        n = 0
        while not stop.is_set():
            for _ in range(per_tick):
                p.send(topic, b"x" * 100, partition=n % PARTITIONS)
                n += 1
            await asyncio.sleep(0.005)  # pacing the load, not synchronising


async def consume(c: AsyncConsumer, arrivals: Arrivals, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        records = await c.poll(0.05)
        if records:
            arrivals.add(records, loop.time())


def balanced(consumers: list[AsyncConsumer], sizes: list[int]) -> bool:
    owned = [c.assignment() for c in consumers]
    if sorted(len(o) for o in owned) != sizes:
        return False
    return len(set().union(*owned)) == sum(sizes)


async def wait_balanced(consumers: list[AsyncConsumer], sizes: list[int], timeout: float) -> float:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not balanced(consumers, sizes):
        if loop.time() > deadline:
            raise TimeoutError(f"not balanced after {timeout}s")
        await asyncio.sleep(0.001)  # checking the consumers' state, once per loop turn
    return loop.time()


async def rebalance_trial(bootstrap: str, trial: int, rate: int) -> dict[str, float]:
    topic = f"bench-groups-{trial}"
    async with AsyncAdmin(bootstrap) as admin:
        await admin.create_topic(topic, PARTITIONS)
    stop = asyncio.Event()
    arrivals = Arrivals()
    loop = asyncio.get_running_loop()

    def member() -> AsyncConsumer:
        return AsyncConsumer(
            bootstrap,
            group_id=topic,
            topics=[topic],
            auto_offset_reset="latest",
            session_timeout_ms=10_000,
            fetch_max_wait_ms=100,
        )

    consumers = [member() for _ in range(3)]
    tasks = [asyncio.create_task(produce(bootstrap, topic, rate, stop))]
    try:
        for c in consumers:
            await c.start()
            tasks.append(asyncio.create_task(consume(c, arrivals, stop)))
        await wait_balanced(consumers, [4, 4, 4], 30)
        await asyncio.sleep(1.5)  # steady state for the baseline
        before = {tp: i for i, c in enumerate(consumers) for tp in c.assignment()}
        joined = loop.time()
        newcomer = member()
        await newcomer.start()
        consumers.append(newcomer)
        tasks.append(asyncio.create_task(consume(newcomer, arrivals, stop)))
        done = await wait_balanced(consumers, [3, 3, 3, 3], 30)
        await asyncio.sleep(0.3)
        after = {tp: i for i, c in enumerate(consumers) for tp in c.assignment()}
        stayed = [tp for tp, i in before.items() if after.get(tp) == i]
        return {
            "join_to_balanced_ms": (done - joined) * 1000,
            "pause_unmoved_ms": arrivals.longest_gap(stayed, joined, done) * 1000,
            "baseline_gap_ms": arrivals.longest_gap(stayed, joined - 1.0, joined) * 1000,
            "moved": PARTITIONS - len(stayed),
        }
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in consumers:
            await c.close()


async def commit_throughput(bootstrap: str, seconds: float) -> dict[str, float]:
    topic = "bench-commits"
    async with AsyncAdmin(bootstrap) as admin:
        await admin.create_topic(topic, PARTITIONS)
    c = AsyncConsumer(bootstrap, group_id=topic, topics=[topic], enable_auto_commit=False)
    loop = asyncio.get_running_loop()
    async with c:
        while len(c.assignment()) < PARTITIONS:
            await c.poll(0.05)
        offsets = dict.fromkeys(sorted(c.assignment()), 0)
        n, start = 0, loop.time()
        while loop.time() - start < seconds:
            n += 1
            await c.commit({tp: n for tp in offsets})
        sync_rate = n / (loop.time() - start)
        n, start, window = 0, loop.time(), []
        while loop.time() - start < seconds:
            n += 1
            window.append(c.commit_async({tp: n for tp in offsets}))
            if len(window) >= 32:
                await window.pop(0)
        await asyncio.gather(*window)
        async_rate = n / (loop.time() - start)
    return {"commit_sync_per_s": sync_rate, "commit_async_32_per_s": async_rate}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    extra = [
        "--offsets-topic-partitions",
        "10",
        "--group-heartbeat-interval-ms",
        str(args.heartbeat_ms),
        "--group-min-session-timeout-ms",
        "1000",
    ]
    with BrokerProcess(extra_args=extra, log_level="warning") as broker:
        trials = [await rebalance_trial(broker.bootstrap, i, args.rate) for i in range(args.trials)]
        commits = await commit_throughput(broker.bootstrap, args.seconds)
    return {"heartbeat_interval_ms": args.heartbeat_ms, "trials": trials, **commits}


def summary(result: dict[str, Any]) -> str:
    def stats(key: str) -> str:
        values = [t[key] for t in result["trials"]]
        return f"{statistics.median(values):.0f} (max {max(values):.0f})"

    lines = [
        f"heartbeat interval: {result['heartbeat_interval_ms']} ms, "
        f"{len(result['trials'])} trials, median (max):",
        "",
        "| measure | value | target |",
        "|---|---|---|",
        f"| 4th member's join to balanced assignment, ms | {stats('join_to_balanced_ms')} "
        "| ≤ 1000 |",
        f"| longest pause on partitions that did not move, ms | {stats('pause_unmoved_ms')} "
        "| ≤ 100 |",
        f"| (baseline: longest gap in the second before, ms) | {stats('baseline_gap_ms')} | |",
        f"| partitions moved | {stats('moved')} | 3 |",
        f"| commit() one at a time, commits/s | {result['commit_sync_per_s']:.0f} | |",
        f"| commit_async(), 32 in flight, commits/s | {result['commit_async_32_per_s']:.0f} | |",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--heartbeat-ms", type=int, default=100)
    ap.add_argument("--rate", type=int, default=6000, help="records/s produced during trials")
    ap.add_argument("--seconds", type=float, default=3.0, help="per commit measurement")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import uvloop

    result = uvloop.run(run(args))
    print(json.dumps(result, indent=2) if args.json else summary(result))


if __name__ == "__main__":
    main()
