"""Log compaction rules (sans-IO): which records of a batch the cleaner keeps, and how.

Kafka's semantics, decided batch by batch from the offset map (key hash -> newest
offset in the dirty section):

- a record survives if it is the newest of its key the map knows (or its key is not in
  the map: it was the newest when the section was cleaned before);
- a record without a key never survives (compacted topics refuse them at produce time,
  see ``check_record_keys``; a topic switched to compact may still hold some);
- a tombstone (value None) survives until ``delete.retention.ms`` after the cleaner
  first saw it: that first time the batch is rewritten with ``ATTR_DELETE_HORIZON`` and
  the horizon in ``first_timestamp`` (Kafka's KIP-534), later passes drop it once the
  horizon has passed;
- a rewritten batch keeps its base offset, last offset delta, leader epoch, producer
  id/epoch/base sequence, max timestamp and codec, and each record keeps its offset and
  timestamp, so replaying its header gives the producer state it gave before;
- a batch with no survivor is dropped, except the last batch of a producer id the
  producer state still tracks: a rebuild of that state from the log must find every
  producer's last sequence (Kafka keeps an empty batch; ours hold at least one
  record). It keeps its last record, turned into a tombstone if a newer record of the
  key superseded it: an old value kept there could reappear once that newer record
  is itself deleted, a tombstone never changes what a key ends up as.

Batches the cleaner keeps whole are copied byte for byte.

Transactions (Kafka's cleaner rules):

- nothing at or after the first unstable offset is cleaned (``plan_cleaning`` caps the
  cleanable segments at min(HW, first unstable offset)), so every transaction with
  data in the cleaned range is decided, and the txn indexes say which were aborted;
- records of aborted transactions are removed, and never enter the offset map (an
  aborted value must not shadow an older committed one); records of committed ones
  are compacted like any other;
- a COMMIT/ABORT marker stays while any data of its transaction does (it was seen in
  this pass) and, like a tombstone, for ``delete.retention.ms`` after the first pass
  that found its transaction empty (that pass stamps its delete horizon). The marker
  that follows a tracked producer's last data batch also stays: it carries the
  producer's epoch, which a rebuild of the producer state needs;
- the txn index entries of the replaced segments go to the cleaned segment, except
  those whose marker was removed (no data of that transaction is left to hide).
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import add, ge, itemgetter
from pathlib import Path
from typing import Any

from logmq.errors import CorruptRecordError, InvalidRecordError, StorageError
from logmq.storage import batch as b
from logmq.storage import checkpoint as ckpt
from logmq.storage import records_codec
from logmq.storage.compression import InflateLimitError
from logmq.storage.offset_map import NO_KEY, OffsetMap, key_hashes
from logmq.storage.txn_index import AbortedTxn
from logmq.storage.txn_state import CONTROL_ABORT, CONTROL_COMMIT, control_record

CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
NO_HORIZON = -1
_MAX_REL_OFFSET = (1 << 32) - 1
_TXN_DATA_MASK = b.ATTR_TRANSACTIONAL | b.ATTR_CONTROL

_DELTA = itemgetter(0)
_KEY = itemgetter(2)
_VALUE = itemgetter(3)


# -- produce-time validation --------------------------------------------------------------


def check_record_keys(data: Any, max_batch_bytes: int | None = None) -> None:
    """Refuse produce data holding a record without a key (for compacted topics only).

    Validates each batch (header and checksum) first, so damaged bytes still get
    CORRUPT_MESSAGE; then decodes the records, which only compacted topics pay for.
    A batch over ``max_batch_bytes`` is left for the append to refuse, undecoded.
    Raises InvalidRecordError (INVALID_RECORD), like Kafka, naming every keyless
    record by its index among the data's records (in its batch, for the one batch a
    Kafka producer sends per partition); only a refused append walks the keys in Python.
    """
    mv = memoryview(data)
    pos, end = 0, len(mv)
    first = 0  # index of the batch's first record among the data's
    keyless: list[int] = []
    while pos < end:
        h = b.validate(mv, pos, end=end)
        if max_batch_bytes is not None and h.size > max_batch_bytes:
            break
        budget = b.inflate_budget(h.size, max_batch_bytes or b.MAX_INFLATED_SIZE)
        rows = b.decode_rows(mv, pos, h, budget)  # a bomb: InflateLimitError
        if None in map(_KEY, rows):
            keyless += [first + i for i, row in enumerate(rows) if row[2] is None]
        first += len(rows)
        pos += h.size
    if keyless:
        why = "record without a key in a compacted topic"
        raise InvalidRecordError(
            f"{len(keyless)} record(s) without a key, the first at index {keyless[0]}: "
            "a compacted topic takes only records with a key",
            record_errors=tuple((i, why) for i in keyless),
        )


# -- cleaner checkpoint ---------------------------------------------------------------------


@dataclass(slots=True)
class CleanerCheckpoint:
    """Per-log cleaner state: where the dirty section starts, when a tombstone expires.

    Its file also marks a log whose segments the cleaner has rewritten: recovery then
    accepts gaps between batch offsets (see PartitionLog.allows_offset_gaps).
    """

    first_dirty_offset: int = 0
    next_delete_horizon: int = NO_HORIZON  # earliest horizon of a kept tombstone

    def to_bytes(self) -> bytes:
        return f"0\n{self.first_dirty_offset}\n{self.next_delete_horizon}\n".encode()

    @classmethod
    def read(cls, directory: Path) -> CleanerCheckpoint | None:
        try:
            text = (directory / CLEANER_CHECKPOINT).read_text()
        except FileNotFoundError:
            return None
        try:
            version, first_dirty, horizon = text.split()
            if version != "0":
                raise ValueError(f"unknown version {version}")
            return cls(int(first_dirty), int(horizon))
        except ValueError as e:
            raise StorageError(f"malformed {directory / CLEANER_CHECKPOINT}: {e}") from None

    def write(self, directory: Path) -> None:
        ckpt.atomic_write(directory / CLEANER_CHECKPOINT, self.to_bytes())


# -- planning -------------------------------------------------------------------------------


@dataclass(slots=True)
class SegmentRef:
    """What the cleaner thread needs of one immutable segment (no shared handles)."""

    segment: Any  # the LogSegment, compared by identity when the result is installed
    base_offset: int
    end_offset: int  # the next segment's base: nothing in this one reaches it
    size: int
    path: Path


@dataclass(slots=True)
class CleaningPlan:
    """A log's cleanable segments, taken on the event loop thread.

    ``segments`` are below the active segment, the high watermark and the
    min.compaction.lag.ms horizon; those from ``first_dirty`` on are dirty and feed
    the offset map; every cleanable segment up to where the map ends is rewritten.
    """

    directory: Path
    segments: list[SegmentRef]
    first_dirty: int  # index in ``segments`` of the first dirty one
    now_ms: int
    delete_retention_ms: int
    segment_bytes: int
    index_interval: int
    index_bytes: int
    producer_last_offsets: dict[int, int]  # producer id -> last offset of its last batch
    dirty_ratio: float
    reason: str  # "dirty ratio", "max.compaction.lag.ms", "tombstones", "forced"
    max_message_bytes: int = b.MAX_INFLATED_SIZE  # sets the budget to inflate a batch
    # aborted transactions with data below the last segment's end (from txn indexes)
    aborted: list[AbortedTxn] = field(default_factory=list)
    # producer ids the producer state tracks: their latest marker stays (epoch)
    tracked_producers: frozenset[int] = frozenset()

    @property
    def dirty_segments(self) -> list[SegmentRef]:
        return self.segments[self.first_dirty :]


def plan_cleaning(plog: Any, now_ms: int | None, *, force: bool = False) -> CleaningPlan | None:
    """What the cleaner would clean in ``plog`` now, or None when nothing (or, unless
    ``force``, nothing worth it) is cleanable. Reads the log: event loop thread only.

    Cleanable: whole segments below the active segment, the high watermark and the
    first unstable offset (an undecided transaction's data, and all after it, stays
    as written), stopping at the first one with a record newer than
    min.compaction.lag.ms. The log is worth cleaning when the dirty share of those
    bytes reaches min.cleanable.dirty.ratio, when its oldest dirty batch is older than
    max.compaction.lag.ms, or when a kept tombstone's delete horizon has passed.
    """
    cfg = plog.config
    if plog.closed or not cfg.compact:
        return None
    now = plog.clock() if now_ms is None else now_ms
    segs, min_lag = plog.segments, cfg.min_compaction_lag_ms
    limit = plog.high_watermark
    unstable = plog.producer_state.txn.first_unstable_offset()
    if unstable is not None and unstable < limit:
        limit = unstable
    refs: list[SegmentRef] = []
    for i in range(len(segs) - 1):
        seg, end = segs[i], segs[i + 1].base_offset
        if end > limit or (min_lag and now - seg.max_timestamp < min_lag):
            break
        refs.append(SegmentRef(seg, seg.base_offset, end, seg.size, seg.log_path))
    if not refs:
        return None
    first_dirty = max(plog.first_dirty_offset, plog.log_start_offset)
    d = next((i for i, r in enumerate(refs) if r.end_offset > first_dirty), len(refs))
    dirty_bytes = sum(r.size for r in refs[d:])
    ratio = dirty_ratio(sum(r.size for r in refs[:d]), dirty_bytes)
    lag = cfg.max_compaction_lag_ms
    horizon = plog.next_delete_horizon
    if force:
        reason = "forced"
    elif dirty_bytes and ratio >= cfg.min_cleanable_dirty_ratio:
        reason = "dirty ratio"
    elif lag is not None and d < len(refs) and now - _written_at(refs[d], now) >= lag:
        reason = "max.compaction.lag.ms"
    elif horizon != NO_HORIZON and now >= horizon:
        reason = "tombstones"
    else:
        return None
    tracked = plog.producer_state.producers.items()
    producers = {pid: e.batches[-1].last_offset for pid, e in tracked if e.batches}
    aborted = collect_aborted_txns(plog, refs[0].base_offset, refs[-1].end_offset)
    return CleaningPlan(
        plog.dir,
        refs,
        d,
        now,
        cfg.delete_retention_ms,
        cfg.segment_bytes,
        cfg.index_interval_bytes,
        cfg.segment_index_bytes,
        producers,
        ratio,
        reason,
        cfg.max_message_bytes,
        aborted,
        frozenset(plog.producer_state.producers),
    )


def collect_aborted_txns(plog: Any, start: int, end: int) -> list[AbortedTxn]:
    """Every aborted transaction with data in [start, end), from the txn indexes of
    the segments from ``start`` on (markers may lie past ``end``), in marker order.
    A log that never indexed an abort opens no txn index."""
    if not getattr(plog, "aborts_indexed", True):
        return []
    segs = plog.segments
    bases = [s.base_offset for s in segs]
    out: list[AbortedTxn] = []
    for seg in segs[max(0, bisect.bisect_right(bases, start) - 1) :]:
        found, passed = seg.txn_index.collect(start, end)
        out.extend(found)
        if passed:
            break
    return out


def _written_at(ref: SegmentRef, now: int) -> int:
    """When a segment's data was first written: its first batch's time, else its open."""
    ts = ref.segment.first_batch_timestamp
    if ts is not None and ts >= 0:
        return ts
    created = ref.segment.created_ms
    return now if created is None else created


def dirty_ratio(clean_bytes: int, dirty_bytes: int) -> float:
    total = clean_bytes + dirty_bytes
    return dirty_bytes / total if total else 0.0


def group_segments(segments: list[SegmentRef], max_bytes: int) -> list[list[SegmentRef]]:
    """Consecutive runs that fit one segment: total size and relative offsets bounded.

    Cleaning only shrinks segments, so the old sizes bound the new one; small cleaned
    segments merge into bigger ones over time, as in Kafka.
    """
    groups: list[list[SegmentRef]] = []
    cur: list[SegmentRef] = []
    size = 0
    for seg in segments:
        if cur and (
            size + seg.size > max_bytes or seg.end_offset - cur[0].base_offset > _MAX_REL_OFFSET
        ):
            groups.append(cur)
            cur, size = [], 0
        cur.append(seg)
        size += seg.size
    if cur:
        groups.append(cur)
    return groups


# -- the record filter ------------------------------------------------------------------------


@dataclass(slots=True)
class CleanStats:
    """What one cleaning did (summed over batches, groups and passes)."""

    segments_in: int = 0
    segments_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    batches_in: int = 0
    batches_out: int = 0
    records_in: int = 0
    records_out: int = 0
    tombstones_removed: int = 0
    keyless_removed: int = 0
    oversized_kept: int = 0  # batches kept whole: they inflate past their budget
    aborted_removed: int = 0  # records of aborted transactions
    markers_removed: int = 0  # COMMIT/ABORT markers of transactions with no data left
    first_dirty_offset: int = -1  # where the next dirty section starts
    next_delete_horizon: int = NO_HORIZON
    seconds: float = 0.0

    def add(self, other: CleanStats) -> None:
        for name in (
            "segments_in",
            "segments_out",
            "bytes_in",
            "bytes_out",
            "batches_in",
            "batches_out",
            "records_in",
            "records_out",
            "tombstones_removed",
            "keyless_removed",
            "oversized_kept",
            "aborted_removed",
            "markers_removed",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.note_horizon(other.next_delete_horizon)

    def note_horizon(self, horizon: int) -> None:
        if horizon != NO_HORIZON and (
            self.next_delete_horizon == NO_HORIZON or horizon < self.next_delete_horizon
        ):
            self.next_delete_horizon = horizon


class AbortedRanges:
    """Which producers' offsets belong to aborted transactions (from txn index entries).

    A producer's transactions on a partition never overlap, so its entries are
    disjoint [first_offset, last_offset] ranges, searched by bisection.
    """

    __slots__ = ("_ranges",)

    def __init__(self, entries: Iterable[AbortedTxn] = ()) -> None:
        ranges: dict[int, list[tuple[int, int]]] = {}
        for e in entries:
            ranges.setdefault(e.producer_id, []).append((e.last_offset, e.first_offset))
        for r in ranges.values():
            r.sort()
        self._ranges = ranges

    def __bool__(self) -> bool:
        return bool(self._ranges)

    def contains(self, producer_id: int, offset: int) -> bool:
        """Whether ``producer_id``'s data at ``offset`` is in an aborted transaction."""
        r = self._ranges.get(producer_id)
        if not r:
            return False
        i = bisect.bisect_left(r, (offset, -1))
        return i < len(r) and r[i][1] <= offset


