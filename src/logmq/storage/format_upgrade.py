"""Upgrading a data directory from batch format 1 (logmq's own) to 2 (Kafka's RecordBatch v2).

Up to format 1 logmq stored its own batches ("magic 1": a 65-byte header, an xxh3-64
checksum, msgpack rows); format 2 is Kafka's RecordBatch v2 (batch.py). The magic byte
sits at offset 16 in both, so the first 17 bytes of a segment tell them apart.

``upgrade_data_dir`` runs when the LogManager starts, before any log opens. The file
``DATA_DIR/log-format`` (``2\\n``) says the directory is already in format 2, so a normal
start costs one small read. Without it, every partition directory is upgraded:

1. Check (no writes): every format-1 segment is read batch by batch, checksummed, and
   its offsets and leader epochs must chain the way recovery requires (an exact chain,
   or increasing offsets in a compacted log). A damaged batch stops the upgrade with a
   FormatUpgradeError naming the file and position, and nothing has been changed.
   The one exception is the tail of the log after an unclean shutdown: damage in the
   last segment at or above the partition's recovery point is what the old recovery
   would have cut, so it is cut here too (logged).
2. Convert, segment by segment: each batch keeps its base offset, offset deltas,
   timestamps, leader epoch, producer fields, attribute bits and codec (the codec id
   renumbered); the records are decoded from msgpack, re-encoded as v2 records and
   checked to decode back to the same rows. The new file is written next to the old one
   (``*.log.v2.tmp``), fsynced, checked as recovery would check it, and renamed over the
   ``.log`` once the segment's ``.index``/``.timeindex`` (byte positions into the old
   file) are durably gone. Each segment's conversion is atomic and idempotent; a crash
   leaves a mix of converted and unconverted segments and the next start continues.
   Records that pass the checksum but do not decode (a writer's bug, not disk damage)
   stop the upgrade here with the same kind of error; their segment is left as it was.
3. Finish: drop the recovery-point checkpoint and the clean-shutdown marker, so that
   every log of the directory then goes through a full recovery scan (which rebuilds
   every index and re-checks every CRC), and write ``log-format``.

A ``log-format.upgrading`` file exists from the first change until step 3 is done, so a
crash after the last segment still leads to step 3. A brand-new data directory (no
format-1 segment at all) just gets the marker.
"""

from __future__ import annotations

import logging
import operator
import os
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import xxhash

from logmq.errors import CorruptRecordError, LogMQError, StorageError, storage_error_for
from logmq.storage import batch as b
from logmq.storage import checkpoint as ckpt
from logmq.storage import records_codec, segment_swap
from logmq.storage.compaction import CLEANER_CHECKPOINT
from logmq.storage.compression import InflateLimitError
from logmq.storage.partition_log import parse_dir_name
from logmq.storage.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, segment_name
from logmq.storage.verify import RecoveryScan

log = logging.getLogger(__name__)

FORMAT_FILE = "log-format"
UPGRADING_FILE = "log-format.upgrading"
FORMAT_VERSION = 2
TMP_SUFFIX = ".v2.tmp"  # "<base>.log.v2.tmp": PartitionLog removes leftover *.tmp files

# Format 1 header: base_offset, batch_length, leader_epoch, magic, checksum u64 (xxh3-64 of
# bytes 25..end), attributes, last_offset_delta, first_timestamp, max_timestamp,
# producer_id, producer_epoch, base_sequence, record_count. Same fields, same order as
# b.BatchHeader, so it parses into one.
V1_HEADER = struct.Struct(">qiibQhiqqqhii")
V1_HEADER_SIZE = V1_HEADER.size  # 65
V1_MAGIC = 1
_V1_CHECKSUM_START = 25
# Format 1 codec ids -> Kafka's.
V1_CODECS = {
    0: b.Compression.NONE,
    1: b.Compression.GZIP,
    2: b.Compression.ZSTD,
    3: b.Compression.LZ4,
}
_MAGIC_POS = b.MAGIC_POS
_READ_CHUNK = 4 << 20
_WRITE_CHUNK = 4 << 20


_HINT = (
    "The upgrade stopped before rewriting any segment. Damage above the recovery point "
    "after an unclean shutdown is cut by the recovery of the previous logmq version: start "
    "it once, stop it cleanly, then upgrade. Otherwise restore the partition from a replica "
    "(or remove its directory) first."
)
_RESUMED_HINT = (
    "Segments converted by an earlier, interrupted upgrade stay converted (the previous "
    "logmq version cannot read them): restore the partition from a replica (or remove its "
    "directory) first."
)


