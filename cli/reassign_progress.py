"""Where a reassignment plan stands: each partition's state, and bytes copied so far.

``classify`` and ``copy_progress`` are pure; ``snapshot`` reads the cluster once (the
controller's list of moving partitions, the topics' replicas, and DescribeLogDirs of the
leaders and of the brokers receiving copies); ``follow`` polls until the plan is done,
drawing a progress bar. ``logmq reassign verify`` and ``logmq cluster decommission`` /
``rebalance`` share them.

Bytes copied for one new replica: its size on disk, capped at the leader's; the total is
the leader's size. A new replica that has caught up is done even if the leader keeps
growing, so the bar reaches its end when the move completes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from logmq.client.admin import AsyncAdmin, PartitionDescription
from logmq.client.reassignment_admin import LogDirPartition, PartitionReassignment
from logmq.cluster.reassignment_plan import ReassignmentPlan
from logmq.errors import LogMQError
from logmq_cli.output import print_table

TopicPartition = tuple[str, int]

DONE = "done"
MOVING = "moving"
NOT_STARTED = "not started or cancelled"  # replicas differ and nothing is moving
OTHER_MOVE = "moving to another target"
MISSING = "no such partition"
# exit status of ``verify --no-wait``: complete, still moving, needs an operator
EXIT_DONE, EXIT_MOVING, EXIT_STUCK = 0, 1, 2
# a partition that looks not started is only believed after this long: the broker that
# answered Metadata may not have applied the controller's latest change yet
SETTLE_S = 3.0
UNREACHABLE_S = 60.0  # while waiting, errors the client may retry are tolerated this long
LOG_DIRS_TIMEOUT_S = 5.0  # a broker that is down must not stall the progress display


@dataclass(slots=True)
class PartitionState:
    topic: str
    partition: int
    state: str
    target: list[int]
    replicas: list[int]  # now (while moving: the original replicas plus the adding ones)
    isr: list[int] = field(default_factory=list)
    leader: int = -1
    adding: list[int] = field(default_factory=list)
    removing: list[int] = field(default_factory=list)
    bytes_total: int = 0
    bytes_copied: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "state": self.state,
            "target_replicas": self.target,
            "replicas": self.replicas,
            "isr": self.isr,
            "leader": self.leader,
            "adding_replicas": self.adding,
            "removing_replicas": self.removing,
            "bytes_total": self.bytes_total,
            "bytes_copied": self.bytes_copied,
        }


@dataclass(slots=True)
class Report:
    partitions: list[PartitionState]
    throttle_bytes_per_sec: int | None

    @property
    def exit_code(self) -> int:
        states = {p.state for p in self.partitions}
        if states - {DONE, MOVING}:
            return EXIT_STUCK
        return EXIT_MOVING if MOVING in states else EXIT_DONE

    @property
    def complete(self) -> bool:
        return self.exit_code == EXIT_DONE

    def to_json(self) -> dict[str, Any]:
        return {
            "complete": self.complete,
            "throttle_bytes_per_sec": self.throttle_bytes_per_sec,
            "bytes_total": sum(p.bytes_total for p in self.partitions),
            "bytes_copied": sum(p.bytes_copied for p in self.partitions),
            "partitions": [p.to_json() for p in self.partitions],
        }

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.partitions:
            out[p.state] = out.get(p.state, 0) + 1
        return out


def classify(
    target: tuple[int, ...], replicas: list[int] | None, moving: PartitionReassignment | None
) -> str:
    """The state of one plan entry, from the partition's replicas and its move (if any)."""
    if moving is not None:
        return MOVING if tuple(moving.target_replicas) == target else OTHER_MOVE
    if replicas is None:
        return MISSING
    return DONE if tuple(replicas) == target else NOT_STARTED


def copy_progress(
    leader_copy: LogDirPartition | None, new_copy: LogDirPartition | None
) -> tuple[int, int]:
    """(bytes copied, bytes total) of one new replica against its leader's copy."""
    total = leader_copy.size if leader_copy is not None else 0
    if new_copy is None:
        return 0, total
    caught_up = leader_copy is not None and new_copy.log_end_offset >= leader_copy.log_end_offset
    copied = total if caught_up else min(new_copy.size, total)
    return copied, total


