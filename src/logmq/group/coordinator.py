"""The groups of one ``__consumer_offsets`` partition, as its leader coordinates them.

A broker runs one :class:`GroupCoordinator` per offsets partition it leads: it builds it
from the partition's records when it becomes leader (:meth:`GroupCoordinator.replay`)
and drops it when it stops leading. This class routes requests to the right group, a
:class:`ConsumerGroup` (the consumer protocol: native clients, KIP-848) or a
:class:`ClassicGroup` (Kafka's JoinGroup/SyncGroup), validates group ids and collects the
records every group wants persisted and the answers of parked requests; like the groups
it is pure (no clock, no I/O).

Transactional offsets (TxnOffsetCommit) wait per producer in the group's offset store
until the producer's marker lands on this partition (:meth:`complete_txn`); the
coordinator indexes which groups each producer touched, and fences a producer epoch
older than one it has already seen.

One group id is one kind of group at a time: an empty group changes kind (keeping its
offsets) when a member of the other protocol joins; a group with members refuses the
other protocol (JoinGroup: INCONSISTENT_GROUP_PROTOCOL; a consumer-protocol heartbeat:
GROUP_ID_NOT_FOUND, as Kafka with online migration disabled).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set
from types import MappingProxyType
from typing import Any

from ..errors import ErrorCode
from .assignors import Assignor, StickyAssignor, TopicPartition
from .classic_group import ClassicGroup, Protocols
from .codec import GroupRecord, RecordType, coordinator_partition, decode_key
from .consumer_group import NO_OPTIONS, ConsumerGroup
from .model import (
    JOIN_EPOCH,
    DescribeAnswer,
    GroupConfig,
    GroupListing,
    HeartbeatResult,
    JoinAnswer,
    LeaveAnswer,
    MemberOptions,
    OffsetFetchAnswer,
    SyncAnswer,
)
from .offsets import OffsetEntry, OpenTxnOffset


class GroupCoordinator:
    """Routes group requests for the groups that hash to ``partition``."""

    def __init__(
        self,
        partition: int = 0,
        partition_count: int = 1,
        config: GroupConfig | None = None,
        assignor_factory: Callable[[], Assignor] = StickyAssignor,
        topic_partitions: Mapping[str, int] | None = None,
        member_id_factory: Callable[[], str] | None = None,
    ) -> None:
        self.partition = partition
        self.partition_count = partition_count
        self.config = config or GroupConfig()
        self._assignor_factory = assignor_factory
        # one read-only mapping shared by every group, replaced (never mutated) on update
        self._topic_partitions = MappingProxyType(dict(topic_partitions or {}))
        self._member_id_factory = member_id_factory
        self._groups: dict[str, ConsumerGroup | ClassicGroup] = {}
        self._touched: dict[str, None] = {}  # groups with records to take, in order
        self._outbox: list[GroupRecord] = []  # records of groups already dropped
        self._completions: list[tuple[int, Any]] = []  # parked requests answered
        # producer id -> groups holding its pending offsets, and its newest epoch
        self._txn_groups: dict[int, set[str]] = {}
        self._txn_epochs: dict[int, int] = {}

    def group_ids(self) -> list[str]:
        return sorted(self._groups)

    def list_groups(self) -> list[GroupListing]:
        return [self._groups[g].listing() for g in sorted(self._groups)]

    def member_count(self) -> int:
        return sum(g.member_count for g in self._groups.values())

    def group(self, group_id: str) -> ConsumerGroup | ClassicGroup | None:
        return self._groups.get(group_id)

    def check_group_id(self, group_id: str) -> ErrorCode:
        """INVALID_GROUP_ID for an empty id, NOT_COORDINATOR if it hashes elsewhere."""
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        if coordinator_partition(group_id, self.partition_count) != self.partition:
            return ErrorCode.NOT_COORDINATOR
        return ErrorCode.NONE

    # ---- requests ------------------------------------------------------------------

    def heartbeat(
        self,
        group_id: str,
        member_id: str,
        member_epoch: int,
        instance_id: str | None = None,
        subscribed_topics: Iterable[str] | None = None,
        owned_partitions: Iterable[TopicPartition] | None = None,
        now_ms: int = 0,
        options: MemberOptions = NO_OPTIONS,
    ) -> HeartbeatResult:
        error = self.check_group_id(group_id)
        group = self._groups.get(group_id)
        if error is ErrorCode.NONE and group is None and member_epoch != JOIN_EPOCH:
            error = ErrorCode.UNKNOWN_MEMBER_ID
        if error is not ErrorCode.NONE:
            return HeartbeatResult(member_id, member_epoch, None, error)
        if isinstance(group, ClassicGroup):
            if not group.is_empty:
                return HeartbeatResult(member_id, member_epoch, None, ErrorCode.GROUP_ID_NOT_FOUND)
            group = self._convert(group)
        group = group or self._create(group_id)
        assert isinstance(group, ConsumerGroup)
        result = group.heartbeat(
            member_id,
            member_epoch,
            instance_id,
            subscribed_topics,
            owned_partitions,
            now_ms,
            options,
        )
        self._touched[group_id] = None
        self._discard_if_blank(group_id)
        return result

    # ---- the classic protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) --------

    def join_group(
        self,
        ticket: int,
        group_id: str,
        member_id: str,
        instance_id: str | None,
        protocol_type: str,
        protocols: Protocols,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_id: str = "",
        client_host: str = "",
        require_known_member_id: bool = True,
        now_ms: int = 0,
    ) -> JoinAnswer | Any:
        """A JoinGroup: its answer, or PARKED (see :meth:`take_completions`)."""
        error = self.check_group_id(group_id)
        group = self._groups.get(group_id)
        if error is ErrorCode.NONE and group is None and member_id:
            error = ErrorCode.UNKNOWN_MEMBER_ID
        if error is ErrorCode.NONE and isinstance(group, ConsumerGroup) and not group.is_empty:
            error = ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        if error is not ErrorCode.NONE:
            return JoinAnswer(error, member_id)
        if isinstance(group, ConsumerGroup):
            group = self._convert(group)
        group = group or self._create_classic(group_id)
        assert isinstance(group, ClassicGroup)
        answer = group.join(
            ticket,
            member_id,
            instance_id,
            protocol_type,
            protocols,
            session_timeout_ms,
            rebalance_timeout_ms,
            client_id,
            client_host,
            require_known_member_id,
            now_ms,
        )
        self._done(group_id)
        return answer

    def sync_group(
        self,
        ticket: int,
        group_id: str,
        member_id: str,
        instance_id: str | None,
        generation: int,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: Mapping[str, bytes],
        now_ms: int = 0,
    ) -> SyncAnswer | Any:
        group = self._classic(group_id)
        if isinstance(group, ErrorCode):
            return SyncAnswer(group)
        answer = group.sync(
            ticket,
            member_id,
            instance_id,
            generation,
            protocol_type,
            protocol_name,
            assignments,
            now_ms,
        )
        self._done(group_id)
        return answer

    def classic_heartbeat(
        self, group_id: str, member_id: str, instance_id: str | None, generation: int, now_ms: int
    ) -> ErrorCode:
        group = self._classic(group_id)
        if isinstance(group, ErrorCode):
            return group
        return group.heartbeat(member_id, instance_id, generation, now_ms)

    def leave_group(
        self, group_id: str, members: Iterable[tuple[str, str | None]], now_ms: int = 0
    ) -> LeaveAnswer:
        members = list(members)
        group = self._classic(group_id)
        if isinstance(group, ErrorCode):
            return LeaveAnswer(group, (group,) * len(members))
        result = group.leave(members, now_ms)
        self._done(group_id)
        return result

    def take_completions(self) -> list[tuple[int, Any]]:
        """(ticket, answer) of every parked request answered since the last call."""
        done, self._completions = self._completions, []
        return done

    def _classic(self, group_id: str) -> ClassicGroup | ErrorCode:
        """The classic group a member of one addresses, or the error to answer."""
        error = self.check_group_id(group_id)
        if error is not ErrorCode.NONE:
            return error
        group = self._groups.get(group_id)
        if not isinstance(group, ClassicGroup):
            return ErrorCode.UNKNOWN_MEMBER_ID  # no such group, or a consumer-protocol one
        return group

    def _done(self, group_id: str) -> None:
        """After a request or tick changed a group: collect its records and answers."""
        group = self._groups.get(group_id)
        if isinstance(group, ClassicGroup):
            self._completions += group.take_completions()
        self._touched[group_id] = None
        self._discard_if_blank(group_id)

    def _convert(self, group: ConsumerGroup | ClassicGroup) -> ConsumerGroup | ClassicGroup:
        """An empty group changes protocol: its state records go, its offsets stay."""
        group.forget_state()
        self._outbox += group.take_records()
        self._touched.pop(group.group_id, None)
        if isinstance(group, ClassicGroup):
            self._completions += group.take_completions()
            new: ConsumerGroup | ClassicGroup = self._create(group.group_id)
        else:
            new = self._create_classic(group.group_id)
        new.offsets = group.offsets
        return new

    def commit_offsets(
        self,
        group_id: str,
        member_id: str,
        member_epoch: int,
        offsets: Mapping[TopicPartition, OffsetEntry],
        now_ms: int = 0,
    ) -> dict[TopicPartition, ErrorCode]:
        error = self.check_group_id(group_id)
        group = self._groups.get(group_id)
        if error is ErrorCode.NONE and group is None and member_id:
            error = ErrorCode.UNKNOWN_MEMBER_ID
        if error is not ErrorCode.NONE:
            return {tp: error for tp in offsets}
        group = group or self._create(group_id)
        self._touched[group_id] = None
        result = group.commit_offsets(member_id, member_epoch, offsets, now_ms)
        self._discard_if_blank(group_id)
        return result

    def fetch_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> OffsetFetchAnswer:
        error = self.check_group_id(group_id)
        if error is not ErrorCode.NONE:
            return OffsetFetchAnswer(error)
        group = self._groups.get(group_id)
        if group is None:
            return OffsetFetchAnswer(ErrorCode.NONE, {tp: None for tp in partitions or ()})
        return OffsetFetchAnswer(ErrorCode.NONE, group.fetch_offsets(partitions))

    def pending_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> set[TopicPartition]:
        """The partitions (of ``partitions``, or all) a transaction holds offsets of: an
        OffsetFetch with require_stable answers them UNSTABLE_OFFSET_COMMIT."""
        group = self._groups.get(group_id)
        if group is None or not group.offsets.has_pending():
            return set()
        pending = group.offsets.pending_partitions()
        return pending if partitions is None else pending & set(partitions)

    # ---- transactions --------------------------------------------------------------

    def txn_offset_commit(
        self,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        offsets: Mapping[TopicPartition, OffsetEntry],
        member_id: str = "",
        generation: int = -1,
        instance_id: str | None = None,
        now_ms: int = 0,
        known_epoch: int = -1,
    ) -> dict[TopicPartition, ErrorCode]:
        """TxnOffsetCommit: the offsets wait, invisible, for the producer's marker.

        ``known_epoch`` is the producer's epoch as this offsets partition's log last saw
        it (a marker may have moved it): an older epoch is a zombie, INVALID_PRODUCER_EPOCH,
        and its batch could not be appended anyway.
        """
        error = self.check_group_id(group_id)
        if error is ErrorCode.NONE and (producer_id < 0 or producer_epoch < 0):
            error = ErrorCode.INVALID_REQUEST
        newest = max(known_epoch, self._txn_epochs.get(producer_id, -1))
        if error is ErrorCode.NONE and producer_epoch < newest:
            error = ErrorCode.INVALID_PRODUCER_EPOCH
        group = self._groups.get(group_id)
        if error is ErrorCode.NONE and group is None and member_id:
            error = ErrorCode.UNKNOWN_MEMBER_ID
        if error is not ErrorCode.NONE:
            return {tp: error for tp in offsets}
        group = group or self._create(group_id)
        self._touched[group_id] = None
        result = group.txn_offset_commit(
            producer_id, producer_epoch, member_id, generation, instance_id, offsets, now_ms
        )
        if group.offsets.pending(producer_id):
            self._txn_groups.setdefault(producer_id, set()).add(group_id)
            self._txn_epochs[producer_id] = producer_epoch
        self._discard_if_blank(group_id)
        return result

    def complete_txn(self, producer_id: int, commit: bool) -> list[str]:
        """The producer's COMMIT (or ABORT) marker is on this partition: its pending
        offsets become committed (or go). Writes nothing: the marker is the record.
        Returns the groups whose offsets changed."""
        self._txn_epochs.pop(producer_id, None)
        changed = []
        for group_id in sorted(self._txn_groups.pop(producer_id, ())):
            group = self._groups.get(group_id)
            if group is None:
                continue
            if group.offsets.complete(producer_id, commit):
                changed.append(group_id)
            self._discard_if_blank(group_id)
        return changed

    def open_transactions(self) -> dict[int, list[str]]:
        """Producer id -> the groups its pending offsets are in (for tools and tests)."""
        return {pid: sorted(groups) for pid, groups in sorted(self._txn_groups.items())}

    def replay_pending(self, open_offsets: Iterable[OpenTxnOffset]) -> dict[str, str]:
        """After :meth:`replay`: restore the offsets of transactions whose marker is not
        in the log yet (in log order). Returns group id -> why a record was skipped."""
        failed: dict[str, str] = {}
        for item in open_offsets:
            record = item.record
            try:
                group_id = decode_key(record.key).group_id
            except ValueError as exc:
                failed[""] = str(exc)
                continue
            group = self._groups.get(group_id) or self._create(group_id)
            try:
                group.offsets.replay_pending(item)
            except ValueError as exc:
                failed[group_id] = str(exc)
                self._discard_if_blank(group_id)
                continue
            pid = record.producer_id
            self._txn_groups.setdefault(pid, set()).add(group_id)
            self._txn_epochs[pid] = max(self._txn_epochs.get(pid, -1), record.producer_epoch)
        return failed

    def alter_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, OffsetEntry], now_ms: int = 0
    ) -> dict[TopicPartition, ErrorCode]:
        error = self.check_group_id(group_id)
        if error is not ErrorCode.NONE:
            return {tp: error for tp in offsets}
        group = self._groups.get(group_id) or self._create(group_id)
        self._touched[group_id] = None
        result = group.alter_offsets(offsets, now_ms)
        self._discard_if_blank(group_id)
        return result

    def delete_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> ErrorCode:
        error = self.check_group_id(group_id)
        if error is not ErrorCode.NONE:
            return error
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.GROUP_ID_NOT_FOUND
        self._touched[group_id] = None
        return group.delete_offsets(partitions)

    def delete_group(self, group_id: str) -> ErrorCode:
        """DeleteGroups: tombstones for everything the group wrote, then forget it."""
        error = self.check_group_id(group_id)
        group = self._groups.get(group_id)
        if error is ErrorCode.NONE and group is None:
            error = ErrorCode.GROUP_ID_NOT_FOUND
        if error is not ErrorCode.NONE:
            return error
        assert group is not None
        error = group.delete()
        if error is ErrorCode.NONE:
            self._outbox += group.take_records()
            self._touched.pop(group_id, None)
            del self._groups[group_id]
        return error

    def delete_topic_offsets(self, topics: Set[str]) -> None:
        """Topics were deleted: every group forgets its offsets of them."""
        for group_id, group in self._groups.items():
            group.delete_topic_offsets(topics)
            self._touched[group_id] = None
        for group_id in [g for g, group in self._groups.items() if group.is_blank]:
            self._discard_if_blank(group_id)

    def describe(self, group_id: str) -> DescribeAnswer:
        error = self.check_group_id(group_id)
        if error is ErrorCode.NONE and group_id not in self._groups:
            error = ErrorCode.GROUP_ID_NOT_FOUND
        if error is not ErrorCode.NONE:
            return DescribeAnswer(error)
        return DescribeAnswer(ErrorCode.NONE, self._groups[group_id].describe())

    # ---- time, metadata, persistence -----------------------------------------------

    def tick(self, now_ms: int) -> dict[str, list[str]]:
        """Expire members in every group; returns group id -> expired member ids."""
        expired = {}
        for group_id, group in self._groups.items():
            deadline = group.next_deadline_ms()
            if deadline is not None and deadline <= now_ms:
                expired[group_id] = group.tick(now_ms)
                if isinstance(group, ClassicGroup):
                    self._completions += group.take_completions()
                self._touched[group_id] = None
        for group_id in [g for g, group in self._groups.items() if group.is_blank]:
            self._discard_if_blank(group_id)
        return expired

    def next_deadline_ms(self) -> int | None:
        deadlines = (g.next_deadline_ms() for g in self._groups.values())
        return min((d for d in deadlines if d is not None), default=None)

    def update_metadata(self, topic_partitions: Mapping[str, int]) -> None:
        self._topic_partitions = MappingProxyType(dict(topic_partitions))
        for group_id, group in self._groups.items():
            group.update_metadata(self._topic_partitions)
            self._touched[group_id] = None

    def take_records(self) -> list[GroupRecord]:
        """Everything to append to this offsets partition since the last call."""
        records, self._outbox = self._outbox, []
        for group_id in self._touched:
            records += self._groups[group_id].take_records()
        self._touched.clear()
        return records

    def replay(self, records: Iterable[GroupRecord], now_ms: int = 0) -> dict[str, str]:
        """Load groups from this partition's records (e.g. on becoming leader).

        A group whose records are corrupt is left out (and reported as group id ->
        reason) so that one bad group never keeps the others from loading; records whose
        key cannot be read at all are reported under "". Deleted groups (nothing but
        tombstones) do not come back.
        """
        by_group: dict[str, list[GroupRecord]] = {}
        failed: dict[str, str] = {}
        unreadable = 0
        for record in records:
            try:
                group_id = decode_key(record.key).group_id
            except ValueError:
                unreadable += 1
                continue
            by_group.setdefault(group_id, []).append(record)
        if unreadable:
            failed[""] = f"{unreadable} records with unreadable keys skipped"
        for group_id, group_records in by_group.items():
            classic = any(
                decode_key(r.key).type is RecordType.CLASSIC_GROUP and r.value is not None
                for r in group_records
            )
            group = self._groups.get(group_id) or (
                self._create_classic(group_id) if classic else self._create(group_id)
            )
            try:
                group.replay(group_records, now_ms)
            except ValueError as exc:
                failed[group_id] = str(exc)
                del self._groups[group_id]
                continue
            if group.is_blank:
                del self._groups[group_id]
        return failed

    def _discard_if_blank(self, group_id: str) -> None:
        """Drop a group that has nothing to remember (e.g. its first request failed)."""
        group = self._groups.get(group_id)
        if group is not None and group.is_blank:
            if isinstance(group, ClassicGroup):
                self._completions += group.take_completions()
            self._outbox += group.take_records()  # e.g. tombstones of deleted offsets
            self._touched.pop(group_id, None)
            del self._groups[group_id]

    def _create_classic(self, group_id: str) -> ClassicGroup:
        group = ClassicGroup(group_id, self.config, self._topic_partitions, self._member_id_factory)
        self._groups[group_id] = group
        return group

    def _create(self, group_id: str) -> ConsumerGroup:
        group = ConsumerGroup(
            group_id,
            self._assignor_factory(),
            self.config,
            self._topic_partitions,
            self._member_id_factory,
        )
        self._groups[group_id] = group
        return group