class FormatUpgradeError(StorageError):
    """The data directory cannot be upgraded as it is; the message names file and position."""


@dataclass(slots=True)
class UpgradeStats:
    partitions: int = 0  # partition directories that held format-1 segments
    segments: int = 0  # segments rewritten
    batches: int = 0
    records: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    cut_bytes: int = 0  # torn tails cut (after an unclean shutdown)
    seconds: float = 0.0


@dataclass(slots=True)
class _Segment:
    path: Path
    base: int
    keep: int  # bytes of the format-1 file to convert: less than its size cuts a tail
    batches: int


@dataclass(slots=True)
class _Partition:
    dir: Path
    allow_gaps: bool
    segments: list[_Segment] = field(default_factory=list)


# Control flow inside this module only (the scan stops at the damage and reports it as
# FormatUpgradeError): never raised to a caller, so outside the LogMQError tree.
class _Damage(Exception):
    def __init__(self, pos: int, expect: int, reason: str) -> None:
        super().__init__(reason)
        self.pos, self.expect, self.reason = pos, expect, reason


def _never(topic: str) -> bool:
    return False


# -- the marker -------------------------------------------------------------------------------


def data_dir_format(data_dir: str | Path) -> int | None:
    """The format ``log-format`` records, None without the file."""
    path = Path(data_dir) / FORMAT_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return int(text.strip())
    except ValueError:
        raise StorageError(f"malformed {path}: {text[:40]!r}") from None


def mark_current(data_dir: str | Path) -> None:
    ckpt.atomic_write(Path(data_dir) / FORMAT_FILE, f"{FORMAT_VERSION}\n".encode())


# -- one batch --------------------------------------------------------------------------------


def validate_v1(buf: Any, pos: int = 0, end: int | None = None) -> b.BatchHeader:
    """Check one format-1 batch as the format-1 broker did (header and xxh3 checksum)."""
    limit = len(buf) if end is None else end
    avail = limit - pos
    if avail < V1_HEADER_SIZE:
        raise CorruptRecordError(f"truncated batch header: {avail} of {V1_HEADER_SIZE} bytes")
    h = b.BatchHeader(*V1_HEADER.unpack_from(buf, pos))
    size = h.batch_length + b.LOG_OVERHEAD
    if h.batch_length < V1_HEADER_SIZE - b.LOG_OVERHEAD or size > b.MAX_BATCH_SIZE:
        raise CorruptRecordError(f"invalid batch length {h.batch_length}")
    if size > avail:
        raise CorruptRecordError(f"truncated batch: {avail} of {size} bytes")
    if h.magic != V1_MAGIC:
        raise CorruptRecordError(f"batch format {h.magic} where format {V1_MAGIC} was expected")
    if h.record_count <= 0:
        raise CorruptRecordError(f"invalid record count {h.record_count}")
    if h.last_offset_delta < h.record_count - 1:
        raise CorruptRecordError(
            f"last offset delta {h.last_offset_delta} does not fit {h.record_count} records"
        )
    if h.compression not in V1_CODECS:
        raise CorruptRecordError(f"unknown format-1 compression codec {h.compression}")
    digest = xxhash.xxh3_64_intdigest(memoryview(buf)[pos + _V1_CHECKSUM_START : pos + size])
    if digest != h.checksum:
        raise CorruptRecordError("checksum mismatch (xxh3-64)")
    return h


