"""One consumer group as the coordinator sees it: a deterministic state machine.

Members heartbeat (KIP-848 style); the coordinator computes the group's *target
assignment* with an assignor and walks each member towards it in safe steps (see
docs/consumer-groups.md). This module owns membership (join, leave, heartbeat, expiry)
and the queries; the other concepts of a group are mixed in from their own modules:
reconciliation.py (target assignment, safe steps), offset_commits.py (commit rules)
and persistence.py (the records).

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
from .codec import GroupRecord
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
from .offset_commits import OffsetCommitsMixin
from .offsets import OffsetStore
from .persistence import GroupPersistenceMixin
from .reconciliation import ReconciliationMixin

NO_OPTIONS = MemberOptions()


def _shared(topic_partitions: Mapping[str, int] | None) -> Mapping[str, int]:
    """Read-only mappings (the coordinator's) are shared by every group; others copied."""
    if isinstance(topic_partitions, MappingProxyType):
        return topic_partitions
    return dict(topic_partitions or {})


class ConsumerGroup(ReconciliationMixin, OffsetCommitsMixin, GroupPersistenceMixin):
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
        return (
            not self._members
            and not self._written
            and not len(self.offsets)
            and not self.offsets.has_pending()
        )

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
