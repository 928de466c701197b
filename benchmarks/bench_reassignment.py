"""Reassignment benchmarks (issue 6) on 4 real ``logmq-server`` processes on 127.0.0.1.

Brokers 1-3 are the metadata quorum's voters and hold every topic (RF=3,
min.insync.replicas=2); broker 4 joins empty afterwards, as an operator's new broker
would. Partitions are filled with pipelined acks=all Produce requests of pre-encoded
128 KiB batches (1 KiB random values), so the copy moves realistic batches. Usage:

    python benchmarks/bench_reassignment.py [--mb 256] [--rates 2,8,32] [--seconds 5]
    python benchmarks/bench_reassignment.py --mb 32 --rates 2,8 --seconds 2   # quick look
    python benchmarks/bench_reassignment.py --json > results.json

Cases, all in one run (MB here is MiB, 2**20 bytes, like the throttle's bytes/s):
1. an unthrottled move of one ``--mb`` MB partition from {1,2,3} to [2,3,4]: MB/s copied
   (execute to replicas == target), and in-sync to completion (broker 4 joins the ISR
   to the controller finishing the move), then to broker 1 deleting its copy;
2. throttle accuracy at each of ``--rates`` MB/s: a partition of rate x
   ``--throttle-seconds`` MB moved to broker 4; the copy rate is the least-squares slope
   of broker 4's ``describe_log_dirs`` size between 20% and 80% of the leader's size;
3. live traffic: acks=all produce (``--in-flight`` pipelined requests of 100 x 100 B
   records) on another partition led by broker 2 (or 3) for ``--seconds``, with no move,
   during an unthrottled move of the big partition, and during a move of it throttled
   at 8 MB/s (cancelled after ``--seconds``);
4. a leadership-only plan (each of 10 partitions' replicas rotated by one): execute to
   every partition on its new order, led by its new first replica, nothing listed.

Speed goals live here, never in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.pipelined_produce import pipelined_produce  # noqa: E402

from logmq import AsyncAdmin  # noqa: E402
from logmq.client.connection import BrokerConnection  # noqa: E402
from logmq.errors import LogMQError  # noqa: E402
from logmq.storage import batch as b  # noqa: E402
from tests.faults.processes import Cluster  # noqa: E402
from tests.faults.workload import ensure_topic  # noqa: E402

T = TypeVar("T")
TP = tuple[str, int]
MiB = 1 << 20
VOTERS = [1, 2, 3]
NEW_BROKER = 4
CONFIGS = {"min.insync.replicas": "2"}
POLL_S = 0.02
TIMEOUT_S = 300.0
IMPACT_THROTTLE = 8 * MiB
LEADER_PARTITIONS = 10


# -- looking at the cluster ------------------------------------------------------------


async def until(
    probe: Callable[[], Awaitable[T]], done: Callable[[T], bool], what: str, poll: float = POLL_S
) -> tuple[T, float]:
    """Poll ``probe`` until ``done``; returns the answer and the monotonic time of the
    middle of the request that first satisfied it. Client errors count as "not yet"."""
    deadline = time.monotonic() + TIMEOUT_S
    last: Any = None
    while time.monotonic() < deadline:
        before = time.monotonic()
        try:
            last = await probe()
        except (LogMQError, OSError, TimeoutError) as e:
            last = e
        else:
            if done(last):
                return last, (before + time.monotonic()) / 2
        await asyncio.sleep(poll)
    raise RuntimeError(f"timed out waiting for {what}; last: {last!r}")


async def partition(admin: AsyncAdmin, tp: TP) -> Any:
    desc = (await admin.describe_topics([tp[0]]))[tp[0]]
    return next(p for p in desc.partitions if p.partition == tp[1])


async def local_size(admin: AsyncAdmin, broker: int, tp: TP) -> int | None:
    found = (await admin.describe_log_dirs(broker, [tp])).get(tp)
    return None if found is None else found.size


async def moved(admin: AsyncAdmin, tps: Sequence[TP], targets: Sequence[Sequence[int]]) -> bool:
    """Every partition on exactly its target (in order), fully in sync, led by the
    target's first replica, and no reassignment listed any more."""
    if (await admin.list_partition_reassignments(tps)).partitions:
        return False
    topics = sorted({t for t, _ in tps})
    found = await admin.describe_topics(topics)
    parts = {(t, p.partition): p for t, d in found.items() for p in d.partitions}
    return all(
        list(parts[tp].replicas) == list(target)
        and set(parts[tp].isr) == set(target)
        and parts[tp].leader == target[0]
        for tp, target in zip(tps, targets, strict=True)
    )


