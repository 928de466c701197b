"""Upgrading a data directory written in batch format 1 (logmq's own) to Kafka's v2.

The format-1 bytes are made here from the old spec (msgpack rows, xxh3-64, the old codec
ids), not with the code under test, and read back through a LogManager.
"""

from __future__ import annotations

import errno
import re
import struct
import zlib
from pathlib import Path

import lz4.frame
import msgpack
import pytest
import xxhash
import zstandard

from logmq.errors import CorruptRecordError, DiskFullError, StorageError
from logmq.storage import batch as b
from logmq.storage import format_upgrade as fu
from logmq.storage.checkpoint import read_offsets, write_offsets
from logmq.storage.log_manager import CLEAN_SHUTDOWN, RECOVERY_POINT_CHECKPOINT, LogManager

V1 = struct.Struct(">qiibQhiqqqhii")
OLD_NONE, OLD_GZIP, OLD_ZSTD, OLD_LZ4 = 0, 1, 2, 3
NEW_CODEC = {OLD_NONE: 0, OLD_GZIP: 1, OLD_ZSTD: 4, OLD_LZ4: 3}
SMALL_INDEX = {"index.interval.bytes": "200"}


def v1_compress(codec: int, data: bytes) -> bytes:
    if codec == OLD_GZIP:
        c = zlib.compressobj(6, zlib.DEFLATED, 31)
        return c.compress(data) + c.flush()
    if codec == OLD_ZSTD:
        return zstandard.ZstdCompressor(level=3).compress(data)
    if codec == OLD_LZ4:
        return lz4.frame.compress(data)
    return data


def v1_batch(
    rows,
    *,
    base: int,
    first_ts: int,
    codec: int = OLD_NONE,
    attrs: int = 0,
    epoch: int = 0,
    pid: int = -1,
    pepoch: int = -1,
    seq: int = -1,
    last_delta: int | None = None,
    max_ts: int | None = None,
) -> bytes:
    """A format-1 batch, straight from the old spec."""
    payload = v1_compress(codec, msgpack.packb([list(r) for r in rows], use_bin_type=True))
    out = bytearray(65 + len(payload))
    V1.pack_into(
        out,
        0,
        base,
        len(out) - 12,
        epoch,
        1,
        0,
        attrs | codec,
        rows[-1][0] if last_delta is None else last_delta,
        first_ts,
        first_ts + max(r[1] for r in rows) if max_ts is None else max_ts,
        pid,
        pepoch,
        seq,
        len(rows),
    )
    out[65:] = payload
    struct.pack_into(">Q", out, 17, xxhash.xxh3_64_intdigest(memoryview(out)[25:]))
    return bytes(out)


def rows_of(n: int, tag: str, *, ts_step: int = 1, headers: bool = False):
    return [
        [
            i,
            i * ts_step,
            f"k{i}".encode() if i % 3 else None,
            f"{tag}:{i}".encode() * 3,
            [["h", f"{i}".encode()], ["nil", None]] if headers and i % 2 else None,
        ]
        for i in range(n)
    ]


