"""One error-code enum shared by the broker and every client, and the error model.

Codes travel in protocol bodies as plain integers (``"error": 6``). Numbers follow
Kafka's where the meaning is the same, so operators can map what they know.

The model (docs/design.md, "Errors"; tests/test_error_model.py keeps it):

* One tree: every error raised for a reason a client or operator should hear of is a
  :class:`LogMQError` carrying its ``ErrorCode`` (``ValueError`` stays a second base
  where callers caught that). Only exceptions that never leave their module stay out.
* A whole request's failure is raised by the service and mapped once: by the pipeline
  (the door's error answer with the code) or by the handler for a richer answer.
* A per-entity answer (a partition of a produce, a group of DescribeGroups) is a typed
  result carrying ``error`` and ``message`` and its payload: :class:`Outcome` or a
  subclass, never an exception passed as a value, never a bare tuple.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from enum import IntEnum
from typing import Self


class ErrorCode(IntEnum):
    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    BROKER_NOT_AVAILABLE = 8
    REPLICA_NOT_AVAILABLE = 9
    MESSAGE_TOO_LARGE = 10
    OFFSET_METADATA_TOO_LARGE = 12
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28  # one offset commit too big to write as one batch
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    INVALID_PRODUCER_ID_MAPPING = 49
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51  # a state change of that transactional id is under way
    TRANSACTION_COORDINATOR_FENCED = 52
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    SECURITY_DISABLED = 54
    OPERATION_NOT_ATTEMPTED = 55  # a request's other items failed first
    STORAGE_ERROR = 56
    SASL_AUTHENTICATION_FAILED = 58
    UNKNOWN_PRODUCER_ID = 59
    REASSIGNMENT_IN_PROGRESS = 60  # the partition is already moving
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    FETCH_SESSION_ID_NOT_FOUND = 70
    INVALID_FETCH_SESSION_EPOCH = 71
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    STALE_BROKER_EPOCH = 77
    MEMBER_ID_REQUIRED = 79
    PREFERRED_LEADER_NOT_AVAILABLE = 80
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82
    ELIGIBLE_LEADERS_NOT_AVAILABLE = 83
    ELECTION_NOT_NEEDED = 84
    NO_REASSIGNMENT_IN_PROGRESS = 85  # cancel of a partition that is not moving
    INVALID_RECORD = 87
    UNSTABLE_OFFSET_COMMIT = 88  # OffsetFetch require_stable: a transaction holds offsets
    THROTTLING_QUOTA_EXCEEDED = 89  # controller_mutation_rate (KIP-599); retry after the throttle
    PRODUCER_FENCED = 90
    RESOURCE_NOT_FOUND = 91
    DUPLICATE_RESOURCE = 92
    UNACCEPTABLE_CREDENTIAL = 93
    INVALID_UPDATE_VERSION = 95
    UNKNOWN_TOPIC_ID = 100
    BROKER_ID_NOT_REGISTERED = 102
    INCONSISTENT_CLUSTER_ID = 104
    TRANSACTIONAL_ID_NOT_FOUND = 105
    INELIGIBLE_REPLICA = 107
    # KIP-405: a follower's fetch offset is below the leader's local log start; the
    # follower builds its state from the remote tier and fetches the local tail
    OFFSET_MOVED_TO_TIERED_STORAGE = 109
    FENCED_MEMBER_EPOCH = 110
    UNSUPPORTED_ASSIGNOR = 112
    STALE_MEMBER_EPOCH = 113
    TRANSACTION_ABORTABLE = 120
    # logmq-specific codes start at 1000.
    REQUEST_TOO_LARGE = 1000
    UNKNOWN_API = 1001
    INVALID_FRAME = 1002
    TOO_MANY_CONNECTIONS = 1003
    # Kafka's KAFKA_STORAGE_ERROR caused by a full disk (or the free-space guard). Not
    # retriable: retrying against a full disk only turns a clear error into a timeout.
    KAFKA_STORAGE_FULL = 1004

    @property
    def retriable(self) -> bool:
        return self in _RETRIABLE


_RETRIABLE = frozenset(
    {
        ErrorCode.CORRUPT_MESSAGE,  # corrupted in transit: resend
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.UNKNOWN_TOPIC_ID,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.BROKER_NOT_AVAILABLE,
        ErrorCode.REPLICA_NOT_AVAILABLE,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.REBALANCE_IN_PROGRESS,
        ErrorCode.STORAGE_ERROR,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.NOT_CONTROLLER,
        ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
        ErrorCode.FETCH_SESSION_ID_NOT_FOUND,  # start a new session
        ErrorCode.INVALID_FETCH_SESSION_EPOCH,
        ErrorCode.CONCURRENT_TRANSACTIONS,  # retry once the pending change is written
    }
)


class LogMQError(Exception):
    """Base of every logmq error; carries the wire code."""

    code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str = "", code: ErrorCode | int | None = None):
        if code is not None:
            self.code = ErrorCode(code)
        super().__init__(message or self.code.name)

    @property
    def retriable(self) -> bool:
        return self.code.retriable


@dataclass(slots=True)
class Outcome:
    """One entity's answer in a request answered per entity (a partition of a produce or
    of a marker write, a group, a topic): NONE, or the code and message its entry gets.

    The service returns one per entity, never an exception as a value; a result with a
    payload extends it (``ProduceResult``, ``DeletedRecords``). Not frozen: a frozen
    dataclass costs five times as much to build, once per partition of every produce."""

    error: ErrorCode = ErrorCode.NONE
    message: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is ErrorCode.NONE

    @classmethod
    def failed(cls, exc: LogMQError) -> Self:
        """The entity's answer for the error its work raised."""
        return cls(exc.code, str(exc))


