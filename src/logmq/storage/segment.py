"""One log segment: a ``.log`` file of whole batches plus its offset and time indexes.

The segment works per batch and never decodes records. It opens its files lazily and
lets an OpenFileCache close them when idle. It remembers which byte ranges it has
checksummed: what this process appended is verified; bytes from before a restart are
checksummed once, on first read, before they are handed out.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from logmq.errors import CorruptRecordError, storage_error_for
from logmq.storage import batch as b
from logmq.storage import checkpoint as ckpt
from logmq.storage.batch_scan import (
    R_BASE_OFFSET,
    R_LAST_OFFSET_DELTA,
    R_LENGTH,
    R_MAX_TIMESTAMP,
    R_POS,
    HeaderRow,
    row_of,
)
from logmq.storage.index import IndexCorruptError, OffsetIndex, TimeIndex
from logmq.storage.open_files import OpenFileCache
from logmq.storage.txn_index import TXN_INDEX_SUFFIX, TxnIndex, TxnIndexCorruptError
from logmq.storage.txn_state import ControlRecord, control_record
from logmq.storage.verify import RecoveryScan, VerifiedRanges, verify_range

try:
    from logmq.storage._recordsv2 import make_log_dirs as _make_log_dirs
except ImportError:  # the optional extension did not build
    _make_log_dirs = None

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
DELETED_SUFFIX = ".deleted"

# Indirection so fault-injection tests can simulate a full disk or a short write.
_pwritev = os.pwritev
_IOV_MAX = 1000
_MAX_HINTS = 64


def make_log_dir(directory: str | Path) -> None:
    """Make a log's directory if missing: a new log has none until its first write.

    Not fsynced here: the first sync of a new segment fsyncs its directory and the
    data directory too (``LogSegment.sync_job``), before any recovery point covers it.
    """
    os.makedirs(directory, exist_ok=True)


def make_log_dirs(directories: list[str], files: list[str]) -> None:
    """Make each directory and its (empty) first segment file, both unless they exist.

    For a worker thread making thousands of new logs: their first writes then only open
    a file, since creating one on the event loop can block for milliseconds while the
    file system commits other writes. The compiled version holds no GIL meanwhile (the
    thread would otherwise wait for it after every system call while the loop runs).
    Not fsynced here, as ``make_log_dir``.
    """
    if _make_log_dirs is not None:
        _make_log_dirs(list(map(os.fsencode, directories)), list(map(os.fsencode, files)))
        return
    for directory, path in zip(directories, files, strict=True):
        make_log_dir(directory)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            pass


def _create_or_open(path: Path) -> SharedFile:
    """A new segment's file: made here, or found made empty by ``make_log_dirs``
    (one that holds anything is not ours to write over)."""
    try:
        return SharedFile(path, create=True)
    except FileExistsError:
        f = SharedFile(path)
        if os.fstat(f.fd).st_size:
            raise
        return f


def segment_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


class SharedFile:
    """A segment file descriptor closed when its last user lets go.

    The segment, every FileSlice handed to a sender and every fsync job hold a
    reference; CPython frees it (closing the descriptor) when the last one drops, so
    evicting or deleting a segment never pulls a descriptor from under a send.
    """

    __slots__ = ("fd", "name")

    def __init__(self, path: Path, *, create: bool = False) -> None:
        self.name = str(path)
        self.fd = -1  # until the open succeeds (__del__ must not fail if it does not)
        self.fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o644)

    def fileno(self) -> int:
        return self.fd

    def __del__(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __repr__(self) -> str:
        return f"SharedFile({self.name!r}, fd={self.fd})"


@dataclass(slots=True)
class FileSlice:
    """A byte range of a segment file, ready for ``os.sendfile``.

    ``file`` keeps its descriptor open for as long as the slice is referenced, even if
    the segment is evicted, truncated or deleted meanwhile.
    """

    file: Any
    position: int
    length: int
    end_offset: int = -1  # the offset a fetch continues from after this slice

    def read(self) -> bytes:
        """Buffered fallback: the bytes of the slice."""
        return os.pread(self.file.fileno(), self.length, self.position)


class BatchInfo(NamedTuple):
    """Where one batch of an append landed, for the indexes.

    A tuple so that ``LogSegment.append`` unpacks it as it does the hot path's
    plain ``(position, size, base_offset, max_timestamp)``.
    """

    position: int  # relative to the start of the write
    size: int
    base_offset: int
    max_timestamp: int


class LogSegment:
    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        index_interval: int,
        index_bytes: int,
        cache: OpenFileCache,
        active: bool = False,
        create: bool = False,
        defer_create: bool = False,
    ) -> None:
        """``create``: a new, empty segment. ``defer_create`` leaves making its file to
        the first open: a fresh partition costs no file until something touches it."""
        self.dir = directory
        self._dirname = os.fspath(directory)
        self.base_offset = base_offset
        self.index_interval = index_interval
        self.index_bytes = index_bytes
        self.cache = cache
        self.active = active
        # Until the first open: the log file is still to be made (deferred creation),
        # and no index files exist yet, so opening needs no look at the disk.
        self._unborn = create and defer_create
        self._new = create
        # Directories whose new entries (this segment's file, the log's directory) the
        # first sync must make durable too.
        self._unsynced_dirs = [self._dirname, os.path.dirname(self._dirname)] if create else []
        if create and not defer_create:
            fd = os.open(self._file_path(LOG_SUFFIX), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            os.close(fd)
        if create:
            self.size = 0
        else:  # a string path: no Path object per segment at start-up
            self.size = os.stat(
                os.path.join(directory, segment_name(base_offset, LOG_SUFFIX))
            ).st_size
        self.verified = VerifiedRanges()
        self._file: SharedFile | None = None
        self._index: OffsetIndex | None = None
        self._time_index: TimeIndex | None = None
        self._next_offset: int | None = base_offset if create else None
        self._max_timestamp: int | None = -1 if create else None
        self.bytes_since_index = 0
        # base offset -> (position, header or None) of where recent reads ended
        self._hints: dict[int, tuple[int, b.BatchHeader | None]] = {}
        self.created_ms: int | None = None  # set by the partition log (for segment.ms)
        self._first_batch_ts: int | None = None  # read lazily from the file
        # Recovery saw every batch and none had a producer id: replaying this segment's
        # headers into producer state would change nothing (log_loader skips it).
        self.no_producers = False
        self.recovered: RecoveryScan | None = None  # the last recovery's scan (log_loader)
        self.flushed_size = self.size
        # aborted transactions whose ABORT marker is in this segment (Kafka's .txnindex):
        # made on first use; a segment this process creates has no file to read
        self._txn_index: TxnIndex | None = None
        self._txn_index_new = create

    # Paths are made when used, not kept: thousands of idle segments would hold three
    # Path objects each for files nobody opens.
    @property
    def log_path(self) -> Path:
        return self.dir / segment_name(self.base_offset, LOG_SUFFIX)

    @property
    def index_path(self) -> Path:
        return self.dir / segment_name(self.base_offset, INDEX_SUFFIX)

    @property
    def time_index_path(self) -> Path:
        return self.dir / segment_name(self.base_offset, TIME_INDEX_SUFFIX)

    @property
    def txn_index_path(self) -> Path:
        return self.dir / segment_name(self.base_offset, TXN_INDEX_SUFFIX)

    @property
    def txn_index(self) -> TxnIndex:
        """The segment's aborted-transaction index, read from its file on first use. A
        damaged file is kept up to the damage, with a warning (the entries after it
        belong to markers a rebuild from the producer snapshot restores, if any)."""
        idx = self._txn_index
        if idx is None:
            path = self._file_path(TXN_INDEX_SUFFIX)
            idx = TxnIndex(path, self.base_offset, fresh=self._txn_index_new)
            if not self._txn_index_new:
                try:
                    idx.sanity_check()
                except TxnIndexCorruptError as e:
                    log.warning("damaged %s, keeping what precedes the damage: %s", path, e)
                    idx.reset()
                    for entry in e.entries:
                        idx.append(entry)
            self._txn_index = idx
        return idx

    @property
    def has_txn_entries(self) -> bool:
        """Whether the txn index is loaded and holds an entry (no file is read)."""
        return self._txn_index is not None and self._txn_index.loaded_entries > 0

    def aborted_transactions(self, fetch_offset: int, upper: int) -> tuple[list[Any], bool]:
        """``TxnIndex.collect`` of this segment."""
        return self.txn_index.collect(fetch_offset, upper)

    def control_record(self, pos: int, size: int) -> ControlRecord:
        """The control record (marker type, coordinator epoch) of the batch at ``pos``."""
        data = os.pread(self.file.fileno(), size, pos)
        return control_record(data, 0)

    def _file_path(self, suffix: str) -> str:
        """A file's path as a string: cheaper than a Path on the paths every open takes."""
        return os.path.join(self._dirname, segment_name(self.base_offset, suffix))

    # -- handles ----------------------------------------------------------------------

    def _open(self, *, indexes: bool = True) -> None:
        if self._file is not None:
            self.cache.touch(self)
            return
        if not indexes:  # recovery rebuilds them
            self._file = SharedFile(self._file_path(LOG_SUFFIX))
            self._reset_indexes(unlink=False)
            self.cache.touch(self)
            return
        if self._new:
            self._open_new()
            return
        index_path, time_index_path = (
            self._file_path(INDEX_SUFFIX),
            self._file_path(TIME_INDEX_SUFFIX),
        )
        missing = not (os.path.exists(index_path) and os.path.exists(time_index_path))
        self._file = SharedFile(self._file_path(LOG_SUFFIX))
        try:
            self._index = OffsetIndex(
                index_path, self.base_offset, self.index_bytes, writable=self.active
            )
            self._time_index = TimeIndex(
                time_index_path, self.base_offset, self.index_bytes, writable=self.active
            )
            self._index.sanity_check(max(self.size, 1))
            if missing and self.size:
                raise IndexCorruptError(f"index of {self.log_path} missing")
        except IndexCorruptError as e:
            if missing and self.active:  # recovered, still empty when closed: never written
                log.debug("rebuilding indexes of %s: %s", self.log_path, e)
            else:
                log.warning("rebuilding indexes of %s: %s", self.log_path, e)
            self._rebuild_indexes()
        self.cache.touch(self)

    def _open_new(self) -> None:
        """First open of a segment this process created: empty in-memory indexes."""
        path = self._file_path(LOG_SUFFIX)
        try:
            if not self._unborn:
                self._file = SharedFile(path)
            else:
                try:
                    self._file = _create_or_open(path)
                except FileNotFoundError:
                    make_log_dir(self._dirname)  # the first write to a new log
                    self._file = _create_or_open(path)
        except OSError as e:
            raise storage_error_for(e, f"creating {self.log_path}") from e
        self._unborn = self._new = False
        writable = self.active
        self._fresh_indexes(writable)
        self.cache.touch(self)

    def _fresh_indexes(self, writable: bool) -> None:
        """Empty offset and time indexes for this segment (their files are new)."""
        self._index = OffsetIndex(
            self._file_path(INDEX_SUFFIX), self.base_offset, self.index_bytes,
            writable=writable, fresh=True,
        )  # fmt: skip
        self._time_index = TimeIndex(
            self._file_path(TIME_INDEX_SUFFIX), self.base_offset, self.index_bytes,
            writable=writable, fresh=True,
        )  # fmt: skip

    def close_handles(self) -> None:
        """Drop descriptors and mmaps (LRU eviction); reopened on next use."""
        for idx in (self._index, self._time_index):
            if idx is not None:
                idx.close()
        self._index = self._time_index = None
        self._file = None  # FileSlices still holding it keep it open

    @property
    def file(self) -> SharedFile:
        self._open()
        assert self._file is not None
        return self._file

    @property
    def index(self) -> OffsetIndex:
        self._open()
        assert self._index is not None
        return self._index

    @property
    def time_index(self) -> TimeIndex:
        self._open()
        assert self._time_index is not None
        return self._time_index

    def is_open(self) -> bool:
        return self._file is not None

    # -- reading headers ----------------------------------------------------------------

    def header_at(self, pos: int) -> b.BatchHeader:
        """The header of the batch at ``pos``; CorruptRecordError if it cannot be one."""
        raw = os.pread(self.file.fileno(), b.HEADER_SIZE, pos)
        if len(raw) < b.HEADER_SIZE:
            raise CorruptRecordError(f"{self.log_path}: truncated batch header at position {pos}")
        h = b.read_header(raw)
        if h.batch_length < b.HEADER_SIZE - b.LOG_OVERHEAD or pos + h.size > self.size:
            raise CorruptRecordError(f"{self.log_path}: invalid batch length at position {pos}")
        return h

    def iter_headers(self, pos: int = 0, end: int | None = None) -> Iterator[tuple[int, Any]]:
        end = self.size if end is None else end
        while pos < end:
            h = self.header_at(pos)
            yield pos, h
            pos += h.size

    def _tail_scan(self) -> None:
        """Find next offset and max timestamp from the last index entries plus the tail."""
        off, pos = self.index.last()
        ts, _ = self.time_index.last()
        nxt = self.base_offset
        if pos:
            nxt = off
        for _, h in self.iter_headers(pos):
            nxt = h.next_offset
            ts = max(ts, h.max_timestamp)
        self._next_offset, self._max_timestamp = nxt, ts

    def known_end(self, next_offset: int) -> None:
        """The segment is known to end at ``next_offset`` (a recovery point covering it
        all): no tail scan, no open. Its max timestamp is still read when asked for."""
        self._next_offset = next_offset

    @property
    def next_offset(self) -> int:
        if self._next_offset is None:
            self._tail_scan()
        assert self._next_offset is not None
        return self._next_offset

    @property
    def max_timestamp(self) -> int:
        if self._max_timestamp is None:
            self._tail_scan()
        assert self._max_timestamp is not None
        return self._max_timestamp

    def locate(self, offset: int) -> tuple[int, b.BatchHeader] | None:
        """Position and header of the first batch whose last offset is >= ``offset``."""
        hint = self._hints.get(offset)  # sequential consumers: where the last read ended
        if hint is not None and hint[0] < self.size:
            pos, h = hint
            if h is None:
                h = self.header_at(pos)
            if h.base_offset == offset:
                return pos, h
        _, pos = self.index.lookup(offset)
        for p, h in self.iter_headers(pos):
            if h.last_offset >= offset:
                return p, h
        return None

    # -- appending ------------------------------------------------------------------------

    def append(
        self,
        parts: list[Any],
        size: int,
        batches: Sequence[tuple[int, int, int, int]],
        next_offset: int,
    ) -> None:
        """Write stamped batches with one vectored syscall and index them; all or nothing.

        The one write path of a segment, for a leader's single produced batch as for
        a follower's copy of many. ``parts`` are the buffers of the write, ``size``
        their total; ``batches`` gives each batch's (position in the write, size, base
        offset, max timestamp), as BatchInfo or, on the produce hot path, a plain
        tuple. Every statement runs once per produced batch, so it reads cached index
        tails and skips calls that would do nothing.
        """
        pos = self.size
        file = self._file
        if file is None:
            self._open()
            file = self._file
            assert file is not None
        else:
            self.cache.touch(self)
        try:
            written = _pwritev(file.fd, parts, pos)
        except OSError:  # also EINVAL for more buffers than IOV_MAX: _write joins them
            written = -1  # _write repeats the write and reports the error
        if written != size:
            self._write(file.fd, parts, size, pos)
        max_ts = self._max_timestamp
        if max_ts is None:
            max_ts = self.max_timestamp
        since = self.bytes_since_index
        for rel, batch_size, base_offset, batch_ts in batches:
            at = pos + rel
            if since >= self.index_interval and at:
                self._index.append(base_offset, at)  # type: ignore[union-attr]
                tidx = self._time_index
                if max_ts > tidx.last_key:  # type: ignore[union-attr]
                    tidx.append(max_ts, base_offset)  # type: ignore[union-attr]
                since = 0
            elif not at:
                self._first_batch_ts = batch_ts
            if batch_ts > max_ts:
                max_ts = batch_ts
            since += batch_size
        self.bytes_since_index = since
        self.size = end = pos + size
        ends = self.verified.ends
        if ends and ends[-1] == pos:
            ends[-1] = end  # what VerifiedRanges.add does for a tail append, inline
        else:
            self.verified.add(pos, end)
        self._next_offset = next_offset
        self._max_timestamp = max_ts
        self.no_producers = False  # what was appended is not known to be free of them

    def _write(self, fd: int, parts: list[Any], size: int, pos: int) -> None:
        try:
            if len(parts) > _IOV_MAX:
                parts = [b"".join(parts)]
            written = _pwritev(fd, parts, pos)
            if written < size:  # short write: finish the rest the slow way
                rest = memoryview(b"".join(parts))
                while written < size:
                    written += _pwritev(fd, [rest[written:]], pos + written)
        except OSError as e:
            self._undo_partial_write(fd, pos)
            raise storage_error_for(e, f"appending to {self.log_path}") from e

    @property
    def first_batch_timestamp(self) -> int | None:
        """Max timestamp of the first batch (what segment.ms measures from), None if empty."""
        if not self.size:
            return None
        if self._first_batch_ts is None:
            try:
                self._first_batch_ts = self.header_at(0).max_timestamp
            except CorruptRecordError as e:  # reads report the damage; rolls fall back
                log.error("cannot read the first batch header of %s: %s", self.log_path, e)
                return -1
        return self._first_batch_ts

    def _undo_partial_write(self, fd: int, pos: int) -> None:
        try:
            os.ftruncate(fd, pos)
        except OSError:
            # Nothing past self.size is ever read, and the next write overwrites it.
            log.error("could not cut partial write in %s at %d", self.log_path, pos)

    @property
    def index_full(self) -> bool:
        """True when an open index has no room left (a closed one is checked on reopen)."""
        idx, tidx = self._index, self._time_index
        if idx is None or tidx is None:
            return False
        return idx.entries >= idx.max_entries or tidx.entries >= tidx.max_entries

    # -- reading ------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, max_offset: int | None) -> FileSlice | None:
        """Whole batches from the one holding ``offset``, up to ``max_bytes`` (at least one).

        Per fetch, so it keeps syscalls down: the header of the batch where a read
        stops is remembered for the next sequential read, which then needs no pread.
        """
        self._open()
        size = self.size
        if (
            offset <= self.base_offset
            and 0 < size <= max_bytes
            and (max_offset is None or self.next_offset <= max_offset)
        ):
            # From the start, and the whole segment fits: no header is read at all (the
            # first fetch of a consumer of thousands of small partitions).
            return self._slice(0, size, self.next_offset, None)
        found = self.locate(offset)
        if found is None:
            return None
        start, first = found
        if max_offset is not None and first.base_offset >= max_offset:
            return None
        end = start + first.size
        end_offset = first.next_offset  # offset of the batch at ``end`` (or the next one)
        stop: b.BatchHeader | None = None  # header of the batch at ``end``, if read
        limit = start + max_bytes
        if end < size and size <= limit and (max_offset is None or self.next_offset <= max_offset):
            # The rest of the segment fits: all of it, with no walk over its headers (a
            # consumer of thousands of small partitions reads each this way).
            end, end_offset = size, self.next_offset
        elif end < limit and end < size:
            idx = self._index
            assert idx is not None
            idx_off, idx_pos = idx.lookup_position(min(limit, size))
            if idx_pos > end and (max_offset is None or idx_off <= max_offset):
                end = idx_pos
            elif max_offset is not None:
                _, mpos = idx.lookup(max_offset)
                if end < mpos <= limit:
                    end = mpos
            end_offset = -1
            for _, h in self.iter_headers(end):
                if end + h.size > limit or (max_offset is not None and h.base_offset >= max_offset):
                    end_offset = h.base_offset
                    stop = h
                    break
                end += h.size
            if end_offset < 0:
                end_offset = self.next_offset
        return self._slice(start, end, end_offset, stop)

    def _slice(
        self, start: int, end: int, end_offset: int, stop: b.BatchHeader | None
    ) -> FileSlice:
        """The FileSlice of [start, end), checksummed where not verified yet."""
        # Remembered even at the segment's end: a caught-up consumer's next fetch starts
        # right there once more batches arrive.
        self._remember(end_offset, end, stop)
        file = self._file
        assert file is not None
        v = self.verified  # usually one range: everything this process appended
        if not (v.starts and v.starts[0] <= start and end <= v.ends[0]):
            valid_end = self.verify(start, end)
            if valid_end != end:  # a corrupt batch: the slice stops before it
                end = valid_end
                for _, h in self.iter_headers(start, end):
                    end_offset = h.next_offset
        return FileSlice(file, start, end - start, end_offset)

    def _remember(self, offset: int, position: int, header: b.BatchHeader | None = None) -> None:
        """Note that the batch at ``position`` starts at ``offset`` (the next read's start)."""
        hints = self._hints
        hints[offset] = (position, header)
        if len(hints) > _MAX_HINTS:
            del hints[next(iter(hints))]

    def verify(self, start: int, end: int) -> int:
        """Checksum unverified bytes of [start, end); returns the end of the valid prefix.

        Raises CorruptRecordError (naming file and position) if the first batch is bad.
        """
        return verify_range(self.file.fileno(), self.log_path, self.verified, start, end)

    def find_timestamp(self, ts: int) -> tuple[int, int] | None:
        """(base offset, max timestamp) of the first batch with max timestamp >= ``ts``."""
        if self.max_timestamp < ts:
            return None
        _, pos = self.index.lookup(self.time_index.lookup(ts))
        for _, h in self.iter_headers(pos):
            if h.max_timestamp >= ts:
                return h.base_offset, h.max_timestamp
        return None

    # -- recovery, truncation, indexes ----------------------------------------------------

    def _rebuild_indexes(self) -> None:
        """Rebuild both indexes from batch headers (no checksums)."""
        self._reset_indexes()
        self._reindex(self._headers_until_damage())

    def _headers_until_damage(self) -> Iterator[HeaderRow]:
        try:
            for pos, h in self.iter_headers(0):
                yield row_of(pos, h)
        except CorruptRecordError as e:
            log.error("index rebuild of %s stopped: %s", self.log_path, e)

    def _reset_indexes(self, *, unlink: bool = True) -> None:
        """Start both indexes empty, in memory; their files are rewritten whole on flush.

        ``unlink=False`` (recovery) leaves the files alone until then: they only ever
        list batches that exist, unless recovery cuts the log (it then removes them).
        """
        for idx in (self._index, self._time_index):
            if idx is not None:
                idx.close()
        if unlink:
            self._unlink_indexes()
        self._fresh_indexes(True)

    def _unlink_indexes(self) -> None:
        for path in (self.index_path, self.time_index_path):
            path.unlink(missing_ok=True)

    def _drop_stale_index_files(self, names: Collection[str] | None = None) -> None:
        """Remove non-empty index files the recovered (in-memory) indexes replace.

        They may list batches recovery cut (or a format upgrade moved), and a later
        open must never trust them; empty ones (the usual case) are left alone, which
        saves two file-system writes per recovered partition, and with the directory's
        listing (``names``) files that are not there are not even looked up.
        """
        for idx in (self._index, self._time_index):
            assert idx is not None
            path = idx.path
            if names is not None and os.path.basename(path) not in names:
                idx.disk_empty = True
                continue
            try:
                if os.stat(path).st_size:
                    os.unlink(path)
            except FileNotFoundError:
                pass
            idx.disk_empty = True

    def _reindex(self, rows: Iterable[HeaderRow]) -> None:
        assert self._index is not None and self._time_index is not None
        since, max_ts, nxt = 0, -1, self.base_offset
        interval = self.index_interval
        for row in rows:
            pos, base = row[R_POS], row[R_BASE_OFFSET]
            if since >= interval and pos > 0:
                self._index.append(base, pos)
                self._time_index.append(max_ts, base)
                since = 0
            since += row[R_LENGTH] + b.LOG_OVERHEAD
            if row[R_MAX_TIMESTAMP] > max_ts:
                max_ts = row[R_MAX_TIMESTAMP]
            nxt = base + row[R_LAST_OFFSET_DELTA] + 1
        self.bytes_since_index = since
        self._next_offset, self._max_timestamp = nxt, max_ts
        if not self.active:
            self._index.trim()
            self._time_index.trim()

    def recover(self, *, allow_gaps: bool = False, names: Collection[str] | None = None) -> int:
        """Checksum every batch, cut at the first invalid one, rebuild indexes.

        ``allow_gaps``: offsets may jump between batches (compacted logs). ``names``:
        the log directory's listing, if the caller has it (no index file outside it is
        looked for). Returns the number of bytes cut.
        """
        if self._file is None:
            self._open(indexes=False)
        else:
            self._reset_indexes(unlink=False)
        scan = RecoveryScan(self.file.fileno(), self.size, self.base_offset, allow_gaps=allow_gaps)
        self._reindex(scan)
        self.no_producers = not scan.producers
        self.recovered = scan  # its producer rows and epoch starts, for the log loader
        valid, reason = scan.valid, scan.reason
        cut = self.size - valid
        if cut:
            log.warning(
                "recovery cut %d bytes from %s at position %d (%s)",
                cut,
                self.log_path,
                valid,
                reason or "torn tail",
            )
            os.ftruncate(self.file.fileno(), valid)
            self.size = valid
        if self.active:  # a rolled segment's index files were just rewritten (trim)
            self._drop_stale_index_files(names)
        self._hints.clear()
        self._first_batch_ts = None
        self.verified = VerifiedRanges()
        self.verified.add(0, self.size)
        self.flushed_size = min(self.flushed_size, self.size)
        return cut

    def truncate_to(self, offset: int) -> int:
        """Remove batches whose last offset is >= ``offset``; returns the new next offset."""
        found = self.locate(offset)
        if found is None:
            return self.next_offset
        pos, h = found
        self._hints.clear()
        self._first_batch_ts = None
        os.ftruncate(self.file.fileno(), pos)
        self.size = pos
        self.flushed_size = min(self.flushed_size, pos)
        self.verified.cut(pos)
        self.index.truncate_to_offset(h.base_offset)
        self.time_index.truncate_to_offset(h.base_offset)
        self.txn_index.truncate_to(h.base_offset)
        self._next_offset = None
        self._max_timestamp = None
        _, ipos = self.index.last()
        self.bytes_since_index = pos - ipos
        return self.next_offset

    def roll(self) -> None:
        """Become read-only: trim the preallocated indexes."""
        self.active = False
        if self._index is not None:
            self._index.trim()
        if self._time_index is not None:
            self._time_index.trim()

    def sync_job(self) -> tuple[SharedFile, int, list[Any]]:
        """What a worker thread needs to make this segment durable (see run_sync)."""
        # The active segment's indexes are rebuilt by recovery anyway; rolled segments'
        # indexes must be durable once the recovery point passes them. A new segment's
        # directory entries must be too (until a sync succeeds: ``synced``).
        paths: list[Any] = [] if self.active else [self.index_path, self.time_index_path]
        # the txn index is not rebuilt from the whole segment, only from the producer
        # snapshot on: always durable with its segment (run_sync skips a missing file)
        paths.append(self._file_path(TXN_INDEX_SUFFIX))
        return self.file, self.size, paths + self._unsynced_dirs

    def synced(self, job: tuple[SharedFile, int, list[Any]]) -> None:
        """``job`` (from ``sync_job``) succeeded."""
        self.flushed_size = max(self.flushed_size, job[1])
        if self._unsynced_dirs and set(self._unsynced_dirs) <= set(job[2]):
            self._unsynced_dirs = []

    def close(self) -> None:
        self.close_handles()
        self.cache.forget(self)

    def delete(self) -> None:
        """Rename every file to ``.deleted`` (crash-safe intent), then remove them."""
        for path in self.rename_for_delete():
            path.unlink(missing_ok=True)

    def rename_for_delete(self) -> list[Path]:
        """Close and rename every file to ``.deleted``; returns the new paths.

        A crash after the rename leaves only ``.deleted`` files, which the next open
        removes, so the segment is gone either way.
        """
        self.close()
        self._txn_index = None
        renamed = []
        for path in (self.log_path, self.index_path, self.time_index_path, self.txn_index_path):
            target = path.with_name(path.name + DELETED_SUFFIX)
            try:
                os.replace(path, target)
                renamed.append(target)
            except FileNotFoundError:
                pass
        return renamed


def run_sync(job: tuple[SharedFile, int, list[Path]]) -> int:
    """fdatasync a segment's log and fsync its indexes (and directories whose new
    entries must last); runs in a worker thread.

    The job holds its own file reference, so eviction meanwhile cannot close the
    descriptor under us. Returns the log size made durable.
    """
    f, size, index_paths = job
    ckpt.fdatasync(f.fileno())
    for path in index_paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            ckpt.fsync(fd)
        finally:
            os.close(fd)
    return size
