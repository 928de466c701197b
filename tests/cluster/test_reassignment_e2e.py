"""Issue 6 end to end: partition reassignment on 4 real brokers under live traffic.

Every test starts its own cluster: brokers 1, 2 and 3 are the metadata quorum's voters
and hold the workload topic (RF=3, min.insync.replicas=2, so every partition lives on
{1, 2, 3}); broker 4 then joins as an observer (a new, empty broker), and the test
moves partitions onto it. Throughout, idempotent acks=all producers send unique values
and a two-member consumer group reads and auto-commits (tests/faults/workload.py); the
history checker (tests/faults/history.py) then proves that no acknowledged record was
lost, duplicated or reordered and that no offset ever showed two different records.

The scenarios: a plain move of p0 from {1,2,3} to [2,3,4]; a kill -9 of the controller
in the middle of a throttled move; a cancelled move; the decommission of broker 1 with
the CLI; and the throttle's accuracy (the copy rate between 20% and 80% progress within
25% of the limit). Moves that must take a while copy a pre-filled partition under a
throttle. Every wait is a condition polled with a deadline. One more test pins down
what a plain consumer must do when a reassignment moves a partition's leadership.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from logmq import AsyncAdmin, AsyncConsumer, AsyncProducer, PartitionDescription
from logmq.errors import LogMQError
from tests.faults.history import History, Status
from tests.faults.processes import Cluster
from tests.faults.workload import GroupReaders, Workload, WorkloadConfig, ensure_topic, prefill

T = TypeVar("T")
TP = tuple[str, int]

VOTERS = [1, 2, 3]
NEW_BROKER = 4
# small: every partition of __consumer_offsets moves too; a group learns of a
# rebalance at its next heartbeat, so a short interval keeps group formation quick
SERVER_ARGS = ["--offsets-topic-partitions", "3", "--group-heartbeat-interval-ms", "500"]
TOPIC_CONFIGS = {"min.insync.replicas": "2"}
POLL_S = 0.05  # between two looks at the cluster while waiting for a condition
MOVE_TIMEOUT_S = 60.0
MiB = 1 << 20


# -- the cluster -----------------------------------------------------------------------
@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """Brokers 1-3 (the quorum's voters) running; broker 4 (an observer) not yet."""
    c = Cluster(4, tmp_path, voters=VOTERS, extra_args=SERVER_ARGS, proxied=False)
    try:
        await asyncio.to_thread(start_nodes, c, VOTERS)
        yield c
    finally:
        await asyncio.to_thread(c.close)


def start_nodes(cluster: Cluster, nodes: Sequence[int]) -> None:
    """Start ``nodes`` at once (the voters need each other to elect a controller)."""
    with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
        for f in [pool.submit(cluster.node(n).start) for n in nodes]:
            f.result()


async def join_new_broker(cluster: Cluster) -> None:
    """Broker 4 joins; it is ready once registered and unfenced."""
    await asyncio.to_thread(cluster.node(NEW_BROKER).start)
    brokers = await eventually(
        cluster,
        lambda admin: admin.describe_cluster(),
        lambda d: any(b["node_id"] == NEW_BROKER and not b["fenced"] for b in d["brokers"]),
        "broker 4 to register",
    )
    assert {b["node_id"] for b in brokers["brokers"]} == {1, 2, 3, 4}


def test_a_node_outside_the_voters_is_an_observer(tmp_path: Path) -> None:
    c = Cluster(4, tmp_path, voters=VOTERS, proxied=False)  # not started
    try:
        for n in c.ids:
            quorum = c.node(n).command()[c.node(n).command().index("--quorum-voters") + 1]
            assert sorted(int(v.split("@")[0]) for v in quorum.split(",")) == VOTERS
    finally:
        c.close()
    with pytest.raises(ValueError, match="subset"):
        Cluster(2, tmp_path, voters=[1, 5], proxied=False)


# -- looking at the cluster ---------------------------------------------------------------
async def eventually(
    cluster: Cluster,
    probe: Callable[[AsyncAdmin], Awaitable[T]],
    done: Callable[[T], bool],
    what: str,
    timeout: float = MOVE_TIMEOUT_S,
) -> T:
    """Poll ``probe`` until ``done(result)``; client errors (a broker just killed, a
    controller moving) count as "not yet". Fails at the deadline with the last answer."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        live = ",".join(cluster.node(n).bootstrap for n in cluster.running())
        try:
            async with AsyncAdmin(live, request_timeout_ms=3000) as admin:
                while True:
                    last = await probe(admin)
                    if done(last):
                        return last
                    if time.monotonic() > deadline:
                        break
                    await asyncio.sleep(POLL_S)
        except (LogMQError, OSError, TimeoutError) as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
        await asyncio.sleep(POLL_S)


async def partition_state(admin: AsyncAdmin, tp: TP) -> PartitionDescription:
    desc = (await admin.describe_topics([tp[0]]))[tp[0]]
    return next(p for p in desc.partitions if p.partition == tp[1])


async def local_size(admin: AsyncAdmin, broker: int, tp: TP) -> int | None:
    """The bytes of ``tp``'s log on ``broker`` (None: it holds no copy)."""
    found = await admin.describe_log_dirs(broker, [tp])
    return found[tp].size if tp in found else None


async def wait_moved(
    cluster: Cluster, tp: TP, replicas: Sequence[int], timeout: float = MOVE_TIMEOUT_S
) -> None:
    """Until no reassignment is listed and ``tp`` has exactly ``replicas`` (in order),
    all of them in the ISR and the first one leading."""

    async def probe(admin: AsyncAdmin) -> tuple[Any, PartitionDescription]:
        return await admin.list_partition_reassignments(), await partition_state(admin, tp)

    await eventually(
        cluster,
        probe,
        lambda r: (
            not r[0].partitions
            and list(r[1].replicas) == list(replicas)
            and set(r[1].isr) == set(replicas)
            and r[1].leader == replicas[0]
        ),
        f"{tp} to be on {list(replicas)} with no reassignment listed",
        timeout,
    )


async def wait_dropped(cluster: Cluster, broker: int, tp: TP) -> None:
    """Until ``broker`` no longer has a copy of ``tp`` (a replica removed by a move)."""
    await eventually(
        cluster,
        lambda admin: local_size(admin, broker, tp),
        lambda size: size is None,
        f"broker {broker} to delete its copy of {tp}",
    )


async def wait_copied(cluster: Cluster, broker: int, tp: TP, fraction: float, total: int) -> int:
    """Until ``broker``'s copy of ``tp`` holds ``fraction`` of ``total`` bytes."""
    return await eventually(
        cluster,
        lambda admin: local_size(admin, broker, tp),
        lambda size: size is not None and size >= fraction * total,
        f"broker {broker} to copy {fraction:.0%} of {total} bytes of {tp}",
    )


async def wait_identical_copies(cluster: Cluster, tp: TP, replicas: Sequence[int]) -> None:
    """Until every replica's copy of ``tp`` has the same bounds and size (call once the
    producers stopped): the new replicas hold the whole log, not only its tail."""

    async def probe(admin: AsyncAdmin) -> list[tuple[int, int, int] | None]:
        out = []
        for broker in replicas:
            found = (await admin.describe_log_dirs(broker, [tp])).get(tp)
            out.append(
                None
                if found is None
                else (found.log_start_offset, found.log_end_offset, found.size)
            )
        return out

    await eventually(
        cluster,
        probe,
        lambda copies: None not in copies and len(set(copies)) == 1,
        f"identical copies of {tp} on {list(replicas)}",
    )


async def leader_size(cluster: Cluster, tp: TP) -> int:
    """The bytes of ``tp``'s log on its leader: what a new replica has to copy."""

    async def probe(admin: AsyncAdmin) -> int | None:
        return await local_size(admin, (await partition_state(admin, tp)).leader, tp)

    return await eventually(cluster, probe, lambda s: bool(s), f"the size of {tp}")


async def copy_sizes(
    cluster: Cluster, broker: int, tp: TP, stop: asyncio.Event
) -> list[int | None]:
    """The sizes of ``broker``'s copy of ``tp``, looked at until ``stop`` is set (client
    errors while the cluster fails over are skipped)."""
    sizes: list[int | None] = []
    while not stop.is_set():
        live = ",".join(cluster.node(n).bootstrap for n in cluster.running())
        try:
            async with AsyncAdmin(live, request_timeout_ms=3000) as admin:
                while not stop.is_set():
                    sizes.append(await local_size(admin, broker, tp))
                    await asyncio.sleep(POLL_S)
        except (LogMQError, OSError, TimeoutError):
            await asyncio.sleep(POLL_S)
    return sizes


async def controller_id(cluster: Cluster) -> int:
    desc = await eventually(
        cluster,
        lambda admin: admin.describe_cluster(),
        lambda d: d["controller_id"] in cluster.running(),
        "a controller",
    )
    return desc["controller_id"]


async def throttle_removed(cluster: Cluster) -> None:
    """The controller drops the throttle itself when the last move ends."""
    await eventually(
        cluster,
        lambda admin: admin.list_partition_reassignments(),
        lambda listing: listing.throttle_bytes_per_sec is None and not listing.partitions,
        "the reassignment throttle to be removed",
        timeout=10.0,
    )


# -- the workload ------------------------------------------------------------------------
def workload_for(cluster: Cluster, topic: str, seed: int) -> tuple[Workload, GroupReaders]:
    """Two idempotent acks=all producers on ``topic`` (3 partitions, RF=3) and a
    two-member consumer group reading it, both recording into one history."""
    config = WorkloadConfig(
        topic=topic,
        partitions=3,
        replication_factor=3,
        topic_configs=dict(TOPIC_CONFIGS),
        producers=2,
        consumers=0,  # the group is the reader
        rate=50,
        seed=seed,
    )
    workload = Workload(cluster, config)
    group = GroupReaders(
        cluster.bootstrap, topic, workload.history, workload.clock, group_id=f"{topic}-readers"
    )
    return workload, group


async def create_on_voters(cluster: Cluster, topic: str) -> None:
    """The topic, created while only brokers 1-3 exist: every partition on {1, 2, 3}."""
    await ensure_topic(cluster.bootstrap, topic, 3, 3, dict(TOPIC_CONFIGS))


async def group_consuming(workload: Workload, group: GroupReaders) -> int:
    """Until the group is stable and has read every partition since; returns the time.
    (A group still forming moves partitions between its members, which pauses them.)"""
    await group.wait_stable()
    stable_ms = workload.clock()
    for tp in workload.partitions:
        await wait_group_reads_after(group, workload.history, tp, stable_ms)
    return stable_ms


async def wait_group_reads_after(
    group: GroupReaders, history: History, tp: TP, after_ms: int
) -> None:
    """Until a group member has read a record of ``tp`` at or after ``after_ms``: its
    consumption of the moved partition went on after the move."""
    deadline = time.monotonic() + MOVE_TIMEOUT_S
    while not group_reads(group, history, tp, after_ms, None):
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the group read nothing of {tp} after {after_ms} ms; {group.explain()}"
            )
        await asyncio.sleep(POLL_S)


