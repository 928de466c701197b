"""How one closed segment becomes objects in the remote store, and back.

Each file of a segment is one object, named as Aiven's tiered-storage plugin names
them so an operator finds them the same way:

    {topic}-{topic_id}/{partition}/{base_offset:020d}-{segment_id}.{suffix}

with suffixes ``log``, ``index``, ``timeindex``, ``txnindex`` (only when the segment
has aborted transactions), ``snapshot`` (the producer snapshot at the segment's end,
when there is one), ``epochs`` (its leader-epoch entries) and ``manifest``. The
manifest is written last, so its presence means the copy is complete; it holds the
xxh3-64 of every ``chunk_size`` chunk of the ``.log`` (a reader verifies each chunk it
fetches before using it) and the size and xxh3-64 of every other object, and the
manifest's own checksum goes into the segment's metadata (``RemoteSegment.checksum``),
so a corrupted or truncated object is never served.
"""

from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import xxhash

from logmq.errors import ErrorCode
from logmq.storage.index import OffsetIndex, TimeIndex
from logmq.storage.remote.rate_limit import ByteRateLimiter
from logmq.storage.remote.segment_metadata import RemoteSegment
from logmq.storage.remote.store import RemoteStorageError, RemoteStore
from logmq.storage.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, segment_name
from logmq.storage.txn_index import TXN_INDEX_SUFFIX

LOG, INDEX, TIME_INDEX, TXN_INDEX = "log", "index", "timeindex", "txnindex"
PRODUCER_SNAPSHOT, LEADER_EPOCHS, MANIFEST = "snapshot", "epochs", "manifest"
SUFFIXES = (LOG, INDEX, TIME_INDEX, TXN_INDEX, PRODUCER_SNAPSHOT, LEADER_EPOCHS, MANIFEST)
# the objects besides the .log that a manifest lists (size and checksum each)
SIDE_FILES = frozenset({INDEX, TIME_INDEX, TXN_INDEX, PRODUCER_SNAPSHOT, LEADER_EPOCHS})

MANIFEST_VERSION = 1
DEFAULT_CHUNK_SIZE = 4 << 20  # Aiven's default chunk size
MIN_CHUNK_SIZE = 16
MAX_CHUNK_SIZE = 1 << 30
MAX_CHUNKS = 1 << 20  # a manifest lists at most this many chunks
MAX_LOG_SIZE = (1 << 31) - 1  # segment.bytes is an int31 (index positions are u32)
MAX_SIDE_FILE_SIZE = 1 << 31
MAX_MANIFEST_BYTES = 32 << 20  # MAX_CHUNKS checksums of 16 hex digits, and some slack
MAX_EPOCH_ENTRIES = 1 << 16
MAX_EPOCHS_BYTES = 1 << 21
MAX_SEGMENT_ID = 64
INT64_MAX = (1 << 63) - 1

_HEX64 = re.compile(r"[0-9a-f]{16}")


class RemoteCorruptionError(RemoteStorageError):
    """An object does not match its manifest (or the manifest its metadata): its bytes
    are never served. Not retriable: reading the same object again gives the same bytes."""

    code = ErrorCode.STORAGE_ERROR  # Kafka answers a remote read failure KAFKA_STORAGE_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False)


def checksum(data: bytes | bytearray | memoryview) -> str:
    """The xxh3-64 hex digest every remote object is checked with."""
    return xxhash.xxh3_64_hexdigest(data)


def manifest_checksum(data: bytes) -> str:
    """The checksum of a manifest object, kept in ``RemoteSegment.checksum``."""
    return checksum(data)


# -- keys -------------------------------------------------------------------------------


def partition_prefix(topic: str, topic_id: str, partition: int) -> str:
    """The key prefix of every object of one partition (for listing orphans)."""
    return f"{topic}-{topic_id}/{partition}/"


def object_key(topic: str, meta: RemoteSegment, suffix: str) -> str:
    """The key of one of a segment's objects."""
    if suffix not in SUFFIXES:
        raise ValueError(f"unknown remote segment file suffix {suffix!r}")
    prefix = partition_prefix(topic, meta.topic_id, meta.partition)
    return f"{prefix}{meta.base_offset:020d}-{meta.segment_id}.{suffix}"


