"""Consumer groups: deterministic cores the broker's group coordinator drives.

Assignors decide who reads what; :class:`ConsumerGroup` runs one group's membership and
incremental reconciliation; :class:`OffsetStore` keeps committed offsets; everything
persists as records in the compacted ``__consumer_offsets`` topic and is rebuilt by
replaying them. See docs/consumer-groups.md.
"""

from .assignors import (
    Assignor,
    RangeAssignor,
    RoundRobinAssignor,
    StickyAssignor,
    TopicPartition,
    assignor_by_name,
)
from .classic_group import ClassicGroup
from .codec import (
    MAX_ID_BYTES,
    OFFSETS_TOPIC,
    GroupRecord,
    coordinator_partition,
    group_id_error,
)
from .consumer_group import ConsumerGroup
from .coordinator import GroupCoordinator
from .model import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    PARKED,
    TEMPORARY_LEAVE_EPOCH,
    ClassicState,
    DescribeAnswer,
    GroupConfig,
    GroupDescription,
    GroupListing,
    GroupState,
    HeartbeatResult,
    JoinAnswer,
    LeaveAnswer,
    MemberDescription,
    MemberOptions,
    MemberState,
    OffsetFetchAnswer,
    SyncAnswer,
)
from .offsets import CommittedOffset, NewOffset, OffsetEntry, OffsetStore

__all__ = [
    "JOIN_EPOCH",
    "LEAVE_EPOCH",
    "MAX_ID_BYTES",
    "OFFSETS_TOPIC",
    "PARKED",
    "TEMPORARY_LEAVE_EPOCH",
    "Assignor",
    "ClassicGroup",
    "ClassicState",
    "CommittedOffset",
    "ConsumerGroup",
    "DescribeAnswer",
    "GroupConfig",
    "GroupCoordinator",
    "GroupDescription",
    "GroupListing",
    "GroupRecord",
    "GroupState",
    "HeartbeatResult",
    "JoinAnswer",
    "LeaveAnswer",
    "MemberDescription",
    "MemberOptions",
    "MemberState",
    "NewOffset",
    "OffsetEntry",
    "OffsetFetchAnswer",
    "OffsetStore",
    "RangeAssignor",
    "RoundRobinAssignor",
    "StickyAssignor",
    "SyncAnswer",
    "TopicPartition",
    "assignor_by_name",
    "coordinator_partition",
    "group_id_error",
]
