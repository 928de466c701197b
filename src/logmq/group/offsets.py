"""Committed offsets of one consumer group, and its pending transactional offsets.

The store only remembers and serialises; deciding whether a commit is allowed (member
epochs, known partitions, metadata size) is the group's job. Every change returns the
records that make it durable, and :meth:`OffsetStore.replay` rebuilds the same store
from those records, compacted or not.

Transactional offsets (TxnOffsetCommit, KIP-98) wait per producer until the producer's
marker reaches this offsets partition: COMMIT makes them committed, ABORT drops them.
Their records sit in the producer's transactional batches, so the log's order decides
which write of a partition wins: a pending offset only becomes committed if no other
write of that partition (a plain commit, a deletion, another transaction's commit)
came after its record. Each pending offset carries its *position* (the record's log
offset after a reload, a counter above those at run time) to compare with the
positions of other producers' pending offsets; plain writes come after every pending
record there is, so they simply mark them superseded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from .assignors import TopicPartition
from .codec import (
    GroupRecord,
    RecordKey,
    RecordType,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)


@dataclass(slots=True, frozen=True)
class CommittedOffset:
    offset: int  # the next offset the group will read
    metadata: str = ""
    commit_timestamp_ms: int = -1
    # the leader epoch of the last record consumed, as the client committed it (-1: not
    # known); KIP-320 clients compare it with the leader's to detect a truncated log
    leader_epoch: int = -1


class NewOffset(NamedTuple):
    """An offset a client asks to commit. Plain ``(offset, metadata)`` pairs are taken
    too: their leader epoch is unknown (-1)."""

    offset: int
    metadata: str = ""
    leader_epoch: int = -1


# what the commit operations take for each partition
OffsetEntry = NewOffset | tuple[int, str] | tuple[int, str, int]


def new_offset(entry: OffsetEntry) -> NewOffset:
    """``(offset, metadata)`` or ``(offset, metadata, leader_epoch)`` as a NewOffset; a
    negative epoch means unknown, as Kafka's empty Optional."""
    if len(entry) == 2:
        return NewOffset(entry[0], entry[1])
    offset, metadata, epoch = entry
    return NewOffset(offset, metadata, epoch if epoch >= 0 else -1)


@dataclass(slots=True)
class PendingOffset:
    """An offset a transaction committed, waiting for its producer's marker."""

    committed: CommittedOffset
    producer_epoch: int
    position: int  # order of its record among the store's pending records
    superseded: bool = False  # a later write of the partition wins even if it commits


class OpenTxnOffset(NamedTuple):
    """A transactional offset record found in the log without its marker (a reload)."""

    record: GroupRecord  # carries the producer id and epoch
    position: int  # its log offset
    superseded: bool  # a later write of the same key is in the log