def group_reads(
    group: GroupReaders, history: History, tp: TP, from_ms: int, to_ms: int | None
) -> int:
    members = set(group.names)
    return sum(
        1
        for r in history.reads
        if r.reader in members
        and (r.topic, r.partition) == tp
        and r.at_ms >= from_ms
        and (to_ms is None or r.at_ms <= to_ms)
    )


def acks_between(history: History, tp: TP, from_ms: int, to_ms: int) -> int:
    return sum(
        1
        for a in history.attempts
        if a.tp == tp and a.status is Status.ACKED and from_ms <= (a.done_ms or -1) <= to_ms
    )


def check(workload: Workload, group: GroupReaders) -> None:
    result = workload.history.check()
    assert result.ok, f"{result.report()}\n{workload.describe()}\ngroup errors: {group.errors}"
    assert result.stats["acked"] > 0, result.report()


# -- 1: a plain move ------------------------------------------------------------------------
async def test_move_a_partition_onto_a_new_broker(cluster: Cluster) -> None:
    """p0 moves from {1,2,3} to [2,3,4] while producers and a group keep going."""
    topic = "moves"
    tp = (topic, 0)
    await create_on_voters(cluster, topic)
    await join_new_broker(cluster)
    workload, group = workload_for(cluster, topic, seed=1)
    async with workload.live([group.run]) as stop_producing:
        await group_consuming(workload, group)
        async with AsyncAdmin(cluster.bootstrap) as admin:
            before = await partition_state(admin, tp)
            assert set(before.replicas) == {1, 2, 3}
            await admin.alter_partition_reassignments({tp: [2, 3, 4]})
        await wait_moved(cluster, tp, [2, 3, 4])
        moved_ms = workload.clock()
        await wait_group_reads_after(group, workload.history, tp, moved_ms)
        await wait_dropped(cluster, 1, tp)  # broker 1 is no replica any more
        await stop_producing()
        await group.wait_caught_up()
        await wait_identical_copies(cluster, tp, [2, 3, 4])
    check(workload, group)
    assert acks_between(workload.history, tp, moved_ms, workload.clock()) > 0