def is_aborted_data(h: b.BatchHeader, aborted: AbortedRanges) -> bool:
    """A transactional data batch (not a marker) of an aborted transaction."""
    return (
        h.attributes & _TXN_DATA_MASK == b.ATTR_TRANSACTIONAL
        and h.producer_id >= 0
        and aborted.contains(h.producer_id, h.base_offset)
    )


@dataclass(slots=True)
class RecordFilter:
    """Decides, batch by batch and in offset order, what one cleaning pass keeps.

    One filter sees every batch of a pass, from the log's first segment on, so it
    knows whether a transaction's data came before its marker in this pass.
    """

    offsets: OffsetMap
    now_ms: int
    delete_retention_ms: int
    producer_last_offsets: dict[int, int]
    stats: CleanStats = field(default_factory=CleanStats)
    max_message_bytes: int = b.MAX_INFLATED_SIZE
    aborted: AbortedRanges = field(default_factory=AbortedRanges)
    tracked_producers: frozenset[int] = frozenset()
    # producers with transactional data since their last marker (in this pass)
    txn_data: set[int] = field(default_factory=set)
    # offsets of the markers this pass removed (their txn index entries go too)
    removed_markers: set[int] = field(default_factory=set)

    def clean_batch(self, buf: Any, pos: int, h: b.BatchHeader) -> Any:
        """The batch to write for the (validated) batch at ``pos``: a slice of ``buf``
        when kept whole, new bytes when rewritten, None when dropped."""
        st = self.stats
        st.batches_in += 1
        st.records_in += h.record_count
        whole = memoryview(buf)[pos : pos + h.size]
        attrs = h.attributes
        if attrs & b.ATTR_CONTROL:
            return self._marker(buf, pos, h, whole)
        if attrs & b.ATTR_TRANSACTIONAL and h.producer_id >= 0:
            self.txn_data.add(h.producer_id)
            if self.aborted.contains(h.producer_id, h.base_offset):
                if self.producer_last_offsets.get(h.producer_id) == h.last_offset:
                    # the producer's last sequence must survive: stays whole, aborted
                    # (its marker and index entry stay, as data of theirs is left)
                    return self._kept(whole, h.record_count)
                st.aborted_removed += h.record_count
                return None
        try:
            rows = b.decode_rows(buf, pos, h, b.inflate_budget(h.size, self.max_message_bytes))
        except InflateLimitError:  # a bomb (stored before the topic was compacted): keep it
            st.oversized_kept += 1
            return self._kept(whole, h.record_count)
        if len(rows) != h.record_count:
            raise CorruptRecordError(f"batch says {h.record_count} records, holds {len(rows)}")
        base = h.base_offset
        hashes = key_hashes(list(map(_KEY, rows)))
        offsets = list(map(add, repeat(base), map(_DELTA, rows)))
        # Newest-or-unknown, in C: a key missing from the map "maps" to the record itself.
        keep = list(map(ge, offsets, map(self.offsets.get, hashes, offsets)))
        keyless = NO_KEY in hashes
        if keyless:
            for i, hsh in enumerate(hashes):
                if hsh is NO_KEY and keep[i]:
                    keep[i] = False
                    st.keyless_removed += 1
        horizon = NO_HORIZON
        if None in map(_VALUE, rows):
            flagged = bool(h.attributes & b.ATTR_DELETE_HORIZON)
            if flagged and self.now_ms >= h.first_timestamp:
                for i, row in enumerate(rows):
                    if keep[i] and row[3] is None:
                        keep[i] = False
                        st.tombstones_removed += 1
            if any(keep[i] and rows[i][3] is None for i in range(len(rows))):
                horizon = h.first_timestamp if flagged else self.now_ms + self.delete_retention_ms
        kept = sum(keep)
        converted = False
        if not kept:
            if self.producer_last_offsets.get(h.producer_id) != h.last_offset:
                return None
            keep[-1] = True  # the producer's last batch stays, with one record
            kept = 1
            last = rows[-1]
            if last[3] is not None and hashes[-1] is not NO_KEY:  # superseded
                rows[-1] = (last[0], last[1], last[2], None, last[4])
                converted = True
            if rows[-1][3] is None:
                horizon = (
                    h.first_timestamp
                    if h.attributes & b.ATTR_DELETE_HORIZON
                    else self.now_ms + self.delete_retention_ms
                )
        if horizon > self.now_ms:  # a kept placeholder's passed horizon wakes no one
            st.note_horizon(horizon)
        stamped = horizon != NO_HORIZON and h.attributes & b.ATTR_DELETE_HORIZON
        if kept == h.record_count and not converted and (horizon == NO_HORIZON or stamped):
            return self._kept(whole, kept)
        rows = list(compress(rows, keep)) if kept < len(rows) else rows
        return self._kept(rewrite_batch(h, rows, horizon), kept)

    def _marker(self, buf: Any, pos: int, h: b.BatchHeader, whole: Any) -> Any:
        """A control batch: a COMMIT/ABORT marker goes once its transaction has no data
        left and its delete horizon has passed; anything else stays whole."""
        pid = h.producer_id
        if pid < 0:
            return self._kept(whole, h.record_count)
        ctype = control_record(buf, pos, verify=False).type
        if ctype != CONTROL_ABORT and ctype != CONTROL_COMMIT:
            return self._kept(whole, h.record_count)
        had_data = pid in self.txn_data
        self.txn_data.discard(pid)
        latest = pid in self.tracked_producers and h.last_offset > self.producer_last_offsets.get(
            pid, -1
        )
        if had_data or latest:
            return self._kept(whole, h.record_count)
        flagged = bool(h.attributes & b.ATTR_DELETE_HORIZON)
        if flagged and self.now_ms >= h.first_timestamp:
            self.stats.markers_removed += 1
            self.removed_markers.add(h.last_offset)
            return None
        if flagged:
            self.stats.note_horizon(h.first_timestamp)
            return self._kept(whole, h.record_count)
        horizon = self.now_ms + self.delete_retention_ms
        self.stats.note_horizon(horizon)
        rows = b.decode_rows(buf, pos, h)
        return self._kept(rewrite_batch(h, rows, horizon), h.record_count)

    def _kept(self, data: Any, records: int) -> Any:
        self.stats.batches_out += 1
        self.stats.records_out += records
        return data