def _convert(batch: Any, h: b.BatchHeader) -> tuple[bytes, int]:
    """The v2 bytes of one validated format-1 batch (``batch`` holds exactly it)."""
    codec = V1_CODECS[h.compression]
    try:
        raw = b.decompress(codec, memoryview(batch)[V1_HEADER_SIZE:], b.inflate_budget(len(batch)))
        rows = msgpack.unpackb(raw, use_list=False, raw=False)
    except InflateLimitError as e:  # a bomb is damage here: these are our own old files
        raise CorruptRecordError(f"cannot decode format-1 records: {e}") from None
    except LogMQError:
        raise
    except Exception as e:  # zlib.error, lz4/zstd errors, msgpack errors, UnicodeDecodeError
        raise CorruptRecordError(f"cannot decode format-1 records: {e}") from None
    if not isinstance(rows, tuple) or len(rows) != h.record_count:
        n = len(rows) if isinstance(rows, tuple) else type(rows).__name__
        raise CorruptRecordError(f"batch says {h.record_count} records, holds {n}")
    try:
        records = records_codec.encode_rows(rows)
        back = records_codec.decode_rows(records, h.record_count)
    except (TypeError, ValueError, OverflowError) as e:
        raise CorruptRecordError(f"format-1 records do not fit format 2: {e}") from None
    # v2 decodes headers as None or a tuple of (str, bytes|None): an empty list is None.
    if back != list(rows) and back != [r if r[4] else (*r[:4], None) for r in rows]:
        raise CorruptRecordError("records do not decode back to the same rows")
    deltas = [r[0] for r in back]
    if deltas[0] < 0 or deltas[-1] > h.last_offset_delta:
        raise CorruptRecordError(
            f"offset deltas {deltas[0]}..{deltas[-1]} outside 0..{h.last_offset_delta}"
        )
    if not all(map(operator.lt, deltas, deltas[1:])):
        raise CorruptRecordError("offset deltas do not increase")
    out = b.assemble(
        records,
        count=h.record_count,
        last_offset_delta=h.last_offset_delta,
        first_timestamp=h.first_timestamp,
        max_timestamp=h.max_timestamp,
        attributes=(h.attributes & ~b.Compression.MASK) | codec,
        base_offset=h.base_offset,
        leader_epoch=h.leader_epoch,
        producer_id=h.producer_id,
        producer_epoch=h.producer_epoch,
        base_sequence=h.base_sequence,
    )
    return out, len(rows)


def convert_batch(buf: Any, pos: int = 0) -> bytes:
    """The format-2 batch for the format-1 batch at ``pos`` (checksummed and decoded)."""
    h = validate_v1(buf, pos)
    return _convert(memoryview(buf)[pos : pos + h.size], h)[0]


# -- one segment ------------------------------------------------------------------------------


def _v1_batches(
    fd: int, size: int, base: int, allow_gaps: bool
) -> Iterator[tuple[int, b.BatchHeader, memoryview]]:
    """(position, header, bytes) of each batch of a format-1 segment, in chunked reads.

    Checks what recovery checks: each batch valid, offsets chaining from ``base`` (or
    only increasing with ``allow_gaps``), leader epochs never decreasing. Raises _Damage
    at the first batch that is not.
    """
    at, expect, epoch = 0, base, -1
    buf, buf_start = b"", 0
    while at < size:
        off = at - buf_start
        rem = len(buf) - off
        need = V1_HEADER_SIZE
        if rem >= b.LOG_OVERHEAD:
            need = max(need, b.peek_size(buf, off))
        if rem < need and need <= b.MAX_BATCH_SIZE and buf_start + len(buf) < size:
            buf, buf_start = os.pread(fd, min(max(_READ_CHUNK, need), size - at), at), at
            continue
        try:
            h = validate_v1(buf, off)
            if h.base_offset < expect if allow_gaps else h.base_offset != expect:
                raise CorruptRecordError(
                    f"batch base offset {h.base_offset} does not follow {expect}"
                )
            if h.leader_epoch < epoch:
                raise CorruptRecordError(f"leader epoch {h.leader_epoch} goes back from {epoch}")
        except CorruptRecordError as e:
            raise _Damage(at, expect, str(e)) from None
        yield at, h, memoryview(buf)[off : off + h.size]
        expect, epoch = h.next_offset, h.leader_epoch
        at += h.size


