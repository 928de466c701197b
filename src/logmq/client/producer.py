"""AsyncProducer: accumulate per partition, send batches to leaders, retry idempotently.

``send()`` is a plain method: it appends to the accumulator and returns a small
awaitable handle, so producing one record costs a list append, not a future or a task.
Everything after that belongs to the Sender task (sender.py) and the sans-IO
DeliveryTracker (inflight.py): sequence numbers for idempotence, at most
``max_in_flight`` batches per partition, and retries that resend the *same bytes* in
order. Sends to a topic whose metadata is not known yet wait in a per-topic queue that
keeps their order.

With a ``transactional_id`` the producer writes transactions (client/transactions.py):
its batches carry the transactional attribute and its producer id and epoch, the
sender adds each partition to the transaction before the partition's first batch,
and sends outside ``begin_transaction()`` ... ``commit/abort_transaction()`` raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Generator, Sequence
from time import time_ns
from typing import Any

from logmq.client.accumulator import RECORD_OVERHEAD, ProducerBatch, RecordAccumulator
from logmq.client.cluster import ClusterClient
from logmq.client.group_offsets import OffsetsArg
from logmq.client.inflight import DeliveryTracker
from logmq.client.missing_topics import MissingTopics
from logmq.client.partitioner import partitioner as partitioner_named
from logmq.client.security import ClientSecurity
from logmq.client.sender import Sender
from logmq.client.transactions import TransactionIdentity, TransactionManager, TxnState
from logmq.errors import ErrorCode, LogMQError, TransactionStateError, UnknownTopicOrPartitionError
from logmq.records import RecordMetadata
from logmq.storage.batch import ATTR_TRANSACTIONAL, Compression

ACKS = {0: 0, 1: 1, -1: -1, "all": -1, "0": 0, "1": 1, "-1": -1}
_IN_TRANSACTION = TxnState.IN_TRANSACTION
_ABORT_ON_CLOSE = frozenset(
    {TxnState.IN_TRANSACTION, TxnState.COMMITTING, TxnState.ABORTING, TxnState.ABORTABLE}
)


class BufferFullError(LogMQError):
    """Twice ``buffer_memory`` bytes are waiting to be sent; await ``wait_for_space()``."""


def _to_bytes(v: bytes | str | None) -> bytes | None:
    if v is None or type(v) is bytes:
        return v
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"values and keys must be bytes or str, not {type(v).__name__}")


_tuple_new = tuple.__new__


class RecordHandle(tuple):
    """What ``AsyncProducer.send`` returns: ``await`` it for the RecordMetadata.

    A tuple subclass ``(batch, index, ...)`` made by ``tuple.__new__`` straight from
    what the accumulator returns: ``send()`` is the per-record path, and a Python
    ``__init__`` per record would cost a tenth of it.
    """

    __slots__ = ()

    def __new__(cls, batch: ProducerBatch, index: int) -> RecordHandle:
        return _tuple_new(cls, (batch, index))

    def done(self) -> bool:
        return self[0].done

    def result(self) -> RecordMetadata:
        """The metadata of a completed send (raises its error)."""
        batch = self[0]
        if not batch.done:
            raise asyncio.InvalidStateError("send not completed yet")
        return batch.metadata(self[1])

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        batch = self[0]
        if not batch.done:
            yield from batch.async_future(asyncio.get_running_loop()).__await__()
        return batch.metadata(self[1])

    def __repr__(self) -> str:
        return f"RecordHandle({self[0]!r}, index={self[1]})"


class BulkHandle:
    """What ``AsyncProducer.send_batch`` returns: awaits to ``[(partition, base_offset, count)]``.

    One entry per batch sent, in the order the values were given per partition;
    ``base_offset`` is -1 with acks=0.
    """

    __slots__ = ("_batches",)

    def __init__(self, batches: list[ProducerBatch]) -> None:
        self._batches = batches

    def done(self) -> bool:
        return all(b.done for b in self._batches)

    def result(self) -> list[tuple[int, int, int]]:
        out = []
        for b in self._batches:
            if b.error is not None:
                raise b.error
            out.append((b.partition, b.base_offset, b.record_count))
        return out

    def __await__(self) -> Generator[Any, None, list[tuple[int, int, int]]]:
        loop = asyncio.get_running_loop()
        for b in self._batches:
            if not b.done:
                yield from b.async_future(loop).__await__()
        return self.result()


class AsyncProducer:
    """Produce to logmq from asyncio code.

    ``send()`` never blocks, and in asyncio nothing is sent until the caller yields, so
    a tight loop should ``await wait_for_space()`` now and then: it returns at once
    below ``buffer_memory`` buffered bytes. Past twice that, send raises BufferFullError.
    Idempotence is on by default (off with acks=0, which cannot retry).

    Keyed records go where Kafka's Java client (and kafka-python, aiokafka, librdkafka's
    ``murmur2_random``) puts them: ``partitioner="murmur2"``; ``"xxh3"`` is logmq's rule
    before issue 27, for topics whose keys it placed (partitioner.py).

    ``batch_size`` defaults to 64 KiB, not Kafka's 16 KiB: a request costs this client
    and the broker about a hundred times what a record costs, so 16 KiB batches
    (~150 records of 100 bytes) spend more time on requests than on records.

    ``transactional_id`` makes it a transactional producer (idempotent, acks=all):
    ``await init_transactions()`` once, then per transaction ``begin_transaction()``,
    sends, optionally ``await send_offsets_to_transaction(...)``, and ``await
    commit_transaction()`` or ``await abort_transaction()``. ``transaction_timeout_ms``
    is how long the coordinator lets a transaction stay open before aborting it.
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        acks: int | str = 1,
        linger_ms: float = 5,
        batch_size: int = 64 << 10,
        max_batch_records: int = 10000,
        bulk_batch_bytes: int = 1 << 20,
        compression: str = "none",
        enable_idempotence: bool = True,
        retries: int = 2**31 - 1,
        max_in_flight: int = 5,
        retry_backoff_ms: int = 100,
        security: ClientSecurity | None = None,
        request_timeout_ms: int = 30000,
        delivery_timeout_ms: int = 120000,
        max_block_ms: int = 60000,
        buffer_memory: int = 32 << 20,
        client_id: str = "logmq-producer",
        allow_auto_create_topics: bool = False,
        metadata_max_age_ms: int = 300_000,
        partitioner: str = "murmur2",
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60000,
    ) -> None:
        if acks not in ACKS:
            raise ValueError(f"acks must be 0, 1 or 'all', not {acks!r}")
        if transactional_id is not None:
            if not enable_idempotence:
                raise ValueError("a transactional producer is idempotent")
            if ACKS[acks] == 0:
                raise ValueError("a transactional producer needs acks='all'")
            acks = -1  # as Kafka's clients: a transaction's records are replicated
        if not 1 <= max_in_flight <= 5:
            raise ValueError("max_in_flight must be 1..5")
        self.acks = ACKS[acks]
        # keyed records: Kafka's Java default, so other clients put a key where we do
        self._partition_for_key = partitioner_named(partitioner)
        self.compression = Compression.parse(compression)
        self.idempotent = enable_idempotence and self.acks != 0
        self.retries = retries
        self.max_in_flight = max_in_flight
        self.retry_backoff_ms = retry_backoff_ms
        self.request_timeout_ms = request_timeout_ms
        self.max_block = max_block_ms / 1000
        self.buffer_memory = buffer_memory
        self.bulk_batch_bytes = bulk_batch_bytes
        self._cluster = ClusterClient(
            bootstrap,
            client_id=client_id,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            security=security,
            allow_auto_create_topics=allow_auto_create_topics,
            metadata_max_age_ms=metadata_max_age_ms,  # picks up partitions added later
        )
        self._acc = RecordAccumulator(
            batch_size=batch_size,
            max_batch_records=max_batch_records,
            linger_ms=linger_ms,
            delivery_timeout_ms=delivery_timeout_ms,
        )
        self._lock = self._acc.lock
        self._tracker = DeliveryTracker(
            idempotent=self.idempotent,
            max_in_flight=max_in_flight,
            retries=retries,
            retry_backoff_ms=retry_backoff_ms,
        )
        self._txn: TransactionManager | None = None
        if transactional_id is not None:
            self._txn = TransactionManager(self._cluster, transactional_id, transaction_timeout_ms)
        self._waiting: dict[str, list[tuple[Any, ...]]] = {}  # topic -> sends awaiting metadata
        self._resolvers: dict[str, asyncio.Task[None]] = {}
        # why sends to a topic wait, said once per topic (until it appears)
        self._missing = MissingTopics(
            allow_auto_create=allow_auto_create_topics,
            max_block_s=self.max_block,
            delivery_timeout_s=delivery_timeout_ms / 1000,
        )
        self.allow_auto_create_topics = allow_auto_create_topics
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sender: Sender | None = None
        self._accepting = False  # true between start() and close()
        self._hard_limit = 2 * buffer_memory
        self._closing = False
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------
    async def start(self) -> AsyncProducer:
        if self._sender is None:
            self._loop = asyncio.get_running_loop()
            try:
                await self._cluster.refresh_metadata()
            except BaseException:
                await self._cluster.close()
                raise
            sender = Sender(
                self._cluster,
                self._acc,
                self._tracker,
                acks=self.acks,
                # the attributes of every batch: the codec, and a transaction's flag
                compression=self.compression | (ATTR_TRANSACTIONAL if self._txn else 0),
                request_timeout_ms=self.request_timeout_ms,
                retry_backoff_ms=self.retry_backoff_ms,
                buffer_memory=self.buffer_memory,
                txn=self._txn,
                missing=self._missing,
            )
            try:
                await sender.start()
            except BaseException:
                await self._cluster.close()
                raise
            self._sender = sender
            self._accepting = True
        return self

    async def __aenter__(self) -> AsyncProducer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Flush what was sent, stop the sender and close connections."""
        if self._closed:
            return
        txn = self._txn
        if self._sender is not None and txn is not None and txn.state in _ABORT_ON_CLOSE:
            # as Kafka's clients: a transaction left open is aborted, not committed
            with contextlib.suppress(LogMQError):
                await self.abort_transaction()
        if self._sender is not None:
            await self.flush()
            self._accepting = False
            self._closing = True
            await self._sender.stop()
        for task in self._resolvers.values():
            task.cancel()
        await asyncio.gather(*self._resolvers.values(), return_exceptions=True)
        self._closed = True
        await self._cluster.close()

    # -- sending ------------------------------------------------------------------
    def send(
        self,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes | str | None]] | None = None,
        timestamp: int | None = None,
    ) -> RecordHandle | asyncio.Future[RecordMetadata]:
        """Queue one record; ``await`` the result for its RecordMetadata."""
        fast = self._append(topic, value, key, partition, headers, timestamp)
        if fast is not None:
            if fast[2]:  # (batch, index, wake)
                self._sender.wakeup.set()  # type: ignore[union-attr]
            return _tuple_new(RecordHandle, fast)
        fut = self._loop.create_future()  # type: ignore[union-attr]
        self._queue_for_metadata(topic, value, key, partition, headers, timestamp, fut)
        return fut

    def _append(self, topic, value, key, partition, headers, timestamp):
        """Fast path shared with the blocking Producer (may run in any thread).

        Returns None when the topic's metadata is unknown (the caller queues the send).
        """
        if not self._accepting:
            raise LogMQError("producer is not running (use async with / start())")
        txn = self._txn
        if txn is not None and txn.state is not _IN_TRANSACTION:
            txn.check_send()
        if type(value) is not bytes and value is not None:
            value = _to_bytes(value)
        if key is not None and type(key) is not bytes:
            key = _to_bytes(key)
        if headers:
            headers = [(h[0], _to_bytes(h[1])) for h in headers]
        if timestamp is None:
            timestamp = time_ns() // 1_000_000
        n = self._cluster.metadata.counts.get(topic)
        acc = self._acc
        lock = self._lock
        lock.acquire()  # explicit: a third of the cost of ``with`` on this per-record path
        try:
            if not n or (self._waiting and topic in self._waiting):
                return None
            if acc.buffered_bytes > self._hard_limit:
                raise BufferFullError(f"{acc.buffered_bytes} bytes wait to be sent")
            if partition is None:
                if key is None:
                    partition = acc._sticky.get(topic)
                    if partition is None:
                        partition = acc.sticky_partition(topic, n)
                else:
                    partition = self._partition_for_key(key, n)
            elif not 0 <= partition < n:
                raise UnknownTopicOrPartitionError(f"{topic!r} has no partition {partition}")
            return acc.append(topic, partition, timestamp, key, value, headers)
        finally:
            lock.release()

    def _queue_for_metadata(self, topic, value, key, partition, headers, timestamp, fut) -> None:
        """Slow path: hold sends to a topic without metadata, in order, until it arrives."""
        if timestamp is None:
            timestamp = time_ns() // 1_000_000
        with self._lock:
            self._waiting.setdefault(topic, []).append(
                (value, key, partition, headers, timestamp, fut)
            )
        self._loop.call_soon_threadsafe(self._start_resolver, topic)  # type: ignore[union-attr]

    def _start_resolver(self, topic: str) -> None:
        if topic not in self._resolvers:
            self._resolvers[topic] = asyncio.create_task(self._resolve(topic))

    async def _resolve(self, topic: str) -> None:
        error: BaseException | None = None
        try:
            await self._ensure_topic(topic)
        except LogMQError as e:
            error = e
        except asyncio.CancelledError:
            error = LogMQError("producer closed")
        appended: list[tuple[Any, ProducerBatch, int]] = []
        failed: list[tuple[Any, BaseException]] = []
        with self._lock:  # held throughout, so no fast-path send can overtake these
            waiting = self._waiting.pop(topic, [])
            del self._resolvers[topic]
            n = self._cluster.metadata.partition_count(topic)
            for value, key, partition, headers, timestamp, fut in waiting:
                if error is not None:
                    failed.append((fut, error))
                    continue
                try:
                    value, key = _to_bytes(value), _to_bytes(key)
                    if headers:
                        headers = [(h[0], _to_bytes(h[1])) for h in headers]
                    if partition is None:
                        if key is None:
                            partition = self._acc.sticky_partition(topic, n)
                        else:
                            partition = self._partition_for_key(key, n)
                    elif not 0 <= partition < n:
                        raise UnknownTopicOrPartitionError(
                            f"{topic!r} has no partition {partition}"
                        )
                    batch, index, _ = self._acc.append(
                        topic, partition, timestamp, key, value, headers
                    )
                except Exception as e:
                    failed.append((fut, e))
                    continue
                appended.append((fut, batch, index))
        for fut, err in failed:  # outside the lock: callbacks may run user code
            _settle(fut, error=err)
        for fut, batch, index in appended:
            batch.add_callback(_settler(fut, batch, index))
        self._wake()

    def send_batch(
        self,
        topic: str,
        values: Sequence[bytes | str | None],
        keys: Sequence[bytes | str | None] | None = None,
        partition: int | None = None,
    ) -> BulkHandle | asyncio.Future[list[tuple[int, int, int]]]:
        """Bulk send: awaits to ``[(partition, base_offset, count), ...]``, one per batch.

        Values go out in batches of about ``bulk_batch_bytes``, each encoded with one
        encode_values call. Keyed values are grouped per partition (order kept within
        a partition); keyless ones fill one partition per batch, moving on after each.
        """
        batches = self._append_bulk(topic, values, keys, partition)
        if batches is not None:
            self._wake()
            return BulkHandle(batches)
        return asyncio.ensure_future(self._send_batch_slow(topic, values, keys, partition))

    async def _send_batch_slow(self, topic, values, keys, partition):
        await self._ensure_topic(topic)
        while True:
            batches = self._append_bulk(topic, values, keys, partition)
            if batches is not None:
                break
            await asyncio.sleep(0.001)  # single sends to this topic still wait for metadata
        self._wake()
        return await BulkHandle(batches)

    def _append_bulk(self, topic, values, keys, partition):
        if self._closing or self._closed or self._sender is None:
            raise LogMQError("producer is not running (use async with / start())")
        if self._txn is not None:
            self._txn.check_send()
        n = self._cluster.metadata.partition_count(topic)
        if n == 0 or topic in self._waiting:
            return None
        if not values:
            return []
        if not set(map(type, values)) <= {bytes}:
            values = [_to_bytes(v) for v in values]
        if keys is not None:
            if len(keys) != len(values):
                raise ValueError("keys and values differ in length")
            if not set(map(type, keys)) <= {bytes}:
                keys = [_to_bytes(k) for k in keys]
        if partition is not None and not 0 <= partition < n:
            raise UnknownTopicOrPartitionError(f"{topic!r} has no partition {partition}")
        ts = time.time_ns() // 1_000_000
        now = time.monotonic() * 1000
        total = sum(map(len, filter(None, values)))
        if keys is not None:
            total += sum(map(len, filter(None, keys)))
        per_record = total / len(values) + RECORD_OVERHEAD
        chunk = max(1, min(int(self.bulk_batch_bytes // per_record), 1 << 20))
        if keys is not None and partition is None:
            groups: dict[int, tuple[list, list]] = {}
            partition_for_key = self._partition_for_key
            for k, v in zip(keys, values, strict=True):
                p = partition_for_key(k, n) if k is not None else 0
                g = groups.get(p)
                if g is None:
                    g = groups[p] = ([], [])
                g[0].append(v)
                g[1].append(k)
            parts = [(p, vs, ks) for p, (vs, ks) in groups.items()]
        else:
            parts = [(partition, values, keys)]
        out: list[ProducerBatch] = []
        with self._lock:
            if self._acc.buffered_bytes > 2 * self.buffer_memory:
                raise BufferFullError(f"{self._acc.buffered_bytes} bytes wait to be sent")
            for p, vs, ks in parts:
                for i in range(0, len(vs), chunk):
                    cv = vs[i : i + chunk]
                    ck = ks[i : i + chunk] if ks is not None else None
                    target = p if p is not None else self._acc.sticky_partition(topic, n)
                    size = int(len(cv) * per_record)
                    out.append(self._acc.append_bulk(topic, target, cv, ck, ts, size, now))
        return out

    async def flush(self) -> None:
        """Send everything queued so far and wait until each of those batches completes."""
        while self._resolvers:
            await asyncio.gather(*self._resolvers.values(), return_exceptions=True)
        with self._lock:
            pending = list(self._acc.batches())
            self._acc.close_all()
        pending.extend(self._tracker.pending())
        if self._sender is not None:
            pending.extend(self._sender.in_transit)
        self._wake()
        loop = asyncio.get_running_loop()
        for b in pending:
            if not b.done:
                await b.async_future(loop)

    # -- transactions -------------------------------------------------------------
    def _transactional(self) -> TransactionManager:
        if self._txn is None:
            raise TransactionStateError("not a transactional producer (no transactional_id)")
        return self._txn

    @property
    def transaction_identity(self) -> TransactionIdentity:
        """``(transactional_id, producer_id, producer_epoch)``: what
        ``complete_transaction`` needs to end this producer's transaction from
        elsewhere (producer id and epoch are -1 before ``init_transactions``)."""
        return self._transactional().identity

    async def init_transactions(self) -> None:
        """Register the transactional id with its coordinator: fences any older producer
        with the same id (its open transaction is aborted) and takes a new epoch."""
        txn = self._transactional()
        if self._sender is None:
            await self.start()
        pid, epoch = await txn.init()
        self._tracker.set_producer(pid, epoch)

    def begin_transaction(self) -> None:
        """Start a transaction (local: the coordinator learns of it with the first
        partition or offsets added)."""
        self._transactional().begin()

    async def send_offsets_to_transaction(self, offsets: OffsetsArg, group_id: str) -> None:
        """Commit ``{(topic, partition): next offset}`` for ``group_id`` as part of the
        transaction: visible to the group when it commits, gone when it aborts. A value
        may be an OffsetAndMetadata, to commit metadata and the leader epoch of the last
        record consumed as well (what OffsetFetch then answers)."""
        await self._transactional().send_offsets(offsets, group_id)

    async def commit_transaction(self) -> None:
        """Flush the transaction's records, then commit it. A record that failed makes
        the transaction abortable: this raises its error, and abort_transaction() is
        the way on. Retriable coordinator errors are retried until the request
        timeout (then RequestTimedOutError, and commit may be called again)."""
        txn = self._transactional()
        if txn.state is TxnState.ABORTABLE and txn.error is not None:
            raise txn.error
        txn._require(
            TxnState.IN_TRANSACTION,
            TxnState.COMMITTING,
            TxnState.PREPARED,
            what="commit_transaction()",
        )
        if txn.state is TxnState.IN_TRANSACTION:
            txn.state = TxnState.COMMITTING
        await self.flush()
        if txn.state in (TxnState.ABORTABLE, TxnState.FATAL) and txn.error is not None:
            raise txn.error
        await txn.end(commit=True)

    async def abort_transaction(self) -> None:
        """Drop the records not sent yet (their sends fail), wait for those on their
        way, and abort: read_committed consumers never see any of them."""
        txn = self._transactional()
        txn._require(
            TxnState.IN_TRANSACTION,
            TxnState.COMMITTING,
            TxnState.ABORTING,
            TxnState.PREPARED,
            TxnState.ABORTABLE,
            what="abort_transaction()",
        )
        txn.state = TxnState.ABORTING
        await self._drop_unsent()
        await txn.end(commit=False)
        if self._tracker.needs_new_producer_id:  # a failed batch left a sequence gap
            pid, epoch = await txn.bump_epoch()
            self._tracker.set_producer(pid, epoch)

    async def prepare_transaction(self) -> TransactionIdentity:
        """Flush the transaction's records and return its identity without ending it:
        another client ends it later with ``complete_transaction(cluster, *identity,
        commit)`` (client/transactions.py; ``Admin.complete_transaction``). Until then
        the transaction holds back read_committed consumers of its partitions, and
        the coordinator aborts it after ``transaction_timeout_ms``. The producer may
        ``begin_transaction()`` again once the transaction has been completed."""
        txn = self._transactional()
        txn._require(TxnState.IN_TRANSACTION, what="prepare_transaction()")
        await self.flush()
        if txn.state in (TxnState.ABORTABLE, TxnState.FATAL) and txn.error is not None:
            raise txn.error
        txn.state = TxnState.PREPARED
        return txn.identity

    async def _drop_unsent(self) -> None:
        """Abort's first half: fail every batch not handed to the sender yet, then wait
        until those already on their way have their answers."""
        while self._resolvers:
            await asyncio.gather(*self._resolvers.values(), return_exceptions=True)
        err = LogMQError(
            "the transaction was aborted before this record was sent",
            ErrorCode.OPERATION_NOT_ATTEMPTED,
        )
        with self._lock:
            dropped = [b for tp in self._acc.partitions() for b in self._acc.remove_partition(tp)]
            for b in dropped:
                self._acc.release(b)
        for b in dropped:
            b.fail(err)
        if self._sender is not None:
            self._sender._space_check()
        loop = asyncio.get_running_loop()
        while True:
            sender = self._sender
            pending = [b for b in self._tracker.pending() if not b.done]
            if sender is not None:
                pending += [b for b in sender.in_transit if not b.done]
            if not pending:
                return
            self._wake()
            for b in pending:
                await b.async_future(loop)

    async def wait_for_space(self) -> None:
        """Wait until the buffered bytes drop below ``buffer_memory``."""
        assert self._sender is not None
        while self._acc.buffered_bytes > self.buffer_memory:
            self._sender.space.clear()
            await self._sender.space.wait()

    async def partitions_for(self, topic: str) -> list[int]:
        md = await self._ensure_topic(topic)
        return [p.partition for p in md.topics[topic].partitions]

    async def _ensure_topic(self, topic: str) -> Any:
        """The topic's metadata, waiting up to ``max_block_ms`` for it to appear."""
        md = await self._cluster.ensure_topic(
            topic, self.max_block, functools.partial(self._missing.waiting_for_metadata, topic)
        )
        self._missing.found(topic)
        return md

    def _wake(self) -> None:
        if self._sender is not None:
            self._sender.wakeup.set()


def _settle(fut: Any, value: Any = None, error: BaseException | None = None) -> None:
    """Resolve an asyncio or concurrent future from the loop thread."""
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


def _settler(fut: Any, batch: ProducerBatch, index: int) -> Callable[[], None]:
    def settle() -> None:
        try:
            md = batch.metadata(index)
        except BaseException as e:
            _settle(fut, error=e)
        else:
            _settle(fut, md)

    return settle