async def wait_moved(admin: AsyncAdmin, tps: Sequence[TP], targets: Sequence[Sequence[int]]):
    return (await until(lambda: moved(admin, tps, targets), bool, f"{tps} moved"))[1]


async def wait_in_sync(admin: AsyncAdmin, tp: TP) -> None:
    await until(
        lambda: partition(admin, tp),
        lambda p: set(p.isr) == set(p.replicas) and p.leader >= 0,
        f"{tp} fully in sync",
    )


def slope(samples: Sequence[tuple[float, int]], total: int, lo: float, hi: float) -> float:
    """Bytes/s between ``lo`` and ``hi`` progress: the least-squares slope of size over
    time (the copy advances in batch-sized steps, so two crossing times would be off by
    up to a step each)."""
    window = [(t, s) for t, s in samples if lo * total <= s <= hi * total]
    n = len(window)
    if n < 3:
        return float("nan")
    mt = sum(t for t, _ in window) / n
    ms = sum(s for _, s in window) / n
    var = sum((t - mt) ** 2 for t, _ in window)
    return sum((t - mt) * (s - ms) for t, s in window) / var if var else float("nan")


# -- load --------------------------------------------------------------------------------


def encoded_batch(records: int, size: int) -> bytes:
    return b.encode_batch([(int(time.time() * 1000), None, os.urandom(size), None)] * records)


async def leader_connection(cluster: Cluster, admin: AsyncAdmin, tp: TP) -> BrokerConnection:
    leader = (await partition(admin, tp)).leader
    return await BrokerConnection.open("127.0.0.1", cluster.node(leader).port)


async def produce(conn: BrokerConnection, tp: TP, batch: bytes, **kwargs: Any) -> dict:
    """acks=all Produce of ``batch`` to ``tp`` (MiB/s); see pipelined_produce.py."""
    return await pipelined_produce(conn, tp[0], tp[1], batch, mb=MiB, **kwargs)


