"""The record batch: Kafka's RecordBatch v2, one format for clients, the wire and the disk.

A batch is Kafka's 61-byte big-endian header followed by the records (zigzag-varint
Kafka records, compressed as a whole by the batch's codec). The broker stamps
``base_offset`` and ``partition_leader_epoch``, which sit before the CRC, so assigning
offsets never re-hashes; everything from ``attributes`` to the end is covered by a
CRC-32C. The broker validates a batch from its header and CRC alone and never decodes
the records it stores; only a topic's compression.type makes it re-wrap them in
another codec (``recompress``). The records section itself is encoded and decoded by
``records_codec`` (compiled). See docs/format.md for the byte layout.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from crc32c import crc32c

from logmq.errors import CorruptRecordError, LogMQError
from logmq.storage import records_codec
from logmq.storage.compression import (  # noqa: F401 - re-exported: batch owns the format
    MAX_INFLATED_SIZE,
    Compression,
    compress,
    decompress,
    inflate_budget,
)

#   base_offset q, batch_length i, partition_leader_epoch i, magic b, crc I, attributes h,
#   last_offset_delta i, base_timestamp q, max_timestamp q, producer_id q,
#   producer_epoch h, base_sequence i, record_count i
HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # base_offset + batch_length: batch_length counts the bytes after them
BASE_OFFSET_POS = 0
LENGTH_POS = 8
LEADER_EPOCH_POS = 12
MAGIC_POS = 16
CHECKSUM_POS = 17
CHECKSUM_START = 21  # the CRC covers attributes .. end of batch
ATTRIBUTES_POS = 21
MAX_TIMESTAMP_POS = 35
MAGIC = 2
MAX_BATCH_SIZE = 1 << 30  # a header announcing more than this is corrupt, not big

_Q = struct.Struct(">q")
_I = struct.Struct(">i")
_CRC = struct.Struct(">I")
_TS_DELTA = itemgetter(1)

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1


ATTR_LOG_APPEND_TIME = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
# Set by the log cleaner: ``first_timestamp`` holds the time after which the batch's
# tombstones may be removed (record timestamp deltas stay relative to it).
ATTR_DELETE_HORIZON = 0x40


@dataclass(slots=True, frozen=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    leader_epoch: int
    magic: int
    checksum: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & Compression.MASK

    @property
    def last_sequence(self) -> int:
        if self.base_sequence < 0:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF

    @property
    def is_idempotent(self) -> bool:
        return self.producer_id >= 0


def read_header(buf: Any, pos: int = 0) -> BatchHeader:
    """Parse a header without checking it. ``buf`` needs HEADER_SIZE bytes at ``pos``."""
    return BatchHeader(*HEADER.unpack_from(buf, pos))


def peek_size(buf: Any, pos: int = 0) -> int:
    """Total size of the batch at ``pos`` from its length field (needs 12 bytes)."""
    return _I.unpack_from(buf, pos + LENGTH_POS)[0] + LOG_OVERHEAD


def compute_checksum(buf: Any, pos: int, size: int) -> int:
    """CRC-32C of ``attributes`` .. end of the batch at ``pos`` (no copy)."""
    return crc32c(memoryview(buf)[pos + CHECKSUM_START : pos + size])


def validate(
    buf: Any, pos: int = 0, *, contiguous: bool = True, end: int | None = None
) -> BatchHeader:
    """Check one batch at ``pos`` from its header and CRC, without decoding records.

    ``contiguous`` requires offset deltas 0..n-1 (true of every batch a producer
    sends); compacted batches on disk may have gaps, so readers of those pass False.
    Raises CorruptRecordError naming what is wrong.
    """
    limit = len(buf) if end is None else end
    avail = limit - pos
    if avail < HEADER_SIZE:
        raise CorruptRecordError(f"truncated batch header: {avail} of {HEADER_SIZE} bytes")
    h = read_header(buf, pos)
    size = h.batch_length + LOG_OVERHEAD
    if h.batch_length < HEADER_SIZE - LOG_OVERHEAD or size > MAX_BATCH_SIZE:
        raise CorruptRecordError(f"invalid batch length {h.batch_length}")
    if size > avail:
        raise CorruptRecordError(f"truncated batch: {avail} of {size} bytes")
    if h.magic != MAGIC:
        raise CorruptRecordError(f"unsupported batch format version {h.magic}")
    if h.record_count <= 0:
        raise CorruptRecordError(f"invalid record count {h.record_count}")
    if h.last_offset_delta < h.record_count - 1 or (
        contiguous and h.last_offset_delta != h.record_count - 1
    ):
        raise CorruptRecordError(
            f"last offset delta {h.last_offset_delta} does not fit {h.record_count} records"
        )
    if h.compression > Compression.LAST:
        raise CorruptRecordError(f"unknown compression codec {h.compression}")
    if compute_checksum(buf, pos, size) != h.checksum:
        raise CorruptRecordError("checksum mismatch (CRC-32C)")
    return h


def iter_headers(
    buf: Any, pos: int = 0, end: int | None = None
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) of each complete batch in a buffer of concatenated batches.

    Stops quietly at a trailing partial batch (fetch responses may end in one); does not
    verify CRCs: use validate() for that.
    """
    limit = len(buf) if end is None else end
    while limit - pos >= HEADER_SIZE:
        h = read_header(buf, pos)
        size = h.batch_length + LOG_OVERHEAD
        if h.batch_length < HEADER_SIZE - LOG_OVERHEAD or pos + size > limit:
            return
        yield pos, h
        pos += size


