"""Stateful model test: consumers joining, beating, losing responses, crashing, leaving.

Each client slot models one consumer process that owns exactly the partitions the
coordinator last told it (a "stubborn" beat keeps partitions it was told to give up, as a
slow consumer would). The invariants: no partition owned by two live processes, what a
process owns is what the coordinator thinks it holds, zombies cannot commit, the records
rebuild the same group; and once everybody heartbeats, every partition is owned once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from logmq.errors import ErrorCode
from logmq.group import ConsumerGroup, GroupConfig, GroupState, StickyAssignor
from logmq.group.assignors import RangeAssignor, RoundRobinAssignor

CONFIG = GroupConfig(session_timeout_ms=1000, heartbeat_interval_ms=100, rebalance_timeout_ms=3000)
SLOTS = 4  # slots 0 and 1 are static members
TOPIC_CHOICES = [frozenset({"t"}), frozenset({"t", "u"}), frozenset({"u"}), frozenset({"v"})]
FENCING_ERRORS = {
    ErrorCode.UNKNOWN_MEMBER_ID,
    ErrorCode.STALE_MEMBER_EPOCH,
    ErrorCode.FENCED_MEMBER_EPOCH,
}


@dataclass
class Process:
    slot: int
    alive: bool = False
    member_id: str | None = None
    epoch: int = 0
    owned: frozenset = frozenset()
    topics: frozenset = frozenset({"t"})
    incarnation: int = 0

    @property
    def instance_id(self) -> str | None:
        return f"inst-{self.slot}" if self.slot < 2 else None


@dataclass
class Zombie:
    member_id: str
    epoch: int


@dataclass
class Model:
    processes: list[Process] = field(default_factory=lambda: [Process(i) for i in range(SLOTS)])
    zombies: list[Zombie] = field(default_factory=list)


class GroupMachine(RuleBasedStateMachine):
    @initialize(assignor=st.sampled_from([StickyAssignor, RangeAssignor, RoundRobinAssignor]))
    def setup(self, assignor):
        self.now = 0
        self.metadata = {"t": 3, "u": 2}
        self.group = ConsumerGroup("g", assignor(), CONFIG, self.metadata)
        self.records = []
        self.model = Model()

    # ---- helpers -------------------------------------------------------------------

    def _send(self, p: Process, epoch: int | None = None, topics=None):
        epoch = p.epoch if epoch is None else epoch
        if epoch == 0:
            topics = p.topics
        result = self.group.heartbeat(p.member_id, epoch, p.instance_id, topics, p.owned, self.now)
        self.records += self.group.take_records()
        return result

    def _apply(self, p: Process, result, stubborn: bool = False) -> None:
        if result.error is ErrorCode.NONE:
            if not stubborn:
                # A process gives up only partitions that move away from it.
                (me,) = [m for m in self.group.describe().members if m.member_id == p.member_id]
                target = set(me.target)
                assert not (p.owned - result.assigned_partitions) & target
            p.member_id, p.epoch = result.member_id, result.member_epoch
            given = result.assigned_partitions
            p.owned = p.owned | given if stubborn else given
        else:
            assert result.error in {ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH}
            self.model.zombies.append(Zombie(p.member_id, p.epoch))
            p.epoch, p.owned = 0, frozenset()  # lost everything: rejoin next time

    def _stop(self, p: Process) -> None:
        if p.member_id is not None:
            self.model.zombies.append(Zombie(p.member_id, p.epoch))
        p.alive, p.member_id, p.epoch, p.owned = False, None, 0, frozenset()

    # ---- rules ---------------------------------------------------------------------

    def _draw_live(self, data, joined: bool = True, static: bool = False) -> Process:
        candidates = [
            p
            for p in self.model.processes
            if p.alive and (p.epoch > 0 or not joined) and (p.slot < 2 or not static)
        ]
        return data.draw(st.sampled_from(candidates))

    def _any_live(self, joined: bool = True, static: bool = False) -> bool:
        return any(
            p.alive and (p.epoch > 0 or not joined) and (p.slot < 2 or not static)
            for p in self.model.processes
        )

    @precondition(lambda self: not all(p.alive for p in self.model.processes))
    @rule(data=st.data(), topics=st.sampled_from(TOPIC_CHOICES))
    def start(self, data, topics):
        p = data.draw(st.sampled_from([p for p in self.model.processes if not p.alive]))
        p.incarnation += 1
        p.alive, p.member_id, p.epoch, p.owned, p.topics = (
            True,
            f"m{p.slot}.{p.incarnation}",
            0,
            frozenset(),
            topics,
        )
        self._apply(p, self._send(p))

    @precondition(lambda self: self._any_live(joined=False))
    @rule(data=st.data(), stubborn=st.booleans())
    def beat(self, data, stubborn):
        p = self._draw_live(data, joined=False)
        self._apply(p, self._send(p), stubborn)

    @precondition(lambda self: self._any_live())
    @rule(data=st.data())
    def beat_response_lost(self, data):
        self._send(self._draw_live(data))

    @precondition(lambda self: self._any_live())
    @rule(data=st.data(), topics=st.sampled_from(TOPIC_CHOICES))
    def resubscribe(self, data, topics):
        p = self._draw_live(data)
        p.topics = topics
        self._apply(p, self._send(p, topics=topics))

    @precondition(lambda self: self._any_live())
    @rule(data=st.data())
    def leave(self, data):
        p = self._draw_live(data)
        assert self._send(p, epoch=-1).member_epoch == -1
        self._stop(p)

    @precondition(lambda self: self._any_live(static=True))
    @rule(data=st.data())
    def leave_temporarily(self, data):
        p = self._draw_live(data, static=True)
        assert self._send(p, epoch=-2).member_epoch == -2
        self._stop(p)

    @precondition(lambda self: self._any_live(joined=False))
    @rule(data=st.data())
    def crash(self, data):
        self._stop(self._draw_live(data, joined=False))

    @rule(step=st.sampled_from([50, 400, 1100, 3100]))
    def advance_time(self, step):
        self.now += step
        expired = set(self.group.tick(self.now))
        self.records += self.group.take_records()
        for p in self.model.processes:
            if p.alive and p.member_id in expired:
                # The client's own session timer fires too: it stops using its partitions.
                self.model.zombies.append(Zombie(p.member_id, p.epoch))
                p.epoch, p.owned = 0, frozenset()

    @rule(grow=st.sampled_from(["t", "u", "v"]))
    def add_partition(self, grow):
        if self.metadata.get(grow, 0) < 5:
            self.metadata[grow] = self.metadata.get(grow, 0) + 1
            self.group.update_metadata(self.metadata)
            self.records += self.group.take_records()

    @precondition(lambda self: any(p.alive and p.owned for p in self.model.processes))
    @rule(data=st.data(), offset=st.integers(0, 100))
    def commit(self, data, offset):
        p = data.draw(st.sampled_from([p for p in self.model.processes if p.alive and p.owned]))
        tp = min(p.owned)
        member = self.group.member(p.member_id)
        before = self.group.fetch_offsets([tp])
        result = self.group.commit_offsets(p.member_id, p.epoch, {tp: (offset, "")}, self.now)
        self.records += self.group.take_records()
        if member is not None and member.member_epoch == p.epoch:
            assert result == {tp: ErrorCode.NONE}
            assert self.group.fetch_offsets([tp])[tp].offset == offset
        else:
            assert result[tp] in FENCING_ERRORS
            assert self.group.fetch_offsets([tp]) == before

    @precondition(lambda self: self.model.zombies)
    @rule(data=st.data())
    def zombie_commit(self, data):
        zombie = data.draw(st.sampled_from(self.model.zombies))
        member = self.group.member(zombie.member_id)
        if member is not None and member.member_epoch == zombie.epoch:
            return  # it rejoined under the same id and epoch: not a zombie any more
        tp = ("t", 0)
        before = self.group.fetch_offsets([tp])
        result = self.group.commit_offsets(zombie.member_id, zombie.epoch, {tp: (7, "")})
        assert result[tp] in FENCING_ERRORS
        assert self.group.fetch_offsets([tp]) == before
        assert self.group.take_records() == []

    @rule(compact=st.booleans())
    def replay_matches(self, compact):
        records = self.records
        if compact:
            newest = {r.key: r for r in records}
            records = [r for r in newest.values() if r.value is not None]
        copy = ConsumerGroup("g", self.group.assignor, CONFIG, self.metadata)
        copy.replay(records, self.now)
        assert copy.describe() == self.group.describe()

    # ---- invariants ----------------------------------------------------------------

    @invariant()
    def no_partition_owned_twice(self):
        seen: dict = {}
        for p in self.model.processes:
            for tp in p.owned:
                assert tp not in seen, f"{tp} owned by slots {seen[tp]} and {p.slot}"
                seen[tp] = p.slot
        held: dict = {}
        for m in self.group.describe().members:
            for tp in (*m.assigned, *m.pending_revocation):
                assert tp not in held, f"{tp} held by {held[tp]} and {m.member_id}"
                held[tp] = m.member_id

    @invariant()
    def processes_own_only_what_the_coordinator_says_they_hold(self):
        for p in self.model.processes:
            if p.owned:
                member = self.group.member(p.member_id)
                assert member is not None
                assert p.owned <= member.assigned | member.pending_revocation

    def teardown(self):
        if not hasattr(self, "group"):
            return
        live = [p for p in self.model.processes if p.alive]
        for round_ in range(60):
            for p in live:
                self._apply(p, self._send(p))
            stable = self.group.describe().state in (GroupState.STABLE, GroupState.EMPTY)
            if round_ > 12 and stable:  # past every session timeout of the departed
                break
            self.now += CONFIG.heartbeat_interval_ms
            self.group.tick(self.now)
        else:
            raise AssertionError(f"never settled: {self.group.describe()}")
        self.no_partition_owned_twice()
        wanted = {(t, i) for p in live for t in p.topics for i in range(self.metadata.get(t, 0))}
        owned = [tp for p in live for tp in p.owned]
        assert sorted(owned) == sorted(wanted)
        assert {m.member_id for m in self.group.describe().members} == {p.member_id for p in live}


GroupMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
TestGroupMachine = GroupMachine.TestCase
