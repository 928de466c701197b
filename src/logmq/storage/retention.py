"""Retention: which of a log's oldest segments go, and how a segment is deleted.

Owns retention.ms and retention.bytes (``delete_old_segments``, run periodically by
the LogManager), explicit moves of the log start offset (``advance_log_start_offset``:
DeleteRecords, followers), and file.delete.delay.ms (``PendingDeletes``: a retired
segment is renamed to ``.deleted`` at once and its files removed after the delay).
Retention never touches data at or above the high watermark, nor the active
segment. Rolling, which decides where segments begin, is the PartitionLog's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from logmq.storage.producer_state import delete_snapshots, list_snapshots
from logmq.storage.segment import LogSegment

if TYPE_CHECKING:
    from logmq.storage.partition_log import PartitionLog

__all__ = [
    "PendingDeletes",
    "advance_log_start_offset",
    "delete_local_below",
    "delete_old_segments",
]

log = logging.getLogger(__name__)


def delete_old_segments(plog: PartitionLog, now: int) -> int:
    """Apply retention.ms and retention.bytes below the high watermark.

    Only when cleanup.policy includes delete (Kafka: a compact-only topic keeps
    every key's newest record however old). Never deletes the active segment, nor a
    segment holding data at or above the HW (a replicated log's tail is not yet
    committed). Returns the number of segments deleted.
    """
    cfg = plog.config
    if not cfg.delete:
        return 0  # cleanup.policy=compact: the cleaner, not retention, bounds the log
    segs = plog.segments
    hw = plog.high_watermark
    deleted = 0
    if cfg.retention_ms >= 0:
        while (
            len(segs) > 1
            and segs[1].base_offset <= hw
            and now - segs[0].max_timestamp > cfg.retention_ms
        ):
            delete_oldest(plog)
            deleted += 1
    if cfg.retention_bytes >= 0:
        total = plog.size_bytes()
        while (
            len(segs) > 1
            and segs[1].base_offset <= hw
            and total - segs[0].size >= cfg.retention_bytes
        ):
            total -= segs[0].size
            delete_oldest(plog)
            deleted += 1
    return deleted


def advance_log_start_offset(plog: PartitionLog, offset: int) -> int:
    """Make offsets below ``offset`` unreadable and delete segments wholly below it.

    Capped at the high watermark, like retention: uncommitted data stays. Returns
    the number of segments deleted.
    """
    offset = min(offset, plog.high_watermark)
    if offset > plog.log_start_offset:
        plog.log_start_offset = offset
        plog.leader_epochs.truncate_from_start(offset)
    segs = plog.segments
    deleted = 0
    while len(segs) > 1 and segs[1].base_offset <= plog.log_start_offset:
        delete_oldest(plog)
        deleted += 1
    return deleted


def delete_local_below(plog: PartitionLog, offset: int) -> int:
    """Delete local segments wholly below ``offset`` (a tiered log's local retention:
    the remote tier holds them). The log start offset over both tiers is the remote
    tier's; ``plog.log_start_offset`` is then the local log start. Returns how many."""
    offset = min(offset, plog.high_watermark)
    segs = plog.segments
    deleted = 0
    while len(segs) > 1 and segs[1].base_offset <= offset:
        delete_oldest(plog)
        deleted += 1
    return deleted


def delete_oldest(plog: PartitionLog) -> None:
    """Retire the oldest segment; the log then starts at the next one at the earliest.

    Producer snapshots below both the new start and the latest snapshot go too.
    """
    seg = plog.segments[0]
    plog._replace_segments(0, 1, [])
    log.info("deleting segment %s", seg.log_path)
    plog._retire(seg)
    plog.log_start_offset = max(plog.log_start_offset, plog.segments[0].base_offset)
    plog.leader_epochs.truncate_from_start(plog.log_start_offset)
    snaps = list_snapshots(plog.dir)
    latest = snaps[-1] if snaps else 0
    delete_snapshots(plog.dir, below=min(plog.log_start_offset, latest))


class PendingDeletes:
    """Retired segment files (renamed ``.deleted``) waiting out file.delete.delay.ms.

    The delay gives anything still reading the old files by name time to finish; a
    restart removes leftovers (log_loader), so the rename alone is the point of no
    return.
    """

    __slots__ = ("_due",)

    def __init__(self) -> None:
        self._due: list[tuple[int, list[Path]]] = []  # (due ms, files)

    def retire(self, seg: LogSegment, delay_ms: int, clock: Callable[[], int]) -> None:
        """Rename ``seg``'s files to ``.deleted``; remove them now or after ``delay_ms``."""
        paths = seg.rename_for_delete()
        if delay_ms > 0:
            self._due.append((clock() + delay_ms, paths))
        else:
            for path in paths:
                path.unlink(missing_ok=True)

    def remove_due(self, now_ms: int | None, clock: Callable[[], int]) -> int:
        """Remove the files whose delay has passed by ``now_ms`` (default: the clock)."""
        if not self._due:
            return 0
        now = clock() if now_ms is None else now_ms
        removed = 0
        keep = []
        for due, paths in self._due:
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
        self._due = keep
        return removed

    def __len__(self) -> int:
        return len(self._due)
