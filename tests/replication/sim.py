"""A deterministic in-memory Raft cluster: a network we control, disks, state machines.

Each node plays the shell's part exactly as docs/raft.md prescribes (persist, then send,
then apply, then advance), so the simulator also checks that the Ready contract is
implementable: entries must land contiguously on the disk, committed entries must be
applied in order. Everything observed is checked against the Raft safety properties by
``check_invariants``; tests call it after every step.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgpack

from logmq.replication import (
    Entry,
    EntryKind,
    HardState,
    Message,
    PersistentState,
    RaftNode,
    Role,
    Snapshot,
)
from logmq.replication.raft_messages import EMPTY_SNAPSHOT


@dataclass
class Disk:
    """What survives a crash."""

    hard_state: HardState = field(default_factory=HardState)
    snapshot: Snapshot = EMPTY_SNAPSHOT
    entries: list[Entry] = field(default_factory=list)

    @property
    def last_index(self) -> int:
        return self.entries[-1].index if self.entries else self.snapshot.index


class StateMachine:
    """Applies DATA entries to a list; its snapshot image is that list."""

    def __init__(self) -> None:
        self.applied = 0
        self.values: list[bytes] = []

    def image(self) -> bytes:
        return msgpack.packb([self.applied, self.values])

    def restore(self, data: bytes) -> None:
        if data:
            self.applied, self.values = msgpack.unpackb(data)
        else:
            self.applied, self.values = 0, []


class SimNode:
    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.disk = Disk()
        self.sm = StateMachine()
        self.raft: RaftNode | None = None


class SafetyViolation(AssertionError):
    pass


class Cluster:
    def __init__(
        self,
        voters: int | list[int],
        observers: Sequence[int] = (),
        *,
        seed: int = 0,
        election_ticks: int = 10,
        heartbeat_ticks: int = 1,
        snapshot_threshold: int | None = None,
        **raft_options: object,
    ) -> None:
        self.voters = list(range(1, voters + 1)) if isinstance(voters, int) else list(voters)
        self.observers = list(observers)
        self.seed = seed
        self.options = dict(
            election_ticks=election_ticks,
            heartbeat_ticks=heartbeat_ticks,
            snapshot_threshold=snapshot_threshold,
            **raft_options,
        )
        self.nodes = {i: SimNode(i) for i in self.voters + self.observers}
        self.network: list[Message] = []
        self.cut: set[tuple[int, int]] = set()  # directed links that drop everything
        self.restarts = 0
        self.delivered: Counter[str] = Counter()  # message type name -> deliveries
        # History for the safety checks.
        self.leaders_by_term: dict[int, set[int]] = {}
        self.committed: dict[int, tuple[Entry, int]] = {}  # index -> (entry, term seen at)
        self.applied_values: list[bytes] = []  # the one true state-machine sequence
        for node_id in self.nodes:
            self.restart(node_id)

    # -- node control ------------------------------------------------------------------------

    def raft(self, node_id: int) -> RaftNode:
        raft = self.nodes[node_id].raft
        assert raft is not None, f"node {node_id} is down"
        return raft

    def live(self) -> list[RaftNode]:
        return [n.raft for n in self.nodes.values() if n.raft is not None]

    def crash(self, node_id: int) -> None:
        """Lose everything but the disk."""
        self.nodes[node_id].raft = None

    def restart(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.raft is not None:
            return
        disk = node.disk
        state = PersistentState(disk.hard_state, disk.snapshot, list(disk.entries))
        self.restarts += 1
        rng = random.Random(self.seed * 1_000_003 + node_id * 1009 + self.restarts)
        node.raft = RaftNode(
            node_id,
            self.voters,
            state,
            observers=self.observers,
            rng=rng,
            **self.options,  # type: ignore[arg-type]
        )
        node.sm.restore(disk.snapshot.data)
        self._check_values(node)
        self._process(node)

    # -- the network ---------------------------------------------------------------------------

    def isolate(self, group: set[int]) -> None:
        """Cut every link between ``group`` and the other nodes (both directions)."""
        others = set(self.nodes) - group
        for a in group:
            for b in others:
                self.cut.add((a, b))
                self.cut.add((b, a))

    def heal(self) -> None:
        self.cut.clear()

    def deliver(self, position: int = 0, *, keep: bool = False) -> None:
        """Deliver the message at ``position`` (any position: reordering); ``keep`` duplicates."""
        if not self.network:
            return
        position %= len(self.network)
        msg = self.network[position] if keep else self.network.pop(position)
        node = self.nodes[msg.dst]
        if node.raft is None or (msg.src, msg.dst) in self.cut:
            return
        self.delivered[type(msg).__name__] += 1
        node.raft.step(msg)
        self._process(node)

    def drop(self, position: int = 0) -> None:
        if self.network:
            self.network.pop(position % len(self.network))

    def deliver_where(self, predicate: Callable[[Message], bool]) -> bool:
        """Deliver the first in-flight message matching ``predicate``; False if none."""
        for position, msg in enumerate(self.network):
            if predicate(msg):
                self.deliver(position)
                return True
        return False

    def drop_where(self, predicate: Callable[[Message], bool]) -> None:
        self.network = [m for m in self.network if not predicate(m)]

    def deliver_all(self, limit: int = 100_000) -> None:
        """Deliver in FIFO order until the network is quiet."""
        for _ in range(limit):
            if not self.network:
                return
            self.deliver(0)
        raise AssertionError("network never went quiet")

    # -- time and clients -----------------------------------------------------------------------

    def tick(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.raft is not None:
            node.raft.tick()
            self._process(node)

    def tick_all(self) -> None:
        for node_id in self.nodes:
            self.tick(node_id)

    def campaign(self, node_id: int) -> None:
        self.raft(node_id).campaign()
        self._process(self.nodes[node_id])

    def leaders(self) -> list[RaftNode]:
        return [r for r in self.live() if r.role is Role.LEADER]

    def leader(self) -> RaftNode | None:
        """The leader of the highest term, if any."""
        leaders = self.leaders()
        return max(leaders, key=lambda r: r.term) if leaders else None

    def propose(self, data: bytes) -> int | None:
        leader = self.leader()
        if leader is None:
            return None
        index = leader.propose(data)
        self._process(self.nodes[leader.node_id])
        return index

    def flush(self, node_id: int) -> None:
        """Carry out the node's pending Readys (after driving its RaftNode directly)."""
        self._process(self.nodes[node_id])

    def compact(self, node_id: int) -> None:
        """The node's shell decides to snapshot at its applied index."""
        node = self.nodes[node_id]
        if node.raft is not None and node.sm.applied > node.raft.log.snapshot.index:
            self._snapshot(node, node.sm.applied)

    def settle(self, max_ticks: int = 500) -> int:
        """Heal everything and run until one leader serves every live node; returns ticks used."""
        self.heal()
        for node_id in self.nodes:
            self.restart(node_id)
        for ticks in range(max_ticks):
            self.deliver_all()
            self.check_invariants()
            leader = self.leader()
            if leader is not None and all(
                r.leader_id == leader.node_id and r.term == leader.term for r in self.live()
            ):
                return ticks
            self.tick_all()
            self.check_invariants()
        raise AssertionError(f"no stable leader within {max_ticks} ticks")

    def commit_everywhere(self, data: bytes, max_ticks: int = 500) -> int:
        """Propose ``data`` (re-proposing after leader changes) until every node applied it."""
        proposed_in: int | None = None
        for ticks in range(max_ticks):
            leader = self.leader()
            wanted = leader is not None and proposed_in != leader.term
            if wanted and self.propose(data) is not None:  # None while a transfer is under way
                proposed_in = leader.term
            self.deliver_all()
            self.check_invariants()
            if all(data in n.sm.values for n in self.nodes.values()):
                return ticks
            self.tick_all()
            self.check_invariants()
        raise AssertionError(f"{data!r} not applied everywhere within {max_ticks} ticks")

    # -- the shell's side of the Ready contract ---------------------------------------------------

    def _process(self, node: SimNode) -> None:
        raft = node.raft
        assert raft is not None
        while (rd := raft.ready()) is not None:
            disk = node.disk
            if rd.snapshot is not None:
                disk.snapshot, disk.entries = rd.snapshot, []
                node.sm.restore(rd.snapshot.data)
                self._check_values(node)
            if rd.truncate_from is not None:
                disk.entries = [e for e in disk.entries if e.index < rd.truncate_from]
            for entry in rd.entries:
                if entry.index != disk.last_index + 1:
                    raise SafetyViolation(f"node {node.node_id}: gap before {entry}")
                disk.entries.append(entry)
            if rd.hard_state is not None:
                disk.hard_state = rd.hard_state
            self.network.extend(rd.messages)
            for entry in rd.committed_entries:
                self._apply(node, entry)
            if rd.take_snapshot_at is not None:
                self._snapshot(node, rd.take_snapshot_at)
            raft.advance(rd)
        self._observe_leader(raft)

    def _snapshot(self, node: SimNode, index: int) -> None:
        assert node.raft is not None and node.sm.applied == index
        node.raft.compact(index, node.sm.image())
        node.disk.snapshot = node.raft.log.snapshot
        node.disk.entries = [e for e in node.disk.entries if e.index > index]

    def _apply(self, node: SimNode, entry: Entry) -> None:
        if entry.index != node.sm.applied + 1:
            raise SafetyViolation(
                f"node {node.node_id} applies {entry.index} after {node.sm.applied}"
            )
        node.sm.applied = entry.index
        if entry.kind is EntryKind.DATA:
            node.sm.values.append(entry.data)
        seen = self.committed.get(entry.index)
        if seen is None:
            assert node.raft is not None
            self.committed[entry.index] = (entry, node.raft.term)
        elif seen[0] != entry:
            raise SafetyViolation(f"index {entry.index}: {seen[0]} and {entry} both applied")
        self._check_values(node)

    def _check_values(self, node: SimNode) -> None:
        values, truth = node.sm.values, self.applied_values
        if values[: len(truth)] != truth[: len(values)]:
            raise SafetyViolation(f"node {node.node_id} state machine diverged")
        if len(values) > len(truth):
            truth.extend(values[len(truth) :])

    def _observe_leader(self, raft: RaftNode) -> None:
        if raft.role is Role.LEADER:
            leaders = self.leaders_by_term.setdefault(raft.term, set())
            leaders.add(raft.node_id)
            if len(leaders) > 1:
                raise SafetyViolation(f"term {raft.term} has leaders {sorted(leaders)}")

    # -- safety ------------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        live = self.live()
        for raft in live:
            self._observe_leader(raft)
            if not raft.log.snapshot.index <= raft.commit_index <= raft.last_index:
                raise SafetyViolation(f"node {raft.node_id}: commit outside its log")
        for i, a in enumerate(live):
            for b in live[i + 1 :]:
                _check_log_matching(a, b)
        for leader in self.leaders():
            first = leader.log.first_index
            for index, (entry, term) in self.committed.items():
                if leader.term < term or index < first:
                    continue  # a stale leader, or covered by the leader's snapshot
                if index > leader.last_index or leader.log.entry_at(index) != entry:
                    raise SafetyViolation(
                        f"leader {leader.node_id} (term {leader.term}) lacks committed {entry}"
                    )


def _check_log_matching(a: RaftNode, b: RaftNode) -> None:
    """If two logs hold an entry with the same index and term, they agree up to it."""
    lo = max(a.log.first_index, b.log.first_index)
    hi = min(a.last_index, b.last_index)
    for index in range(hi, lo - 1, -1):
        if a.log.term_at(index) == b.log.term_at(index):
            if a.log.slice(lo, index) != b.log.slice(lo, index):
                raise SafetyViolation(f"nodes {a.node_id} and {b.node_id} break log matching")
            return
