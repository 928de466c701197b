"""Reassignment plans: the JSON file operators pass around, and the planners that write one.

Pure functions over ``{(topic, partition): replicas}``; no IO, so the CLI, the tests and
any other tool agree on what a plan means. The file format is Kafka's
(``kafka-reassign-partitions``): ``{"version": 1, "partitions": [{"topic": "t",
"partition": 0, "replicas": [2, 3, 4]}]}``. The first replica is the preferred leader.

The planners return only the partitions that change, either their set of brokers (data
is copied) or only the order (the preferred leader changes; no data moves). They keep
what they can: a replica stays on its broker unless the balance needs it elsewhere, and
a moved replica takes the place of the one it replaces in the list.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from logmq.errors import ErrorCode, LogMQError

TopicPartition = tuple[str, int]
Assignment = Mapping[TopicPartition, Sequence[int]]

PLAN_VERSION = 1
_ENTRY_KEYS = {"topic", "partition", "replicas", "log_dirs"}


class PlanError(LogMQError, ValueError):
    """A plan file that cannot be used, or a plan that cannot be made; says why."""

    code = ErrorCode.INVALID_REPLICA_ASSIGNMENT


@dataclass(frozen=True, slots=True)
class ReassignmentPlan:
    """Target replicas per partition, in (topic, partition) order."""

    partitions: dict[TopicPartition, tuple[int, ...]]

    def __post_init__(self) -> None:
        ordered = {tp: tuple(r) for tp, r in sorted(self.partitions.items())}
        object.__setattr__(self, "partitions", ordered)

    def __len__(self) -> int:
        return len(self.partitions)

    def __bool__(self) -> bool:
        return bool(self.partitions)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": PLAN_VERSION,
            "partitions": [
                {"topic": t, "partition": p, "replicas": list(r)}
                for (t, p), r in self.partitions.items()
            ],
        }

    def dumps(self) -> str:
        """The plan file's text: valid JSON, one partition per line so diffs stay readable."""
        if not self.partitions:
            return '{"version": 1, "partitions": []}\n'
        lines = [json.dumps(e, ensure_ascii=False) for e in self.to_json()["partitions"]]
        return '{"version": 1, "partitions": [\n  ' + ",\n  ".join(lines) + "\n]}\n"


def assignment_plan(current: Assignment, partitions: Iterable[TopicPartition]) -> ReassignmentPlan:
    """The current replicas of ``partitions`` as a plan: executing it rolls a move back."""
    return ReassignmentPlan({tp: tuple(current[tp]) for tp in partitions if tp in current})


# -- the file ---------------------------------------------------------------------------------


def parse_plan(text: str | bytes) -> ReassignmentPlan:
    """Parse and validate a plan file's text; PlanError names the first problem."""
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise PlanError(f"the plan is not valid JSON: {e}") from None
    return plan_from_json(doc)


def plan_from_json(doc: Any) -> ReassignmentPlan:
    if not isinstance(doc, dict):
        raise PlanError('the plan must be a JSON object: {"version": 1, "partitions": [...]}')
    version = doc.get("version")
    if type(version) is not int or version != PLAN_VERSION:
        raise PlanError(f"unsupported plan version {version!r}; expected {PLAN_VERSION}")
    entries = doc.get("partitions")
    if not isinstance(entries, list):
        raise PlanError('the plan needs a "partitions" list')
    out: dict[TopicPartition, tuple[int, ...]] = {}
    for i, entry in enumerate(entries):
        tp, replicas = _parse_entry(entry, i)
        if tp in out:
            raise PlanError(f"partition {tp[0]}-{tp[1]} appears twice in the plan")
        out[tp] = replicas
    return ReassignmentPlan(out)


def _parse_entry(entry: Any, i: int) -> tuple[TopicPartition, tuple[int, ...]]:
    where = f"partitions[{i}]"
    if not isinstance(entry, dict):
        raise PlanError(f"{where} must be an object with topic, partition and replicas")
    for key in ("topic", "partition", "replicas"):
        if key not in entry:
            raise PlanError(f'{where} has no "{key}"')
    unknown = sorted(set(entry) - _ENTRY_KEYS)
    if unknown:
        raise PlanError(f"{where} has unknown field(s) {unknown}")
    topic, partition, replicas = entry["topic"], entry["partition"], entry["replicas"]
    if not isinstance(topic, str) or not topic:
        raise PlanError(f"{where}: topic must be a non-empty string, got {topic!r}")
    if type(partition) is not int or partition < 0:
        raise PlanError(f"{where}: partition must be an integer >= 0, got {partition!r}")
    name = f"{topic}-{partition}"
    if not isinstance(replicas, list) or any(type(r) is not int or r < 0 for r in replicas):
        raise PlanError(f"{name}: replicas must be a list of broker ids, got {replicas!r}")
    if not replicas:
        raise PlanError(f"{name}: the replica set is empty")
    if len(set(replicas)) != len(replicas):
        raise PlanError(f"{name}: a broker appears twice in {replicas}")
    log_dirs = entry.get("log_dirs")
    if log_dirs is not None and (
        not isinstance(log_dirs, list)
        or len(log_dirs) != len(replicas)
        or any(d != "any" for d in log_dirs)
    ):
        raise PlanError(
            f'{name}: log_dirs must be "any" for every replica (a logmq broker has one '
            f"data directory), got {log_dirs!r}"
        )
    return (topic, partition), tuple(replicas)


