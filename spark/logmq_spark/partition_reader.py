"""Reading one offset range inside a Spark task, as Arrow record batches.

A task owns one blocking ``Consumer`` assigned to its one partition (the consumer
fetches from the partition's leader), seeks to the range start and takes whole decoded
batches with ``poll_batches`` (the client's bulk path: no Python object per record)
until the range end. The consumer reads with the query's isolation level; under
read_committed it drops aborted transactions' records and skips transaction markers, so
a range's end is reached by the consumer's position, not by counting records. Several
logmq batches are gathered into one Arrow batch so the
cost of crossing into the JVM is paid per tens of thousands of records.

Retention may remove the start of a range between planning and reading: with
``failOnDataLoss`` (the default) that is a DataLossError naming the lost offsets,
otherwise the task skips to the log start and logs a warning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pyarrow as pa

from logmq.client.fetcher import FetchedBatch
from logmq.client.sync import Consumer
from logmq.errors import ErrorCode, LogMQError, OffsetOutOfRangeError
from logmq_spark.arrow import to_record_batch
from logmq_spark.offsets import DATA_LOSS_HINT, DataLossError, OffsetRange
from logmq_spark.options import SourceOptions

log = logging.getLogger("logmq_spark")

ARROW_BATCH_ROWS = 50_000  # gather logmq batches up to this many rows per Arrow batch
ARROW_BATCH_PARTS = 32  # ...or this many logmq batches (bounds memory for big records)
POLL_INTERVAL_S = 1.0


def _trim(b: FetchedBatch, end: int) -> FetchedBatch:
    """``b`` without its records at or after ``end`` (only a compacted batch can have a
    gap that puts them there after the consumer's record-count trim)."""
    if b.next_offset <= end:
        return b
    keep = end - b.base_offset
    b.rows = tuple(r for r in b.rows if r[0] < keep)
    b.next_offset = end
    return b


class RangeReader:
    """Iterate Arrow record batches holding exactly the records of one offset range."""

    def __init__(self, options: SourceOptions, offset_range: OffsetRange) -> None:
        self.options = options
        self.range = offset_range
        self.tp = (offset_range.topic, offset_range.partition)
        self.position = offset_range.start

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        r = self.range
        if r.size <= 0:
            return
        consumer = Consumer(
            self.options.bootstrap,
            auto_offset_reset="none",  # an out-of-range position must surface, not reset
            max_partition_fetch_bytes=self.options.max_partition_fetch_bytes,
            fetch_max_bytes=max(self.options.max_partition_fetch_bytes, 50 << 20),
            client_id="logmq-spark",
            isolation_level=self.options.isolation_level,
        )
        try:
            consumer.assign([self.tp])
            consumer.seek(r.topic, r.partition, self.position)
            yield from self._read(consumer)
        finally:
            consumer.close()

    def _read(self, consumer: Consumer) -> Iterator[pa.RecordBatch]:
        r = self.range
        pending: list[FetchedBatch] = []
        rows = 0
        last_progress = time.monotonic()
        while self.position < r.end:
            try:
                got = consumer.poll_batches(POLL_INTERVAL_S, max_records=r.end - self.position)
            except OffsetOutOfRangeError:
                if not self._skip_lost(consumer):
                    break
                last_progress = time.monotonic()
                continue
            # Markers and aborted records take offsets but return no rows: move on by
            # the consumer's position, which steps over them.
            moved = consumer.position(r.topic, r.partition)
            if moved > self.position:
                self.position = moved
                last_progress = time.monotonic()
            if not got:
                if time.monotonic() - last_progress > self.options.poll_timeout_ms / 1000:
                    if not self._stalled(consumer):
                        break
                    last_progress = time.monotonic()
                continue
            last_progress = time.monotonic()
            for b in got:
                b = _trim(b, r.end)
                if b.rows:
                    pending.append(b)
                    rows += len(b.rows)
                self.position = max(self.position, b.next_offset)
            if rows >= ARROW_BATCH_ROWS or len(pending) >= ARROW_BATCH_PARTS:
                yield to_record_batch(r.topic, r.partition, pending)
                pending, rows = [], 0
        if pending:
            yield to_record_batch(r.topic, r.partition, pending)

    def _lost(self, message: str) -> None:
        if self.options.fail_on_data_loss:
            raise DataLossError(message + DATA_LOSS_HINT)
        log.warning("%s; skipping them (failOnDataLoss=false)", message)

    def _skip_lost(self, consumer: Consumer) -> bool:
        """After OFFSET_OUT_OF_RANGE: report the loss and move on; False ends the range."""
        r = self.range
        name = f"{r.topic}-{r.partition}"
        first = consumer.beginning_offsets([self.tp])[self.tp]
        if self.position < first:
            self._lost(
                f"offsets {self.position}..{min(first, r.end) - 1} of {name} were removed "
                f"(retention) before they were read; the log now starts at {first}"
            )
            self.position = first
            if self.position >= r.end:
                return False
            consumer.seek(r.topic, r.partition, self.position)
            return True
        last = consumer.end_offsets([self.tp])[self.tp]
        self._lost(
            f"offsets {self.position}..{r.end - 1} of {name} no longer exist: the log ends "
            f"at {last} (truncated, or the topic was recreated)"
        )
        return False

    def _stalled(self, consumer: Consumer) -> bool:
        """No records for pollTimeoutMs: data loss if the log ends before the range does."""
        r = self.range
        last = consumer.end_offsets([self.tp])[self.tp]
        if last < r.end:
            self._lost(
                f"offsets {max(self.position, last)}..{r.end - 1} of {r.topic}-{r.partition} "
                f"no longer exist: the log ends at {last}"
            )
            return False
        raise LogMQError(
            f"no records from {r.topic}-{r.partition} at offset {self.position} for "
            f"{self.options.poll_timeout_ms} ms (option pollTimeoutMs) although the log "
            f"ends at {last}",
            ErrorCode.REQUEST_TIMED_OUT,
        )