def rewrite_batch(h: b.BatchHeader, rows: list[tuple], horizon: int) -> bytes:
    """Re-encode surviving rows under ``h``'s offsets, producer fields and codec.

    With a delete horizon the batch's ``first_timestamp`` carries it and record
    timestamps are re-based on it; without one it is the first record's timestamp.
    """
    old_first = h.first_timestamp
    attributes = h.attributes & ~b.ATTR_DELETE_HORIZON
    if horizon != NO_HORIZON:
        first = horizon
        attributes |= b.ATTR_DELETE_HORIZON
    else:
        first = old_first + rows[0][1]
    if first != old_first:
        shift = old_first - first
        rows = [(r[0], r[1] + shift, r[2], r[3], r[4]) for r in rows]
    return b.assemble(
        records_codec.encode_rows(rows),
        count=len(rows),
        last_offset_delta=h.last_offset_delta,
        first_timestamp=first,
        max_timestamp=h.max_timestamp,
        attributes=attributes,
        base_offset=h.base_offset,
        leader_epoch=h.leader_epoch,
        producer_id=h.producer_id,
        producer_epoch=h.producer_epoch,
        base_sequence=h.base_sequence,
    )


# -- reading segment files --------------------------------------------------------------------

READ_CHUNK = 4 << 20


