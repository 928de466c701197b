"""Replacing a run of segments by one cleaned segment, crash-safely.

The cleaner writes the new segment ``B`` as ``B.log.cleaned`` (+ ``.index.cleaned``,
``.timeindex.cleaned`` and, when the replaced segments indexed aborted transactions
whose markers it keeps, ``.txnindex.cleaned``), fsyncs it, and records in the
``cleaner-swap`` manifest which old segments it replaces. Then, on the event loop
thread:

1. ``commit``: rename the indexes, then the log, from ``.cleaned`` to ``.swap``; fsync
   the directory. The rename of ``B.log.swap`` is the commit point.
2. The old segments are retired (renamed to ``.deleted``, PartitionLog._retire).
3. ``finish``: rename ``B.log.swap`` to ``B.log``, then the indexes; the manifest is
   removed afterwards (``remove_manifest``).

``recover`` runs when a log opens, before its segments are listed: without a
``.log.swap`` the new files are discarded (the old segments are intact); with one, the
old segments the manifest names are removed and the renames are completed. Either way
the log holds the old segments or the new one, never a mix.

The txn index is optional at every step: a missing ``.txnindex`` means no entries, so
a swap without one is complete. That is also why an old segment's own ``.txnindex``
must go with it (it would otherwise become the new segment's when they share a base).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from logmq.errors import CorruptRecordError
from logmq.storage import checkpoint as ckpt
from logmq.storage.compaction import segment_batches
from logmq.storage.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, segment_name
from logmq.storage.txn_index import TXN_INDEX_SUFFIX

log = logging.getLogger(__name__)

CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
MANIFEST = "cleaner-swap"
# the log last: its rename commits
_SUFFIXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, LOG_SUFFIX)
_OPTIONAL = TXN_INDEX_SUFFIX  # absent when there are no entries


def segment_paths(directory: Path, base: int, state: str = "") -> list[Path]:
    """The index, time index, txn index and log paths of segment ``base`` with a
    state suffix (the log last)."""
    return [directory / (segment_name(base, s) + state) for s in _SUFFIXES]


def write_manifest(directory: Path, new_base: int, old_bases: list[int]) -> None:
    text = f"0\n{new_base}\n{' '.join(map(str, old_bases))}\n"
    ckpt.atomic_write(directory / MANIFEST, text.encode())


def read_manifest(directory: Path) -> tuple[int, list[int]] | None:
    try:
        lines = (directory / MANIFEST).read_text().splitlines()
    except FileNotFoundError:
        return None
    try:
        if lines[0] != "0":
            raise ValueError(f"unknown version {lines[0]}")
        return int(lines[1]), [int(x) for x in lines[2].split()]
    except (ValueError, IndexError) as e:
        log.error("unreadable %s in %s: %s", MANIFEST, directory, e)
        return None


def remove_manifest(directory: Path) -> None:
    (directory / MANIFEST).unlink(missing_ok=True)
    ckpt.fsync_dir(directory)


def discard(directory: Path, base: int) -> None:
    """Remove an uncommitted cleaned segment."""
    for path in segment_paths(directory, base, CLEANED_SUFFIX):
        path.unlink(missing_ok=True)


def commit(directory: Path, base: int) -> None:
    """``.cleaned`` -> ``.swap``; durable once this returns (the log rename commits)."""
    for src, dst in zip(
        segment_paths(directory, base, CLEANED_SUFFIX),
        segment_paths(directory, base, SWAP_SUFFIX),
        strict=True,
    ):
        try:
            os.replace(src, dst)
        except FileNotFoundError:
            if not src.name.endswith(_OPTIONAL + CLEANED_SUFFIX):
                raise
    ckpt.fsync_dir(directory)


def finish(directory: Path, base: int) -> None:
    """``.swap`` -> final names, the log first (then leftover index swaps are final).

    A missing index is no reason to stop: the segment rebuilds it when it opens. A
    missing txn index is normal: the cleaned segment indexes no aborted transaction.
    """
    paths = segment_paths(directory, base, SWAP_SUFFIX)
    os.replace(paths[-1], paths[-1].with_name(paths[-1].name[: -len(SWAP_SUFFIX)]))
    for src in paths[:-1]:
        try:
            os.replace(src, src.with_name(src.name[: -len(SWAP_SUFFIX)]))
        except FileNotFoundError:
            if not src.name.endswith(_OPTIONAL + SWAP_SUFFIX):
                log.warning("no %s: the index will be rebuilt", src)


def interrupted(names: Iterable[str]) -> bool:
    """Whether a directory listing shows a swap to finish or undo (``recover``)."""
    return any(n == MANIFEST or n.endswith((CLEANED_SUFFIX, SWAP_SUFFIX)) for n in names)


def recover(directory: Path) -> int:
    """Finish or undo an interrupted swap; returns how many old segments it removed."""
    names = os.listdir(directory)
    manifest = read_manifest(directory)
    removed = 0
    for name in names:
        if name.endswith(LOG_SUFFIX + CLEANED_SUFFIX):  # never committed
            base = int(name[:20])
            discard(directory, base)
            for path in segment_paths(directory, base, SWAP_SUFFIX)[:-1]:
                path.unlink(missing_ok=True)
            log.warning("discarded an uncommitted cleaned segment %d in %s", base, directory)
    for name in names:
        if not name.endswith(LOG_SUFFIX + SWAP_SUFFIX):
            continue
        base = int(name[:20])
        if manifest is not None and manifest[0] == base:
            old = manifest[1]
        else:
            old = _covered_bases(directory, base)
        for old_base in old:
            for path in segment_paths(directory, old_base):
                if path.exists():
                    path.unlink()
                    removed += path.name.endswith(LOG_SUFFIX)
        log.warning("completing the swap of cleaned segment %d in %s", base, directory)
        finish(directory, base)
    for name in os.listdir(directory):
        if name.endswith(SWAP_SUFFIX):  # an index whose log was already renamed
            os.replace(directory / name, directory / name[: -len(SWAP_SUFFIX)])
        elif name.endswith(CLEANED_SUFFIX):
            (directory / name).unlink()
    if manifest is not None or removed:
        (directory / MANIFEST).unlink(missing_ok=True)
        ckpt.fsync_dir(directory)
    return removed


def _covered_bases(directory: Path, base: int) -> list[int]:
    """Without a manifest (never written that way; a damaged disk): Kafka's rule,
    the old segments whose base lies in [base, end of the swap segment)."""
    path = directory / (segment_name(base, LOG_SUFFIX) + SWAP_SUFFIX)
    end = base + 1
    fd = os.open(path, os.O_RDONLY)
    try:
        for _, _, h in segment_batches(fd, os.fstat(fd).st_size, path):
            end = h.next_offset
    except (CorruptRecordError, OSError):
        pass
    finally:
        os.close(fd)
    log.error("swap of %d in %s has no manifest: replacing [%d, %d)", base, directory, base, end)
    out = []
    for name in os.listdir(directory):
        if name.endswith(LOG_SUFFIX) and name[:20].isdigit() and base <= int(name[:20]) < end:
            out.append(int(name[:20]))
    return out
