"""Producer-side batching: records in, closed batches out (sans-IO, no clock of its own).

Each partition has at most one open batch that ``send()`` appends to (a list append and
a size estimate: the cheap per-record path) and a queue of closed batches waiting for
the sender. A batch closes when it reaches ``batch_size`` bytes or ``max_batch_records``
records, when it has lingered ``linger_ms``, or on flush. Times are passed in as
milliseconds so tests drive the accumulator with a fake clock.
"""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from logmq.records import RecordMetadata
from logmq.storage.batch import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    Header,
    encode_rows,
    encode_values,
)

TopicPartition = tuple[str, int]
RECORD_OVERHEAD = 12  # v2 varint framing per record, roughly: an estimate, not a promise
_LOCK = threading.Lock()  # guards lazy waiter creation against completion in another thread


class ProducerBatch:
    """Records for one partition that travel (and are retried) as one encoded batch.

    Holds either per-record rows already in wire form (``records``: ``(index,
    timestamp - first_timestamp, key, value, headers or None)``, so encoding is one
    compiled call) or, for ``send_batch``, parallel value and key lists sharing one
    timestamp. Completion is signalled once; waiters are made
    lazily (an asyncio future, a threading event, callbacks) so a batch nobody waits on
    costs nothing extra.
    """

    __slots__ = (
        "_af",
        "_callbacks",
        "_event",
        "attempts",
        "base_offset",
        "base_sequence",
        "bulk_keys",
        "bulk_timestamp",
        "bulk_values",
        "created",
        "deadline",
        "done",
        "error",
        "first_timestamp",
        "log_append_time",
        "partition",
        "payload",
        "producer_epoch",
        "producer_id",
        "records",
        "retry_at",
        "size",
        "topic",
    )

    def __init__(self, topic: str, partition: int, created: float) -> None:
        self.topic = topic
        self.partition = partition
        self.created = created
        self.records: list[tuple[int, int, bytes | None, bytes | None, list[Header] | None]] = []
        self.first_timestamp = 0
        self.bulk_values: Sequence[bytes | None] | None = None
        self.bulk_keys: Sequence[bytes | None] | None = None
        self.bulk_timestamp = 0
        self.size = 0
        self.payload: bytes | None = None
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self.base_sequence = NO_SEQUENCE
        self.attempts = 0
        self.retry_at = 0.0
        self.deadline = float("inf")
        self.done = False
        self.error: BaseException | None = None
        self.base_offset = -1
        self.log_append_time = -1
        self._af = None
        self._event: threading.Event | None = None
        self._callbacks: list[Callable[[], None]] | None = []

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)

    @property
    def record_count(self) -> int:
        return len(self.bulk_values) if self.bulk_values is not None else len(self.records)

    def encode(
        self,
        *,
        compression: int,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        base_sequence: int = NO_SEQUENCE,
    ) -> bytes:
        """Encode once; retries resend these exact bytes so the broker can deduplicate."""
        if self.payload is None:
            self.producer_id = producer_id
            self.producer_epoch = producer_epoch
            self.base_sequence = base_sequence
            if self.bulk_values is not None:
                self.payload = encode_values(
                    self.bulk_values,
                    timestamp=self.bulk_timestamp,
                    keys=self.bulk_keys,
                    compression=compression,
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    base_sequence=base_sequence,
                )
            else:
                self.payload = encode_rows(
                    self.records,
                    first_timestamp=self.first_timestamp,
                    compression=compression,
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    base_sequence=base_sequence,
                )
        return self.payload

    # -- completion ---------------------------------------------------------------
    def complete(self, base_offset: int, log_append_time: int = -1) -> None:
        self.base_offset = base_offset
        self.log_append_time = log_append_time
        self._finish()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._finish()

    def _finish(self) -> None:
        with _LOCK:
            if self.done:
                return
            self.done = True
            event, callbacks, self._callbacks = self._event, self._callbacks, None
        # Drop the records: they are encoded or no longer needed; handles keep the batch.
        self.payload = None
        af = self._af
        if af is not None and not af.done():
            af.set_result(None)
        if event is not None:
            event.set()
        for cb in callbacks or ():
            cb()

    def add_callback(self, cb: Callable[[], None]) -> None:
        """Call ``cb()`` once the batch is done (at once if it already is)."""
        with _LOCK:
            if not self.done:
                assert self._callbacks is not None
                self._callbacks.append(cb)
                return
        cb()

    def async_future(self, loop):  # -> asyncio.Future[None]
        """A future on ``loop`` resolved at completion (create and await it on the loop)."""
        if self._af is None:
            self._af = loop.create_future()
            if self.done:
                self._af.set_result(None)
        return self._af

    def wait(self, timeout: float | None = None) -> bool:
        """Block the calling thread until done; False on timeout."""
        if self.done:
            return True
        with _LOCK:
            if self.done:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def metadata(self, index: int) -> RecordMetadata:
        """The outcome for the ``index``-th record; raises the batch's error."""
        if self.error is not None:
            raise self.error
        if self.log_append_time >= 0:
            ts = self.log_append_time
        elif self.bulk_values is not None:
            ts = self.bulk_timestamp
        else:
            ts = self.first_timestamp + self.records[index][1]
        offset = self.base_offset + index if self.base_offset >= 0 else -1
        return RecordMetadata(self.topic, self.partition, offset, ts)

    def __repr__(self) -> str:
        return (
            f"ProducerBatch({self.topic}-{self.partition}, n={self.record_count}, "
            f"seq={self.base_sequence}, done={self.done})"
        )


