"""Partition assignors: who in a consumer group reads which partition.

The coordinator computes assignments on the broker (KIP-848 style), so an assignor is a
pure function of the group's members, the partition counts of their topics and the
previous assignment. Every input is sorted before use, so the same inputs always give
the same answer on every broker -- a new coordinator after failover agrees with the old.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Set
from typing import Protocol

TopicPartition = tuple[str, int]
Assignment = dict[str, set[TopicPartition]]


class Assignor(Protocol):
    """The one interface every assignor implements."""

    name: str

    def assign(
        self,
        members: Mapping[str, Set[str]],
        partitions: Mapping[str, int],
        current: Mapping[str, Set[TopicPartition]],
    ) -> Assignment:
        """Map every member id to the partitions it should own.

        ``members`` maps member id -> subscribed topic names; ``partitions`` maps topic ->
        partition count (topics missing from it are not assignable yet); ``current`` is
        the previous assignment (assignors that are not sticky ignore it). Every member
        appears in the result, possibly with an empty set; every partition of a topic
        somebody subscribes to is owned by exactly one subscriber.
        """
        ...


def _subscribers(
    members: Mapping[str, Set[str]], partitions: Mapping[str, int]
) -> dict[str, list[str]]:
    """Topic -> sorted ids of the members subscribed to it (known topics only)."""
    by_topic: dict[str, list[str]] = {}
    for member_id in sorted(members):
        for topic in members[member_id]:
            if partitions.get(topic, 0) > 0:
                by_topic.setdefault(topic, []).append(member_id)
    return {topic: by_topic[topic] for topic in sorted(by_topic)}


class RangeAssignor:
    """Per topic, contiguous ranges of partitions in member-id order.

    Members with the same index across co-partitioned topics get the same partition
    numbers, which is what joins on keys need. Ignores the previous assignment.
    """

    name = "range"

    def assign(
        self,
        members: Mapping[str, Set[str]],
        partitions: Mapping[str, int],
        current: Mapping[str, Set[TopicPartition]],
    ) -> Assignment:
        result: Assignment = {member_id: set() for member_id in members}
        for topic, subscribers in _subscribers(members, partitions).items():
            count = partitions[topic]
            per_member, extra = divmod(count, len(subscribers))
            start = 0
            for index, member_id in enumerate(subscribers):
                size = per_member + (1 if index < extra else 0)
                result[member_id].update((topic, p) for p in range(start, start + size))
                start += size
        return result


class RoundRobinAssignor:
    """Deal partitions (sorted by topic, partition) one at a time around the members.

    A partition goes to the next member in the circle that subscribes to its topic, so
    members with identical subscriptions end up within one partition of each other.
    Ignores the previous assignment.
    """

    name = "roundrobin"

    def assign(
        self,
        members: Mapping[str, Set[str]],
        partitions: Mapping[str, int],
        current: Mapping[str, Set[TopicPartition]],
    ) -> Assignment:
        result: Assignment = {member_id: set() for member_id in members}
        circle = sorted(members)
        position = 0
        for topic in _subscribers(members, partitions):
            for partition in range(partitions[topic]):
                while topic not in members[circle[position % len(circle)]]:
                    position += 1
                result[circle[position % len(circle)]].add((topic, partition))
                position += 1
        return result


class StickyAssignor:
    """Balanced assignment that moves as few partitions as possible (the default).

    1. Keep every still-valid partition of the previous assignment with its owner
       (a partition claimed twice stays with the first owner in id order).
    2. Hand the partitions nobody kept to the least-loaded subscriber, most constrained
       partitions (fewest possible owners) first.
    3. While some partition can move from a member to an eligible member holding at
       least two fewer, move it. Each move strictly lowers the sum of squared loads, so
       this ends; when it ends, any two members with identical subscriptions differ by
       at most one partition, and only partitions that had to move did.

    Adding a member to a balanced group of N moves at most ceil(P / (N + 1)) partitions
    (exactly the ones the newcomer receives); removing a member moves only its own.
    """

    name = "sticky"

    def assign(
        self,
        members: Mapping[str, Set[str]],
        partitions: Mapping[str, int],
        current: Mapping[str, Set[TopicPartition]],
    ) -> Assignment:
        result: Assignment = {member_id: set() for member_id in members}
        eligible = _subscribers(members, partitions)
        kept: set[TopicPartition] = set()
        for member_id in sorted(members):
            subscribed = members[member_id]
            for tp in sorted(current.get(member_id, ())):
                topic, partition = tp
                if (
                    topic in subscribed
                    and 0 <= partition < partitions.get(topic, 0)
                    and tp not in kept
                ):
                    result[member_id].add(tp)
                    kept.add(tp)

        unowned: dict[str, list[int]] = {}
        for topic in eligible:
            free = [p for p in range(partitions[topic]) if (topic, p) not in kept]
            if free:
                unowned[topic] = free
        # Most constrained topics first; within a topic a heap of (load, member).
        for topic in sorted(unowned, key=lambda t: (len(eligible[t]), t)):
            heap = [(len(result[m]), m) for m in eligible[topic]]
            heapq.heapify(heap)
            for partition in unowned[topic]:
                load, owner = heapq.heappop(heap)
                result[owner].add((topic, partition))
                heapq.heappush(heap, (load + 1, owner))

        self._balance(result, members)
        return result

    @staticmethod
    def _balance(result: Assignment, members: Mapping[str, Set[str]]) -> None:
        """Move partitions from loaded to light members while that narrows the gap."""
        while True:
            takers = sorted(result, key=lambda m: (len(result[m]), m))
            donors = takers[::-1]
            move = None
            for taker in takers:
                taker_load = len(result[taker])
                for donor in donors:
                    if len(result[donor]) < taker_load + 2:
                        break
                    movable = [tp for tp in result[donor] if tp[0] in members[taker]]
                    if movable:
                        move = (donor, taker, min(movable))
                        break
                if move or len(result[donors[0]]) < taker_load + 2:
                    break
            if move is None:
                return
            donor, taker, tp = move
            result[donor].remove(tp)
            result[taker].add(tp)


ASSIGNORS: dict[str, type[RangeAssignor | RoundRobinAssignor | StickyAssignor]] = {
    cls.name: cls for cls in (RangeAssignor, RoundRobinAssignor, StickyAssignor)
}


def assignor_by_name(name: str) -> Assignor:
    """Build the assignor a group config names ("range", "roundrobin", "sticky")."""
    try:
        return ASSIGNORS[name]()
    except KeyError:
        raise ValueError(f"unknown assignor {name!r}; choose one of {sorted(ASSIGNORS)}")
