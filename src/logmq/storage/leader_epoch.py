"""Leader epoch -> start offset history of one partition (KIP-101/279 truncation).

A follower that becomes follower asks the leader "where does my last epoch end?" and
truncates there, instead of trusting its high watermark (which loses acknowledged data
in double failovers). The history is tiny and kept in ``leader-epoch-checkpoint``.
"""

from __future__ import annotations

import bisect
import os
import threading
from pathlib import Path

from logmq.errors import StorageError
from logmq.storage.checkpoint import atomic_write, fsync_dir, read_small

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1
FILE_NAME = "leader-epoch-checkpoint"


class LeaderEpochCache:
    """Sorted (epoch, start_offset) pairs; both columns strictly increase."""

    def __init__(self, path: str | Path | None = None, *, exists: bool | None = None) -> None:
        """``exists``: whether the file is there, when the caller already knows."""
        self.path = path
        self._epochs: list[int] = []
        self._starts: list[int] = []
        # assign(flush=False) leaves the file behind until flush(), which the log's
        # flush runs in a worker thread while the loop may change the history: changes
        # and the flush's snapshot take ``_lock`` (briefly, never across I/O), and
        # ``_write_lock`` keeps writes in snapshot order.
        self.unflushed = False
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._on_disk: list[tuple[int, int]] = []  # as last read or written
        if path is not None and (os.path.exists(path) if exists is None else exists):
            self._load()

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._starts, strict=True))

    @property
    def latest_epoch(self) -> int:
        return self._epochs[-1] if self._epochs else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int, *, flush: bool = True) -> None:
        """Record that ``epoch`` starts at ``start_offset`` (called on the first append).

        ``flush=False`` defers the write (``unflushed`` until ``flush()``): the log's
        next flush writes it before its recovery point passes the epoch's records, and
        crash recovery takes the epochs of the batches past it from the batches.
        """
        if epoch < 0 or (self._epochs and epoch <= self._epochs[-1]):
            return
        with self._lock:
            # A newer epoch starting at or before older entries supersedes them.
            while self._starts and self._starts[-1] >= start_offset:
                self._epochs.pop()
                self._starts.pop()
            self._epochs.append(epoch)
            self._starts.append(start_offset)
        self._changed(flush)

    def end_offset_for_epoch(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest epoch <= ``epoch``, the offset where it ends) as KIP-279 defines it."""
        i = bisect.bisect_right(self._epochs, epoch) - 1
        if i < 0:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if i == len(self._epochs) - 1:
            return self._epochs[i], log_end_offset
        return self._epochs[i], self._starts[i + 1]

    def truncate_from_end(self, end_offset: int, *, flush: bool = True) -> None:
        """Forget epochs that start at or after ``end_offset`` (log truncated there).

        ``flush=False``: written by the log's next flush (``unflushed``), as on load.
        """
        n = bisect.bisect_left(self._starts, end_offset)
        if n != len(self._starts):
            with self._lock:
                del self._epochs[n:], self._starts[n:]
            self._changed(flush)

    def truncate_from_start(self, start_offset: int, *, flush: bool = True) -> None:
        """Drop epochs wholly before ``start_offset``; the one spanning it now starts there."""
        i = bisect.bisect_right(self._starts, start_offset) - 1
        if i < 0:
            return
        if i > 0 or self._starts[0] != start_offset:
            with self._lock:
                del self._epochs[:i], self._starts[:i]
                self._starts[0] = start_offset
            self._changed(flush)

    def _changed(self, flush: bool) -> None:
        if flush:
            self.flush()
        else:
            self.unflushed = True

    def clear(self) -> None:
        with self._lock:
            self._epochs.clear()
            self._starts.clear()
        self.flush()

    def flush(self) -> None:
        with self._write_lock:
            with self._lock:
                self.unflushed = False
                pairs = list(zip(self._epochs, self._starts, strict=True))
            self._write(pairs)

    def take_checkpoint(self, end_offset: int) -> bytes | None:
        """The file's content as the cache is now, which the caller writes (a clean
        stop writes thousands together: checkpoint.atomic_write_many); the cache counts
        as flushed. If the write fails, call ``flush``.

        None when the file already says the same below ``end_offset`` (the log end): a
        start drops the epochs starting at or after it (``truncate_from_end``), so an
        epoch a new leadership began, with no record yet, need not be written. Every
        partition gets one on each restart of its leader.
        """
        with self._lock:
            self.unflushed = False
            pairs = list(zip(self._epochs, self._starts, strict=True))
        kept = [p for p in pairs if p[1] < end_offset]
        if kept == [p for p in self._on_disk if p[1] < end_offset]:
            return None
        self._on_disk = pairs
        return _encode(pairs)

    def _write(self, pairs: list[tuple[int, int]]) -> None:
        if self.path is None:
            return
        data = _encode(pairs)
        try:
            atomic_write(self.path, data)
        except FileNotFoundError:
            # A new log has no directory before its first write (partition_log.py); an
            # epoch can start before any record. Make it, durably (the data directory
            # holds its entry), then write.
            directory = os.path.dirname(self.path)
            os.makedirs(directory, exist_ok=True)
            fsync_dir(os.path.dirname(directory) or ".")
            atomic_write(self.path, data)
        self._on_disk = pairs

    def _load(self) -> None:
        assert self.path is not None
        try:
            lines = read_small(self.path).decode().splitlines()
            count = int(lines[1])
            for line in lines[2 : 2 + count]:
                e, s = line.split()
                self._epochs.append(int(e))
                self._starts.append(int(s))
        except (ValueError, IndexError) as err:
            raise StorageError(f"malformed leader epoch checkpoint {self.path}: {err}") from None
        self._on_disk = list(zip(self._epochs, self._starts, strict=True))


def _encode(pairs: list[tuple[int, int]]) -> bytes:
    lines = ["0", str(len(pairs)), *(f"{e} {s}" for e, s in pairs)]
    return ("\n".join(lines) + "\n").encode()
