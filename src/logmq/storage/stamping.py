"""Turning produce bytes into stamped write buffers (sans-IO, per batch).

Validation reads headers and checksums only. Stamping never copies a batch: each one
becomes a fresh 16-byte prefix (base offset, length, leader epoch, which the checksum
does not cover) plus a memoryview of the caller's bytes from offset 16, ready for a
single ``pwritev``. Only LogAppendTime, which rewrites checksummed fields, copies.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from logmq.errors import CorruptRecordError, MessageTooLargeError
from logmq.storage import batch as b
from logmq.storage.segment import BatchInfo

_ATTR = struct.Struct(">h")
_Q = struct.Struct(">q")
_CHECKSUM = struct.Struct(">Q")
_ATTRIBUTES_POS = 25
_MAX_TIMESTAMP_POS = 39
STAMP = struct.Struct(">qii")  # base_offset, batch_length, leader_epoch: not checksummed
assert STAMP.size == b.MAGIC_POS

Located = list[tuple[int, b.BatchHeader]]  # (position in the request, header)


@dataclass(slots=True)
class AppendInfo:
    first_offset: int
    last_offset: int
    max_timestamp: int
    record_count: int
    duplicate: bool = False  # idempotent retry: nothing appended, offsets are the originals


@dataclass(slots=True)
class StampedWrite:
    """Buffers for one vectored write plus what the indexes and the caller need."""

    parts: list[Any] = field(default_factory=list)
    size: int = 0
    infos: list[BatchInfo] = field(default_factory=list)
    next_offset: int = 0
    record_count: int = 0
    max_timestamp: int = -1


def validate_batches(mv: memoryview, max_batch_bytes: int, *, contiguous: bool) -> Located:
    """Validate every batch of a request (header and checksum, no record decoding)."""
    headers = []
    pos, limit = 0, len(mv)
    if not limit:
        raise CorruptRecordError("empty produce data: no record batch")
    while pos < limit:
        if limit - pos >= b.LOG_OVERHEAD and b.peek_size(mv, pos) > max_batch_bytes:
            raise MessageTooLargeError(
                f"batch of {b.peek_size(mv, pos)} bytes exceeds max.message.bytes {max_batch_bytes}"
            )
        h = b.validate(mv, pos, contiguous=contiguous)
        headers.append((pos, h))
        pos += h.size
    return headers


def stamp_batches(
    mv: memoryview,
    batches: Located,
    first_offset: int,
    leader_epoch: int,
    *,
    log_append_time: int | None = None,
) -> StampedWrite:
    """Assign consecutive offsets from ``first_offset``; stamp ``log_append_time`` if set."""
    out = StampedWrite(next_offset=first_offset)
    parts, infos = out.parts, out.infos
    next_offset, pos, count, max_ts = first_offset, 0, 0, -1
    for p, h in batches:
        size = h.batch_length + b.LOG_OVERHEAD
        if log_append_time is not None:
            ts = log_append_time
            part = bytearray(mv[p : p + size])
            b.stamp(part, 0, next_offset, leader_epoch)
            _ATTR.pack_into(part, _ATTRIBUTES_POS, h.attributes | b.ATTR_LOG_APPEND_TIME)
            _Q.pack_into(part, _MAX_TIMESTAMP_POS, ts)
            _CHECKSUM.pack_into(part, b.CHECKSUM_POS, b.compute_checksum(part, 0, size))
            parts.append(part)
        else:
            ts = h.max_timestamp
            parts.append(STAMP.pack(next_offset, h.batch_length, leader_epoch))
            parts.append(mv[p + STAMP.size : p + size])
        infos.append(BatchInfo(pos, size, next_offset, ts))
        if ts > max_ts:
            max_ts = ts
        next_offset += h.last_offset_delta + 1
        pos += size
        count += h.record_count
    out.size, out.next_offset, out.record_count, out.max_timestamp = pos, next_offset, count, max_ts
    return out


def count_offsets(batches: Located) -> int:
    return sum(h.last_offset_delta + 1 for _, h in batches)
