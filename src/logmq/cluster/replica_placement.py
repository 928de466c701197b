"""Where new partitions' replicas go (rack-unaware, Kafka-style)."""

from __future__ import annotations

from collections.abc import Sequence


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
