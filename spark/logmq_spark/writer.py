"""The logmq sink: ``df.write.format("logmq")`` and ``df.writeStream.format("logmq")``.

Rows come in as Arrow record batches (Spark's Arrow writer API) with the columns of
Spark's Kafka sink: ``value`` (binary or string, required), and optionally ``key``
(binary or string), ``topic`` (string; the ``topic`` option wins over it),
``partition`` (int) and ``headers`` (array<struct<key: string, value: binary>>); other
columns are ignored. Each task writes through its own idempotent blocking Producer
with acks=all, and returns its commit message only once every record is acknowledged.

Delivery is at-least-once. The idempotent producer removes duplicates of its own
retries, but Spark retries a failed task (or re-runs a micro-batch after a crash) with
a new producer, and records an earlier attempt already wrote stay in the log: there is
nothing to roll back, so ``abort`` can only log. Consumers that need exactly-once
results deduplicate, for example by key.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from logmq.client.sync import Admin, Producer
from logmq.errors import ErrorCode, LogMQError, UnknownTopicOrPartitionError
from logmq_spark.options import OptionError, SinkOptions

log = logging.getLogger("logmq_spark")

MAX_OUTSTANDING = 4  # Arrow batches sent but not yet acknowledged, per task
_BYTES = (BinaryType, StringType)


@dataclass(frozen=True, slots=True)
class SinkColumns:
    """Which of the sink's columns the written DataFrame has."""

    key: bool
    topic: bool
    partition: bool
    headers: bool


def _is(dtype: DataType, kinds: tuple[type, ...]) -> bool:
    return isinstance(dtype, kinds)


def sink_columns(schema: StructType, options: SinkOptions) -> SinkColumns:
    """Check the DataFrame's columns against the sink's (on the driver, before any task)."""
    fields = {f.name: f.dataType for f in schema.fields}
    if "value" not in fields:
        raise OptionError("the logmq sink needs a 'value' column (binary or string)")
    if not _is(fields["value"], _BYTES):
        raise OptionError(f"column 'value' must be binary or string, not {fields['value']}")
    if "key" in fields and not _is(fields["key"], _BYTES):
        raise OptionError(f"column 'key' must be binary or string, not {fields['key']}")
    if "topic" in fields and not _is(fields["topic"], (StringType,)):
        raise OptionError(f"column 'topic' must be a string, not {fields['topic']}")
    if options.topic is None and "topic" not in fields:
        raise OptionError("the logmq sink needs the option 'topic' or a 'topic' column")
    if "partition" in fields and not _is(
        fields["partition"], (IntegerType, LongType, ShortType, ByteType)
    ):
        raise OptionError(f"column 'partition' must be an integer, not {fields['partition']}")
    if "headers" in fields:
        h = fields["headers"]
        ok = isinstance(h, ArrayType) and isinstance(h.elementType, StructType)
        if ok:
            inner = {f.name: f.dataType for f in h.elementType.fields}
            ok = (
                set(inner) == {"key", "value"}
                and isinstance(inner["key"], StringType)
                and _is(inner["value"], _BYTES)
            )
        if not ok:
            raise OptionError(
                "column 'headers' must be array<struct<key: string, value: binary>>, "
                f"not {h.simpleString()}"
            )
    return SinkColumns(
        key="key" in fields,
        topic="topic" in fields and options.topic is None,
        partition="partition" in fields,
        headers="headers" in fields,
    )


def check_topic(options: SinkOptions) -> None:
    """Fail the write at once, on the driver, when the ``topic`` option names no topic
    (the producer would otherwise wait max_block_ms in every task before failing)."""
    if options.topic is None:
        return
    with Admin(options.bootstrap) as admin:
        if options.topic not in admin.list_topics(internal=True):
            raise UnknownTopicOrPartitionError(
                f"topic {options.topic!r} does not exist: create it first "
                f"(logmq topic create {options.topic} --partitions N)"
            )


@dataclass(slots=True)
class LogMQCommitMessage(WriterCommitMessage):
    records: int


