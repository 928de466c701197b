"""The logmq sink: ``df.write.format("logmq")`` and ``df.writeStream.format("logmq")``.

Rows come in as Arrow record batches (Spark's Arrow writer API) with the columns of
Spark's Kafka sink: ``value`` (binary or string, required), and optionally ``key``
(binary or string), ``topic`` (string; the ``topic`` option wins over it),
``partition`` (int) and ``headers`` (array<struct<key: string, value: binary>>); other
columns are ignored. Each task writes through its own idempotent blocking Producer
with acks=all, and returns its commit message only once every record is acknowledged.

By default delivery is at-least-once: Spark retries a failed task (or re-runs a
micro-batch after a crash) with a new producer, and what an earlier attempt wrote stays.

With ``exactlyOnce`` each task writes inside one transaction and never ends it: the
task prepares (flushes) and hands the driver its transactional id, producer id and
epoch; the driver's ``commit`` ends every task's transaction with commit, its ``abort``
with abort. Nothing a task writes is visible to read_committed readers before the
driver decides, so a failed attempt's records never show. The transactional id is
``{prefix}-{epoch}-{Spark partition}``, one per task and epoch, where the epoch is a
per-write id (batch) or the query id (streaming: micro-batches run one after another,
so one id per partition serves them all and the coordinator's ids stay bounded): a
retry of the task
reuses it, and its ``init_transactions`` fences the earlier attempt (a killed executor
included) and aborts what that attempt left open.

A streaming batch re-run after a driver crash that came between the driver's commits
and Spark's commit log must not write twice what was already committed. So each task
also commits, inside its transaction, the offset ``batch id`` of partition 0 of the
sink topic in the group ``{prefix}-{query id}-{Spark partition}``: it becomes visible
exactly when the task's records do. A re-run task reads that marker after its
``init_transactions`` (by then the earlier transaction is complete, committed or
aborted) and, if it names this batch, writes nothing. This holds when a re-run gives
each Spark partition the same rows, which Spark's replayable sources and deterministic
plans do (docs/spark.md).
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import uuid
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

# Local properties Spark sets on every task of a micro-batch (MicroBatchExecution and
# StreamExecution): the batch id, and the query id that survives restarts from the
# same checkpoint.
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"

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
    """What a task tells the driver. With exactlyOnce: the prepared transaction the
    driver must end (``transactional_id`` None when the task had nothing to write), or
    ``skipped`` when a streaming re-run found this partition's batch already committed."""

    records: int
    transactional_id: str | None = None
    producer_id: int = -1
    producer_epoch: int = -1
    skipped: bool = False
    epoch: str | None = None  # the write's (or micro-batch's) epoch, for the driver's abort


def transactional_id(prefix: str, epoch: str, partition: int) -> str:
    """One transactional id per task and epoch: stable across the task's retries."""
    return f"{prefix}-{epoch}-{partition}"


def marker_group(prefix: str, query_id: str, partition: int) -> str:
    """The group whose offset records the last micro-batch a Spark partition committed."""
    return f"{prefix}-{query_id}-{partition}"


@dataclass(frozen=True, slots=True)
class TaskTxn:
    """A task's transaction: its id and, for a stream, where its batch marker goes."""

    transactional_id: str
    epoch: str
    marker_group: str | None = None
    marker_topic: str | None = None
    batch_id: int = -1


def stream_task_txn(options: SinkOptions, query_id: str, batch_id: int, partition: int) -> TaskTxn:
    assert options.topic is not None  # checked on the driver (check_exactly_once)
    prefix = options.transactional_id_prefix
    # The query is the epoch: Spark runs a stream's micro-batches one after another and
    # commits each before the next starts, so batch N+1's init never fences a batch the
    # driver has not ended, and one id per Spark partition (not per batch) keeps the
    # coordinator's ids bounded: a 1 s trigger would otherwise add 86,400 ids a day per
    # partition, each kept for --transactional-id-expiration-ms.
    epoch = query_id
    return TaskTxn(
        transactional_id(prefix, epoch, partition),
        epoch,
        marker_group(prefix, query_id, partition),
        options.topic,
        batch_id,
    )


def batch_task_txn(options: SinkOptions, write_id: str, partition: int) -> TaskTxn:
    return TaskTxn(transactional_id(options.transactional_id_prefix, write_id, partition), write_id)