def _check_segment(
    path: Path, base: int, allow_gaps: bool, tail_from: int | None
) -> tuple[_Segment | None, int]:
    """Plan the conversion of one segment: (plan or None if nothing to do, next offset).

    ``tail_from``: damage at or above this offset is a torn tail to cut (the last segment
    after an unclean shutdown); None: any damage is an error. The next offset is -1 for
    a segment already in format 2.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if not size:
            return None, base  # the same in both formats
        head = os.pread(fd, _MAGIC_POS + 1, 0)
        magic = head[_MAGIC_POS] if len(head) > _MAGIC_POS else None
        if magic == b.MAGIC:
            return None, -1  # converted by an earlier, interrupted upgrade
        nxt, batches = base, 0
        try:
            if magic != V1_MAGIC:
                what = "truncated header" if magic is None else f"unknown batch format {magic}"
                raise _Damage(0, base, what)
            for _, h, _ in _v1_batches(fd, size, base, allow_gaps):
                nxt, batches = h.next_offset, batches + 1
            return _Segment(path, base, size, batches), nxt
        except _Damage as d:
            if tail_from is None or d.expect < tail_from:
                raise FormatUpgradeError(
                    f"cannot upgrade {path} from batch format 1 to 2: damaged batch at "
                    f"position {d.pos}: {d.reason}"
                ) from None
            log.warning(
                "batch format upgrade will cut %d bytes from %s at position %d (offset %d): "
                "%s; recovery would have cut this torn tail",
                size - d.pos,
                path,
                d.pos,
                d.expect,
                d.reason,
            )
            return _Segment(path, base, d.pos, batches), nxt
    finally:
        os.close(fd)


def _write_all(fd: int, parts: list[bytes]) -> None:
    view = memoryview(b"".join(parts))
    while view:
        view = view[os.write(fd, view) :]


def _convert_segment(seg: _Segment, allow_gaps: bool, stats: UpgradeStats) -> None:
    """Rewrite one format-1 segment in format 2, atomically (see the module docstring)."""
    tmp = seg.path.with_name(seg.path.name + TMP_SUFFIX)
    fd = os.open(seg.path, os.O_RDONLY)
    out = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        parts: list[bytes] = []
        pending = written = batches = records = 0
        try:
            for pos, h, data in _v1_batches(fd, seg.keep, seg.base, allow_gaps):
                try:
                    v2, n = _convert(data, h)
                except CorruptRecordError as e:
                    raise FormatUpgradeError(
                        f"cannot upgrade {seg.path} from batch format 1 to 2: batch at "
                        f"position {pos} (offset {h.base_offset}): {e}. This segment was "
                        "not changed."
                    ) from None
                parts.append(v2)
                pending += len(v2)
                batches += 1
                records += n
                if pending >= _WRITE_CHUNK:
                    _write_all(out, parts)
                    written += pending
                    parts, pending = [], 0
        except _Damage as d:  # the file changed since it was checked
            raise FormatUpgradeError(
                f"cannot upgrade {seg.path}: damaged batch at position {d.pos}: {d.reason}"
            ) from None
        _write_all(out, parts)
        written += pending
        ckpt.fsync(out)
        # Check the new file the way recovery will, so recovery finds nothing to cut.
        scan = RecoveryScan(out, written, seg.base, allow_gaps=allow_gaps)
        found = sum(1 for _ in scan)
        if scan.valid != written or found != seg.batches or batches != seg.batches:
            raise FormatUpgradeError(
                f"converting {seg.path} produced an invalid segment ({found} of "
                f"{seg.batches} batches valid: {scan.reason or 'short'}); it was not replaced"
            )
    except BaseException as e:
        os.close(out)
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):  # ENOSPC: the upgrade needs room for one segment copy
            raise storage_error_for(e, f"upgrading {seg.path} to batch format 2") from e
        raise
    else:
        os.close(out)
    finally:
        os.close(fd)
    # The indexes hold positions into the old file: they go (durably) before the new
    # file takes its name. A crash in between leaves the old file without indexes.
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        (seg.path.parent / segment_name(seg.base, suffix)).unlink(missing_ok=True)
    ckpt.fsync_dir(seg.path.parent)
    os.replace(tmp, seg.path)
    ckpt.fsync_dir(seg.path.parent)
    stats.segments += 1
    stats.batches += batches
    stats.records += records
    stats.bytes_in += seg.keep
    stats.bytes_out += written


# -- the data directory -----------------------------------------------------------------------


def _check_partition(pdir: Path, allow_gaps: bool, tail_from: int | None) -> _Partition | None:
    """Plan a partition's upgrade (None: nothing in format 1); raises on damage."""
    segment_swap.recover(pdir)  # what opening the log does first: no .swap/.cleaned left
    bases = sorted(
        int(n[:20]) for n in os.listdir(pdir) if n.endswith(LOG_SUFFIX) and n[:20].isdigit()
    )
    part = _Partition(pdir, allow_gaps)
    prev_next = -1
    found_v1 = False
    for i, base in enumerate(bases):
        path = pdir / segment_name(base, LOG_SUFFIX)
        last = i == len(bases) - 1
        if prev_next >= 0 and (prev_next > base if allow_gaps else prev_next != base):
            raise FormatUpgradeError(
                f"cannot upgrade {pdir} from batch format 1 to 2: the segment before {path.name}"
                f" ends at offset {prev_next}, which does not lead to {base} (recovery would "
                "drop the later segments)"
            )
        plan, prev_next = _check_segment(path, base, allow_gaps, tail_from if last else None)
        if plan is not None:
            part.segments.append(plan)
            found_v1 = True
    return part if found_v1 else None


