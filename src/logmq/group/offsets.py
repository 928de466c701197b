"""Committed offsets of one consumer group.

The store only remembers and serialises; deciding whether a commit is allowed (member
epochs, known partitions, metadata size) is the group's job. Every change returns the
records that make it durable, and :meth:`OffsetStore.replay` rebuilds the same store
from those records, compacted or not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

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


class OffsetStore:
    """topic-partition -> CommittedOffset for one group."""

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self._offsets: dict[TopicPartition, CommittedOffset] = {}

    def __len__(self) -> int:
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

    def record(self, tp: TopicPartition, committed: CommittedOffset) -> GroupRecord:
        """The record that persists ``committed`` (without applying it)."""
        value = {
            "offset": committed.offset,
            "metadata": committed.metadata,
            "ts": committed.commit_timestamp_ms,
        }
        return GroupRecord(self._key(tp), encode_value(value))

    def delete(self, partitions: Iterable[TopicPartition]) -> list[GroupRecord]:
        records = []
        for tp in sorted(set(partitions)):
            if self._offsets.pop(tp, None) is not None:
                records.append(GroupRecord(self._key(tp), None))
        return records

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
        fields = decode_value(value)
        try:
            committed = CommittedOffset(
                int(fields["offset"]), str(fields.get("metadata", "")), int(fields.get("ts", -1))
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"corrupt offset commit record: {exc!r}") from exc
        self._offsets[tp] = committed

    def _key(self, tp: TopicPartition) -> bytes:
        return encode_key(
            RecordKey(RecordType.OFFSET_COMMIT, self.group_id, topic=tp[0], partition=tp[1])
        )
