"""How a ConsumerGroup persists itself in ``__consumer_offsets`` and is rebuilt from it.

Every state change is diffed against what was last written (newest value per key) and
only the changed keys go to the outbox, so the coordinator appends small batches and a
compacted log still holds the whole group. state_records.py owns the record layout.

A mixin so that group/consumer_group.py keeps to membership and queries.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..errors import ErrorCode
from .assignors import Assignor, TopicPartition, assignor_by_name
from .codec import GroupRecord, RecordType, decode_key
from .model import Member, MemberState
from .offsets import OffsetStore
from .state_records import group_records, load_snapshot, member_keys, member_records


class GroupPersistenceMixin:
    """Mixed into ConsumerGroup: its outbox of records, replay and deletion."""

    # provided by ConsumerGroup
    group_id: str
    assignor: Assignor
    group_epoch: int
    assignment_epoch: int
    offsets: OffsetStore
    _assigned_metadata: dict[str, int]
    _members: dict[str, Member]
    _target: dict[str, frozenset[TopicPartition]]
    _holder: dict[TopicPartition, str]
    _written: dict[bytes, bytes]
    _dirty: set[str]
    _outbox: list[GroupRecord]

    if TYPE_CHECKING:

        def _session_timeout(self, member: Member) -> int: ...
        def _rebalance_timeout(self, member: Member) -> int: ...

    def take_records(self) -> list[GroupRecord]:
        """Records produced since the last call; append them as one batch."""
        records, self._outbox = self._outbox, []
        return records

    def delete(self) -> ErrorCode:
        """DeleteGroups: tombstone every record of an empty group; NON_EMPTY_GROUP if not
        (members, or offsets of a transaction still open).

        The caller drops the group object afterwards (after taking its records).
        """
        if self._members or self.offsets.has_pending():
            return ErrorCode.NON_EMPTY_GROUP
        self._outbox.extend(self.offsets.delete(list(self.offsets.fetch())))
        self._outbox.extend(GroupRecord(key, None) for key in sorted(self._written))
        self._written.clear()
        return ErrorCode.NONE

    def forget_state(self) -> None:
        """Tombstone the group's state records, keeping its offsets: an empty group that
        becomes a classic-protocol group."""
        self._outbox.extend(GroupRecord(key, None) for key in sorted(self._written))
        self._written.clear()

    def replay(self, records: Iterable[GroupRecord], now_ms: int = 0) -> None:
        """Rebuild from ``__consumer_offsets`` records of this group (others skipped).

        Order only matters per key (newest wins), so a compacted log works. Sessions
        are not persisted: every member gets a fresh session from ``now_ms``. A corrupt
        record raises ValueError and leaves the group unusable: discard it.
        """
        for record in records:
            key = decode_key(record.key)
            if key.group_id != self.group_id:
                continue
            if key.type is RecordType.OFFSET_COMMIT:
                self.offsets.apply(key, record.value)
            elif record.value is None:
                self._written.pop(record.key, None)
            else:
                self._written[record.key] = record.value
        self._rebuild(now_ms)

    def _flush(self) -> None:
        """Emit a record for every persisted value that changed since the last flush."""
        view = group_records(
            self.group_id,
            self.group_epoch,
            self._assigned_metadata,
            self.assignment_epoch,
            self.assignor.name,
        )
        gone: list[bytes] = []
        for member_id in sorted(self._dirty):
            member = self._members.get(member_id)
            if member is None:
                gone += member_keys(self.group_id, member_id)
            else:
                target = self._target.get(member_id, frozenset())
                view.update(member_records(self.group_id, member, target))
        self._dirty.clear()
        for key in gone:
            if self._written.pop(key, None) is not None:
                self._outbox.append(GroupRecord(key, None))
        for key, value in view.items():
            if self._written.get(key) != value:
                self._written[key] = value
                self._outbox.append(GroupRecord(key, value))

    def _rebuild(self, now_ms: int) -> None:
        snapshot = load_snapshot(self._written)
        if snapshot.assignor is not None and snapshot.assignor != self.assignor.name:
            self.assignor = assignor_by_name(snapshot.assignor)  # ValueError if unknown
        self.group_epoch = snapshot.group_epoch
        self.assignment_epoch = snapshot.assignment_epoch
        self._assigned_metadata = snapshot.assigned_metadata
        self._members = snapshot.members
        self._target = snapshot.target
        self._holder = {}
        for member in self._members.values():
            member.session_deadline_ms = now_ms + self._session_timeout(member)
            if member.state is MemberState.UNREVOKED_PARTITIONS:
                member.revocation_deadline_ms = now_ms + self._rebalance_timeout(member)
            for tp in member.assigned | member.pending_revocation:
                self._holder[tp] = member.member_id
        self._dirty.clear()
