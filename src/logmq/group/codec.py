"""Keys and values of the records consumer groups keep in ``__consumer_offsets``.

The topic is compacted: for each key only the newest value matters and a value of
``None`` (a tombstone) deletes the key. Keys and values are msgpack. A key is an array
whose first element is the record type, then the group id, then what identifies the
item inside the group; a value is a map with a format version ``v`` so fields can be
added later without breaking old readers.

Which partition of ``__consumer_offsets`` holds a group (and therefore which broker
coordinates it) is :func:`coordinator_partition`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import msgpack
import xxhash

from .assignors import TopicPartition

OFFSETS_TOPIC = "__consumer_offsets"
FORMAT_VERSION = 0


class RecordType(IntEnum):
    OFFSET_COMMIT = 0  # key: [0, group, topic, partition]
    GROUP_METADATA = 1  # key: [1, group]
    MEMBER_METADATA = 2  # key: [2, group, member_id]
    TARGET_ASSIGNMENT = 3  # key: [3, group, member_id]
    TARGET_ASSIGNMENT_METADATA = 4  # key: [4, group]
    CURRENT_ASSIGNMENT = 5  # key: [5, group, member_id]
    CLASSIC_GROUP = 6  # key: [6, group]: a classic-protocol group, whole (group/classic_group.py)


# record types keyed by the group alone
_GROUP_KEYS = (
    RecordType.GROUP_METADATA,
    RecordType.TARGET_ASSIGNMENT_METADATA,
    RecordType.CLASSIC_GROUP,
)


@dataclass(slots=True, frozen=True)
class GroupRecord:
    """One record to append to (or read from) the compacted offsets topic."""

    key: bytes
    value: bytes | None  # None is a tombstone
    # a transactional offset commit: written in that producer's transactional batch, so
    # the partition's COMMIT or ABORT marker for the producer decides whether it counts
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(slots=True, frozen=True)
class RecordKey:
    type: RecordType
    group_id: str
    member_id: str = ""  # member records
    topic: str = ""  # offset records
    partition: int = -1  # offset records


def coordinator_partition(group_id: str, partition_count: int) -> int:
    """The ``__consumer_offsets`` partition whose leader coordinates ``group_id``."""
    return xxhash.xxh32_intdigest(group_id.encode()) % partition_count


def encode_key(key: RecordKey) -> bytes:
    if key.type is RecordType.OFFSET_COMMIT:
        parts: list[Any] = [int(key.type), key.group_id, key.topic, key.partition]
    elif key.type in _GROUP_KEYS:
        parts = [int(key.type), key.group_id]
    else:
        parts = [int(key.type), key.group_id, key.member_id]
    return msgpack.packb(parts)


def decode_key(raw: bytes) -> RecordKey:
    """Parse a key; raises ValueError on anything that is not a group record key."""
    try:
        parts = msgpack.unpackb(raw)
        kind = RecordType(parts[0])
        group_id = parts[1]
        if not isinstance(group_id, str):
            raise TypeError("group id must be a string")
        if kind is RecordType.OFFSET_COMMIT:
            topic, partition = parts[2], parts[3]
            if not isinstance(topic, str) or type(partition) is not int:
                raise TypeError("bad offset key")
            return RecordKey(kind, group_id, topic=topic, partition=partition)
        if kind in _GROUP_KEYS:
            return RecordKey(kind, group_id)
        if not isinstance(parts[2], str):
            raise TypeError("member id must be a string")
        return RecordKey(kind, group_id, member_id=parts[2])
    except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException) as exc:
        raise ValueError(f"not a consumer group record key: {raw!r}") from exc


def encode_value(fields: Mapping[str, Any]) -> bytes:
    return msgpack.packb({"v": FORMAT_VERSION, **fields})


def decode_value(raw: bytes) -> dict[str, Any]:
    try:
        value = msgpack.unpackb(raw, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ValueError("corrupt consumer group record value") from exc
    version = value.get("v", FORMAT_VERSION) if isinstance(value, dict) else None
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError("unsupported consumer group record value")
    return value


def pack_partitions(partitions: Iterable[TopicPartition]) -> dict[str, list[int]]:
    """``{(t, p), ...}`` -> ``{t: [sorted p]}`` (sorted topics): compact and canonical."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return by_topic


def unpack_partitions(packed: Mapping[str, Iterable[int]]) -> set[TopicPartition]:
    return {(topic, int(p)) for topic, ps in packed.items() for p in ps}


MAX_ID_BYTES = 1024  # group, member and instance ids: they are part of every record key


def group_id_error(group_id: str) -> str | None:
    """Why ``group_id`` cannot name a group, or None (both protocols' check)."""
    if not group_id:
        return "the group id is empty"
    if len(group_id.encode()) > MAX_ID_BYTES:
        return f"the group id is longer than {MAX_ID_BYTES} bytes"
    return None