# -- planners ---------------------------------------------------------------------------------


def generate(
    current: Assignment, topics: Iterable[str], brokers: Iterable[int]
) -> ReassignmentPlan:
    """A plan that spreads the replicas and preferred leaders of ``topics`` evenly over
    ``brokers``, keeping each partition's replication factor and moving as little as
    possible. Balance is counted over these topics' partitions only."""
    topics = list(dict.fromkeys(topics))
    if not topics:
        raise PlanError("give at least one topic")
    chosen = {tp: tuple(r) for tp, r in current.items() if tp[0] in set(topics)}
    missing = [t for t in topics if not any(tp[0] == t for tp in chosen)]
    if missing:
        raise PlanError(f"unknown topic(s): {', '.join(missing)}")
    return _changes(chosen, _balance(chosen, _broker_list(brokers)))


def rebalance(current: Assignment, brokers: Iterable[int]) -> ReassignmentPlan:
    """Even replica counts (max - min <= 1) and preferred-leader counts over ``brokers``
    with as few moves as possible; a balanced cluster gives an empty plan. Replicas on
    brokers outside ``brokers`` are moved onto them."""
    assignment = {tp: tuple(r) for tp, r in current.items()}
    return _changes(assignment, _balance(assignment, _broker_list(brokers)))


def decommission(current: Assignment, broker: int, live_brokers: Iterable[int]) -> ReassignmentPlan:
    """Every replica off ``broker``, each onto the least loaded live broker that does not
    hold that partition yet. Where ``broker`` was the preferred leader, the partition's
    remaining replica that leads the fewest partitions becomes the first (it already has
    the data, so leadership can move before the copy is done)."""
    remaining = [b for b in _broker_list(live_brokers, allow_empty=True) if b != broker]
    load = dict.fromkeys(remaining, 0)
    leads = dict.fromkeys(remaining, 0)
    for replicas in current.values():
        for b in replicas:
            if b in load:
                load[b] += 1
        if replicas and replicas[0] in leads:
            leads[replicas[0]] += 1
    out: dict[TopicPartition, tuple[int, ...]] = {}
    for tp, replicas in sorted(current.items()):
        if broker not in replicas:
            continue
        candidates = [b for b in remaining if b not in replicas]
        if not candidates:
            raise PlanError(
                f"{tp[0]}-{tp[1]} has {len(replicas)} replica(s) but only "
                f"{len(remaining)} live broker(s) would remain without broker {broker}"
            )
        new = min(candidates, key=lambda b: (load[b], b))
        load[new] += 1
        target = [new if b == broker else b for b in replicas]
        if replicas[0] == broker:
            kept = [b for b in target if b != new]
            first = min(kept or [new], key=lambda b: (leads[b], target.index(b)))
            target.remove(first)
            target.insert(0, first)
            leads[first] += 1
        out[tp] = tuple(target)
    return ReassignmentPlan(out)


def _broker_list(brokers: Iterable[int], *, allow_empty: bool = False) -> list[int]:
    out = list(brokers)
    if any(type(b) is not int or b < 0 for b in out):
        raise PlanError(f"broker ids must be integers >= 0, got {out}")
    if len(set(out)) != len(out):
        raise PlanError(f"a broker is listed twice in {out}")
    if not out and not allow_empty:
        raise PlanError("give at least one broker")
    return sorted(out)


def _changes(
    old: Mapping[TopicPartition, tuple[int, ...]], new: Mapping[TopicPartition, list[int]]
) -> ReassignmentPlan:
    return ReassignmentPlan({tp: tuple(r) for tp, r in new.items() if tuple(r) != old[tp]})


# -- balancing --------------------------------------------------------------------------------
#
# Replicas first, then leaders. Replica targets: R replicas over n brokers is q = R // n
# each, and R % n brokers get one more; those are the brokers holding the most already, so
# the total excess (the number of replicas that must move) is as small as it can be. A
# broker outside the allowed set has target 0. Each step moves one replica from a broker
# above its target towards one below it. From an allowed broker a direct move always exists
# (if every partition on an over-target broker also held an under-target one, the latter
# would hold at least as many replicas, impossible while targets differ by at most one);
# from a disallowed broker it may take a chain (x moves to y, y hands another partition on
# to z...), found by breadth-first search. Leaders are balanced the same way by reordering:
# a chain of "partition led by x is now led by its replica y" from a broker leading the
# most to one leading at least two fewer, until no such chain exists.


