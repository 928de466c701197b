"""Replication benchmarks (issue 5): acks=all on 3 brokers vs acks=1 on one, catch-up.

Each broker is its own process running the real data path (storage, DataApi, server,
ReplicaManager, ReplicaFetcher) with a static partition assignment instead of the
metadata quorum (tests/replication/replica_cluster.py's MiniBroker), so these numbers
measure replication alone. The load generator is this process: pipelined Produce
requests of pre-encoded batches (100-byte records) over one connection, the same load
for every case. Usage:

    python benchmarks/bench_replication.py [--seconds 5] [--catch-up-mb 1024]
    python benchmarks/bench_replication.py --failovers 5 --failover-only

Cases, all in one run on this machine:
* single broker, RF=1, acks=1 (the baseline);
* 3 brokers, RF=3, min.insync.replicas=2, acks=all;
* catch-up: a new, empty follower copies ``--catch-up-mb`` MB from the leader (MB/s).

``--failovers N`` adds the unavailability after SIGKILL of a partition leader (last ack
before to first ack after), on real ``logmq-server`` processes with default settings.
Speed goals live here, never in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.pipelined_produce import pipelined_produce  # noqa: E402

from logmq.client.connection import BrokerConnection  # noqa: E402
from logmq.errors import ErrorCode  # noqa: E402
from logmq.net.codec import ApiKey  # noqa: E402
from logmq.storage import batch as b  # noqa: E402
from tests.harness import free_port  # noqa: E402

TOPIC = "bench"


# -- one broker process ----------------------------------------------------------------


async def run_node(args: argparse.Namespace) -> None:
    import logging

    from logmq.broker.replica.replica_manager import (
        PartitionChange,
        ReplicaManager,
        ReplicationConfig,
    )
    from logmq.cluster.controller_api import AlterPartitionResponse
    from tests.replication.replica_cluster import MiniBroker

    logging.basicConfig(level=logging.WARNING)
    ports = {int(k): int(v) for k, v in (p.split("=") for p in args.peers.split(","))}
    replicas = tuple(int(r) for r in args.replicas.split(","))
    isr = tuple(int(r) for r in args.isr.split(","))
    broker = MiniBroker(args.id, Path(args.dir), {"min.insync.replicas": str(args.min_isr)})

    async def no_controller(_request):  # static assignment: the ISR stays as given
        return AlterPartitionResponse(ErrorCode.NOT_CONTROLLER)

    await broker.start(
        [(TOPIC, 0)],
        lambda logs, waiters: ReplicaManager(
            args.id,
            logs,
            waiters,
            alter_partition=no_controller,
            broker_address=lambda n: ("127.0.0.1", ports[n]) if n in ports else None,
            leader_logs=broker,
            metadata=lambda: broker.image,
            config=ReplicationConfig(),
        ),
        ports[args.id],
    )
    rm = broker.replicas
    await rm.start()
    role = "leader" if args.leader == args.id else "follower"
    await rm.apply_changes([PartitionChange(TOPIC, 0, role, args.leader, 0, 0, replicas, isr)])
    print("READY", flush=True)
    plog = broker.logs.get_log(TOPIC, 0)
    start = time.perf_counter()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    while not stop.is_set():
        if args.exit_at_offset >= 0 and plog.log_end_offset >= args.exit_at_offset:
            print(json.dumps({"seconds": time.perf_counter() - start}), flush=True)
            break
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.005 if args.exit_at_offset >= 0 else 1):
                await stop.wait()
    await rm.stop()
    await broker.stop()


# -- the benchmark driver --------------------------------------------------------------


class Nodes:
    def __init__(self, base: Path, ids: list[int]) -> None:
        self.base = base
        self.ports = {i: free_port() for i in ids}
        self.procs: dict[int, subprocess.Popen] = {}

    def start(self, node_id: int, *, leader: int, replicas, isr, min_isr: int, exit_at=-1):
        peers = ",".join(f"{i}={p}" for i, p in self.ports.items())
        cmd = [
            sys.executable, __file__, "node", "--id", str(node_id),
            "--dir", str(self.base / f"node{node_id}"), "--peers", peers,
            "--leader", str(leader), "--replicas", ",".join(map(str, replicas)),
            "--isr", ",".join(map(str, isr)), "--min-isr", str(min_isr),
            "--exit-at-offset", str(exit_at),
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("READY"):
            raise RuntimeError(f"node {node_id} did not start: {line!r}")
        self.procs[node_id] = proc
        return proc

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


def encoded_batch(records: int, size: int) -> bytes:
    value = os.urandom(size // 2).hex().encode()[:size]
    return b.encode_batch([(int(time.time() * 1000), None, value, None)] * records)


async def produce_load(
    port: int, acks: int, seconds: float, batch: bytes, in_flight: int = 32
) -> dict:
    conn = await BrokerConnection.open("127.0.0.1", port)
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(seconds, stop.set)
    try:
        return await pipelined_produce(
            conn, TOPIC, 0, batch, acks=acks, stop=stop, in_flight=in_flight
        )
    finally:
        conn.close()


async def bench(args: argparse.Namespace) -> dict:
    batch = encoded_batch(100, 100)  # 100 records of 100 B: one ~12 KB batch per request
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="logmq-bench-repl-") as tmp:
        single = Nodes(Path(tmp) / "single", [1])
        try:
            single.start(1, leader=1, replicas=(1,), isr=(1,), min_isr=1)
            results["single_acks1"] = await produce_load(single.ports[1], 1, args.seconds, batch)
        finally:
            single.stop_all()
        three = Nodes(Path(tmp) / "three", [1, 2, 3])
        try:
            for i in (1, 2, 3):
                three.start(i, leader=1, replicas=(1, 2, 3), isr=(1, 2, 3), min_isr=2)
            results["rf3_acks_all"] = await produce_load(three.ports[1], -1, args.seconds, batch)
        finally:
            three.stop_all()
        # catch-up: a leader with data, then an empty follower that must copy all of it
        catch = Nodes(Path(tmp) / "catch", [1, 2])
        try:
            catch.start(1, leader=1, replicas=(1, 2), isr=(1,), min_isr=1)
            big = encoded_batch(1000, 1000)  # ~1 MB batches
            conn = await BrokerConnection.open("127.0.0.1", catch.ports[1])
            count = max(1, args.catch_up_mb * 1_000_000 // len(big))
            body = {
                "acks": 1,
                "timeout_ms": 30_000,
                "topics": [{"topic": TOPIC, "partitions": [{"partition": 0, "size": len(big)}]}],
            }
            for _ in range(count):
                await conn.request(ApiKey.PRODUCE, body, [big])
            conn.close()
            target = count * 1000
            t0 = time.perf_counter()
            proc = catch.start(2, leader=1, replicas=(1, 2), isr=(1,), min_isr=1, exit_at=target)
            out = proc.stdout.readline() if proc.stdout else ""
            wall = time.perf_counter() - t0
            seconds = json.loads(out)["seconds"]
            mb = count * len(big) / 1e6
            results["catch_up"] = {
                "mb": mb,
                "seconds": seconds,
                "mb_per_sec": mb / seconds,
                "with_process_start_mb_per_sec": mb / wall,
            }
        finally:
            catch.stop_all()
    base = results["single_acks1"]["mb_per_sec"]
    results["acks_all_vs_single_acks1"] = results["rf3_acks_all"]["mb_per_sec"] / base
    return results


async def _send(producer, topic: str, acks: list[float], stop: asyncio.Event) -> None:
    """acks=all sends, 10 in flight, noting when each is acknowledged."""
    from logmq.errors import LogMQError

    n = 0
    while not stop.is_set():
        handles = [producer.send(topic, f"v{n + i}".encode(), partition=0) for i in range(10)]
        n += 10
        for h in handles:
            with contextlib.suppress(LogMQError):
                await h
                acks.append(time.monotonic())


async def failover(args: argparse.Namespace) -> dict:
    """Real ``logmq-server`` processes: the gap in acks=all acks around a leader SIGKILL."""
    from logmq import AsyncAdmin, AsyncProducer
    from tests.faults.processes import Cluster
    from tests.faults.workload import ensure_topic

    gaps, controller_killed = [], []
    for round_ in range(args.failovers):
        cluster = Cluster(3, proxied=False, extra_args=args.server_arg)
        await asyncio.to_thread(cluster.start)
        try:
            topic = f"failover{round_}"
            await ensure_topic(cluster.bootstrap, topic, 1, 3, {"min.insync.replicas": "2"})
            producer = await AsyncProducer(
                cluster.bootstrap, acks="all", enable_idempotence=True, linger_ms=1
            ).start()
            acks: list[float] = []
            stop = asyncio.Event()

            task = asyncio.get_running_loop().create_task(_send(producer, topic, acks, stop))
            while len(acks) < 200:
                await asyncio.sleep(0.05)  # warm-up pacing, not synchronisation
            leader = await asyncio.to_thread(cluster.leader_of, topic, 0)
            assert leader is not None
            async with AsyncAdmin(cluster.bootstrap) as admin:
                controller = (await admin.describe_cluster()).get("controller_id")
            controller_killed.append(controller == leader)
            await asyncio.to_thread(cluster.kill, leader)
            killed = time.monotonic()
            deadline = killed + 60
            while time.monotonic() < deadline and not any(t > killed + 0.001 for t in acks[-5:]):
                await asyncio.sleep(0.01)
            before = max((t for t in acks if t <= killed), default=killed)
            after = min((t for t in acks if t > killed), default=float("inf"))
            gaps.append(after - before)
            stop.set()
            await task
            await producer.close()
        finally:
            await asyncio.to_thread(cluster.close)
    return {"unavailability_s": gaps, "controller_killed": controller_killed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd")
    node = sub.add_parser("node")
    node.add_argument("--id", type=int, required=True)
    node.add_argument("--dir", required=True)
    node.add_argument("--peers", required=True)
    node.add_argument("--leader", type=int, required=True)
    node.add_argument("--replicas", required=True)
    node.add_argument("--isr", required=True)
    node.add_argument("--min-isr", type=int, default=1)
    node.add_argument("--exit-at-offset", type=int, default=-1)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--catch-up-mb", type=int, default=1024)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="Extra logmq-server argument for the failover runs (repeatable), e.g. "
        "--server-arg=--broker-session-timeout-ms --server-arg=3000.",
    )
    parser.add_argument(
        "--failovers",
        type=int,
        default=0,
        help="Also measure acks=all unavailability after SIGKILL of the leader this many "
        "times, on real logmq-server processes (needs the cluster wiring).",
    )
    parser.add_argument(
        "--failover-only",
        action="store_true",
        help="Skip the throughput and catch-up cases (with --failovers).",
    )
    args = parser.parse_args()
    import uvloop

    if args.cmd == "node":
        uvloop.run(run_node(args))
        return
    results = {} if args.failover_only else uvloop.run(bench(args))
    if args.failovers:
        results["failover"] = uvloop.run(failover(args))
    if args.json:
        print(json.dumps(results, indent=2))
        return
    if args.failover_only:
        _print_failover(results)
        return
    s, r, c = results["single_acks1"], results["rf3_acks_all"], results["catch_up"]
    print("| case | MB/s | p50 ms | p99 ms |")
    print("|---|---|---|---|")
    print(f"| 1 broker, acks=1 | {s['mb_per_sec']:.1f} | {s['p50_ms']:.1f} | {s['p99_ms']:.1f} |")
    print(f"| 3 brokers, RF=3, acks=all | {r['mb_per_sec']:.1f} | {r['p50_ms']:.1f} | "
          f"{r['p99_ms']:.1f} |")  # fmt: skip
    print(f"\nacks=all / acks=1: {results['acks_all_vs_single_acks1']:.0%}")
    print(
        f"catch-up: {c['mb']:.0f} MB in {c['seconds']:.2f} s = {c['mb_per_sec']:.0f} MB/s "
        f"({c['with_process_start_mb_per_sec']:.0f} MB/s counting the process start)"
    )
    _print_failover(results)


def _print_failover(results: dict) -> None:
    if "failover" in results:
        out = results["failover"]
        gaps = ", ".join(
            f"{g:.2f}{'*' if c else ''}"
            for g, c in zip(out["unavailability_s"], out["controller_killed"], strict=True)
        )
        print(f"unavailability after SIGKILL of the leader (last ack before to first after): "
              f"{gaps} s (*: the leader was also the controller)")  # fmt: skip


if __name__ == "__main__":
    main()
