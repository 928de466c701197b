"""LogManager: lifecycle, clean-shutdown marker, configs, durability policies, chores."""

from __future__ import annotations

import asyncio
import time

import pytest

from logmq.errors import InvalidConfigError
from logmq.storage import checkpoint
from logmq.storage.checkpoint import read_offsets
from logmq.storage.config import LogConfig
from logmq.storage.log_manager import CLEAN_SHUTDOWN, LogManager

from .helpers import commit, make_batch, read_all

SMALL = {"segment.bytes": "2048", "index.interval.bytes": "256"}


async def wait_for(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        await asyncio.sleep(0.005)


async def crash(mgr: LogManager) -> None:
    """Stop without flushing, checkpoints or marker (what kill -9 leaves behind)."""
    for t in mgr._tasks:
        t.cancel()
    await asyncio.gather(*mgr._tasks, return_exceptions=True)
    for plog in mgr.logs():
        plog.close_handles()
    mgr.started = False


async def test_leader_epochs_survive_two_crashes_of_a_quiet_log(tmp_path):
    """A log written once and then idle, its broker killed twice: the first recovery
    rebuilds the epochs from the batches and sets the recovery point to the log end;
    the checkpoint written before the second kill must not let the second start skip
    the scan while the epoch file was never written (the transactional soak found
    partitions answering OffsetForLeaderEpoch with "no such epoch", which sent
    librdkafka consumers back to the beginning)."""
    mgr = LogManager(tmp_path)
    await mgr.start()
    plog = mgr.create_log("quiet", 0, SMALL)
    for i in range(10):
        await mgr.append(plog, make_batch(2, tag=i), leader_epoch=3)
    await crash(mgr)  # no flush: no epoch file, no recovery point

    mgr = LogManager(tmp_path)
    await mgr.start()
    assert mgr.recovered_logs == ["quiet-0"]
    assert mgr.get_log("quiet", 0).leader_epochs.entries() == [(3, 0)]
    mgr.write_checkpoints()  # what the periodic checkpoint does while the log is quiet
    assert read_offsets(tmp_path / "recovery-point-checkpoint") == {("quiet", 0): 20}
    await crash(mgr)

    mgr = LogManager(tmp_path)
    await mgr.start()
    plog = mgr.get_log("quiet", 0)
    assert plog.leader_epochs.entries() == [(3, 0)]
    assert plog.leader_epochs.end_offset_for_epoch(3, plog.log_end_offset) == (3, 20)
    await mgr.stop()


async def test_unwritten_epochs_hold_the_recovery_point_back(tmp_path):
    """Epochs only in memory keep the recovery point last checkpointed (none: a full
    scan), whatever path left them unwritten."""
    mgr = LogManager(tmp_path)
    await mgr.start()
    plog = mgr.create_log("held", 0, SMALL)
    await mgr.append(plog, make_batch(2), leader_epoch=1)
    await mgr.sync(plog)
    mgr.write_checkpoints()
    assert read_offsets(tmp_path / "recovery-point-checkpoint") == {("held", 0): 2}
    plog.leader_epochs.assign(4, 2, flush=False)  # a leadership begun, not flushed yet
    await mgr.append(plog, make_batch(2), leader_epoch=4)
    plog.recovery_point = plog.log_end_offset  # as if flushed without the epoch job
    mgr.write_checkpoints()
    assert read_offsets(tmp_path / "recovery-point-checkpoint") == {("held", 0): 2}
    await mgr.sync(plog)  # the flush writes the epochs: the recovery point moves on
    mgr.write_checkpoints()
    assert read_offsets(tmp_path / "recovery-point-checkpoint") == {("held", 0): 4}
    await mgr.stop()


async def test_clean_and_unclean_restart(tmp_path):
    mgr = LogManager(tmp_path)
    await mgr.start()
    plog = mgr.create_log("orders", 0, SMALL)
    for i in range(30):
        await mgr.append(plog, make_batch(2, tag=i))
    plog.high_watermark = 40
    await mgr.stop()
    assert (tmp_path / CLEAN_SHUTDOWN).exists()
    assert read_offsets(tmp_path / "replication-offset-checkpoint") == {("orders", 0): 40}
    assert read_offsets(tmp_path / "recovery-point-checkpoint") == {("orders", 0): 60}

    mgr = LogManager(tmp_path, topic_overrides={"orders": SMALL})  # the caller's metadata
    await mgr.start()
    assert not (tmp_path / CLEAN_SHUTDOWN).exists() and mgr.recovered_logs == []
    plog = mgr.get_log("orders", 0)
    assert plog.high_watermark == 40 and plog.config.segment_bytes == 2048
    assert len(read_all(plog)) == 60
    await mgr.append(plog, make_batch(3, tag=99))
    await crash(mgr)

    mgr = LogManager(tmp_path)
    await mgr.start()
    assert mgr.recovered_logs == ["orders-0"]
    assert [o for o, _ in read_all(mgr.get_log("orders", 0))] == list(range(63))
    await mgr.stop()


async def test_topic_config_comes_from_the_caller_and_validates(tmp_path):
    mgr = LogManager(tmp_path, LogConfig.from_dict({"retention.ms": "1000"}))
    await mgr.start()
    p0 = mgr.create_log("t", 0)
    p1 = mgr.create_log("t", 1)
    mgr.set_topic_config("t", {"flush.messages": "3"})
    assert p0.config.flush_messages == 3 and p1.config.retention_ms == 1000
    with pytest.raises(InvalidConfigError):
        mgr.set_topic_config("t", {"flush.messages": "zero"})
    assert p0.config.flush_messages == 3
    await mgr.stop()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file() and "config" in p.name) == []

    # The storage keeps no copy: without overrides from its caller a log opens with defaults.
    mgr = LogManager(tmp_path, LogConfig.from_dict({"retention.ms": "1000"}))
    await mgr.start()
    assert mgr.get_log("t", 1).config.flush_messages is None
    assert mgr.topic_overrides("t") == {}
    await mgr.stop()

    calls = []

    def overrides():
        calls.append(1)
        return {"t": {"flush.messages": "3"}}

    mgr = LogManager(
        tmp_path, LogConfig.from_dict({"retention.ms": "1000"}), topic_overrides=overrides
    )
    await mgr.start()
    assert calls == [1]
    assert mgr.get_log("t", 1).config.flush_messages == 3
    assert mgr.topic_overrides("t") == {"flush.messages": "3"}
    mgr.delete_log("t", 0)
    mgr.delete_log("t", 1)
    assert mgr.logs() == [] and not any(tmp_path.glob("t-*"))
    assert mgr.topic_overrides("t") == {}
    await mgr.stop()


