"""The transaction coordinator's data: per-id metadata, and what its calls answer.

Kept apart from coordinator.py (the state machine) so the shells and doors that read
these types need not know the machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ErrorCode
from .codec import (
    MAX_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    TopicPartition,
    TxnRecord,
    TxnState,
    TxnStateValue,
)


def is_epoch_exhausted(epoch: int) -> bool:
    """Clients never get the last epoch, so a coordinator can always fence one more time."""
    return epoch >= MAX_EPOCH - 1


@dataclass(slots=True, frozen=True)
class TxnConfig:
    max_timeout_ms: int = 900_000  # transaction.max.timeout.ms
    id_expiration_ms: int = 604_800_000  # transactional.id.expiration.ms
    abort_check_interval_ms: int = 10_000  # how often the shell should call expire()


@dataclass(slots=True, frozen=True)
class InitProducerIdResult:
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(slots=True, frozen=True)
class MarkerJob:
    """WriteTxnMarkers to send: one marker per partition, to each partition's leader.

    ``job_id`` names this attempt; hand it back to :meth:`TransactionCoordinator.markers_written`
    so a delayed or duplicated completion of an earlier job cannot complete a later
    transaction of the same producer id and epoch.
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    commit: bool
    partitions: tuple[TopicPartition, ...]
    job_id: int


Answer = InitProducerIdResult | ErrorCode | None


@dataclass(slots=True, frozen=True, eq=False)
class Pending:
    """A state change waiting for its record to be written (compared by identity)."""

    transactional_id: str
    records: tuple[TxnRecord, ...]
    answer: Answer  # send after written(); None when no client waits (timeouts, markers)
    target: TxnStateValue | None  # None: the id is removed
    epoch_fence: bool = False  # a bump that fences the current producer


@dataclass(slots=True, frozen=True)
class TransactionDescription:
    transactional_id: str
    error: ErrorCode
    state: str = ""  # Kafka's spelling: "Empty", "Ongoing", "PrepareCommit", ...
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    timeout_ms: int = 0
    txn_start_ms: int = -1
    partitions: tuple[TopicPartition, ...] = ()


@dataclass(slots=True, frozen=True)
class TransactionListing:
    transactional_id: str
    producer_id: int
    state: str


@dataclass(slots=True, frozen=True)
class ListTransactionsResult:
    transactions: list[TransactionListing]
    unknown_state_filters: list[str]


@dataclass(slots=True)
class TransactionMetadata:
    """The committed state of one transactional id, plus the change in flight (if any)."""

    transactional_id: str
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    timeout_ms: int = 0
    state: TxnState = TxnState.EMPTY
    partitions: frozenset[TopicPartition] = frozenset()
    txn_start_ms: int = -1
    last_update_ms: int = -1
    previous_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    pending: Pending | None = None
    # False until the first record of a new id is written: not visible to anyone yet
    exists: bool = True
    # an epoch fence whose write failed: the bumped epoch stays in memory (the zombie
    # stays fenced) and the next fence reuses it instead of bumping again
    has_failed_epoch_fence: bool = False
    marker_job_id: int | None = None  # the job of a Prepare* state

    def value(self) -> TxnStateValue:
        return TxnStateValue(
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            timeout_ms=self.timeout_ms,
            state=self.state,
            partitions=tuple(sorted(self.partitions)),
            txn_start_ms=self.txn_start_ms,
            last_update_ms=self.last_update_ms,
            previous_producer_id=self.previous_producer_id,
            last_producer_epoch=self.last_producer_epoch,
        )

    def apply(self, value: TxnStateValue) -> None:
        self.producer_id = value.producer_id
        self.producer_epoch = value.producer_epoch
        self.timeout_ms = value.timeout_ms
        self.state = value.state
        self.partitions = frozenset(value.partitions)
        self.txn_start_ms = value.txn_start_ms
        self.last_update_ms = value.last_update_ms
        self.previous_producer_id = value.previous_producer_id
        self.last_producer_epoch = value.last_producer_epoch
        self.exists = True