def segment_batches(fd: int, size: int, path: Path) -> Iterator[tuple[Any, int, b.BatchHeader]]:
    """(buffer, position in it, header) of every batch of a segment file, checksummed.

    Reads in large chunks. Offsets must increase; gaps are fine (compacted input). A
    damaged batch raises CorruptRecordError naming the file and position.
    """
    filepos, expect = 0, -1
    while filepos < size:
        chunk = os.pread(fd, min(READ_CHUNK, size - filepos), filepos)
        if len(chunk) >= b.LOG_OVERHEAD and b.peek_size(chunk, 0) > len(chunk):
            need = b.peek_size(chunk, 0)
            if need > size - filepos:
                raise CorruptRecordError(f"{path}: truncated batch at position {filepos}")
            chunk = os.pread(fd, need, filepos)
        pos = 0
        while pos < len(chunk):
            rem = len(chunk) - pos
            if pos and (rem < b.HEADER_SIZE or b.peek_size(chunk, pos) > rem):
                break  # spans the chunk end: the next chunk starts with it
            try:
                h = b.validate(chunk, pos, contiguous=False)
                if h.base_offset < expect:
                    raise CorruptRecordError(f"batch offset {h.base_offset} goes back")
            except CorruptRecordError as e:
                raise CorruptRecordError(f"{path} at position {filepos + pos}: {e}") from None
            yield chunk, pos, h
            expect = h.next_offset
            pos += h.size
        if not pos:
            raise CorruptRecordError(f"{path}: unreadable batch at position {filepos}")
        filepos += pos
