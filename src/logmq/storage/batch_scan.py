"""Many batches in one call: crash recovery's and the consumer's per-batch loop.

With thousands of partitions each holding a few small batches, the work per batch
(unpacking a header into an object, a CRC call, the checks) costs more than the records
themselves, so the C extension ``_recordsv2`` walks a whole buffer of batches per call:

* ``scan_batches(buf, pos, end, expect, epoch, allow_gaps, contiguous, origin=0)`` checks
  each batch as ``batch.validate`` does and that offsets and leader epochs chain
  (``expect`` -1: any first offset). Returns ``(headers, stop, need, reason)``: a row per
  valid batch (``(origin + position, *BatchHeader fields)``, indexed by the ``R_``
  constants), where the scan stopped, the size of a batch cut
  short by the end of the buffer (0 if none: a reader of a file refills), and why it
  stopped ("" at the end).
* ``batches_end(buf, pos)``: the largest next offset of the whole batches from ``pos`` on
  (-1 if none), without checking them: where a consumer's next fetch starts.
* ``take_records(buf, pos, position, max, topic, partition, record_type)`` checks and
  decodes uncompressed batches straight into ``record_type`` tuples (a tuple subclass),
  those at or after ``position``, at most ``max``. Returns ``(records, pos, position,
  stop)``: ``stop`` is "" at the end of the whole batches, "compressed" before a compressed
  batch (the caller decodes it), else why the batch at ``pos`` is bad (nothing of it is
  returned).

Offsets and timestamps are int64 and the sums that make them come from untrusted bytes:
a batch whose next offset, or a record whose offset or timestamp, leaves int64 is bad
(``batches_end`` stops before such a batch), in C without a signed overflow.

When the extension did not build, the pure-Python versions below stand in with the same
results (tests compare the two).
"""

from __future__ import annotations

from typing import Any

from logmq.errors import CorruptRecordError
from logmq.storage import batch as b
from logmq.storage.records_codec import decode_rows

HeaderRow = tuple[int, ...]  # (position, *BatchHeader fields)
# Fields of a row (BatchHeader's, after the position).
R_POS, R_BASE_OFFSET, R_LENGTH, R_LEADER_EPOCH = 0, 1, 2, 3
R_ATTRIBUTES, R_LAST_OFFSET_DELTA, R_MAX_TIMESTAMP = 6, 7, 9
R_PRODUCER_ID, R_PRODUCER_EPOCH, R_BASE_SEQUENCE = 10, 11, 12
# Offsets and timestamps are int64: a batch or record whose sum leaves that range is bad
# (the C versions test the same sums for overflow).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _overflow(h: b.BatchHeader) -> str:
    lod = h.last_offset_delta
    return f"offsets overflow: base offset {h.base_offset}, last offset delta {lod}"


def header_of(row: HeaderRow) -> b.BatchHeader:
    """The BatchHeader of a ``scan_batches`` row."""
    return b.BatchHeader(*row[1:])


def row_of(pos: int, h: b.BatchHeader) -> HeaderRow:
    """The ``scan_batches`` row of a header at ``pos``."""
    return (pos, h.base_offset, h.batch_length, h.leader_epoch, h.magic, h.checksum,
            h.attributes, h.last_offset_delta, h.first_timestamp, h.max_timestamp,
            h.producer_id, h.producer_epoch, h.base_sequence, h.record_count)  # fmt: skip


