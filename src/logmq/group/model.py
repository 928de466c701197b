"""The data of a consumer group: member state, configuration, results, descriptions.

Shared by the state machine (consumer_group.py) and its record encoding
(state_records.py); plain slotted dataclasses, no behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from ..errors import ErrorCode
from .assignors import TopicPartition
from .offsets import CommittedOffset

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
TEMPORARY_LEAVE_EPOCH = -2  # static members: leave, but keep the assignment a while


class MemberState(StrEnum):
    STABLE = "stable"  # owns its whole target
    UNREVOKED_PARTITIONS = "unrevoked_partitions"  # must give some up before going on
    UNRELEASED_PARTITIONS = "unreleased_partitions"  # waits for others to let go


class GroupState(StrEnum):
    EMPTY = "empty"
    RECONCILING = "reconciling"  # some member has not reached its target yet
    STABLE = "stable"


@dataclass(slots=True, frozen=True)
class GroupConfig:
    """Coordinator-wide settings; members may override the two timeouts per member."""

    session_timeout_ms: int = 45_000  # for members that do not ask for their own
    heartbeat_interval_ms: int = 5_000
    rebalance_timeout_ms: int = 300_000  # how long a member may sit on revocations
    max_metadata_bytes: int = 4096  # offset commit metadata, UTF-8 bytes
    # what a member may ask for as its own session timeout (INVALID_SESSION_TIMEOUT)
    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 300_000
    # the records of one offset commit must fit in one batch of __consumer_offsets
    max_commit_bytes: int = 1 << 20


@dataclass(slots=True, frozen=True)
class MemberOptions:
    """Per-member settings a heartbeat may carry; None leaves a setting unchanged."""

    session_timeout_ms: int | None = None
    rebalance_timeout_ms: int | None = None
    server_assignor: str | None = None  # the group's assignor; only an empty group switches
    client_id: str | None = None
    client_host: str | None = None


@dataclass(slots=True)
class Member:
    member_id: str
    instance_id: str | None
    subscribed_topics: frozenset[str]
    member_epoch: int = 0
    previous_member_epoch: int = 0
    state: MemberState = MemberState.STABLE
    assigned: frozenset[TopicPartition] = frozenset()
    pending_revocation: frozenset[TopicPartition] = frozenset()
    left_temporarily: bool = False
    session_deadline_ms: int = 0
    revocation_deadline_ms: int | None = None
    session_timeout_ms: int | None = None  # None: the group config's
    rebalance_timeout_ms: int | None = None  # None: the group config's
    client_id: str = ""
    client_host: str = ""


@dataclass(slots=True, frozen=True)
class HeartbeatResult:
    member_id: str
    member_epoch: int
    assigned_partitions: frozenset[TopicPartition] | None  # None: error or left
    error: ErrorCode = ErrorCode.NONE
    heartbeat_interval_ms: int = 0


@dataclass(slots=True, frozen=True)
class MemberDescription:
    member_id: str
    instance_id: str | None
    member_epoch: int
    state: MemberState
    left_temporarily: bool
    subscribed_topics: tuple[str, ...]
    assigned: tuple[TopicPartition, ...]
    pending_revocation: tuple[TopicPartition, ...]
    target: tuple[TopicPartition, ...]
    client_id: str = ""
    client_host: str = ""


@dataclass(slots=True, frozen=True)
class GroupDescription:
    group_id: str
    state: GroupState
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: tuple[MemberDescription, ...]
    offsets: tuple[tuple[TopicPartition, CommittedOffset], ...] = field(default=())


@dataclass(slots=True, frozen=True)
class GroupListing:
    """One line of ListGroups."""

    group_id: str
    state: GroupState
    members: int
