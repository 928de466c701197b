"""Partition log behaviour: offsets, reads, indexes, truncation, retention, faults."""

from __future__ import annotations

import errno
import os

import pytest

from logmq.errors import (
    CorruptRecordError,
    DiskFullError,
    InvalidProducerEpochError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
)
from logmq.storage import batch as b
from logmq.storage import segment as segment_mod
from logmq.storage import verify as verify_mod
from logmq.storage.config import LogConfig
from logmq.storage.partition_log import PartitionLog

from .helpers import commit, make_batch, read_all

SMALL = LogConfig.from_dict(
    {"segment.bytes": "4096", "index.interval.bytes": "256", "segment.index.bytes": "4096"}
)


def open_log(tmp_path, cfg=SMALL, **kw) -> PartitionLog:
    return PartitionLog(tmp_path / "topic-0", cfg, **kw)


def test_append_assigns_offsets_and_reads_back(tmp_path):
    log = open_log(tmp_path)
    a = log.append(make_batch(3, tag=1))
    bb = log.append(make_batch(2, tag=2) + make_batch(4, tag=3))  # two batches, one call
    assert (a.first_offset, a.last_offset, a.record_count) == (0, 2, 3)
    assert (bb.first_offset, bb.last_offset, bb.record_count) == (3, 8, 6)
    assert log.log_end_offset == 9
    got = read_all(log)
    assert [o for o, _ in got] == list(range(9))
    assert got[3][1].startswith(b"2:0:") and got[5][1].startswith(b"3:0:")


def test_read_bounds(tmp_path):
    log = open_log(tmp_path)
    for i in range(5):
        log.append(make_batch(2, tag=i))
    with pytest.raises(OffsetOutOfRangeError):
        log.read(11, 100)
    assert log.read(10, 100) is None  # at the end: nothing yet
    sl = log.read(3, 1)  # first batch whole even if larger than max_bytes
    hs = list(b.iter_headers(sl.read()))
    assert len(hs) == 1 and hs[0][1].base_offset == 2
    sl = log.read(0, 10_000, max_offset=4)  # stops before batches at/after the HW
    assert [h.base_offset for _, h in b.iter_headers(sl.read())] == [0, 2]
    assert sl.end_offset == 4 and log.read(0, 10_000).end_offset == 10
    assert log.read(4, 10_000, max_offset=4) is None


def test_index_lookup_across_segments(tmp_path):
    log = open_log(tmp_path)
    ends = []
    for i in range(120):
        info = log.append(make_batch(1 + i % 3, ts=10_000 + i * 10, tag=i))
        ends.append(info)
    assert len(log.segments) > 3
    for info in ends:
        for off in range(info.first_offset, info.last_offset + 1):
            h = next(iter(b.iter_headers(log.read(off, 1).read())))[1]
            assert h.base_offset == info.first_offset
    # by time: the first batch whose max timestamp >= ts
    for i, info in enumerate(ends):
        ts = 10_000 + i * 10
        assert log.offset_for_timestamp(ts) == (info.first_offset, ts)
        assert log.offset_for_timestamp(ts - 5) == (info.first_offset, ts)
    assert log.offset_for_timestamp(10_000 + 120 * 10) is None
    log.close()
    reopened = open_log(tmp_path)  # same answers from the on-disk indexes
    for i, info in enumerate(ends):
        assert reopened.offset_for_timestamp(10_000 + i * 10) == (
            info.first_offset,
            10_000 + i * 10,
        )
        h = next(iter(b.iter_headers(reopened.read(info.last_offset, 1).read())))[1]
        assert h.base_offset == info.first_offset


def test_non_monotonic_timestamps(tmp_path):
    log = open_log(tmp_path)
    for ts in [500, 100, 900, 300, 1200]:
        log.append(make_batch(1, ts=ts))
    assert log.offset_for_timestamp(400) == (0, 500)
    assert log.offset_for_timestamp(600) == (2, 900)
    assert log.offset_for_timestamp(1000) == (4, 1200)


