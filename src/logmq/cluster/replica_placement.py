"""Where new partitions' replicas go: placed by the controller (rack-unaware,
Kafka-style), or named by the user and checked here (CreateTopics and CreatePartitions
with manual assignments share one rule)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Container, Sequence


def place_replicas(
    brokers: Sequence[int], partitions: int, replication_factor: int, start: int
) -> list[tuple[int, ...]]:
    """Rack-unaware placement: leaders round-robin from ``start``, followers shifted.

    The first replica (the preferred leader) of partition p is broker ``start + p``; the
    others follow it at a distance that grows by one every time the partitions wrap
    around the brokers, so the same pairs of brokers do not always share partitions.
    """
    n = len(brokers)
    out: list[tuple[int, ...]] = []
    shift = start
    for p in range(partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (start + p) % n
        replicas = [brokers[first]]
        for j in range(replication_factor - 1):
            replicas.append(brokers[(first + 1 + (shift + j) % (n - 1)) % n])
        out.append(tuple(replicas))
    return out


def assignment_problem(
    replicas: Sequence[int],
    registered: Container[int],
    is_active: Callable[[int], bool],
    replication_factor: int | None = None,
    factor_source: str = "the topic's replication factor is",
) -> str | None:
    """Why one partition's manual replica list cannot be used, or None.

    Kafka's checks in its order: the list is not empty, names registered brokers only,
    none twice, has ``replication_factor`` replicas when one is required (CreateTopics:
    the first list's length; CreatePartitions: the topic's), and at least one of them
    is active (a fenced broker can neither lead nor join the ISR of a new partition).
    ``factor_source`` says where the required factor comes from, for the message.
    """
    if not replicas:
        return "an empty replica list"
    ordered = sorted(replicas)
    unknown = [b for b in ordered if b not in registered]
    if unknown:
        return f"broker {unknown[0]}, which is not registered"
    twice = [b for b, nxt in itertools.pairwise(ordered) if b == nxt]
    if twice:
        return f"broker {twice[0]} more than once"
    if replication_factor is not None and len(replicas) != replication_factor:
        return (
            f"{len(replicas)} replica(s) where {factor_source} {replication_factor}: "
            "every partition of a topic needs the same replication factor"
        )
    if not any(is_active(b) for b in replicas):
        return f"only fenced brokers {list(replicas)}"
    return None