def py_scan_batches(
    buf: Any,
    pos: int,
    end: int,
    expect: int,
    epoch: int,
    allow_gaps: bool,
    contiguous: bool,
    origin: int = 0,
) -> tuple[list[HeaderRow], int, int, str]:
    limit = len(buf) if end < 0 or end > len(buf) else end
    if pos < 0 or pos > limit:
        raise ValueError(f"position {pos} outside the buffer")
    out: list[HeaderRow] = []
    while pos < limit:
        rem = limit - pos
        size = b.peek_size(buf, pos) if rem >= b.LOG_OVERHEAD else b.HEADER_SIZE
        try:
            h = b.validate(buf, pos, contiguous=contiguous, end=limit)
        except CorruptRecordError as e:
            want = max(size, b.HEADER_SIZE)
            return out, pos, want if want > rem and size <= b.MAX_BATCH_SIZE else 0, str(e)
        if h.next_offset > INT64_MAX:
            return out, pos, 0, _overflow(h)
        if expect >= 0 and (h.base_offset < expect if allow_gaps else h.base_offset != expect):
            return out, pos, 0, f"batch base offset {h.base_offset} does not follow {expect}"
        if h.leader_epoch < epoch:
            return out, pos, 0, f"leader epoch {h.leader_epoch} goes back from {epoch}"
        out.append((origin + pos, *b.HEADER.unpack_from(buf, pos)))
        expect, epoch = h.next_offset, h.leader_epoch
        pos += h.size
    return out, pos, 0, ""


def py_batches_end(buf: Any, pos: int) -> int:
    nxt = -1
    for _, h in b.iter_headers(buf, pos):
        if not INT64_MIN <= h.next_offset <= INT64_MAX:
            break
        nxt = max(nxt, h.next_offset)
    return nxt


def py_take_records(
    buf: Any,
    pos: int,
    position: int,
    max_records: int,
    topic: str,
    partition: int,
    record_type: type,
) -> tuple[list[Any], int, int, str]:
    out: list[Any] = []
    new = tuple.__new__
    while len(out) < max_records and len(buf) - pos >= b.HEADER_SIZE:
        h = b.read_header(buf, pos)
        size = h.batch_length + b.LOG_OVERHEAD
        if h.batch_length < b.HEADER_SIZE - b.LOG_OVERHEAD or size > b.MAX_BATCH_SIZE:
            return out, pos, position, f"invalid batch length {h.batch_length}"
        if size > len(buf) - pos:
            break
        if h.next_offset <= position:
            pos += size
            continue
        try:
            h = b.validate(buf, pos, contiguous=False)
        except CorruptRecordError as e:
            return out, pos, position, str(e)
        if h.next_offset > INT64_MAX:
            return out, pos, position, _overflow(h)
        if h.compression:
            return out, pos, position, "compressed"
        try:
            rows = decode_rows(memoryview(buf)[pos + b.HEADER_SIZE : pos + size], h.record_count)
        except ValueError as e:
            return out, pos, position, f"cannot decode records: {e}"
        append_time = h.attributes & b.ATTR_LOG_APPEND_TIME
        before = len(out)
        for i, (od, td, key, value, headers) in enumerate(rows):
            offset = h.base_offset + od
            if offset > INT64_MAX or offset < INT64_MIN:
                del out[before:]
                why = f"record {i}: offset delta {od} overflows the base offset"
                return out, pos, position, f"cannot decode records: {why}"
            if offset < position:
                continue
            if len(out) >= max_records:
                return out, pos, offset, ""
            ts = h.max_timestamp if append_time else h.first_timestamp + td
            if ts > INT64_MAX or ts < INT64_MIN:
                del out[before:]
                why = f"record {i}: timestamp delta {td} overflows the first timestamp"
                return out, pos, position, f"cannot decode records: {why}"
            hs = [tuple(x) for x in headers] if headers else None
            out.append(new(record_type, (topic, partition, offset, ts, key, value, hs)))
        position = h.next_offset
        pos += size
    return out, pos, position, ""


try:
    from logmq.storage._recordsv2 import batches_end, scan_batches, take_records

    COMPILED = True
except ImportError:  # the optional extension did not build
    scan_batches, batches_end, take_records = py_scan_batches, py_batches_end, py_take_records
    COMPILED = False

__all__ = ["COMPILED", "batches_end", "header_of", "row_of", "scan_batches", "take_records"]