# -- the manifest -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileEntry:
    size: int
    checksum: str


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a copied segment holds and the checksums that prove it."""

    segment_id: str
    base_offset: int
    end_offset: int  # the segment's last offset (inclusive)
    chunk_size: int
    log_size: int
    chunks: tuple[str, ...]  # xxh3-64 hex of each chunk of the .log
    files: dict[str, FileEntry] = field(default_factory=dict)  # suffix -> size, checksum

    @property
    def chunk_count(self) -> int:
        return len(self.chunks)

    def chunk_range(self, k: int) -> tuple[int, int]:
        """The byte range [start, end) of chunk ``k`` of the .log."""
        start = k * self.chunk_size
        return start, min(start + self.chunk_size, self.log_size)

    def to_bytes(self) -> bytes:
        doc = {
            "version": MANIFEST_VERSION,
            "segment_id": self.segment_id,
            "base_offset": self.base_offset,
            "end_offset": self.end_offset,
            "chunk_size": self.chunk_size,
            "log_size": self.log_size,
            "chunks": list(self.chunks),
            "files": {k: [e.size, e.checksum] for k, e in sorted(self.files.items())},
        }
        return msgpack.packb(doc)

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Parse and check a manifest; RemoteCorruptionError for anything malformed."""
        if len(data) > MAX_MANIFEST_BYTES:
            raise RemoteCorruptionError(f"manifest of {len(data)} bytes is over the limit")
        try:
            doc = msgpack.unpackb(data, raw=False, strict_map_key=True)
        except Exception as e:  # msgpack raises several kinds for malformed input
            raise RemoteCorruptionError(f"manifest is not msgpack: {e}") from None
        if not isinstance(doc, dict):
            raise RemoteCorruptionError("manifest is not a map")
        version = _int(doc, "version", 0, 1 << 16)
        if version != MANIFEST_VERSION:
            raise RemoteCorruptionError(f"unknown manifest version {version}")
        segment_id = doc.get("segment_id")
        if not isinstance(segment_id, str) or not 0 < len(segment_id) <= MAX_SEGMENT_ID:
            raise RemoteCorruptionError("manifest segment_id is not a short string")
        base = _int(doc, "base_offset", 0, INT64_MAX)
        end = _int(doc, "end_offset", base, INT64_MAX)
        chunk_size = _int(doc, "chunk_size", MIN_CHUNK_SIZE, MAX_CHUNK_SIZE)
        log_size = _int(doc, "log_size", 0, MAX_LOG_SIZE)
        chunks = doc.get("chunks")
        if not isinstance(chunks, list) or len(chunks) != math.ceil(log_size / chunk_size):
            raise RemoteCorruptionError("manifest chunk list does not cover the log size")
        for c in chunks:
            _check_hex(c, "chunk checksum")
        raw_files = doc.get("files")
        if not isinstance(raw_files, dict):
            raise RemoteCorruptionError("manifest files is not a map")
        files: dict[str, FileEntry] = {}
        for name, entry in raw_files.items():
            if name not in SIDE_FILES:
                raise RemoteCorruptionError(f"manifest lists an unknown file {name!r}")
            if not (isinstance(entry, list) and len(entry) == 2):
                raise RemoteCorruptionError(f"manifest entry of {name!r} is not [size, checksum]")
            size, digest = entry
            if type(size) is not int or not 0 <= size <= MAX_SIDE_FILE_SIZE:
                raise RemoteCorruptionError(f"manifest size of {name!r} is out of range")
            _check_hex(digest, f"checksum of {name!r}")
            files[name] = FileEntry(size, digest)
        return cls(segment_id, base, end, chunk_size, log_size, tuple(chunks), files)


def _int(doc: dict[str, Any], name: str, lo: int, hi: int) -> int:
    v = doc.get(name)
    if type(v) is not int or not lo <= v <= hi:
        raise RemoteCorruptionError(f"manifest {name} {v!r} is not an integer in [{lo}, {hi}]")
    return v


def _check_hex(v: Any, what: str) -> None:
    if not isinstance(v, str) or not _HEX64.fullmatch(v):
        raise RemoteCorruptionError(f"manifest {what} is not 16 hex digits")


# -- leader epochs ----------------------------------------------------------------------