async def fill(cluster: Cluster, admin: AsyncAdmin, tp: TP, mib: float, batch: bytes) -> int:
    """About ``mib`` MiB into ``tp`` (acks=all); returns the leader's log size once
    every replica is in sync."""
    conn = await leader_connection(cluster, admin, tp)
    try:
        out = await produce(conn, tp, batch, count=max(1, int(mib * MiB) // len(batch)))
    finally:
        conn.close()
    if out["errors"]:
        raise RuntimeError(f"filling {tp}: {out['errors']} produce errors")
    await wait_in_sync(admin, tp)
    leader = (await partition(admin, tp)).leader
    return await local_size(admin, leader, tp) or 0


# -- the cases ---------------------------------------------------------------------------


async def unthrottled_move(admin: AsyncAdmin, tp: TP, total: int) -> dict:
    """Case 1: {1,2,3} -> [2,3,4] at full speed."""
    target = [2, 3, NEW_BROKER]
    in_sync = done = None
    t0 = time.monotonic()
    await admin.alter_partition_reassignments({tp: target})
    while done is None:  # one probe for both, so their order and gap are exact
        if time.monotonic() - t0 > TIMEOUT_S:
            raise RuntimeError(f"{tp} not moved after {TIMEOUT_S} s")
        before = time.monotonic()
        p = await partition(admin, tp)
        now = (before + time.monotonic()) / 2
        if in_sync is None and NEW_BROKER in p.isr:
            in_sync = now
        if list(p.replicas) == target and p.leader == target[0] and set(p.isr) == set(target):
            done = now
        await asyncio.sleep(POLL_S / 4)
    assert in_sync is not None
    await wait_moved(admin, [tp], [target])  # and the controller lists nothing any more
    _, dropped = await until(
        lambda: local_size(admin, 1, tp), lambda s: s is None, "broker 1 to drop its copy"
    )
    return {
        "mb": total / MiB,
        "seconds": done - t0,
        "mb_per_sec": total / MiB / (done - t0),
        "copy_seconds": in_sync - t0,
        "in_sync_to_done_ms": (done - in_sync) * 1000,
        "done_to_old_copy_deleted_ms": (dropped - done) * 1000,
    }


async def throttled_move(admin: AsyncAdmin, tp: TP, total: int, rate: int) -> dict:
    """Case 2: a move onto broker 4 under ``rate`` bytes/s; samples broker 4's copy."""
    original = list((await partition(admin, tp)).replicas)
    target = [r for r in original if r != 1] + [NEW_BROKER]
    samples: list[tuple[float, int]] = []
    t0 = time.monotonic()
    await admin.alter_partition_reassignments({tp: target}, throttle_bytes_per_sec=rate)
    while not samples or samples[-1][1] < total:
        if time.monotonic() - t0 > TIMEOUT_S:
            raise RuntimeError(f"throttled copy of {tp} incomplete: {samples[-3:]}")
        before = time.monotonic()
        size = await local_size(admin, NEW_BROKER, tp)
        samples.append(((before + time.monotonic()) / 2 - t0, size or 0))
        await asyncio.sleep(POLL_S)
    done = await wait_moved(admin, [tp], [target])
    await until(
        lambda: admin.list_partition_reassignments(),
        lambda listing: listing.throttle_bytes_per_sec is None,
        "the throttle to be removed",
    )
    measured = slope(samples, total, 0.2, 0.8)
    return {
        "rate_mb": rate / MiB,
        "size_mb": total / MiB,
        "measured_mb_per_sec": measured / MiB,
        "error_pct": (measured - rate) / rate * 100,
        "seconds": done - t0,
        "samples": len(samples),
    }


async def live_traffic(
    cluster: Cluster, admin: AsyncAdmin, live: TP, big: TP, args: argparse.Namespace
) -> dict:
    """Case 3: the same acks=all load on ``live`` with no move, during an unthrottled move
    of ``big`` and during a move of ``big`` at 8 MiB/s."""
    batch = encoded_batch(100, 100)
    results: dict[str, Any] = {"partition": list(live)}
    conn = await leader_connection(cluster, admin, live)
    results["leader"] = (await partition(admin, live)).leader

    async def load_for(seconds: float) -> dict:
        stop = asyncio.Event()
        task = asyncio.get_running_loop().create_task(
            produce(conn, live, batch, stop=stop, in_flight=args.in_flight)
        )
        await asyncio.sleep(seconds)  # the load's duration, not a synchronisation
        stop.set()
        return await task

    try:
        results["no_move"] = await load_for(args.seconds)
        # unthrottled: back-to-back moves of the big partition, each onto the broker
        # that holds no copy of it, for as long as the load runs
        stop = asyncio.Event()
        moves: list[float] = []

        async def keep_moving() -> None:
            while not stop.is_set():
                original = list((await partition(admin, big)).replicas)
                newcomer = next(n for n in (1, 2, 3, 4) if n not in original)
                await until(
                    lambda n=newcomer: local_size(admin, n, big),
                    lambda s: s is None,
                    f"broker {newcomer} without a copy of {big}",
                )
                target = [*original[1:], newcomer]
                t0 = time.monotonic()
                await admin.alter_partition_reassignments({big: target})
                moves.append(await wait_moved(admin, [big], [target]) - t0)

        mover = asyncio.get_running_loop().create_task(keep_moving())
        results["unthrottled_move"] = await load_for(args.seconds)
        stop.set()
        await mover
        results["unthrottled_move"]["moves"] = len(moves)
        results["unthrottled_move"]["move_seconds"] = moves
        # throttled: on to a broker without a copy, cancelled once the load is done
        original = list((await partition(admin, big)).replicas)
        newcomer = next(n for n in (1, 2, 3, 4) if n not in original)
        target = [*original[1:], newcomer]
        await admin.alter_partition_reassignments(
            {big: target}, throttle_bytes_per_sec=IMPACT_THROTTLE
        )
        results["throttled_move"] = await load_for(args.seconds)
        copied = await local_size(admin, newcomer, big)
        results["throttled_move"]["copied_mb"] = (copied or 0) / MiB
        await admin.alter_partition_reassignments({big: None})
        await wait_moved(admin, [big], [original])
        await until(
            lambda: local_size(admin, newcomer, big), lambda s: s is None, "the partial copy gone"
        )
    finally:
        conn.close()
    return results


async def leadership_plan(admin: AsyncAdmin, topic: str) -> dict:
    """Case 4: rotate the replicas of every partition of ``topic`` by one."""
    desc = (await admin.describe_topics([topic]))[topic]
    tps = [(topic, p.partition) for p in desc.partitions]
    targets = [[*p.replicas[1:], p.replicas[0]] for p in desc.partitions]
    t0 = time.monotonic()
    await admin.alter_partition_reassignments(dict(zip(tps, targets, strict=True)))
    done = await wait_moved(admin, tps, targets)
    return {"partitions": len(tps), "ms": (done - t0) * 1000}


# -- the driver --------------------------------------------------------------------------


def start_nodes(cluster: Cluster, nodes: Sequence[int]) -> None:
    with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
        for f in [pool.submit(cluster.node(n).start) for n in nodes]:
            f.result()


async def bench(args: argparse.Namespace) -> dict:
    rates = [int(float(r) * MiB) for r in args.rates.split(",") if r]
    results: dict[str, Any] = {}
    big = ("big", 0)
    with tempfile.TemporaryDirectory(prefix="logmq-bench-reassign-") as tmp:
        cluster = Cluster(4, tmp, voters=VOTERS, proxied=False)
        try:
            await asyncio.to_thread(start_nodes, cluster, VOTERS)
            boot = ",".join(cluster.node(n).bootstrap for n in VOTERS)
            # every topic before broker 4 exists: all partitions on {1, 2, 3}
            await ensure_topic(boot, "big", 1, 3, CONFIGS)
            await ensure_topic(boot, "throttled", max(1, len(rates)), 3, CONFIGS)
            await ensure_topic(boot, "live", 3, 3, CONFIGS)
            await ensure_topic(boot, "leaders", LEADER_PARTITIONS, 3, CONFIGS)
            fill_batch = encoded_batch(128, 1024)
            t0 = time.monotonic()
            async with AsyncAdmin(boot) as admin:
                big_size = await fill(cluster, admin, big, args.mb, fill_batch)
                throttled_sizes = [
                    await fill(
                        cluster,
                        admin,
                        ("throttled", i),
                        r / MiB * args.throttle_seconds,
                        fill_batch,
                    )
                    for i, r in enumerate(rates)
                ]
            results["fill_seconds"] = time.monotonic() - t0
            await asyncio.to_thread(cluster.node(NEW_BROKER).start)
            async with AsyncAdmin(cluster.bootstrap) as admin:
                await until(
                    admin.describe_cluster,
                    lambda d: any(
                        x["node_id"] == NEW_BROKER and not x["fenced"] for x in d["brokers"]
                    ),
                    "broker 4 to register",
                )
                results["unthrottled"] = await unthrottled_move(admin, big, big_size)
                results["throttled"] = [
                    await throttled_move(admin, ("throttled", i), size, rate)
                    for i, (rate, size) in enumerate(zip(rates, throttled_sizes, strict=True))
                ]
                live_desc = (await admin.describe_topics(["live"]))["live"].partitions
                led = {p.leader: p.partition for p in live_desc}
                live = ("live", led.get(2, led.get(3, live_desc[0].partition)))
                results["live_traffic"] = await live_traffic(cluster, admin, live, big, args)
                results["leadership_only"] = await leadership_plan(admin, "leaders")
        finally:
            await asyncio.to_thread(cluster.close)
    return results


def print_table(r: dict) -> None:
    u = r["unthrottled"]
    print(
        f"1. unthrottled move of {u['mb']:.0f} MiB, {{1,2,3}} -> [2,3,4]: {u['seconds']:.2f} s "
        f"= {u['mb_per_sec']:.1f} MiB/s (copy {u['copy_seconds']:.2f} s); in sync -> done "
        f"{u['in_sync_to_done_ms']:.0f} ms; done -> old copy deleted "
        f"{u['done_to_old_copy_deleted_ms']:.0f} ms"
    )
    print("\n2. throttle accuracy (copy rate between 20% and 80%)")
    print("| throttle MiB/s | size MiB | measured MiB/s | error | move s |")
    print("|---|---|---|---|---|")
    for t in r["throttled"]:
        print(
            f"| {t['rate_mb']:g} | {t['size_mb']:.0f} | {t['measured_mb_per_sec']:.2f} | "
            f"{t['error_pct']:+.1f}% | {t['seconds']:.1f} |"
        )
    lt = r["live_traffic"]
    print(f"\n3. acks=all produce on {tuple(lt['partition'])} (leader {lt['leader']})")
    print("| while | MiB/s | p50 ms | p99 ms | errors |")
    print("|---|---|---|---|---|")
    for key, label in (
        ("no_move", "no move"),
        ("unthrottled_move", f"{lt['unthrottled_move']['moves']} unthrottled moves"),
        ("throttled_move", "move throttled at 8 MiB/s"),
    ):
        x = lt[key]
        print(
            f"| {label} ({x['seconds']:.1f} s) | {x['mb_per_sec']:.1f} | {x['p50_ms']:.1f} | "
            f"{x['p99_ms']:.1f} | {x['errors']} |"
        )
    lo = r["leadership_only"]
    print(f"\n4. leadership-only plan on {lo['partitions']} partitions: {lo['ms']:.0f} ms")
    print(f"\n(filling took {r['fill_seconds']:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=256, help="MiB in the moved partition")
    parser.add_argument("--rates", default="2,8,32", help="throttles to check, MiB/s")
    parser.add_argument(
        "--throttle-seconds",
        type=float,
        default=6.0,
        help="each throttled partition holds rate x this many MiB",
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="live-traffic load time")
    parser.add_argument("--in-flight", type=int, default=8, help="pipelined live requests")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import uvloop

    results = uvloop.run(bench(args))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_table(results)


if __name__ == "__main__":
    main()
