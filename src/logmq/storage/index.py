"""Sparse offset and time indexes of one segment.

Both are arrays of fixed-width big-endian entries. A rolled segment's index is a file
of exactly its entries, memory-mapped read-only. The active segment's index lives in a
growing ``bytearray`` and reaches its file when the segment rolls, closes or is
evicted (``trim``) or on ``flush``: storing into a fresh shared mapping of a sparse
file made the first append of every segment wait milliseconds on ext4 (the first
write fault allocating the file's blocks), and the active segment's indexes are
rebuilt by recovery after a crash anyway. Lowering the entry count cuts the file at
once, so it never lists entries for batches that are gone.

Files preallocated by earlier versions end in zeros; valid entries never hold
position 0 (the first batch of a segment is never indexed), so their count is found
by a binary search for the first zero entry.

- offset index entry: relative offset u32, file position u32 (8 bytes)
- time index entry: timestamp i64, relative offset u32 (12 bytes): every batch before
  that offset in the segment has a max timestamp <= the entry's timestamp.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
from pathlib import Path
from typing import Any

from logmq.errors import StorageError

log = logging.getLogger(__name__)

_BEFORE_ANY = -(1 << 64)  # below every key and value: what an empty index compares with


class IndexCorruptError(StorageError):
    """An index file fails its sanity check; the caller rebuilds it from the log."""


class _Index:
    ENTRY: struct.Struct
    _pos_field = 1

    def __init__(
        self,
        path: str | Path,
        base_offset: int,
        max_bytes: int,
        *,
        writable: bool,
        fresh: bool = False,
    ) -> None:
        """``fresh``: the segment is new, so no file is read (one is written on flush)."""
        self.path = path
        self.base_offset = base_offset
        self.width = self.ENTRY.size
        self.max_entries = max(1, max_bytes // self.width)
        # bytearray while writable, a read-only mmap (None when empty) afterwards
        self._buf: Any = None
        self.entries = 0
        self._written = 0  # entries known to be in the file as they are in _buf
        self.writable = False
        # The last entry's fields, kept in Python so appends never read the buffer back.
        self.last_key = self.last_value = _BEFORE_ANY
        # Known to have no entries on disk (no file, or an empty one): closing an index
        # that is still empty then has nothing to write (recovery of idle partitions).
        self.disk_empty = False
        if fresh:
            self.writable = writable
            self._buf = bytearray() if writable else None
        else:
            self._open(writable)

    # -- file lifecycle -------------------------------------------------------------

    def _open(self, writable: bool) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size % self.width:
                raise IndexCorruptError(f"{self.path}: size {size} is not a multiple of entries")
            self.entries = size // self.width
            self.writable = writable
            if writable:
                self._buf = bytearray(_read_all(fd, size))
            else:
                self._buf = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else None
        finally:
            os.close(fd)
        if self.entries and self._is_free(self.entries - 1):
            self.entries = self._count_used()
        if writable:
            del self._buf[self.entries * self.width :]
        self._written = self.entries
        self._load_last()

    def _load_last(self) -> None:
        if self.entries:
            self.last_key, self.last_value = self.entry(self.entries - 1)
        else:
            self.last_key = self.last_value = _BEFORE_ANY

    def _is_free(self, i: int) -> bool:
        return self.ENTRY.unpack_from(self._buf, i * self.width)[self._pos_field] == 0

    def _count_used(self) -> int:
        lo, hi = 0, self.entries  # entries [0, lo) used, [hi, entries) free
        while lo < hi:
            mid = (lo + hi) // 2
            if self._is_free(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def flush(self) -> None:
        """Write entries not yet in the file, and cut the file to the entry count."""
        if not self.writable:
            return
        w, done, n = self.width, self._written, self.entries
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if done < n:
                _write_all(fd, self._buf[done * w : n * w], done * w)
            if os.fstat(fd).st_size != n * w:
                os.ftruncate(fd, n * w)
        except OSError as e:
            # A full disk must not fail a roll, close or delete: a sparse index is only a
            # shortcut, so keep the entries already in the file and drop the rest.
            log.warning("index %s keeps %d of %d entries: %s", self.path, done, n, e)
            os.ftruncate(fd, done * w)  # shrinking needs no space; cuts a torn entry
            self.entries = n = done
            del self._buf[done * w :]
            self._load_last()
        finally:
            os.close(fd)
        self._written = n

    def trim(self) -> None:
        """Put the file at exactly its entries (on roll and close); it becomes read-only."""
        if self.writable:
            self.flush()
            self.writable = False
        else:
            if self._buf is not None:
                self._buf.close()
            os.truncate(self.path, self.entries * self.width)
        self._buf = None
        size = self.entries * self.width
        if size:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                self._buf = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)

    def close(self) -> None:
        if self.writable and not self.entries and self.disk_empty:
            self._buf = None  # nothing to write, and no file worth making
            self.writable = False
            return
        if self.writable:
            self.trim()
        if self._buf is not None:
            self._buf.close()
            self._buf = None

    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    def entry(self, i: int) -> tuple[int, int]:
        return self.ENTRY.unpack_from(self._buf, i * self.width)

    def truncate_entries(self, n: int) -> None:
        """Keep the first ``n`` entries; the file loses the others at once."""
        if n >= self.entries:
            return
        self.entries = n
        if self.writable:
            del self._buf[n * self.width :]
            if self._written > n:
                os.truncate(self.path, n * self.width)
                self._written = n
        else:
            self.trim()
        self._load_last()

    def reset(self) -> None:
        self.truncate_entries(0)

    def _bsearch(self, field: int, key: int) -> int:
        """Index of the last entry whose ``field`` <= key, or -1."""
        lo, hi = 0, self.entries
        unpack, buf, w = self.ENTRY.unpack_from, self._buf, self.width
        while lo < hi:
            mid = (lo + hi) // 2
            if unpack(buf, mid * w)[field] <= key:
                lo = mid + 1
            else:
                hi = mid
        return lo - 1


def _read_all(fd: int, size: int) -> bytes:
    parts, pos = [], 0
    while pos < size:
        chunk = os.pread(fd, size - pos, pos)
        if not chunk:
            break
        parts.append(chunk)
        pos += len(chunk)
    return b"".join(parts)


def _write_all(fd: int, data: bytes | bytearray, pos: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, pos)
        view, pos = view[n:], pos + n


class OffsetIndex(_Index):
    ENTRY = struct.Struct(">II")
    _pos_field = 1

    def append(self, offset: int, position: int) -> None:
        rel = offset - self.base_offset
        n = self.entries
        if rel <= self.last_key or position <= self.last_value or n >= self.max_entries:
            return  # out of order, or full: the log rolls; until then lookups scan more
        self._buf += self.ENTRY.pack(rel, position)
        self.entries = n + 1
        self.last_key = rel
        self.last_value = position

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the last indexed batch starting at or before ``offset``."""
        i = self._bsearch(0, offset - self.base_offset)
        if i < 0:
            return self.base_offset, 0
        rel, pos = self.entry(i)
        return self.base_offset + rel, pos

    def lookup_position(self, position: int) -> tuple[int, int]:
        """(offset, position) of the last indexed batch starting at or before ``position``."""
        i = self._bsearch(1, position)
        if i < 0:
            return self.base_offset, 0
        rel, pos = self.entry(i)
        return self.base_offset + rel, pos

    def truncate_to_offset(self, offset: int) -> None:
        """Drop entries for batches at or after ``offset``."""
        self.truncate_entries(self._bsearch(0, offset - self.base_offset - 1) + 1)

    def last(self) -> tuple[int, int]:
        if not self.entries:
            return self.base_offset, 0
        rel, pos = self.entry(self.entries - 1)
        return self.base_offset + rel, pos

    def sanity_check(self, log_size: int) -> None:
        """Cheap check at open: the last entry must point inside the log."""
        if self.entries:
            _, pos = self.last()
            if pos >= log_size:
                raise IndexCorruptError(f"{self.path}: last entry points past the log end")


