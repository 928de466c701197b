"""``spark.readStream.format("logmq")``: micro-batches of offset ranges.

The driver side lives in one long-lived Python process per query: Spark calls
``initialOffset`` once for a new query (the result goes to the checkpoint), then per
trigger ``latestOffset(start, limit)`` to pick the batch's end, ``partitions(start,
end)`` to cut it into tasks and, once the batch is done, ``commit(end)``. Tasks get a
pickled copy of this reader (without its admin client) and call ``read``.

End offsets are the partitions' high watermarks (read_uncommitted) or last stable offsets
(read_committed, the default), so a batch never waits for records;
``latestOffset`` honours the engine's read limit (``maxRecordsPerTrigger`` becomes
``ReadMaxRows``) and, under ``Trigger.AvailableNow``, the target offsets recorded when
the trigger started. Topics and partitions that appear later are picked up by the next
``latestOffset`` and read from offset 0.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from logmq.client.sync import Admin
from logmq_spark.cluster_view import ClusterView, LogBounds
from logmq_spark.offsets import (
    DATA_LOSS_HINT,
    TP,
    DataLossError,
    Offsets,
    RangePartition,
    available,
    cap,
    from_json,
    plan_ranges,
    rate_limit,
    split_ranges,
    to_json,
)
from logmq_spark.options import OptionError, SourceOptions
from logmq_spark.partition_reader import RangeReader
from logmq_spark.positions import resolve

log = logging.getLogger("logmq_spark")


def hold_back(begin: Offsets, bounds: dict[TP, LogBounds]) -> Offsets:
    """Each partition's end for the next batch: its readable end, except that a start
    already past the LSO but not past the high watermark (a checkpoint written while the
    query read uncommitted) waits there instead of looking like a truncated log."""
    out: Offsets = {}
    for tp, b in bounds.items():
        start = begin.get(tp)
        hw = b.high_watermark
        if start is not None and hw is not None and b.end < start <= hw:
            out[tp] = start
        else:
            out[tp] = b.end
    return out


class LogMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        if options.group_id is not None and not hasattr(Admin, "commit_group_offsets"):
            raise OptionError(
                "option 'groupId' needs Admin.commit_group_offsets (consumer groups), which "
                "this logmq client does not have yet; drop the option or upgrade logmq"
            )
        self.options = options
        self._view: ClusterView | None = None
        self._target: Offsets | None = None  # Trigger.AvailableNow: never read past these
        self._latest: Offsets | None = None  # log ends seen by the last latestOffset
        self._group_committed: Offsets | None = None  # last offsets committed to groupId

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_view"] = None  # a live client never travels into a task
        return state

    def _new_view(self) -> ClusterView:
        return ClusterView(self.options.bootstrap, read_committed=self.options.read_committed)

    def _bounds(self) -> dict[TP, LogBounds]:
        if self._view is None:
            self._view = self._new_view()
        return self._view.bounds(self.options.subscription, must_exist=False)

    # -- offsets ------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        o = self.options
        bounds = self._bounds()
        assert self._view is not None
        start = resolve(o.starting, "startingOffsets", bounds, self._view, o.timestamp_strategy)
        log.info("new query on %s starts at %s", o.subscription.describe(), start)
        return to_json(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_records_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {tp: b.end for tp, b in self._bounds().items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_json(start)
        # Spark asks for the next batch's end only once the batch ending at ``start`` is
        # processed and in its commit log: a safe point to commit. Spark calls commit()
        # for a batch only when it builds the next one, so the query's final position
        # (the end of an availableNow run, say) is committed here.
        self._commit_group(begin)
        latest = hold_back(begin, self._bounds())
        self._latest = latest
        if self._target is not None:
            latest = cap(latest, self._target)
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(begin, latest, limit.max_rows)
        elif isinstance(limit, ReadMinRows) and available(begin, latest) < limit.min_rows:
            return start
        else:
            end = latest
        return to_json(end)

    def reportLatestOffset(self) -> dict | None:
        return to_json(self._latest) if self._latest is not None else None

    # -- planning and reading ----------------------------------------------------------
    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        o = self.options
        plan = plan_ranges(from_json(start), from_json(end))
        if plan.losses:
            message = "; ".join(plan.losses)
            if o.fail_on_data_loss:
                raise DataLossError(message + "." + DATA_LOSS_HINT)
            log.warning("%s; skipping (failOnDataLoss=false)", message)
        ranges = split_ranges(plan.ranges, o.min_partitions, o.max_records_per_partition)
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return iter(RangeReader(self.options, partition.range))

    # -- progress -----------------------------------------------------------------------
    def commit(self, end: dict) -> None:
        """Spark finished every record below ``end``: mirror that into the consumer group."""
        self._commit_group(from_json(end))

    def _commit_group(self, offsets: Offsets) -> None:
        group = self.options.group_id
        if group is None or not offsets or offsets == self._group_committed:
            return
        if self._view is None:
            self._view = self._new_view()
        if self._view.commit_group_offsets(group, offsets):
            self._group_committed = offsets

    def stop(self) -> None:
        view, self._view = self._view, None
        if view is not None:
            view.close()