async def test_group_commit_shares_fsyncs(tmp_path, monkeypatch):
    calls = []
    real = checkpoint.fdatasync

    def counting(fd):
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(checkpoint, "fdatasync", counting)
    mgr = LogManager(tmp_path)
    await mgr.start()
    plog = mgr.create_log("gc", 0, {"group.commit": "true"})
    infos = await asyncio.gather(*(mgr.append(plog, make_batch(1, tag=i)) for i in range(64)))
    assert sorted(i.first_offset for i in infos) == list(range(64))
    assert plog.recovery_point == 64  # every append returned only after its fsync
    assert 1 <= len(calls) < 64
    await mgr.stop()


async def test_flush_messages_and_flush_ms(tmp_path):
    mgr = LogManager(tmp_path, flush_check_interval_ms=10)
    await mgr.start()
    fm = mgr.create_log("fm", 0, {"flush.messages": "5"})
    for i in range(4):
        await mgr.append(fm, make_batch(1, tag=i))
    assert fm.recovery_point == 0
    await mgr.append(fm, make_batch(1, tag=4))
    assert fm.recovery_point == 5
    ms = mgr.create_log("ms", 0, {"flush.ms": "20"})
    await mgr.append(ms, make_batch(2))
    await wait_for(lambda: ms.recovery_point == 2)
    await mgr.stop()