async def describe_partitions(
    admin: AsyncAdmin, topics: set[str] | None = None
) -> dict[TopicPartition, PartitionDescription]:
    """Every partition (of ``topics``, or of all topics, internal ones included)."""
    names = await admin.list_topics(internal=True)
    if topics is not None:
        names = [n for n in names if n in topics]
    if not names:
        return {}
    descs = await admin.describe_topics(names)
    return {(name, p.partition): p for name, d in descs.items() for p in d.partitions}


async def current_replicas(
    admin: AsyncAdmin, topics: set[str] | None = None
) -> dict[TopicPartition, list[int]]:
    """Replicas per partition (of ``topics``, or all topics, internal ones included)."""
    parts = await describe_partitions(admin, topics)
    return {tp: list(p.replicas) for tp, p in parts.items()}


async def snapshot(admin: AsyncAdmin, plan: ReassignmentPlan) -> Report:
    """Every plan entry's state, with the bytes its new replicas have copied so far."""
    listing = await admin.list_partition_reassignments(list(plan.partitions))
    parts = await describe_partitions(admin, {t for t, _ in plan.partitions})
    out = []
    for tp, target in plan.partitions.items():
        moving, now = listing.partitions.get(tp), parts.get(tp)
        replicas = None if now is None else list(now.replicas)
        state = PartitionState(tp[0], tp[1], classify(target, replicas, moving), list(target), [])
        if moving is not None:
            state.replicas, state.isr, state.leader = moving.replicas, moving.isr, moving.leader
            state.adding, state.removing = moving.adding_replicas, moving.removing_replicas
        elif now is not None:
            state.replicas, state.isr, state.leader = list(now.replicas), list(now.isr), now.leader
        out.append(state)
    await _fill_bytes(admin, [s for s in out if s.state == MOVING])
    return Report(out, listing.throttle_bytes_per_sec)


async def _fill_bytes(admin: AsyncAdmin, moving: list[PartitionState]) -> None:
    wanted: dict[int, set[TopicPartition]] = {}
    for s in moving:
        for b in [s.leader, *s.adding]:
            if b >= 0:
                wanted.setdefault(b, set()).add((s.topic, s.partition))
    brokers = sorted(wanted)
    answers = await asyncio.gather(
        *(
            asyncio.wait_for(admin.describe_log_dirs(b, sorted(wanted[b])), LOG_DIRS_TIMEOUT_S)
            for b in brokers
        ),
        return_exceptions=True,
    )
    copies: dict[int, Mapping[TopicPartition, LogDirPartition]] = {}
    for b, answer in zip(brokers, answers, strict=True):
        if isinstance(answer, (LogMQError, OSError, TimeoutError)):
            copies[b] = {}  # a broker that does not answer shows no progress, for now
        elif isinstance(answer, BaseException):
            raise answer
        else:
            copies[b] = answer
    for s in moving:
        tp = (s.topic, s.partition)
        leader_copy = copies.get(s.leader, {}).get(tp)
        for b in s.adding:
            copied, total = copy_progress(leader_copy, copies.get(b, {}).get(tp))
            s.bytes_copied += copied
            s.bytes_total += total


# -- output ------------------------------------------------------------------------------------


def print_report(report: Report, *, title: str = "Reassignment") -> None:
    throttle = report.throttle_bytes_per_sec
    counts = ", ".join(f"{n} {s}" for s, n in report.counts().items())
    print_table(
        ["topic", "partition", "state", "replicas", "target", "isr", "copied"],
        [
            [p.topic, p.partition, _state_text(p), p.replicas, p.target, p.isr, _copied_text(p)]
            for p in report.partitions
        ],
        title=f"{title}: {counts}" + (f"; throttle {format_rate(throttle)}" if throttle else ""),
    )


def _state_text(p: PartitionState) -> str:
    if p.state != MOVING:
        return p.state
    change = [f"+{b}" for b in p.adding] + [f"-{b}" for b in p.removing]
    return f"moving ({' '.join(change)})" if change else "moving"


def _copied_text(p: PartitionState) -> str:
    if p.state != MOVING or not p.adding:
        return ""
    return f"{_size(p.bytes_copied)}/{_size(p.bytes_total)}"


