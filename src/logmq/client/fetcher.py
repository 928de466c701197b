"""Turning Fetch responses into records (sans-IO: bytes in, records out).

A Fetch tail holds, per partition, whole batches exactly as the broker stored them;
the first may start before the requested offset and the last may be cut short. Each
batch is checksummed here (over the response buffer, no copy) before anything is
decoded. ``poll()`` takes a partition's uncompressed batches with one compiled call
(``batch_scan.take_records``: checks, decodes and builds the Records), so no Python
code runs per batch or per record; compressed batches and ``poll_batches()`` decode a
batch per compiled call (``records_codec``) and build Records with one C-level
``map``/``zip`` pass.

Transactions: control batches (COMMIT/ABORT markers) are never handed out, and a
read_committed consumer also drops the batches of aborted transactions, from the
aborted-transaction list of the answer, as Kafka's consumer does (``txn_filter``).
Either way the position moves past what was dropped. A partition without control or
transactional batches costs one header walk and no copy.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import add, itemgetter
from typing import Any

from logmq.errors import CorruptRecordError, ErrorCode, LogMQError
from logmq.gcpause import gc_paused
from logmq.net.fetch_message import fetched_partitions
from logmq.records import Record
from logmq.storage.batch import (
    ATTR_CONTROL,
    ATTR_LOG_APPEND_TIME,
    ATTR_TRANSACTIONAL,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAX_BATCH_SIZE,
    BatchHeader,
    decompress,
    iter_headers,
    read_header,
    validate,
)
from logmq.storage.batch_scan import batches_end, take_records
from logmq.storage.compression import CLIENT_MAX_INFLATED, InflateLimitError
from logmq.storage.records_codec import decode_rows
from logmq.storage.txn_state import CONTROL_ABORT, control_record

_tuple_new = tuple.__new__
_OFFSET_DELTA, _TS_DELTA, _KEY, _VALUE, _HEADERS = (itemgetter(i) for i in range(5))


Row = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...] | None]


def decode_batch_rows(buf: Any, pos: int, header: BatchHeader) -> Sequence[Row]:
    """The records of one validated batch as ``(offset_delta, timestamp_delta, key, value,
    headers)`` tuples: one compiled call per batch."""
    mv = memoryview(buf)[pos + HEADER_SIZE : pos + header.size]
    try:
        records = decompress(header.compression, mv, CLIENT_MAX_INFLATED)
        return decode_rows(records, header.record_count)
    except InflateLimitError as e:  # a bomb from a broker (or a batch too big to take apart)
        raise InflateLimitError(f"batch at offset {header.base_offset}: {e}") from None
    except LogMQError:
        raise
    except Exception as e:  # ValueError from the codec, zlib.error, lz4/zstd errors
        raise CorruptRecordError(f"cannot decode records: {e}") from None


@dataclass(slots=True)
class FetchedBatch:
    """One decoded batch, for the batch-wise consume path (``poll_batches``).

    ``rows`` are the raw decoded records ``(offset_delta, timestamp_delta, key, value,
    headers)`` (tuples), already trimmed to those at or after the fetch position, so the record's
    offset is ``base_offset + row[0]`` and its timestamp ``first_timestamp + row[1]``
    (``headers`` is None or a tuple of ``(name, value)`` pairs).
    """

    topic: str
    partition: int
    base_offset: int
    first_timestamp: int
    rows: Sequence[Row]
    next_offset: int  # the position after this batch

    def values(self) -> list[bytes | None]:
        return list(map(_VALUE, self.rows))

    def keys(self) -> list[bytes | None]:
        return list(map(_KEY, self.rows))

    def offsets(self) -> list[int]:
        return list(map(add, repeat(self.base_offset), map(_OFFSET_DELTA, self.rows)))

    def records(self) -> list[Record]:
        with gc_paused():
            return build_records(
                self.topic, self.partition, self.base_offset, self.first_timestamp, self.rows
            )

    def __len__(self) -> int:
        return len(self.rows)


def build_records(
    topic: str, partition: int, base_offset: int, first_timestamp: int, rows: Sequence[Row]
) -> list[Record]:
    """Record tuples for decoded rows: ``zip`` assembles each record's fields in C and
    ``tuple.__new__`` gives it the Record type, so no Python code runs per record."""
    n = len(rows)
    if n == 0:
        return []
    first = base_offset + rows[0][0]
    if rows[-1][0] - rows[0][0] == n - 1:  # contiguous (every batch but compacted ones)
        offsets: Any = range(first, first + n)
    else:
        offsets = map(add, repeat(base_offset), map(_OFFSET_DELTA, rows))
    if rows[0][1] == 0 and rows[-1][1] == 0 and not any(map(_TS_DELTA, rows)):
        stamps: Any = repeat(first_timestamp, n)  # one timestamp for the batch
    else:
        stamps = map(add, repeat(first_timestamp), map(_TS_DELTA, rows))
    if any(map(_HEADERS, rows)):
        headers: Any = [list(map(tuple, h)) if h else None for h in map(_HEADERS, rows)]
    else:
        headers = repeat(None, n)
    fields = zip(
        repeat(topic, n),
        repeat(partition, n),
        offsets,
        stamps,
        map(_KEY, rows),
        map(_VALUE, rows),
        headers,
        strict=True,
    )
    return list(map(_tuple_new, repeat(Record, n), fields))


_LENGTH = struct.Struct(">i")  # batch_length, at byte 8 of a batch
_MIN_LENGTH = HEADER_SIZE - LOG_OVERHEAD


def has_flagged_batches(data: Any, mask: int) -> bool:
    """Whether a whole batch in ``data`` has an attribute bit of ``mask`` set: a walk
    over the batch lengths, reading one byte per batch (malformed lengths end it; the
    decoding path reports them)."""
    pos = 0
    last = len(data) - HEADER_SIZE  # the last position a whole header can start at
    unpack = _LENGTH.unpack_from
    while pos <= last:  # per batch on every fetch: kept to the fewest steps
        if data[pos + 22] & mask:  # the attributes' low byte
            return True
        length = unpack(data, pos + 8)[0]
        if length < 49:  # HEADER_SIZE - LOG_OVERHEAD: a bad length, left to the decoder
            return False
        pos += length + 12  # LOG_OVERHEAD
    return False


def txn_filter(
    data: Any, aborted: Iterable[Sequence[int]] | None, read_committed: bool
) -> bytes | None:
    """``data`` without its control batches and, for read_committed, without the
    batches of aborted transactions; None when nothing is to be dropped.

    ``aborted`` is the answer's ``[producer id, first offset]`` list. As in Kafka's
    consumer: walking the batches in order, a transaction becomes aborted for its
    producer once a batch reaches its first offset; that producer's transactional
    batches are dropped until its ABORT marker. Only whole batches are kept (a trailing
    partial one is dropped: the next fetch reads it whole). A control batch that cannot
    be read stops the filtering there: it and what follows stay, for the decoding path
    to report.
    """
    pending = sorted((int(a[1]), int(a[0])) for a in aborted or () if len(a) >= 2)
    mask = ATTR_CONTROL | ATTR_TRANSACTIONAL if read_committed and pending else ATTR_CONTROL
    if not has_flagged_batches(data, mask):
        return None
    active: set[int] = set()  # producers whose transaction here is aborted
    i = 0
    keep: list[Any] = []
    end = 0
    for pos, h in iter_headers(data):
        end = pos + h.size
        if read_committed:
            last = h.base_offset + h.last_offset_delta
            while i < len(pending) and pending[i][0] <= last:
                active.add(pending[i][1])
                i += 1
        if h.attributes & ATTR_CONTROL:
            if h.producer_id in active:
                try:
                    control = control_record(data, pos)
                except LogMQError:
                    keep.append(data[pos:])
                    return b"".join(keep)
                if control.type == CONTROL_ABORT:
                    active.discard(h.producer_id)
            continue
        if read_committed and h.attributes & ATTR_TRANSACTIONAL and h.producer_id in active:
            continue
        keep.append(data[pos:end])
    if end < len(data) and len(data) - end >= HEADER_SIZE:
        length = _LENGTH.unpack_from(data, end + 8)[0]
        if length < _MIN_LENGTH or length + LOG_OVERHEAD > MAX_BATCH_SIZE:
            keep.append(data[end:])  # garbage, not a cut batch: the decoder says so
    return b"".join(keep)


@dataclass(slots=True)
class PartitionData:
    """The part of one fetch response that belongs to one partition, consumed lazily."""

    topic: str
    partition: int
    fetch_offset: int
    error: ErrorCode
    high_watermark: int = -1
    log_start_offset: int = -1
    data: memoryview = field(default_factory=lambda: memoryview(b""))
    pos: int = 0  # next undecoded batch in data
    position: int = 0  # next offset to hand out
    pending: FetchedBatch | None = None  # a batch partly handed out
    # where the position goes once ``data`` is used up: past the batches a transaction
    # filter dropped at its end (-1: nothing was dropped)
    skip_to: int = -1

    def __post_init__(self) -> None:
        self.position = self.fetch_offset

    def drop_txn_batches(self, aborted: Iterable[Sequence[int]] | None, committed: bool) -> None:
        """Apply ``txn_filter`` to this partition's data (before anything is taken)."""
        kept = txn_filter(self.data, aborted, committed)
        if kept is not None:
            self.skip_to = batches_end(self.data, 0)
            self.data = memoryview(kept)

    def _past_dropped(self) -> None:
        if self.skip_to > self.position and self.exhausted:
            self.position = self.skip_to

    @property
    def tp(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    def next_fetch_offset(self) -> int:
        """Where the next fetch for this partition should start: after the last whole batch."""
        return max(self.fetch_offset, batches_end(self.data, self.pos))

    @property
    def exhausted(self) -> bool:
        return self.pending is None and batches_end(self.data, self.pos) < 0

    def next_batch(self) -> FetchedBatch | None:
        """Validate and decode the next batch holding records at or after ``position``.

        Raises CorruptRecordError for a batch that fails its checksum; the position stays
        before it, so nothing after a corrupt batch is ever returned.
        """
        if self.pending is not None:
            b, self.pending = self.pending, None
            return b
        while True:
            h = _next_header(self.data, self.pos)
            if h is None:
                if len(self.data) - self.pos >= HEADER_SIZE:
                    length = read_header(self.data, self.pos).batch_length
                    if (
                        length < HEADER_SIZE - LOG_OVERHEAD
                        or length + LOG_OVERHEAD > MAX_BATCH_SIZE
                    ):
                        raise CorruptRecordError(f"invalid batch length {length}")
                return None
            if h.next_offset <= self.position:  # wholly before the position: skip unread
                self.pos += h.size
                continue
            header = validate(self.data, self.pos, contiguous=False)
            rows = decode_batch_rows(self.data, self.pos, header)
            self.pos += header.size
            first_timestamp = header.first_timestamp
            if header.attributes & ATTR_LOG_APPEND_TIME:  # Kafka: every record has it
                first_timestamp = header.max_timestamp
                rows = [(r[0], 0, r[2], r[3], r[4]) for r in rows]
            skip = self.position - header.base_offset
            if skip > 0:
                if header.last_offset_delta == header.record_count - 1:
                    rows = rows[skip:]
                else:
                    rows = tuple(r for r in rows if r[0] >= skip)
            if not rows:
                self.position = header.next_offset
                continue
            return FetchedBatch(
                self.topic,
                self.partition,
                header.base_offset,
                first_timestamp,
                rows,
                header.next_offset,
            )

    def _next_or_stop(self, have_some: bool) -> FetchedBatch | None:
        """The next batch; a corrupt one ends this take quietly if records were already
        taken (they are good and get returned), and raises on the next take."""
        try:
            return self.next_batch()
        except CorruptRecordError:
            if have_some:
                return None
            raise

    def take(self, max_records: int) -> list[Record]:
        """Up to ``max_records`` records from the current position on, advancing it."""
        with gc_paused():
            return self.take_paused(max_records)

    def take_paused(self, max_records: int) -> list[Record]:
        """``take`` for a caller that has paused the cyclic GC itself (once per poll)."""
        out: list[Record] = []
        while len(out) < max_records:
            if self.pending is not None:  # a batch partly handed out by take_batches
                if not self._take_batch(out, max_records):
                    break
                continue
            # Every uncompressed batch in one compiled call: checked, decoded, Records.
            recs, self.pos, self.position, stop = take_records(
                self.data, self.pos, self.position, max_records - len(out),
                self.topic, self.partition, Record,
            )  # fmt: skip
            if out:
                out.extend(recs)
            else:
                out = recs
            if not stop or len(out) >= max_records:
                break
            if stop != "compressed":
                if out:  # the good records go out; the next take raises
                    break
                raise CorruptRecordError(stop)
            if not self._take_batch(out, max_records):
                break
        if self.skip_to >= 0:
            self._past_dropped()
        return out

    def _take_batch(self, out: list[Record], max_records: int) -> bool:
        """Hand out (part of) one batch the Python way: a compressed one or the rest of
        a pending one. False when there is nothing more to take now."""
        b = self._next_or_stop(bool(out))
        if b is None:
            return False
        room = max_records - len(out)
        if len(b.rows) > room:
            head, rest = b.rows[:room], b.rows[room:]
            out.extend(build_records(b.topic, b.partition, b.base_offset, b.first_timestamp, head))
            self.position = b.base_offset + rest[0][0]
            b.rows = rest
            self.pending = b
            return False
        out.extend(build_records(b.topic, b.partition, b.base_offset, b.first_timestamp, b.rows))
        self.position = b.next_offset
        return True

    def take_batches(self, max_records: int) -> list[FetchedBatch]:
        """Whole decoded batches (the last one trimmed to fit ``max_records``)."""
        out: list[FetchedBatch] = []
        count = 0
        while count < max_records:
            b = self._next_or_stop(bool(out))
            if b is None:
                break
            room = max_records - count
            if len(b.rows) > room:
                head = FetchedBatch(
                    b.topic,
                    b.partition,
                    b.base_offset,
                    b.first_timestamp,
                    b.rows[:room],
                    b.base_offset + b.rows[room][0],
                )
                b.rows = b.rows[room:]
                self.pending = b
                self.position = head.next_offset
                out.append(head)
                break
            out.append(b)
            count += len(b.rows)
            self.position = b.next_offset
        if self.skip_to >= 0:
            self._past_dropped()
        return out


def first_at_or_after(pd: PartitionData, target: int) -> tuple[int, int] | None:
    """``(offset, timestamp)`` of the first record in ``pd`` stamped at or after ``target``."""
    while (b := pd.next_batch()) is not None:
        for row in b.rows:
            if b.first_timestamp + row[1] >= target:
                return b.base_offset + row[0], b.first_timestamp + row[1]
        pd.position = b.next_offset
    return None


def _next_header(data: memoryview, pos: int) -> BatchHeader | None:
    for _, h in iter_headers(data, pos):
        return h
    return None


def parse_fetch_response(
    body: dict[str, Any], tail: memoryview, fetch_offsets: dict[tuple[str, int], int]
) -> list[PartitionData]:
    """The partitions this client asked for, at the offsets it asked (``fetch_offsets``)."""
    out: list[PartitionData] = []
    for f in fetched_partitions(body, tail):
        offset = fetch_offsets.get((f.topic, f.partition))
        if offset is not None:
            out.append(
                PartitionData(
                    f.topic,
                    f.partition,
                    offset,
                    f.error,
                    f.high_watermark,
                    f.log_start_offset,
                    f.records,
                )
            )
    return out
