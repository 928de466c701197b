"""Segment lifecycle: time-based rolls, delayed file deletion, retention below the HW,
and the append fast path agreeing with the reference batch validator."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.errors import CorruptRecordError, MessageTooLargeError
from logmq.storage import batch as b
from logmq.storage.config import LogConfig
from logmq.storage.partition_log import PartitionLog
from logmq.storage.stamping import check_batch

from .helpers import commit, make_batch, read_all

SMALL = LogConfig.from_dict(
    {"segment.bytes": "4096", "index.interval.bytes": "256", "segment.index.bytes": "4096"}
)


class Clock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def open_log(path, cfg=SMALL, **kw) -> PartitionLog:
    return PartitionLog(path / "topic-0", cfg, **kw)


# -- segment.ms ---------------------------------------------------------------------------


def test_segment_ms_rolls_on_the_first_batch_timestamp(tmp_path):
    cfg = LogConfig.from_dict({"segment.ms": "10000"})
    clock = Clock()
    log = open_log(tmp_path, cfg, clock=clock)
    log.append(make_batch(2, ts=50_000))
    log.append(make_batch(2, ts=59_999))  # 9.999 s after the first batch: same segment
    assert len(log.segments) == 1
    log.append(make_batch(2, ts=60_000))  # incoming batch 10 s after the first: roll
    assert [s.base_offset for s in log.segments] == [0, 4]
    # Producer timestamps far in the past never roll per batch (as in Kafka).
    for i in range(5):
        log.append(make_batch(1, ts=60_001 + i))
    assert len(log.segments) == 2


def test_restart_does_not_postpone_a_time_roll(tmp_path):
    cfg = LogConfig.from_dict({"segment.ms": "10000"})
    clock = Clock(100_000)
    log = open_log(tmp_path, cfg, clock=clock)
    log.append(make_batch(2, ts=95_000))
    log.close()
    clock.now = 106_000  # 11 s after the data; the process only just opened the segment
    again = open_log(tmp_path, cfg, clock=clock)
    assert again.active_segment.first_batch_timestamp == 95_000  # read back from the file
    assert again.roll_if_old()
    assert [s.base_offset for s in again.segments] == [0, 2]
    assert not again.roll_if_old()  # the new segment is empty


def test_segment_ms_without_timestamps_uses_the_open_time(tmp_path):
    cfg = LogConfig.from_dict({"segment.ms": "10000"})
    clock = Clock(100_000)
    log = open_log(tmp_path, cfg, clock=clock)
    log.append(make_batch(2, ts=-1))
    assert not log.roll_if_old()
    clock.now += 10_000
    assert log.roll_if_old(clock.now)
    assert len(log.segments) == 2


def test_first_batch_timestamp_follows_truncation(tmp_path):
    log = open_log(tmp_path, LogConfig(), clock=Clock())
    log.append(make_batch(2, ts=500))
    log.append(make_batch(2, ts=900))
    log.truncate_to(0)
    assert log.active_segment.first_batch_timestamp is None
    log.append(make_batch(1, ts=700))
    assert log.active_segment.first_batch_timestamp == 700


# -- file.delete.delay.ms -----------------------------------------------------------------


def fill(log: PartitionLog, n: int = 60, *, committed: bool = True) -> None:
    """Append ``n`` batches of 3; ``committed``: then move the HW to the log end, as the
    replica manager of a single broker does (retention only deletes below the HW)."""
    for i in range(n):
        log.append(make_batch(3, tag=i))
    if committed:
        commit(log)


def deleted_files(log: PartitionLog) -> list:
    return sorted(log.dir.glob("*.deleted"))


def test_deleted_segments_wait_for_the_delay(tmp_path):
    clock = Clock()
    cfg = SMALL.merged({"retention.bytes": "0", "file.delete.delay.ms": "5000"})
    log = open_log(tmp_path, cfg, clock=clock)
    fill(log)
    before = len(log.segments)
    deleted = log.delete_old_segments()
    assert deleted == before - 1
    assert len(deleted_files(log)) == 3 * deleted  # .log, .index, .timeindex
    assert [o for o, _ in read_all(log)] == list(range(log.log_start_offset, 180))
    clock.now += 4999
    assert log.delete_expired_files() == 0
    clock.now += 1
    assert log.delete_expired_files() == 3 * deleted
    assert deleted_files(log) == []


def test_retention_pass_also_runs_the_deletion_pass(tmp_path):
    clock = Clock()
    cfg = SMALL.merged({"retention.bytes": "0", "file.delete.delay.ms": "100"})
    log = open_log(tmp_path, cfg, clock=clock)
    fill(log, 30)
    assert log.delete_old_segments() > 0
    first_round = deleted_files(log)
    fill(log, 30)
    clock.now += 100
    second = log.delete_old_segments()
    assert second > 0
    left = deleted_files(log)
    assert not set(first_round) & set(left)  # the first round's files are gone
    assert len(left) == 3 * second  # the second round's wait for their delay


def test_truncation_deletes_after_the_delay_and_close_removes_pending(tmp_path):
    clock = Clock()
    log = open_log(tmp_path, SMALL.merged({"file.delete.delay.ms": "60000"}), clock=clock)
    fill(log)
    log.truncate_to(10)
    assert deleted_files(log)
    assert [o for o, _ in read_all(log)] == list(range(9))  # cut at the batch holding 10
    log.truncate_fully_and_start_at(500)
    log.append(make_batch(2))
    assert [o for o, _ in read_all(log)] == [500, 501]
    log.close()
    assert deleted_files(log) == []


def test_zero_delay_deletes_at_once(tmp_path):
    log = open_log(tmp_path, SMALL.merged({"retention.bytes": "0", "file.delete.delay.ms": "0"}))
    fill(log)
    assert log.delete_old_segments() > 0
    assert deleted_files(log) == []


def test_leftover_deleted_files_are_removed_at_startup(tmp_path):
    cfg = SMALL.merged({"retention.bytes": "0"})
    log = open_log(tmp_path, cfg, clock=Clock())
    fill(log)
    log.delete_old_segments()
    start = log.log_start_offset
    assert deleted_files(log)
    log.close_handles()  # a crash: pending deletions never ran
    again = open_log(tmp_path, cfg, log_start_offset=start)
    assert deleted_files(again) == []
    assert [o for o, _ in read_all(again)] == list(range(start, 180))


# -- retention below the high watermark ---------------------------------------------------


def test_appends_do_not_move_the_high_watermark(tmp_path):
    # Only the replica manager moves the HW; the log keeps it within its offsets.
    log = open_log(tmp_path)
    log.append(make_batch(3))
    log.append(make_batch(2) + make_batch(2))
    assert (log.high_watermark, log.log_end_offset) == (0, 7)
    log.high_watermark = 5
    log.append(make_batch(1))
    assert (log.high_watermark, log.log_end_offset) == (5, 8)
    log.high_watermark = 100  # clamped to the log end offset
    assert log.high_watermark == 8
    assert log.advance_log_start_offset(3) == 0  # inside the only segment: nothing deleted
    log.high_watermark = 1  # clamped to the log start offset
    assert (log.log_start_offset, log.high_watermark) == (3, 3)
    log.close()
    again = open_log(tmp_path, log_start_offset=3, high_watermark=100)  # clamped at load too
    assert (again.high_watermark, again.log_end_offset) == (8, 8)
    again.close()


def test_retention_never_deletes_at_or_above_the_high_watermark(tmp_path):
    clock = Clock(10**9)
    cfg = SMALL.merged({"retention.bytes": "0", "retention.ms": "1000"})
    log = open_log(tmp_path, cfg, clock=clock)
    fill(log, 150, committed=False)
    assert len(log.segments) > 4
    assert log.high_watermark == 0
    assert log.delete_old_segments() == 0  # everything is old and over budget, but uncommitted
    bases = [s.base_offset for s in log.segments]
    log.high_watermark = bases[3] + 1  # inside the fourth segment
    assert log.delete_old_segments() == 3
    assert log.log_start_offset == bases[3] <= log.high_watermark
    assert [o for o, _ in read_all(log)] == list(range(bases[3], 450))
    assert log.advance_log_start_offset(log.log_end_offset) == 0  # capped at the HW too
    assert log.log_start_offset == log.high_watermark == bases[3] + 1
    log.high_watermark = log.log_end_offset
    log.delete_old_segments()
    assert len(log.segments) == 1  # never the active segment


@settings(max_examples=25, deadline=None)
@given(
    batches=st.lists(st.integers(1, 6), min_size=1, max_size=60),
    hw_fraction=st.floats(0, 1),
    limit=st.integers(0, 6000),
)
def test_retention_respects_any_high_watermark(tmp_path_factory, batches, hw_fraction, limit):
    path = tmp_path_factory.mktemp("hw")
    cfg = SMALL.merged({"retention.bytes": str(limit), "file.delete.delay.ms": "0"})
    log = open_log(path, cfg)
    for i, n in enumerate(batches):
        log.append(make_batch(n, tag=i))
    end = log.log_end_offset
    hw = int(end * hw_fraction)
    log.high_watermark = hw
    log.delete_old_segments()
    assert log.log_start_offset <= hw
    assert [o for o, _ in read_all(log, hw)] == list(range(hw, end))
    segs = log.segments  # retention stopped for a reason: active, uncommitted or in budget
    assert len(segs) == 1 or segs[1].base_offset > hw or log.size_bytes() - segs[0].size < limit
    log.close()


# -- the append fast path validates exactly like batch.validate ----------------------------


def _outcome(fn):
    try:
        h = fn()
    except (CorruptRecordError, MessageTooLargeError) as e:
        return type(e).__name__
    return h


@settings(max_examples=150, deadline=None)
@given(
    pos=st.integers(0, 200),
    value=st.integers(0, 255),
    cut=st.integers(0, 40),
    max_bytes=st.sampled_from([b.HEADER_SIZE, 150, 1 << 20]),
)
def test_check_batch_agrees_with_validate(pos, value, cut, max_bytes):
    data = bytearray(make_batch(4, tag=7))
    pos %= len(data)
    data[pos] = value
    if cut:
        del data[len(data) - cut :]
    mv = memoryview(bytes(data))

    def reference():
        if len(mv) >= b.LOG_OVERHEAD and b.peek_size(mv) > max_bytes:
            raise MessageTooLargeError("too large")
        return _fields(b.validate(mv))

    got = _outcome(lambda: tuple(check_batch(mv, 0, len(mv), max_bytes, True)))
    assert got == _outcome(reference)


def _fields(h: b.BatchHeader) -> tuple:
    return (
        h.base_offset,
        h.batch_length,
        h.leader_epoch,
        h.magic,
        h.checksum,
        h.attributes,
        h.last_offset_delta,
        h.first_timestamp,
        h.max_timestamp,
        h.producer_id,
        h.producer_epoch,
        h.base_sequence,
        h.record_count,
    )


def test_fast_path_and_general_path_write_the_same_bytes(tmp_path):
    one = open_log(tmp_path / "a", LogConfig())
    many = open_log(tmp_path / "b", LogConfig())
    batches = [make_batch(3, tag=i, ts=100 + i) for i in range(6)]
    for x in batches:
        one.append(x, leader_epoch=2)  # one batch per call: the fast path
    many.append(b"".join(batches[:3]), leader_epoch=2)  # several per call: the general path
    many.append(b"".join(batches[3:]), leader_epoch=2)
    assert one.read(0, 1 << 20).read() == many.read(0, 1 << 20).read()
    assert one.active_segment.max_timestamp == many.active_segment.max_timestamp == 105
    assert one.offset_for_timestamp(103) == many.offset_for_timestamp(103) == (9, 103)


def test_fast_path_rejects_bad_input_whole(tmp_path):
    log = open_log(tmp_path)
    good = make_batch(2)
    bad = bytearray(good)
    bad[-1] ^= 1
    with pytest.raises(CorruptRecordError, match="checksum"):
        log.append(bytes(bad))
    with pytest.raises(CorruptRecordError, match="empty"):
        log.append(b"")
    with pytest.raises(MessageTooLargeError):
        open_log(tmp_path / "x", SMALL.merged({"max.message.bytes": "100"})).append(good)
    assert log.log_end_offset == 0 and log.active_segment.size == 0
    log.append(good)
    assert [o for o, _ in read_all(log)] == [0, 1]