def stamp(buf: Any, pos: int, base_offset: int, leader_epoch: int) -> None:
    """Write broker-assigned fields into a writable buffer; the CRC stays valid."""
    _Q.pack_into(buf, pos + BASE_OFFSET_POS, base_offset)
    _I.pack_into(buf, pos + LEADER_EPOCH_POS, leader_epoch)


def assemble(
    records: Any,
    *,
    count: int,
    last_offset_delta: int,
    first_timestamp: int,
    max_timestamp: int,
    attributes: int,
    base_offset: int = 0,
    leader_epoch: int = -1,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
) -> bytes:
    """One batch around an uncompressed records section: compressed by the codec in
    ``attributes``, with its length and CRC filled in."""
    payload = compress(attributes & Compression.MASK, records)
    out = bytearray(HEADER_SIZE + len(payload))
    HEADER.pack_into(
        out,
        0,
        base_offset,
        HEADER_SIZE + len(payload) - LOG_OVERHEAD,
        leader_epoch,
        MAGIC,
        0,
        attributes,
        last_offset_delta,
        first_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    )
    out[HEADER_SIZE:] = payload
    _CRC.pack_into(out, CHECKSUM_POS, crc32c(memoryview(out)[CHECKSUM_START:]))
    return bytes(out)


Header = tuple[str, bytes | None]


def encode_batch(
    records: Sequence[tuple[int, bytes | None, bytes | None, Sequence[Header] | None]],
    *,
    compression: int = Compression.NONE,
    base_offset: int = 0,
    leader_epoch: int = -1,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    offset_deltas: Sequence[int] | None = None,
) -> bytes:
    """Encode ``(timestamp_ms, key, value, headers)`` tuples into one batch.

    ``offset_deltas`` is for compaction, which rewrites batches that keep gaps.
    """
    if not records:
        raise ValueError("a batch holds at least one record")
    first_ts = records[0][0]
    max_ts = max(r[0] for r in records)
    deltas = range(len(records)) if offset_deltas is None else offset_deltas
    rows = [
        (d, ts - first_ts, k, v, h or None)
        for d, (ts, k, v, h) in zip(deltas, records, strict=True)
    ]
    return assemble(
        records_codec.encode_rows(rows),
        count=len(records),
        last_offset_delta=rows[-1][0],
        first_timestamp=first_ts,
        max_timestamp=max_ts,
        attributes=compression,
        base_offset=base_offset,
        leader_epoch=leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )


def encode_values(
    values: Sequence[bytes | None],
    *,
    timestamp: int,
    keys: Sequence[bytes | None] | None = None,
    compression: int = Compression.NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
) -> bytes:
    """Bulk path: many values sharing one timestamp, no headers."""
    n = len(values)
    if n == 0:
        raise ValueError("a batch holds at least one record")
    return assemble(
        records_codec.encode_values(values, keys),
        count=n,
        last_offset_delta=n - 1,
        first_timestamp=timestamp,
        max_timestamp=timestamp,
        attributes=compression,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )


