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
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    rebalance_timeout_ms: int = 300_000  # how long a member may sit on revocations
    max_metadata_bytes: int = 4096  # offset commit metadata, UTF-8 bytes


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


@dataclass(slots=True, frozen=True)
class GroupDescription:
    group_id: str
    state: GroupState
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: tuple[MemberDescription, ...]
    offsets: tuple[tuple[TopicPartition, CommittedOffset], ...] = field(default=())
