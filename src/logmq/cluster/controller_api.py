"""What the controller is asked and what it answers (the shell maps these to the wire).

Plain frozen dataclasses, so the broker's request handlers and the tests build them
without touching the controller's state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from logmq.cluster.metadata_image import PartitionRegistration, TopicPartition
from logmq.cluster.metadata_records import Record
from logmq.errors import ErrorCode
from logmq.security.acl import AclBinding
from logmq.storage.remote.segment_metadata import RemoteSegment, SegmentState

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    session_timeout_ms: int = 9_000
    default_partitions: int = 1
    default_replication_factor: int = 1
    auto_leader_rebalance: bool = True
    leader_rebalance_interval_ms: int = 300_000
    # the controller's broker-wide topic config defaults (--topic-config), under each
    # topic's own settings when it checks them (e.g. min.insync.replicas of a move)
    topic_defaults: Mapping[str, str] = field(default_factory=dict)
    # remote.log.storage.system.enable: topics may set remote.storage.enable=true
    remote_storage_enabled: bool = False


@dataclass(frozen=True, slots=True)
class ApiResult:
    error: ErrorCode = ErrorCode.NONE
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.error is ErrorCode.NONE


OK = ApiResult()


@dataclass(slots=True)
class ControllerResult(Generic[T]):
    """Records to propose (one atomic batch) and the response to send once committed."""

    records: list[Record]
    response: T


@dataclass(frozen=True, slots=True)
class NewTopic:
    name: str
    num_partitions: int = -1  # -1: the controller's default
    replication_factor: int = -1
    assignments: Mapping[int, Sequence[int]] | None = None  # partition -> replicas
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CreateTopicResult:
    error: ErrorCode = ErrorCode.NONE
    message: str = ""
    topic_id: str | None = None
    partitions: tuple[PartitionRegistration, ...] = ()


@dataclass(frozen=True, slots=True)
class RegistrationResponse:
    error: ErrorCode = ErrorCode.NONE
    message: str = ""
    broker_epoch: int = -1


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    error: ErrorCode = ErrorCode.NONE
    message: str = ""
    fenced: bool = True
    should_shutdown: bool = False


@dataclass(frozen=True, slots=True)
class AlterPartitionRequest:
    broker_id: int
    broker_epoch: int
    topic: str
    partition: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AlterPartitionResponse:
    error: ErrorCode = ErrorCode.NONE
    message: str = ""
    partition: PartitionRegistration | None = None  # the state after the change


@dataclass(frozen=True, slots=True)
class ProducerIdsResponse:
    error: ErrorCode = ErrorCode.NONE
    message: str = ""
    start: int = -1  # ids start .. start+count-1 are this broker's
    count: int = 0


@dataclass(frozen=True, slots=True)
class ReassignmentResult:
    """Started (or cancelled) all, or nothing: ``error`` names the first refusal."""

    error: ErrorCode = ErrorCode.NONE
    message: str = ""
    partitions: Mapping[TopicPartition, ApiResult] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is ErrorCode.NONE


@dataclass(frozen=True, slots=True)
class AclDeleteResult:
    """What one DeleteAcls filter removed (a binding matched by two filters of a request
    is reported by the first)."""

    error: ErrorCode = ErrorCode.NONE
    message: str = ""
    deleted: tuple[AclBinding, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is ErrorCode.NONE


@dataclass(frozen=True, slots=True)
class ClientQuotaAlteration:
    """Quota changes of one entity: ``entity`` maps "user"/"client-id" to a name (None:
    that type's default entity); ``ops`` maps a quota key to its new value (None: remove)."""

    entity: Mapping[str, str | None]
    ops: Mapping[str, float | None]


@dataclass(frozen=True, slots=True)
class RemoteSegmentChange:
    """One change a partition leader asks for (cluster/remote_segments.py has the rules).

    Either ``segment`` is set (a new copy, in COPY_STARTED; ``state`` is then
    COPY_STARTED and ``segment_id`` its id) or it is None and the segment ``segment_id``
    moves to ``state`` (``checksum``: set at COPY_FINISHED; "" keeps the segment's).
    ``corrupt`` marks a COPY_FINISHED segment found corrupt (``state`` COPY_FINISHED).
    Build them with ``copy_started``, ``state_change`` and ``found_corrupt``.
    """

    topic_id: str
    partition: int
    leader_epoch: int  # the requester's leader epoch of the partition
    segment_id: str
    state: SegmentState
    segment: RemoteSegment | None = None
    checksum: str = ""
    event_ms: int = 0
    corrupt: bool = False

    @classmethod
    def found_corrupt(
        cls, segment: RemoteSegment, leader_epoch: int, event_ms: int
    ) -> RemoteSegmentChange:
        return cls(
            segment.topic_id,
            segment.partition,
            leader_epoch,
            segment.segment_id,
            SegmentState.COPY_FINISHED,
            None,
            "",
            event_ms,
            True,
        )

    @classmethod
    def copy_started(cls, segment: RemoteSegment, leader_epoch: int) -> RemoteSegmentChange:
        return cls(
            segment.topic_id,
            segment.partition,
            leader_epoch,
            segment.segment_id,
            SegmentState.COPY_STARTED,
            segment,
            segment.checksum,
            segment.event_ms,
        )

    @classmethod
    def state_change(
        cls,
        topic_id: str,
        partition: int,
        segment_id: str,
        state: SegmentState,
        leader_epoch: int,
        *,
        checksum: str = "",
        event_ms: int = 0,
    ) -> RemoteSegmentChange:
        return cls(topic_id, partition, leader_epoch, segment_id, state, None, checksum, event_ms)