async def test_background_retention_and_checkpoints(tmp_path):
    mgr = LogManager(tmp_path, retention_check_interval_ms=10, checkpoint_interval_ms=10)
    await mgr.start()
    plog = mgr.create_log("r", 0, {**SMALL, "retention.bytes": "4096"})
    for i in range(100):
        await mgr.append(plog, make_batch(2, tag=i))
        commit(plog)  # as the replica manager does after each append
    await wait_for(lambda: plog.log_start_offset > 0 and plog.size_bytes() < 4096 + 2048)
    await wait_for(
        lambda: read_offsets(tmp_path / "log-start-offset-checkpoint").get(("r", 0), 0) > 0
    )
    # rolled segments get flushed in the background, moving the recovery point
    await wait_for(lambda: plog.recovery_point >= plog.active_segment.base_offset)
    await mgr.stop()


async def test_many_partitions_bounded_open_files(tmp_path, no_fsync):
    mgr = LogManager(tmp_path, max_open_segments=8)
    await mgr.start()
    logs = [mgr.create_log("many", p, SMALL) for p in range(40)]
    for round_ in range(3):
        for plog in logs:
            await mgr.append(plog, make_batch(2, tag=round_))
    assert len(mgr.cache) <= 8
    assert sum(s.is_open() for p in logs for s in p.segments) <= 8
    for plog in logs:
        assert len(read_all(plog)) == 6
    await mgr.stop()


async def test_unreadable_log_stays_offline(tmp_path):
    mgr = LogManager(tmp_path)
    await mgr.start()
    mgr.create_log("ok", 0)
    bad = mgr.create_log("bad", 0)
    await mgr.append(bad, make_batch(1))
    await mgr.stop()
    (bad.dir / "leader-epoch-checkpoint").write_text("garbage")
    mgr = LogManager(tmp_path)
    await mgr.start()
    assert mgr.get_log("ok", 0) is not None and ("bad", 0) in mgr.offline_logs
    mgr.delete_log("bad", 0)  # an offline log can still be deleted
    assert not (tmp_path / "bad-0").exists() and not mgr.offline_logs
    await mgr.stop()


async def test_idle_segments_are_closed(tmp_path, no_fsync):
    mgr = LogManager(tmp_path, idle_close_ms=40)
    await mgr.start()
    plog = mgr.create_log("idle", 0, SMALL)
    for i in range(30):
        await mgr.append(plog, make_batch(2, tag=i))
    assert len(mgr.cache) > 0
    await wait_for(lambda: len(mgr.cache) == 0)
    assert not any(s.is_open() for s in plog.segments)
    await mgr.append(plog, make_batch(1))  # reopens on demand
    assert len(read_all(plog)) == 61
    await mgr.stop()


async def test_group_commit_acks_survive_losing_unflushed_bytes(tmp_path):
    mgr = LogManager(tmp_path)
    await mgr.start()
    plog = mgr.create_log("dur", 0, {**SMALL, "group.commit": "true"})
    acked = await asyncio.gather(*(mgr.append(plog, make_batch(2, tag=i)) for i in range(40)))
    mgr.write_checkpoints()
    plog.append(make_batch(5, tag=99))  # written but never synced: may be lost
    segs = list(plog.segments)
    await crash(mgr)
    for seg in segs:  # the machine loses everything not fsynced
        with open(seg.log_path, "r+b") as f:
            f.truncate(seg.flushed_size)
    mgr = LogManager(tmp_path)
    await mgr.start()
    got = {o for o, _ in read_all(mgr.get_log("dur", 0))}
    assert all(o in got for info in acked for o in range(info.first_offset, info.last_offset + 1))
    await mgr.stop()
