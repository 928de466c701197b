"""Bytes for Raft messages between brokers, and for entries/snapshots on disk.

A message is one msgpack array: ``[type, src, dst, term, *fields]`` with the fields in
dataclass order; an entry is ``[index, term, kind, data]``; a snapshot is
``[index, term, data]``. Decoding checks every type and count, so a corrupt or hostile
frame becomes a RaftCodecError (a ValueError) and never a half-built message that could
trip the core. Numbers are not sanity-checked here: RaftNode.step does that.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from functools import cache
from typing import Any

import msgpack

from logmq.errors import CorruptRecordError
from logmq.replication.raft_messages import (
    AppendRequest,
    AppendResponse,
    Entry,
    EntryKind,
    HeartbeatRequest,
    HeartbeatResponse,
    Message,
    Snapshot,
    SnapshotRequest,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)


class RaftCodecError(CorruptRecordError, ValueError):
    pass


# Type codes are part of the wire format: append only, never renumber.
_TYPES: dict[int, type] = {
    1: VoteRequest,
    2: VoteResponse,
    3: AppendRequest,
    4: AppendResponse,
    5: HeartbeatRequest,
    6: HeartbeatResponse,
    7: SnapshotRequest,
    8: TimeoutNow,
}
_CODES = {cls: code for code, cls in _TYPES.items()}

# Field kinds after src, dst, term: i = int, b = bool, E = entries, S = snapshot.
_FIELDS: dict[type, str] = {
    VoteRequest: "iibb",
    VoteResponse: "bb",
    AppendRequest: "iiEi",
    AppendResponse: "biii",
    HeartbeatRequest: "i",
    HeartbeatResponse: "",
    SnapshotRequest: "S",
    TimeoutNow: "",
}


def encode_entry(entry: Entry) -> list[Any]:
    return [entry.index, entry.term, int(entry.kind), entry.data]


def decode_entry(raw: Any) -> Entry:
    if not (isinstance(raw, list) and len(raw) == 4):
        raise RaftCodecError(f"an entry is a 4-item array, got {raw!r:.80}")
    index, term, kind, data = raw
    try:
        kind = EntryKind(kind)
    except ValueError:
        raise RaftCodecError(f"unknown entry kind {kind!r}")
    return Entry(index=_int(index), term=_int(term), data=_bytes(data), kind=kind)


def encode_snapshot(snapshot: Snapshot) -> list[Any]:
    return [snapshot.index, snapshot.term, snapshot.data]


def decode_snapshot(raw: Any) -> Snapshot:
    if not (isinstance(raw, list) and len(raw) == 3):
        raise RaftCodecError(f"a snapshot is a 3-item array, got {raw!r:.80}")
    return Snapshot(index=_int(raw[0]), term=_int(raw[1]), data=_bytes(raw[2]))


def encode_message(msg: Message) -> bytes:
    cls = type(msg)
    out: list[Any] = [_CODES[cls], msg.src, msg.dst, msg.term]
    for name, kind in zip(_names(cls), _FIELDS[cls], strict=True):
        value = getattr(msg, name)
        if kind == "E":
            value = [encode_entry(e) for e in value]
        elif kind == "S":
            value = encode_snapshot(value)
        out.append(value)
    return msgpack.packb(out, use_bin_type=True)


def decode_message(data: bytes | bytearray | memoryview) -> Message:
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise RaftCodecError(f"not a msgpack Raft message: {exc}")
    if not (isinstance(raw, list) and len(raw) >= 4):
        raise RaftCodecError("a Raft message is an array [type, src, dst, term, ...]")
    cls = _TYPES.get(raw[0]) if isinstance(raw[0], int) else None
    if cls is None:
        raise RaftCodecError(f"unknown Raft message type {raw[0]!r:.20}")
    kinds = _FIELDS[cls]
    if len(raw) != 4 + len(kinds):
        raise RaftCodecError(f"{cls.__name__} needs {4 + len(kinds)} items, got {len(raw)}")
    values = [_int(v) for v in raw[1:4]]
    for kind, value in zip(kinds, raw[4:], strict=True):
        values.append(_DECODERS[kind](value))
    return cls(*values)


@cache
def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))[3:]  # after src, dst, term


# Ids, terms and indexes are stored as int64 and only ever grow by one: a bigger value is
# hostile, and one at the int64 edge would overflow the hard state at the next election.
_MAX_INT = 1 << 62


def _int(value: Any) -> int:
    if type(value) is not int or not 0 <= value <= _MAX_INT:
        raise RaftCodecError(f"expected an integer in [0, 2**62], got {value!r:.40}")
    return value


def _bool(value: Any) -> bool:
    if type(value) is not bool:
        raise RaftCodecError(f"expected a boolean, got {value!r:.40}")
    return value


def _bytes(value: Any) -> bytes:
    if type(value) is not bytes:
        raise RaftCodecError(f"expected bytes, got {type(value).__name__}")
    return value


def _entries(value: Any) -> tuple[Entry, ...]:
    if not isinstance(value, list):
        raise RaftCodecError("entries must be an array")
    return tuple(decode_entry(e) for e in value)


_DECODERS: dict[str, Callable[[Any], Any]] = {
    "i": _int,
    "b": _bool,
    "E": _entries,
    "S": decode_snapshot,
}
