"""``spark.read.format("logmq")``: a bounded read between startingOffsets and endingOffsets.

Spark creates the reader and calls ``partitions()`` in a planning process on the
driver, then pickles the reader into every task, where ``read()`` runs. So the
partition list is decided once, from offsets resolved at planning time, and the reader
carries nothing but its parsed options into the tasks. With read_committed (the default)
``latest`` is the last stable offset, and an ``endingOffsets`` past it is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from logmq_spark.cluster_view import ClusterView
from logmq_spark.offsets import (
    DATA_LOSS_HINT,
    DataLossError,
    RangePartition,
    plan_ranges,
    split_ranges,
)
from logmq_spark.options import SourceOptions
from logmq_spark.partition_reader import RangeReader
from logmq_spark.positions import check_batch_range, resolve

log = logging.getLogger("logmq_spark")


class LogMQBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        o = self.options
        view = ClusterView(o.bootstrap, read_committed=o.read_committed)
        try:
            bounds = view.bounds(o.subscription, must_exist=True)
            start = resolve(o.starting, "startingOffsets", bounds, view, o.timestamp_strategy)
            end = resolve(o.ending, "endingOffsets", bounds, view)
        finally:
            view.close()
        check_batch_range(start, end, bounds)
        lost = sorted(tp for tp in start if start[tp] < bounds[tp].start)
        if lost:
            message = "; ".join(
                f"offsets {start[tp]}..{bounds[tp].start - 1} of {tp[0]}-{tp[1]} were removed"
                for tp in lost
            )
            if o.fail_on_data_loss:
                raise DataLossError(message + "." + DATA_LOSS_HINT)
            log.warning("%s; skipping them (failOnDataLoss=false)", message)
            start.update({tp: bounds[tp].start for tp in lost})
            start.update({tp: min(start[tp], end[tp]) for tp in lost})
        plan = plan_ranges(start, end)
        ranges = split_ranges(plan.ranges, o.min_partitions, o.max_records_per_partition)
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            return iter(())  # Spark's placeholder when there is nothing to read
        return iter(RangeReader(self.options, partition.range))