class OffsetStore:
    """topic-partition -> CommittedOffset for one group."""

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self._offsets: dict[TopicPartition, CommittedOffset] = {}
        self._pending: dict[int, dict[TopicPartition, PendingOffset]] = {}  # by producer
        self._next_position = 0

    def __len__(self) -> int:
        """The committed offsets (pending ones are not counted: see has_pending)."""
        return len(self._offsets)

    def get(self, tp: TopicPartition) -> CommittedOffset | None:
        return self._offsets.get(tp)

    def fetch(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, CommittedOffset | None]:
        """The committed offsets of ``partitions`` (None for never committed), or all."""
        if partitions is None:
            return dict(sorted(self._offsets.items()))
        return {tp: self._offsets.get(tp) for tp in partitions}

    def commit(self, tp: TopicPartition, committed: CommittedOffset) -> GroupRecord:
        self.put(tp, committed)
        return self.record(tp, committed)

    def put(self, tp: TopicPartition, committed: CommittedOffset) -> None:
        self._offsets[tp] = committed
        self._supersede(tp)

    def record(self, tp: TopicPartition, committed: CommittedOffset) -> GroupRecord:
        """The record that persists ``committed`` (without applying it)."""
        value = {
            "offset": committed.offset,
            "metadata": committed.metadata,
            "ts": committed.commit_timestamp_ms,
        }
        if committed.leader_epoch >= 0:  # absent when unknown: older records read alike
            value["leader_epoch"] = committed.leader_epoch
        return GroupRecord(self._key(tp), encode_value(value))

    def delete(self, partitions: Iterable[TopicPartition]) -> list[GroupRecord]:
        records = []
        for tp in sorted(set(partitions)):
            if self._offsets.pop(tp, None) is not None:
                records.append(GroupRecord(self._key(tp), None))
                self._supersede(tp)
        return records

    # ---- transactional offsets -----------------------------------------------------

    def has_pending(self, tp: TopicPartition | None = None) -> bool:
        """Whether a transaction holds offsets (of ``tp``, or of any partition)."""
        if tp is None:
            return bool(self._pending)
        return any(tp in by_tp for by_tp in self._pending.values())

    def pending_partitions(self) -> set[TopicPartition]:
        return {tp for by_tp in self._pending.values() for tp in by_tp}

    def pending_producers(self) -> list[int]:
        return sorted(self._pending)

    def pending(self, producer_id: int) -> dict[TopicPartition, PendingOffset]:
        return dict(self._pending.get(producer_id, {}))

    def txn_record(
        self,
        producer_id: int,
        producer_epoch: int,
        tp: TopicPartition,
        committed: CommittedOffset,
    ) -> GroupRecord:
        """The record of a transactional commit (without applying it): the same key and
        value as a plain commit, in the producer's batch."""
        plain = self.record(tp, committed)
        return GroupRecord(plain.key, plain.value, producer_id, producer_epoch)

    def stage(
        self, producer_id: int, producer_epoch: int, tp: TopicPartition, committed: CommittedOffset
    ) -> None:
        """Hold ``committed`` for ``tp`` until the producer's marker (a later commit of
        the same producer and partition replaces it, as its record is later)."""
        self._add_pending(producer_id, tp, PendingOffset(committed, producer_epoch, -1))

    def complete(self, producer_id: int, commit: bool) -> list[TopicPartition]:
        """The producer's marker: its pending offsets become committed (those no later
        write superseded) or are dropped; returns the partitions whose offset changed."""
        pending = self._pending.pop(producer_id, None)
        if not pending or not commit:
            return []
        changed = []
        for tp, entry in pending.items():
            if entry.superseded:
                continue
            self._offsets[tp] = entry.committed
            changed.append(tp)
            for other in self._pending.values():
                later = other.get(tp)
                if later is not None and later.position < entry.position:
                    later.superseded = True
        return changed

    def replay_pending(self, open_offset: OpenTxnOffset) -> None:
        """Restore a pending offset from its record (found without a marker)."""
        record = open_offset.record
        key = decode_key(record.key)
        if key.type is not RecordType.OFFSET_COMMIT or key.group_id != self.group_id:
            raise ValueError(f"not an offset record of group {self.group_id!r}")
        if record.value is None:
            raise ValueError("a transactional offset tombstone")
        entry = PendingOffset(
            self._parse(record.value),
            record.producer_epoch,
            open_offset.position,
            open_offset.superseded,
        )
        self._add_pending(record.producer_id, (key.topic, key.partition), entry)

    def supersede_topics(self, topics: Iterable[str]) -> None:
        """Deleted topics: their pending offsets wait for the marker, then count for
        nothing (a transaction's marker ends them, a commit must not revive them)."""
        gone = set(topics)
        for by_tp in self._pending.values():
            for tp, entry in by_tp.items():
                if tp[0] in gone:
                    entry.superseded = True

    def _add_pending(self, producer_id: int, tp: TopicPartition, entry: PendingOffset) -> None:
        if entry.position < 0:
            entry.position = self._next_position
        self._next_position = max(self._next_position, entry.position + 1)
        by_tp = self._pending.setdefault(producer_id, {})
        by_tp.pop(tp, None)
        by_tp[tp] = entry

    def _supersede(self, tp: TopicPartition) -> None:
        """A plain write of ``tp`` comes after every pending record of it."""
        for by_tp in self._pending.values():
            entry = by_tp.get(tp)
            if entry is not None:
                entry.superseded = True

    def replay(self, records: Iterable[GroupRecord]) -> None:
        """Apply offset records of this group; other records are skipped."""
        for record in records:
            key = decode_key(record.key)
            if key.type is RecordType.OFFSET_COMMIT and key.group_id == self.group_id:
                self.apply(key, record.value)

    def apply(self, key: RecordKey, value: bytes | None) -> None:
        tp = (key.topic, key.partition)
        if value is None:
            self._offsets.pop(tp, None)
            return
        self._offsets[tp] = self._parse(value)

    @staticmethod
    def _parse(value: bytes) -> CommittedOffset:
        fields = decode_value(value)
        try:
            return CommittedOffset(
                int(fields["offset"]),
                str(fields.get("metadata", "")),
                int(fields.get("ts", -1)),
                int(fields.get("leader_epoch", -1)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"corrupt offset commit record: {exc!r}") from exc

    def _key(self, tp: TopicPartition) -> bytes:
        return encode_key(
            RecordKey(RecordType.OFFSET_COMMIT, self.group_id, topic=tp[0], partition=tp[1])
        )