def encode_leader_epochs(entries: tuple[tuple[int, int], ...]) -> bytes:
    """The segment's (epoch, start offset) entries, in the leader-epoch checkpoint's
    text format (version, count, then one ``epoch start`` line each)."""
    lines = ["0", str(len(entries)), *(f"{e} {s}" for e, s in entries)]
    return ("\n".join(lines) + "\n").encode()


def decode_leader_epochs(data: bytes) -> tuple[tuple[int, int], ...]:
    """Parse ``encode_leader_epochs``; RemoteCorruptionError when malformed."""
    if len(data) > MAX_EPOCHS_BYTES:
        raise RemoteCorruptionError(f"leader epochs of {len(data)} bytes are over the limit")
    try:
        lines = data.decode("ascii").splitlines()
        if len(lines) < 2 or lines[0] != "0":
            raise ValueError("not a version 0 leader-epoch file")
        count = int(lines[1])
        if not 0 <= count <= MAX_EPOCH_ENTRIES or len(lines) != count + 2:
            raise ValueError(f"count {count} does not match {len(lines) - 2} entries")
        out: list[tuple[int, int]] = []
        for line in lines[2:]:
            e_text, s_text = line.split(" ")
            e, s = int(e_text), int(s_text)
            if e < 0 or s < 0 or (out and (e <= out[-1][0] or s <= out[-1][1])):
                raise ValueError(f"entry {line!r} does not follow {out[-1] if out else None}")
            out.append((e, s))
    except (UnicodeDecodeError, ValueError) as e:
        raise RemoteCorruptionError(f"malformed leader epochs: {e}") from None
    return tuple(out)


# -- copying ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SegmentFiles:
    """A closed local segment's files, as the copier hands them over."""

    log_path: Path
    offset_index_path: Path
    time_index_path: Path
    txn_index_path: Path | None
    producer_snapshot: bytes | None  # the snapshot at the segment's next offset, if any
    leader_epochs: tuple[tuple[int, int], ...]  # (epoch, start offset) within the segment


def hash_chunks(path: str | Path, chunk_size: int) -> tuple[int, list[str]]:
    """The size of the file and the checksum of each of its chunks, reading it once.
    Blocking: run it in a worker thread."""
    out: list[str] = []
    size = 0
    with open(path, "rb") as f:
        while data := f.read(chunk_size):
            out.append(checksum(data))
            size += len(data)
    return size, out


def index_bytes(path: Path, kind: type[OffsetIndex] | type[TimeIndex], base_offset: int) -> bytes:
    """An index file's valid entries: a rolled segment's index is trimmed to them
    (``_Index.trim``), but a file preallocated by an earlier version ends in zeros, which
    the index's own open finds and leaves out. No file: no entries. Blocking."""
    if not path.exists():
        return b""
    idx = kind(path, base_offset, 64, writable=False)
    try:
        n = idx.entries * idx.width
    finally:
        idx.close()
    with open(path, "rb") as f:
        data = f.read(n)
    if len(data) != n:
        raise RemoteStorageError(f"{path} shrank while being read", retriable=True)
    return data


def _side_files(meta: RemoteSegment, files: SegmentFiles, log_size: int) -> dict[str, bytes]:
    """Every object but the .log, in memory (indexes are small). Blocking."""
    offsets = index_bytes(files.offset_index_path, OffsetIndex, meta.base_offset)
    if offsets:
        last_pos = OffsetIndex.ENTRY.unpack_from(offsets, len(offsets) - OffsetIndex.ENTRY.size)[1]
        if last_pos >= log_size:
            raise RemoteStorageError(
                f"{files.offset_index_path}: last entry points past the log end", retriable=False
            )
    out = {
        INDEX: offsets,
        TIME_INDEX: index_bytes(files.time_index_path, TimeIndex, meta.base_offset),
        LEADER_EPOCHS: encode_leader_epochs(files.leader_epochs),
    }
    if files.txn_index_path is not None and files.txn_index_path.exists():
        with open(files.txn_index_path, "rb") as f:
            txn = f.read()
        if txn:
            out[TXN_INDEX] = txn
    if files.producer_snapshot is not None:
        out[PRODUCER_SNAPSHOT] = files.producer_snapshot
    return out