class RecordAccumulator:
    """Open and closed batches per partition, plus the sticky choice for keyless records.

    Not thread-safe by itself: the producer holds ``lock`` around every call, which is
    cheap when uncontended and lets blocking clients append from their own threads.
    """

    def __init__(
        self,
        *,
        batch_size: int = 16384,
        max_batch_records: int = 10000,
        linger_ms: float = 5.0,
        delivery_timeout_ms: float = 120000.0,
        clock: Callable[[], float] = lambda: time.monotonic() * 1000,
    ) -> None:
        if batch_size <= 0 or max_batch_records <= 0 or linger_ms < 0:
            raise ValueError("batch_size and max_batch_records must be > 0, linger_ms >= 0")
        self.batch_size = batch_size
        self.max_batch_records = max_batch_records
        self.linger_ms = linger_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.clock = clock  # milliseconds; used only when a caller passes no ``now``
        self.lock = threading.Lock()
        self.buffered_bytes = 0
        self._open: dict[TopicPartition, ProducerBatch] = {}
        self._closed: dict[TopicPartition, collections.deque[ProducerBatch]] = {}
        self._sticky: dict[str, int] = {}

    # -- appending ----------------------------------------------------------------
    def sticky_partition(self, topic: str, num_partitions: int) -> int:
        """Keep filling one partition until its batch closes, then move to another."""
        p = self._sticky.get(topic)
        if p is None or p >= num_partitions:
            p = random.randrange(num_partitions)
            self._sticky[topic] = p
        return p

    def append(
        self,
        topic: str,
        partition: int,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header] | None,
        now: float | None = None,
    ) -> tuple[ProducerBatch, int, bool]:
        """Add one record; returns (batch, index in batch, sender needs waking).

        ``now`` (ms) is read from the clock only when a batch is created.
        """
        size = RECORD_OVERHEAD + len(value) if value is not None else RECORD_OVERHEAD
        if key is not None:
            size += len(key)
        if headers:
            size += sum(len(h[0]) + len(h[1] or b"") + 4 for h in headers)
        tp = (topic, partition)
        batch = self._open.get(tp)
        wake = False
        if batch is None or (batch.size + size > self.batch_size and batch.records):
            batch = self._new_batch(tp, batch, now)
            wake = True  # the sender must learn the new linger deadline
        records = batch.records
        n = len(records)
        if not n:
            batch.first_timestamp = timestamp
        records.append((n, timestamp - batch.first_timestamp, key, value, headers or None))
        batch.size += size
        self.buffered_bytes += size
        if batch.size >= self.batch_size or len(records) >= self.max_batch_records:
            self._close(tp, batch)
            wake = True
        return batch, n, wake

    def _new_batch(
        self, tp: TopicPartition, full: ProducerBatch | None, now: float | None
    ) -> ProducerBatch:
        if full is not None:
            self._close(tp, full)
        if now is None:
            now = self.clock()
        batch = ProducerBatch(tp[0], tp[1], now)
        batch.deadline = now + self.delivery_timeout_ms
        self._open[tp] = batch
        return batch

    def append_bulk(
        self,
        topic: str,
        partition: int,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        timestamp: int,
        size: int,
        now: float,
    ) -> ProducerBatch:
        """Queue a ready-made batch of values (send_batch); keeps order with appended ones."""
        tp = (topic, partition)
        open_batch = self._open.get(tp)
        if open_batch is not None:
            self._close(tp, open_batch)
        batch = ProducerBatch(topic, partition, now)
        batch.deadline = now + self.delivery_timeout_ms
        batch.bulk_values = values
        batch.bulk_keys = keys
        batch.bulk_timestamp = timestamp
        batch.size = size
        self.buffered_bytes += size
        self._closed.setdefault(tp, collections.deque()).append(batch)
        if self._sticky.get(topic) == partition:
            del self._sticky[topic]
        return batch

    def _close(self, tp: TopicPartition, batch: ProducerBatch) -> None:
        del self._open[tp]
        self._closed.setdefault(tp, collections.deque()).append(batch)
        if self._sticky.get(tp[0]) == tp[1]:
            del self._sticky[tp[0]]

    # -- draining -----------------------------------------------------------------
    def partitions(self) -> list[TopicPartition]:
        """Partitions holding any batch, open or closed."""
        tps = [tp for tp, q in self._closed.items() if q]
        tps.extend(tp for tp in self._open if tp not in self._closed or not self._closed[tp])
        return tps

    def ready(self, tp: TopicPartition, now: float, force: bool = False) -> bool:
        """Whether ``tp`` has a batch the sender may take now."""
        q = self._closed.get(tp)
        if q:
            return True
        batch = self._open.get(tp)
        return batch is not None and (force or now - batch.created >= self.linger_ms)

    def pop(self, tp: TopicPartition, now: float, force: bool = False) -> ProducerBatch | None:
        """The oldest batch of ``tp`` if one is ready (closing a lingered open batch)."""
        q = self._closed.get(tp)
        if q:
            batch = q.popleft()
            if not q:
                del self._closed[tp]
            return batch
        batch = self._open.get(tp)
        if batch is not None and (force or now - batch.created >= self.linger_ms):
            self._close(tp, batch)
            return self.pop(tp, now)
        return None

    def peek(self, tp: TopicPartition) -> ProducerBatch | None:
        q = self._closed.get(tp)
        if q:
            return q[0]
        return self._open.get(tp)

    def next_deadline(self) -> float | None:
        """When the earliest open batch finishes lingering (None if nothing is open)."""
        if not self._open:
            return None
        return min(b.created for b in self._open.values()) + self.linger_ms

    def release(self, batch: ProducerBatch) -> None:
        """Give back a finished batch's share of the buffer."""
        self.buffered_bytes -= batch.size

    def close_all(self) -> None:
        """Close every open batch (flush)."""
        for tp, batch in list(self._open.items()):
            self._close(tp, batch)

    def remove_partition(self, tp: TopicPartition) -> list[ProducerBatch]:
        """Take every batch still queued for ``tp`` out (to fail them); returns them."""
        out = list(self._closed.pop(tp, ()))
        batch = self._open.pop(tp, None)
        if batch is not None:
            out.append(batch)
        return out

    def batches(self) -> Iterator[ProducerBatch]:
        for q in self._closed.values():
            yield from q
        yield from self._open.values()

    def __len__(self) -> int:
        return len(self._open) + sum(len(q) for q in self._closed.values())