def test_truncate_to_across_segments(tmp_path):
    log = open_log(tmp_path)
    for i in range(80):
        log.append(make_batch(2, tag=i), leader_epoch=i // 20)
    log.high_watermark = 150
    log.truncate_to(61)  # mid-batch: the whole batch holding 61 goes
    assert log.log_end_offset == 60 and log.high_watermark == 60
    assert [o for o, _ in read_all(log)] == list(range(60))
    assert log.leader_epochs.entries() == [(0, 0), (1, 40)]
    info = log.append(make_batch(3, tag=99), leader_epoch=5)
    assert info.first_offset == 60
    assert log.leader_epochs.end_offset_for_epoch(1, log.log_end_offset) == (1, 60)
    log.close()
    again = open_log(tmp_path)
    assert [o for o, _ in read_all(again)] == list(range(63))
    again.truncate_to(0)
    assert again.log_end_offset == 0 and again.read(0, 100) is None
    again.append(make_batch(1))
    assert [o for o, _ in read_all(again)] == [0]


def test_retention_by_bytes_and_time(tmp_path):
    now = [1_000_000]
    cfg = SMALL.merged({"retention.bytes": "8192", "retention.ms": "-1"})
    log = open_log(tmp_path, cfg, clock=lambda: now[0])
    for i in range(200):
        log.append(make_batch(3, ts=now[0] - 100_000 + i, tag=i))
    commit(log)  # retention only deletes below the high watermark
    n = len(log.segments)
    deleted = log.delete_old_segments()
    assert deleted > 0 and len(log.segments) == n - deleted
    assert log.size_bytes() - log.segments[0].size < 8192
    assert log.log_start_offset == log.segments[0].base_offset
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 100)
    assert [o for o, _ in read_all(log)] == list(range(log.log_start_offset, 600))
    # file.delete.delay.ms: renamed now, removed by the deletion pass after the delay
    pending = list(log.dir.glob("*.deleted"))
    assert len(pending) == 3 * deleted and not (log.dir / "00000000000000000000.log").exists()
    assert log.delete_expired_files(now[0] + cfg.file_delete_delay_ms - 1) == 0
    assert log.delete_expired_files(now[0] + cfg.file_delete_delay_ms) == len(pending)
    assert not list(log.dir.glob("*.deleted"))
    log.config = cfg.merged({"retention.bytes": "-1", "retention.ms": "1000"})
    log.delete_old_segments()
    assert len(log.segments) == 1  # never the active segment
    assert log.log_start_offset == log.active_segment.base_offset