# -- 2: the controller dies in the middle of a move -------------------------------------------
async def test_controller_killed_in_the_middle_of_a_move(cluster: Cluster) -> None:
    """kill -9 of the controller while a throttled move copies; the next controller
    finishes it, the killed broker (a replica the move removes) drops its copy when it
    comes back."""
    topic = "failover"
    tp = (topic, 0)
    await create_on_voters(cluster, topic)
    await join_new_broker(cluster)
    workload, group = workload_for(cluster, topic, seed=2)
    await prefill(cluster.bootstrap, *tp, workload.history, workload.clock, total_bytes=6 * MiB)
    total = await leader_size(cluster, tp)
    async with workload.live([group.run]) as stop_producing:
        await group_consuming(workload, group)
        controller = await controller_id(cluster)
        async with AsyncAdmin(cluster.bootstrap) as admin:
            original = list((await partition_state(admin, tp)).replicas)
            assert controller in original  # every partition is on the three voters
            target = [r for r in original if r != controller] + [NEW_BROKER]
            await admin.alter_partition_reassignments({tp: target}, throttle_bytes_per_sec=MiB)
        started_ms = workload.clock()
        copied = await wait_copied(cluster, NEW_BROKER, tp, 0.25, total)
        assert copied < total  # in the middle of the copy
        await asyncio.to_thread(cluster.kill, controller)
        killed_ms = workload.clock()
        moved = asyncio.Event()
        sizes = asyncio.create_task(copy_sizes(cluster, NEW_BROKER, tp, moved))
        try:
            assert await controller_id(cluster) != controller
            await wait_moved(cluster, tp, target)  # without the killed broker
        finally:
            moved.set()
            seen = await sizes
        moved_ms = workload.clock()
        # the move resumed where it was: the new replica's copy never started over
        after_kill = [size for size in seen if size is not None]
        assert after_kill and min(after_kill) >= copied, (copied, after_kill)
        await asyncio.to_thread(cluster.restart, controller)
        await wait_dropped(cluster, controller, tp)
        await eventually(
            cluster,
            lambda admin: admin.describe_topics([topic]),
            lambda found: all(set(p.isr) == set(p.replicas) for p in found[topic].partitions),
            f"broker {controller} back in the ISR of every partition of {topic}",
        )
        await wait_group_reads_after(group, workload.history, tp, moved_ms)
        await stop_producing()
        await group.wait_caught_up()
        await wait_identical_copies(cluster, tp, target)
    check(workload, group)
    await throttle_removed(cluster)
    assert group_reads(group, workload.history, tp, started_ms, moved_ms) > 0
    assert acks_between(workload.history, tp, killed_ms, moved_ms) > 0


