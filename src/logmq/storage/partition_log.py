"""The partition log: an ordered list of segments, appended to, read, rolled and truncated.

All work is per batch: a produce request's slice is validated header-and-checksum,
stamped with offsets without copying (stamping.py) and written with one ``pwritev``;
reads hand out a FileSlice for sendfile. Durability timing (fsync) is the
LogManager's business; this class offers a synchronous ``flush`` and a split
``flush_jobs``/``flush_done`` so the manager can run fsyncs in a worker thread.

The rest of a log's life is in its own modules, each working on a PartitionLog:
opening and crash recovery in log_loader.py, retention and delayed file deletion in
retention.py, installing the log cleaner's output in cleaned_install.py.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from logmq.errors import (
    CorruptRecordError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    StorageError,
    storage_error_for,
)
from logmq.storage import batch as b
from logmq.storage import cleaned_install, retention
from logmq.storage.checkpoint import atomic_write
from logmq.storage.compaction import CleaningPlan, CleanStats, plan_cleaning
from logmq.storage.config import LogConfig
from logmq.storage.log_loader import load_log, rebuild_producer_state
from logmq.storage.open_files import OpenFileCache
from logmq.storage.producer_state import (
    ProducerEntry,
    delete_snapshots,
    list_snapshots,
    snapshot_path,
)
from logmq.storage.segment import BatchInfo, FileSlice, LogSegment, make_log_dir, run_sync
from logmq.storage.stamping import (
    F_ATTRIBUTES,
    F_LAST_OFFSET_DELTA,
    F_LENGTH,
    F_MAX_TIMESTAMP,
    F_PRODUCER_ID,
    F_RECORD_COUNT,
    STAMP,
    AppendInfo,
    Located,
    RawHeader,
    StampedWrite,
    check_batch,
    count_offsets,
    stamp_batches,
    to_headers,
    validate_batches,
)
from logmq.storage.txn_index import TXN_INDEX_SUFFIX, collect_aborted
from logmq.storage.txn_state import control_record

__all__ = ["AppendInfo", "FileSlice", "PartitionLog", "parse_dir_name"]

log = logging.getLogger(__name__)

_MAX_REL_OFFSET = (1 << 32) - 1
_LOG_OVERHEAD = b.LOG_OVERHEAD
_STAMP_SIZE = STAMP.size
_CONTROL = b.ATTR_CONTROL
_TXN_ATTRS = b.ATTR_TRANSACTIONAL | b.ATTR_CONTROL
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1


class FlushMark(NamedTuple):
    """What a flush covers once its jobs are done: taken when the jobs were."""

    offset: int  # the log end offset then
    messages: int  # messages appended until then
    changes: int  # PartitionLog._changes then
    truncations: int  # PartitionLog._truncations then
    base: int  # the active segment's base offset then
    position: int  # and its size


def parse_dir_name(name: str) -> tuple[str, int]:
    """``<topic>-<partition>`` -> (topic, partition); topics may contain dashes."""
    topic, _, part = name.rpartition("-")
    if not topic or not part.isdigit():
        raise ValueError(f"not a partition directory name: {name!r}")
    return topic, int(part)


def run_flush_jobs(jobs: list[Any]) -> None:
    """Run what ``flush_jobs`` returned (a worker thread may): segment syncs and the
    leader-epoch checkpoint write."""
    for seg, job in jobs:
        if seg is None:
            job()
        else:
            run_sync(job)


def _now_ms() -> int:
    return int(time.time() * 1000)


class PartitionLog:
    def __init__(
        self,
        directory: str | Path,
        config: LogConfig | None = None,
        *,
        cache: OpenFileCache | None = None,
        clean_shutdown: bool = True,
        recovery_point: int | None = None,
        log_start_offset: int = 0,
        high_watermark: int = 0,
        clock: Callable[[], int] = _now_ms,
        recovery_position: tuple[int, int] | None = None,
        names: list[str] | None = None,
    ) -> None:
        """``recovery_point``/``recovery_position``: from the recovery-point checkpoint
        (log_loader.load_log says how they bound the work of opening the log).
        ``names``: the directory's listing, when the caller has just made it."""
        self.dir = Path(directory)
        self.topic, self.partition = parse_dir_name(self.dir.name)
        self.config = config or LogConfig()
        self.cache = cache if cache is not None else OpenFileCache()
        self.clock = clock
        # A new log writes nothing here: its directory comes from the LogManager (a
        # worker thread) or its first write, its first segment file from that write
        # (LogSegment), so creating 10,000 partitions costs the caller no file writes.
        if names is None:
            names = os.listdir(self.dir) if os.path.isdir(self.dir) else []
        self._appended_messages = 0
        self._flushed_messages = 0
        # Counts writes, rolls and truncations; a flush or a producer snapshot is only
        # due at close when one happened since the last (an idle log then costs none).
        self._changes = 0
        self._flushed_changes = 0
        self._snapshot_changes: int | None = None
        self.last_flush_ms = clock()
        self._pending_deletes = retention.PendingDeletes()
        self.closed = False
        # the remote tier holds this log's older part (broker/replica/remote_log.py):
        # log_start_offset is then the local log start, and only the tier's planner
        # deletes local segments, once a finished copy covers them
        self.remote_managed = False
        loaded = load_log(
            self.dir,
            self.config,
            self._segment,
            clean_shutdown=clean_shutdown,
            recovery_point=recovery_point,
            log_start_offset=log_start_offset,
            names=names,
            recovery_position=recovery_position,
        )
        self.segments: list[LogSegment] = loaded.segments
        self._bases = [s.base_offset for s in self.segments]
        self.log_start_offset = loaded.log_start_offset
        self.log_end_offset = loaded.log_end_offset
        self.recovery_point = self.log_end_offset
        last = self.segments[-1]
        # (active segment base, its size) at the recovery point, while known: what the
        # recovery-point checkpoint records so that a start can skip the scan.
        self.recovery_position: tuple[int, int] | None = (last.base_offset, last.size)
        self._truncations = 0
        self.cut_bytes = loaded.cut_bytes  # bytes recovery removed at open
        if self.cut_bytes:
            self._changes = 1  # the cut reaches the disk with the next flush
        if loaded.snapshot_current:
            self._snapshot_changes = self._changes
        self.producer_state = loaded.producer_state
        self.leader_epochs = loaded.leader_epochs
        # Compaction state (log_cleaner.py): where the dirty section starts, the earliest
        # delete horizon of a kept tombstone, and whether the cleaner ever rewrote this log.
        self.first_dirty_offset = loaded.first_dirty_offset
        self.next_delete_horizon = loaded.next_delete_horizon
        self.cleaned_before = loaded.cleaned_before
        self._hw = min(max(high_watermark, 0), self.log_end_offset)
        self.producer_state.txn.on_high_watermark(self._hw)
        # whether any segment may hold an aborted transaction: a read_committed fetch
        # (librdkafka reads committed) or a cleaning of a log that never had one opens
        # no txn index; set by appends, recovery and the cleaner's installs
        self.aborts_indexed = any(n.endswith(TXN_INDEX_SUFFIX) for n in names) or any(
            seg.has_txn_entries for seg in self.segments
        )

    def _segment(
        self, base: int, *, active: bool = False, create: bool = False, defer_create: bool = False
    ) -> LogSegment:
        seg = LogSegment(
            self.dir,
            base,
            index_interval=self.config.index_interval_bytes,
            index_bytes=self.config.segment_index_bytes,
            cache=self.cache,
            active=active,
            create=create,
            defer_create=defer_create,
        )
        seg.created_ms = self.clock()
        return seg

    def _replace_segments(self, start: int, stop: int, new: list[LogSegment]) -> None:
        """``segments[start:stop] = new``, keeping the base offsets in step.

        How retention.py and cleaned_install.py change the segment list.
        """
        self.segments[start:stop] = new
        self._bases[start:stop] = [s.base_offset for s in new]

    # -- properties -----------------------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        """Kept and checkpointed here; only the replica manager moves it (appends do not)."""
        return self._hw

    @high_watermark.setter
    def high_watermark(self, value: int) -> None:
        self._hw = hw = min(max(value, self.log_start_offset), self.log_end_offset)
        txn = self.producer_state.txn
        if txn.ended or txn.high_watermark > hw:
            txn.on_high_watermark(hw)
        else:
            txn.high_watermark = hw

    @property
    def last_stable_offset(self) -> int:
        """Where read_committed consumers stop: the HW, or the first offset of the
        earliest transaction not yet decided below it (txn_state.py)."""
        txn = self.producer_state.txn
        if not txn.ongoing and not txn.ended:
            return self._hw
        # never below the log start (retention or DeleteRecords past an open
        # transaction's first offset): offsets there are gone for every reader, as Kafka
        return min(max(txn.lso(self._hw), self.log_start_offset), self._hw)

    def aborted_transactions(self, fetch_offset: int, upper: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions a read_committed fetch
        of [fetch_offset, upper) must filter out, from the segments' txn indexes."""
        if upper <= fetch_offset or not self.aborts_indexed:
            return []
        i = max(0, bisect.bisect_right(self._bases, fetch_offset) - 1)
        return collect_aborted(
            (_SegmentAborts(seg) for seg in self.segments[i:]), fetch_offset, upper
        )

    @property
    def active_segment(self) -> LogSegment:
        return self.segments[-1]

    @property
    def unflushed_messages(self) -> int:
        return self._appended_messages - self._flushed_messages

    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    # -- appending ------------------------------------------------------------------------
    #
    # Two entry points, for the two ways offsets arrive: ``append`` (a leader assigns
    # them from the log end, under its epoch) and ``append_as_follower`` (batches keep
    # the leader's offsets, gaps included, and epochs). Both end in ``_write``: the
    # roll check and the one segment write.

    def append(self, data: Any, *, leader_epoch: int = 0, control: bool = False) -> AppendInfo:
        """Validate, assign offsets to and write one or more batches; all or nothing.

        One batch without a producer id, in CreateTime, is the produce hot path and is
        stamped inline here (every statement runs per produced batch). Several batches,
        idempotent producers (whose retries are answered, not written) and
        LogAppendTime (which rewrites checksummed fields) are stamped by
        ``_stamp_many``. Both then share the write and the bookkeeping.

        ``control``: the append may hold control batches (transaction markers, from the
        coordinator's WriteTxnMarkers); a client's never may (INVALID_RECORD, as Kafka).
        """
        if self.closed:
            self._check_open()
        mv = memoryview(data)
        cfg = self.config
        limit = len(mv)
        if not limit:
            raise CorruptRecordError("empty produce data: no record batch")
        f = check_batch(mv, 0, limit, cfg.max_message_bytes, True)
        size = f[F_LENGTH] + _LOG_OVERHEAD
        first = self.log_end_offset
        pending = None
        if (
            size == limit
            and f[F_PRODUCER_ID] < 0
            and cfg.message_timestamp_type != "LogAppendTime"
            and not f[F_ATTRIBUTES] & _CONTROL
        ):
            nxt = first + f[F_LAST_OFFSET_DELTA] + 1
            max_ts = f[F_MAX_TIMESTAMP]
            count = f[F_RECORD_COUNT]
            parts = [STAMP.pack(first, f[F_LENGTH], leader_epoch), mv[_STAMP_SIZE:size]]
            batches: Sequence[tuple[int, int, int, int]] = ((0, size, first, max_ts),)
        else:
            stamped = self._stamp_many(mv, f, size, leader_epoch, control)
            if isinstance(stamped, AppendInfo):
                return stamped  # every batch an idempotent retry: nothing to write
            w, pending, kept = stamped
            parts, size, batches = w.parts, w.size, w.infos
            nxt, max_ts, count = w.next_offset, w.max_timestamp, w.record_count
        self._write(parts, size, batches, first, nxt, max_ts)
        if pending:
            self.producer_state.commit(pending)
            self._track_transactions(mv, kept, first)
        if leader_epoch > self.leader_epochs.latest_epoch:
            # No fsync on the append path (Kafka's KAFKA-15046): the epoch reaches disk
            # with the log's next flush, before the recovery point passes its records.
            self.leader_epochs.assign(leader_epoch, first, flush=False)
        self._appended_messages += count
        return AppendInfo(first, nxt - 1, max_ts, count, False)

    def _stamp_many(
        self, mv: memoryview, f: RawHeader, size: int, leader_epoch: int, control: bool = False
    ) -> tuple[StampedWrite, dict[int, ProducerEntry], Located] | AppendInfo:
        """Stamp several batches, idempotent producers' or LogAppendTime ones.

        ``f`` and ``size`` describe the first batch, already validated. Returns the
        write plus the producer state to commit once it is done, or, if every batch is
        a retry of one already written, the original offsets (``duplicate``).
        """
        cfg = self.config
        limit = len(mv)
        raw = [(0, f)]
        while size < limit:
            f = check_batch(mv, size, limit, cfg.max_message_bytes, True)
            raw.append((size, f))
            size += f[F_LENGTH] + _LOG_OVERHEAD
        headers = to_headers(raw)
        if not control and any(h.attributes & _CONTROL for _, h in headers):
            raise InvalidRecordError(
                "control batches are written by the transaction coordinator only"
            )
        pending: dict[int, ProducerEntry] = {}
        keep = headers
        if any(h.producer_id >= 0 for _, h in headers):
            keep, dups = self._check_producers(mv, headers, pending)
            if not keep:
                max_ts = max(h.max_timestamp for _, h in headers)
                count = sum(h.record_count for _, h in headers)
                return AppendInfo(dups[0].first_offset, dups[-1].last_offset, max_ts, count, True)
        now = self.clock()
        append_time = now if cfg.message_timestamp_type == "LogAppendTime" else None
        w = stamp_batches(mv, keep, self.log_end_offset, leader_epoch, log_append_time=append_time)
        return w, pending, keep

    def _track_transactions(self, mv: memoryview, kept: Located, first: int) -> None:
        """Transactional batches and markers just written (at offsets from ``first``):
        open or end transactions, and index an abort in the active segment."""
        txn = self.producer_state.txn
        base = first
        for pos, h in kept:
            attrs = h.attributes
            if attrs & _TXN_ATTRS and h.producer_id >= 0:
                ctype = None
                if attrs & _CONTROL:
                    ctype = control_record(mv, pos, verify=False).type
                    self.producer_state.verifications.pop(h.producer_id, None)
                aborted = txn.on_batch(dataclasses.replace(h, base_offset=base), ctype)
                if aborted is not None:
                    self.segments[-1].txn_index.append(aborted)
                    self.aborts_indexed = True
            base += h.last_offset_delta + 1

    def _check_producers(
        self,
        mv: memoryview,
        headers: list[tuple[int, b.BatchHeader]],
        pending: dict[int, ProducerEntry],
    ) -> tuple[list[tuple[int, b.BatchHeader]], list[Any]]:
        """Split idempotent retries from new batches; stage the new ones in ``pending``.
        A marker (only ``append(control=True)`` lets one through) is also checked
        against the coordinator epoch of the producer's last marker."""
        state = self.producer_state
        keep: list[tuple[int, b.BatchHeader]] = []
        dups = []
        for pos, h in headers:
            dup = state.check(h, pending)
            if dup is not None:
                dups.append(dup)
                continue
            marker = h.attributes & _CONTROL and h.producer_id >= 0
            if marker:
                coordinator_epoch = control_record(mv, pos, verify=False).coordinator_epoch
                state.check_marker(h.producer_id, coordinator_epoch, pending)
            state.stage(h, self.log_end_offset + count_offsets(keep), pending)
            if marker:
                state.note_marker(h.producer_id, coordinator_epoch, pending)
            keep.append((pos, h))
        return keep, dups

    def append_as_follower(self, data: Any) -> AppendInfo | None:
        """Append batches that already carry offsets and epochs (replication).

        Batches must start at or after the log end offset, in increasing order.
        """
        self._check_open()
        mv = memoryview(data)
        headers = validate_batches(mv, self.config.max_message_bytes, contiguous=False)
        if not headers:
            return None
        expect = self.log_end_offset
        for _, h in headers:
            if h.base_offset < expect:
                raise CorruptRecordError(
                    f"follower batch at offset {h.base_offset} is below {expect}"
                )
            expect = h.next_offset
        infos = [BatchInfo(p, h.size, h.base_offset, h.max_timestamp) for p, h in headers]
        first = headers[0][1].base_offset
        max_ts = max(h.max_timestamp for _, h in headers)
        self._write([mv], len(mv), infos, first, expect, max_ts)
        txn = self.producer_state.txn
        for pos, h in headers:
            self.producer_state.replay(h)
            if h.attributes & _TXN_ATTRS and h.producer_id >= 0:
                ctype = None
                if h.attributes & _CONTROL:
                    rec = control_record(mv, pos, verify=False)
                    ctype = rec.type
                    self.producer_state.note_marker(h.producer_id, rec.coordinator_epoch, None)
                    self.producer_state.verifications.pop(h.producer_id, None)
                aborted = txn.on_batch(h, ctype)
                if aborted is not None:
                    self.segments[-1].txn_index.append(aborted)
                    self.aborts_indexed = True
            if h.leader_epoch > self.leader_epochs.latest_epoch:
                self.leader_epochs.assign(h.leader_epoch, h.base_offset, flush=False)
        count = sum(h.record_count for _, h in headers)
        self._appended_messages += count
        return AppendInfo(first, expect - 1, max_ts, count, False)

    def _write(
        self,
        parts: list[Any],
        size: int,
        batches: Sequence[tuple[int, int, int, int]],
        first: int,
        next_offset: int,
        max_timestamp: int,
    ) -> None:
        """Write stamped batches at the log end, rolling first if the active segment is done.

        The write every append shares (``LogSegment.append`` has the ``batches``
        format). A non-empty active segment rolls when the write would overflow
        segment.bytes, 32-bit relative offsets or an index, or segment.ms has passed.
        """
        seg = self.segments[-1]
        used = seg.size
        if used and (
            used + size > self.config.segment_bytes
            or next_offset - seg.base_offset > _MAX_REL_OFFSET
            or seg.index_full
            or self._segment_expired(seg, max_timestamp)
        ):
            seg = self.roll(first)
        seg.append(parts, size, batches, next_offset)
        self.log_end_offset = next_offset
        self._changes += 1

    def _segment_expired(
        self, seg: LogSegment, timestamp: int | None, now_ms: int | None = None
    ) -> bool:
        """segment.ms, measured like Kafka from the max timestamp of the first batch.

        On append ``timestamp`` is the new batch's max timestamp (so a producer's
        consistent old timestamps never roll per batch); the periodic check passes
        None and compares with now. The data carries that time, so a restart does
        not postpone a roll. Segments whose first batch has no timestamp fall back
        to when this process opened them.
        """
        first_ts = seg.first_batch_timestamp
        if first_ts is not None and first_ts >= 0:
            if timestamp is None:
                timestamp = self.clock() if now_ms is None else now_ms
            return timestamp - first_ts >= self.config.segment_ms
        created = seg.created_ms
        if created is None:
            return False
        now = self.clock() if now_ms is None else now_ms
        return now - created >= self.config.segment_ms

    def roll(self, base_offset: int | None = None) -> LogSegment:
        """Start a new active segment at ``base_offset`` (default: the log end offset)."""
        base = self.log_end_offset if base_offset is None else base_offset
        old = self.active_segment
        if not old.size and old.base_offset == base:
            return old
        self._changes += 1
        try:
            if base == self.log_end_offset:
                # A snapshot per segment bounds the header replay after a crash.
                self.write_producer_snapshot()
            old.roll()
            try:
                seg = self._segment(base, active=True, create=True)
            except OSError:
                # No new segment (a full disk): the old one stays active for the retry.
                old.close()  # reopens lazily with writable indexes
                old.active = True
                raise
        except OSError as e:
            raise storage_error_for(e, f"rolling {self.dir.name} at offset {base}") from e
        self.segments.append(seg)
        self._bases.append(base)
        return seg

    def roll_if_old(self, now_ms: int | None = None) -> bool:
        """Roll a non-empty active segment older than segment.ms (called periodically).

        A compacted log's active segment also rolls once its first batch is older
        than max.compaction.lag.ms: only rolled segments can be cleaned.
        """
        seg = self.active_segment
        if not seg.size:
            return False
        expired = self._segment_expired(seg, None, now_ms)
        lag = self.config.max_compaction_lag_ms
        if not expired and lag is not None and self.config.compact:
            first_ts = seg.first_batch_timestamp
            now = self.clock() if now_ms is None else now_ms
            expired = first_ts is not None and first_ts >= 0 and now - first_ts >= lag
        if expired:
            self.roll()
        return expired

    # -- reading --------------------------------------------------------------------------

    def read(
        self, offset: int, max_bytes: int, *, max_offset: int | None = None
    ) -> FileSlice | None:
        """Whole batches from the one holding ``offset``; the first one even if too big."""
        self._check_open()
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside [{self.log_start_offset}, {self.log_end_offset}] "
                f"of {self.topic}-{self.partition}"
            )
        if offset == self.log_end_offset or (max_offset is not None and offset >= max_offset):
            return None
        i = max(0, bisect.bisect_right(self._bases, offset) - 1)
        for seg in self.segments[i:]:
            if max_offset is not None and seg.base_offset >= max_offset:
                return None
            found = seg.read(offset, max(max_bytes, 1), max_offset)
            if found is not None:
                return found
        return None

    def offset_for_timestamp(self, ts_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first batch with max timestamp >= ``ts_ms``.

        -2 (earliest) and -1 (latest) answer the log start and end offsets.
        """
        self._check_open()
        if ts_ms == EARLIEST_TIMESTAMP:
            return self.log_start_offset, -1
        if ts_ms == LATEST_TIMESTAMP:
            return self.log_end_offset, -1
        i = max(0, bisect.bisect_right(self._bases, self.log_start_offset) - 1)
        for seg in self.segments[i:]:
            if seg.max_timestamp < ts_ms:
                continue
            found = seg.find_timestamp(ts_ms)
            if found is not None:
                return max(found[0], self.log_start_offset), found[1]
        return None

    # -- truncation (replication) ----------------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Remove every batch whose last offset is >= ``offset`` (replication truncation).

        The log end offset becomes the base of the first removed batch (<= ``offset``).
        """
        self._check_open()
        if offset >= self.log_end_offset:
            return
        self._changes += 1
        offset = max(offset, 0)
        while len(self.segments) > 1 and self.segments[-1].base_offset >= offset:
            self._retire(self.segments.pop())
            self._bases.pop()
        seg = self.segments[-1]
        if seg.base_offset >= offset:
            self._retire(seg)
            fresh = self._segment(offset, active=True, create=True)
            self.segments[-1] = fresh
            self._bases[-1] = offset
            self.log_end_offset = offset
            self.log_start_offset = offset
        else:
            if not seg.active:
                seg.close()  # reopens lazily with writable, preallocated indexes
                seg.active = True
            self.log_end_offset = seg.truncate_to(offset)
        self._truncations += 1
        self.recovery_position = None  # until a flush covers the new end
        leo = self.log_end_offset
        self.log_start_offset = min(self.log_start_offset, leo)
        self._hw = min(self._hw, leo)
        self.recovery_point = min(self.recovery_point, leo)
        self.first_dirty_offset = min(self.first_dirty_offset, leo)
        self.leader_epochs.truncate_from_end(leo)
        self.producer_state.clear()
        rebuild_producer_state(self.dir, self.segments, leo, self.producer_state)
        self.producer_state.txn.on_high_watermark(self._hw)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop everything and restart the log at ``offset`` (a follower far behind)."""
        self._check_open()
        make_log_dir(self.dir)
        self._changes += 1
        for seg in self.segments:
            self._retire(seg)
        seg = self._segment(offset, active=True, create=True)
        self.segments, self._bases = [seg], [offset]
        self.log_start_offset = self.log_end_offset = self.recovery_point = self._hw = offset
        self._truncations += 1
        self.recovery_position = (offset, 0)
        self.first_dirty_offset = offset
        self.leader_epochs.clear()
        self.producer_state.clear()
        delete_snapshots(self.dir, above=-1)

    # -- retention (retention.py) ---------------------------------------------------------

    def advance_log_start_offset(self, offset: int) -> int:
        """Make offsets below ``offset`` unreadable and delete segments wholly below it.

        Capped at the high watermark, like retention: uncommitted data stays.
        """
        self._check_open()
        return retention.advance_log_start_offset(self, offset)

    def delete_old_segments(self, now_ms: int | None = None) -> int:
        """Apply retention.ms and retention.bytes below the high watermark.

        Also runs the deletion pass for file.delete.delay.ms. Returns the number of
        segments deleted (see retention.delete_old_segments for the rules).
        """
        self._check_open()
        now = self.clock() if now_ms is None else now_ms
        self.delete_expired_files(now)
        return retention.delete_old_segments(self, now)

    def delete_expired_files(self, now_ms: int | None = None) -> int:
        """Remove ``.deleted`` files whose file.delete.delay.ms has passed; returns how many.

        The log manager should call this periodically; retention passes call it too.
        """
        return self._pending_deletes.remove_due(now_ms, self.clock)

    def _retire(self, seg: LogSegment) -> None:
        """Delete a segment: renamed to ``.deleted`` now, removed after file.delete.delay.ms."""
        self._pending_deletes.retire(seg, self.config.file_delete_delay_ms, self.clock)

    # -- compaction (compaction.py plans, log_cleaner.py runs, cleaned_install.py installs)

    @property
    def allows_offset_gaps(self) -> bool:
        """Whether recovery accepts gaps between batch offsets (cleaned_install.py)."""
        return cleaned_install.allows_offset_gaps(self.config, self.cleaned_before)

    def cleaning_plan(
        self, now_ms: int | None = None, *, force: bool = False
    ) -> CleaningPlan | None:
        """What the cleaner would clean now (compaction.plan_cleaning); event loop thread."""
        return plan_cleaning(self, now_ms, force=force)

    def install_cleaned(self, cleaned: Any) -> bool:
        """Swap a cleaned segment in for the segments it replaces (event loop thread).

        False, leaving the log untouched, if those segments are no longer all here
        (see cleaned_install.install_cleaned).
        """
        return cleaned_install.install_cleaned(self, cleaned)

    def cleaning_done(self, first_dirty: int, horizon: int) -> tuple[int, int]:
        """Note a finished cleaning; returns the (first dirty offset, delete horizon) to
        checkpoint. The log may have been truncated below where the map ended."""
        self.first_dirty_offset = min(first_dirty, self.log_end_offset)
        self.next_delete_horizon = horizon
        return self.first_dirty_offset, horizon

    def clean(
        self, now_ms: int | None = None, *, buffer_bytes: int | None = None, force: bool = True
    ) -> CleanStats | None:
        """Compact this log now, synchronously (tests, tools); None if nothing to clean.

        The LogManager's cleaner does the same with the heavy steps in worker threads.
        """
        from logmq.storage import log_cleaner

        kw = {} if buffer_bytes is None else {"buffer_bytes": buffer_bytes}
        return log_cleaner.clean_log(self, now_ms=now_ms, force=force, **kw)

    # -- durability -----------------------------------------------------------------------

    @property
    def changes(self) -> int:
        """Writes, rolls and truncations so far: equal counts mean nothing happened."""
        return self._changes

    @property
    def needs_flush(self) -> bool:
        """Written, rolled or truncated since the last flush began."""
        return self._changes != self._flushed_changes

    def flush_jobs(self, *, epochs: bool = True) -> tuple[list[Any], FlushMark]:
        """Segments needing an fsync, and what they cover (none if nothing changed).

        Call on the event loop thread; run the jobs with ``run_flush_jobs`` anywhere, then
        ``flush_done``. Holding file references keeps descriptors open meanwhile.
        ``epochs=False`` leaves the leader-epoch checkpoint to the caller.
        """
        self._check_open()
        last = self.segments[-1]
        mark = FlushMark(
            self.log_end_offset,
            self._appended_messages,
            self._changes,
            self._truncations,
            last.base_offset,
            last.size,
        )
        # Epochs kept in memory since the last flush go to disk with it (before the
        # recovery point passes their records); as a job, with no segment.
        jobs: list[Any] = (
            [(None, self.leader_epochs.flush)] if epochs and self.leader_epochs.unflushed else []
        )
        if not self.needs_flush:
            return jobs, mark
        i = max(0, bisect.bisect_right(self._bases, self.recovery_point) - 1)
        jobs += [(seg, seg.sync_job()) for seg in self.segments[i:]]
        return jobs, mark

    def flush_done(self, jobs: list[Any], mark: FlushMark) -> None:
        for seg, job in jobs:
            if seg is not None:
                seg.synced(job)
        if mark.truncations == self._truncations and mark.offset >= self.recovery_point:
            self.recovery_point = mark.offset  # not truncated since: still in the log
            self.recovery_position = (mark.base, mark.position)
        self._flushed_messages = max(self._flushed_messages, mark.messages)
        self._flushed_changes = max(self._flushed_changes, mark.changes)
        self.last_flush_ms = self.clock()

    def flush(self) -> None:
        """fsync everything appended so far, synchronously."""
        jobs, mark = self.flush_jobs()
        try:
            run_flush_jobs(jobs)
        except OSError as e:
            raise StorageError(f"fsync failed in {self.dir}: {e}") from e
        self.flush_done(jobs, mark)

    def write_producer_snapshot(self) -> None:
        atomic_write(*self.producer_snapshot_file())
        self.producer_snapshot_written()

    def producer_snapshot_file(self) -> tuple[Path, bytes]:
        """The snapshot ``write_producer_snapshot`` writes, for a caller that writes
        many together (then calls ``producer_snapshot_written``)."""
        end = self.log_end_offset
        return snapshot_path(self.dir, end), self.producer_state.to_bytes(end)

    def producer_snapshot_written(self) -> None:
        """The snapshot at the log end is on disk: keep it and the one before."""
        self._snapshot_changes = self._changes
        snaps = list_snapshots(self.dir)
        if len(snaps) > 2:
            delete_snapshots(self.dir, below=snaps[-2])

    @property
    def needs_snapshot(self) -> bool:
        """No producer snapshot on disk matches the log as it is now."""
        return self._snapshot_changes != self._changes

    def close(self) -> None:
        """Flush, snapshot producer state, trim indexes and release every handle.

        A log unchanged since it opened (or since its last flush and snapshot) is
        neither fsynced nor snapshotted again.
        """
        if self.closed:
            return
        self.flush()
        if self.needs_snapshot:
            self.write_producer_snapshot()
        for seg in self.segments:
            seg.close()
        self.delete_expired_files(1 << 62)  # nothing reads them after close
        self.closed = True

    def close_handles(self) -> None:
        """Release descriptors without flushing (simulates a crash in tests)."""
        for seg in self.segments:
            seg.close()
        self.closed = True

    def _check_open(self) -> None:
        if self.closed:
            raise StorageError(f"log {self.topic}-{self.partition} is closed")

    def __repr__(self) -> str:
        return (
            f"PartitionLog({self.topic}-{self.partition}, start={self.log_start_offset}, "
            f"end={self.log_end_offset}, segments={len(self.segments)})"
        )


class _SegmentAborts:
    """A segment as ``collect_aborted`` reads it (its txn index, opened when reached)."""

    __slots__ = ("_seg",)

    def __init__(self, seg: LogSegment) -> None:
        self._seg = seg

    def collect(self, fetch_offset: int, upper: int) -> tuple[list[Any], bool]:
        return self._seg.aborted_transactions(fetch_offset, upper)