async def copy_segment(
    store: RemoteStore,
    topic: str,
    meta: RemoteSegment,
    files: SegmentFiles,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    rate_limiter: ByteRateLimiter | None = None,
) -> tuple[Manifest, str]:
    """Upload a closed segment's objects, the manifest last; returns the manifest and
    its checksum (for ``RemoteSegment.with_state(COPY_FINISHED, checksum=...)``).

    Keys carry ``meta.segment_id``, fresh per attempt, so a failed copy leaves objects
    that no retry overwrites and the orphan sweep deletes (``delete_segment``).
    """
    if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
        raise ValueError(f"chunk size {chunk_size} outside [{MIN_CHUNK_SIZE}, {MAX_CHUNK_SIZE}]")
    if math.ceil(meta.size_bytes / chunk_size) > MAX_CHUNKS:
        raise ValueError(f"chunk size {chunk_size} makes over {MAX_CHUNKS} chunks")
    log_size, chunks = await asyncio.to_thread(hash_chunks, files.log_path, chunk_size)
    if log_size != meta.size_bytes:
        raise RemoteStorageError(
            f"{files.log_path} holds {log_size} bytes, its metadata says {meta.size_bytes}",
            retriable=False,
        )
    side = await asyncio.to_thread(_side_files, meta, files, log_size)

    async def put_log() -> None:
        if rate_limiter is not None:
            await rate_limiter.acquire(log_size)
        sent = await store.put_file(object_key(topic, meta, LOG), files.log_path)
        if sent != log_size:
            raise RemoteStorageError(
                f"{files.log_path} changed during its upload ({sent} of {log_size} bytes)"
            )

    async def put_side(suffix: str, data: bytes) -> None:
        if rate_limiter is not None:
            await rate_limiter.acquire(len(data))
        await store.put_bytes(object_key(topic, meta, suffix), data)

    try:
        async with asyncio.TaskGroup() as tg:  # a failure cancels the other uploads
            tg.create_task(put_log())
            for suffix, data in side.items():
                tg.create_task(put_side(suffix, data))
    except ExceptionGroup as group:
        raise _first_error(group) from None
    manifest = Manifest(
        segment_id=meta.segment_id,
        base_offset=meta.base_offset,
        end_offset=meta.end_offset,
        chunk_size=chunk_size,
        log_size=log_size,
        chunks=tuple(chunks),
        files={k: FileEntry(len(v), checksum(v)) for k, v in side.items()},
    )
    raw = manifest.to_bytes()
    await store.put_bytes(object_key(topic, meta, MANIFEST), raw)
    return manifest, manifest_checksum(raw)


def _first_error(group: BaseExceptionGroup) -> BaseException:
    """The error a caller of ``copy_segment`` sees: the uploads' first (a store's
    RemoteStorageError, not the TaskGroup's wrapper, so retriable stays readable)."""
    first = group.exceptions[0]
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    if not isinstance(first, RemoteStorageError) and isinstance(first, Exception):
        err = RemoteStorageError(f"remote copy failed: {first!r}")
        err.__cause__ = first
        return err
    return first


async def delete_segment(store: RemoteStore, topic: str, meta: RemoteSegment) -> None:
    """Delete every object a copy of ``meta`` may have written (idempotent: missing
    keys are no error, so a retried or orphan delete is the same call). The manifest
    goes first: a half-deleted segment then no longer looks complete."""
    await store.delete([object_key(topic, meta, MANIFEST)])
    await store.delete([object_key(topic, meta, s) for s in SUFFIXES if s != MANIFEST])


def local_segment_files(
    log_dir: str | Path,
    base_offset: int,
    *,
    producer_snapshot: bytes | None,
    leader_epochs: tuple[tuple[int, int], ...],
) -> SegmentFiles:
    """The files of the local segment at ``base_offset`` (named as segment.py names them)."""
    d = Path(log_dir)
    return SegmentFiles(
        log_path=d / segment_name(base_offset, LOG_SUFFIX),
        offset_index_path=d / segment_name(base_offset, INDEX_SUFFIX),
        time_index_path=d / segment_name(base_offset, TIME_INDEX_SUFFIX),
        txn_index_path=d / segment_name(base_offset, TXN_INDEX_SUFFIX),
        producer_snapshot=producer_snapshot,
        leader_epochs=leader_epochs,
    )