OK = Outcome()


class CorruptRecordError(LogMQError):
    """A batch failed validation (length, version, checksum, offsets)."""

    code = ErrorCode.CORRUPT_MESSAGE


class OffsetOutOfRangeError(LogMQError):
    code = ErrorCode.OFFSET_OUT_OF_RANGE


class UnknownTopicOrPartitionError(LogMQError):
    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


class MessageTooLargeError(LogMQError):
    code = ErrorCode.MESSAGE_TOO_LARGE


class InvalidRecordError(LogMQError):
    """A valid batch whose records break a topic rule (a keyless record in a compacted topic).

    ``record_errors`` names the offending records, ``(index, message)``, so a Kafka
    producer can fail just those (KIP-467).
    """

    code = ErrorCode.INVALID_RECORD

    def __init__(
        self,
        message: str = "",
        code: ErrorCode | int | None = None,
        *,
        record_errors: tuple[tuple[int, str | None], ...] = (),
    ) -> None:
        super().__init__(message, code)
        self.record_errors = record_errors


class StorageError(LogMQError):
    """An I/O error on the log; the log stays readable."""

    code = ErrorCode.STORAGE_ERROR


class DiskFullError(StorageError):
    """The broker's data directory is full (or below its free-space guard): nothing of
    the refused write was stored. Retry once space is freed, or produce to a partition
    whose leader has room."""

    code = ErrorCode.KAFKA_STORAGE_FULL


class InvalidConfigError(LogMQError):
    code = ErrorCode.INVALID_CONFIG


class UnsupportedVersionError(LogMQError):
    code = ErrorCode.UNSUPPORTED_VERSION


class OutOfOrderSequenceError(LogMQError):
    code = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


class InvalidProducerEpochError(LogMQError):
    code = ErrorCode.INVALID_PRODUCER_EPOCH


class TransactionCoordinatorFencedError(LogMQError):
    """A marker from a coordinator older than the last one this partition heard from."""

    code = ErrorCode.TRANSACTION_COORDINATOR_FENCED


