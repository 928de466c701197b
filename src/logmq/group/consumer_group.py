"""One consumer group as the coordinator sees it: a deterministic state machine.

Members heartbeat (KIP-848 style); the coordinator computes the group's *target
assignment* with an assignor and walks each member towards its target in safe steps
(see docs/consumer-groups.md for the protocol and the reconciliation rule):

* a member first gives up what it must lose and keeps the rest, fetching throughout;
* a partition goes to its new owner only once no other member holds it, i.e. its old
  owner reported it no longer owns it, left, or was expired.

No clocks, sockets or tasks here: time arrives as ``now_ms`` and every state change
leaves records in an outbox (:meth:`ConsumerGroup.take_records`) for the shell to append
to ``__consumer_offsets`` as one batch before answering. :meth:`ConsumerGroup.replay`
rebuilds the same group from those records.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Set
from types import MappingProxyType

from ..errors import ErrorCode
from .assignors import ASSIGNORS, Assignor, StickyAssignor, TopicPartition, assignor_by_name
from .codec import GroupRecord, RecordType, decode_key
from .model import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    TEMPORARY_LEAVE_EPOCH,
    GroupConfig,
    GroupDescription,
    GroupListing,
    GroupState,
    HeartbeatResult,
    Member,
    MemberDescription,
    MemberOptions,
    MemberState,
)
from .offsets import CommittedOffset, OffsetStore
from .state_records import group_records, load_snapshot, member_keys, member_records

NO_OPTIONS = MemberOptions()


def _shared(topic_partitions: Mapping[str, int] | None) -> Mapping[str, int]:
    """Read-only mappings (the coordinator's) are shared by every group; others copied."""
    if isinstance(topic_partitions, MappingProxyType):
        return topic_partitions
    return dict(topic_partitions or {})


class ConsumerGroup:
    """Membership, target assignment, reconciliation and offsets of one group."""

    def __init__(
        self,
        group_id: str,
        assignor: Assignor | None = None,
        config: GroupConfig | None = None,
        topic_partitions: Mapping[str, int] | None = None,
        member_id_factory: Callable[[], str] | None = None,
    ) -> None:
        self.group_id = group_id
        self.assignor = assignor or StickyAssignor()
        self.config = config or GroupConfig()
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.offsets = OffsetStore(group_id)
        self._topic_partitions = _shared(topic_partitions)
        self._assigned_metadata: dict[str, int] = {}  # counts the target was computed on
        self._members: dict[str, Member] = {}
        self._target: dict[str, frozenset[TopicPartition]] = {}
        self._holder: dict[TopicPartition, str] = {}  # assigned or pending revocation
        self._new_member_id = member_id_factory or (lambda: uuid.uuid4().hex)
        self._written: dict[bytes, bytes] = {}  # newest value per key, as persisted
        self._dirty: set[str] = set()
        self._outbox: list[GroupRecord] = []

    # ---- queries -------------------------------------------------------------------

    @property
    def is_empty(self) -> bool:
        return not self._members

    @property
    def is_blank(self) -> bool:
        """Nothing to remember: no members, no persisted state, no offsets."""
        return not self._members and not self._written and not len(self.offsets)

    @property
    def member_count(self) -> int:
        return len(self._members)

    def member(self, member_id: str) -> Member | None:
        """The coordinator's view of a member (read only: do not mutate it)."""
        return self._members.get(member_id)

    def holder_of(self, tp: TopicPartition) -> str | None:
        """The member that owns ``tp`` or still has to revoke it, if any."""
        return self._holder.get(tp)

    def next_deadline_ms(self) -> int | None:
        """When :meth:`tick` next has work: the shell's timer target."""
        deadlines = [m.session_deadline_ms for m in self._members.values()]
        deadlines += [
            m.revocation_deadline_ms
            for m in self._members.values()
            if m.revocation_deadline_ms is not None
        ]
        return min(deadlines, default=None)

    def state(self) -> GroupState:
        if not self._members:
            return GroupState.EMPTY
        if all(
            m.left_temporarily
            or (m.state is MemberState.STABLE and m.member_epoch == self.assignment_epoch)
            for m in self._members.values()
        ):
            return GroupState.STABLE
        return GroupState.RECONCILING

    def listing(self) -> GroupListing:
        return GroupListing(self.group_id, self.state(), len(self._members))

    def describe(self) -> GroupDescription:
        members = tuple(
            MemberDescription(
                m.member_id,
                m.instance_id,
                m.member_epoch,
                m.state,
                m.left_temporarily,
                tuple(sorted(m.subscribed_topics)),
                tuple(sorted(m.assigned)),
                tuple(sorted(m.pending_revocation)),
                tuple(sorted(self._target.get(m.member_id, ()))),
                m.client_id,
                m.client_host,
            )
            for m in sorted(self._members.values(), key=lambda m: m.member_id)
        )
        offsets = tuple((tp, c) for tp, c in self.offsets.fetch().items() if c is not None)
        return GroupDescription(
            self.group_id,
            self.state(),
            self.group_epoch,
            self.assignment_epoch,
            self.assignor.name,
            members,
            offsets,
        )

    def take_records(self) -> list[GroupRecord]:
        """Records produced since the last call; append them as one batch."""
        records, self._outbox = self._outbox, []
        return records

    # ---- membership ----------------------------------------------------------------

    def heartbeat(
        self,
        member_id: str,
        member_epoch: int,
        instance_id: str | None = None,
        subscribed_topics: Iterable[str] | None = None,
        owned_partitions: Iterable[TopicPartition] | None = None,
        now_ms: int = 0,
        options: MemberOptions = NO_OPTIONS,
    ) -> HeartbeatResult:
        """Handle one heartbeat; epoch 0 joins, -1 leaves, -2 leaves temporarily.

        ``subscribed_topics`` / ``owned_partitions`` may be None for "unchanged" /
        "not reported"; a join must subscribe. Errors change nothing. Any iterables
        work (e.g. msgpack lists of ``[topic, partition]``).
        """
        if subscribed_topics is not None:
            subscribed_topics = frozenset(str(t) for t in subscribed_topics)
        if owned_partitions is not None:
            owned_partitions = frozenset((str(t), int(p)) for t, p in owned_partitions)
        error = self._check_options(member_epoch, options)
        if error is not ErrorCode.NONE:
            result = self._error(member_id, member_epoch, error)
        elif member_epoch == JOIN_EPOCH:
            result = self._join(member_id, instance_id, subscribed_topics, options, now_ms)
        elif member_epoch in (LEAVE_EPOCH, TEMPORARY_LEAVE_EPOCH):
            result = self._leave(member_id, member_epoch, instance_id, now_ms)
        elif member_epoch > 0:
            result = self._beat(
                member_id,
                member_epoch,
                instance_id,
                subscribed_topics,
                owned_partitions,
                options,
                now_ms,
            )
        else:
            result = self._error(member_id, member_epoch, ErrorCode.INVALID_REQUEST)
        if result.error is ErrorCode.NONE:  # an error changed nothing: nothing to write
            self._flush()
        return result

    def tick(self, now_ms: int) -> list[str]:
        """Expire members past their session or revocation deadline; returns their ids."""
        expired = sorted(
            m.member_id
            for m in self._members.values()
            if m.session_deadline_ms <= now_ms
            or (m.revocation_deadline_ms is not None and m.revocation_deadline_ms <= now_ms)
        )
        for member_id in expired:
            self._remove_member(member_id)
        if expired:
            self._bump_and_assign()
        self._flush()
        return expired

    def update_metadata(self, topic_partitions: Mapping[str, int]) -> None:
        """New partition counts from the cluster metadata; re-assigns if they matter."""
        self._topic_partitions = _shared(topic_partitions)
        if self._members and self._subscribed_metadata() != self._assigned_metadata:
            self._bump_and_assign()
        self._flush()

    # ---- offsets -------------------------------------------------------------------

    def commit_offsets(
        self,
        member_id: str,
        member_epoch: int,
        offsets: Mapping[TopicPartition, tuple[int, str]],
        now_ms: int = 0,
    ) -> dict[TopicPartition, ErrorCode]:
        """Commit ``{tp: (offset, metadata)}``; returns an error code per partition.

        Members must commit with their current epoch: a zombie (expired, replaced or
        behind) is rejected for every partition and nothing is written. Without a member
        id and with epoch -1 only an empty group accepts commits (manual assignment).
        Valid partitions are committed even when others in the request are rejected.
        """
        error = self._commit_member_error(member_id, member_epoch)
        if error is not ErrorCode.NONE:
            return {tp: error for tp in offsets}
        return self._write_offsets(offsets, now_ms)

    def fetch_offsets(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, CommittedOffset | None]:
        return self.offsets.fetch(partitions)

    def alter_offsets(
        self, offsets: Mapping[TopicPartition, tuple[int, str]], now_ms: int = 0
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

    def delete(self) -> ErrorCode:
        """DeleteGroups: tombstone every record of an empty group; NON_EMPTY_GROUP if not.

        The caller drops the group object afterwards (after taking its records).
        """
        if self._members:
            return ErrorCode.NON_EMPTY_GROUP
        self._outbox.extend(self.offsets.delete(list(self.offsets.fetch())))
        self._outbox.extend(GroupRecord(key, None) for key in sorted(self._written))
        self._written.clear()
        return ErrorCode.NONE

    # ---- persistence ---------------------------------------------------------------

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

    # ---- heartbeat cases -----------------------------------------------------------

    def _error(self, member_id: str, member_epoch: int, error: ErrorCode) -> HeartbeatResult:
        return HeartbeatResult(member_id, member_epoch, None, error)

    def _ok(self, member: Member) -> HeartbeatResult:
        # Never ask for heartbeats so rare that a short session would expire between them.
        interval = min(
            self.config.heartbeat_interval_ms, max(1, self._session_timeout(member) // 3)
        )
        return HeartbeatResult(
            member.member_id, member.member_epoch, member.assigned, ErrorCode.NONE, interval
        )

    def _session_timeout(self, member: Member) -> int:
        return member.session_timeout_ms or self.config.session_timeout_ms

    def _rebalance_timeout(self, member: Member) -> int:
        return member.rebalance_timeout_ms or self.config.rebalance_timeout_ms

    def _check_options(self, member_epoch: int, options: MemberOptions) -> ErrorCode:
        session = options.session_timeout_ms
        cfg = self.config
        if session is not None and not (
            cfg.min_session_timeout_ms <= session <= cfg.max_session_timeout_ms
        ):
            return ErrorCode.INVALID_SESSION_TIMEOUT
        if options.rebalance_timeout_ms is not None and options.rebalance_timeout_ms <= 0:
            return ErrorCode.INVALID_REQUEST
        name = options.server_assignor
        if name is not None and member_epoch >= 0:
            if name not in ASSIGNORS:
                return ErrorCode.INVALID_REQUEST
            # The first member of a group picks the assignor; later ones must agree.
            if name != self.assignor.name and self._members:
                return ErrorCode.INVALID_REQUEST
        return ErrorCode.NONE

    def _apply_options(self, member: Member, options: MemberOptions) -> None:
        if options.session_timeout_ms is not None:
            member.session_timeout_ms = options.session_timeout_ms
        if options.rebalance_timeout_ms is not None:
            member.rebalance_timeout_ms = options.rebalance_timeout_ms
        if options.client_id is not None:
            member.client_id = options.client_id
        if options.client_host is not None:
            member.client_host = options.client_host
        self._dirty.add(member.member_id)

    def _join(
        self,
        member_id: str,
        instance_id: str | None,
        subscribed_topics: Set[str] | None,
        options: MemberOptions,
        now_ms: int,
    ) -> HeartbeatResult:
        if subscribed_topics is None:
            return self._error(member_id, JOIN_EPOCH, ErrorCode.INVALID_REQUEST)
        existing = self._members.get(member_id) if member_id else None
        if existing is not None and existing.instance_id != instance_id:
            return self._error(member_id, JOIN_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID)
        name = options.server_assignor
        if name is not None and name != self.assignor.name:  # empty group: checked
            self.assignor = assignor_by_name(name)
        topics = frozenset(subscribed_topics)
        if existing is not None:
            # The client lost its state (e.g. after being fenced): it owns nothing now.
            member = existing
            self._set_holdings(member, frozenset(), frozenset())
            member.member_epoch = member.previous_member_epoch = 0
            member.state = MemberState.STABLE
            member.revocation_deadline_ms = None
            member.left_temporarily = False
            resubscribed = member.subscribed_topics != topics
        else:
            member_id = member_id or self._fresh_member_id()
            previous = self._static_member(instance_id)
            member = Member(member_id, instance_id, topics)
            self._members[member_id] = member
            self._dirty.add(member_id)
            if previous is not None:
                member.session_timeout_ms = previous.session_timeout_ms
                member.rebalance_timeout_ms = previous.rebalance_timeout_ms
                # Static membership: the restarted instance takes over its predecessor's
                # target, so nothing is reassigned (see docs for the trade-off).
                self._target[member_id] = self._target.get(previous.member_id, frozenset())
                self._remove_member(previous.member_id)
                resubscribed = previous.subscribed_topics != topics
            else:
                self._target[member_id] = frozenset()
                resubscribed = True
        member.subscribed_topics = topics
        self._apply_options(member, options)
        if resubscribed:
            self._bump_and_assign()
        member.session_deadline_ms = now_ms + self._session_timeout(member)
        self._reconcile(member, frozenset(), now_ms)
        return self._ok(member)

    def _leave(
        self, member_id: str, member_epoch: int, instance_id: str | None, now_ms: int
    ) -> HeartbeatResult:
        member = self._members.get(member_id)
        if member is None:
            return self._error(member_id, member_epoch, ErrorCode.UNKNOWN_MEMBER_ID)
        if instance_id is not None and instance_id != member.instance_id:
            return self._error(member_id, member_epoch, ErrorCode.UNKNOWN_MEMBER_ID)
        if member_epoch == TEMPORARY_LEAVE_EPOCH and member.instance_id is not None:
            # Keep the target (and what it holds of it) reserved until the session
            # expires; the process is gone, so whatever is moving away is released now.
            target = self._target.get(member_id, frozenset())
            self._set_holdings(member, member.assigned & target, frozenset())
            member.state = MemberState.STABLE
            member.left_temporarily = True
            member.revocation_deadline_ms = None
            member.session_deadline_ms = now_ms + self._session_timeout(member)
            return HeartbeatResult(member_id, TEMPORARY_LEAVE_EPOCH, None)
        self._remove_member(member_id)
        self._bump_and_assign()
        return HeartbeatResult(member_id, LEAVE_EPOCH, None)

    def _beat(
        self,
        member_id: str,
        member_epoch: int,
        instance_id: str | None,
        subscribed_topics: Set[str] | None,
        owned: Set[TopicPartition] | None,
        options: MemberOptions,
        now_ms: int,
    ) -> HeartbeatResult:
        member = self._members.get(member_id)
        if member is None or (instance_id is not None and instance_id != member.instance_id):
            return self._error(member_id, member_epoch, ErrorCode.UNKNOWN_MEMBER_ID)
        current = member_epoch == member.member_epoch
        # A lost response leaves the client one epoch behind; accept it only if it
        # claims nothing it was not given.
        lost_response = (
            member_epoch == member.previous_member_epoch
            and owned is not None
            and owned <= member.assigned
        )
        if member.left_temporarily or not (current or lost_response):
            return self._error(member_id, member_epoch, ErrorCode.FENCED_MEMBER_EPOCH)
        if subscribed_topics is not None and frozenset(subscribed_topics) != (
            member.subscribed_topics
        ):
            member.subscribed_topics = frozenset(subscribed_topics)
            self._dirty.add(member_id)
            self._bump_and_assign()
        self._apply_options(member, options)
        member.session_deadline_ms = now_ms + self._session_timeout(member)
        self._reconcile(member, owned, now_ms)
        return self._ok(member)

    # ---- reconciliation ------------------------------------------------------------

    def _reconcile(self, member: Member, owned: Set[TopicPartition] | None, now_ms: int) -> None:
        """Move ``member`` one safe step towards its target (see module docstring)."""
        self._dirty.add(member.member_id)
        target = self._target.get(member.member_id, frozenset())
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            # A newer target may want back what is being revoked: nobody else can hold
            # it yet, so the member simply keeps it.
            keep = member.pending_revocation & target
            pending = member.pending_revocation - keep
            if pending and (owned is None or not owned.isdisjoint(pending)):
                if keep:
                    self._set_holdings(member, member.assigned | keep, pending)
                return  # still owns something it must give up
            self._set_holdings(member, member.assigned | keep, frozenset())
            member.revocation_deadline_ms = None
        if member.member_epoch != self.assignment_epoch:
            to_revoke = member.assigned - target
            if to_revoke:
                self._set_holdings(member, member.assigned & target, to_revoke)
                member.state = MemberState.UNREVOKED_PARTITIONS
                member.revocation_deadline_ms = now_ms + self._rebalance_timeout(member)
                return
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = self.assignment_epoch
        free = frozenset(tp for tp in target - member.assigned if tp not in self._holder)
        if free:
            self._set_holdings(member, member.assigned | free, member.pending_revocation)
        if member.assigned == target:
            member.state = MemberState.STABLE
        else:
            member.state = MemberState.UNRELEASED_PARTITIONS

    def _set_holdings(
        self,
        member: Member,
        assigned: frozenset[TopicPartition],
        pending: frozenset[TopicPartition],
    ) -> None:
        for tp in member.assigned | member.pending_revocation:
            if self._holder.get(tp) == member.member_id:
                del self._holder[tp]
        member.assigned, member.pending_revocation = assigned, pending
        for tp in assigned | pending:
            self._holder[tp] = member.member_id
        self._dirty.add(member.member_id)

    def _remove_member(self, member_id: str) -> None:
        member = self._members[member_id]
        self._set_holdings(member, frozenset(), frozenset())
        del self._members[member_id]
        self._target.pop(member_id, None)

    def _static_member(self, instance_id: str | None) -> Member | None:
        if instance_id is None:
            return None
        for member in self._members.values():
            if member.instance_id == instance_id:
                return member
        return None

    def _fresh_member_id(self) -> str:
        while (member_id := self._new_member_id()) in self._members or not member_id:
            pass
        return member_id

    def _subscribed_metadata(self) -> dict[str, int]:
        topics = set().union(*(m.subscribed_topics for m in self._members.values()))
        return {
            t: self._topic_partitions[t]
            for t in sorted(topics)
            if self._topic_partitions.get(t, 0) > 0
        }

    def _bump_and_assign(self) -> None:
        """Membership, subscriptions or metadata changed: new epoch, new target."""
        self.group_epoch += 1
        self._assigned_metadata = self._subscribed_metadata()
        subscriptions = {mid: m.subscribed_topics for mid, m in self._members.items()}
        target = self.assignor.assign(subscriptions, self._assigned_metadata, self._target)
        self._target = {mid: frozenset(target.get(mid, ())) for mid in self._members}
        self.assignment_epoch = self.group_epoch
        self._dirty.update(self._members)
        for member in self._members.values():
            if member.left_temporarily:
                # Nobody consumes for it: what moves away is released at once.
                target = self._target[member.member_id]
                self._set_holdings(member, member.assigned & target, frozenset())

    # ---- offsets helpers -----------------------------------------------------------

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
        self, offsets: Mapping[TopicPartition, tuple[int, str]], now_ms: int
    ) -> dict[TopicPartition, ErrorCode]:
        """Commit the valid partitions, all or none of them if they are too big together."""
        errors: dict[TopicPartition, ErrorCode] = {}
        accepted: list[tuple[TopicPartition, CommittedOffset]] = []
        for tp, (offset, metadata) in offsets.items():
            topic, partition = tp
            if not 0 <= partition < self._topic_partitions.get(topic, 0):
                errors[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif len(metadata.encode()) > self.config.max_metadata_bytes:
                errors[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            elif offset < 0:
                errors[tp] = ErrorCode.INVALID_REQUEST
            else:
                accepted.append((tp, CommittedOffset(offset, metadata, now_ms)))
                errors[tp] = ErrorCode.NONE
        records = [self.offsets.record(tp, committed) for tp, committed in accepted]
        size = sum(len(r.key) + len(r.value or b"") for r in records)
        if size > self.config.max_commit_bytes:
            return {tp: ErrorCode.INVALID_COMMIT_OFFSET_SIZE for tp in offsets}
        for tp, committed in accepted:
            self.offsets.put(tp, committed)
        self._outbox.extend(records)
        return errors

    # ---- records -------------------------------------------------------------------

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