# -- 3: cancel ---------------------------------------------------------------------------------
async def test_cancel_returns_to_the_original_replicas(cluster: Cluster) -> None:
    """A throttled move cancelled half way: the original replicas (same order) stay, the
    adding broker deletes its partial copy."""
    topic = "cancel"
    tp = (topic, 0)
    await create_on_voters(cluster, topic)
    await join_new_broker(cluster)
    workload, group = workload_for(cluster, topic, seed=3)
    await prefill(cluster.bootstrap, *tp, workload.history, workload.clock, total_bytes=6 * MiB)
    total = await leader_size(cluster, tp)
    async with workload.live([group.run]) as stop_producing:
        await group_consuming(workload, group)
        async with AsyncAdmin(cluster.bootstrap) as admin:
            before = await partition_state(admin, tp)
            original = list(before.replicas)
            target = [*original[1:], NEW_BROKER]
            await admin.alter_partition_reassignments({tp: target}, throttle_bytes_per_sec=MiB)
        listing = await eventually(
            cluster,
            lambda admin: admin.list_partition_reassignments(),
            lambda listing: tp in listing.partitions,
            f"the move of {tp} to be listed",
        )
        assert listing.throttle_bytes_per_sec == MiB
        moving = listing.partitions[tp]
        assert moving.target_replicas == target
        assert moving.adding_replicas == [NEW_BROKER]
        assert moving.removing_replicas == original[:1]
        assert moving.replicas == [*original, NEW_BROKER]
        copied = await wait_copied(cluster, NEW_BROKER, tp, 0.2, total)
        assert copied < total  # still in the middle
        async with AsyncAdmin(cluster.bootstrap) as admin:
            await admin.alter_partition_reassignments({tp: None})
        await eventually(
            cluster,
            lambda admin: partition_state(admin, tp),
            lambda p: list(p.replicas) == original and set(p.isr) == set(original),
            f"{tp} back on {original}",
        )
        await throttle_removed(cluster)
        await wait_dropped(cluster, NEW_BROKER, tp)
        cancelled_ms = workload.clock()
        await wait_group_reads_after(group, workload.history, tp, cancelled_ms)
        await stop_producing()
        await group.wait_caught_up()
    check(workload, group)
    async with AsyncAdmin(cluster.bootstrap) as admin:
        after = await partition_state(admin, tp)
    assert list(after.replicas) == original and after.leader in original


