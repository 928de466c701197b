"""Keys and values of the records the transaction coordinator keeps in ``__transaction_state``.

The topic is compacted: one key per transactional id, the newest value is the id's whole
state, and a tombstone (value ``None``) means the id expired. Keys and values are msgpack:
a key is ``[0, transactional_id]`` (the leading record type leaves room for other record
kinds), a value is a map with a format version ``v`` so fields can be added without
breaking old readers (unknown fields are ignored, a newer version is refused).

Everything decoded here comes from disk or a replica and may be damaged: every decoder
raises :class:`TxnRecordError` (a LogMQError and a ValueError) for anything malformed,
never another error.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import msgpack
import xxhash

from logmq.errors import ErrorCode, LogMQError

TXN_STATE_TOPIC = "__transaction_state"
FORMAT_VERSION = 0
KEY_TYPE_TXN = 0

TopicPartition = tuple[str, int]

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_EPOCH = 32767  # Short.MaxValue: kept free so a coordinator can always fence
MAX_PRODUCER_ID = (1 << 63) - 1
MAX_INT32 = (1 << 31) - 1
MAX_ID_BYTES = 1024  # a transactional id is part of every key


class TxnRecordError(LogMQError, ValueError):
    """A ``__transaction_state`` key or value that cannot be read."""

    code = ErrorCode.CORRUPT_MESSAGE


class TxnState(IntEnum):
    """Kafka's transaction states with Kafka's ids (also the ids stored in values)."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """The name DescribeTransactions and ListTransactions use ("PrepareCommit")."""
        return _KAFKA_NAMES[self]

    @classmethod
    def from_kafka_name(cls, name: str) -> TxnState | None:
        return _BY_KAFKA_NAME.get(name)


_KAFKA_NAMES = {
    TxnState.EMPTY: "Empty",
    TxnState.ONGOING: "Ongoing",
    TxnState.PREPARE_COMMIT: "PrepareCommit",
    TxnState.PREPARE_ABORT: "PrepareAbort",
    TxnState.COMPLETE_COMMIT: "CompleteCommit",
    TxnState.COMPLETE_ABORT: "CompleteAbort",
    TxnState.DEAD: "Dead",
    TxnState.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}
_BY_KAFKA_NAME = {name: state for state, name in _KAFKA_NAMES.items()}


@dataclass(slots=True, frozen=True)
class TxnRecord:
    """One record to append to (or read from) a ``__transaction_state`` partition."""

    key: bytes
    value: bytes | None  # None is a tombstone


@dataclass(slots=True, frozen=True)
class TxnStateValue:
    """The whole persisted state of one transactional id."""

    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: tuple[TopicPartition, ...] = ()  # sorted, distinct
    txn_start_ms: int = -1  # -1: no transaction open
    last_update_ms: int = -1
    # the producer id before the last bump (KIP-360: lets a retried InitProducerId of
    # a producer whose epochs ran out be recognised after a rotation)
    previous_producer_id: int = NO_PRODUCER_ID
    # reserved for KIP-890 part 2 (the id a rotation at EndTxn will hand out); always -1
    next_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_PRODUCER_EPOCH  # KIP-360: the epoch a retry may present


def coordinator_partition(transactional_id: str, partition_count: int) -> int:
    """The ``__transaction_state`` partition whose leader coordinates ``transactional_id``."""
    return xxhash.xxh32_intdigest(transactional_id.encode()) % partition_count


def encode_key(transactional_id: str) -> bytes:
    return msgpack.packb([KEY_TYPE_TXN, transactional_id])


def decode_key(raw: bytes) -> str:
    """The transactional id of a key."""
    parts = _unpack(raw, "key")
    if not isinstance(parts, list) or len(parts) != 2 or type(parts[0]) is not int:
        raise TxnRecordError(f"not a transaction state key: {bytes(raw)[:64]!r}")
    if parts[0] != KEY_TYPE_TXN:
        raise TxnRecordError(f"unknown transaction state key type {parts[0]}")
    txn_id = parts[1]
    if not isinstance(txn_id, str) or not txn_id:
        raise TxnRecordError("transactional id must be a non-empty string")
    return txn_id


def encode_value(value: TxnStateValue) -> bytes:
    return msgpack.packb(
        {
            "v": FORMAT_VERSION,
            "producer_id": value.producer_id,
            "previous_producer_id": value.previous_producer_id,
            "next_producer_id": value.next_producer_id,
            "producer_epoch": value.producer_epoch,
            "last_producer_epoch": value.last_producer_epoch,
            "timeout_ms": value.timeout_ms,
            "state": int(value.state),
            "partitions": [[t, p] for t, p in sorted(set(value.partitions))],
            "txn_start_ms": value.txn_start_ms,
            "last_update_ms": value.last_update_ms,
        }
    )


def decode_value(raw: bytes) -> TxnStateValue:
    fields = _unpack(raw, "value")
    if not isinstance(fields, dict):
        raise TxnRecordError("transaction state value is not a map")
    version = fields.get("v", FORMAT_VERSION)
    if type(version) is not int or not 0 <= version <= FORMAT_VERSION:
        raise TxnRecordError(f"unsupported transaction state value version {version!r}")
    state_id = _int(fields, "state", 0, max(TxnState))
    return TxnStateValue(
        producer_id=_int(fields, "producer_id", NO_PRODUCER_ID, MAX_PRODUCER_ID),
        producer_epoch=_int(fields, "producer_epoch", NO_PRODUCER_EPOCH, MAX_EPOCH),
        timeout_ms=_int(fields, "timeout_ms", 0, MAX_INT32),
        state=TxnState(state_id),
        partitions=_partitions(fields.get("partitions")),
        txn_start_ms=_int(fields, "txn_start_ms", -1, 1 << 62),
        last_update_ms=_int(fields, "last_update_ms", -1, 1 << 62),
        previous_producer_id=_int(fields, "previous_producer_id", -1, MAX_PRODUCER_ID),
        next_producer_id=_int(fields, "next_producer_id", -1, MAX_PRODUCER_ID),
        last_producer_epoch=_int(fields, "last_producer_epoch", -1, MAX_EPOCH),
    )


def state_record(transactional_id: str, value: TxnStateValue | None) -> TxnRecord:
    """The record that persists ``value`` (or removes the id, for ``None``)."""
    return TxnRecord(encode_key(transactional_id), None if value is None else encode_value(value))


def _unpack(raw: bytes, what: str) -> Any:
    try:
        return msgpack.unpackb(raw, strict_map_key=False)
    except Exception as exc:  # msgpack raises a zoo of types for garbage: one answer
        raise TxnRecordError(f"corrupt transaction state {what}") from exc


def _int(fields: dict, name: str, low: int, high: int) -> int:
    value = fields.get(name)
    if type(value) is not int or not low <= value <= high:  # bool is not an int here
        raise TxnRecordError(f"transaction state field {name!r} is {value!r}")
    return value


def _partitions(raw: Any) -> tuple[TopicPartition, ...]:
    if not isinstance(raw, list):
        raise TxnRecordError("transaction state partitions are not a list")
    out: set[TopicPartition] = set()
    for item in raw:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not isinstance(item[0], str)
            or type(item[1]) is not int
            or not 0 <= item[1] <= MAX_INT32
        ):
            raise TxnRecordError(f"bad transaction partition {item!r}")
        out.add((item[0], item[1]))
    return tuple(sorted(out))
