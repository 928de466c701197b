"""The log cleaner: compacts logs whose cleanup.policy includes compact.

One cleaning of one log runs in steps, each where it belongs:

1. plan (event loop): ``PartitionLog.cleaning_plan`` picks the cleanable segments
   (below the active segment, the high watermark and min.compaction.lag.ms) and says
   whether the log needs cleaning (dirty ratio, max.compaction.lag.ms, tombstones due);
2. map (worker thread): the offset map over the dirty segments, one segment at a
   time until the cleaner buffer is full, so the map ends at a segment boundary;
3. per group of segments below that boundary: write (worker) the kept batches to a
   ``.cleaned`` segment with fresh indexes (its txn index: the replaced segments'
   entries whose markers stay), fsynced, and the swap manifest; install
   (event loop) it with ``PartitionLog.install_cleaned``, which gives up if retention
   or truncation changed those segments meanwhile; tidy (worker) the manifest;
4. checkpoint (worker): the next dirty section starts where the map ended.

Only immutable segments are read, through their own descriptors, so appends and reads
go on meanwhile. ``clean_log`` runs the steps inline (tests, tools); ``LogCleaner`` is
the background task the LogManager owns and the ``await``-able ``clean``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from operator import add, itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from logmq.errors import CorruptRecordError, StorageError
from logmq.storage import batch as b
from logmq.storage import checkpoint as ckpt
from logmq.storage import segment_swap as swap
from logmq.storage.compaction import (
    AbortedRanges,
    CleanerCheckpoint,
    CleaningPlan,
    CleanStats,
    RecordFilter,
    SegmentRef,
    group_segments,
    is_aborted_data,
    segment_batches,
)
from logmq.storage.compression import InflateLimitError
from logmq.storage.index import OffsetIndex, TimeIndex
from logmq.storage.offset_map import OffsetMap, key_hashes
from logmq.storage.txn_index import AbortedTxn, encode_entries

if TYPE_CHECKING:
    from logmq.storage.partition_log import PartitionLog

log = logging.getLogger(__name__)

DEFAULT_BUFFER_BYTES = 64 << 20
DEFAULT_INTERVAL_MS = 15_000  # Kafka's log.cleaner.backoff.ms
YIELD_EVERY_S = 0.002
_WRITE_BYTES = 1 << 20
_WRITE_PARTS = 512
_DELTA = itemgetter(0)
_KEY = itemgetter(2)


class CleaningAborted(Exception):
    """The cleaner is stopping; the cleaning in progress leaves the log as it was.

    Control flow between the cleaner's thread and its loop, caught by the cleaner: no
    client or operator hears of it, so it is outside the LogMQError tree."""


@dataclass(slots=True)
class CleanedGroup:
    """A written, not yet installed, cleaned segment and the segments it replaces."""

    base_offset: int
    replaced: list[Any]  # LogSegment objects, by identity
    size: int
    stats: CleanStats
    txn_entries: int = 0  # aborted transactions its txn index holds


class LogCleaning:
    """One cleaning of one log; the thread steps never touch the PartitionLog."""

    def __init__(
        self, plan: CleaningPlan, buffer_bytes: int, abort: threading.Event | None = None
    ) -> None:
        self.plan = plan
        self.dir = plan.directory
        self.offsets = OffsetMap(buffer_bytes)
        self.abort = abort or threading.Event()
        self.map_end = plan.segments[-1].end_offset
        self.groups: list[list[SegmentRef]] = []
        self.aborted = AbortedRanges(plan.aborted)
        self.filter = RecordFilter(
            self.offsets,
            plan.now_ms,
            plan.delete_retention_ms,
            plan.producer_last_offsets,
            max_message_bytes=plan.max_message_bytes,
            aborted=self.aborted,
            tracked_producers=plan.tracked_producers,
        )
        self.stats = self.filter.stats
        self._writing: int | None = None  # base of the group being written
        self._yielded = 0.0

    def _next_batch(self) -> None:
        """Called per batch in the worker thread: stop if asked, and every couple of
        milliseconds let the event loop thread have the GIL. A CPU-bound thread
        otherwise keeps it for whole switch intervals (5 ms, often several in a row)
        while the loop waits; ``sleep(0)`` releases it long enough (about 60 us of
        timer slack, so not on every batch) for a waiting thread to take it."""
        if self.abort.is_set():
            raise CleaningAborted()
        now = time.perf_counter()
        if now - self._yielded >= YIELD_EVERY_S:
            time.sleep(0)
            self._yielded = time.perf_counter()

    # -- worker thread steps ----------------------------------------------------------

    def build_map(self) -> None:
        """Map the dirty segments until the buffer is full; decide the groups."""
        started = time.perf_counter()
        try:
            marked = CleanerCheckpoint.read(self.dir) is not None
        except StorageError:
            marked = True  # malformed, but there: rewritten at the end of this cleaning
        if not marked:
            # Marks the log as rewritten before anything is: recovery accepts gaps.
            first = self.plan.dirty_segments[0] if self.plan.dirty_segments else None
            start = first.base_offset if first else self.map_end
            CleanerCheckpoint(start).write(self.dir)
        for ref in self.plan.dirty_segments:
            staged: dict[Any, int] = {}
            fd = os.open(ref.path, os.O_RDONLY)
            try:
                for buf, pos, h in segment_batches(fd, ref.size, ref.path):
                    self._next_batch()
                    # markers hold no keyed data; an aborted value must not hide the
                    # committed one before it
                    if h.attributes & b.ATTR_CONTROL or is_aborted_data(h, self.aborted):
                        continue
                    budget = b.inflate_budget(h.size, self.plan.max_message_bytes)
                    try:
                        rows = b.decode_rows(buf, pos, h, budget)
                    except InflateLimitError:
                        continue  # a bomb: its keys stay unmapped, the filter keeps it whole
                    offsets = map(add, repeat(h.base_offset), map(_DELTA, rows))
                    staged.update(zip(key_hashes(list(map(_KEY, rows))), offsets, strict=True))
            finally:
                os.close(fd)
            staged.pop(None, None)
            if len(self.offsets) and not self.offsets.room_for(len(staged)):
                self.map_end = ref.base_offset
                break
            if not self.offsets.room_for(len(staged)):
                log.warning(
                    "cleaner buffer too small for segment %s (%d keys): using more memory",
                    ref.path,
                    len(staged),
                )
            self.offsets.update(staged)
        below = [s for s in self.plan.segments if s.end_offset <= self.map_end]
        self.groups = group_segments(below, self.plan.segment_bytes)
        self.stats.seconds += time.perf_counter() - started

    def write_group(self, group: list[SegmentRef]) -> CleanedGroup:
        """Write the kept batches of ``group`` as one ``.cleaned`` segment, durably."""
        started = time.perf_counter()
        st = self.stats
        base = group[0].base_offset
        self._writing = base
        try:
            size, entries = self._write_segment(group, base)
            swap.write_manifest(self.dir, base, [r.base_offset for r in group])
        except BaseException:
            swap.discard(self.dir, base)  # also when cancelled: nobody else will
            self._writing = None
            raise
        st.segments_out += 1
        st.bytes_out += size
        st.seconds += time.perf_counter() - started
        return CleanedGroup(base, [r.segment for r in group], size, st, entries)

    def _write_segment(self, group: list[SegmentRef], base: int) -> tuple[int, int]:
        """Write the cleaned segment's files; returns its size and txn index entries."""
        plan, st = self.plan, self.stats
        paths = swap.segment_paths(self.dir, base, swap.CLEANED_SUFFIX)
        idx_path, tidx_path, txn_path, log_path = paths
        swap.discard(self.dir, base)
        out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        index = OffsetIndex(idx_path, base, plan.index_bytes, writable=True)
        tindex = TimeIndex(tidx_path, base, plan.index_bytes, writable=True)
        size = since = 0
        max_ts = -1
        parts: list[Any] = []
        pending = 0
        try:
            for ref in group:
                st.segments_in += 1
                st.bytes_in += ref.size
                fd = os.open(ref.path, os.O_RDONLY)
                try:
                    for buf, pos, h in segment_batches(fd, ref.size, ref.path):
                        self._next_batch()
                        data = self.filter.clean_batch(buf, pos, h)
                        if data is None:
                            continue
                        if since >= plan.index_interval and size:
                            index.append(h.base_offset, size)
                            tindex.append(max_ts, h.base_offset)
                            since = 0
                        n = len(data)
                        since += n
                        size += n
                        max_ts = max(max_ts, h.max_timestamp)
                        parts.append(data)
                        pending += n
                        if pending >= _WRITE_BYTES or len(parts) >= _WRITE_PARTS:
                            _write_all(out, parts)
                            parts, pending = [], 0
                finally:
                    os.close(fd)
            _write_all(out, parts)
            ckpt.fdatasync(out)
        finally:
            os.close(out)
            index.close()  # trims to its entries
            tindex.close()
        synced = [idx_path, tidx_path]
        entries = self._kept_entries(group)
        if entries:  # no entries, no file (as for any segment)
            fd = os.open(txn_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _write_all(fd, [encode_entries(entries)])
            finally:
                os.close(fd)
            synced.append(txn_path)
        for path in synced:
            fd = os.open(path, os.O_RDONLY)
            try:
                ckpt.fsync(fd)
            finally:
                os.close(fd)
        return size, len(entries)

    def _kept_entries(self, group: list[SegmentRef]) -> list[AbortedTxn]:
        """The txn index of the cleaned segment: the replaced segments' entries (markers
        in [group start, group end)) whose markers this pass kept; call after writing."""
        start, end = group[0].base_offset, group[-1].end_offset
        removed = self.filter.removed_markers
        return [
            e
            for e in self.plan.aborted
            if start <= e.last_offset < end and e.last_offset not in removed
        ]

    def tidy(self) -> None:
        """After an install: the manifest has done its job."""
        self._writing = None
        swap.remove_manifest(self.dir)

    def abandon(self) -> None:
        """After a failure or a refused install: remove what was written, if uncommitted."""
        if self._writing is not None:
            swap.discard(self.dir, self._writing)
            self._writing = None
        with contextlib.suppress(OSError):
            swap.remove_manifest(self.dir)

    def write_checkpoint(self, first_dirty: int, horizon: int) -> None:
        CleanerCheckpoint(first_dirty, horizon).write(self.dir)


def _write_all(fd: int, parts: list[Any]) -> None:
    if not parts:
        return
    total = sum(map(len, parts))
    done = os.writev(fd, parts)
    if done < total:  # short write: finish the slow way
        rest = memoryview(b"".join(parts))[done:]
        while rest:
            rest = rest[os.write(fd, rest) :]


# -- drivers --------------------------------------------------------------------------------


def clean_log(
    plog: PartitionLog,
    *,
    buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    now_ms: int | None = None,
    force: bool = True,
) -> CleanStats | None:
    """Clean ``plog`` now, every step inline; None if there is nothing to clean."""
    plan = plog.cleaning_plan(now_ms, force=force)
    if plan is None:
        return None
    job = LogCleaning(plan, buffer_bytes)
    try:
        job.build_map()
        for group in job.groups:
            result = job.write_group(group)
            if not plog.install_cleaned(result):
                job.abandon()
                return None
            job.tidy()
    except BaseException:
        job.abandon()
        raise
    first_dirty, horizon = plog.cleaning_done(job.map_end, job.stats.next_delete_horizon)
    job.write_checkpoint(first_dirty, horizon)
    job.stats.first_dirty_offset = first_dirty
    return job.stats


class LogCleaner:
    """The LogManager's cleaner: a periodic pass over compacted logs, dirtiest first.

    Heavy steps run in worker threads; installs happen on the event loop thread. One
    cleaning at a time per log; ``stop`` makes a running cleaning give up promptly
    (what it wrote is discarded) and waits for it.
    """

    def __init__(
        self,
        logs: Callable[[], list[PartitionLog]],
        *,
        interval_ms: int = DEFAULT_INTERVAL_MS,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    ) -> None:
        self._logs = logs
        self.interval_ms = interval_ms
        self.buffer_bytes = buffer_bytes
        self._stopping = False
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._locks: weakref.WeakKeyDictionary[PartitionLog, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._running: set[LogCleaning] = set()
        # Logs the cleaner skips until restart (a damaged batch), and why.
        self.uncleanable: weakref.WeakKeyDictionary[PartitionLog, str] = weakref.WeakKeyDictionary()
        self.total = CleanStats()
        self._warned_oversized: set[Path] = set()  # logs whose bombs were reported

    def start(self) -> asyncio.Task[None]:
        """Start the periodic task (returned, so its owner can cancel it in a crash)."""
        self._stopping = False
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self._task

    async def stop(self) -> None:
        self._stopping = True
        for job in self._running:
            job.abort.set()
        if self._wake is not None:
            self._wake.set()
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_ms / 1000)
            if self._stopping:
                return
            try:
                await self.run_pass()
            except Exception:
                log.exception("log cleaner pass failed")

    async def run_pass(self, now_ms: int | None = None) -> int:
        """Clean every compacted log that needs it, dirtiest first; returns how many."""
        due = []
        for plog in self._logs():
            if plog.closed or not plog.config.compact or plog in self.uncleanable:
                continue
            try:
                plog.roll_if_old(now_ms)  # max.compaction.lag.ms applies to the active segment
                plan = plog.cleaning_plan(now_ms)
            except (CorruptRecordError, StorageError, OSError) as e:
                log.error("cannot plan the cleaning of %s: %s", plog, e)
                continue
            if plan is not None:
                due.append((plan.dirty_ratio, plog))
        cleaned = 0
        for _, plog in sorted(due, key=lambda x: -x[0]):
            if self._stopping:
                break
            try:
                stats = await self.clean(plog, force=False, now_ms=now_ms)
            except (CorruptRecordError, StorageError, OSError) as e:
                log.error("cleaning %s failed, skipping it until restart: %s", plog.dir, e)
                self.uncleanable[plog] = str(e)
                continue
            cleaned += stats is not None
        return cleaned

    async def clean(
        self, plog: PartitionLog, *, force: bool = True, now_ms: int | None = None
    ) -> CleanStats | None:
        """Clean one log now (``force``: whatever its dirty ratio); None if nothing to do."""
        lock = self._locks.get(plog)
        if lock is None:
            lock = self._locks[plog] = asyncio.Lock()
        async with lock:
            if self._stopping:
                return None
            plan = plog.cleaning_plan(now_ms, force=force)
            if plan is None:
                return None
            job = LogCleaning(plan, self.buffer_bytes)
            self._running.add(job)
            try:
                return await self._run_job(plog, job)
            finally:
                self._running.discard(job)

    async def _run_job(self, plog: PartitionLog, job: LogCleaning) -> CleanStats | None:
        plan = job.plan
        try:
            await asyncio.to_thread(job.build_map)
            for group in job.groups:
                result = await asyncio.to_thread(job.write_group, group)
                if not plog.install_cleaned(result):
                    log.info("%s changed while being cleaned: trying again later", plog)
                    await asyncio.to_thread(job.abandon)
                    return None
                await asyncio.to_thread(job.tidy)
        except CleaningAborted:
            await asyncio.to_thread(job.abandon)
            return None
        except FileNotFoundError as e:  # retention or a deletion removed a segment
            log.info("%s changed while being cleaned (%s): trying again later", plog, e)
            with contextlib.suppress(OSError):
                await asyncio.to_thread(job.abandon)
            return None
        except asyncio.CancelledError:
            job.abort.set()  # the thread step in flight cleans up after itself
            raise
        except BaseException:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(job.abandon)
            raise
        first_dirty, horizon = plog.cleaning_done(job.map_end, job.stats.next_delete_horizon)
        await asyncio.to_thread(job.write_checkpoint, first_dirty, horizon)
        job.stats.first_dirty_offset = first_dirty
        self.total.add(job.stats)
        if job.stats.oversized_kept and plog.dir not in self._warned_oversized:
            self._warned_oversized.add(plog.dir)  # once per log: it stays until retention
            log.warning(
                "cleaning %s kept %d batch(es) whole: their records inflate past the budget",
                plog,
                job.stats.oversized_kept,
            )
        log.info(
            "cleaned %s (%s): %d -> %d bytes, %d -> %d records in %.3f s",
            plog,
            plan.reason,
            job.stats.bytes_in,
            job.stats.bytes_out,
            job.stats.records_in,
            job.stats.records_out,
            job.stats.seconds,
        )
        return job.stats