class V1Dir:
    """A format-1 data directory plus what every batch must read back as."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.expected: dict[str, list] = {}  # partition dir -> [(fields, rows)] per batch
        self.segments: dict[str, list[Path]] = {}
        root.mkdir(parents=True, exist_ok=True)

    def segment(self, part: str, base: int, batches: list[tuple[bytes, list]]) -> Path:
        d = self.root / part
        d.mkdir(exist_ok=True)
        path = d / f"{base:020d}.log"
        path.write_bytes(b"".join(data for data, _ in batches))
        # Stale indexes from format 1: positions into the old file.
        (d / f"{base:020d}.index").write_bytes(struct.pack(">II", 1, 65) * 2)
        (d / f"{base:020d}.timeindex").write_bytes(struct.pack(">qI", 10, 1))
        self.segments.setdefault(part, []).append(path)
        for data, rows in batches:
            h = b.BatchHeader(*V1.unpack_from(data))
            fields = (
                h.base_offset,
                h.leader_epoch,
                (h.attributes & ~7) | NEW_CODEC[h.attributes & 7],
                h.last_offset_delta,
                h.first_timestamp,
                h.max_timestamp,
                h.producer_id,
                h.producer_epoch,
                h.base_sequence,
                h.record_count,
            )
            norm = [
                (r[0], r[1], r[2], r[3], tuple(tuple(x) for x in r[4]) if r[4] else None)
                for r in rows
            ]
            self.expected.setdefault(part, []).append((fields, norm))
        return path


def batch(rows, **kw) -> tuple[bytes, list]:
    return v1_batch(rows, **kw), rows


def build(root: Path, *, torn_tail: bool = True) -> V1Dir:
    """orders-0: three segments (every codec, producer fields, epochs, flags, a torn tail);
    compacted-0: gaps and a delete horizon; empty-0: one empty segment."""
    d = V1Dir(root)
    d.segment(
        "orders-0",
        0,
        [
            batch(rows_of(3, "a", headers=True), base=0, first_ts=1000),
            batch(rows_of(5, "b"), base=3, first_ts=1010, codec=OLD_GZIP),
            batch(
                rows_of(4, "c"),
                base=8,
                first_ts=1020,
                codec=OLD_ZSTD,
                epoch=1,
                pid=7,
                pepoch=0,
                seq=0,
            ),
            batch(
                rows_of(2, "d"),
                base=12,
                first_ts=1030,
                codec=OLD_LZ4,
                epoch=1,
                pid=7,
                pepoch=0,
                seq=4,
            ),
        ],
    )
    seg1 = []
    off = 14
    for i in range(30):
        codec = (OLD_NONE, OLD_GZIP, OLD_ZSTD, OLD_LZ4)[i % 4]
        attrs = 0
        kw = {}
        if i == 10:
            attrs = b.ATTR_TRANSACTIONAL
            kw = {"pid": 9, "pepoch": 2, "seq": 0}
        elif i == 20:
            attrs = b.ATTR_LOG_APPEND_TIME
            kw = {"max_ts": 2205}  # the broker's clock
        seg1.append(
            batch(
                rows_of(2, f"s{i}", headers=i % 5 == 0),
                base=off,
                first_ts=2000 + 10 * i,
                codec=codec,
                attrs=attrs,
                epoch=2,
                **kw,
            )
        )
        off += 2
    d.segment("orders-0", 14, seg1)
    last = [
        batch(rows_of(3, f"t{i}"), base=74 + 3 * i, first_ts=9000 + i, epoch=3) for i in range(4)
    ]
    path = d.segment("orders-0", 74, last)
    if torn_tail:
        torn = v1_batch(rows_of(3, "torn"), base=86, first_ts=9100, epoch=3)
        with open(path, "ab") as f:
            f.write(torn[: len(torn) // 2])
    d.segment(
        "compacted-0",
        0,
        [
            # gaps inside (deltas 0, 2 of 0..3) and between batches (4 -> 6)
            batch(
                [[0, 0, b"x", b"1", None], [2, 5, b"y", b"2", None]],
                base=0,
                first_ts=100,
                last_delta=3,
                codec=OLD_GZIP,
            ),
            # delete horizon: first_timestamp holds it, record deltas go negative
            batch(
                [[1, -4900, b"z", None, None]],
                base=6,
                first_ts=5000,
                last_delta=1,
                attrs=b.ATTR_DELETE_HORIZON,
                max_ts=100,
                codec=OLD_LZ4,
            ),
        ],
    )
    d.segment("compacted-0", 10, [batch(rows_of(2, "c2"), base=12, first_ts=200, codec=OLD_ZSTD)])
    (root / "empty-0").mkdir()
    (root / "empty-0" / f"{0:020d}.log").write_bytes(b"")
    # Recovery points: orders-0 fsynced up to its last segment's base (the torn tail is
    # above it), the others fully.
    write_offsets(
        root / RECOVERY_POINT_CHECKPOINT, {("orders", 0): 74, ("compacted", 0): 14, ("empty", 0): 0}
    )
    return d


def overrides():
    return {"orders": SMALL_INDEX, "compacted": {"cleanup.policy": "compact", **SMALL_INDEX}}


def manager(root: Path) -> LogManager:
    return LogManager(root, topic_overrides=overrides(), cleaner_enabled=False)


def read_batches(plog) -> list:
    """Every batch of a log through its read path, as (fields, rows)."""
    out = []
    offset = plog.log_start_offset
    while offset < plog.log_end_offset:
        sl = plog.read(offset, 150)
        if sl is None:
            break
        data = sl.read()
        for pos, h in b.iter_headers(data):
            b.validate(data, pos, contiguous=False)
            fields = (
                h.base_offset,
                h.leader_epoch,
                h.attributes,
                h.last_offset_delta,
                h.first_timestamp,
                h.max_timestamp,
                h.producer_id,
                h.producer_epoch,
                h.base_sequence,
                h.record_count,
            )
            out.append((fields, b.decode_rows(data, pos, h)))
        offset = sl.end_offset
    return out


def file_state(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def v1_positions(path: Path) -> list[int]:
    data, out, pos = path.read_bytes(), [], 0
    while pos + 65 <= len(data):
        out.append(pos)
        pos += V1.unpack_from(data, pos)[1] + 12
    return [*out, pos]


def magic_of(path: Path) -> int:
    return path.read_bytes()[16]


def assert_fully_recovered(mgr: LogManager, d: V1Dir) -> None:
    """Every segment went through recovery at open: checksummed from its first byte to
    its last (a segment opened lazily has verified nothing before its first read) and
    its indexes rebuilt from the new file."""
    assert not (mgr.data_dir / RECOVERY_POINT_CHECKPOINT).exists()
    for part, paths in d.segments.items():
        topic, p = part.rsplit("-", 1)
        segs = mgr.get_log(topic, int(p)).segments
        assert [s.log_path for s in segs] == paths
        for seg in segs:
            assert magic_of(seg.log_path) == 2
            assert (seg.verified.starts, seg.verified.ends) == ([0], [seg.size])
            # The old index is gone: rewritten, or (active segment) dropped until the
            # rebuilt in-memory one is written.
            if seg.index_path.exists():
                idx = seg.index_path.read_bytes()
                assert idx != struct.pack(">II", 1, 65) * 2
            else:
                assert seg.active


# -- tests ------------------------------------------------------------------------------------


async def test_upgrade_converts_every_batch(tmp_path, no_fsync, caplog):
    root = tmp_path / "data"
    d = build(root)
    caplog.set_level("INFO", logger="logmq.storage.format_upgrade")
    mgr = manager(root)
    await mgr.start()
    try:
        assert (root / fu.FORMAT_FILE).read_text() == "2\n"
        assert not (root / fu.UPGRADING_FILE).exists()
        assert "5 segments, 41 batches, 91 records in 2 partitions" in caplog.text
        assert "cut" in caplog.text  # the torn tail was logged
        # Forced full recovery: every log recovered, and every segment's indexes were
        # rebuilt eagerly at open (a lazily opened segment would have none yet).
        assert sorted(mgr.recovered_logs) == ["compacted-0", "empty-0", "orders-0"]
        assert_fully_recovered(mgr, d)
        for part in ("orders-0", "compacted-0"):
            topic, p = part.rsplit("-", 1)
            plog = mgr.get_log(topic, int(p))
            assert read_batches(plog) == d.expected[part]
        orders = mgr.get_log("orders", 0)
        assert orders.log_end_offset == 86 and orders.cut_bytes == 0  # the tail was cut before
        assert len(orders.segments) == 3 and orders.segments[1].index.entries > 3
        # Reads from the middle of a segment, and by timestamp, go through the new indexes.
        sl = orders.read(41, 1)
        data = sl.read()
        h = b.validate(data, 0)
        assert h.base_offset == 40 and [r[0] for r in b.decode_records(data)] == [40, 41]
        assert b.decode_records(data)[1][3] == b"s13:1" * 3
        assert orders.offset_for_timestamp(2000 + 10 * 17) == (14 + 2 * 17, 2000 + 10 * 17 + 1)
        assert orders.offset_for_timestamp(9003) == (77, 9003)
        # LogAppendTime keeps its meaning: every record takes the batch's max timestamp.
        sl = orders.read(54, 1)
        assert {r[1] for r in b.decode_records(sl.read())} == {2205}
        # Producer state rebuilt from the converted headers.
        assert orders.producer_state.producers[7].batches[-1].last_seq == 5
        assert orders.producer_state.producers[9].epoch == 2
        assert mgr.get_log("empty", 0).log_end_offset == 0
        compacted = mgr.get_log("compacted", 0)
        assert compacted.log_end_offset == 14 and compacted.offset_for_timestamp(104) == (0, 105)
        info = await mgr.append(orders, b.encode_values([b"new"], timestamp=9999))
        assert info.first_offset == 86
    finally:
        await mgr.stop()

    before = file_state(root)
    assert fu.upgrade_data_dir(root) is None  # a normal start: the marker says 2
    mgr = manager(root)
    await mgr.start()
    assert mgr.recovered_logs == []
    assert read_batches(mgr.get_log("orders", 0))[:-1] == d.expected["orders-0"]
    await mgr.stop()
    after = file_state(root)
    assert {k: v for k, v in after.items() if k.endswith(".log")} == {
        k: v for k, v in before.items() if k.endswith(".log")
    }


async def test_crash_between_segments_completes_at_next_start(tmp_path, no_fsync, monkeypatch):
    root = tmp_path / "data"
    d = build(root)
    real = fu._convert_segment
    calls = []

    class Crash(BaseException):
        pass

    def convert_one(seg, gaps, stats):
        if calls:
            raise Crash
        calls.append(seg.path)
        real(seg, gaps, stats)

    monkeypatch.setattr(fu, "_convert_segment", convert_one)
    with pytest.raises(Crash):
        fu.upgrade_data_dir(root, compacted=lambda t: t == "compacted")
    first, *rest = d.segments["compacted-0"] + d.segments["orders-0"]
    assert calls == [first] and magic_of(first) == 2
    assert all(magic_of(p) == 1 for p in rest)
    assert not first.with_suffix(".index").exists()  # stale positions gone with the old file
    assert (root / fu.UPGRADING_FILE).exists() and not (root / fu.FORMAT_FILE).exists()
    assert read_offsets(root / RECOVERY_POINT_CHECKPOINT)  # untouched until the end
    monkeypatch.setattr(fu, "_convert_segment", real)

    # A second crash after the last segment, before the finish: still completed later.
    real_mark = fu.mark_current
    monkeypatch.setattr(fu, "mark_current", lambda root: (_ for _ in ()).throw(Crash()))
    with pytest.raises(Crash):
        fu.upgrade_data_dir(root, compacted=lambda t: t == "compacted")
    assert all(magic_of(p) == 2 for p in rest)
    monkeypatch.setattr(fu, "mark_current", real_mark)

    mgr = manager(root)
    await mgr.start()
    try:
        assert (root / fu.FORMAT_FILE).read_text() == "2\n"
        assert not (root / fu.UPGRADING_FILE).exists()
        assert sorted(mgr.recovered_logs) == ["compacted-0", "empty-0", "orders-0"]
        for part in ("orders-0", "compacted-0"):
            topic, p = part.rsplit("-", 1)
            assert read_batches(mgr.get_log(topic, int(p))) == d.expected[part]
    finally:
        await mgr.stop()


def _flip(path: Path, pos: int) -> None:
    data = bytearray(path.read_bytes())
    data[pos] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("case", ["middle", "below-recovery-point", "clean-torn-tail", "gap"])
async def test_damage_stops_the_upgrade_and_changes_nothing(tmp_path, no_fsync, case):
    root = tmp_path / "data"
    d = build(root, torn_tail=case == "clean-torn-tail")
    orders = d.segments["orders-0"]
    if case == "middle":
        bad = orders[1]
        pos = v1_positions(bad)[3]  # a payload byte of the 4th batch of a middle segment
        _flip(bad, pos + 70)
    elif case == "below-recovery-point":
        # The last segment, but below the recovery point: fsynced data is damaged.
        write_offsets(root / RECOVERY_POINT_CHECKPOINT, {("orders", 0): 83})
        bad = orders[2]
        pos = v1_positions(bad)[1]
        _flip(bad, pos + 70)
    elif case == "clean-torn-tail":
        (root / CLEAN_SHUTDOWN).write_bytes(b"")  # then nothing can be torn
        bad = orders[2]
        pos = v1_positions(bad)[4]
    else:  # a non-compacted log whose segments do not chain: recovery would drop some
        orders[1].rename(orders[1].with_name(f"{15:020d}.log"))
        bad = pos = None
    before = file_state(root)
    mgr = manager(root)
    with pytest.raises(fu.FormatUpgradeError) as e:
        await mgr.start()
    msg = str(e.value)
    if bad is not None:
        assert str(bad) in msg and f"position {pos}" in msg
    else:
        assert "offset 14" in msg and "00000000000000000015.log" in msg
    assert "stopped before rewriting any segment" in msg
    assert file_state(root) == before
    assert not (root / fu.FORMAT_FILE).exists()


async def test_new_data_dir_gets_the_marker(tmp_path):
    root = tmp_path / "fresh"
    mgr = LogManager(root)
    await mgr.start()
    assert (root / fu.FORMAT_FILE).read_text() == "2\n"
    plog = mgr.create_log("t", 0)
    await mgr.append(plog, b.encode_values([b"v"], timestamp=1))
    await mgr.stop()
    # A format-2 directory without the marker (say, from a build before it existed): no
    # conversion and no forced recovery, the clean shutdown is honoured.
    (root / fu.FORMAT_FILE).unlink()
    mgr = LogManager(root)
    await mgr.start()
    assert mgr.recovered_logs == [] and (root / fu.FORMAT_FILE).exists()
    await mgr.stop()


def test_unknown_format_marker_refuses(tmp_path):
    (tmp_path / fu.FORMAT_FILE).write_text("3\n")
    with pytest.raises(StorageError, match="batch format 3"):
        fu.upgrade_data_dir(tmp_path)


@pytest.mark.parametrize("codec", [OLD_NONE, OLD_GZIP, OLD_ZSTD, OLD_LZ4])
def test_convert_batch_keeps_every_field(codec):
    rows = rows_of(6, "x", headers=True)
    v1 = v1_batch(
        rows,
        base=5,
        first_ts=77,
        codec=codec,
        epoch=4,
        pid=3,
        pepoch=1,
        seq=9,
        attrs=b.ATTR_TRANSACTIONAL,
    )
    v2 = fu.convert_batch(v1)
    h = b.validate(v2)
    assert h.magic == 2 and h.compression == NEW_CODEC[codec]
    assert (h.base_offset, h.leader_epoch, h.producer_id, h.producer_epoch, h.base_sequence) == (
        5,
        4,
        3,
        1,
        9,
    )
    assert h.attributes & ~7 == b.ATTR_TRANSACTIONAL and h.first_timestamp == 77
    recs = b.decode_records(v2)
    assert [(o, ts, k, v) for o, ts, k, v, _ in recs] == [
        (5 + r[0], 77 + r[1], r[2], r[3]) for r in rows
    ]
    assert recs[1][4] == [("h", b"1"), ("nil", None)] and recs[0][4] == []


def test_undecodable_format1_records_are_an_error():
    bad = v1_batch([[0, 0, "a str key", b"v", None]], base=0, first_ts=1)
    with pytest.raises(CorruptRecordError, match="do not fit format 2"):
        fu.convert_batch(bad)
    shuffled = v1_batch(
        [[1, 0, None, b"v", None], [0, 0, None, b"w", None]], base=0, first_ts=1, last_delta=1
    )
    with pytest.raises(CorruptRecordError, match="do not increase"):
        fu.convert_batch(shuffled)


async def test_unwritten_tail_segment_becomes_empty(tmp_path, no_fsync):
    """After a crash the active segment may hold nothing but zeros (pages never written):
    without a recovery point inside it, all of it is a torn tail."""
    root = tmp_path / "data"
    d = V1Dir(root)
    d.segment("t-0", 0, [batch(rows_of(2, "a"), base=0, first_ts=5)])
    (root / "t-0" / f"{2:020d}.log").write_bytes(bytes(300))
    stats = fu.upgrade_data_dir(root)
    assert stats is not None and stats.segments == 2 and stats.cut_bytes == 300
    assert (root / "t-0" / f"{2:020d}.log").stat().st_size == 0
    mgr = manager(root)
    await mgr.start()
    plog = mgr.get_log("t", 0)
    assert plog.log_end_offset == 2 and read_batches(plog) == d.expected["t-0"]
    await mgr.stop()


async def test_records_that_do_not_decode_stop_at_their_segment(tmp_path, no_fsync):
    """A checksummed batch whose rows cannot be format 2 (a writer bug, not disk damage)
    is found while converting: earlier segments stay converted, its own is untouched."""
    root = tmp_path / "data"
    d = V1Dir(root)
    d.segment("t-0", 0, [batch(rows_of(2, "a"), base=0, first_ts=5)])
    bad = d.segment(
        "t-0",
        2,
        [
            batch(rows_of(2, "b"), base=2, first_ts=6),
            batch([[0, 0, "str key", b"v", None]], base=4, first_ts=7),
        ],
    )
    before = bad.read_bytes()
    pos = v1_positions(bad)[1]
    with pytest.raises(
        fu.FormatUpgradeError, match=rf"{re.escape(str(bad))} .*position {pos} \(offset 4\)"
    ):
        await manager(root).start()
    assert bad.read_bytes() == before and bad.with_suffix(".index").exists()
    assert magic_of(d.segments["t-0"][0]) == 2
    assert (root / fu.UPGRADING_FILE).exists() and not (root / fu.FORMAT_FILE).exists()


async def test_clean_format1_dir_is_still_fully_recovered(tmp_path, no_fsync):
    """The clean-shutdown marker and recovery points describe the old files: the upgrade
    drops both, so every converted log is re-validated and re-indexed at open."""
    root = tmp_path / "data"
    d = build(root, torn_tail=False)
    (root / CLEAN_SHUTDOWN).write_bytes(b"")
    mgr = manager(root)
    await mgr.start()
    try:
        assert sorted(mgr.recovered_logs) == ["compacted-0", "empty-0", "orders-0"]
        assert not (root / CLEAN_SHUTDOWN).exists()
        assert_fully_recovered(mgr, d)
        assert read_batches(mgr.get_log("orders", 0)) == d.expected["orders-0"]
    finally:
        await mgr.stop()


def test_full_disk_leaves_the_segment_and_no_temp_file(tmp_path, no_fsync, monkeypatch):
    d = V1Dir(tmp_path)
    path = d.segment("t-0", 0, [batch(rows_of(2, "a"), base=0, first_ts=5)])
    before = path.read_bytes()

    def full(fd, parts):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fu, "_write_all", full)
    with pytest.raises(DiskFullError, match=r"upgrading .*00000000000000000000\.log"):
        fu.upgrade_data_dir(tmp_path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "00000000000000000000.index",
        "00000000000000000000.log",
        "00000000000000000000.timeindex",
    ]


async def test_format1_log_copied_into_a_format2_dir_is_refused_not_cut(tmp_path, no_fsync):
    """A partition dir from an old broker appearing after the upgrade: recovery must not
    take its batches for damage and cut them; the log stays offline, the file intact."""
    root = tmp_path / "data"
    mgr = manager(root)
    await mgr.start()
    await mgr.stop()
    old = root / "copied-0"
    old.mkdir()
    raw = v1_batch(rows_of(3, "x"), base=0, first_ts=1000)
    (old / f"{0:020d}.log").write_bytes(raw)
    (root / CLEAN_SHUTDOWN).unlink()  # an unclean start scans the copied segment
    mgr = manager(root)
    await mgr.start()
    try:
        assert mgr.get_log("copied", 0) is None
        assert "batch format 1" in mgr.offline_logs[("copied", 0)]
        assert (old / f"{0:020d}.log").read_bytes() == raw
    finally:
        await mgr.stop()