def check_exactly_once(options: SinkOptions, *, streaming: bool) -> None:
    """A stream's batch marker is an offset of the sink topic's partition 0, so an
    exactly-once stream needs the ``topic`` option (a batch write does not)."""
    if options.exactly_once and streaming and options.topic is None:
        raise OptionError(
            "exactlyOnce on a stream needs the option 'topic': each batch's completion is "
            "recorded as a group offset of that topic (route rows with the 'partition' "
            "column instead of the 'topic' column)"
        )


def _task_context() -> Any:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:  # pragma: no cover - Spark always runs write() inside a task
        raise RuntimeError("the logmq sink's write() must run in a Spark task")
    return ctx


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

    def __init__(self, options: SinkOptions, columns: SinkColumns, **producer: Any) -> None:
        self.options = options
        self.columns = columns
        self.producer = Producer(
            options.bootstrap,
            acks=options.acks,
            compression=options.compression,
            enable_idempotence=True,
            client_id="logmq-spark-sink",
            **options.producer,
            **producer,
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


class _TxnTaskWriter(_TaskWriter):
    """One task's writes inside one transaction, prepared but left for the driver to end."""

    def __init__(self, options: SinkOptions, columns: SinkColumns, txn: TaskTxn) -> None:
        super().__init__(
            options,
            columns,
            transactional_id=txn.transactional_id,
            transaction_timeout_ms=options.transaction_timeout_ms,
        )
        self.txn = txn

    def write_all_in_txn(self, batches: Iterator[pa.RecordBatch]) -> LogMQCommitMessage:
        p = self.producer
        began = False
        try:
            # Fences any earlier attempt of this task and aborts what it left open; an
            # attempt the driver already committed stays committed.
            p.init_transactions()
            if self.txn.marker_group is not None and self._batch_done():
                for _ in batches:  # Spark's writer protocol expects the input consumed
                    pass
                log.info("%s: batch already committed", self.txn.transactional_id)
                return LogMQCommitMessage(0, skipped=True, epoch=self.txn.epoch)
            for batch in batches:
                if batch.num_rows:
                    if not began:
                        p.begin_transaction()
                        began = True
                    self._write(batch)
                    self._settle(MAX_OUTSTANDING)
            if self.txn.marker_group is not None:
                if not began:
                    p.begin_transaction()
                    began = True
                assert self.txn.marker_topic is not None
                p.send_offsets_to_transaction(
                    {(self.txn.marker_topic, 0): self.txn.batch_id}, self.txn.marker_group
                )
            if not began:  # nothing to write: no transaction for the driver to end
                return LogMQCommitMessage(0, epoch=self.txn.epoch)
            p.flush()
            self._settle(0)
            tid, pid, epoch = p.prepare_transaction()
            return LogMQCommitMessage(self.records, tid, pid, epoch, epoch=self.txn.epoch)
        except BaseException:
            if began:
                try:  # releases the partitions' LSO now instead of at the retry
                    p.abort_transaction()
                except Exception as e:  # fenced or broker gone: the retry or timeout aborts
                    log.debug("abort after a failed write: %s", e)
            raise
        finally:
            p.close()

    def _batch_done(self) -> bool:
        """Did an earlier run of this batch commit this partition (its marker names it)?"""
        assert self.txn.marker_group is not None and self.txn.marker_topic is not None
        tp = (self.txn.marker_topic, 0)
        with Admin(self.options.bootstrap) as admin:
            committed = admin.group_offsets(self.txn.marker_group, [tp]).get(tp)
        return committed is not None and committed.offset == self.txn.batch_id


def _total(messages: Sequence[WriterCommitMessage | None]) -> int:
    return sum(m.records for m in messages if isinstance(m, LogMQCommitMessage))


def _prepared(messages: Sequence[WriterCommitMessage | None]) -> list[LogMQCommitMessage]:
    return [
        m for m in messages if isinstance(m, LogMQCommitMessage) and m.transactional_id is not None
    ]


def end_transactions(
    bootstrap: str, messages: Sequence[WriterCommitMessage | None], *, commit: bool
) -> None:
    """End every task's prepared transaction (the driver's commit or abort).

    Every transaction is tried even after a failure, so as much as possible is decided
    now; on commit the first failure is raised afterwards (the write fails, and a
    streaming batch is re-run: its committed partitions then skip by their markers).
    Abort failures are logged only: an undecided transaction also times out.
    """
    prepared = _prepared(messages)
    if not prepared:
        return
    first: BaseException | None = None
    with Admin(bootstrap) as admin:
        for m in prepared:
            assert m.transactional_id is not None
            try:
                admin.complete_transaction(
                    m.transactional_id, m.producer_id, m.producer_epoch, commit=commit
                )
            except LogMQError as e:
                log.warning(
                    "could not %s transaction %s (producer %d, epoch %d): %s",
                    "commit" if commit else "abort",
                    m.transactional_id,
                    m.producer_id,
                    m.producer_epoch,
                    e,
                )
                if first is None:
                    first = e
    if commit and first is not None:
        raise first


def abort_write(
    options: SinkOptions, messages: Sequence[WriterCommitMessage | None], epoch: str | None
) -> None:
    """The driver's abort: end the prepared transactions, and fence the ids of the tasks
    that reported nothing. A task that failed, was cancelled when the job failed, or
    whose executor died leaves its transaction open, holding back the LSO of every
    partition it wrote to until the transaction times out; an InitProducerId with its
    id (the ids are known: one per Spark partition and epoch) aborts it now."""
    end_transactions(options.bootstrap, messages, commit=False)
    if epoch is None:  # a micro-batch whose every task failed: its re-run fences them
        return
    for partition, m in enumerate(messages):
        if isinstance(m, LogMQCommitMessage):
            continue
        tid = transactional_id(options.transactional_id_prefix, epoch, partition)
        try:
            with Producer(
                options.bootstrap,
                transactional_id=tid,
                transaction_timeout_ms=options.transaction_timeout_ms,
                client_id="logmq-spark-sink",
            ) as fence:
                fence.init_transactions()
        except LogMQError as e:
            log.warning("could not fence transactional id %s: %s", tid, e)


class LogMQBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self.options = options
        self.columns = columns
        # The epoch of an exactly-once write: made on the driver, so every task and
        # every retry of one write sees the same one and a new write gets new ids.
        self.write_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LogMQCommitMessage:
        if self.options.exactly_once:
            txn = batch_task_txn(self.options, self.write_id, _task_context().partitionId())
            return _TxnTaskWriter(self.options, self.columns, txn).write_all_in_txn(iterator)
        return LogMQCommitMessage(_TaskWriter(self.options, self.columns).write_all(iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.options.exactly_once:
            end_transactions(self.options.bootstrap, messages, commit=True)
        log.info("wrote %d records to logmq", _total(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.options.exactly_once:
            abort_write(self.options, messages, self.write_id)
            log.warning("logmq write failed; its transactions were aborted (exactlyOnce)")
            return
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
        if self.options.exactly_once:
            ctx = _task_context()
            query_id = ctx.getLocalProperty(QUERY_ID_PROPERTY)
            batch_id = ctx.getLocalProperty(BATCH_ID_PROPERTY)
            if query_id is None or batch_id is None:  # pragma: no cover - Spark sets both
                raise RuntimeError("exactlyOnce: Spark gave the task no query or batch id")
            txn = stream_task_txn(self.options, query_id, int(batch_id), ctx.partitionId())
            return _TxnTaskWriter(self.options, self.columns, txn).write_all_in_txn(iterator)
        return LogMQCommitMessage(_TaskWriter(self.options, self.columns).write_all(iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.options.exactly_once:
            end_transactions(self.options.bootstrap, messages, commit=True)
            skipped = sum(isinstance(m, LogMQCommitMessage) and m.skipped for m in messages)
            if skipped:
                log.info("micro-batch %d: %d partitions were committed before", batchId, skipped)
        log.info("micro-batch %d: wrote %d records to logmq", batchId, _total(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.options.exactly_once:
            epochs = {m.epoch for m in messages if isinstance(m, LogMQCommitMessage)}
            abort_write(self.options, messages, epochs.pop() if len(epochs) == 1 else None)
            log.warning("micro-batch %d failed; its transactions were aborted", batchId)
            return
        log.warning(
            "micro-batch %d failed; %d records written by tasks that finished stay in the "
            "log and will be written again when the batch is retried (at-least-once)",
            batchId,
            _total(messages),
        )
