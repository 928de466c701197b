"""The metadata quorum's disk: hard state, log segments and snapshots in one directory.

``RaftStorage`` carries out the persistence half of a Ready (docs/raft.md, "Driving the
core") and reads everything back at start-up, cutting a torn tail. Layout, under e.g.
``DATA_DIR/__cluster_metadata/`` (byte layouts in docs/raft.md, "On disk"):

* ``quorum-state``: two fixed 64-byte slots, each a checksummed (term, vote, commit) with a
  sequence number. A write goes to the slot that is *not* the last durable one, so a torn
  write always leaves the previous durable hard state readable; no rename, no directory
  fsync per vote.
* ``<first index>.log``: append-only segments of ``[u32 length][u64 xxh3][raft_codec
  entry]`` records; the checksum is seeded with the length, so a torn length is caught too.
* ``<index>.snapshot``: one checksummed snapshot (``raft_codec`` layout), written to a temp
  file, fsynced and renamed.

Ordering makes every crash leave a state the core may start from: a new term/vote is made
durable before any entry of that term is written (a log never holds entries from a term
the node has not recorded), and the commit index is written after the entries it covers.
Every method raises StorageError (DiskFullError on ENOSPC) and then refuses further use: a
half-applied Ready must not be followed by another, so the shell stops the node instead.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import xxhash

from logmq.errors import StorageError, storage_error_for
from logmq.replication.raft_codec import (
    RaftCodecError,
    decode_entry,
    decode_snapshot,
    encode_entry,
    encode_snapshot,
)
from logmq.replication.raft_messages import EMPTY_SNAPSHOT, Entry, Snapshot
from logmq.replication.raft_ready import HardState, PersistentState, Ready

DIR_NAME = "__cluster_metadata"
STATE_FILE = "quorum-state"
LOG_SUFFIX = ".log"
SNAPSHOT_SUFFIX = ".snapshot"
TMP_SUFFIX = ".tmp"

DEFAULT_SEGMENT_BYTES = 8 << 20
MAX_ENTRY_BYTES = 64 << 20  # a larger length can only be a corrupt header

# Hard state slot: magic, sequence, term, voted_for (-1 = none), commit, xxh3 of the rest.
_SLOT = struct.Struct(">4sQqqq")
_SLOT_SIZE = 64
_STATE_MAGIC = b"LQHS"
# Entry record header: payload length, xxh3-64 of the payload seeded with the length.
_RECORD = struct.Struct(">IQ")
# Snapshot file header: magic, xxh3-64 of the body.
_SNAP = struct.Struct(">4sQ")
_SNAP_MAGIC = b"LQSN"


class FileOps:
    """The system calls the store makes, in one place so tests can crash between any two."""

    def open(self, path: Path) -> int:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def close(self, fd: int) -> None:
        os.close(fd)

    def write(self, fd: int, data: bytes, offset: int) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def sync(self, fd: int) -> None:
        os.fdatasync(fd)

    def sync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def unlink(self, path: Path) -> None:
        path.unlink(missing_ok=True)

    def replace(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)


@dataclass(slots=True)
class _Segment:
    first_index: int
    path: Path
    size: int = 0
    positions: list[int] = field(default_factory=list)  # file offset of each entry

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.positions) - 1


def segment_name(first_index: int) -> str:
    return f"{first_index:020d}{LOG_SUFFIX}"


def snapshot_name(index: int) -> str:
    return f"{index:020d}{SNAPSHOT_SUFFIX}"


def encode_record(entry: Entry) -> bytes:
    payload = msgpack.packb(encode_entry(entry), use_bin_type=True)
    return _RECORD.pack(len(payload), xxhash.xxh3_64_intdigest(payload, len(payload))) + payload


def encode_snapshot_file(snapshot: Snapshot) -> bytes:
    body = msgpack.packb(encode_snapshot(snapshot), use_bin_type=True)
    return _SNAP.pack(_SNAP_MAGIC, xxhash.xxh3_64_intdigest(body)) + body


def decode_snapshot_file(data: bytes) -> Snapshot:
    """Raises ValueError on a damaged file."""
    if len(data) < _SNAP.size:
        raise ValueError("snapshot file too short")
    magic, checksum = _SNAP.unpack_from(data)
    body = data[_SNAP.size :]
    if magic != _SNAP_MAGIC or xxhash.xxh3_64_intdigest(body) != checksum:
        raise ValueError("snapshot file checksum mismatch")
    return decode_snapshot(msgpack.unpackb(body, raw=False))


def encode_hard_state(state: HardState, seq: int) -> bytes:
    vote = -1 if state.voted_for is None else state.voted_for
    head = _SLOT.pack(_STATE_MAGIC, seq, state.term, vote, state.commit)
    return (head + struct.pack(">Q", xxhash.xxh3_64_intdigest(head))).ljust(_SLOT_SIZE, b"\0")


def decode_hard_state(slot: bytes) -> tuple[int, HardState] | None:
    """(sequence, state), or None for an empty, torn or damaged slot."""
    if len(slot) < _SLOT.size + 8:
        return None
    head = slot[: _SLOT.size]
    (checksum,) = struct.unpack_from(">Q", slot, _SLOT.size)
    magic, seq, term, vote, commit = _SLOT.unpack(head)
    if magic != _STATE_MAGIC or xxhash.xxh3_64_intdigest(head) != checksum:
        return None
    return seq, HardState(term=term, voted_for=None if vote < 0 else vote, commit=commit)


def scan_records(data: bytes | memoryview, first_index: int) -> tuple[list[Entry], list[int], int]:
    """Decode whole records from a segment's bytes.

    Returns (entries, their file offsets, bytes of valid prefix). Stops at the first record
    that is short, fails its checksum, does not decode or breaks index contiguity: in the
    last segment that is a torn tail, elsewhere damage.
    """
    entries: list[Entry] = []
    positions: list[int] = []
    pos, end = 0, len(data)
    expected = first_index
    while pos + _RECORD.size <= end:
        length, checksum = _RECORD.unpack_from(data, pos)
        start = pos + _RECORD.size
        if length > MAX_ENTRY_BYTES or start + length > end:
            break
        payload = bytes(data[start : start + length])
        if xxhash.xxh3_64_intdigest(payload, length) != checksum:
            break
        try:
            entry = decode_entry(msgpack.unpackb(payload, raw=False))
        except (RaftCodecError, ValueError, msgpack.UnpackException):
            break
        if entry.index != expected or (entries and entry.term < entries[-1].term):
            break
        entries.append(entry)
        positions.append(pos)
        expected += 1
        pos = start + length
    return entries, positions, pos


class RaftStorage:
    """Durable home of one RaftNode's PersistentState; one instance per directory."""

    def __init__(
        self,
        directory: str | Path,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        file_ops: FileOps | None = None,
    ) -> None:
        self.dir = Path(directory)
        self.segment_bytes = segment_bytes
        self._ops = file_ops or FileOps()
        self._hard = HardState()
        self._seq = 0
        self._durable_slot = 1  # the slot holding the last durable hard state
        self._state_fd: int | None = None
        self._snapshot = EMPTY_SNAPSHOT
        self._segments: list[_Segment] = []
        self._active_fd: int | None = None
        self._failed: BaseException | None = None

    # -- reading -------------------------------------------------------------------------

    @property
    def hard_state(self) -> HardState:
        return self._hard

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    @property
    def last_index(self) -> int:
        if not self._segments:
            return self._snapshot.index
        return max(self._snapshot.index, self._segments[-1].last_index)

    def segment_files(self) -> list[Path]:
        return [s.path for s in self._segments]

    def load(self) -> PersistentState:
        """Open the directory (creating it), recover from a crash and return what is durable."""
        return self._guard(self._load)

    def _load(self) -> PersistentState:
        self.dir.mkdir(parents=True, exist_ok=True)
        for tmp in self.dir.glob(f"*{TMP_SUFFIX}"):
            self._ops.unlink(tmp)
        self._load_hard_state()
        self._load_snapshot()
        entries = self._load_segments()
        return PersistentState(self._hard, self._snapshot, entries)

    def _load_hard_state(self) -> None:
        path = self.dir / STATE_FILE
        existed = path.exists()
        self._state_fd = self._ops.open(path)
        if not existed:
            self._ops.sync_dir(self.dir)
            return
        data = path.read_bytes()
        slots = [decode_hard_state(data[i * _SLOT_SIZE : (i + 1) * _SLOT_SIZE]) for i in (0, 1)]
        best = max(
            ((s[0], i, s[1]) for i, s in enumerate(slots) if s is not None),
            default=None,
        )
        if best is not None:
            self._seq, self._durable_slot, self._hard = best
        # What we read may have been in the page cache only (a process crash): make it
        # durable before any write may overwrite the other slot.
        self._ops.sync(self._state_fd)

    def _load_snapshot(self) -> None:
        files = sorted(self.dir.glob(f"*{SNAPSHOT_SUFFIX}"))
        if not files:
            return
        latest = files[-1]
        try:
            snap = decode_snapshot_file(latest.read_bytes())
        except (ValueError, msgpack.UnpackException) as err:
            raise StorageError(f"damaged Raft snapshot {latest}: {err}") from None
        if snapshot_name(snap.index) != latest.name:
            raise StorageError(f"Raft snapshot {latest} holds index {snap.index}")
        self._snapshot = snap
        for older in files[:-1]:
            self._ops.unlink(older)

    def _load_segments(self) -> list[Entry]:
        paths = sorted(self.dir.glob(f"*{LOG_SUFFIX}"))
        entries: list[Entry] = []
        next_index: int | None = None
        for n, path in enumerate(paths):
            try:
                first = int(path.name[: -len(LOG_SUFFIX)])
            except ValueError:
                raise StorageError(f"unexpected file {path} in the Raft log directory") from None
            if next_index is not None and first != next_index:
                raise StorageError(
                    f"Raft log segment {path} does not follow index {next_index - 1}"
                )
            data = path.read_bytes()
            found, positions, valid = scan_records(data, first)
            if valid != len(data):
                if n != len(paths) - 1:
                    raise StorageError(
                        f"damaged Raft log segment {path} at byte {valid}: "
                        "entries after it would be lost"
                    )
                self._cut(path, valid)  # a torn tail: the write never completed
            if found and entries and found[0].term < entries[-1].term:
                raise StorageError(f"Raft log segment {path} goes back in term")
            self._segments.append(_Segment(first, path, valid, positions))
            entries.extend(found)
            next_index = first + len(found)
        return self._reconcile_with_snapshot(entries)

    def _cut(self, path: Path, size: int) -> None:
        fd = self._ops.open(path)
        try:
            self._ops.truncate(fd, size)
            self._ops.sync(fd)
        finally:
            self._ops.close(fd)

    def _reconcile_with_snapshot(self, entries: list[Entry]) -> list[Entry]:
        """Drop what the snapshot covers; drop everything if the log contradicts it."""
        snap = self._snapshot
        if self._segments and self._segments[0].first_index > snap.index + 1:
            raise StorageError(
                f"Raft log starts at {self._segments[0].first_index} but the snapshot only "
                f"covers up to {snap.index}: entries are missing"
            )
        at_snap = next((e for e in entries if e.index == snap.index), None)
        consistent = bool(entries) and (
            snap.index == 0
            or (at_snap is not None and at_snap.term == snap.term)
            or (entries[0].index == snap.index + 1 and entries[0].term >= snap.term)
        )
        if not consistent or entries[-1].index <= snap.index:
            if not entries and [s.first_index for s in self._segments] == [snap.index + 1]:
                self._open_active()  # an empty log right after the snapshot
                return []
            # A snapshot install crashed before its old log was deleted (or a compaction
            # before its covered segments were): the snapshot wins.
            for seg in self._segments:
                self._ops.unlink(seg.path)
            self._segments = []
            self._ops.sync_dir(self.dir)
            self._new_segment(snap.index + 1)
            return []
        # Whole segments below the snapshot are leftovers of an interrupted compaction.
        while len(self._segments) > 1 and self._segments[0].last_index <= snap.index:
            self._ops.unlink(self._segments.pop(0).path)
        self._open_active()
        return [e for e in entries if e.index > snap.index]

    # -- writing -------------------------------------------------------------------------

    def save(self, rd: Ready) -> None:
        """Make steps 1-4 of a Ready durable (as ``rd.must_sync`` demands), in order."""
        self._guard(self._save, rd)

    def _save(self, rd: Ready) -> None:
        hs = rd.hard_state
        if hs is not None and (hs.term, hs.voted_for) != (self._hard.term, self._hard.voted_for):
            # Term and vote first, with the old commit: entries of a new term must never
            # be on disk without the term, and a commit must never precede its entries.
            self._write_hard_state(HardState(hs.term, hs.voted_for, self._hard.commit), sync=True)
        if rd.snapshot is not None:
            self._install(rd.snapshot)
        if rd.truncate_from is not None:
            self._truncate(rd.truncate_from, sync=not rd.entries and rd.must_sync)
        if rd.entries:
            self._append(rd.entries, sync=rd.must_sync)
        if hs is not None and hs != self._hard:
            self._write_hard_state(hs, sync=False)  # only the advisory commit is left

    def save_snapshot(self, snapshot: Snapshot) -> None:
        """A snapshot the local state machine took: store it, then drop the log it covers."""
        self._guard(self._save_snapshot, snapshot)

    def _save_snapshot(self, snapshot: Snapshot) -> None:
        if snapshot.index <= self._snapshot.index:
            return  # a newer snapshot (e.g. installed from the leader) already covers it
        if snapshot.index > self.last_index:
            raise StorageError(f"snapshot {snapshot.index} beyond the log end {self.last_index}")
        self._write_snapshot(snapshot)
        active = self._segments[-1]
        if active.positions and active.first_index <= snapshot.index:
            # Roll, so the covered part can be deleted by this or the next compaction.
            self._new_segment(self.last_index + 1)
        covered = [s for s in self._segments[:-1] if s.last_index <= snapshot.index]
        for seg in covered:
            self._ops.unlink(seg.path)
            self._segments.remove(seg)

    def close(self) -> None:
        for fd in (self._active_fd, self._state_fd):
            if fd is not None:
                try:
                    self._ops.close(fd)
                except OSError:
                    pass
        self._active_fd = self._state_fd = None

    # -- internals -------------------------------------------------------------------------

    def _guard(self, fn, *args):  # type: ignore[no-untyped-def]
        if self._failed is not None:
            raise StorageError(f"Raft storage in {self.dir} failed earlier: {self._failed}")
        try:
            return fn(*args)
        except StorageError as err:
            self._failed = err
            raise
        except OSError as err:
            self._failed = err
            raise storage_error_for(err, f"in Raft storage {self.dir}") from err

    def _write_hard_state(self, state: HardState, *, sync: bool) -> None:
        assert self._state_fd is not None
        slot = 1 - self._durable_slot
        self._seq += 1
        self._ops.write(self._state_fd, encode_hard_state(state, self._seq), slot * _SLOT_SIZE)
        if sync:
            self._ops.sync(self._state_fd)
            self._durable_slot = slot
        self._hard = state

    def _write_snapshot(self, snapshot: Snapshot) -> None:
        final = self.dir / snapshot_name(snapshot.index)
        tmp = final.with_name(final.name + TMP_SUFFIX)
        fd = self._ops.open(tmp)
        try:
            try:
                self._ops.truncate(fd, 0)
                self._ops.write(fd, encode_snapshot_file(snapshot), 0)
                self._ops.sync(fd)
            finally:
                self._ops.close(fd)
            self._ops.replace(tmp, final)
        except OSError:
            self._ops.unlink(tmp)  # the old snapshot stays; a partial temp file only holds space
            raise
        self._ops.sync_dir(self.dir)
        old, self._snapshot = self._snapshot, snapshot
        if old.index:
            self._ops.unlink(self.dir / snapshot_name(old.index))

    def _install(self, snapshot: Snapshot) -> None:
        """Replace the whole log by a snapshot received from the leader."""
        self._write_snapshot(snapshot)
        self._close_active()
        for seg in self._segments:
            self._ops.unlink(seg.path)
        self._segments = []
        self._ops.sync_dir(self.dir)  # the old log is gone before a new one starts
        self._new_segment(snapshot.index + 1)

    def _truncate(self, index: int, *, sync: bool) -> None:
        if index > self.last_index:
            return
        if index <= self._snapshot.index:
            raise StorageError(f"cannot truncate at {index}: compacted into the snapshot")
        keep = [s for s in self._segments if s.first_index <= index]
        doomed = self._segments[len(keep) :]
        if doomed:
            self._close_active()
            for seg in doomed:  # later segments go first: a crash leaves a prefix
                self._ops.unlink(seg.path)
            self._ops.sync_dir(self.dir)
            self._segments = keep
            self._open_active()
        seg = self._segments[-1]
        count = index - seg.first_index
        size = seg.positions[count] if count < len(seg.positions) else seg.size
        assert self._active_fd is not None
        self._ops.truncate(self._active_fd, size)
        if sync:
            self._ops.sync(self._active_fd)
        del seg.positions[count:]
        seg.size = size

    def _append(self, entries: tuple[Entry, ...] | list[Entry], *, sync: bool) -> None:
        if entries[0].index != self.last_index + 1:
            raise StorageError(
                f"Raft entry {entries[0].index} does not follow the log end {self.last_index}"
            )
        records = [encode_record(e) for e in entries]
        seg = self._segments[-1]
        if seg.positions and seg.size + sum(map(len, records)) > self.segment_bytes:
            seg = self._new_segment(entries[0].index)
        assert self._active_fd is not None
        positions = []
        pos = seg.size
        for record in records:
            positions.append(pos)
            pos += len(record)
        try:
            self._ops.write(self._active_fd, b"".join(records), seg.size)
        except OSError:
            # ENOSPC mid-write: cut the torn tail now, so the file holds whole entries only
            # and what is in memory matches it (a restart would cut it too).
            try:
                self._ops.truncate(self._active_fd, seg.size)
            except OSError:
                pass
            raise
        seg.positions.extend(positions)
        seg.size = pos
        if sync:
            self._ops.sync(self._active_fd)

    def _new_segment(self, first_index: int) -> _Segment:
        self._close_active()
        seg = _Segment(first_index, self.dir / segment_name(first_index))
        self._active_fd = self._ops.open(seg.path)
        self._ops.truncate(self._active_fd, 0)
        self._ops.sync_dir(self.dir)
        self._segments.append(seg)
        return seg

    def _open_active(self) -> None:
        if self._active_fd is None:
            self._active_fd = self._ops.open(self._segments[-1].path)

    def _close_active(self) -> None:
        if self._active_fd is not None:
            self._ops.close(self._active_fd)
            self._active_fd = None


def open_storage(directory: str | Path, **options: object) -> tuple[RaftStorage, PersistentState]:
    """Open (or create) the store in ``directory`` and return it with what it holds."""
    storage = RaftStorage(directory, **options)  # type: ignore[arg-type]
    return storage, storage.load()
