"""Bytes for Raft messages between brokers, and for entries/snapshots on disk.

A message is one msgpack array: ``[type, src, dst, term, *fields]`` with the fields in
dataclass order; an entry is ``[index, term, kind, data]``; a snapshot is
``[index, term, data]``. Decoding checks every type and count, so a corrupt or hostile
frame becomes a RaftCodecError (a ValueError) and never a half-built message that could
trip the core. Numbers are not sanity-checked here: RaftNode.step does that.

Every port is reachable by an attacker, so a message is decoded by its layout, not by
unpacking whatever the frame holds and looking afterwards: each value's type byte is
checked before it is read, and each array's count against its limit and the bytes left
before any element is built. Per-array limits alone would not do: a frame of 64 MiB (the
transport's limit) of one-element arrays unpacks into some 4 GB of lists, whatever each
array's cap. So nothing is built but the message's own ints, booleans, byte strings and
entries; maps, strings and extension types never occur in a message and are refused. The
limits cannot refuse a message a member sends: a message has at most 8 items, an entry 4,
a snapshot 3, and an AppendRequest at most MAX_ENTRIES_PER_MESSAGE entries (a leader
sends at most ``max_entries_per_message``, 256 by default, which RaftNode keeps within
that). A snapshot travels whole as one byte string, so the size of the metadata image
bears on the frame limit only, never on these counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from functools import cache
from typing import Any

import msgpack

from logmq.errors import CorruptRecordError
from logmq.replication.raft_messages import (
    MAX_ENTRIES_PER_MESSAGE,
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
    r = _Reader(data)
    n = r.array(_MAX_ITEMS)
    if n < 4:
        raise RaftCodecError("a Raft message is an array [type, src, dst, term, ...]")
    code = r.int()
    cls = _TYPES.get(code)
    if cls is None:
        raise RaftCodecError(f"unknown Raft message type {code}")
    kinds = _FIELDS[cls]
    if n != 4 + len(kinds):
        raise RaftCodecError(f"{cls.__name__} needs {4 + len(kinds)} items, got {n}")
    values: list[Any] = [r.int(), r.int(), r.int()]
    for kind in kinds:
        if kind == "i":
            values.append(r.int())
        elif kind == "b":
            values.append(r.bool())
        elif kind == "E":
            values.append(tuple(r.entry() for _ in range(r.array(*_ENTRIES))))
        else:
            values.append(r.snapshot())
    r.end()
    return cls(*values)


_MAX_ITEMS = 4 + max(len(kinds) for kinds in _FIELDS.values())
# an AppendRequest's entries: at most this many, each at least 6 bytes (a 4-item array
# header, three one-byte ints, an empty byte string's two bytes)
_ENTRIES = (MAX_ENTRIES_PER_MESSAGE, 6)
_INT_TYPES = frozenset(range(0x00, 0x80)) | frozenset(range(0xCC, 0xD4))  # fixint, (u)int8-64
_BOOL_TYPES = frozenset((0xC2, 0xC3))
_BIN_TYPES = frozenset((0xC4, 0xC5, 0xC6))
_ARRAY_TYPES = frozenset(range(0x90, 0xA0)) | frozenset((0xDC, 0xDD))


class _Reader:
    """One message's values in order, each type checked before it is read."""

    __slots__ = ("_size", "_unpacker", "_view")

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self._view = memoryview(data).cast("B")
        self._size = len(self._view)
        # the limits only back up the type checks below: no str, map or ext is ever read
        self._unpacker = msgpack.Unpacker(
            raw=False,
            max_buffer_size=max(self._size, 1),
            max_str_len=0,
            max_bin_len=self._size,
            max_array_len=MAX_ENTRIES_PER_MESSAGE,
            max_map_len=0,
            max_ext_len=0,
        )
        self._unpacker.feed(self._view)

    def _next(self, types: frozenset[int], what: str) -> None:
        pos = self._unpacker.tell()
        if pos >= self._size:
            raise RaftCodecError(f"the message ends where {what} was expected")
        if self._view[pos] not in types:
            raise RaftCodecError(f"expected {what}, got type byte 0x{self._view[pos]:02x}")

    def _read(self, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except (ValueError, msgpack.UnpackException) as exc:  # OutOfData: cut short
            raise RaftCodecError(f"not a msgpack Raft message: {exc or 'truncated'}")

    def array(self, limit: int, min_item_bytes: int = 1) -> int:
        """An array's count, once it is known to fit its limit and the bytes left."""
        self._next(_ARRAY_TYPES, "an array")
        n = self._read(self._unpacker.read_array_header)
        left = self._size - self._unpacker.tell()
        if n > limit or n * min_item_bytes > left:
            raise RaftCodecError(
                f"an array of {n} items (at most {limit}) in {left} bytes is not a Raft message"
            )
        return n

    def int(self) -> int:
        self._next(_INT_TYPES, "an integer")
        return _int(self._read(self._unpacker.unpack))

    def bool(self) -> bool:
        self._next(_BOOL_TYPES, "a boolean")
        return self._read(self._unpacker.unpack)

    def bytes(self) -> bytes:
        self._next(_BIN_TYPES, "bytes")
        return self._read(self._unpacker.unpack)

    def entry(self) -> Entry:
        if self.array(4) != 4:
            raise RaftCodecError("an entry is a 4-item array")
        index, term, kind = self.int(), self.int(), self.int()
        try:
            kind = EntryKind(kind)
        except ValueError:
            raise RaftCodecError(f"unknown entry kind {kind!r}")
        return Entry(index=index, term=term, data=self.bytes(), kind=kind)

    def snapshot(self) -> Snapshot:
        if self.array(3) != 3:
            raise RaftCodecError("a snapshot is a 3-item array")
        return Snapshot(index=self.int(), term=self.int(), data=self.bytes())

    def end(self) -> None:
        if self._unpacker.tell() != self._size:
            raise RaftCodecError("bytes after the end of the message")


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


def _bytes(value: Any) -> bytes:
    if type(value) is not bytes:
        raise RaftCodecError(f"expected bytes, got {type(value).__name__}")
    return value
