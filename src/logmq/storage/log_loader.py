"""Opening a partition directory: segment discovery, crash recovery, producer state.

Owns everything between "here is a directory" and "here is a consistent log", so that
PartitionLog only ever sees a loaded one: finishing an interrupted cleaner swap or
delete, reading the cleaner checkpoint, re-validating the segments after an unclean
shutdown (from the one holding the recovery point, cutting at the first damage),
trimming the leader-epoch cache to the offsets that survived and replaying batch
headers into producer state from the latest snapshot. ``load_log`` runs once, at
open; ``rebuild_producer_state`` runs again after a truncation.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from logmq.errors import CorruptRecordError
from logmq.storage import batch as b
from logmq.storage import segment_swap
from logmq.storage.batch_scan import (
    R_ATTRIBUTES,
    R_BASE_OFFSET,
    R_LAST_OFFSET_DELTA,
    R_LENGTH,
    R_POS,
    R_PRODUCER_ID,
    HeaderRow,
    row_of,
)
from logmq.storage.cleaned_install import allows_offset_gaps, read_cleaner_checkpoint
from logmq.storage.compaction import CLEANER_CHECKPOINT, NO_HORIZON
from logmq.storage.config import LogConfig
from logmq.storage.leader_epoch import FILE_NAME as EPOCH_FILE
from logmq.storage.leader_epoch import LeaderEpochCache
from logmq.storage.producer_state import (
    ProducerStateManager,
    delete_snapshots,
    load_latest_snapshot,
)
from logmq.storage.segment import DELETED_SUFFIX, LOG_SUFFIX, LogSegment

__all__ = [
    "LoadedLog",
    "find_segment_bases",
    "load_log",
    "rebuild_producer_state",
    "recover_segments",
]

log = logging.getLogger(__name__)

_TXN_ATTRS = b.ATTR_TRANSACTIONAL | b.ATTR_CONTROL

# new_segment(base_offset, active=..., create=...): PartitionLog._segment
SegmentFactory = Callable[..., LogSegment]


@dataclass(slots=True)
class LoadedLog:
    """What a partition directory holds, made consistent."""

    segments: list[LogSegment]  # never empty; the last one is active
    log_start_offset: int
    log_end_offset: int
    cut_bytes: int  # bytes recovery removed (0 after a clean shutdown)
    first_dirty_offset: int  # from the cleaner checkpoint, clamped to the log
    next_delete_horizon: int
    cleaned_before: bool  # a cleaner checkpoint exists: offsets may have gaps
    producer_state: ProducerStateManager
    leader_epochs: LeaderEpochCache
    snapshot_current: bool  # a producer snapshot at the log end is on disk (or none needed)


def load_log(
    directory: Path,
    config: LogConfig,
    new_segment: SegmentFactory,
    *,
    clean_shutdown: bool,
    recovery_point: int | None,
    log_start_offset: int,
    names: list[str] | None = None,
    recovery_position: tuple[int, int] | None = None,
) -> LoadedLog:
    """Open the log in ``directory``; recover it unless it was shut down cleanly.

    ``recovery_point``: the offset up to which everything was flushed (recovery
    starts at its segment; None re-validates all). ``recovery_position``: the
    (base offset, size) the active segment had at that offset, if known: when the
    last segment is still exactly that, the recovery point covers the whole log,
    which is then neither scanned nor even opened. An empty directory gets one
    active segment at ``log_start_offset``, whose file is made on first use.
    ``names``: the directory's listing if the caller has it ([] for a directory it
    has just made). The directory is listed once and only files it holds are opened:
    with thousands of partitions, every system call per log counts.
    """
    if names is None:
        names = os.listdir(directory)
    if segment_swap.interrupted(names):
        segment_swap.recover(directory)  # a crash in the middle of a cleaner swap
        names = os.listdir(directory)
    epochs_path = os.path.join(directory, EPOCH_FILE)
    leader_epochs = LeaderEpochCache(epochs_path, exists=EPOCH_FILE in names)
    checkpoint = read_cleaner_checkpoint(directory) if CLEANER_CHECKPOINT in names else None
    cleaned_before = checkpoint is not None
    first_dirty = checkpoint.first_dirty_offset if checkpoint else 0
    horizon = checkpoint.next_delete_horizon if checkpoint else NO_HORIZON
    bases = find_segment_bases(directory, names)
    if not bases:
        start = max(log_start_offset, 0)
        segments = [new_segment(start, active=True, create=True, defer_create=True)]
    else:
        segments = [new_segment(x, active=(x == bases[-1])) for x in bases]
    gaps = allows_offset_gaps(config, cleaned_before)
    cut = 0
    last = segments[-1]
    if (
        bases
        and recovery_point is not None
        and recovery_position == (last.base_offset, last.size)
        and recovery_point >= last.base_offset
    ):
        last.known_end(recovery_point)  # the checkpoint covers it all: nothing to scan
    elif bases and not clean_shutdown:
        cut += recover_segments(
            directory, segments, recovery_point, allow_gaps=gaps, names=set(names)
        )
    try:
        end = segments[-1].next_offset
    except CorruptRecordError as e:
        # "Clean" but the tail is damaged (edited or disk fault): recover that segment.
        log.error("damaged tail in %s despite a clean shutdown: %s", directory, e)
        cut += recover_segments(directory, segments, segments[-1].base_offset, allow_gaps=gaps)
        end = segments[-1].next_offset
    start = min(max(log_start_offset, segments[0].base_offset), end)
    first_dirty = min(max(first_dirty, start), end)
    # Appends keep new epochs in memory until the log is flushed (partition_log.py), so
    # the epochs of the batches recovery just scanned are taken from the batches. The
    # corrections are written with the log's next flush, not one fsync per log here.
    for seg in segments:
        if seg.recovered is not None:
            for epoch, first in seg.recovered.epoch_starts:
                leader_epochs.assign(epoch, first, flush=False)
    leader_epochs.truncate_from_end(end, flush=False)
    leader_epochs.truncate_from_start(start, flush=False)
    producers = ProducerStateManager()
    snap = rebuild_producer_state(directory, segments, end, producers, names)
    for seg in segments:
        seg.recovered = None  # its rows were only needed here
    current = snap == end or (len(segments) == 1 and not segments[0].size)
    return LoadedLog(
        segments,
        start,
        end,
        cut,
        first_dirty,
        horizon,
        cleaned_before,
        producers,
        leader_epochs,
        current,
    )


def find_segment_bases(directory: Path, names: list[str] | None = None) -> list[int]:
    """Base offsets of the segments in ``directory`` (listed as ``names``), ascending.

    Removes what an interrupted delete (``.deleted``) or write (``.tmp``) left.
    """
    bases = []
    for name in os.listdir(directory) if names is None else names:
        if name.endswith((DELETED_SUFFIX, ".tmp")):
            (directory / name).unlink(missing_ok=True)
        elif name.endswith(LOG_SUFFIX) and name[:20].isdigit():
            bases.append(int(name[:20]))
    bases.sort()
    return bases


def recover_segments(
    directory: Path,
    segments: list[LogSegment],
    recovery_point: int | None,
    *,
    allow_gaps: bool,
    names: Collection[str] | None = None,
) -> int:
    """Re-validate segments from the one holding the recovery point; cut at damage.

    Segments after a damaged one (or after a break in the offset chain) are deleted
    and dropped from ``segments``, whose last one ends up active. Returns the number
    of bytes removed.
    """
    bases = [s.base_offset for s in segments]
    first = 0
    if recovery_point is not None:
        first = max(0, bisect.bisect_right(bases, recovery_point) - 1)
    cut_bytes = 0
    for i in range(first, len(segments)):
        seg = segments[i]
        cut = seg.recover(allow_gaps=allow_gaps, names=names)
        cut_bytes += cut
        gap = i + 1 < len(segments) and (
            seg.next_offset > bases[i + 1] if allow_gaps else seg.next_offset != bases[i + 1]
        )
        if (cut or gap) and i + 1 < len(segments):
            dropped = segments[i + 1 :]
            log.warning(
                "recovery of %s dropped %d later segments after damage in %s",
                directory,
                len(dropped),
                seg.log_path.name,
            )
            for later in dropped:
                cut_bytes += later.size
                later.delete()
            del segments[i + 1 :]
            break
    last = segments[-1]
    if not last.active:
        last.close()  # reopens lazily with writable, preallocated indexes
        last.active = True
    return cut_bytes


def rebuild_producer_state(
    directory: Path,
    segments: list[LogSegment],
    log_end_offset: int,
    producer_state: ProducerStateManager,
    names: list[str] | None = None,
) -> int:
    """Load the latest producer snapshot at or below the log end, replay the rest.

    Snapshots above the log end (left by a truncation or a cut tail) are deleted.
    ``names``: the directory's listing, if the caller has it. Returns the offset of
    the snapshot loaded, -1 if none.
    """
    if names is None:
        names = os.listdir(directory)
    delete_snapshots(directory, above=log_end_offset, names=names)
    snapshot = start = load_latest_snapshot(directory, producer_state, log_end_offset, names)
    if start < 0:
        start = segments[0].base_offset
    bases = [s.base_offset for s in segments]
    for seg in segments[max(0, bisect.bisect_right(bases, start) - 1) :]:
        if seg.no_producers or seg.next_offset <= start:
            continue  # nothing to replay: no second read of what recovery just scanned
        if seg.recovered is not None:  # recovery just read it: its idempotent batches
            rows = [
                r
                for r in seg.recovered.producer_rows
                if r[R_BASE_OFFSET] + r[R_LAST_OFFSET_DELTA] >= start
            ]
        else:
            found = seg.locate(start)
            if found is None:
                continue
            rows = [row_of(p, h) for p, h in seg.iter_headers(found[0])]
        producer_state.replay_rows(rows)
        _replay_transactions(seg, rows, start, producer_state)
    return snapshot


def _replay_transactions(
    seg: LogSegment, rows: list[HeaderRow], start: int, producer_state: ProducerStateManager
) -> None:
    """Replay ``seg``'s batches from ``start`` into the open transactions, and rebuild
    its txn index from there: entries before ``start`` stand (the snapshot's state
    follows them); those after are exactly the aborts the replay meets."""
    txn = producer_state.txn
    if not any(r[R_ATTRIBUTES] & _TXN_ATTRS and r[R_PRODUCER_ID] >= 0 for r in rows):
        seg.txn_index.truncate_to(start)  # entries of markers a crash cut off
        return

    def control_type(r: HeaderRow) -> int:
        rec = seg.control_record(r[R_POS], r[R_LENGTH] + b.LOG_OVERHEAD)
        producer_state.note_marker(r[R_PRODUCER_ID], rec.coordinator_epoch, None)
        return rec.type

    aborted = txn.replay_rows(rows, control_type)
    index = seg.txn_index
    index.truncate_to(start)
    for entry in aborted:
        if entry.last_offset >= start:
            index.append(entry)
