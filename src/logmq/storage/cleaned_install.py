"""Where compaction meets the live log: installing cleaned segments, cleaner state.

compaction.py decides what to keep (sans-IO) and log_cleaner.py runs a cleaning in
steps; this module owns the one step that changes a live PartitionLog, on the event
loop thread: swapping a cleaned segment in for the run of segments it replaces
(crash-safe through segment_swap's commit and finish), its txn index included. It
also owns what a cleaning leaves behind for the next open: the cleaner checkpoint,
and the rule that a log the cleaner ever rewrote may have gaps between batch offsets.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from logmq.errors import StorageError
from logmq.storage import segment_swap
from logmq.storage.compaction import CleanerCheckpoint
from logmq.storage.config import LogConfig

if TYPE_CHECKING:
    from logmq.storage.partition_log import PartitionLog

__all__ = ["allows_offset_gaps", "install_cleaned", "read_cleaner_checkpoint"]

log = logging.getLogger(__name__)


def allows_offset_gaps(config: LogConfig, cleaned_before: bool) -> bool:
    """Whether recovery accepts gaps between batch offsets.

    The cleaner drops whole batches, and followers copy compacted batches as they
    are, so a compacted log (or one the cleaner ever rewrote) is checked for
    increasing offsets only; other logs for an exact chain.
    """
    return config.compact or cleaned_before


def read_cleaner_checkpoint(directory: Path) -> CleanerCheckpoint | None:
    """The log's cleaner checkpoint; None if the cleaner never rewrote it.

    A malformed checkpoint still marks the log as cleaned (offsets may have gaps) but
    counts the whole log as dirty.
    """
    try:
        return CleanerCheckpoint.read(directory)
    except StorageError as e:
        log.error("%s; the whole log counts as dirty", e)
        return CleanerCheckpoint()


def install_cleaned(plog: PartitionLog, cleaned: Any) -> bool:
    """Swap a cleaned segment in for the segments it replaces (event loop thread).

    False, leaving the log untouched, if those segments are no longer all there
    (retention, truncation or deletion got there first). Readers holding slices of
    the old files keep them: old segments are retired like deleted ones.
    """
    old = cleaned.replaced
    if plog.closed or not old:
        return False
    segments = plog.segments
    i = next((k for k, seg in enumerate(segments) if seg is old[0]), -1)
    n = len(old)
    if i < 0 or i + n >= len(segments):
        return False
    if any(x is not y for x, y in zip(segments[i : i + n], old, strict=True)):
        return False
    base = cleaned.base_offset
    segment_swap.commit(plog.dir, base)  # from here on a crash completes the swap
    plog.cleaned_before = True
    for seg in old:
        plog._retire(seg)
    segment_swap.finish(plog.dir, base)
    fresh = plog._segment(base)  # reads the swapped-in .txnindex, if any, when used
    fresh.verified.add(0, fresh.size)  # the cleaner checksummed what it wrote
    if getattr(cleaned, "txn_entries", 0):
        plog.aborts_indexed = True  # normally set already: the old segments had them
    plog._replace_segments(i, i + n, [fresh])
    return True