# -- 4: decommission -----------------------------------------------------------------------------
async def test_decommission_a_broker(cluster: Cluster) -> None:
    """``logmq cluster decommission 1``: afterwards no partition (internal ones
    included) has broker 1 as a replica, and broker 1 holds no partition data."""
    topic = "decommission"
    await create_on_voters(cluster, topic)
    await join_new_broker(cluster)
    workload, group = workload_for(cluster, topic, seed=4)
    async with workload.live([group.run]) as stop_producing:
        await group_consuming(workload, group)
        started_ms = workload.clock()
        out = await asyncio.to_thread(run_cli, cluster, "cluster", "decommission", "1")
        assert out.returncode == 0, out.stderr + out.stdout

        async def placement(admin: AsyncAdmin) -> tuple[Any, dict[TP, Any]]:
            names = await admin.list_topics(internal=True)
            found = await admin.describe_topics(names)
            parts = {(t, p.partition): p for t, d in found.items() for p in d.partitions}
            return await admin.list_partition_reassignments(), parts

        _listing, parts = await eventually(
            cluster,
            placement,
            lambda r: (
                not r[0].partitions
                and all(
                    1 not in p.replicas and set(p.isr) == set(p.replicas) and p.leader != 1
                    for p in r[1].values()
                )
            ),
            "every replica to leave broker 1",
        )
        assert {tp[0] for tp in parts} >= {topic, "__consumer_offsets"}
        assert all(len(p.replicas) == 3 for p in parts.values()), parts
        await eventually(
            cluster,
            lambda admin: admin.describe_log_dirs(1),
            lambda found: not found,
            "broker 1 to delete its copies",
        )
        moved_ms = workload.clock()
        for tp in workload.partitions:
            await wait_group_reads_after(group, workload.history, tp, moved_ms)
        await stop_producing()
        await group.wait_caught_up()
    check(workload, group)
    assert group_reads(group, workload.history, (topic, 0), started_ms, moved_ms) > 0


def run_cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    live = ",".join(cluster.node(n).bootstrap for n in cluster.running())
    return subprocess.run(
        [sys.executable, "-m", "logmq_cli.main", "--bootstrap", live, *args],
        capture_output=True,
        text=True,
        timeout=MOVE_TIMEOUT_S,
    )


# -- a consumer follows leadership moved by a reassignment ----------------------------------------
async def test_consumer_follows_a_leader_moved_onto_an_idle_fetch_broker(cluster: Cluster) -> None:
    """A reassignment that only reorders replicas moves leadership (to the new first
    replica). A consumer that once fetched from that broker, and has nothing to fetch
    there now, must pick the partition up there: the leader change must wake it."""
    topic = "leaders"
    await ensure_topic(cluster.bootstrap, topic, 2, 3)
    async with AsyncAdmin(cluster.bootstrap) as admin:
        p0, p1 = (await admin.describe_topics([topic]))[topic].partitions
    assert p0.leader != p1.leader  # placement spreads leaders
    async with AsyncProducer(cluster.bootstrap, acks="all") as producer:
        await producer.send(topic, b"p0", partition=0)
        await producer.send(topic, b"p1-before", partition=1)
    async with AsyncConsumer(
        cluster.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100
    ) as consumer:
        consumer.assign([(topic, 0), (topic, 1)])
        assert await read_values(consumer, 2) == {b"p0", b"p1-before"}
        consumer.assign([(topic, 1)])  # nothing left to fetch from p0's leader
        target = [p0.leader, *(r for r in p1.replicas if r != p0.leader)]
        async with AsyncAdmin(cluster.bootstrap) as admin:
            await admin.alter_partition_reassignments({(topic, 1): target})
        await wait_moved(cluster, (topic, 1), target)
        async with AsyncProducer(cluster.bootstrap, acks="all") as producer:
            await producer.send(topic, b"p1-after", partition=1)
        assert await read_values(consumer, 1) == {b"p1-after"}


