"""The nemesis: a fault schedule made from a seed, and the task that carries it out.

A schedule alternates fault windows with quiet windows, one fault at a time. Each
fault is a function ``(FaultContext, pick) -> (description, undo)``: it breaks
something in a ``Cluster`` (kill, SIGSTOP, cut links ...) and returns how to heal it.
``Nemesis.run`` injects, waits, heals, and records both in the History; when stopped it
heals whatever is active, so a run always ends with every node up and every link whole.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tests.faults.history import HEAL, INJECT, History
from tests.faults.processes import Cluster

Undo = Callable[[], None]


@dataclass(frozen=True, slots=True)
class Step:
    """One fault: planned ``at_s`` after the start, lasts ``duration_s``, then heals.

    It never begins less than ``quiet_s`` after the previous heal (a restart can take
    longer than planned), so the cluster always gets its quiet time to recover.
    ``pick`` chooses the target among the candidates at that moment (deterministically).
    """

    at_s: float
    fault: str
    duration_s: float
    pick: int
    quiet_s: float


def schedule(
    seed: int,
    duration_s: float,
    faults: Sequence[str],
    *,
    fault_s: tuple[float, float] = (0.5, 2.0),
    quiet_s: tuple[float, float] = (0.5, 2.0),
) -> list[Step]:
    """Faults alternating with quiet periods, all ending within ``duration_s``."""
    unknown = set(faults) - set(FAULTS)
    if unknown or not faults:
        raise ValueError(f"unknown faults {sorted(unknown)}; known: {sorted(FAULTS)}")
    rng = random.Random(seed)
    steps: list[Step] = []
    t = quiet = round(rng.uniform(*quiet_s), 3)
    while True:
        length = round(rng.uniform(*fault_s), 3)
        if t + length > duration_s:
            return steps
        steps.append(Step(t, rng.choice(list(faults)), length, rng.getrandbits(32), quiet))
        quiet = round(rng.uniform(*quiet_s), 3)
        t = round(t + length + quiet, 3)


@dataclass(slots=True)
class FaultContext:
    """What a fault may act on: the cluster and the workload's topic."""

    cluster: Cluster
    topic: str
    partitions: int

    def live(self) -> list[int]:
        return [n for n in self.cluster.running() if not self.cluster.node(n).paused]

    def choose(self, pick: int, candidates: Sequence[int]) -> int:
        if not candidates:
            raise LookupError("no node to act on")
        return sorted(candidates)[pick % len(candidates)]

    def leader(self, pick: int) -> int:
        """The leader of a partition chosen by ``pick``; any live node if none is known."""
        leader = self.cluster.leader_of(self.topic, pick % self.partitions)
        return leader if leader is not None else self.choose(pick, self.live())


def _kill(ctx: FaultContext, node: int) -> tuple[str, Undo]:
    ctx.cluster.kill(node)
    return f"kill -9 node {node}", lambda: ctx.cluster.restart(node)


def _pause(ctx: FaultContext, node: int) -> tuple[str, Undo]:
    ctx.cluster.pause(node)
    return f"SIGSTOP node {node}", lambda: ctx.cluster.resume(node)


def _isolate(ctx: FaultContext, node: int) -> tuple[str, Undo]:
    ctx.cluster.isolate(node)
    return f"isolate node {node}", lambda: ctx.cluster.heal(node)


def _lose_tail(ctx: FaultContext, node: int) -> tuple[str, Undo]:
    """SIGKILL, then chop the newest segment of every partition of the topic in half.

    Models a machine crash that lost writes never fsynced, except that it ignores
    fsyncs: it loses acknowledged data by design. For negative controls only.
    """
    ctx.cluster.kill(node)
    cut = []
    for p in range(ctx.partitions):
        part_dir = ctx.cluster.node(node).data_dir / f"{ctx.topic}-{p}"
        segments = sorted(part_dir.glob("*.log"))
        if segments:
            size = segments[-1].stat().st_size
            with open(segments[-1], "r+b") as f:
                f.truncate(size // 2)
            cut.append(f"{p}: {size}->{size // 2}")
    return (
        f"kill -9 node {node} and chop segment tails ({', '.join(cut)})",
        lambda: ctx.cluster.restart(node),
    )


def _cut_link(ctx: FaultContext, pick: int) -> tuple[str, Undo]:
    a = ctx.choose(pick, ctx.live())
    b = ctx.choose(random.Random(pick).getrandbits(32), [n for n in ctx.cluster.ids if n != a])
    ctx.cluster.cut(a, b)
    return f"cut link {a}<->{b}", lambda: ctx.cluster.heal(a, b)


#: name -> fn(context, pick) -> (description, undo). Every fault is healed by its undo.
FAULTS: dict[str, Callable[[FaultContext, int], tuple[str, Undo]]] = {
    "kill": lambda ctx, pick: _kill(ctx, ctx.choose(pick, ctx.live())),
    "kill_leader": lambda ctx, pick: _kill(ctx, ctx.leader(pick)),
    "pause": lambda ctx, pick: _pause(ctx, ctx.choose(pick, ctx.live())),
    "pause_leader": lambda ctx, pick: _pause(ctx, ctx.leader(pick)),
    "isolate": lambda ctx, pick: _isolate(ctx, ctx.choose(pick, ctx.live())),
    "isolate_leader": lambda ctx, pick: _isolate(ctx, ctx.leader(pick)),
    "cut_link": _cut_link,
    "lose_tail": lambda ctx, pick: _lose_tail(ctx, ctx.choose(pick, ctx.live())),
}


class Nemesis:
    """Carries out a schedule against a cluster, one fault at a time, recording each.

    Process and proxy controls block (a restart waits for the broker to be ready), so
    they run in worker threads; the nemesis itself is a task stopped by an event.
    """

    def __init__(
        self,
        cluster: Cluster,
        steps: Sequence[Step],
        *,
        topic: str,
        partitions: int,
    ) -> None:
        self.ctx = FaultContext(cluster, topic, partitions)
        self.steps = list(steps)
        self.active: list[tuple[str, Undo]] = []

    async def run(self, history: History, clock: Callable[[], int], stop: asyncio.Event) -> None:
        started = healed = time.monotonic()
        try:
            for step in self.steps:
                if await wait_until(stop, max(started + step.at_s, healed + step.quiet_s)):
                    return
                try:
                    done = await asyncio.to_thread(FAULTS[step.fault], self.ctx, step.pick)
                except LookupError as e:
                    history.nemesis(INJECT, f"{step.fault}: skipped ({e})", clock())
                    continue
                self.active.append(done)
                history.nemesis(INJECT, done[0], clock())
                if await wait_until(stop, time.monotonic() + step.duration_s):
                    return
                await self._heal(history, clock)
                healed = time.monotonic()
        finally:
            await self._heal(history, clock)

    async def _heal(self, history: History, clock: Callable[[], int]) -> None:
        while self.active:
            description, undo = self.active.pop()
            await asyncio.to_thread(undo)
            history.nemesis(HEAL, description, clock())


async def wait_until(stop: asyncio.Event, until: float) -> bool:
    """Wait until a monotonic time; True if ``stop`` was set first."""
    try:
        async with asyncio.timeout(max(0.0, until - time.monotonic())):
            await stop.wait()
    except TimeoutError:
        return False
    return True
