"""The offset operations of a ConsumerGroup: who may commit, and what is accepted.

OffsetStore (group/offsets.py) only keeps committed offsets; the rules live here:
members commit with their current epoch (zombies are fenced), admin resets and
deletions need an empty group, and one commit is written whole or not at all when it
is too big for the log.

A mixin so that group/consumer_group.py keeps to membership, queries and persistence;
accepted commits go to the group's outbox like every other state change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set

from ..errors import ErrorCode
from .assignors import TopicPartition
from .codec import GroupRecord
from .model import GroupConfig, Member
from .offsets import CommittedOffset, OffsetEntry, OffsetStore, new_offset


class OffsetCommitsMixin:
    """Mixed into ConsumerGroup: OffsetCommit, OffsetFetch, resets and deletions."""

    # provided by ConsumerGroup
    config: GroupConfig
    offsets: OffsetStore
    _topic_partitions: Mapping[str, int]
    _members: dict[str, Member]
    _outbox: list[GroupRecord]

    def commit_offsets(
        self,
        member_id: str,
        member_epoch: int,
        offsets: Mapping[TopicPartition, OffsetEntry],
        now_ms: int = 0,
    ) -> dict[TopicPartition, ErrorCode]:
        """Commit ``{tp: (offset, metadata[, leader_epoch])}``; an error code per partition.

        Members must commit with their current epoch: a zombie (expired, replaced or
        behind) is rejected for every partition and nothing is written. Without a member
        id and with epoch -1 only an empty group accepts commits (manual assignment).
        Valid partitions are committed even when others in the request are rejected.
        """
        error = self._commit_member_error(member_id, member_epoch)
        if error is not ErrorCode.NONE:
            return {tp: error for tp in offsets}
        return self._write_offsets(offsets, now_ms)

    def txn_offset_commit(
        self,
        producer_id: int,
        producer_epoch: int,
        member_id: str,
        generation: int,
        instance_id: str | None,
        offsets: Mapping[TopicPartition, OffsetEntry],
        now_ms: int = 0,
    ) -> dict[TopicPartition, ErrorCode]:
        """TxnOffsetCommit: hold ``{tp: (offset, metadata[, leader_epoch])}`` until the
        producer's marker (which commits them as a plain commit would have).

        Without a member id and with generation -1 (always so before v3) nothing is
        checked: the transaction coordinator vouches for the producer. Otherwise the
        member must be current, as for a plain commit.
        """
        if member_id or generation >= 0 or instance_id is not None:
            error = self._txn_member_error(member_id, generation, instance_id)
            if error is not ErrorCode.NONE:
                return {tp: error for tp in offsets}
        return self._write_offsets(offsets, now_ms, (producer_id, producer_epoch))

    def fetch_offsets(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, CommittedOffset | None]:
        return self.offsets.fetch(partitions)

    def alter_offsets(
        self, offsets: Mapping[TopicPartition, OffsetEntry], now_ms: int = 0
    ) -> dict[TopicPartition, ErrorCode]:
        """Admin reset: only while nobody consumes (else NON_EMPTY_GROUP everywhere)."""
        if self._members:
            return {tp: ErrorCode.NON_EMPTY_GROUP for tp in offsets}
        return self._write_offsets(offsets, now_ms)

    def delete_offsets(self, partitions: Iterable[TopicPartition]) -> ErrorCode:
        if self._members:
            return ErrorCode.NON_EMPTY_GROUP
        self._outbox.extend(self.offsets.delete(partitions))
        return ErrorCode.NONE

    def delete_topic_offsets(self, topics: Set[str]) -> None:
        """The topics were deleted: forget their offsets, members or not (as Kafka does)."""
        doomed = [tp for tp in self.offsets.fetch() if tp[0] in topics]
        self._outbox.extend(self.offsets.delete(doomed))
        self.offsets.supersede_topics(topics)

    def _txn_member_error(
        self, member_id: str, member_epoch: int, instance_id: str | None
    ) -> ErrorCode:
        """A consumer-protocol member commits transactionally at its current epoch;
        a stale one hears ILLEGAL_GENERATION, which every transactional client knows."""
        member = self._members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if member_epoch != member.member_epoch:
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    def _commit_member_error(self, member_id: str, member_epoch: int) -> ErrorCode:
        if not member_id:
            if member_epoch < 0 and not self._members:
                return ErrorCode.NONE
            return ErrorCode.UNKNOWN_MEMBER_ID
        member = self._members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if member_epoch > member.member_epoch:
            return ErrorCode.FENCED_MEMBER_EPOCH
        if member_epoch < member.member_epoch:
            return ErrorCode.STALE_MEMBER_EPOCH
        return ErrorCode.NONE

    def _write_offsets(
        self,
        offsets: Mapping[TopicPartition, OffsetEntry],
        now_ms: int,
        txn: tuple[int, int] | None = None,
    ) -> dict[TopicPartition, ErrorCode]:
        """Commit the valid partitions, all or none of them if they are too big together;
        with ``txn`` (producer id, epoch) as that transaction's pending offsets."""
        errors: dict[TopicPartition, ErrorCode] = {}
        accepted: list[tuple[TopicPartition, CommittedOffset]] = []
        for tp, entry in offsets.items():
            offset, metadata, leader_epoch = new_offset(entry)
            topic, partition = tp
            if not 0 <= partition < self._topic_partitions.get(topic, 0):
                errors[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif len(metadata.encode()) > self.config.max_metadata_bytes:
                errors[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            elif offset < 0:
                errors[tp] = ErrorCode.INVALID_REQUEST
            else:
                accepted.append((tp, CommittedOffset(offset, metadata, now_ms, leader_epoch)))
                errors[tp] = ErrorCode.NONE
        if txn is None:
            records = [self.offsets.record(tp, committed) for tp, committed in accepted]
        else:
            records = [self.offsets.txn_record(*txn, tp, c) for tp, c in accepted]
        size = sum(len(r.key) + len(r.value or b"") for r in records)
        if size > self.config.max_commit_bytes:
            return {tp: ErrorCode.INVALID_COMMIT_OFFSET_SIZE for tp in offsets}
        for tp, committed in accepted:
            if txn is None:
                self.offsets.put(tp, committed)
            else:
                self.offsets.stage(*txn, tp, committed)
        self._outbox.extend(records)
        return errors