async def read_values(consumer: AsyncConsumer, count: int, timeout: float = 15.0) -> set[bytes]:
    values: set[bytes] = set()
    deadline = time.monotonic() + timeout
    while len(values) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"read {values} of {count} records in {timeout}s")
        for batch in await consumer.poll_batches(timeout=min(0.5, remaining)):
            values.update(v for v in batch.values() if v is not None)
    return values


# -- 5: the throttle ---------------------------------------------------------------------------
async def test_throttle_holds_the_copy_rate(cluster: Cluster) -> None:
    """A 16 MiB partition copied to a new broker under a 4 MiB/s throttle: between 20%
    and 80% progress the copy runs at 4 MiB/s +-25%, while the partition's ordinary
    replication (acks=all to its in-sync followers) goes on. The new broker ends up
    leading, so the final read (and the checker) sees the log through its copy."""
    topic = "throttled"
    tp = (topic, 0)
    rate = 4 * MiB
    await create_on_voters(cluster, topic)
    await join_new_broker(cluster)
    workload, group = workload_for(cluster, topic, seed=5)
    await prefill(cluster.bootstrap, *tp, workload.history, workload.clock, total_bytes=16 * MiB)
    total = await leader_size(cluster, tp)
    async with workload.live([group.run]) as stop_producing:
        await group_consuming(workload, group)
        async with AsyncAdmin(cluster.bootstrap) as admin:
            original = list((await partition_state(admin, tp)).replicas)
            target = [NEW_BROKER, *original[1:]]
            started_ms = workload.clock()
            await admin.alter_partition_reassignments({tp: target}, throttle_bytes_per_sec=rate)
            samples = await sample_copy(admin, NEW_BROKER, tp, total)
        copied_ms = workload.clock()
        await wait_moved(cluster, tp, target)
        await wait_dropped(cluster, original[0], tp)
        await stop_producing()
        await group.wait_caught_up()
        await wait_identical_copies(cluster, tp, target)
    check(workload, group)
    await throttle_removed(cluster)
    measured = copy_rate(samples, total, 0.2, 0.8)
    assert 0.75 * rate <= measured <= 1.25 * rate, (
        f"copy rate {measured / MiB:.2f} MiB/s under a {rate / MiB:.0f} MiB/s throttle; "
        f"samples (s, bytes): {samples}"
    )
    assert acks_between(workload.history, tp, started_ms, copied_ms) > 0


async def sample_copy(
    admin: AsyncAdmin, broker: int, tp: TP, total: int, timeout: float = MOVE_TIMEOUT_S
) -> list[tuple[float, int]]:
    """(seconds, bytes) of ``broker``'s copy of ``tp``, looked at every few ms until it
    holds ``total`` bytes; each time is the middle of its request."""
    samples: list[tuple[float, int]] = []
    t0 = time.monotonic()
    while not samples or samples[-1][1] < total:
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"copy of {tp} incomplete after {timeout}s: {samples[-5:]}")
        before = time.monotonic()
        size = await local_size(admin, broker, tp)
        samples.append(((before + time.monotonic()) / 2 - t0, size or 0))
        await asyncio.sleep(0.02)
    return samples


def copy_rate(samples: Sequence[tuple[float, int]], total: int, lo: float, hi: float) -> float:
    """Bytes/s of the copy between ``lo`` and ``hi`` progress: the least-squares slope
    of size over time (the copy advances in fetch-sized steps, so two single crossing
    times would be off by up to a step each)."""
    window = [(t, s) for t, s in samples if lo * total <= s <= hi * total]
    assert len(window) >= 3, f"too few samples between {lo:.0%} and {hi:.0%}: {samples}"
    n = len(window)
    mt = sum(t for t, _ in window) / n
    ms = sum(s for _, s in window) / n
    var = sum((t - mt) ** 2 for t, _ in window)
    assert var > 0, window
    return sum((t - mt) * (s - ms) for t, s in window) / var


def test_copy_rate_is_the_slope_of_a_staircase() -> None:
    """The estimator itself: a copy in 1 MiB steps every 0.25 s is 4 MiB/s."""
    steps = [(i * 0.25 + j * 0.02, i * MiB) for i in range(17) for j in range(12)]
    assert copy_rate(steps, 16 * MiB, 0.2, 0.8) == pytest.approx(4 * MiB, rel=0.1)
