"""Log compaction: configs, the record filter, cleaning a log, crash safety, the cleaner task."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from logmq.errors import CorruptRecordError, ErrorCode, InvalidConfigError, InvalidRecordError
from logmq.storage import batch as b
from logmq.storage import segment_swap
from logmq.storage.compaction import (
    CLEANER_CHECKPOINT,
    RecordFilter,
    check_record_keys,
    group_segments,
)
from logmq.storage.config import LogConfig
from logmq.storage.log_cleaner import LogCleaning
from logmq.storage.log_manager import LogManager
from logmq.storage.offset_map import OffsetMap, key_hash
from logmq.storage.partition_log import PartitionLog
from logmq.storage.producer_state import delete_snapshots

from .compaction_helpers import (
    ALL,
    COMPACT,
    T0,
    Clock,
    CrashAfter,
    SimulatedCrash,
    kbatch,
    newest,
    read_records,
)
from .helpers import commit, make_batch


def open_log(tmp_path: Path, clock=None, **overrides) -> PartitionLog:
    cfg = LogConfig.from_dict({**COMPACT, **overrides})
    return PartitionLog(tmp_path / "topic-0", cfg, clock=clock or Clock())


def fill(
    plog: PartitionLog, n: int, keys: int = 7, *, tombstone_every: int = 0, committed: bool = True
) -> list[tuple]:
    """Append ``n`` single-record batches cycling over ``keys`` keys; returns the history.

    ``committed``: then move the high watermark to the log end, as the replica manager of
    a single broker does (cleaning only acts below the high watermark)."""
    history = []
    for i in range(n):
        key = f"k{i % keys}".encode()
        value = None if tombstone_every and i % tombstone_every == 0 else f"v{i}".encode()
        ts = plog.clock()
        info = plog.append(kbatch([(key, value)], ts=ts))
        history.append((info.first_offset, ts, key, value))
    if committed:
        commit(plog)
    return history


# -- configs and produce-time validation -----------------------------------------------------


def test_compaction_config_keys():
    cfg = LogConfig.from_dict({"cleanup.policy": " delete , compact"})
    assert cfg.cleanup_policy == "compact,delete" and cfg.compact and cfg.delete
    assert not LogConfig().compact and LogConfig().delete
    d = LogConfig().to_dict()
    assert d["min.cleanable.dirty.ratio"] == "0.5"
    assert d["min.compaction.lag.ms"] == "0"
    assert d["max.compaction.lag.ms"] == ""
    assert d["delete.retention.ms"] == "86400000"
    cfg = LogConfig.from_dict(
        {"min.cleanable.dirty.ratio": "0.1", "max.compaction.lag.ms": "500"}, base=cfg
    )
    assert cfg.min_cleanable_dirty_ratio == 0.1 and cfg.max_compaction_lag_ms == 500
    assert LogConfig.from_dict(cfg.to_dict()) == cfg
    for bad in (
        {"cleanup.policy": "compress"},
        {"cleanup.policy": ""},
        {"min.cleanable.dirty.ratio": "1.5"},
        {"min.cleanable.dirty.ratio": "half"},
        {"min.compaction.lag.ms": "-1"},
        {"min.compaction.lag.ms": "100", "max.compaction.lag.ms": "50"},
    ):
        with pytest.raises(InvalidConfigError):
            LogConfig.from_dict(bad)


def test_check_record_keys():
    check_record_keys(kbatch([(b"a", b"1"), (b"b", None)]) + kbatch([(b"c", b"2")]))
    with pytest.raises(InvalidRecordError) as e:
        check_record_keys(
            kbatch([(None, b"1"), (b"c", b"2")]) + kbatch([(b"a", b"1"), (None, b"x")])
        )
    assert e.value.code == ErrorCode.INVALID_RECORD
    # every keyless record is named, by its index among the data's records
    assert [i for i, _ in e.value.record_errors] == [0, 3]
    damaged = bytearray(kbatch([(b"a", b"1")]))
    damaged[-1] ^= 1
    with pytest.raises(CorruptRecordError):
        check_record_keys(damaged)


async def test_manager_refuses_keyless_records_for_compacted_topics(tmp_path):
    mgr = LogManager(tmp_path)
    compacted = mgr.create_log("offsets", 0, {"cleanup.policy": "compact"})
    with pytest.raises(InvalidRecordError):
        await mgr.append(compacted, make_batch(2))
    assert compacted.log_end_offset == 0
    await mgr.append(compacted, kbatch([(b"k", b"v"), (b"k", None)]))
    assert compacted.log_end_offset == 2
    plain = mgr.create_log("events", 0)
    await mgr.append(plain, make_batch(2))  # keyless records are fine elsewhere
    assert plain.log_end_offset == 2
    for plog in mgr.logs():
        plog.close()


# -- the record filter (pure) ----------------------------------------------------------------


def _filter(offsets: dict[bytes, int], now: int = T0, producers=None) -> RecordFilter:
    m = OffsetMap(1 << 20)
    m.update((key_hash(k), o) for k, o in offsets.items())
    return RecordFilter(m, now, 1000, producers or {})


@pytest.mark.parametrize("codec", ["none", "gzip", "zstd", "lz4"])
def test_rewritten_batch_keeps_offsets_timestamps_and_producer_fields(codec):
    records = [
        (T0 + 5, b"a", b"a0", None),
        (T0 + 1, b"b", b"b0", [("h", b"x")]),
        (T0 + 9, b"a", b"a1", None),
        (T0 + 3, b"c", b"c0", None),
        (T0 + 2, b"b", b"b1", None),
    ]
    raw = b.encode_batch(
        records,
        compression=b.Compression.parse(codec),
        base_offset=100,
        leader_epoch=3,
        producer_id=7,
        producer_epoch=2,
        base_sequence=40,
    )
    # a and b have newer records at 102 and 104 in this batch; c was superseded at 150.
    f = _filter({b"a": 102, b"b": 104, b"c": 150})
    out = f.clean_batch(raw, 0, b.read_header(raw))
    h, old = b.validate(out, contiguous=False), b.read_header(raw)
    assert (h.base_offset, h.last_offset_delta, h.leader_epoch) == (100, 4, 3)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (7, 2, 40)
    assert (h.max_timestamp, h.compression, h.record_count) == (
        old.max_timestamp,
        old.compression,
        2,
    )
    assert b.decode_records(out) == [(102, T0 + 9, b"a", b"a1", []), (104, T0 + 2, b"b", b"b1", [])]
    assert (f.stats.records_in, f.stats.records_out) == (5, 2)


def test_batch_with_every_record_kept_is_copied_byte_for_byte():
    raw = kbatch([(b"a", b"1"), (b"b", b"2")])
    f = _filter({b"a": 0})
    assert bytes(f.clean_batch(raw, 0, b.read_header(raw))) == raw
    control = bytearray(kbatch([(b"a", b"1")]))  # control batches are never filtered
    attrs = b.read_header(control).attributes | b.ATTR_CONTROL
    control[b.CHECKSUM_START : b.CHECKSUM_START + 2] = attrs.to_bytes(2, "big")
    b.stamp(control, 0, 0, 0)
    control[b.CHECKSUM_POS : b.CHECKSUM_START] = b.compute_checksum(
        control, 0, len(control)
    ).to_bytes(4, "big")
    f = _filter({b"a": 99})
    assert bytes(f.clean_batch(control, 0, b.read_header(control))) == bytes(control)


def test_tombstone_gets_a_delete_horizon_then_expires():
    raw = kbatch([(b"a", None), (b"b", b"1")], ts=T0 - 50)
    f = _filter({}, now=T0)
    out = f.clean_batch(raw, 0, b.read_header(raw))
    h = b.validate(out, contiguous=False)
    assert h.attributes & b.ATTR_DELETE_HORIZON and h.first_timestamp == T0 + 1000
    assert [r[1] for r in b.decode_records(out)] == [T0 - 50, T0 - 50]  # timestamps kept
    assert f.stats.next_delete_horizon == T0 + 1000
    again = _filter({}, now=T0 + 999)  # before the horizon: copied as it is
    assert bytes(again.clean_batch(out, 0, h)) == bytes(out)
    later = _filter({}, now=T0 + 1000)
    gone = later.clean_batch(out, 0, h)
    h2 = b.validate(gone, contiguous=False)
    assert not h2.attributes & b.ATTR_DELETE_HORIZON
    assert b.decode_records(gone) == [(1, T0 - 50, b"b", b"1", [])]
    assert later.stats.tombstones_removed == 1


def test_keyless_records_are_dropped_and_empty_batches_vanish():
    raw = kbatch([(None, b"x"), (b"a", b"1")])
    f = _filter({b"a": 5})
    assert f.clean_batch(raw, 0, b.read_header(raw)) is None
    assert f.stats.keyless_removed == 1 and f.stats.batches_out == 0


def test_last_batch_of_a_producer_keeps_one_record():
    raw = kbatch([(b"a", b"1"), (b"b", b"2")], producer_id=9, producer_epoch=0, base_sequence=4)
    raw = bytearray(raw)
    b.stamp(raw, 0, 10, 0)
    f = _filter({b"a": 50, b"b": 51}, producers={9: 11})
    out = f.clean_batch(raw, 0, b.read_header(raw))
    h = b.validate(out, contiguous=False)
    assert (h.base_offset, h.last_offset, h.base_sequence, h.last_sequence) == (10, 11, 4, 5)
    # Superseded: kept as a tombstone, which cannot bring an old value back later.
    assert b.decode_records(out) == [(11, T0, b"b", None, [])]
    assert h.attributes & b.ATTR_DELETE_HORIZON and h.first_timestamp == T0 + 1000
    f = _filter({b"a": 50, b"b": 51}, producers={9: 40})  # not its last batch: dropped
    assert f.clean_batch(raw, 0, b.read_header(raw)) is None


def test_group_segments_bounds_size_and_relative_offsets():
    from logmq.storage.compaction import SegmentRef

    refs = [SegmentRef(None, i * 10, i * 10 + 10, 400, Path()) for i in range(5)]
    assert [len(g) for g in group_segments(refs, 1000)] == [2, 2, 1]
    refs = [SegmentRef(None, 0, 10, 1, Path()), SegmentRef(None, 10, 1 << 33, 1, Path())]
    assert [len(g) for g in group_segments(refs, 1000)] == [1, 1]


# -- cleaning a partition log ------------------------------------------------------------------


def test_clean_keeps_the_newest_record_of_every_key(tmp_path):
    plog = open_log(tmp_path)
    history = fill(plog, 300)
    plog.roll()
    end, segments = plog.log_end_offset, len(plog.segments)
    stats = plog.clean()
    assert stats is not None and stats.records_in == 300 and stats.records_out == 7
    assert stats.first_dirty_offset == end
    got = read_records(plog)
    assert got == sorted(newest(history).values())
    assert (plog.log_start_offset, plog.log_end_offset) == (0, end)
    assert len(plog.segments) <= segments
    # Reading from inside a gap gives the next surviving record.
    assert read_records(plog, got[0][0] + 1)[0] == got[1]
    assert (tmp_path / "topic-0" / CLEANER_CHECKPOINT).exists()
    leftovers = [n for n in os.listdir(tmp_path / "topic-0") if n.endswith((".cleaned", ".swap"))]
    assert leftovers == [] and not (tmp_path / "topic-0" / segment_swap.MANIFEST).exists()
    # Appends continue after the gaps; a second pass merges the small cleaned segments.
    history += fill(plog, 50)
    plog.roll()
    plog.clean()
    assert read_records(plog) == sorted(newest(history).values())
    plog.close()


def test_cleaning_leaves_active_segment_and_data_above_the_high_watermark(tmp_path):
    plog = open_log(tmp_path)
    history = fill(plog, 120, committed=False)
    assert plog.clean() is None  # nothing committed: nothing to clean
    seg3 = plog.segments[3].base_offset
    plog.high_watermark = seg3 + 1  # inside segment 3: segments 0-2 are cleanable
    stats = plog.clean()
    cleaned_end = stats.first_dirty_offset
    assert cleaned_end == seg3 and stats.segments_in == 3
    got = read_records(plog)
    assert [r for r in got if r[0] >= cleaned_end] == [r for r in history if r[0] >= cleaned_end]
    expect = newest([r for r in history if r[0] < cleaned_end])
    assert [r for r in got if r[0] < cleaned_end] == sorted(expect.values())
    plog.close()


def test_min_compaction_lag_protects_recent_segments(tmp_path):
    clock = Clock()
    plog = open_log(tmp_path, clock, **{"min.compaction.lag.ms": "500"})
    history = fill(plog, 60)
    clock.now += 600
    history += fill(plog, 60)
    plog.roll()
    stats = plog.clean()
    old_end = history[59][0] + 1
    assert stats.first_dirty_offset <= old_end
    got = read_records(plog)
    assert [r for r in got if r[0] >= old_end] == history[60:]
    clock.now += 600
    plog.clean()
    assert read_records(plog) == sorted(newest(history).values())
    plog.close()


def test_tombstones_survive_delete_retention_after_the_first_cleaning(tmp_path):
    clock = Clock()
    plog = open_log(tmp_path, clock)
    history = fill(plog, 70)
    plog.append(kbatch([(b"k3", None)], ts=clock.now))
    commit(plog)
    plog.roll()
    plog.clean()
    assert (plog.log_end_offset - 1, T0, b"k3", None) in read_records(plog)
    assert plog.next_delete_horizon == T0 + 1000
    clock.now += 999
    assert plog.cleaning_plan() is None  # nothing dirty, horizon not reached
    clock.now += 1
    plan = plog.cleaning_plan()
    assert plan is not None and plan.reason == "tombstones"
    plog.clean(force=False)
    got = read_records(plog)
    assert all(k != b"k3" for _, _, k, _ in got)
    expect = {k: r for k, r in newest(history).items() if k != b"k3"}
    assert got == sorted(expect.values())
    assert plog.next_delete_horizon == -1
    plog.close()


def test_dirty_ratio_and_max_compaction_lag_decide_when_to_clean(tmp_path):
    clock = Clock()
    plog = open_log(tmp_path, clock, **{"min.cleanable.dirty.ratio": "0.6"})
    fill(plog, 100, keys=100)  # distinct keys: cleaning keeps everything
    plog.roll()
    plan = plog.cleaning_plan()
    assert plan is not None and plan.reason == "dirty ratio" and plan.dirty_ratio == 1.0
    plog.clean(force=False)
    fill(plog, 20, keys=100)
    plog.roll()
    plan = plog.cleaning_plan(force=True)
    assert plan.reason == "forced" and 0 < plan.dirty_ratio < 0.6
    assert plog.cleaning_plan() is None
    plog.config = LogConfig.from_dict({"max.compaction.lag.ms": "1000"}, base=plog.config)
    clock.now += 1000
    assert plog.cleaning_plan().reason == "max.compaction.lag.ms"
    # The active segment rolls once its first batch is older than the lag.
    fill(plog, 1)
    assert not plog.roll_if_old()
    clock.now += 1000
    assert plog.roll_if_old() and plog.active_segment.size == 0
    plog.close()


def test_retention_applies_only_with_the_delete_policy(tmp_path):
    clock = Clock()
    plog = open_log(tmp_path, clock, **{"retention.ms": "10", "retention.bytes": "0"})
    fill(plog, 60)
    clock.now += 100
    assert plog.delete_old_segments() == 0  # compact only: retention does not apply
    plog.config = LogConfig.from_dict({"cleanup.policy": "compact,delete"}, base=plog.config)
    assert plog.delete_old_segments() > 0
    plog.close()


def test_compressed_batches_stay_compressed(tmp_path):
    plog = open_log(tmp_path)
    for i in range(40):
        codec = b.Compression.GZIP if i % 2 else b.Compression.ZSTD
        plog.append(kbatch([(b"a", b"x" * 50), (f"k{i}".encode(), b"y" * 50)], compression=codec))
    commit(plog)
    plog.roll()
    plog.clean()
    codecs = set()
    for seg in plog.segments:
        for _, h in seg.iter_headers():
            codecs.add(h.compression)
    assert codecs == {b.Compression.GZIP, b.Compression.ZSTD}
    got = read_records(plog)
    assert len(got) == 41 and got[-2][:3] == (78, T0, b"a")
    plog.close()


def test_small_cleaner_buffer_cleans_in_several_passes(tmp_path):
    plog = open_log(tmp_path)
    history = fill(plog, 400, keys=60)
    plog.roll()
    end = plog.log_end_offset
    passes = 0
    while plog.first_dirty_offset < end:
        plog.clean(buffer_bytes=40 * 128)  # 40 keys per map
        passes += 1
        assert passes < 50
    assert passes > 1
    assert read_records(plog) == sorted(newest(history).values())
    plog.close()


def test_idempotent_producer_state_survives_cleaning_and_rebuild(tmp_path):
    clock = Clock()
    plog = open_log(tmp_path, clock)
    pid = 42
    for seq in range(3):  # the producer's batches, all later superseded
        plog.append(
            kbatch(
                [(b"a", b"p"), (b"t", b"p")],
                producer_id=pid,
                producer_epoch=0,
                base_sequence=seq * 2,
            )
        )
    last = plog.producer_state.producers[pid].batches[-1]
    fill(plog, 40, keys=3)  # k0..k2
    plog.append(kbatch([(b"a", b"new"), (b"t", None)], ts=clock.now))
    commit(plog)
    plog.roll()
    plog.clean()
    kept = [r for r in read_records(plog) if r[0] <= last.last_offset]
    assert kept == [(last.last_offset, T0, b"t", None)]  # one record of the last batch
    clock.now += 5000  # past every horizon: only the producer's placeholder stays
    plog.clean()
    assert [r for r in read_records(plog) if r[2] == b"t"] == [kept[0]]
    # Rebuild the producer state from the log alone: no snapshot, full recovery.
    plog.close()
    delete_snapshots(plog.dir, above=-1)
    plog = PartitionLog(plog.dir, plog.config, clock=clock, clean_shutdown=False, recovery_point=0)
    entry = plog.producer_state.producers[pid]
    assert (entry.batches[-1].last_seq, entry.batches[-1].last_offset) == (5, last.last_offset)
    retry = plog.append(
        kbatch([(b"a", b"p"), (b"t", b"p")], producer_id=pid, producer_epoch=0, base_sequence=4)
    )
    assert retry.duplicate and retry.first_offset == last.first_offset
    nxt = plog.append(kbatch([(b"z", b"p")], producer_id=pid, producer_epoch=0, base_sequence=6))
    assert not nxt.duplicate
    commit(plog)
    # Now the old batch is not the producer's last: it goes.
    plog.roll()
    clock.now += 5000
    plog.clean()
    got = read_records(plog)
    assert all(k != b"t" for _, _, k, _ in got)
    assert (nxt.first_offset, T0, b"z", b"p") in got
    plog.close()


def test_open_slices_of_replaced_segments_keep_working(tmp_path):
    plog = open_log(tmp_path)
    fill(plog, 100)
    plog.roll()
    sl = plog.read(0, 1 << 16)
    before = sl.read()
    plog.clean()
    assert sl.read() == before  # the descriptor outlives the rename and unlink
    assert not plog.segments[0].log_path.with_name("00000000000000000000.log.deleted").exists()
    plog.close()


def test_install_gives_up_when_retention_got_there_first(tmp_path):
    plog = open_log(tmp_path)
    history = fill(plog, 100)
    plog.roll()
    job = LogCleaning(plog.cleaning_plan(force=True), 1 << 20)
    job.build_map()
    result = job.write_group(job.groups[0])
    plog.advance_log_start_offset(plog.segments[1].base_offset)
    assert not plog.install_cleaned(result)
    job.abandon()
    names = os.listdir(plog.dir)
    assert not [n for n in names if n.endswith((".cleaned", ".swap"))]
    assert segment_swap.MANIFEST not in names
    start = plog.log_start_offset
    assert read_records(plog) == [r for r in history if r[0] >= start]
    plog.close()


def test_unclean_recovery_accepts_the_gaps_cleaning_leaves(tmp_path, no_fsync):
    plog = open_log(tmp_path)
    history = fill(plog, 200)
    plog.roll()
    history += fill(plog, 5)
    plog.clean()
    expect = read_records(plog)
    assert len(expect) < len(history)
    plog.close_handles()
    cfg = plog.config
    plog = PartitionLog(plog.dir, cfg, clean_shutdown=False, recovery_point=0)
    assert plog.cut_bytes == 0 and read_records(plog) == expect
    plog.close_handles()
    # Switched back to delete: the cleaner's checkpoint still says gaps are legitimate.
    cfg = LogConfig.from_dict({"cleanup.policy": "delete"}, base=cfg)
    plog = PartitionLog(plog.dir, cfg, clean_shutdown=False, recovery_point=0)
    assert plog.cut_bytes == 0 and read_records(plog) == expect
    plog.close()


# -- crash safety ------------------------------------------------------------------------------


CRASH_CFG = {
    **COMPACT,
    "segment.bytes": "2048",
    "segment.index.bytes": "1024",
    "file.delete.delay.ms": "60000",  # retired files wait: fewer, equivalent crash points
}


def _build_dirty_log(path: Path) -> None:
    plog = PartitionLog(path, LogConfig.from_dict(CRASH_CFG), clock=Clock())
    fill(plog, 60, tombstone_every=11)
    plog.roll()
    plog.clean()  # a first pass: horizons and gaps already on disk
    fill(plog, 80, tombstone_every=13)
    plog.roll()
    plog.close()


def test_a_crash_at_any_point_of_a_cleaning_leaves_old_or_new_segments(tmp_path, monkeypatch):
    checkpoint_patch = pytest.MonkeyPatch()
    from logmq.storage import checkpoint

    checkpoint_patch.setattr(checkpoint, "fsync", lambda fd: None)
    checkpoint_patch.setattr(checkpoint, "fdatasync", lambda fd: None)
    template = tmp_path / "template" / "topic-0"
    _build_dirty_log(template)
    cfg = LogConfig.from_dict(CRASH_CFG)

    def fresh(n: int) -> Path:
        path = tmp_path / f"run{n}" / "topic-0"
        shutil.copytree(template, path)
        return path

    plog = PartitionLog(fresh(-1), cfg, clock=Clock(), high_watermark=ALL)
    old = set(read_records(plog))
    plog.clean()
    new = read_records(plog)
    plog.close()
    assert set(new) < old

    n = 0
    try:
        while True:
            path = fresh(n)
            plog = PartitionLog(path, cfg, clock=Clock(), high_watermark=ALL)
            with pytest.MonkeyPatch.context() as mp:
                crash = CrashAfter(mp, n)
                try:
                    plog.clean()
                except SimulatedCrash:
                    pass
                crashed = crash.crashed
            plog.close_handles()
            if not crashed:
                break  # n is past the last file operation of a cleaning
            plog = PartitionLog(
                path, cfg, clock=Clock(), clean_shutdown=False, recovery_point=0, high_watermark=ALL
            )
            got = read_records(plog)
            assert set(new) <= set(got) <= old, f"crash at operation {n}"
            assert plog.cut_bytes == 0
            names = os.listdir(path)
            assert not [x for x in names if x.endswith((".cleaned", ".swap", ".deleted"))], names
            assert segment_swap.MANIFEST not in names
            plog.clean()  # and the log cleans normally afterwards
            assert read_records(plog) == new, f"crash at operation {n}"
            plog.close()
            shutil.rmtree(path.parent)
            n += 1
    finally:
        checkpoint_patch.undo()
    assert n > 20  # the cleaning really was interrupted at many points


# -- the LogManager's cleaner --------------------------------------------------------------------


async def test_manager_clean_runs_while_appends_continue(tmp_path):
    mgr = LogManager(tmp_path, cleaner_enabled=False)
    plog = mgr.create_log("offsets", 0, COMPACT)
    history = fill(plog, 300)
    plog.roll()

    async def appender() -> None:
        for i in range(60):
            ts = plog.clock()
            info = await mgr.append(plog, kbatch([(f"k{i % 9}".encode(), b"late")], ts=ts))
            commit(plog)
            history.append((info.first_offset, ts, f"k{i % 9}".encode(), b"late"))
            await asyncio.sleep(0)

    stats, _ = await asyncio.gather(mgr.clean(plog), appender())
    assert stats is not None and stats.records_in == 300
    assert newest(read_records(plog)) == newest(history)
    plog.roll()
    await mgr.clean(plog)
    assert read_records(plog) == sorted(newest(history).values())
    plog.close()


async def test_background_cleaner_compacts_dirty_logs(tmp_path):
    mgr = LogManager(tmp_path, cleaner_interval_ms=10)
    await mgr.start()
    try:
        plog = mgr.create_log("offsets", 0, {**COMPACT, "min.cleanable.dirty.ratio": "0.1"})
        history = fill(plog, 200)
        plog.roll()
        deadline = asyncio.get_running_loop().time() + 10
        while mgr.cleaner.total.records_in < 200:  # counted when a cleaning completes
            assert asyncio.get_running_loop().time() < deadline, "the cleaner never ran"
            await asyncio.sleep(0.01)
        assert read_records(plog) == sorted(newest(history).values())
    finally:
        await mgr.stop()


async def test_stopping_during_a_cleaning_loses_nothing(tmp_path):
    mgr = LogManager(tmp_path, cleaner_enabled=False)
    await mgr.start()
    plog = mgr.create_log("offsets", 0, COMPACT)
    history = fill(plog, 400)
    plog.roll()
    task = asyncio.get_running_loop().create_task(mgr.clean(plog))
    await asyncio.sleep(0)  # let it start (whether it gets far does not matter)
    await mgr.stop()
    await task
    mgr = LogManager(tmp_path, topic_overrides={"offsets": COMPACT}, cleaner_enabled=False)
    await mgr.start()
    plog = mgr.get_log("offsets", 0)
    got = read_records(plog)
    assert set(got) <= set(history) and newest(got) == newest(history)
    names = os.listdir(plog.dir)
    assert not [n for n in names if n.endswith((".cleaned", ".swap"))]
    await mgr.stop()


async def test_compacted_topic_ignores_retention(tmp_path):
    mgr = LogManager(tmp_path, cleaner_enabled=False)
    plog = mgr.create_log("__consumer_offsets", 0, {**COMPACT, "retention.ms": "0"})
    fill(plog, 100)
    assert mgr.run_retention() == 0 and plog.log_start_offset == 0
    plog.close()


# -- through a real broker ------------------------------------------------------------------------


async def test_broker_refuses_keyless_records_and_describes_compaction_configs(broker):
    from logmq import AsyncAdmin, AsyncProducer
    from logmq.errors import LogMQError

    async with AsyncAdmin(broker.bootstrap) as admin:
        await admin.create_topic("compacted", configs={"cleanup.policy": "compact"})
        configs = (await admin.describe_configs(["compacted"]))["compacted"]
        assert configs["cleanup.policy"].value == "compact"
        assert not configs["cleanup.policy"].default
        assert configs["min.cleanable.dirty.ratio"].value == "0.5"
        assert configs["min.cleanable.dirty.ratio"].default
        await admin.alter_configs("compacted", set={"max.compaction.lag.ms": "60000"})
        configs = (await admin.describe_configs(["compacted"]))["compacted"]
        assert configs["max.compaction.lag.ms"].value == "60000"
    async with AsyncProducer(broker.bootstrap) as producer:
        meta = await producer.send("compacted", b"v", key=b"k", partition=0)
        assert meta.offset == 0
        with pytest.raises(LogMQError) as e:
            await producer.send("compacted", b"no key", partition=0)
        assert e.value.code == ErrorCode.INVALID_RECORD