def test_disk_full_leaves_log_consistent(tmp_path, monkeypatch):
    log = open_log(tmp_path)
    log.append(make_batch(2))
    size = log.size_bytes()

    def half_then_enospc(fd, parts, pos):
        data = b"".join(parts)
        os.pwrite(fd, data[: len(data) // 2], pos)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(segment_mod, "_pwritev", half_then_enospc)
    with pytest.raises(DiskFullError):
        log.append(make_batch(5))
    assert log.log_end_offset == 2 and log.size_bytes() == size
    assert os.path.getsize(log.active_segment.log_path) == size  # partial write cut back
    monkeypatch.setattr(segment_mod, "_pwritev", os.pwritev)
    assert log.append(make_batch(1)).first_offset == 2
    log.close()
    assert [o for o, _ in read_all(open_log(tmp_path))] == [0, 1, 2]


def test_bad_input_is_rejected_whole(tmp_path):
    log = open_log(tmp_path, SMALL.merged({"max.message.bytes": "400"}))
    good = make_batch(2)
    bad = bytearray(make_batch(2))
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        log.append(good + bytes(bad))  # all or nothing: the good batch is not written
    with pytest.raises(CorruptRecordError):
        log.append(good[:-3])
    with pytest.raises(CorruptRecordError):
        log.append(b"")
    with pytest.raises(MessageTooLargeError):
        log.append(make_batch(20, size=100))
    assert log.log_end_offset == 0 and log.size_bytes() == 0


def test_idempotent_producer(tmp_path):
    log = open_log(tmp_path)
    kw = {"producer_id": 7, "producer_epoch": 0}
    a = log.append(make_batch(3, base_sequence=0, **kw))
    log.append(make_batch(2, base_sequence=3, **kw))
    dup = log.append(make_batch(3, base_sequence=0, **kw))
    assert dup.duplicate and (dup.first_offset, dup.last_offset) == (a.first_offset, a.last_offset)
    assert log.log_end_offset == 5
    with pytest.raises(OutOfOrderSequenceError):
        log.append(make_batch(1, base_sequence=9, **kw))
    log.append(make_batch(1, base_sequence=0, producer_id=7, producer_epoch=1))
    with pytest.raises(InvalidProducerEpochError):
        log.append(make_batch(1, base_sequence=5, **kw))
    log.close()
    again = open_log(tmp_path)  # state rebuilt from the snapshot
    assert again.append(make_batch(1, base_sequence=0, producer_id=7, producer_epoch=1)).duplicate
    again.close_handles()  # crash: no fresh snapshot, rebuilt from headers
    for snap in again.dir.glob("*.snapshot"):
        snap.unlink()
    third = open_log(tmp_path, clean_shutdown=False)
    assert third.append(make_batch(1, base_sequence=0, producer_id=7, producer_epoch=1)).duplicate
    assert (
        third.append(make_batch(1, base_sequence=1, producer_id=7, producer_epoch=1)).first_offset
        == 6
    )


def test_log_append_time(tmp_path):
    log = open_log(
        tmp_path, SMALL.merged({"message.timestamp.type": "LogAppendTime"}), clock=lambda: 77
    )
    info = log.append(make_batch(2, ts=5))
    assert info.max_timestamp == 77
    h = b.validate(log.read(0, 100).read())
    assert h.max_timestamp == 77 and h.attributes & b.ATTR_LOG_APPEND_TIME


def test_caller_buffer_is_not_modified(tmp_path):
    log = open_log(tmp_path)
    log.append(make_batch(1))
    buf = bytearray(make_batch(2))
    log.append(memoryview(buf))
    assert bytes(buf) == make_batch(2)  # offsets are stamped on the way to disk only
    assert [o for o, _ in read_all(log)] == [0, 1, 2]


@pytest.mark.parametrize("chunk", [verify_mod.VERIFY_CHUNK, 300])
def test_corruption_before_restart_is_found_on_first_read(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(verify_mod, "VERIFY_CHUNK", chunk)
    log = open_log(tmp_path)
    for i in range(10):
        log.append(make_batch(2, tag=i))
    log.close()
    path = log.segments[0].log_path
    batch_size = len(make_batch(2, tag=0))
    with open(path, "r+b") as f:  # flip a byte inside the 4th batch's records
        f.seek(3 * batch_size + 70)
        byte = f.read(1)
        f.seek(3 * batch_size + 70)
        f.write(bytes([byte[0] ^ 1]))
    log = open_log(tmp_path)  # clean shutdown: not scanned at open
    sl = log.read(0, 1 << 20)
    assert sl.length == 3 * batch_size  # the valid prefix only
    with pytest.raises(CorruptRecordError) as e:
        log.read(6, 1 << 20)
    assert str(path) in str(e.value) and str(3 * batch_size) in str(e.value)
    assert log.read(8, 1 << 20).position == 4 * batch_size  # data after it stays readable


def test_missing_and_damaged_indexes_are_rebuilt(tmp_path):
    log = open_log(tmp_path)
    for i in range(150):
        log.append(make_batch(2, tag=i, ts=100 + i))
    log.close()
    segs = sorted(log.dir.glob("*.index"))
    assert len(segs) > 3
    segs[0].unlink()
    with open(segs[1], "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(b"\x00\x00\x00\x05\xff\xff\xff\xff")  # last entry points past the end
    f2 = sorted(log.dir.glob("*.timeindex"))[2]
    f2.write_bytes(f2.read_bytes()[:-3])  # not a whole number of entries
    again = open_log(tmp_path)
    assert [o for o, _ in read_all(again)] == list(range(300))
    for i in range(150):
        assert again.offset_for_timestamp(100 + i) == (2 * i, 100 + i)


def test_lru_caps_open_segments(tmp_path):
    from logmq.storage.open_files import OpenFileCache

    cache = OpenFileCache(3)
    log = open_log(tmp_path, cache=cache)
    for i in range(150):
        log.append(make_batch(3, tag=i))
    assert len(log.segments) >= 6
    assert [o for o, _ in read_all(log)] == list(range(450))
    assert len(cache) <= 3 and cache.evictions > 0
    assert sum(s.is_open() for s in log.segments) <= 3
    slice_ = log.read(0, 100)
    for seg in log.segments:  # evict everything: the slice keeps its own descriptor
        seg.close_handles()
    assert b.validate(slice_.read()).base_offset == 0


def test_follower_append_keeps_offsets_and_epochs(tmp_path):
    leader = PartitionLog(tmp_path / "lead-0", SMALL)
    for i in range(10):
        leader.append(make_batch(2, tag=i), leader_epoch=1 + i // 5)
    follower = PartitionLog(tmp_path / "follow-0", SMALL)
    offset = 0
    while offset < leader.log_end_offset:
        data = leader.read(offset, 300).read()
        info = follower.append_as_follower(data)
        offset = info.last_offset + 1
    assert read_all(follower) == read_all(leader)
    assert follower.leader_epochs.entries() == leader.leader_epochs.entries() == [(1, 0), (2, 10)]
    with pytest.raises(CorruptRecordError):
        follower.append_as_follower(leader.read(0, 100).read())  # below the log end


def test_advance_start_and_truncate_fully(tmp_path):
    log = open_log(tmp_path)
    for i in range(100):
        log.append(make_batch(2, tag=i))
    commit(log)  # the log start offset cannot pass the high watermark
    n = len(log.segments)
    deleted = log.advance_log_start_offset(101)
    assert log.log_start_offset == 101 and len(log.segments) == n - deleted and deleted > 0
    with pytest.raises(OffsetOutOfRangeError):
        log.read(100, 10)
    assert read_all(log)[0][0] == 101
    log.truncate_fully_and_start_at(500)
    assert (log.log_start_offset, log.log_end_offset) == (500, 500)
    assert log.append(make_batch(1)).first_offset == 500
    log.close()
    assert [o for o, _ in read_all(open_log(tmp_path, log_start_offset=500))] == [500]


def test_damaged_tail_after_clean_close_is_recovered(tmp_path):
    log = open_log(tmp_path)
    for i in range(5):
        log.append(make_batch(2, tag=i))
    log.close()
    path = log.active_segment.log_path
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 7)
    again = open_log(tmp_path)  # claims clean, but the tail is torn: recovered, not fatal
    assert again.log_end_offset == 8 and len(read_all(again)) == 8


def test_full_index_rolls_the_segment(tmp_path):
    cfg = LogConfig.from_dict({"segment.index.bytes": "64", "index.interval.bytes": "0"})
    log = open_log(tmp_path, cfg)
    for i in range(40):
        log.append(make_batch(1, tag=i, ts=100 + i))
    assert len(log.segments) > 5  # 64 bytes hold 5 time entries: a roll every few batches
    assert all(s.index.entries <= 8 and s.time_index.entries <= 5 for s in log.segments)
    assert [o for o, _ in read_all(log)] == list(range(40))
    assert all(log.offset_for_timestamp(100 + i) == (i, 100 + i) for i in range(40))