def explain_stuck(report: Report) -> str:
    stuck = [p for p in report.partitions if p.state not in (DONE, MOVING)]
    names = ", ".join(f"{p.topic}-{p.partition} ({p.state})" for p in stuck[:5])
    more = f" and {len(stuck) - 5} more" if len(stuck) > 5 else ""
    return (
        f"{len(stuck)} partition(s) are neither on their target nor moving: {names}{more}; "
        "run `logmq reassign execute` with the plan to (re)start them"
    )


def format_rate(rate: int) -> str:
    return f"{_size(rate)}/s"


def _size(n: int) -> str:
    for unit, scale in (("GB", 1000**3), ("MB", 1000**2), ("KB", 1000)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


# -- following a plan --------------------------------------------------------------------------


class _CopyTotals:
    """(copied, total) bytes per moving partition across polls: a partition that
    finishes keeps its full bar instead of vanishing from the totals."""

    def __init__(self) -> None:
        self.pairs: dict[TopicPartition, tuple[int, int]] = {}

    def update(self, report: Report) -> tuple[int, int]:
        for p in report.partitions:
            tp = (p.topic, p.partition)
            if p.state == MOVING:
                self.pairs[tp] = (p.bytes_copied, p.bytes_total)
            elif p.state == DONE and tp in self.pairs:
                total = self.pairs[tp][1]
                self.pairs[tp] = (total, total)
            else:
                self.pairs.pop(tp, None)
        copied = sum(c for c, _ in self.pairs.values())
        return copied, sum(t for _, t in self.pairs.values())


async def follow(
    admin: AsyncAdmin,
    plan: ReassignmentPlan,
    *,
    wait: bool,
    interval_s: float = 1.0,
    timeout_s: float | None = None,
    show_progress: bool = True,
) -> tuple[Report, bool]:
    """Poll until every partition is done, one is stuck (not moving, not done) for longer
    than SETTLE_S, or ``timeout_s`` passes; without ``wait``, one look (settled).

    Returns the last report and whether the timeout ended the wait.
    """
    start = time.monotonic()
    stuck_since: float | None = None
    totals = _CopyTotals()
    states: dict[TopicPartition, str] = {}
    progress = _progress_bar() if wait and show_progress else None
    task = None
    failing_since: float | None = None
    try:
        while True:
            try:
                report = await snapshot(admin, plan)
            except (LogMQError, OSError, TimeoutError) as e:
                # a controller failover or a broker restart: keep following for a while
                retriable = not isinstance(e, LogMQError) or e.retriable
                now = time.monotonic()
                if not wait or not retriable:
                    raise
                if failing_since is None:
                    failing_since = now
                    if progress is not None and task is not None:
                        progress.console.print(f"cannot reach the cluster ({e}); retrying")
                elif now - failing_since > UNREACHABLE_S:
                    raise
                if timeout_s is not None and now - start >= timeout_s:
                    raise
                await asyncio.sleep(interval_s)
                continue
            failing_since = None
            now = time.monotonic()
            copied, total = totals.update(report)
            if progress is not None and (task is not None or report.exit_code != EXIT_DONE):
                if task is None:
                    progress.start()
                    task = progress.add_task("copying", total=total or None)
                progress.update(task, completed=copied, total=total or None)
                progress.update(task, description=_describe(report))
                for p in report.partitions:
                    tp = (p.topic, p.partition)
                    if tp in states and states[tp] != p.state:
                        progress.console.print(f"{p.topic}-{p.partition}: {p.state}")
                    states[tp] = p.state
            code = report.exit_code
            if code == EXIT_DONE:
                return report, False
            if code == EXIT_STUCK:
                stuck_since = now if stuck_since is None else stuck_since
                if now - stuck_since >= SETTLE_S:
                    return report, False
            else:
                stuck_since = None
                if not wait:
                    return report, False
            if timeout_s is not None and now - start >= timeout_s:
                return report, True
            await asyncio.sleep(interval_s if stuck_since is None else min(interval_s, 0.2))
    finally:
        if progress is not None and task is not None:
            progress.stop()


def _progress_bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
    )


def _describe(report: Report) -> str:
    counts = report.counts()
    return f"{counts.get(DONE, 0)}/{len(report.partitions)} done"


def echo_timeout(timeout_s: float) -> None:
    click.echo(f"Error: still moving after {timeout_s:g} s (the moves go on)", err=True)