class TimeIndex(_Index):
    ENTRY = struct.Struct(">qI")
    _pos_field = 1

    def append(self, timestamp: int, offset: int) -> None:
        rel = offset - self.base_offset
        n = self.entries
        if timestamp <= self.last_key or rel <= self.last_value or n >= self.max_entries:
            return  # not newer, or full: the log rolls; until then lookups scan more
        self._buf += self.ENTRY.pack(timestamp, rel)
        self.entries = n + 1
        self.last_key = timestamp
        self.last_value = rel

    def lookup(self, timestamp: int) -> int:
        """An offset such that every earlier batch of the segment has max timestamp < ts."""
        i = self._bsearch(0, timestamp - 1)
        if i < 0:
            return self.base_offset
        return self.base_offset + self.entry(i)[1]

    def truncate_to_offset(self, offset: int) -> None:
        n = self.entries
        while n and self.base_offset + self.entry(n - 1)[1] > offset:
            n -= 1
        self.truncate_entries(n)

    def last(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry, or (-1, base_offset)."""
        if not self.entries:
            return -1, self.base_offset
        ts, rel = self.entry(self.entries - 1)
        return ts, self.base_offset + rel

    def sanity_check(self, next_offset: int) -> None:
        if self.entries and self.last()[1] > next_offset:
            raise IndexCorruptError(f"{self.path}: last entry is past the log end")