def _balance(
    assignment: Mapping[TopicPartition, tuple[int, ...]], brokers: list[int]
) -> dict[TopicPartition, list[int]]:
    n = len(brokers)
    for tp, replicas in assignment.items():
        if len(replicas) > n:
            raise PlanError(
                f"{tp[0]}-{tp[1]} has {len(replicas)} replica(s), more than the {n} broker(s) given"
            )
        if not replicas or len(set(replicas)) != len(replicas):
            raise PlanError(f"{tp[0]}-{tp[1]} has an invalid replica list {list(replicas)}")
    state = _Placement({tp: list(r) for tp, r in sorted(assignment.items())}, brokers)
    state.balance_replicas()
    state.balance_leaders()
    return state.replicas


class _Placement:
    """A mutable assignment with per-broker indexes, for the balancing steps."""

    def __init__(self, replicas: dict[TopicPartition, list[int]], brokers: list[int]) -> None:
        self.replicas = replicas
        self.allowed = set(brokers)
        self.brokers = brokers
        self.on: dict[int, set[TopicPartition]] = {b: set() for b in brokers}
        for tp, rs in replicas.items():
            for b in rs:
                self.on.setdefault(b, set()).add(tp)

    def load(self, b: int) -> int:
        return len(self.on.get(b, ()))

    # -- replicas --------------------------------------------------------------------------

    def replica_targets(self) -> dict[int, int]:
        total = sum(len(rs) for rs in self.replicas.values())
        q, extra = divmod(total, len(self.brokers))
        heaviest = sorted(self.brokers, key=lambda b: (-self.load(b), b))[:extra]
        targets = {b: q + (b in heaviest) for b in self.brokers}
        for b in self.on:
            targets.setdefault(b, 0)  # a broker outside the allowed set keeps nothing
        return targets

    def balance_replicas(self) -> None:
        targets = self.replica_targets()
        while True:
            over = [b for b in self.on if self.load(b) > targets[b]]
            if not over:
                return
            # disallowed brokers first (everything must go), then the most loaded
            source = min(over, key=lambda b: (b in self.allowed, -self.load(b), b))
            path = self._replica_path(source, targets)
            if path is None:  # cannot happen while every RF <= len(brokers); never loop
                raise PlanError(f"no valid place for the replicas of broker {source}")
            for tp, frm, to in path:
                self.move(tp, frm, to)

    def _replica_path(
        self, source: int, targets: Mapping[int, int]
    ) -> list[tuple[TopicPartition, int, int]] | None:
        """Shortest chain of moves from ``source`` to a broker below its target."""
        under = {b for b in self.brokers if self.load(b) < targets[b]}
        parent: dict[int, tuple[int, TopicPartition] | None] = {source: None}
        queue = deque([source])
        while queue:
            x = queue.popleft()
            # a replica that is not the preferred leader moves first: leaders stay put
            for tp in sorted(self.on[x], key=lambda tp: (self.replicas[tp][0] == x, tp)):
                held = self.replicas[tp]
                free = [b for b in self.brokers if b not in held and b not in parent]
                hits = [b for b in free if b in under]
                if hits:
                    end = min(hits, key=lambda b: (self.load(b) - targets[b], b))
                    parent[end] = (x, tp)
                    return self._unwind(parent, end)
                for b in free:
                    parent[b] = (x, tp)
                    queue.append(b)
        return None

    @staticmethod
    def _unwind(
        parent: Mapping[int, tuple[int, TopicPartition] | None], end: int
    ) -> list[tuple[TopicPartition, int, int]]:
        path = []
        node = end
        while (step := parent[node]) is not None:
            frm, tp = step
            path.append((tp, frm, node))
            node = frm
        path.reverse()
        return path

    def move(self, tp: TopicPartition, frm: int, to: int) -> None:
        rs = self.replicas[tp]
        rs[rs.index(frm)] = to
        self.on[frm].discard(tp)
        self.on[to].add(tp)

    # -- leaders ---------------------------------------------------------------------------

    def balance_leaders(self) -> None:
        leads: dict[int, set[TopicPartition]] = {b: set() for b in self.brokers}
        for tp, rs in self.replicas.items():
            leads[rs[0]].add(tp)
        while True:
            for source in sorted(self.brokers, key=lambda b: (-len(leads[b]), b)):
                path = self._leader_path(source, leads)
                if path:
                    break
            else:
                return
            for tp, frm, to in path:
                rs = self.replicas[tp]
                rs.remove(to)
                rs.insert(0, to)
                leads[frm].discard(tp)
                leads[to].add(tp)

    def _leader_path(
        self, source: int, leads: Mapping[int, set[TopicPartition]]
    ) -> list[tuple[TopicPartition, int, int]] | None:
        """Shortest chain of leader handovers from ``source`` to a broker leading at
        least two fewer partitions (each handover: a replica becomes the first)."""
        limit = len(leads[source]) - 2
        if limit < 0:
            return None
        parent: dict[int, tuple[int, TopicPartition] | None] = {source: None}
        queue = deque([source])
        while queue:
            x = queue.popleft()
            for tp in sorted(leads[x]):
                for b in self.replicas[tp][1:]:
                    if b in parent:
                        continue
                    parent[b] = (x, tp)
                    if len(leads[b]) <= limit:
                        return self._unwind(parent, b)
                    queue.append(b)
        return None