def upgrade_data_dir(
    data_dir: str | Path, *, compacted: Callable[[str], bool] = _never
) -> UpgradeStats | None:
    """Bring ``data_dir`` to batch format 2; None when it already was (the usual case).

    ``compacted(topic)``: whether the topic's cleanup.policy includes compact, which
    makes recovery (and so this check) accept gaps between batch offsets. Raises
    FormatUpgradeError, with nothing of a damaged segment changed, when a format-1 batch
    is damaged anywhere but in a torn tail.
    """
    from logmq.storage import log_manager as lm  # it imports this module

    data_dir = Path(data_dir)
    fmt = data_dir_format(data_dir)
    if fmt == FORMAT_VERSION:
        return None
    if fmt is not None:
        raise StorageError(
            f"{data_dir / FORMAT_FILE} says batch format {fmt}; this logmq knows formats "
            f"1 and {FORMAT_VERSION}"
        )
    started = time.monotonic()
    in_progress = (data_dir / UPGRADING_FILE).exists()
    clean = (data_dir / lm.CLEAN_SHUTDOWN).exists()
    rps = ckpt.read_offsets(data_dir / lm.RECOVERY_POINT_CHECKPOINT)
    parts: list[_Partition] = []
    for entry in sorted(os.scandir(data_dir), key=lambda e: e.name):
        if not entry.is_dir() or entry.name.endswith(lm.DELETE_SUFFIX):
            continue
        try:
            key = parse_dir_name(entry.name)
        except ValueError:
            continue
        pdir = Path(entry.path)
        gaps = compacted(key[0]) or (pdir / CLEANER_CHECKPOINT).exists()
        # After a crash, damage in the unflushed tail is what recovery always cut.
        tail_from = None if clean else rps.get(key, -1)
        try:
            part = _check_partition(pdir, gaps, tail_from)
        except FormatUpgradeError as e:
            raise FormatUpgradeError(f"{e}. {_RESUMED_HINT if in_progress else _HINT}") from None
        if part is not None:
            parts.append(part)
    if not parts and not in_progress:
        mark_current(data_dir)  # a new data directory, or one format 1 never wrote to
        return None
    stats = UpgradeStats(partitions=len(parts))
    total = sum(len(p.segments) for p in parts)
    log.info(
        "upgrading %s from batch format 1 to 2: %d segments in %d partitions",
        data_dir,
        total,
        len(parts),
    )
    ckpt.atomic_write(data_dir / UPGRADING_FILE, b"1 2\n")
    for part in parts:
        for seg in part.segments:
            path_size = os.stat(seg.path).st_size
            stats.cut_bytes += path_size - seg.keep
            _convert_segment(seg, part.allow_gaps, stats)
    # Every log of the directory now gets a full recovery scan at open: indexes rebuilt
    # from the new files, every CRC checked once.
    (data_dir / lm.RECOVERY_POINT_CHECKPOINT).unlink(missing_ok=True)
    (data_dir / lm.CLEAN_SHUTDOWN).unlink(missing_ok=True)
    ckpt.fsync_dir(data_dir)
    mark_current(data_dir)
    (data_dir / UPGRADING_FILE).unlink(missing_ok=True)
    ckpt.fsync_dir(data_dir)
    stats.seconds = time.monotonic() - started
    log.info(
        "upgraded %s from batch format 1 to 2 in %.2f s: %d segments, %d batches, "
        "%d records in %d partitions (%d -> %d bytes, %d torn-tail bytes cut)",
        data_dir,
        stats.seconds,
        stats.segments,
        stats.batches,
        stats.records,
        stats.partitions,
        stats.bytes_in,
        stats.bytes_out,
        stats.cut_bytes,
    )
    return stats
