"""Blocking clients for scripts and Spark executors: the async clients on a loop thread.

A ``LoopThread`` runs a uvloop event loop in a daemon thread. By default every blocking
client in a process shares one (reference-counted: it stops when the last client
closes); pass ``own_loop=True`` for a private one. Blocking calls submit coroutines to
that loop and wait, so they are safe from several threads at once. ``Producer.send``
is the exception that matters for speed: it appends to the accumulator directly from
the calling thread (under the accumulator's lock) and only wakes the loop when a batch
is created or fills up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import uvloop

from logmq.client.accumulator import ProducerBatch
from logmq.client.admin import AsyncAdmin, ConfigEntry, NewTopic, TopicDescription, TopicListing
from logmq.client.cluster import TopicPartition
from logmq.client.consumer import AsyncConsumer
from logmq.client.fetcher import FetchedBatch
from logmq.client.group_admin import GroupDescription, GroupListing
from logmq.client.group_offsets import OffsetAndMetadata, OffsetsArg
from logmq.client.producer import AsyncProducer, BufferFullError
from logmq.client.reassignment_admin import LogDirPartition, ReassignmentListing
from logmq.client.security_admin import (
    QuotaAlteration,
    QuotaEntry,
    QuotaFilter,
    ScramCredentialInfo,
)
from logmq.client.txn_admin import (
    DEFAULT_MAX_AGE_MS,
    HangingTransaction,
    ProducerState,
    TransactionDescription,
    TransactionListing,
)
from logmq.errors import ErrorCode, LogMQError
from logmq.records import Record, RecordMetadata
from logmq.security.acl import AclBinding, AclBindingFilter

T = TypeVar("T")
# How long calls still running when a loop thread stops get to finish their cleanup.
LEFTOVER_GRACE_S = 5.0


class LoopThread:
    """An event loop running forever in a daemon thread."""

    _shared: LoopThread | None = None
    _shared_users = 0
    _shared_lock = threading.Lock()

    def __init__(self, name: str = "logmq-loop") -> None:
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self._finish_leftovers()

    def _finish_leftovers(self) -> None:
        """Cancel the calls still running when the loop stops (one whose caller was
        interrupted by Ctrl-C) and let them unwind, as asyncio.run does: a task left
        pending would be destroyed with a warning and its cleanup never run."""
        tasks = asyncio.all_tasks(self.loop)
        for task in tasks:
            task.cancel()
        if tasks:
            self.loop.run_until_complete(asyncio.wait(tasks, timeout=LEFTOVER_GRACE_S))

    @classmethod
    def acquire(cls) -> LoopThread:
        """The process-wide loop thread, started on first use."""
        with cls._shared_lock:
            if cls._shared is None or not cls._shared._thread.is_alive():
                cls._shared = LoopThread("logmq-shared-loop")
            cls._shared_users += 1
            return cls._shared

    @classmethod
    def release(cls, lt: LoopThread) -> None:
        with cls._shared_lock:
            if lt is not cls._shared:
                lt.stop()
                return
            cls._shared_users -= 1
            if cls._shared_users == 0:
                cls._shared = None
                lt.stop()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if threading.get_ident() == self._thread.ident:
            coro.close()
            raise RuntimeError("blocking logmq call from inside its own event loop thread")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        fut = self.submit(coro)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError("logmq call timed out") from None
        except KeyboardInterrupt:
            fut.cancel()  # else the call runs on in the loop thread, unowned
            raise

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            if threading.get_ident() != self._thread.ident:
                self._thread.join()
                self.loop.close()


class _Client:
    def __init__(self, own_loop: bool) -> None:
        self._lt = LoopThread() if own_loop else LoopThread.acquire()
        self._own = own_loop
        self._closed = False

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self._lt.run(coro, timeout)

    def _release_loop(self) -> None:
        if self._own:
            self._lt.stop()
        else:
            LoopThread.release(self._lt)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class RecordFuture(concurrent.futures.Future):
    """A send's future that costs almost nothing until someone waits on it.

    It answers from the batch it belongs to. The machinery of a real Future (a
    Condition, used by ``concurrent.futures.wait``) is built only on first access.
    """

    def __init__(self, batch: ProducerBatch, index: int) -> None:  # no super().__init__
        self._batch = batch
        self._index = index

    _materialize_lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        if name in ("_condition", "_state", "_waiters", "_result", "_exception", "_done_callbacks"):
            with RecordFuture._materialize_lock:
                if "_condition" not in self.__dict__:
                    concurrent.futures.Future.__init__(self)
                    self._batch.add_callback(self._settle)
            return object.__getattribute__(self, name)
        raise AttributeError(name)

    def _settle(self) -> None:
        try:
            md = self._batch.metadata(self._index)
        except BaseException as e:
            concurrent.futures.Future.set_exception(self, e)
        else:
            concurrent.futures.Future.set_result(self, md)

    def done(self) -> bool:
        return self._batch.done

    def running(self) -> bool:
        return not self._batch.done

    def cancelled(self) -> bool:
        return False

    def cancel(self) -> bool:
        return False

    def result(self, timeout: float | None = None) -> RecordMetadata:
        if not self._batch.wait(timeout):
            raise concurrent.futures.TimeoutError()
        return self._batch.metadata(self._index)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._batch.wait(timeout):
            raise concurrent.futures.TimeoutError()
        return self._batch.error

    def add_done_callback(self, fn: Any) -> None:
        self._batch.add_callback(lambda: fn(self))


class Producer(_Client):
    """Blocking producer: ``send()`` returns a concurrent.futures.Future of RecordMetadata."""

    def __init__(self, bootstrap: str, *, own_loop: bool = False, **config: Any) -> None:
        super().__init__(own_loop)
        try:  # a bad setting (acks, partitioner) raises here: the loop is released too
            self._p = AsyncProducer(bootstrap, **config)
            self._run(self._p.start())
        except BaseException:
            self._release_loop()
            raise

    def send(
        self,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes | str | None]] | None = None,
        timestamp: int | None = None,
    ) -> concurrent.futures.Future[RecordMetadata]:
        """Queue one record (blocks only while the buffer is full, up to max_block_ms)."""
        p = self._p
        while True:
            if p._acc.buffered_bytes > p.buffer_memory:
                self._run(p.wait_for_space(), p.max_block)
            try:
                fast = p._append(topic, value, key, partition, headers, timestamp)
                break
            except BufferFullError:
                continue
        if fast is not None:
            batch, index, wake = fast
            if wake:
                self._lt.loop.call_soon_threadsafe(p._wake)
            return RecordFuture(batch, index)
        fut: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()
        p._queue_for_metadata(topic, value, key, partition, headers, timestamp, fut)
        return fut

    def send_batch(
        self,
        topic: str,
        values: Sequence[bytes | str | None],
        keys: Sequence[bytes | str | None] | None = None,
        partition: int | None = None,
    ) -> concurrent.futures.Future[list[tuple[int, int, int]]]:
        """Bulk send; the future resolves to ``[(partition, base_offset, count), ...]``."""
        return self._lt.submit(self._send_batch(topic, values, keys, partition))

    async def _send_batch(self, topic, values, keys, partition) -> list[tuple[int, int, int]]:
        while True:
            await self._p.wait_for_space()
            try:
                handle = self._p.send_batch(topic, values, keys, partition)
                break
            except BufferFullError:
                continue
        return await handle

    def flush(self, timeout: float | None = None) -> None:
        self._run(self._p.flush(), timeout)

    def partitions_for(self, topic: str) -> list[int]:
        return self._run(self._p.partitions_for(topic))

    # -- transactions (the AsyncProducer methods, blocking) -----------------------------
    @property
    def transaction_identity(self) -> tuple[str, int, int]:
        return self._p.transaction_identity

    def init_transactions(self, timeout: float | None = None) -> None:
        self._run(self._p.init_transactions(), timeout)

    def begin_transaction(self) -> None:
        self._p.begin_transaction()

    def send_offsets_to_transaction(
        self, offsets: OffsetsArg, group_id: str, timeout: float | None = None
    ) -> None:
        self._run(self._p.send_offsets_to_transaction(dict(offsets), group_id), timeout)

    def commit_transaction(self, timeout: float | None = None) -> None:
        self._run(self._p.commit_transaction(), timeout)

    def abort_transaction(self, timeout: float | None = None) -> None:
        self._run(self._p.abort_transaction(), timeout)

    def prepare_transaction(self, timeout: float | None = None) -> tuple[str, int, int]:
        return self._run(self._p.prepare_transaction(), timeout)

    def close(self) -> None:
        """Flush, then stop."""
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._p.close())
        finally:
            self._release_loop()


class Consumer(_Client):
    """Blocking consumer; iterate it for records, or call poll()/poll_batches().

    Plain-function rebalance listeners run in a worker thread, so they may call this
    consumer's blocking methods (``commit()`` in ``on_revoked``, ``seek()`` in
    ``on_assigned``); coroutine functions run on the client's event loop.
    """

    def __init__(self, bootstrap: str, *, own_loop: bool = False, **config: Any) -> None:
        super().__init__(own_loop)
        for name in ("on_assigned", "on_revoked", "on_lost"):
            if config.get(name) is not None:
                config[name] = _in_thread(config[name])
        self._c = AsyncConsumer(bootstrap, **config)
        try:
            self._run(self._c.start())
        except BaseException:
            self._release_loop()
            raise

    def _call(self, fn: Any, *args: Any) -> Any:
        async def call() -> Any:
            return fn(*args)

        return self._run(call())

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._call(self._c.assign, list(partitions))

    def assignment(self) -> set[TopicPartition]:
        return self._call(self._c.assignment)

    def subscribe(self, topics: Iterable[str] | None = None, *, pattern: str | None = None) -> None:
        self._run(self._c.subscribe(topics, pattern=pattern))

    def subscription(self) -> set[str]:
        return self._call(self._c.subscription)

    @property
    def member_id(self) -> str | None:
        return self._c.member_id

    def pause(self, *partitions: TopicPartition) -> None:
        self._call(self._c.pause, *partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._call(self._c.resume, *partitions)

    def paused(self) -> set[TopicPartition]:
        return self._call(self._c.paused)

    def commit(self, offsets: OffsetsArg | None = None, *, metadata: str | None = None) -> None:
        """Commit consumed positions (or the given offsets); raises CommitFailedError
        when this consumer no longer owns them in its group."""
        self._run(self._c.commit(offsets, metadata=metadata))

    def commit_async(
        self,
        offsets: OffsetsArg | None = None,
        *,
        metadata: str | None = None,
        callback: Any = None,
    ) -> concurrent.futures.Future[None]:
        """Start a commit; the future resolves when the coordinator answered.
        ``callback(offsets, error)`` runs on the client's loop thread."""

        async def start() -> asyncio.Task[None]:
            return self._c.commit_async(offsets, metadata=metadata, callback=callback)

        task = self._run(start())
        result: concurrent.futures.Future[None] = concurrent.futures.Future()

        def done(t: asyncio.Task[None]) -> None:
            if t.cancelled():
                result.cancel()
            elif t.exception() is not None:
                result.set_exception(t.exception())  # type: ignore[arg-type]
            else:
                result.set_result(None)

        self._lt.loop.call_soon_threadsafe(task.add_done_callback, done)
        return result

    def committed(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        return self._run(self._c.committed(list(partitions)))

    def seek(self, topic: str, partition: int, offset: int) -> None:
        self._call(self._c.seek, topic, partition, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._run(self._c.seek_to_beginning(*partitions))

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._run(self._c.seek_to_end(*partitions))

    def position(self, topic: str, partition: int) -> int:
        return self._run(self._c.position(topic, partition))

    def highwater(self, topic: str, partition: int) -> int:
        return self._call(self._c.highwater, topic, partition)

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int, int] | None]:
        return self._run(self._c.offsets_for_times(dict(timestamps)))

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict:
        return self._run(self._c.beginning_offsets(list(partitions)))

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict:
        return self._run(self._c.end_offsets(list(partitions)))

    def poll(self, timeout: float = 1.0, max_records: int | None = None) -> list[Record]:
        return self._run(self._c.poll(timeout, max_records))

    def poll_batches(
        self, timeout: float = 1.0, max_records: int | None = None
    ) -> list[FetchedBatch]:
        return self._run(self._c.poll_batches(timeout, max_records))

    def __iter__(self) -> Iterator[Record]:
        while not self._closed:
            yield from self.poll(1.0)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._c.close())
        finally:
            self._release_loop()


