"""Sparse, memory-mapped offset and time indexes of one segment.

Both are arrays of fixed-width big-endian entries in a file preallocated to
``segment.index.bytes`` while the segment is active and trimmed to its entries when
the segment rolls or closes. A preallocated file's unused tail is zeros; valid
entries never hold position 0 (the first batch of a segment is never indexed), so
the count of an untrimmed file is found by a binary search for the first zero entry.

- offset index entry: relative offset u32, file position u32 (8 bytes)
- time index entry: timestamp i64, relative offset u32 (12 bytes): every batch before
  that offset in the segment has a max timestamp <= the entry's timestamp.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

from logmq.errors import StorageError


class IndexCorruptError(StorageError):
    """An index file fails its sanity check; the caller rebuilds it from the log."""


class _Index:
    ENTRY: struct.Struct

    def __init__(self, path: Path, base_offset: int, max_bytes: int, *, writable: bool) -> None:
        self.path = path
        self.base_offset = base_offset
        self.width = self.ENTRY.size
        self.max_entries = max(1, max_bytes // self.width)
        self._mm: mmap.mmap | None = None
        self.entries = 0
        self.writable = False
        self._open(writable)

    # -- file lifecycle -------------------------------------------------------------

    def _open(self, writable: bool) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size % self.width:
                raise IndexCorruptError(f"{self.path}: size {size} is not a multiple of entries")
            self.entries = size // self.width
            if writable:
                alloc = max(self.max_entries, self.entries) * self.width
                if alloc != size:
                    os.ftruncate(fd, alloc)
                size = alloc
            self.writable = writable
            self._mm = mmap.mmap(fd, size) if size else None
        finally:
            os.close(fd)
        if self.entries and self._is_free(self.entries - 1):
            self.entries = self._count_used()

    def _is_free(self, i: int) -> bool:
        return self.ENTRY.unpack_from(self._mm, i * self.width)[self._pos_field] == 0

    def _count_used(self) -> int:
        lo, hi = 0, self.entries  # entries [0, lo) used, [hi, entries) free
        while lo < hi:
            mid = (lo + hi) // 2
            if self._is_free(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def trim(self) -> None:
        """Shrink the file to its entries (on roll and close); the index becomes read-only."""
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        with open(self.path, "r+b") as f:
            f.truncate(self.entries * self.width)
        self.writable = False
        size = self.entries * self.width
        if size:
            fd = os.open(self.path, os.O_RDWR)
            try:
                self._mm = mmap.mmap(fd, size)
            finally:
                os.close(fd)

    def close(self) -> None:
        if self.writable:
            self.trim()
        if self._mm is not None:
            self._mm.close()
            self._mm = None

    def flush(self) -> None:
        if self._mm is not None:
            self._mm.flush()

    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    def entry(self, i: int) -> tuple[int, int]:
        return self.ENTRY.unpack_from(self._mm, i * self.width)

    def truncate_entries(self, n: int) -> None:
        """Keep the first ``n`` entries (zeroing the rest keeps the free-tail invariant)."""
        if n >= self.entries:
            return
        if self.writable:
            self._mm[n * self.width : self.entries * self.width] = bytes(
                (self.entries - n) * self.width
            )
            self.entries = n
        else:
            self.entries = n
            self.trim()

    def reset(self) -> None:
        self.truncate_entries(0)

    def _bsearch(self, field: int, key: int) -> int:
        """Index of the last entry whose ``field`` <= key, or -1."""
        lo, hi = 0, self.entries
        unpack, mm, w = self.ENTRY.unpack_from, self._mm, self.width
        while lo < hi:
            mid = (lo + hi) // 2
            if unpack(mm, mid * w)[field] <= key:
                lo = mid + 1
            else:
                hi = mid
        return lo - 1

    _pos_field = 1


class OffsetIndex(_Index):
    ENTRY = struct.Struct(">II")
    _pos_field = 1

    def append(self, offset: int, position: int) -> None:
        n = self.entries
        if n >= self.max_entries:
            return  # the log rolls on a full index; until then lookups scan a bit more
        rel = offset - self.base_offset
        if n:
            last_rel, last_pos = self.ENTRY.unpack_from(self._mm, (n - 1) * 8)
            if rel <= last_rel or position <= last_pos:
                return
        self.ENTRY.pack_into(self._mm, n * 8, rel, position)
        self.entries += 1

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
        n = self.entries
        if n >= self.max_entries:
            return  # the log rolls on a full index; until then lookups scan a bit more
        rel = offset - self.base_offset
        if n:
            last_ts, last_rel = self.ENTRY.unpack_from(self._mm, (n - 1) * 12)
            if timestamp <= last_ts or rel <= last_rel:
                return
        self.ENTRY.pack_into(self._mm, n * 12, timestamp, rel)
        self.entries = n + 1

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
