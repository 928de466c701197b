"""Turning produce bytes into stamped write buffers (sans-IO, per batch).

Validation reads headers and CRCs only, and keeps each header as the plain tuple
``batch.HEADER`` unpacks: building a frozen ``BatchHeader`` costs more than the
checksum of a 100 KB batch, so one is made only where producer state needs it.
Stamping never copies a batch: each one becomes a fresh 16-byte prefix (base offset,
length, leader epoch, which the checksum does not cover) plus a memoryview of the
caller's bytes from offset 16, ready for a single ``pwritev``. Only LogAppendTime,
which rewrites checksummed fields, copies.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from crc32c import crc32c

from logmq.errors import CorruptRecordError, MessageTooLargeError
from logmq.storage import batch as b
from logmq.storage.segment import BatchInfo

_ATTR = struct.Struct(">h")
_Q = struct.Struct(">q")
_CHECKSUM = struct.Struct(">I")
_ATTRIBUTES_POS = b.ATTRIBUTES_POS
_MAX_TIMESTAMP_POS = b.MAX_TIMESTAMP_POS
STAMP = struct.Struct(">qii")  # base_offset, batch_length, leader_epoch: not checksummed
assert STAMP.size == b.MAGIC_POS

# Positions in the tuple ``batch.HEADER`` unpacks (the BatchHeader field order).
(
    F_BASE_OFFSET,
    F_LENGTH,
    F_LEADER_EPOCH,
    F_MAGIC,
    F_CHECKSUM,
    F_ATTRIBUTES,
    F_LAST_OFFSET_DELTA,
    F_FIRST_TIMESTAMP,
    F_MAX_TIMESTAMP,
    F_PRODUCER_ID,
    F_PRODUCER_EPOCH,
    F_BASE_SEQUENCE,
    F_RECORD_COUNT,
) = range(13)

RawHeader = tuple[int, ...]  # as ``batch.HEADER.unpack_from`` returns it
Located = list[tuple[int, b.BatchHeader]]  # (position in the request, header)
RawLocated = list[tuple[int, RawHeader]]

_unpack_header = b.HEADER.unpack_from
_hash = crc32c
_HEADER_SIZE = b.HEADER_SIZE
_OVERHEAD = b.LOG_OVERHEAD
_MIN_LENGTH = b.HEADER_SIZE - b.LOG_OVERHEAD
_CHECKSUM_START = b.CHECKSUM_START
_MAX_BATCH_SIZE = b.MAX_BATCH_SIZE
_MAGIC = b.MAGIC
_CODEC_MASK = b.Compression.MASK
_LAST_CODEC = b.Compression.LAST


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


def check_batch(
    mv: memoryview, pos: int, limit: int, max_batch_bytes: int, contiguous: bool
) -> RawHeader:
    """Validate the batch at ``pos`` (the checks of ``batch.validate``); return its fields.

    Raises MessageTooLargeError over ``max_batch_bytes``, else CorruptRecordError
    naming what is wrong.
    """
    avail = limit - pos
    if avail < _HEADER_SIZE:
        if avail >= _OVERHEAD and b.peek_size(mv, pos) > max_batch_bytes:
            _too_large(b.peek_size(mv, pos), max_batch_bytes)
        raise CorruptRecordError(f"truncated batch header: {avail} of {_HEADER_SIZE} bytes")
    f = _unpack_header(mv, pos)
    size = f[F_LENGTH] + _OVERHEAD
    count = f[F_RECORD_COUNT]
    delta = f[F_LAST_OFFSET_DELTA]
    # One combined test on the produce hot path; _reject names the first problem.
    if (
        size > max_batch_bytes
        or size > avail
        or size < _HEADER_SIZE
        or size > _MAX_BATCH_SIZE
        or f[F_MAGIC] != _MAGIC
        or count <= 0
        or delta < count - 1
        or (contiguous and delta != count - 1)
        or f[F_ATTRIBUTES] & _CODEC_MASK > _LAST_CODEC
    ):
        _reject(f, avail, max_batch_bytes, contiguous)
    if _hash(mv[pos + _CHECKSUM_START : pos + size]) != f[F_CHECKSUM]:
        raise CorruptRecordError("checksum mismatch (CRC-32C)")
    return f


def _reject(f: RawHeader, avail: int, max_batch_bytes: int, contiguous: bool) -> None:
    """Raise the error for the first check ``f`` fails, in the order clients rely on."""
    length = f[F_LENGTH]
    size = length + _OVERHEAD
    if size > max_batch_bytes:
        _too_large(size, max_batch_bytes)
    if length < _MIN_LENGTH or size > b.MAX_BATCH_SIZE:
        raise CorruptRecordError(f"invalid batch length {length}")
    if size > avail:
        raise CorruptRecordError(f"truncated batch: {avail} of {size} bytes")
    if f[F_MAGIC] != b.MAGIC:
        raise CorruptRecordError(f"unsupported batch format version {f[F_MAGIC]}")
    count, delta = f[F_RECORD_COUNT], f[F_LAST_OFFSET_DELTA]
    if count <= 0:
        raise CorruptRecordError(f"invalid record count {count}")
    if delta < count - 1 or (contiguous and delta != count - 1):
        raise CorruptRecordError(f"last offset delta {delta} does not fit {count} records")
    raise CorruptRecordError(f"unknown compression codec {f[F_ATTRIBUTES] & 7}")


def _too_large(size: int, limit: int) -> None:
    raise MessageTooLargeError(f"batch of {size} bytes exceeds max.message.bytes {limit}")


def validate_raw(mv: memoryview, max_batch_bytes: int, *, contiguous: bool) -> RawLocated:
    """Validate every batch of a request; (position, raw header fields) of each."""
    limit = len(mv)
    if not limit:
        raise CorruptRecordError("empty produce data: no record batch")
    out = []
    pos = 0
    while pos < limit:
        f = check_batch(mv, pos, limit, max_batch_bytes, contiguous)
        out.append((pos, f))
        pos += f[F_LENGTH] + _OVERHEAD
    return out


def to_headers(raw: RawLocated) -> Located:
    """Full BatchHeader objects, for the paths that track producer state."""
    return [(p, b.BatchHeader(*f)) for p, f in raw]


def validate_batches(mv: memoryview, max_batch_bytes: int, *, contiguous: bool) -> Located:
    """Validate every batch of a request (header and checksum, no record decoding)."""
    return to_headers(validate_raw(mv, max_batch_bytes, contiguous=contiguous))


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