def encode_rows(
    rows: Sequence[Sequence[Any]],
    *,
    first_timestamp: int,
    compression: int = Compression.NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
) -> bytes:
    """Fast path: encode rows the caller already built in wire form.

    Each row is ``(offset_delta, timestamp_delta, key, value, headers or None)`` with
    offset deltas exactly 0..n-1 and timestamp deltas from ``first_timestamp`` (the
    producer's accumulator appends records this way), so encoding is one compiled call
    and no Python code runs per record.
    """
    n = len(rows)
    if n == 0:
        raise ValueError("a batch holds at least one record")
    max_delta = max(map(_TS_DELTA, rows))
    return assemble(
        records_codec.encode_rows(rows),
        count=n,
        last_offset_delta=n - 1,
        first_timestamp=first_timestamp,
        max_timestamp=first_timestamp + max_delta,
        attributes=compression,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )


def decode_rows(
    buf: Any, pos: int = 0, header: BatchHeader | None = None, max_size: int | None = None
) -> list[tuple]:
    """Decode the records of one (already validated) batch into raw rows.

    Each row is ``(offset_delta, timestamp_delta, key, value, headers or None)``; this
    is the batch-wise path: one compiled call per batch, no per-record Python.
    ``max_size`` bounds decompression (compression.py); the broker passes
    ``inflate_budget(size, max.message.bytes)``, the default is that for 64 MiB.
    """
    h = header or read_header(buf, pos)
    mv = memoryview(buf)[pos + HEADER_SIZE : pos + h.size]
    budget = inflate_budget(h.size) if max_size is None else max_size
    try:
        return records_codec.decode_rows(decompress(h.compression, mv, budget), h.record_count)
    except LogMQError:
        raise
    except Exception as e:  # ValueError from the codec, zlib.error, lz4/zstd errors
        raise CorruptRecordError(f"cannot decode records: {e}") from None


def recompress(
    buf: Any, pos: int, header: BatchHeader, codec: int, budget: int | None = None
) -> bytes:
    """The batch at ``pos`` re-encoded in ``codec`` (a topic's compression.type).

    In v2 the codec wraps the records section as a whole, so only that wrapping
    changes: the records stay the same bytes, which keeps every record field by
    construction and costs no Python per record. The header keeps every field but the
    codec bits, the length and the CRC. ``header`` must come from a validated batch; a
    payload that does not decompress raises CorruptRecordError, one that inflates past
    ``budget`` (default ``inflate_budget(size)``) InflateLimitError.
    """
    h = header
    mv = memoryview(buf)[pos + HEADER_SIZE : pos + h.size]
    try:
        records = decompress(h.compression, mv, budget or inflate_budget(h.size))
    except LogMQError:
        raise  # too large, or a codec package missing on this broker
    except Exception as e:  # zlib.error, lz4's RuntimeError, zstandard.ZstdError
        raise CorruptRecordError(f"cannot decompress records to recompress them: {e}") from None
    return assemble(
        records,
        count=h.record_count,
        last_offset_delta=h.last_offset_delta,
        first_timestamp=h.first_timestamp,
        max_timestamp=h.max_timestamp,
        attributes=(h.attributes & ~Compression.MASK) | codec,
        base_offset=h.base_offset,
        leader_epoch=h.leader_epoch,
        producer_id=h.producer_id,
        producer_epoch=h.producer_epoch,
        base_sequence=h.base_sequence,
    )


def decode_records(
    buf: Any, pos: int = 0, *, verify: bool = True, max_size: int | None = None
) -> list[tuple[int, int, bytes | None, bytes | None, list[Header]]]:
    """Decode one batch into ``(offset, timestamp, key, value, headers)`` tuples."""
    h = validate(buf, pos, contiguous=False) if verify else read_header(buf, pos)
    rows = decode_rows(buf, pos, h, max_size)
    base, ts0 = h.base_offset, h.first_timestamp
    if h.attributes & ATTR_LOG_APPEND_TIME:  # as in Kafka, every record has the append time
        return [(base + r[0], h.max_timestamp, r[2], r[3], list(r[4] or ())) for r in rows]
    return [(base + r[0], ts0 + r[1], r[2], r[3], list(r[4] or ())) for r in rows]
