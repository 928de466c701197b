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
    abort_check_interval_ms: int = 10_000  # how often tick() looks for timeouts, expiry


@dataclass(slots=True, frozen=True)
class InitProducerIdResult:
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(slots=True, frozen=True)
class MarkerJob:
    """WriteTxnMarkers to send: one marker per partition, to each partition's leader.

    ``job_id`` names this attempt; hand the job back to
    :meth:`TransactionCoordinator.markers_written` so a delayed or duplicated completion
    of an earlier job cannot complete a later transaction of the same producer id and
    epoch.
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    commit: bool
    partitions: tuple[TopicPartition, ...]
    job_id: int


class NeedProducerId:
    """The answer of an InitProducerId that needs a fresh producer id and was given none:
    nothing changed; allocate one (the broker's allocator is async, the core is not) and
    ask again with it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_PRODUCER_ID"


NEED_PRODUCER_ID = NeedProducerId()


@dataclass(slots=True, frozen=True)
class Expired:
    """What one ``tick`` did: transactions aborted for their timeout (their producer
    fenced), and ids removed after ``id_expiration_ms`` idle."""

    timed_out: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


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
    """The state of one transactional id (ahead of the log until the shell's round is
    durable; the shell rebuilds it from the log if the round fails)."""

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
