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


class ClassicState(StrEnum):
    """The states of a classic-protocol group (Kafka's JoinGroup/SyncGroup groups)."""

    EMPTY = "empty"
    PREPARING_REBALANCE = "preparing_rebalance"  # collecting joins
    COMPLETING_REBALANCE = "completing_rebalance"  # waiting for the leader's assignment
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
    # classic groups: how long the first rebalance of an empty group waits for more
    # members (Kafka's group.initial.rebalance.delay.ms), and how long a joining member
    # is kept without heartbeats while its JoinGroup waits
    initial_rebalance_delay_ms: int = 3_000
    new_member_join_timeout_ms: int = 300_000


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
class ClassicMemberDetails:
    """A classic member's opaque protocol bytes (empty unless the group is stable)."""

    member_id: str
    metadata: bytes
    assignment: bytes


@dataclass(slots=True, frozen=True)
class ClassicDetails:
    """What a classic group adds to its description (Kafka's DescribeGroups fields)."""

    protocol_type: str
    protocol: str
    generation: int
    leader: str
    members: tuple[ClassicMemberDetails, ...]


@dataclass(slots=True, frozen=True)
class GroupDescription:
    group_id: str
    state: GroupState | ClassicState
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: tuple[MemberDescription, ...]
    offsets: tuple[tuple[TopicPartition, CommittedOffset], ...] = field(default=())
    classic: ClassicDetails | None = None  # set for classic-protocol groups


@dataclass(slots=True, frozen=True)
class GroupListing:
    """One line of ListGroups."""

    group_id: str
    state: GroupState | ClassicState
    members: int
    type: str = "consumer"  # "consumer" (KIP-848 protocol) or "classic"
    protocol_type: str = "consumer"


@dataclass(slots=True, frozen=True)
class JoinAnswer:
    """A JoinGroup answer; ``members`` (id, instance id, metadata) go to the leader only."""

    error: ErrorCode
    member_id: str = ""
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()
    skip_assignment: bool = False


@dataclass(slots=True, frozen=True)
class SyncAnswer:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


class _Parked:
    """The answer of a request that waits (a JoinGroup or SyncGroup): it comes later, as
    a completion of its ticket."""

    def __repr__(self) -> str:
        return "PARKED"


PARKED = _Parked()


@dataclass(slots=True, frozen=True)
class LeaveAnswer:
    """A LeaveGroup answer: the request's error, and one per member asked to leave."""

    error: ErrorCode
    members: tuple[ErrorCode, ...] = ()


@dataclass(slots=True, frozen=True)
class OffsetFetchAnswer:
    """An OffsetFetch answer: the group's error, else the committed offset of each
    partition asked about (None: none committed)."""

    error: ErrorCode
    offsets: dict[TopicPartition, CommittedOffset | None] = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class DescribeAnswer:
    """A group's description, or why there is none (GROUP_ID_NOT_FOUND, INVALID_GROUP_ID)."""

    error: ErrorCode
    description: GroupDescription | None = None
