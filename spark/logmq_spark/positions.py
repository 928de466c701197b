"""Turning ``startingOffsets`` / ``startingTimestamp`` / ``endingOffsets`` into offsets.

Resolved once, on the driver, against the partitions that exist at that moment: a
streaming query writes the result to its checkpoint as its initial offsets, a batch
read plans its ranges from it. As in Spark's Kafka source, per-partition JSON must
name every partition of the subscribed topics, and nothing else, so a typo cannot
silently read from the wrong place.
"""

from __future__ import annotations

from collections.abc import Mapping

from logmq.errors import ErrorCode, LogMQError
from logmq_spark.cluster_view import ClusterView, LogBounds
from logmq_spark.offsets import TP, Offsets
from logmq_spark.options import EARLIEST, LATEST, OffsetSpec, OptionError


def resolve(
    spec: OffsetSpec,
    option: str,
    bounds: Mapping[TP, LogBounds],
    view: ClusterView,
    timestamp_strategy: str = "error",
) -> Offsets:
    """Concrete offsets for every partition in ``bounds``."""
    if spec.kind == "earliest":
        return {tp: b.start for tp, b in bounds.items()}
    if spec.kind == "latest":
        return {tp: b.end for tp, b in bounds.items()}
    if spec.kind == "timestamp":
        assert spec.timestamp_ms is not None
        found = view.offsets_for_time(sorted(bounds), spec.timestamp_ms)
        out: Offsets = {}
        for tp, b in bounds.items():
            offset = found.get(tp)
            if offset is None:
                if timestamp_strategy != "latest":
                    raise LogMQError(
                        f"{tp[0]}-{tp[1]} has no record at or after startingTimestamp "
                        f"{spec.timestamp_ms}; set startingOffsetsByTimestampStrategy=latest "
                        "to start such partitions at their end",
                        ErrorCode.OFFSET_OUT_OF_RANGE,
                    )
                offset = b.end
            out[tp] = offset
        return out
    given = spec.specific()
    unknown = sorted(set(given) - set(bounds))
    if unknown:
        names = ", ".join(f"{t}-{p}" for t, p in unknown)
        raise OptionError(f"option {option!r} names partitions that do not exist: {names}")
    missing = sorted(set(bounds) - set(given))
    if missing:
        names = ", ".join(f"{t}-{p}" for t, p in missing)
        raise OptionError(
            f"option {option!r} must give an offset for every partition; missing: {names} "
            "(use -2 for earliest, -1 for latest)"
        )
    out = {}
    for tp, b in bounds.items():
        offset = given[tp]
        out[tp] = b.start if offset == EARLIEST else b.end if offset == LATEST else offset
    return out


def check_batch_range(start: Offsets, end: Offsets, bounds: Mapping[TP, LogBounds]) -> None:
    """A batch read must end within the log and not before it starts."""
    for tp in sorted(end):
        name = f"{tp[0]}-{tp[1]}"
        if end[tp] > bounds[tp].end:
            where = "the end of its log"
            if bounds[tp].high_watermark is not None:  # read_committed
                where = "the end of its log for read_committed (the last stable offset)"
            raise OptionError(
                f"endingOffsets {end[tp]} of {name} is beyond {where} ({bounds[tp].end})"
            )
        if start[tp] > end[tp]:
            raise OptionError(
                f"starting offset {start[tp]} of {name} is after its ending offset {end[tp]}"
            )
