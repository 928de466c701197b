"""Offset commit throughput of the group coordinator (a benchmark, not a test).

    python -m tests.broker.bench_groups [--seconds 5] [--partitions 1] [--brokers 3]

Starts a ``logmq-server`` subprocess on a free port with a temp data dir (or, with
``--brokers 3``, a 3-broker cluster with ``__consumer_offsets`` replicated 3 ways), joins
one member per connection (each in its own group, so the groups spread over the
``__consumer_offsets`` partitions; each connection goes to its group's coordinator) and
commits as fast as the broker answers for a fixed time. Every answer means the commit
was fsynced, and in a cluster replicated to the partition's in-sync replicas. Cases:

* sequential: each connection waits for an answer before the next commit;
* pipelined: each connection keeps ``--window`` commits in flight.

Prints commits/s (requests) and partition offsets/s, plus the broker's CPU seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import uvloop

from logmq.net.codec import ApiKey
from tests.harness import BrokerProcess
from tests.net.raw_client import RawClient


def commit_body(group: str, member: str, epoch: int, offset: int, partitions: int) -> dict:
    return {
        "group_id": group,
        "member_id": member,
        "member_epoch": epoch,
        "topics": [
            {
                "topic": "bench",
                "partitions": [
                    {"partition": p, "offset": offset, "metadata": None} for p in range(partitions)
                ],
            }
        ],
    }


async def join(c: RawClient, group: str) -> tuple[str, int]:
    while True:
        body = {
            "group_id": group,
            "member_id": "",
            "member_epoch": 0,
            "instance_id": None,
            "rebalance_timeout_ms": 60_000,
            "session_timeout_ms": 60_000,
            "subscribed_topics": ["bench"],
            "server_assignor": None,
            "owned_partitions": None,
        }
        resp = (await c.call(ApiKey.CONSUMER_GROUP_HEARTBEAT, body)).body
        if resp["error"] == 0:
            return resp["member_id"], resp["member_epoch"]
        await asyncio.sleep(0.01)  # the coordinator is still loading


async def coordinator_port(port: int, group: str) -> int:
    """The client port of ``group``'s coordinator (FindCoordinator, retried while loading)."""
    async with await RawClient.connect(port) as c:
        while True:
            resp = await c.call(ApiKey.FIND_COORDINATOR, {"key_type": 0, "keys": [group]})
            (entry,) = resp.body["coordinators"]
            if entry["error"] == 0:
                return entry["port"]
            await asyncio.sleep(0.05)  # the offsets topic is being created


async def run_case(port: int, connections: int, window: int, seconds: float, partitions: int):
    ports = [await coordinator_port(port, f"bench-{i}") for i in range(connections)]
    clients = [await RawClient.connect(p) for p in ports]
    members = [await join(c, f"bench-{i}") for i, c in enumerate(clients)]
    done = 0
    stop_at = time.monotonic() + seconds

    async def drive(i: int) -> None:
        nonlocal done
        c, (member, epoch) = clients[i], members[i]
        offset = 0
        in_flight = 0
        while time.monotonic() < stop_at or in_flight:
            while in_flight < window and time.monotonic() < stop_at:
                offset += 1
                c.send(
                    ApiKey.OFFSET_COMMIT,
                    commit_body(f"bench-{i}", member, epoch, offset, partitions),
                )
                in_flight += 1
            resp = await c.recv()
            assert resp.body["error"] == 0, resp.body
            in_flight -= 1
            done += 1

    start = time.monotonic()
    await asyncio.gather(*(drive(i) for i in range(connections)))
    elapsed = time.monotonic() - start
    for c in clients:
        await c.close()
    return done / elapsed


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--partitions", type=int, default=1, help="partitions per commit")
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--brokers", type=int, default=1, help="1, or a cluster of this many")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cases = [
        ("1 connection, sequential", 1, 1),
        ("16 connections, sequential", 16, 1),
        ("64 connections, sequential", 64, 1),
        (f"1 connection, pipelined x{args.window}", 1, args.window),
        (f"8 connections, pipelined x{args.window}", 8, args.window),
    ]
    results = []
    extra = ["--offsets-topic-partitions", "50"]
    if args.brokers > 1:
        from tests.faults.processes import Cluster

        servers = Cluster(args.brokers, proxied=False, extra_args=extra)
        pids = lambda: [n.pid for n in servers.nodes.values()]  # noqa: E731
    else:
        servers = BrokerProcess(extra_args=extra)
        pids = lambda: [servers.pid]  # noqa: E731
    with servers:
        port = servers.node(1).port if args.brokers > 1 else servers.port
        async with await RawClient.connect(port) as c:
            await c.create_topic(
                "bench", max(args.partitions, 1), replication_factor=min(args.brokers, 3)
            )
        for name, connections, window in cases:
            cpu0 = sum(cpu_seconds(p) for p in pids())
            rate = await run_case(port, connections, window, args.seconds, args.partitions)
            cpu = sum(cpu_seconds(p) for p in pids()) - cpu0
            results.append(
                {
                    "case": name,
                    "commits_per_sec": round(rate),
                    "offsets_per_sec": round(rate * args.partitions),
                    "broker_cpu_s": round(cpu, 2),
                }
            )
            print(
                f"{name:34s} {rate:10,.0f} commits/s  {rate * args.partitions:10,.0f} "
                f"offsets/s  brokers' CPU {cpu:.2f}s / {args.seconds:.0f}s"
            )
    if args.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    uvloop.run(main())
