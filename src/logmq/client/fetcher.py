"""Turning Fetch responses into records (sans-IO: bytes in, records out).

A Fetch tail holds, per partition, whole batches exactly as the broker stored them;
the first may start before the requested offset and the last may be cut short. Each
batch is checksummed here (over the response buffer, no copy) before anything is
decoded. ``poll()`` takes a partition's uncompressed batches with one compiled call
(``batch_scan.take_records``: checks, decodes and builds the Records), so no Python
code runs per batch or per record; compressed batches and ``poll_batches()`` decode a
batch per compiled call (``records_codec``) and build Records with one C-level
``map``/``zip`` pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import add, itemgetter
from typing import Any

from logmq.errors import CorruptRecordError, ErrorCode, LogMQError
from logmq.gcpause import gc_paused
from logmq.net.fetch_message import fetched_partitions
from logmq.records import Record
from logmq.storage.batch import (
    ATTR_LOG_APPEND_TIME,
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

    def __post_init__(self) -> None:
        self.position = self.fetch_offset

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