def _as_bytes(column: pa.Array | pa.ChunkedArray) -> list[bytes | None]:
    """A binary or string column as a list of bytes (strings are cast, not re-encoded)."""
    if pa.types.is_string(column.type):
        column = column.cast(pa.binary())
    elif pa.types.is_large_string(column.type):
        column = column.cast(pa.large_binary())
    return column.to_pylist()


def _has_any(column: pa.Array | pa.ChunkedArray) -> bool:
    return column.null_count < len(column)


class _TaskWriter:
    """One task's writes: Arrow batches in, acknowledged records out."""

    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self.options = options
        self.columns = columns
        self.producer = Producer(
            options.bootstrap,
            acks=options.acks,
            compression=options.compression,
            enable_idempotence=True,
            client_id="logmq-spark-sink",
            **options.producer,
        )
        self._outstanding: collections.deque[Any] = collections.deque()
        self.records = 0

    def write_all(self, batches: Iterator[pa.RecordBatch]) -> int:
        try:
            for batch in batches:
                if batch.num_rows:
                    self._write(batch)
                    self._settle(MAX_OUTSTANDING)
            self.producer.flush()
            self._settle(0)
        finally:
            self.producer.close()
        return self.records

    def _settle(self, keep: int) -> None:
        """Wait for the oldest sends until at most ``keep`` remain; raise their errors."""
        while len(self._outstanding) > keep:
            pending = self._outstanding.popleft()
            if isinstance(pending, list):
                for fut in pending:
                    fut.result()
            else:
                pending.result()

    def _write(self, batch: pa.RecordBatch) -> None:
        c = self.columns
        values = _as_bytes(batch.column("value"))
        keys = _as_bytes(batch.column("key")) if c.key else None
        topics = batch.column("topic").to_pylist() if c.topic else None
        partitions = None
        if c.partition and _has_any(batch.column("partition")):
            partitions = batch.column("partition").to_pylist()
        headers = None
        if c.headers and _has_any(batch.column("headers")):
            headers = batch.column("headers").to_pylist()
        single_topic = self.options.topic
        if topics is not None:
            distinct = set(topics)
            if len(distinct) == 1 and None not in distinct:
                single_topic, topics = distinct.pop(), None
        if topics is None and partitions is None and headers is None:
            assert single_topic is not None
            # The bulk path: whole batches encoded at once, no future per record.
            self._outstanding.append(self.producer.send_batch(single_topic, values, keys))
        else:
            self._outstanding.append(
                self._send_each(single_topic, values, keys, topics, partitions, headers)
            )
        self.records += len(values)

    def _send_each(
        self,
        default_topic: str | None,
        values: list[bytes | None],
        keys: list[bytes | None] | None,
        topics: list[str | None] | None,
        partitions: list[int | None] | None,
        headers: list[Any] | None,
    ) -> list[concurrent.futures.Future]:
        send = self.producer.send
        futures = []
        for i, value in enumerate(values):
            topic = topics[i] if topics is not None and topics[i] is not None else default_topic
            if topic is None:
                raise LogMQError(
                    "a row has a null 'topic' and the sink has no 'topic' option",
                    ErrorCode.INVALID_REQUEST,
                )
            h = headers[i] if headers is not None else None
            futures.append(
                send(
                    topic,
                    value,
                    keys[i] if keys is not None else None,
                    partitions[i] if partitions is not None else None,
                    [(e["key"], e["value"]) for e in h] if h else None,
                )
            )
        return futures


def _total(messages: Sequence[WriterCommitMessage | None]) -> int:
    return sum(m.records for m in messages if isinstance(m, LogMQCommitMessage))


class LogMQBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LogMQCommitMessage:
        return LogMQCommitMessage(_TaskWriter(self.options, self.columns).write_all(iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("wrote %d records to logmq", _total(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning(
            "logmq write failed; %d records written by tasks that finished stay in the log "
            "(at-least-once: nothing can be rolled back)",
            _total(messages),
        )


class LogMQStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LogMQCommitMessage:
        return LogMQCommitMessage(_TaskWriter(self.options, self.columns).write_all(iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("micro-batch %d: wrote %d records to logmq", batchId, _total(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "micro-batch %d failed; %d records written by tasks that finished stay in the "
            "log and will be written again when the batch is retried (at-least-once)",
            batchId,
            _total(messages),
        )
