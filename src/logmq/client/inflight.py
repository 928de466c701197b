"""Sequence numbers, in-flight limits and retry order for the producer (sans-IO).

The idempotent producer gives each partition's batches consecutive sequence numbers;
the broker appends a batch only if its sequence follows the last one it appended, and
acknowledges a repeat without appending it again. So a retry must resend the same
bytes, batches of a partition must reach the broker in sequence order, and an
OUT_OF_ORDER_SEQUENCE_NUMBER is only a real gap when no earlier batch of the partition
is still on its way. This class decides all of that from events; the sender does I/O.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Iterator

from logmq.client.accumulator import ProducerBatch, TopicPartition
from logmq.errors import ErrorCode
from logmq.storage.batch import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE


class Outcome(enum.Enum):
    COMPLETE = "complete"  # acknowledged (or a duplicate of an acknowledged batch)
    RETRY = "retry"  # queued to be resent, same bytes, after the backoff
    FAIL = "fail"  # give up on this batch with the broker's error
    FATAL = "fatal"  # a real sequence gap: this partition's pending batches fail


_REFRESH = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.NETWORK_EXCEPTION,
    }
)


def needs_metadata(code: int) -> bool:
    """Whether an error means the leader may have moved."""
    return code in _REFRESH


class DeliveryTracker:
    """Per-partition sequences, batches in flight and batches waiting to be resent."""

    def __init__(
        self,
        *,
        idempotent: bool,
        max_in_flight: int = 5,
        retries: int = 2**31 - 1,
        retry_backoff_ms: float = 100,
    ) -> None:
        self.idempotent = idempotent
        self.max_in_flight = max_in_flight
        self.retries = retries
        self.retry_backoff_ms = retry_backoff_ms
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self.needs_new_producer_id = False
        self._next_seq: dict[TopicPartition, int] = {}
        self._in_flight: dict[TopicPartition, collections.deque[ProducerBatch]] = {}
        self._retry: dict[TopicPartition, list[ProducerBatch]] = {}

    def set_producer(self, producer_id: int, producer_epoch: int) -> None:
        """A new producer id starts every partition's sequence at 0."""
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self._next_seq.clear()
        self.needs_new_producer_id = False

    # -- what may be sent -----------------------------------------------------------
    def room(self, tp: TopicPartition) -> int:
        flight = self._in_flight.get(tp)
        return self.max_in_flight - (len(flight) if flight else 0)

    def has_retries(self, tp: TopicPartition) -> bool:
        return bool(self._retry.get(tp))

    def retry_partitions(self) -> list[TopicPartition]:
        return [tp for tp, r in self._retry.items() if r]

    def take_retries(self, tp: TopicPartition, now: float) -> list[ProducerBatch]:
        """Batches to resend now, in sequence order: only once nothing of ``tp`` is in
        flight (so the resent ones cannot overtake older ones) and the backoff passed."""
        retry = self._retry.get(tp)
        if not retry or self._in_flight.get(tp) or retry[0].retry_at > now:
            return []
        room = self.room(tp)
        taken = retry[:room]
        del retry[:room]
        if not retry:
            del self._retry[tp]
        return taken

    def expire_retries(self, tp: TopicPartition, now: float) -> list[ProducerBatch]:
        """Remove and return ``tp``'s batches waiting to be resent whose delivery deadline
        has passed, when nothing of ``tp`` is in flight. For a partition with no leader
        (its topic deleted): they were never resent, so no answer would ever fail them."""
        retry = self._retry.get(tp)
        if not retry or self._in_flight.get(tp):
            return []
        expired = [b for b in retry if b.deadline <= now]
        if not expired:
            return []
        retry[:] = [b for b in retry if b.deadline > now]
        if not retry:
            del self._retry[tp]
        if self.idempotent and any(b.base_sequence >= 0 for b in expired):
            self.needs_new_producer_id = True  # as for any batch given up (on_result)
        return expired

    def next_retry_time(self) -> float | None:
        times = [
            r[0].retry_at for tp, r in self._retry.items() if r and not self._in_flight.get(tp)
        ]
        return min(times) if times else None

    # -- sending and results --------------------------------------------------------
    def prepare(self, batch: ProducerBatch, compression: int) -> bytes:
        """Encode a batch on its first send, assigning its sequence; later sends reuse it."""
        if batch.payload is None:
            seq = NO_SEQUENCE
            if self.idempotent:
                seq = self._next_seq.get(batch.tp, 0)
                self._next_seq[batch.tp] = (seq + batch.record_count) & 0x7FFFFFFF
            batch.encode(
                compression=compression,
                producer_id=self.producer_id if self.idempotent else NO_PRODUCER_ID,
                producer_epoch=self.producer_epoch if self.idempotent else NO_PRODUCER_EPOCH,
                base_sequence=seq,
            )
        assert batch.payload is not None
        return batch.payload

    def sent(self, batch: ProducerBatch) -> None:
        batch.attempts += 1
        self._in_flight.setdefault(batch.tp, collections.deque()).append(batch)

    def on_result(self, batch: ProducerBatch, code: int, now: float) -> Outcome:
        """Record a response (or a connection failure as NETWORK_EXCEPTION) for a batch."""
        tp = batch.tp
        flight = self._in_flight.get(tp)
        if flight is not None:
            try:
                flight.remove(batch)
            except ValueError:
                pass
            if not flight:
                del self._in_flight[tp]
        if code in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
            return Outcome.COMPLETE
        if code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and self.idempotent:
            if self._earlier_pending(batch):
                self._queue_retry(batch, now)  # its predecessor is being resent: no gap
                return Outcome.RETRY
            self.needs_new_producer_id = True
            return Outcome.FATAL
        try:
            retriable = ErrorCode(code).retriable
        except ValueError:
            retriable = False
        if retriable and batch.attempts <= self.retries and now < batch.deadline:
            self._queue_retry(batch, now)
            return Outcome.RETRY
        if self.idempotent and batch.base_sequence >= 0:
            # The broker never appended these sequences: later ones would be a gap.
            self.needs_new_producer_id = True
        return Outcome.FAIL

    def drop_retries(self, tp: TopicPartition) -> list[ProducerBatch]:
        """Remove and return the batches of ``tp`` waiting to be resent (after FATAL)."""
        return self._retry.pop(tp, [])

    def _earlier_pending(self, batch: ProducerBatch) -> bool:
        tp = batch.tp
        return any(
            other.producer_id == batch.producer_id
            and other.base_sequence < batch.base_sequence
            and not other.done
            for other in (*self._in_flight.get(tp, ()), *self._retry.get(tp, ()))
        )

    def _queue_retry(self, batch: ProducerBatch, now: float) -> None:
        batch.retry_at = now + self.retry_backoff_ms
        r = self._retry.setdefault(batch.tp, [])
        r.append(batch)
        r.sort(key=lambda b: (b.producer_id, b.base_sequence))

    # -- introspection ----------------------------------------------------------------
    def pending(self) -> Iterator[ProducerBatch]:
        """Every batch in flight or waiting to be resent."""
        for q in self._in_flight.values():
            yield from q
        for r in self._retry.values():
            yield from r

    @property
    def busy(self) -> bool:
        return any(self._in_flight.values()) or any(self._retry.values())