class ProducerFencedError(LogMQError):
    """A newer producer with the same transactional id (or the coordinator, after a
    transaction timed out) bumped the epoch: this producer can never write or end a
    transaction again. Fatal: close it (a new one calls init_transactions). Raised for
    INVALID_PRODUCER_EPOCH from a transaction's coordinator too (``.code`` says which)."""

    code = ErrorCode.PRODUCER_FENCED


class TransactionalIdAuthorizationError(LogMQError):
    """The principal may not WRITE (or DESCRIBE) this transactional id. Fatal."""

    code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


class TransactionStateError(LogMQError):
    """A transactional call out of order: a send outside begin/commit, a commit with no
    transaction begun, or the coordinator's INVALID_TXN_STATE."""

    code = ErrorCode.INVALID_TXN_STATE


class RequestTimedOutError(LogMQError):
    code = ErrorCode.REQUEST_TIMED_OUT


class ConnectionError_(LogMQError):
    """The broker connection failed or closed; retriable."""

    code = ErrorCode.NETWORK_EXCEPTION


class InvalidFrameError(LogMQError):
    """A protocol frame could not be parsed."""

    code = ErrorCode.INVALID_FRAME


class FrameTooLargeError(InvalidFrameError):
    code = ErrorCode.REQUEST_TOO_LARGE


_BY_CODE: dict[ErrorCode, type[LogMQError]] = {}
for _cls in list(globals().values()):
    if isinstance(_cls, type) and issubclass(_cls, LogMQError) and _cls is not LogMQError:
        _BY_CODE.setdefault(_cls.code, _cls)


def error_for(code: int, message: str = "") -> LogMQError:
    """Build the most specific exception for a wire error code."""
    try:
        ec = ErrorCode(code)
    except ValueError:
        return LogMQError(message or f"unknown error code {code}")
    cls = _BY_CODE.get(ec, LogMQError)
    if cls is LogMQError:
        return LogMQError(message, ec)
    return cls(message)


# Raised by the consumer for conditions several wire codes lead to; kept out of
# ``error_for``'s table because those codes mean other things for other requests.
class CommitFailedError(LogMQError):
    """An offset commit was refused because this consumer is no longer the group member
    that owned the partitions (fenced, expired or replaced): another member may already
    be processing them, so the records consumed since the last commit may be processed
    twice. ``.code`` is the broker's reason (UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH...)."""

    code = ErrorCode.UNKNOWN_MEMBER_ID


def storage_error_for(err: OSError, what: str) -> StorageError:
    """The error for a failed system call on storage: DiskFullError on ENOSPC/EDQUOT."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(f"disk full {what}: {err.strerror or err}")
    return StorageError(f"I/O error {what}: {err}")


class BootstrapError(LogMQError):
    """No bootstrap address accepted a connection, and this client has never reached its
    cluster: most likely a wrong address or no broker running, which retrying until the
    request timeout would only hide. The client raises it at once instead of retrying;
    a later attempt may succeed (a broker starting up), hence ``retriable``. Not a
    ConnectionError_, which the client's own retry loops take as transient."""

    code = ErrorCode.NETWORK_EXCEPTION


class NoOffsetForPartitionError(OffsetOutOfRangeError):
    """A partition has no committed offset and ``auto_offset_reset`` is ``"none"``."""


class ReassignmentError(LogMQError):
    """A partition reassignment request was refused as a whole: nothing started.

    ``.code`` is the request's error; ``.partitions`` maps each failing
    ``(topic, partition)`` to its ``(ErrorCode, message)``. Kept out of ``error_for``'s
    table: its code is whichever reason the controller gave.
    """

    code = ErrorCode.INVALID_REPLICA_ASSIGNMENT

    def __init__(
        self,
        message: str = "",
        code: ErrorCode | int | None = None,
        partitions: dict[tuple[str, int], tuple[ErrorCode, str]] | None = None,
    ):
        super().__init__(message, code)
        self.partitions = dict(partitions or {})