class Admin(_Client):
    """Blocking admin client; the same methods as AsyncAdmin."""

    def __init__(self, bootstrap: str, *, own_loop: bool = False, **config: Any) -> None:
        super().__init__(own_loop)
        self._a = AsyncAdmin(bootstrap, **config)
        try:
            self._run(self._a.start())
        except BaseException:
            self._release_loop()
            raise

    def create_topics(self, topics: Iterable[NewTopic], *, validate_only: bool = False) -> None:
        self._run(self._a.create_topics(list(topics), validate_only=validate_only))

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = 1,
        configs: Mapping[str, Any] | None = None,
    ) -> None:
        self._run(self._a.create_topic(name, partitions, replication_factor, configs))

    def create_partitions(
        self,
        new_totals: Mapping[str, int],
        *,
        assignments: Mapping[str, Sequence[Sequence[int]]] | None = None,
        validate_only: bool = False,
    ) -> None:
        """Grow topics to ``{topic: new total partition count}``, the new partitions
        on ``assignments`` (``{topic: [[broker, ...], ...]}``) when given."""
        self._run(
            self._a.create_partitions(
                dict(new_totals), assignments=assignments, validate_only=validate_only
            )
        )

    def delete_topics(self, names: Iterable[str]) -> None:
        self._run(self._a.delete_topics(list(names)))

    def delete_topic(self, name: str) -> None:
        self._run(self._a.delete_topic(name))

    def list_topics(self, *, internal: bool = False) -> list[str]:
        return self._run(self._a.list_topics(internal=internal))

    def list_topic_listings(self, *, internal: bool = False) -> list[TopicListing]:
        return self._run(self._a.list_topic_listings(internal=internal))

    def describe_topics(self, names: Iterable[str]) -> dict[str, TopicDescription]:
        return self._run(self._a.describe_topics(list(names)))

    def alter_partition_reassignments(
        self,
        moves: Mapping[TopicPartition, Sequence[int] | None],
        *,
        throttle_bytes_per_sec: int | None = None,
    ) -> None:
        """Start (target replicas) or cancel (None) moves, all or nothing."""
        coro = self._a.alter_partition_reassignments(
            dict(moves), throttle_bytes_per_sec=throttle_bytes_per_sec
        )
        self._run(coro)

    def set_reassignment_throttle(self, rate: int) -> None:
        self._run(self._a.set_reassignment_throttle(rate))

    def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> ReassignmentListing:
        parts = None if partitions is None else list(partitions)
        return self._run(self._a.list_partition_reassignments(parts))

    def describe_log_dirs(
        self, broker_id: int, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, LogDirPartition]:
        parts = None if partitions is None else list(partitions)
        return self._run(self._a.describe_log_dirs(broker_id, parts))

    def elect_leaders(
        self, partitions: Iterable[TopicPartition] | None = None, *, unclean: bool = False
    ) -> dict[TopicPartition, tuple[ErrorCode, str]]:
        parts = None if partitions is None else list(partitions)
        return self._run(self._a.elect_leaders(parts, unclean=unclean))

    def describe_configs(
        self, names: Iterable[str], *, resource_type: str = "topic"
    ) -> dict[str, dict[str, ConfigEntry]]:
        return self._run(self._a.describe_configs(list(names), resource_type=resource_type))

    def alter_configs(
        self,
        topic: str,
        set: Mapping[str, Any] | None = None,
        delete: Iterable[str] | None = None,
        *,
        validate_only: bool = False,
    ) -> None:
        self._run(self._a.alter_configs(topic, set, delete, validate_only=validate_only))

    def list_offsets(
        self, requests: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int, int]]:
        return self._run(self._a.list_offsets(dict(requests)))

    def delete_records(
        self, offsets: Mapping[TopicPartition, int], *, timeout_ms: int = 30_000
    ) -> dict[TopicPartition, int]:
        return self._run(self._a.delete_records(dict(offsets), timeout_ms=timeout_ms))

    def list_groups(self, states: Iterable[str] | None = None) -> list[GroupListing]:
        return self._run(self._a.list_groups(states))

    def describe_group(self, group_id: str) -> GroupDescription:
        return self._run(self._a.describe_group(group_id))

    def delete_group(self, group_id: str) -> None:
        self._run(self._a.delete_group(group_id))

    def delete_groups(self, group_ids: Iterable[str]) -> None:
        self._run(self._a.delete_groups(list(group_ids)))

    def commit_group_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, Any],
        metadata: str | None = None,
    ) -> None:
        self._run(self._a.commit_group_offsets(group_id, dict(offsets), metadata))

    def alter_group_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, Any],
        metadata: str | None = None,
    ) -> None:
        self._run(self._a.alter_group_offsets(group_id, dict(offsets), metadata))

    def group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        parts = None if partitions is None else list(partitions)
        return self._run(self._a.group_offsets(group_id, parts))

    def delete_group_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        self._run(self._a.delete_group_offsets(group_id, list(partitions)))

    # -- security: ACLs, SCRAM users, client quotas ------------------------------------
    def create_acls(self, bindings: Iterable[AclBinding]) -> None:
        self._run(self._a.create_acls(list(bindings)))

    def describe_acls(self, filter: AclBindingFilter | None = None) -> list[AclBinding]:
        return self._run(self._a.describe_acls(filter))

    def delete_acls(self, filters: Iterable[AclBindingFilter]) -> list[AclBinding]:
        return self._run(self._a.delete_acls(list(filters)))

    def upsert_scram_user(
        self,
        name: str,
        password: str,
        mechanism: str = "SCRAM-SHA-512",
        iterations: int = 4096,
    ) -> None:
        self._run(self._a.upsert_scram_user(name, password, mechanism, iterations))

    def delete_scram_user(self, name: str, mechanism: str | None = None) -> list[str]:
        return self._run(self._a.delete_scram_user(name, mechanism))

    def describe_scram_users(
        self, names: Iterable[str] | None = None
    ) -> dict[str, list[ScramCredentialInfo]]:
        return self._run(self._a.describe_scram_users(None if names is None else list(names)))

    def alter_client_quotas(
        self, entries: Iterable[QuotaAlteration], *, validate_only: bool = False
    ) -> None:
        self._run(self._a.alter_client_quotas(list(entries), validate_only=validate_only))

    def describe_client_quotas(
        self, components: Iterable[QuotaFilter] = (), *, strict: bool = False
    ) -> list[QuotaEntry]:
        return self._run(self._a.describe_client_quotas(list(components), strict=strict))

    # -- transactions -----------------------------------------------------------------
    def list_transactions(
        self,
        states: Iterable[str] = (),
        producer_ids: Iterable[int] = (),
        duration_ms: int | None = None,
    ) -> list[TransactionListing]:
        return self._run(self._a.list_transactions(list(states), list(producer_ids), duration_ms))

    def describe_transactions(self, ids: Iterable[str]) -> list[TransactionDescription]:
        return self._run(self._a.describe_transactions(list(ids)))

    def describe_producers(
        self, topic: str, partitions: Iterable[int] | None = None
    ) -> dict[int, list[ProducerState]]:
        parts = None if partitions is None else list(partitions)
        return self._run(self._a.describe_producers(topic, parts))

    def abort_transaction(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int | None = None,
    ) -> None:
        self._run(
            self._a.abort_transaction(
                topic, partition, producer_id, producer_epoch, coordinator_epoch
            )
        )

    def find_hanging(
        self, topics: Iterable[str] | None = None, max_age_ms: int = DEFAULT_MAX_AGE_MS
    ) -> list[HangingTransaction]:
        return self._run(self._a.find_hanging(None if topics is None else list(topics), max_age_ms))

    def complete_transaction(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> None:
        """Commit or abort a prepared transaction (see AsyncAdmin.complete_transaction)."""
        self._run(
            self._a.complete_transaction(transactional_id, producer_id, producer_epoch, commit)
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._a.close())
        finally:
            self._release_loop()


def _in_thread(listener: Any) -> Any:
    """A sync listener as a coroutine function run in a worker thread (so it may block
    on this client); async listeners are used as they are."""
    if asyncio.iscoroutinefunction(listener):
        return listener

    async def run(partitions: set[TopicPartition]) -> Any:
        return await asyncio.to_thread(listener, partitions)

    return run


__all__ = ["Admin", "Consumer", "LogMQError", "LoopThread", "Producer", "RecordFuture"]
