"""The aborted-transaction index of one segment (Kafka's ``.txnindex``).

A read_committed consumer must be told which producers' data in a fetched range
belongs to aborted transactions; the log alone would make the broker scan backwards
for the start of every transaction. Each ABORT marker therefore adds one fixed-width
entry to the index of the segment that holds the marker:

    version int16 (0) | producer_id int64 | first_offset int64 | last_offset int64
    | last_stable_offset int64                                  (34 bytes, big-endian)

``first_offset`` is the offset of the producer's first batch of the aborted
transaction on this partition, ``last_offset`` the marker's offset and
``last_stable_offset`` the partition's first unstable offset once the transaction is
complete (see ``txn_state``). Entries are in increasing ``last_offset`` order, so a
fetch finds its first candidate by bisection and stops early: every transaction
aborted after an entry began at or after that entry's ``last_stable_offset``.

Aborts are rare, so an append writes its entry to the file at once (page cache; the
owner fsyncs with the segment) and the parsed entries are cached after first use.
No file exists until the first entry, as in Kafka.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
from collections.abc import Iterable, Sequence
from operator import attrgetter
from pathlib import Path
from typing import NamedTuple, Protocol

from logmq.storage import checkpoint
from logmq.storage.index import IndexCorruptError

log = logging.getLogger(__name__)

TXN_INDEX_SUFFIX = ".txnindex"
ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = ENTRY.size  # 34
ENTRY_VERSION = 0

_LAST = attrgetter("last_offset")


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset
    last_stable_offset: int  # first unstable offset right after the abort completed


class TxnIndexCorruptError(IndexCorruptError):
    """A ``.txnindex`` file fails its checks; the caller rebuilds it from the log.

    ``entries`` holds the valid entries before the damage, for a caller that prefers
    to keep them.
    """

    def __init__(self, message: str, entries: Sequence[AbortedTxn] = ()) -> None:
        super().__init__(message)
        self.entries = list(entries)


def encode_entry(e: AbortedTxn) -> bytes:
    return ENTRY.pack(
        ENTRY_VERSION, e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset
    )


def encode_entries(entries: Iterable[AbortedTxn]) -> bytes:
    return b"".join(map(encode_entry, entries))


def decode_entries(
    data: bytes, *, base_offset: int | None = None, name: str = "txn index"
) -> list[AbortedTxn]:
    """Parse a whole index file, checking every entry.

    Raises TxnIndexCorruptError (and nothing else) for a size that is not a multiple of
    34 bytes, an unknown version, ``first_offset > last_offset``, last offsets that do
    not increase, or (given ``base_offset``, the segment's) a marker before the segment.
    """
    out: list[AbortedTxn] = []
    n, rest = divmod(len(data), ENTRY_SIZE)
    prev = None
    for i in range(n):
        version, pid, first, last, lso = ENTRY.unpack_from(data, i * ENTRY_SIZE)
        why = None
        if version != ENTRY_VERSION:
            why = f"unknown entry version {version}"
        elif first > last:
            why = f"first offset {first} is after last offset {last}"
        elif prev is not None and last <= prev:
            why = f"last offset {last} does not follow {prev}"
        elif base_offset is not None and last < base_offset:
            why = f"last offset {last} is before the segment base {base_offset}"
        if why:
            raise TxnIndexCorruptError(f"{name}: entry {i}: {why}", out)
        out.append(AbortedTxn(pid, first, last, lso))
        prev = last
    if rest:
        raise TxnIndexCorruptError(
            f"{name}: size {len(data)} is not a multiple of {ENTRY_SIZE} (torn last entry)", out
        )
    return out


def txn_index_path(directory: str | Path, base_offset: int) -> Path:
    """The index file of the segment at ``base_offset`` (named like its ``.log``)."""
    return Path(directory) / f"{base_offset:020d}{TXN_INDEX_SUFFIX}"


def collect_from(
    entries: Sequence[AbortedTxn], fetch_offset: int, upper: int
) -> tuple[list[AbortedTxn], bool]:
    """Entries whose [first_offset, last_offset] overlaps [fetch_offset, upper), and
    whether the scan passed ``upper`` (no later entry, here or in later segments, can
    overlap). ``entries`` must be in increasing last_offset order."""
    out: list[AbortedTxn] = []
    if upper <= fetch_offset:
        return out, True  # an empty range overlaps nothing
    # Entries before i end below fetch_offset and have last_stable_offset <= last + 1
    # <= fetch_offset < upper: skipping them changes neither result.
    for i in range(bisect.bisect_left(entries, fetch_offset, key=_LAST), len(entries)):
        e = entries[i]
        if e.first_offset < upper:
            out.append(e)
        if e.last_stable_offset >= upper:
            return out, True
    return out, False


class TxnIndex:
    """The ``.txnindex`` file of one segment: append, search, truncate, delete."""

    def __init__(self, path: str | Path, base_offset: int = 0, *, fresh: bool = False) -> None:
        """``fresh``: the segment is new, so there is no file to read (nor made yet).

        Otherwise the file, if any, is read on first use; a damaged file raises
        TxnIndexCorruptError from that use (or from ``sanity_check``).
        """
        self.path = Path(path)
        self.base_offset = base_offset
        self._entries: list[AbortedTxn] | None = [] if fresh else None
        self._written = 0  # entries known to be in the file
        self._unsynced = False

    # -- reading ----------------------------------------------------------------------

    def _load(self) -> list[AbortedTxn]:
        if self._entries is None:
            try:
                data = checkpoint.read_small(self.path)
            except FileNotFoundError:
                data = b""
            entries = decode_entries(data, base_offset=self.base_offset, name=str(self.path))
            self._entries = entries
            self._written = len(entries)
        return self._entries

    def sanity_check(self) -> None:
        """Read and check the file now (at open) rather than at the first fetch."""
        self._load()

    def entries(self) -> list[AbortedTxn]:
        """Every entry, in increasing last_offset order (a copy)."""
        return list(self._load())

    @property
    def loaded_entries(self) -> int:
        """Entries held in memory, without reading the file (0 when not read yet)."""
        return len(self._entries) if self._entries is not None else 0

    def __len__(self) -> int:
        return len(self._load())

    @property
    def last_offset(self) -> int:
        """The last entry's marker offset, or -1 when there is none."""
        entries = self._load()
        return entries[-1].last_offset if entries else -1

    def collect(self, fetch_offset: int, upper: int) -> tuple[list[AbortedTxn], bool]:
        """Aborted transactions overlapping [fetch_offset, upper), and whether this
        segment's entries passed ``upper`` (the caller stops at later segments)."""
        return collect_from(self._load(), fetch_offset, upper)

    # -- writing ----------------------------------------------------------------------

    def append(self, entry: AbortedTxn) -> None:
        """Add an entry (its marker after every entry already here) and write it to
        the file, creating the file for the first one.

        Raises ValueError when out of order or inconsistent: nothing is stored then. A
        failed write (disk full) is logged, not raised: the marker is already in the
        log, the entry stays in memory for fetches and ``flush`` retries the write
        (and raises if it fails again).
        """
        entries = self._load()
        e = AbortedTxn(*entry)
        if e.first_offset > e.last_offset:
            raise ValueError(f"aborted txn first offset {e.first_offset} > last {e.last_offset}")
        if e.last_offset < self.base_offset:
            raise ValueError(f"marker {e.last_offset} is before segment {self.base_offset}")
        if entries and e.last_offset <= entries[-1].last_offset:
            raise ValueError(
                f"marker {e.last_offset} does not follow the last indexed {entries[-1].last_offset}"
            )
        entries.append(e)
        try:
            self._write_pending()
        except OSError as err:
            log.warning("%s: entry for marker %d unwritten: %s", self.path, e.last_offset, err)

    def _write_pending(self) -> None:
        entries = self._entries
        assert entries is not None
        n = len(entries)
        if self._written >= n:
            return
        data = encode_entries(entries[self._written :])
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            pos, view = self._written * ENTRY_SIZE, memoryview(data)
            while view:
                k = os.pwrite(fd, view, pos)
                view, pos = view[k:], pos + k
        finally:
            os.close(fd)
        self._written = n
        self._unsynced = True

    def truncate_to(self, offset: int) -> None:
        """Drop entries whose marker is at or after ``offset`` (log truncation)."""
        entries = self._load()
        keep = bisect.bisect_left(entries, offset, key=_LAST)
        if keep == len(entries):
            return
        del entries[keep:]
        if self._written > keep:
            try:
                os.truncate(self.path, keep * ENTRY_SIZE)
            except FileNotFoundError:
                pass
            self._written = keep
            self._unsynced = True

    def reset(self) -> None:
        """Drop every entry (before a rebuild from the log); the file, if any, is emptied."""
        self._entries = []
        self._written = 0
        try:
            os.truncate(self.path, 0)
            self._unsynced = True
        except FileNotFoundError:
            pass

    def flush(self) -> None:
        """Write any entry a failed append left out, then fsync the file if it changed."""
        if self._entries is not None:
            self._write_pending()
        if not self._unsynced:
            return
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            self._unsynced = False
            return
        try:
            checkpoint.fsync(fd)
        finally:
            os.close(fd)
        self._unsynced = False

    def close(self) -> None:
        """Forget the cached entries (re-read on next use). Entries are already in
        the file, so nothing is lost; call ``flush`` first for durability."""
        if self._entries is not None and self._written < len(self._entries):
            self._write_pending()
        self._entries = None
        self._written = 0

    def delete(self) -> None:
        """Remove the file (with its segment); the index is then empty."""
        self._entries = []
        self._written = 0
        self._unsynced = False
        self.path.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return f"TxnIndex({self.path})"


class _Collects(Protocol):
    def collect(self, fetch_offset: int, upper: int) -> tuple[list[AbortedTxn], bool]: ...


def collect_aborted(
    indexes: Iterable[_Collects], fetch_offset: int, upper: int
) -> list[tuple[int, int]]:
    """``aborted_transactions`` of a read_committed fetch of [fetch_offset, upper).

    ``indexes``: the txn indexes of the segment holding ``fetch_offset`` and of every
    later segment, in log order (earlier segments cannot hold an overlapping entry:
    their markers are below fetch_offset). Iterated lazily, and no further once an
    index reports that its entries passed ``upper``. Returns ``(producer_id,
    first_offset)`` pairs in marker order.
    """
    out: list[tuple[int, int]] = []
    if upper <= fetch_offset:
        return out
    for idx in indexes:
        found, passed = idx.collect(fetch_offset, upper)
        out.extend((e.producer_id, e.first_offset) for e in found)
        if passed:
            break
    return out
