"""One classic-protocol group (Kafka's JoinGroup/SyncGroup/Heartbeat/LeaveGroup).

Clients assign: the broker collects every member's join (its protocols, in order of
preference, with opaque metadata), picks the protocol all members support with the most
first-choice votes, names a leader, answers the joins with a new generation (the leader
also gets every member's metadata), then waits for the leader's SyncGroup carrying each
member's opaque assignment and hands those out. States follow Kafka's: Empty,
PreparingRebalance (collecting joins), CompletingRebalance (waiting for the leader's
assignment), Stable.

Deterministic and sans-IO like :class:`ConsumerGroup`: time comes in as ``now_ms``,
records go to an outbox, and a JoinGroup or SyncGroup that has to wait returns
:data:`PARKED`; its answer comes later as a *completion* of the ticket the shell gave it
(:meth:`ClassicGroup.take_completions`), from whichever request or tick completes it.
The shell answers completions only once the round that produced them is durable, so
every member hears of an assignment only after the group record holding it is written
and replicated (the leader's SyncGroup writes it, as on Kafka).

What is persisted is Kafka's GroupMetadata: one record per group with the generation,
the protocol, the leader and every member with its subscription and assignment bytes.
Join-phase state is soft: a new coordinator resumes at the last synced generation, and
members that had moved past it rejoin (ILLEGAL_GENERATION).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ErrorCode
from .codec import GroupRecord, RecordKey, RecordType, decode_key, decode_value, encode_key
from .codec import encode_value as _encode_value
from .consumer_protocol import CONSUMER_PROTOCOL_TYPE, decode_assignment, decode_subscription
from .model import (
    PARKED,
    ClassicDetails,
    ClassicMemberDetails,
    ClassicState,
    GroupConfig,
    GroupDescription,
    GroupListing,
    JoinAnswer,
    LeaveAnswer,
    MemberDescription,
    MemberState,
    SyncAnswer,
)
from .offset_commits import OffsetCommitsMixin
from .offsets import OffsetStore

Protocols = tuple[tuple[str, bytes], ...]  # (name, metadata) in order of preference


@dataclass(slots=True)
class ClassicMember:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: Protocols
    assignment: bytes = b""
    join_ticket: int | None = None  # its JoinGroup waits
    sync_ticket: int | None = None  # its SyncGroup waits
    heartbeat_deadline_ms: int = 0
    is_new: bool = False  # joined, not yet in a generation

    def metadata(self, protocol: str) -> bytes:
        return next((m for name, m in self.protocols if name == protocol), b"")


class ClassicGroup(OffsetCommitsMixin):
    """Membership, generations, assignments relay and offsets of one classic group."""

    def __init__(
        self,
        group_id: str,
        config: GroupConfig | None = None,
        topic_partitions: Mapping[str, int] | None = None,
        member_id_factory: Callable[[], str] | None = None,
    ) -> None:
        self.group_id = group_id
        self.config = config or GroupConfig()
        self.offsets = OffsetStore(group_id)
        self._topic_partitions: Mapping[str, int] = topic_partitions or {}
        self._unique = member_id_factory or (lambda: str(uuid.uuid4()))
        self.state = ClassicState.EMPTY
        self.generation = 0
        self.protocol_type = ""
        self.protocol_name = ""
        self.leader = ""
        self._members: dict[str, ClassicMember] = {}  # in joining order
        self._static: dict[str, str] = {}  # instance id -> member id
        self._pending: dict[str, int] = {}  # KIP-394 member ids handed out -> deadline
        self._join_deadline: int | None = None
        self._initial = False  # this join phase started from Empty (initial delay)
        self._rebalance_started_ms = 0
        self._sync_deadline: int | None = None
        self._completions: list[tuple[int, Any]] = []
        self._written: bytes | None = None  # the group record, as last written
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
            and not self._pending
            and self._written is None
            and not len(self.offsets)
            and not self.offsets.has_pending()
        )

    @property
    def member_count(self) -> int:
        return len(self._members)

    def next_deadline_ms(self) -> int | None:
        deadlines = list(self._pending.values())
        deadlines += [m.heartbeat_deadline_ms for m in self._members.values() if self._expirable(m)]
        if self._join_deadline is not None:
            deadlines.append(self._join_deadline)
        if self._sync_deadline is not None:
            deadlines.append(self._sync_deadline)
        return min(deadlines, default=None)

    def listing(self) -> GroupListing:
        return GroupListing(
            self.group_id, self.state, len(self._members), "classic", self.protocol_type
        )

    def describe(self) -> GroupDescription:
        consumer = self.protocol_type == CONSUMER_PROTOCOL_TYPE
        stable = self.state is ClassicState.STABLE
        members = []
        details = []
        for m in sorted(self._members.values(), key=lambda m: m.member_id):
            metadata = m.metadata(self.protocol_name)
            topics: list[str] = []
            assigned: list[tuple[str, int]] = []
            if consumer:
                try:
                    topics = decode_subscription(metadata)[0] if metadata else []
                    assigned = decode_assignment(m.assignment) if stable else []
                except ValueError:
                    pass  # a client's own bytes: shown raw to Kafka clients only
            members.append(
                MemberDescription(
                    m.member_id,
                    m.instance_id,
                    self.generation,
                    MemberState.STABLE,
                    False,
                    tuple(sorted(topics)),
                    tuple(sorted(assigned)),
                    (),
                    tuple(sorted(assigned)),
                    m.client_id,
                    m.client_host,
                )
            )
            details.append(
                ClassicMemberDetails(
                    m.member_id,
                    metadata if stable else b"",
                    m.assignment if stable else b"",
                )
            )
        offsets = tuple((tp, c) for tp, c in self.offsets.fetch().items() if c is not None)
        return GroupDescription(
            self.group_id,
            self.state,
            self.generation,
            self.generation,
            self.protocol_name,
            tuple(members),
            offsets,
            ClassicDetails(
                self.protocol_type, self.protocol_name, self.generation, self.leader, tuple(details)
            ),
        )

    # ---- JoinGroup -----------------------------------------------------------------

    def join(
        self,
        ticket: int,
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
        """A JoinGroup; returns its answer, or PARKED (answered later as a completion)."""
        cfg = self.config
        if not cfg.min_session_timeout_ms <= session_timeout_ms <= cfg.max_session_timeout_ms:
            return JoinAnswer(ErrorCode.INVALID_SESSION_TIMEOUT, member_id)
        if rebalance_timeout_ms <= 0:
            rebalance_timeout_ms = session_timeout_ms
        if not member_id:
            if not self._supports(protocol_type, protocols):
                return JoinAnswer(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, "")
            if instance_id is not None and instance_id in self._static:
                return self._replace_static(
                    ticket, instance_id, protocols, session_timeout_ms, rebalance_timeout_ms,
                    client_id, client_host, now_ms,
                )  # fmt: skip
            new_id = f"{instance_id or client_id}-{self._unique()}"
            if instance_id is None and require_known_member_id:
                self._pending[new_id] = now_ms + session_timeout_ms
                return JoinAnswer(ErrorCode.MEMBER_ID_REQUIRED, new_id)
            member = ClassicMember(
                new_id, instance_id, client_id, client_host, session_timeout_ms,
                rebalance_timeout_ms, protocols,
            )  # fmt: skip
            return self._add(member, protocol_type, ticket, now_ms)
        if member_id in self._pending:
            del self._pending[member_id]
            if not self._supports(protocol_type, protocols):
                return JoinAnswer(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
            member = ClassicMember(
                member_id, instance_id, client_id, client_host, session_timeout_ms,
                rebalance_timeout_ms, protocols,
            )  # fmt: skip
            return self._add(member, protocol_type, ticket, now_ms)
        error = self._check_member(member_id, instance_id)
        if error is not ErrorCode.NONE:
            return JoinAnswer(error, member_id)
        member = self._members[member_id]
        if not self._supports(protocol_type, protocols, without=member_id):
            return JoinAnswer(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
        changed = member.protocols != protocols
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.protocols = protocols
        if self.state is ClassicState.PREPARING_REBALANCE:
            self._park_join(member, ticket)
            self._maybe_complete_join(now_ms)
            return PARKED
        if self.state is ClassicState.COMPLETING_REBALANCE and not changed:
            return self._join_answer(member)  # a lost answer: the same generation again
        if self.state is ClassicState.STABLE and not changed and member_id != self.leader:
            member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
            return self._join_answer(member)
        # new protocols, or the leader rejoining (how clients ask for a new assignment)
        self._park_join(member, ticket)
        self._prepare_rebalance(now_ms)
        self._maybe_complete_join(now_ms)
        return PARKED

    def _add(self, member: ClassicMember, protocol_type: str, ticket: int, now_ms: int) -> Any:
        member.is_new = True
        member.heartbeat_deadline_ms = now_ms + self.config.new_member_join_timeout_ms
        if not self._members:
            self.protocol_type = protocol_type
        self._members[member.member_id] = member
        if member.instance_id is not None:
            self._static[member.instance_id] = member.member_id
        if not self.leader:
            self.leader = member.member_id
        self._park_join(member, ticket)
        if self.state is ClassicState.PREPARING_REBALANCE:
            if self._initial and self.config.initial_rebalance_delay_ms > 0:
                limit = self._rebalance_started_ms + self._rebalance_timeout()
                self._join_deadline = min(now_ms + self.config.initial_rebalance_delay_ms, limit)
        else:
            self._prepare_rebalance(now_ms)
        self._maybe_complete_join(now_ms)
        return PARKED

    def _replace_static(
        self,
        ticket: int,
        instance_id: str,
        protocols: Protocols,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_id: str,
        client_host: str,
        now_ms: int,
    ) -> Any:
        """A static member restarts: it takes its old member's place (KIP-345), fencing it."""
        old = self._members.pop(self._static[instance_id])
        self._answer_join(old, JoinAnswer(ErrorCode.FENCED_INSTANCE_ID, old.member_id))
        self._answer_sync(old, SyncAnswer(ErrorCode.FENCED_INSTANCE_ID))
        new_id = f"{instance_id}-{self._unique()}"
        member = ClassicMember(
            new_id, instance_id, client_id, client_host, session_timeout_ms,
            rebalance_timeout_ms, protocols, old.assignment,
        )  # fmt: skip
        member.heartbeat_deadline_ms = now_ms + session_timeout_ms
        self._members[new_id] = member
        self._static[instance_id] = new_id
        if self.leader == old.member_id:
            self.leader = new_id
        if self.state is ClassicState.STABLE and old.protocols == protocols:
            self._write_record()  # the new member id, so a reload knows it
            return self._join_answer(member)
        self._park_join(member, ticket)
        if self.state is not ClassicState.PREPARING_REBALANCE:
            self._prepare_rebalance(now_ms)
        self._maybe_complete_join(now_ms)
        return PARKED

    def _join_answer(self, member: ClassicMember) -> JoinAnswer:
        leader = member.member_id == self.leader
        return JoinAnswer(
            ErrorCode.NONE,
            member.member_id,
            self.generation,
            self.protocol_type,
            self.protocol_name,
            self.leader,
            self._member_list() if leader else (),
        )

    def _member_list(self) -> tuple[tuple[str, str | None, bytes], ...]:
        return tuple(
            (m.member_id, m.instance_id, m.metadata(self.protocol_name))
            for m in self._members.values()
        )

    # ---- the join phase ------------------------------------------------------------

    def _prepare_rebalance(self, now_ms: int) -> None:
        if self.state is ClassicState.COMPLETING_REBALANCE:
            for m in self._members.values():
                self._answer_sync(m, SyncAnswer(ErrorCode.REBALANCE_IN_PROGRESS))
            self._sync_deadline = None
        self._initial = self.state is ClassicState.EMPTY
        self.state = ClassicState.PREPARING_REBALANCE
        self._rebalance_started_ms = now_ms
        if self._initial:
            self._join_deadline = now_ms + self.config.initial_rebalance_delay_ms
        else:
            self._join_deadline = now_ms + self._rebalance_timeout()

    def _maybe_complete_join(self, now_ms: int) -> None:
        if self.state is not ClassicState.PREPARING_REBALANCE:
            return
        if self._initial and self._join_deadline is not None and self._join_deadline > now_ms:
            return  # the initial rebalance waits out its delay for more members
        if not self._pending and all(m.join_ticket is not None for m in self._members.values()):
            self._complete_join(now_ms)

    def _complete_join(self, now_ms: int) -> None:
        for m in list(self._members.values()):
            if m.join_ticket is None and m.instance_id is None:
                self._remove(m)  # did not rejoin in time
        self._join_deadline = None
        joined = [m for m in self._members.values() if m.join_ticket is not None]
        if not joined and self._members:
            # only static members that have not rejoined: wait for them a while longer
            self._join_deadline = now_ms + self._rebalance_timeout()
            return
        self.generation += 1
        if not self._members:
            self.state = ClassicState.EMPTY
            self.protocol_name = ""
            self.leader = ""
            self._write_record()
            return
        if self.leader not in self._members or self._members[self.leader].join_ticket is None:
            self.leader = joined[0].member_id
        self.protocol_name = self._select_protocol()
        self.state = ClassicState.COMPLETING_REBALANCE
        for m in self._members.values():
            m.is_new = False
            m.heartbeat_deadline_ms = now_ms + m.session_timeout_ms
            if m.join_ticket is not None:
                self._answer_join(m, self._join_answer(m))
        self._sync_deadline = now_ms + self._rebalance_timeout()

    def _select_protocol(self) -> str:
        """The protocol every member supports with the most first-choice votes."""
        members = list(self._members.values())
        candidates = set.intersection(*({name for name, _ in m.protocols} for m in members))
        votes: dict[str, int] = dict.fromkeys(candidates, 0)
        for m in members:
            choice = next(name for name, _ in m.protocols if name in candidates)
            votes[choice] += 1
        return min(votes, key=lambda name: (-votes[name], name))

    def _supports(self, protocol_type: str, protocols: Protocols, without: str = "") -> bool:
        """Could a member with these protocols be in the group (Kafka's supportsProtocols)?"""
        if not protocol_type or not protocols:
            return False
        others = [m for m in self._members.values() if m.member_id != without]
        if not others:
            return True
        if protocol_type != self.protocol_type:
            return False
        names = {name for name, _ in protocols}
        for m in others:
            names &= {name for name, _ in m.protocols}
        return bool(names)

    def _rebalance_timeout(self) -> int:
        return max((m.rebalance_timeout_ms for m in self._members.values()), default=0) or 1

    # ---- SyncGroup, Heartbeat, LeaveGroup ------------------------------------------

    def sync(
        self,
        ticket: int,
        member_id: str,
        instance_id: str | None,
        generation: int,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: Mapping[str, bytes],
        now_ms: int = 0,
    ) -> SyncAnswer | Any:
        error = self._check_member(member_id, instance_id)
        if error is ErrorCode.NONE and generation != self.generation:
            error = ErrorCode.ILLEGAL_GENERATION
        if error is ErrorCode.NONE and (
            (protocol_type is not None and protocol_type != self.protocol_type)
            or (protocol_name is not None and protocol_name != self.protocol_name)
        ):
            error = ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        if error is ErrorCode.NONE and self.state is ClassicState.PREPARING_REBALANCE:
            error = ErrorCode.REBALANCE_IN_PROGRESS
        if error is not ErrorCode.NONE:
            return SyncAnswer(error)
        member = self._members[member_id]
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        if self.state is ClassicState.STABLE:
            return self._sync_answer(member)
        self._answer_sync(member, SyncAnswer(ErrorCode.REBALANCE_IN_PROGRESS))  # superseded
        member.sync_ticket = ticket
        if member_id == self.leader:
            for m in self._members.values():
                m.assignment = bytes(assignments.get(m.member_id, b""))
            self._write_record()
            self.state = ClassicState.STABLE
            self._sync_deadline = None
            for m in self._members.values():
                m.heartbeat_deadline_ms = now_ms + m.session_timeout_ms
                self._answer_sync(m, self._sync_answer(m))
        return PARKED

    def _sync_answer(self, member: ClassicMember) -> SyncAnswer:
        return SyncAnswer(ErrorCode.NONE, self.protocol_type, self.protocol_name, member.assignment)

    def heartbeat(
        self, member_id: str, instance_id: str | None, generation: int, now_ms: int = 0
    ) -> ErrorCode:
        error = self._check_member(member_id, instance_id)
        if error is not ErrorCode.NONE:
            return error
        if generation != self.generation:
            return ErrorCode.ILLEGAL_GENERATION
        member = self._members[member_id]
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        if self.state is ClassicState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, members: Iterable[tuple[str, str | None]], now_ms: int = 0) -> LeaveAnswer:
        """LeaveGroup: the request's error, and one per member asked to leave."""
        if not self._members and not self._pending:
            return LeaveAnswer(ErrorCode.UNKNOWN_MEMBER_ID)
        errors = []
        removed = False
        for member_id, instance_id in members:
            if not member_id and instance_id is not None:
                member_id = self._static.get(instance_id, "")  # an admin removal
                if not member_id:
                    errors.append(ErrorCode.UNKNOWN_MEMBER_ID)
                    continue
            if member_id in self._pending:
                del self._pending[member_id]
                errors.append(ErrorCode.NONE)
                continue
            error = self._check_member(member_id, instance_id)
            errors.append(error)
            if error is ErrorCode.NONE:
                self._remove(self._members[member_id])
                removed = True
        if removed:
            self._after_removal(now_ms)
        return LeaveAnswer(ErrorCode.NONE, tuple(errors))

    def _check_member(self, member_id: str, instance_id: str | None) -> ErrorCode:
        if instance_id is not None:
            holder = self._static.get(instance_id)
            if holder is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if holder != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in self._members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return ErrorCode.NONE

    def _remove(self, member: ClassicMember) -> None:
        del self._members[member.member_id]
        if member.instance_id is not None and self._static.get(member.instance_id) == (
            member.member_id
        ):
            del self._static[member.instance_id]
        self._answer_join(member, JoinAnswer(ErrorCode.UNKNOWN_MEMBER_ID, member.member_id))
        self._answer_sync(member, SyncAnswer(ErrorCode.UNKNOWN_MEMBER_ID))
        if self.leader == member.member_id:
            self.leader = next(iter(self._members), "")

    def _after_removal(self, now_ms: int) -> None:
        if self.state in (ClassicState.STABLE, ClassicState.COMPLETING_REBALANCE):
            self._prepare_rebalance(now_ms)
        self._maybe_complete_join(now_ms)

    # ---- tickets -------------------------------------------------------------------

    def _park_join(self, member: ClassicMember, ticket: int) -> None:
        # a second JoinGroup from the same member (another connection) replaces the first
        self._answer_join(member, JoinAnswer(ErrorCode.REBALANCE_IN_PROGRESS, member.member_id))
        member.join_ticket = ticket

    def _answer_join(self, member: ClassicMember, answer: JoinAnswer) -> None:
        if member.join_ticket is not None:
            self._completions.append((member.join_ticket, answer))
            member.join_ticket = None

    def _answer_sync(self, member: ClassicMember, answer: SyncAnswer) -> None:
        if member.sync_ticket is not None:
            self._completions.append((member.sync_ticket, answer))
            member.sync_ticket = None

    def take_completions(self) -> list[tuple[int, Any]]:
        """(ticket, answer) of parked requests completed since the last call."""
        done, self._completions = self._completions, []
        return done

    # ---- time and metadata ---------------------------------------------------------

    def _expirable(self, m: ClassicMember) -> bool:
        """A member waiting in a JoinGroup or SyncGroup cannot heartbeat: it is not
        expired meanwhile, unless it joined new and its join waits too long."""
        if m.sync_ticket is not None:
            return False
        return m.join_ticket is None or m.is_new

    def tick(self, now_ms: int) -> list[str]:
        """Expire pending ids and silent members, end join and sync phases that timed out."""
        for member_id, deadline in list(self._pending.items()):
            if deadline <= now_ms:
                del self._pending[member_id]
        expired = [
            m
            for m in self._members.values()
            if self._expirable(m) and m.heartbeat_deadline_ms <= now_ms
        ]
        if (
            self._sync_deadline is not None
            and self._sync_deadline <= now_ms
            and self.state is ClassicState.COMPLETING_REBALANCE
        ):
            # the leader never sent its assignment: drop who has not synced, start over
            self._sync_deadline = None
            expired += [
                m for m in self._members.values() if m.sync_ticket is None and m not in expired
            ]
        for m in expired:
            self._remove(m)
        if expired:
            self._after_removal(now_ms)
        elif self.state is ClassicState.PREPARING_REBALANCE:
            if self._join_deadline is not None and self._join_deadline <= now_ms:
                self._complete_join(now_ms)
            else:
                self._maybe_complete_join(now_ms)
        if self._sync_deadline is not None and self.state is not (
            ClassicState.COMPLETING_REBALANCE
        ):
            self._sync_deadline = None
        return [m.member_id for m in expired]

    def update_metadata(self, topic_partitions: Mapping[str, int]) -> None:
        self._topic_partitions = topic_partitions  # commits check partitions against it

    # ---- offsets (the commit rules of classic groups) ------------------------------

    def _commit_member_error(self, member_id: str, member_epoch: int) -> ErrorCode:
        """Members commit at the current generation; a simple consumer (no member id,
        generation -1) only while the group has no members."""
        if not member_id:
            if member_epoch < 0 and not self._members:
                return ErrorCode.NONE
            return ErrorCode.UNKNOWN_MEMBER_ID
        if member_id not in self._members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if member_epoch != self.generation:
            return ErrorCode.ILLEGAL_GENERATION
        if self.state is ClassicState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def _txn_member_error(
        self, member_id: str, generation: int, instance_id: str | None
    ) -> ErrorCode:
        """A transactional commit from a member: its current generation, and its static
        instance if it names one; generation -1 passes while the group is empty."""
        if generation < 0 and not self._members:
            return ErrorCode.NONE
        error = self._check_member(member_id, instance_id)
        if error is not ErrorCode.NONE:
            return error
        if generation != self.generation:
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    # ---- persistence ---------------------------------------------------------------

    def _key(self) -> bytes:
        return encode_key(RecordKey(RecordType.CLASSIC_GROUP, self.group_id))

    def _write_record(self) -> None:
        """Persist the group as it is now (a tombstone once nothing is left to keep)."""
        if not self._members and not len(self.offsets):
            self.forget_state()
            return
        value = _encode_value(
            {
                "protocol_type": self.protocol_type,
                "protocol": self.protocol_name,
                "generation": self.generation,
                "leader": self.leader,
                "members": [
                    {
                        "id": m.member_id,
                        "instance": m.instance_id,
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        "session_timeout": m.session_timeout_ms,
                        "rebalance_timeout": m.rebalance_timeout_ms,
                        "subscription": m.metadata(self.protocol_name),
                        "assignment": m.assignment,
                    }
                    for m in self._members.values()
                ],
            }
        )
        if value != self._written:
            self._written = value
            self._outbox.append(GroupRecord(self._key(), value))

    def forget_state(self) -> None:
        """Tombstone the group record (offsets stay): on deletion or a change of protocol."""
        if self._written is not None:
            self._written = None
            self._outbox.append(GroupRecord(self._key(), None))

    def take_records(self) -> list[GroupRecord]:
        records, self._outbox = self._outbox, []
        return records

    def delete(self) -> ErrorCode:
        """DeleteGroups: only without members nor open transactions' offsets; tombstones
        for the group and its offsets."""
        if self._members or self.offsets.has_pending():
            return ErrorCode.NON_EMPTY_GROUP
        self._outbox.extend(self.offsets.delete(list(self.offsets.fetch())))
        self.forget_state()
        return ErrorCode.NONE

    def replay(self, records: Iterable[GroupRecord], now_ms: int = 0) -> None:
        """Rebuild from this group's records: Stable at its last synced generation (or
        Empty), every member with a fresh session. ValueError on a corrupt record."""
        for record in records:
            key = decode_key(record.key)
            if key.group_id != self.group_id:
                continue
            if key.type is RecordType.OFFSET_COMMIT:
                self.offsets.apply(key, record.value)
            elif key.type is RecordType.CLASSIC_GROUP:
                self._written = record.value
            else:
                raise ValueError(f"a {key.type.name} record in classic group {self.group_id!r}")
        self._members.clear()
        self._static.clear()
        if self._written is None:
            return
        try:
            value = decode_value(self._written)
            self.protocol_type = str(value["protocol_type"])
            self.protocol_name = str(value["protocol"])
            self.generation = int(value["generation"])
            self.leader = str(value["leader"])
            for m in value["members"]:
                member = ClassicMember(
                    str(m["id"]),
                    None if m["instance"] is None else str(m["instance"]),
                    str(m["client_id"]),
                    str(m["client_host"]),
                    int(m["session_timeout"]),
                    int(m["rebalance_timeout"]),
                    ((self.protocol_name, bytes(m["subscription"])),),
                    bytes(m["assignment"]),
                    heartbeat_deadline_ms=now_ms + int(m["session_timeout"]),
                )
                self._members[member.member_id] = member
                if member.instance_id is not None:
                    self._static[member.instance_id] = member.member_id
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"corrupt classic group record: {exc!r}") from exc
        self.state = ClassicState.STABLE if self._members else ClassicState.EMPTY
        if self.leader not in self._members:
            self.leader = next(iter(self._members), "")
