"""The partition log: an ordered list of segments with offsets, retention and recovery.

All work is per batch: a produce request's slice is validated header-and-checksum,
stamped with offsets without copying (stamping.py) and written with one ``pwritev``;
reads hand out a FileSlice for sendfile. Durability timing (fsync) is the
LogManager's business; this class offers a synchronous ``flush`` and a split
``flush_jobs``/``flush_done`` so the manager can run fsyncs in a worker thread.
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from logmq.errors import (
    CorruptRecordError,
    OffsetOutOfRangeError,
    StorageError,
    storage_error_for,
)
from logmq.storage import batch as b
from logmq.storage import segment_swap
from logmq.storage.compaction import (
    NO_HORIZON,
    CleanerCheckpoint,
    CleaningPlan,
    CleanStats,
    plan_cleaning,
)
from logmq.storage.config import LogConfig
from logmq.storage.leader_epoch import FILE_NAME as EPOCH_FILE
from logmq.storage.leader_epoch import LeaderEpochCache
from logmq.storage.open_files import OpenFileCache
from logmq.storage.producer_state import (
    ProducerEntry,
    ProducerStateManager,
    delete_snapshots,
    list_snapshots,
    load_latest_snapshot,
    write_snapshot,
)
from logmq.storage.segment import (
    DELETED_SUFFIX,
    LOG_SUFFIX,
    BatchInfo,
    FileSlice,
    LogSegment,
    run_sync,
)
from logmq.storage.stamping import (
    F_LAST_OFFSET_DELTA,
    F_LENGTH,
    F_MAX_TIMESTAMP,
    F_PRODUCER_ID,
    F_RECORD_COUNT,
    STAMP,
    AppendInfo,
    RawHeader,
    check_batch,
    count_offsets,
    stamp_batches,
    to_headers,
    validate_batches,
)

__all__ = ["AppendInfo", "FileSlice", "PartitionLog", "parse_dir_name"]

log = logging.getLogger(__name__)

_MAX_REL_OFFSET = (1 << 32) - 1
_LOG_OVERHEAD = b.LOG_OVERHEAD
_STAMP_SIZE = STAMP.size
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1


def parse_dir_name(name: str) -> tuple[str, int]:
    """``<topic>-<partition>`` -> (topic, partition); topics may contain dashes."""
    topic, _, part = name.rpartition("-")
    if not topic or not part.isdigit():
        raise ValueError(f"not a partition directory name: {name!r}")
    return topic, int(part)


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
        auto_high_watermark: bool = True,
    ) -> None:
        # auto_high_watermark: a single replica's HW is its log end offset, so appends
        # move it; the replication layer turns this off and sets the HW itself.
        self.auto_high_watermark = auto_high_watermark
        self.dir = Path(directory)
        self.topic, self.partition = parse_dir_name(self.dir.name)
        self.config = config or LogConfig()
        self.cache = cache if cache is not None else OpenFileCache()
        self.clock = clock
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segments: list[LogSegment] = []
        self._bases: list[int] = []
        self.producer_state = ProducerStateManager()
        self.leader_epochs = LeaderEpochCache(self.dir / EPOCH_FILE)
        self._appended_messages = 0
        self._flushed_messages = 0
        self.last_flush_ms = clock()
        self.cut_bytes = 0  # bytes recovery removed at open
        self._pending_deletes: list[tuple[int, list[Path]]] = []  # (due ms, files)
        self.closed = False
        # Compaction state (log_cleaner.py): where the dirty section starts, the earliest
        # delete horizon of a kept tombstone, and whether the cleaner ever rewrote this log.
        self.first_dirty_offset = 0
        self.next_delete_horizon = NO_HORIZON
        self._cleaned_before = False
        self._load(clean_shutdown, recovery_point, log_start_offset)
        self._hw = min(max(high_watermark, 0), self.log_end_offset)

    # -- opening --------------------------------------------------------------------------

    def _segment(self, base: int, *, active: bool = False, create: bool = False) -> LogSegment:
        seg = LogSegment(
            self.dir,
            base,
            index_interval=self.config.index_interval_bytes,
            index_bytes=self.config.segment_index_bytes,
            cache=self.cache,
            active=active,
            create=create,
        )
        seg.created_ms = self.clock()
        return seg

    def _load(self, clean: bool, recovery_point: int | None, start: int) -> None:
        segment_swap.recover(self.dir)  # a crash in the middle of a cleaner swap
        self._load_cleaner_checkpoint()
        bases = []
        for name in os.listdir(self.dir):
            path = self.dir / name
            if name.endswith((DELETED_SUFFIX, ".tmp")):
                path.unlink(missing_ok=True)  # finish an interrupted delete / write
            elif name.endswith(LOG_SUFFIX) and name[:20].isdigit():
                bases.append(int(name[:20]))
        bases.sort()
        if not bases:
            self.segments = [self._segment(max(start, 0), active=True, create=True)]
        else:
            self.segments = [self._segment(x, active=(x == bases[-1])) for x in bases]
        self._bases = [s.base_offset for s in self.segments]
        if not clean:
            self._recover(recovery_point)
        try:
            self.log_end_offset = self.segments[-1].next_offset
        except CorruptRecordError as e:
            # "Clean" but the tail is damaged (edited or disk fault): recover that segment.
            log.error("damaged tail in %s despite a clean shutdown: %s", self.dir, e)
            self._recover(self.segments[-1].base_offset)
            self.log_end_offset = self.segments[-1].next_offset
        self.log_start_offset = min(max(start, self.segments[0].base_offset), self.log_end_offset)
        self.recovery_point = self.log_end_offset
        self.first_dirty_offset = min(
            max(self.first_dirty_offset, self.log_start_offset), self.log_end_offset
        )
        self.leader_epochs.truncate_from_end(self.log_end_offset)
        self.leader_epochs.truncate_from_start(self.log_start_offset)
        self._rebuild_producer_state()

    def _recover(self, recovery_point: int | None) -> None:
        """Re-validate segments from the one holding the recovery point; cut at damage."""
        first = 0
        if recovery_point is not None:
            first = max(0, bisect.bisect_right(self._bases, recovery_point) - 1)
        gaps = self.allows_offset_gaps
        for i in range(first, len(self.segments)):
            seg = self.segments[i]
            cut = seg.recover(allow_gaps=gaps)
            self.cut_bytes += cut
            gap = i + 1 < len(self.segments) and (
                seg.next_offset > self._bases[i + 1]
                if gaps
                else seg.next_offset != self._bases[i + 1]
            )
            if (cut or gap) and i + 1 < len(self.segments):
                dropped = self.segments[i + 1 :]
                log.warning(
                    "recovery of %s dropped %d later segments after damage in %s",
                    self.dir,
                    len(dropped),
                    seg.log_path.name,
                )
                for later in dropped:
                    self.cut_bytes += later.size
                    later.delete()
                del self.segments[i + 1 :]
                break
        self._bases = [s.base_offset for s in self.segments]
        last = self.segments[-1]
        if not last.active:
            last.close()  # reopens lazily with writable, preallocated indexes
            last.active = True

    def _rebuild_producer_state(self) -> None:
        leo = self.log_end_offset
        delete_snapshots(self.dir, above=leo)
        start = load_latest_snapshot(self.dir, self.producer_state, leo)
        if start < 0:
            start = self.segments[0].base_offset
        for seg in self.segments[max(0, bisect.bisect_right(self._bases, start) - 1) :]:
            if seg.next_offset <= start:
                continue
            found = seg.locate(start)
            if found is None:
                continue
            for _, h in seg.iter_headers(found[0]):
                self.producer_state.replay(h)

    # -- properties -----------------------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        return self._hw

    @high_watermark.setter
    def high_watermark(self, value: int) -> None:
        self._hw = min(max(value, self.log_start_offset), self.log_end_offset)

    @property
    def active_segment(self) -> LogSegment:
        return self.segments[-1]

    @property
    def unflushed_messages(self) -> int:
        return self._appended_messages - self._flushed_messages

    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    # -- appending ------------------------------------------------------------------------

    def append(self, data: Any, *, leader_epoch: int = 0) -> AppendInfo:
        """Validate, assign offsets to and write one or more batches; all or nothing.

        One batch without a producer id, in CreateTime, is the produce hot path and is
        handled inline here (every statement runs per produced batch); anything else
        goes through ``_append_many``.
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
        if size != limit or f[F_PRODUCER_ID] >= 0 or cfg.message_timestamp_type == "LogAppendTime":
            return self._append_many(mv, f, size, leader_epoch)
        first = self.log_end_offset
        nxt = first + f[F_LAST_OFFSET_DELTA] + 1
        max_ts = f[F_MAX_TIMESTAMP]
        seg = self.segments[-1]
        used = seg.size
        if used and (
            used + size > cfg.segment_bytes
            or nxt - seg.base_offset > _MAX_REL_OFFSET
            or seg.index_full
            or self._segment_expired(seg, max_ts)
        ):
            seg = self.roll(first)
        seg.append_batch(
            STAMP.pack(first, f[F_LENGTH], leader_epoch),
            mv[_STAMP_SIZE:size],
            size,
            first,
            max_ts,
            nxt,
        )
        self.log_end_offset = nxt
        if self.auto_high_watermark:
            self._hw = nxt
        if leader_epoch > self.leader_epochs.latest_epoch:
            self.leader_epochs.assign(leader_epoch, first)
        count = f[F_RECORD_COUNT]
        self._appended_messages += count
        return AppendInfo(first, nxt - 1, max_ts, count, False)

    def _append_many(
        self, mv: memoryview, f: RawHeader, size: int, leader_epoch: int
    ) -> AppendInfo:
        """``append`` for several batches, idempotent producers or LogAppendTime.

        ``f`` and ``size`` describe the first batch, already validated.
        """
        cfg = self.config
        limit = len(mv)
        raw = [(0, f)]
        while size < limit:
            f = check_batch(mv, size, limit, cfg.max_message_bytes, True)
            raw.append((size, f))
            size += f[F_LENGTH] + _LOG_OVERHEAD
        headers = to_headers(raw)
        pending: dict[int, ProducerEntry] = {}
        keep = headers
        if any(h.producer_id >= 0 for _, h in headers):
            keep, dups = self._check_producers(headers, pending)
            if not keep:
                max_ts = max(h.max_timestamp for _, h in headers)
                count = sum(h.record_count for _, h in headers)
                return AppendInfo(dups[0].first_offset, dups[-1].last_offset, max_ts, count, True)
        now = self.clock()
        first = self.log_end_offset
        append_time = now if cfg.message_timestamp_type == "LogAppendTime" else None
        w = stamp_batches(mv, keep, first, leader_epoch, log_append_time=append_time)
        self._write(w.parts, w.size, w.infos, first, w.next_offset, w.max_timestamp)
        if pending:
            self.producer_state.commit(pending)
        if leader_epoch > self.leader_epochs.latest_epoch:
            self.leader_epochs.assign(leader_epoch, first)
        self._appended_messages += w.record_count
        if self.auto_high_watermark:
            self._hw = w.next_offset
        return AppendInfo(first, w.next_offset - 1, w.max_timestamp, w.record_count, False)

    def _check_producers(
        self, headers: list[tuple[int, b.BatchHeader]], pending: dict[int, ProducerEntry]
    ) -> tuple[list[tuple[int, b.BatchHeader]], list[Any]]:
        """Split idempotent retries from new batches; stage the new ones in ``pending``."""
        keep: list[tuple[int, b.BatchHeader]] = []
        dups = []
        for pos, h in headers:
            dup = self.producer_state.check(h, pending)
            if dup is not None:
                dups.append(dup)
                continue
            self.producer_state.stage(h, self.log_end_offset + count_offsets(keep), pending)
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
        for _, h in headers:
            self.producer_state.replay(h)
            if h.leader_epoch > self.leader_epochs.latest_epoch:
                self.leader_epochs.assign(h.leader_epoch, h.base_offset)
        count = sum(h.record_count for _, h in headers)
        self._appended_messages += count
        return AppendInfo(first, expect - 1, max_ts, count, False)

    def _write(
        self,
        parts: list[Any],
        size: int,
        infos: list[BatchInfo],
        first: int,
        next_offset: int,
        max_timestamp: int,
    ) -> None:
        seg = self.active_segment
        if seg.size and self._should_roll(seg, size, next_offset, max_timestamp):
            seg = self.roll(first)
        seg.append(parts, size, infos, next_offset)
        self.log_end_offset = next_offset

    def _should_roll(self, seg: LogSegment, size: int, next_offset: int, max_ts: int) -> bool:
        cfg = self.config
        return (
            seg.size + size > cfg.segment_bytes
            or seg.index_full
            or next_offset - seg.base_offset > _MAX_REL_OFFSET
            or self._segment_expired(seg, max_ts)
        )

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

    # -- truncation and retention ---------------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Remove every batch whose last offset is >= ``offset`` (replication truncation).

        The log end offset becomes the base of the first removed batch (<= ``offset``).
        """
        self._check_open()
        if offset >= self.log_end_offset:
            return
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
        leo = self.log_end_offset
        self.log_start_offset = min(self.log_start_offset, leo)
        self._hw = min(self._hw, leo)
        self.recovery_point = min(self.recovery_point, leo)
        self.first_dirty_offset = min(self.first_dirty_offset, leo)
        self.leader_epochs.truncate_from_end(leo)
        self.producer_state.clear()
        self._rebuild_producer_state()

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop everything and restart the log at ``offset`` (a follower far behind)."""
        self._check_open()
        for seg in self.segments:
            self._retire(seg)
        seg = self._segment(offset, active=True, create=True)
        self.segments, self._bases = [seg], [offset]
        self.log_start_offset = self.log_end_offset = self.recovery_point = self._hw = offset
        self.first_dirty_offset = offset
        self.leader_epochs.clear()
        self.producer_state.clear()
        delete_snapshots(self.dir, above=-1)

    def advance_log_start_offset(self, offset: int) -> int:
        """Make offsets below ``offset`` unreadable and delete segments wholly below it.

        Capped at the high watermark, like retention: uncommitted data stays.
        """
        self._check_open()
        offset = min(offset, self._hw)
        if offset > self.log_start_offset:
            self.log_start_offset = offset
            self.leader_epochs.truncate_from_start(offset)
        deleted = 0
        while len(self.segments) > 1 and self.segments[1].base_offset <= self.log_start_offset:
            self._delete_oldest()
            deleted += 1
        return deleted

    def _delete_oldest(self) -> None:
        seg = self.segments.pop(0)
        self._bases.pop(0)
        log.info("deleting segment %s", seg.log_path)
        self._retire(seg)
        self.log_start_offset = max(self.log_start_offset, self.segments[0].base_offset)
        self.leader_epochs.truncate_from_start(self.log_start_offset)
        delete_snapshots(self.dir, below=min(self.log_start_offset, self._latest_snapshot()))

    def _latest_snapshot(self) -> int:
        snaps = list_snapshots(self.dir)
        return snaps[-1] if snaps else 0

    def delete_old_segments(self, now_ms: int | None = None) -> int:
        """Apply retention.ms and retention.bytes below the high watermark.

        Only when cleanup.policy includes delete (Kafka: a compact-only topic keeps
        every key's newest record however old).

        Never deletes the active segment, nor a segment holding data at or above the
        HW (a replicated log's tail is not yet committed). Also runs the deletion pass
        for file.delete.delay.ms. Returns the number of segments deleted.
        """
        self._check_open()
        now = self.clock() if now_ms is None else now_ms
        self.delete_expired_files(now)
        cfg = self.config
        if not cfg.delete:
            return 0  # cleanup.policy=compact: the cleaner, not retention, bounds the log
        segs = self.segments
        deleted = 0
        if cfg.retention_ms >= 0:
            while (
                len(segs) > 1
                and segs[1].base_offset <= self._hw
                and now - segs[0].max_timestamp > cfg.retention_ms
            ):
                self._delete_oldest()
                deleted += 1
        if cfg.retention_bytes >= 0:
            total = self.size_bytes()
            while (
                len(segs) > 1
                and segs[1].base_offset <= self._hw
                and total - segs[0].size >= cfg.retention_bytes
            ):
                total -= segs[0].size
                self._delete_oldest()
                deleted += 1
        return deleted

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

    def delete_expired_files(self, now_ms: int | None = None) -> int:
        """Remove ``.deleted`` files whose file.delete.delay.ms has passed; returns how many.

        The log manager should call this periodically; retention passes call it too.
        """
        if not self._pending_deletes:
            return 0
        now = self.clock() if now_ms is None else now_ms
        removed = 0
        keep = []
        for due, paths in self._pending_deletes:
            if due > now:
                keep.append((due, paths))
                continue
            for path in paths:
                try:
                    path.unlink()
                    removed += 1
                except FileNotFoundError:
                    pass
                except OSError as e:
                    log.error("could not remove %s: %s", path, e)
        self._pending_deletes = keep
        return removed

    def _retire(self, seg: LogSegment) -> None:
        """Delete a segment: renamed to ``.deleted`` now, removed after file.delete.delay.ms.

        The delay gives anything still reading the old files by name time to finish;
        a restart removes leftovers, so the rename alone is the point of no return.
        """
        paths = seg.rename_for_delete()
        delay = self.config.file_delete_delay_ms
        if delay > 0:
            self._pending_deletes.append((self.clock() + delay, paths))
        else:
            for path in paths:
                path.unlink(missing_ok=True)

    # -- compaction -----------------------------------------------------------------------

    @property
    def allows_offset_gaps(self) -> bool:
        """Whether recovery accepts gaps between batch offsets.

        The cleaner drops whole batches, and followers copy compacted batches as they
        are, so a compacted log (or one the cleaner ever rewrote) is checked for
        increasing offsets only; other logs for an exact chain.
        """
        return self.config.compact or self._cleaned_before

    def _load_cleaner_checkpoint(self) -> None:
        try:
            cp = CleanerCheckpoint.read(self.dir)
        except StorageError as e:
            log.error("%s; the whole log counts as dirty", e)
            cp = CleanerCheckpoint()
        if cp is not None:
            self._cleaned_before = True
            self.first_dirty_offset = cp.first_dirty_offset
            self.next_delete_horizon = cp.next_delete_horizon

    def cleaning_plan(
        self, now_ms: int | None = None, *, force: bool = False
    ) -> CleaningPlan | None:
        """What the cleaner would clean now (compaction.plan_cleaning); event loop thread."""
        return plan_cleaning(self, now_ms, force=force)

    def install_cleaned(self, cleaned: Any) -> bool:
        """Swap a cleaned segment in for the segments it replaces (event loop thread).

        False, leaving the log untouched, if those segments are no longer all here
        (retention, truncation or deletion got there first). Readers holding slices of
        the old files keep them: old segments are retired like deleted ones.
        """
        old = cleaned.replaced
        if self.closed or not old:
            return False
        i = next((k for k, seg in enumerate(self.segments) if seg is old[0]), -1)
        n = len(old)
        if i < 0 or i + n >= len(self.segments):
            return False
        if any(x is not y for x, y in zip(self.segments[i : i + n], old, strict=True)):
            return False
        base = cleaned.base_offset
        segment_swap.commit(self.dir, base)  # from here on a crash completes the swap
        self._cleaned_before = True
        for seg in old:
            self._retire(seg)
        segment_swap.finish(self.dir, base)
        fresh = self._segment(base)
        fresh.verified.add(0, fresh.size)  # the cleaner checksummed what it wrote
        self.segments[i : i + n] = [fresh]
        self._bases[i : i + n] = [base]
        return True

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

    def flush_jobs(self) -> tuple[list[Any], int, int]:
        """Segments needing an fsync, the offset they cover and the message count.

        Call on the event loop thread; run the jobs with ``run_sync`` anywhere, then
        ``flush_done``. Holding file references keeps descriptors open meanwhile.
        """
        self._check_open()
        i = max(0, bisect.bisect_right(self._bases, self.recovery_point) - 1)
        jobs = [(seg, seg.sync_job()) for seg in self.segments[i:]]
        return jobs, self.log_end_offset, self._appended_messages

    def flush_done(self, jobs: list[Any], offset: int, messages: int) -> None:
        for seg, job in jobs:
            seg.flushed_size = max(seg.flushed_size, job[1])
        self.recovery_point = max(self.recovery_point, min(offset, self.log_end_offset))
        self._flushed_messages = max(self._flushed_messages, messages)
        self.last_flush_ms = self.clock()

    def flush(self) -> None:
        """fsync everything appended so far, synchronously."""
        jobs, offset, messages = self.flush_jobs()
        try:
            for _, job in jobs:
                run_sync(job)
        except OSError as e:
            raise StorageError(f"fsync failed in {self.dir}: {e}") from e
        self.flush_done(jobs, offset, messages)

    def write_producer_snapshot(self) -> None:
        write_snapshot(self.dir, self.producer_state, self.log_end_offset)
        snaps = list_snapshots(self.dir)
        if len(snaps) > 2:
            delete_snapshots(self.dir, below=snaps[-2])

    def close(self) -> None:
        """Flush, snapshot producer state, trim indexes and release every handle."""
        if self.closed:
            return
        self.flush()
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
