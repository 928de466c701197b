"""Offsets, offset ranges and how a micro-batch is cut into Spark tasks (pure functions).

Spark stores a source's offsets in its checkpoint as JSON; ours is Kafka's shape,
``{"topic": {"partition": next_offset}}``, with partitions as string keys (JSON keys
are strings) and both levels sorted, so the same offsets always give the same JSON and
Spark's "did the offset move?" comparison is exact. In between, offsets are plain
``{(topic, partition): offset}`` dicts.

Nothing here talks to a broker: the driver gathers log start/end offsets, then these
functions decide the ranges, which keeps the decisions testable on their own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise

from pyspark.sql.datasource import InputPartition

from logmq.errors import OffsetOutOfRangeError

TP = tuple[str, int]
Offsets = dict[TP, int]

DATA_LOSS_HINT = (
    " Some records were never read. If this is expected (retention removed them, or the "
    "topic was deleted), set the option failOnDataLoss to false to skip them."
)


class DataLossError(OffsetOutOfRangeError):
    """Records the query should have read are gone (retention, truncation, deletion)."""


def to_json(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    """Offsets as checkpoint JSON, with a stable key order."""
    out: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(offsets):
        out.setdefault(topic, {})[str(partition)] = int(offsets[(topic, partition)])
    return out


def from_json(data: Mapping[str, Mapping[str, int]] | None) -> Offsets:
    """Checkpoint JSON (or an engine-provided dict) back to ``{(topic, partition): offset}``."""
    out: Offsets = {}
    for topic, parts in (data or {}).items():
        for partition, offset in parts.items():
            out[(str(topic), int(partition))] = int(offset)
    return out


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Records ``[start, end)`` of one logmq partition: what one Spark task reads."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


class RangePartition(InputPartition):
    """The pickled unit of work a Spark task receives: one offset range."""

    def __init__(self, offset_range: OffsetRange) -> None:
        super().__init__(offset_range)
        self.range = offset_range


def rate_limit(start: Mapping[TP, int], latest: Mapping[TP, int], max_records: int) -> Offsets:
    """End offsets at most ``max_records`` past ``start`` in total, spread over partitions.

    Each partition gets a share proportional to what it has available; the rounding
    remainder goes to the partitions with the largest fractional shares, so the sum is
    exactly ``min(max_records, available)`` and a backlog of one record still moves.
    Partitions missing from ``start`` are new: they start at 0.
    """
    avail = {tp: max(0, end - start.get(tp, 0)) for tp, end in latest.items()}
    total = sum(avail.values())
    if total <= max_records:
        return dict(latest)
    grant: dict[TP, int] = {}
    fractions: list[tuple[float, TP]] = []
    for tp, n in avail.items():
        share = max_records * n / total
        grant[tp] = min(n, math.floor(share))
        fractions.append((share - grant[tp], tp))
    left = max_records - sum(grant.values())
    for _, tp in sorted(fractions, key=lambda f: (-f[0], f[1])):
        if left <= 0:
            break
        if grant[tp] < avail[tp]:
            grant[tp] += 1
            left -= 1
    out: Offsets = {}
    for tp, end in latest.items():
        begin = start.get(tp, 0)
        out[tp] = begin + grant[tp] if end > begin else end
    return out


def cap(latest: Mapping[TP, int], target: Mapping[TP, int]) -> Offsets:
    """``latest`` limited to the partitions and offsets of ``target`` (Trigger.AvailableNow)."""
    return {tp: min(end, target[tp]) for tp, end in latest.items() if tp in target}


def available(start: Mapping[TP, int], end: Mapping[TP, int]) -> int:
    return sum(max(0, e - start.get(tp, 0)) for tp, e in end.items())


@dataclass(slots=True)
class RangePlan:
    """The ranges of a micro-batch, and what was lost on the way (for failOnDataLoss)."""

    ranges: list[OffsetRange]
    losses: list[str]


def plan_ranges(start: Mapping[TP, int], end: Mapping[TP, int]) -> RangePlan:
    """One range per partition of ``end``; partitions new since ``start`` begin at 0.

    Losses: a partition in ``start`` but gone from ``end`` (its topic was deleted), and
    an end below the start (the log was truncated or recreated smaller).
    """
    ranges: list[OffsetRange] = []
    losses: list[str] = []
    for tp in sorted(set(start) - set(end)):
        losses.append(f"{tp[0]}-{tp[1]} is gone (deleted topic?) at offset {start[tp]}")
    for tp in sorted(end):
        begin = start.get(tp, 0)
        finish = end[tp]
        if finish < begin:
            losses.append(
                f"{tp[0]}-{tp[1]} went back from offset {begin} to {finish} "
                "(the log was truncated or the topic recreated)"
            )
            continue
        if finish > begin:
            ranges.append(OffsetRange(tp[0], tp[1], begin, finish))
    return RangePlan(ranges, losses)


def split_ranges(
    ranges: Iterable[OffsetRange],
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
) -> list[OffsetRange]:
    """Cut large ranges so Spark gets at least ``min_partitions`` tasks (as Kafka's source).

    A range is cut into pieces of at most ``max_records_per_partition`` records; then,
    while fewer than ``min_partitions`` pieces exist, each range gets a number of pieces
    proportional to its size (at least one), cut evenly.
    """
    out = [r for r in ranges if r.size > 0]
    if max_records_per_partition:
        out = [
            piece for r in out for piece in _cut(r, math.ceil(r.size / max_records_per_partition))
        ]
    if min_partitions and len(out) < min_partitions:
        total = sum(r.size for r in out)
        if total > 0:
            out = [
                piece
                for r in out
                for piece in _cut(r, max(1, round(r.size * min_partitions / total)))
            ]
    return out


def _cut(r: OffsetRange, pieces: int) -> list[OffsetRange]:
    pieces = max(1, min(pieces, r.size))
    bounds = [r.start + r.size * k // pieces for k in range(pieces + 1)]
    return [OffsetRange(r.topic, r.partition, a, b) for a, b in pairwise(bounds)]
