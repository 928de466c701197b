"""Partition reassignment for the admin client: request bodies and answers, no I/O.

AsyncAdmin sends these: moves, the throttle and leader elections to the controller,
listings to the controller (its metadata is the newest), DescribeLogDirs to the one
broker whose copies are asked about. Wire schemas are in docs/protocol.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from logmq.client.cluster import TopicPartition
from logmq.errors import ErrorCode, ReassignmentError


@dataclass(slots=True, frozen=True)
class PartitionReassignment:
    """A partition on the move: ``replicas`` is the original set plus ``adding_replicas``."""

    topic: str
    partition: int
    replicas: list[int]
    isr: list[int]
    leader: int
    adding_replicas: list[int]
    removing_replicas: list[int]
    target_replicas: list[int]


@dataclass(slots=True, frozen=True)
class ReassignmentListing:
    throttle_bytes_per_sec: int | None  # per broker and direction; None: unthrottled
    partitions: dict[TopicPartition, PartitionReassignment]


@dataclass(slots=True, frozen=True)
class LogDirPartition:
    """One broker's copy of a partition, as that broker has it on disk."""

    topic: str
    partition: int
    size: int  # bytes of its segment files
    log_start_offset: int
    log_end_offset: int


def _code(value: Any) -> ErrorCode:
    try:
        return ErrorCode(value)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR


def _key(tp: Any) -> TopicPartition:
    topic, partition = tp
    return (str(topic), int(partition))


def partitions_filter(partitions: Iterable[TopicPartition] | None) -> list[dict] | None:
    if partitions is None:
        return None
    return [{"topic": t, "partition": p} for t, p in map(_key, partitions)]


def alter_body(
    moves: Mapping[TopicPartition, Sequence[int] | None], throttle: int | None
) -> dict[str, Any]:
    return {
        "partitions": [
            {
                "topic": t,
                "partition": p,
                "replicas": None if replicas is None else [int(r) for r in replicas],
            }
            for (t, p), replicas in ((_key(tp), r) for tp, r in moves.items())
        ],
        "throttle_bytes_per_sec": None if throttle is None else int(throttle),
    }


def check_alter_response(body: Mapping[str, Any]) -> None:
    """Raise ReassignmentError naming every refused partition; nothing was started then."""
    failing: dict[TopicPartition, tuple[ErrorCode, str]] = {}
    for e in body.get("partitions") or ():
        code = _code(e.get("error", 0))
        if code is not ErrorCode.NONE:
            key = (e.get("topic"), e.get("partition"))
            failing[key] = (code, e.get("message") or f"{key[0]}-{key[1]}: {code.name}")
    code = _code(body.get("error", 0))
    if code is ErrorCode.NONE and not failing:
        return
    if code is ErrorCode.NONE:  # a partition refused but no overall code: take the first
        code = next(iter(failing.values()))[0]
    reasons = [f"{c.name}: {m}" for c, m in failing.values()]
    if not reasons:
        reasons = [body.get("message") or code.name]
    raise ReassignmentError("nothing was moved: " + "; ".join(reasons), code, failing)


def parse_listing(body: Mapping[str, Any]) -> ReassignmentListing:
    parts = {}
    for e in body.get("partitions") or ():
        r = PartitionReassignment(
            e["topic"],
            e["partition"],
            list(e.get("replicas") or ()),
            list(e.get("isr") or ()),
            e.get("leader", -1),
            list(e.get("adding_replicas") or ()),
            list(e.get("removing_replicas") or ()),
            list(e.get("target_replicas") or ()),
        )
        parts[(r.topic, r.partition)] = r
    return ReassignmentListing(body.get("throttle_bytes_per_sec"), parts)


def parse_log_dirs(body: Mapping[str, Any]) -> dict[TopicPartition, LogDirPartition]:
    out = {}
    for e in body.get("partitions") or ():
        d = LogDirPartition(
            e["topic"], e["partition"], e["size"], e["log_start_offset"], e["log_end_offset"]
        )
        out[(d.topic, d.partition)] = d
    return out


def parse_elections(body: Mapping[str, Any]) -> dict[TopicPartition, tuple[ErrorCode, str]]:
    return {
        (e["topic"], e["partition"]): (_code(e.get("error", 0)), e.get("message") or "")
        for e in body.get("partitions") or ()
    }
