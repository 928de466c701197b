"""A full disk: the free-space guard, and writes that hit ENOSPC leave nothing half-done.

ENOSPC is simulated by patching the system calls; tests/e2e/test_disk_full.py fills a
real tmpfs under a real broker.
"""

from __future__ import annotations

import errno
import logging
import os
from types import SimpleNamespace

import pytest

from logmq.errors import DiskFullError, ErrorCode, error_for
from logmq.storage import checkpoint, index
from logmq.storage import segment as segment_mod
from logmq.storage.config import LogConfig
from logmq.storage.disk_space import GIB, DiskSpace, default_min_free_bytes
from logmq.storage.log_manager import LogManager
from logmq.storage.partition_log import PartitionLog

from .helpers import make_batch, read_all

SMALL = LogConfig.from_dict(
    {"segment.bytes": "1024", "index.interval.bytes": "128", "segment.index.bytes": "4096"}
)


def enospc(*_args, **_kw):
    raise OSError(errno.ENOSPC, "No space left on device")


class FakeDisk:
    """statvfs and a clock for DiskSpace, in bytes and seconds."""

    def __init__(self, free: int, total: int = 100 << 20) -> None:
        self.free, self.total, self.now, self.calls = free, total, 0.0, 0

    def statvfs(self, _path):
        self.calls += 1
        return SimpleNamespace(f_bavail=self.free, f_frsize=1, f_blocks=self.total)

    def clock(self) -> float:
        return self.now


def disk_space(fake: FakeDisk, min_free: int | None = 1000) -> DiskSpace:
    return DiskSpace("/data", min_free, statvfs=fake.statvfs, clock=fake.clock)


# -- the guard --------------------------------------------------------------------------


def test_default_guard_is_the_smaller_of_1gib_and_5_percent():
    assert default_min_free_bytes(1000) == 50
    assert default_min_free_bytes(1 << 40) == GIB
    fake = FakeDisk(free=10_000, total=100_000)
    d = disk_space(fake, None)
    d.refresh()
    assert d.min_free_bytes == 5_000


def test_guard_refuses_below_the_threshold_and_resumes_by_itself(caplog):
    fake = FakeDisk(free=5000)
    d = disk_space(fake)
    caplog.set_level(logging.INFO, "logmq.storage.disk_space")
    d.check_append(1000)
    d.appended(1000)
    d.check_append(1000)
    d.appended(1000)
    fake.free = 3000  # the writes above landed
    with pytest.raises(DiskFullError) as e:
        d.check_append(2500)  # would leave 500 < 1000: refused before writing
    assert "disk full" in str(e.value) and "/data" in str(e.value) and "bytes free" in str(e.value)
    assert e.value.code is ErrorCode.KAFKA_STORAGE_FULL
    calls = fake.calls
    for _ in range(100):  # refused at once, without a statvfs per request
        with pytest.raises(DiskFullError):
            d.check_append(10)
    assert fake.calls == calls
    fullness = [r for r in caplog.records if "disk full" in r.getMessage()]
    assert len(fullness) == 1 and fullness[0].levelno == logging.ERROR  # logged once
    fake.free = 50_000  # retention / a topic delete freed space
    fake.now += 1.0
    d.check_append(2000)
    assert not d.full
    back = [r for r in caplog.records if "available again" in r.getMessage()]
    assert len(back) == 1


def test_statvfs_runs_at_most_once_a_second_while_there_is_room():
    fake = FakeDisk(free=1 << 30)
    d = disk_space(fake)
    for _ in range(1000):
        d.check_append(1000)
        d.appended(1000)
    assert fake.calls == 1
    fake.now += 1.0
    d.check_append(1000)
    assert fake.calls == 2


def test_an_enospc_marks_the_disk_full_until_room_returns():
    fake = FakeDisk(free=1 << 20)
    d = disk_space(fake, 0)
    d.check_append(500)
    fake.free = 100  # something else filled the disk
    d.write_failed(500)
    assert d.full
    with pytest.raises(DiskFullError, match="no room for a 500-byte write"):
        d.check_append(10)
    fake.free, fake.now = 400, fake.now + 1  # not enough for the refused write yet
    assert d.poll()
    fake.free, fake.now = 5000, fake.now + 1
    assert not d.poll()
    d.check_append(10)


def test_disk_full_is_not_retried_by_clients():
    err = error_for(ErrorCode.KAFKA_STORAGE_FULL, "disk full: x")
    assert isinstance(err, DiskFullError) and not err.retriable


# -- files that must never be left torn ------------------------------------------------


def test_checkpoint_write_on_a_full_disk_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "recovery-point-checkpoint"
    checkpoint.write_offsets(path, {("t", 0): 5})
    before = path.read_bytes()

    def write_half_then_fail(fd, data):
        real_write(fd, bytes(data[:3]))
        raise OSError(errno.ENOSPC, "No space left on device")

    real_write = os.write
    monkeypatch.setattr(checkpoint.os, "write", write_half_then_fail)
    with pytest.raises(OSError):
        checkpoint.write_offsets(path, {("t", 0): 9, ("t", 1): 7})
    monkeypatch.setattr(checkpoint.os, "write", real_write)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temp file left
    assert checkpoint.read_offsets(path) == {("t", 0): 5}


def test_index_flush_on_a_full_disk_keeps_a_valid_sparse_index(tmp_path, monkeypatch):
    log = PartitionLog(tmp_path / "t-0", SMALL)
    for i in range(6):
        log.append(make_batch(3, tag=i))
    seg = log.active_segment
    assert seg.index.entries > 1
    monkeypatch.setattr(index.os, "pwrite", enospc)
    seg.close_handles()  # flushes the active index: fails, keeps what the file holds
    monkeypatch.undo()
    assert os.path.getsize(seg.index_path) == 0
    assert [o for o, _ in read_all(log)] == list(range(18))
    log.append(make_batch(2, tag=9))
    log.close()
    again = PartitionLog(tmp_path / "t-0", SMALL)
    assert [o for o, _ in read_all(again)] == list(range(20))


def test_a_roll_that_hits_a_full_disk_is_retried_when_space_returns(tmp_path, monkeypatch):
    log = PartitionLog(tmp_path / "t-0", SMALL)
    while len(log.segments) == 1 and log.active_segment.size + 200 < SMALL.segment_bytes:
        log.append(make_batch(3, tag=log.log_end_offset))
    end, segments = log.log_end_offset, len(log.segments)
    real_segment = log._segment

    def no_new_files(base, **kw):
        if kw.get("create"):
            enospc()
        return real_segment(base, **kw)

    monkeypatch.setattr(log, "_segment", no_new_files)
    for _ in range(3):  # the roll fails: a clear error, nothing written, not poisoned
        with pytest.raises(DiskFullError, match="disk full rolling"):
            log.append(make_batch(20, tag=1))
        assert log.log_end_offset == end and len(log.segments) == segments
    monkeypatch.setattr(log, "_segment", real_segment)
    info = log.append(make_batch(20, tag=2))
    assert info.first_offset == end and len(log.segments) == segments + 1
    assert [o for o, _ in read_all(log)] == list(range(end + 20))


# -- the log manager ----------------------------------------------------------------------


async def test_manager_refuses_produce_below_the_guard_and_resumes(tmp_path, monkeypatch):
    fake = FakeDisk(free=1 << 30)
    mgr = LogManager(tmp_path, min_free_bytes=1 << 20)
    mgr.disk = DiskSpace(tmp_path, 1 << 20, statvfs=fake.statvfs, clock=fake.clock)
    plog = mgr.create_log("t", 0)
    await mgr.append(plog, make_batch(2))
    fake.free, fake.now = 1000, fake.now + 1
    with pytest.raises(DiskFullError):
        await mgr.append(plog, make_batch(2))
    assert plog.log_end_offset == 2
    plog.append(make_batch(1))  # internal writes (offset commits) do not ask the guard
    fake.free, fake.now = 1 << 30, fake.now + 1
    assert (await mgr.append(plog, make_batch(2))).first_offset == 3


async def test_manager_turns_enospc_into_a_clear_error_and_resumes(tmp_path, monkeypatch):
    fake = FakeDisk(free=1 << 30)
    mgr = LogManager(tmp_path, min_free_bytes=0)
    mgr.disk = DiskSpace(tmp_path, 0, statvfs=fake.statvfs, clock=fake.clock)
    plog = mgr.create_log("t", 0)
    await mgr.append(plog, make_batch(2))
    monkeypatch.setattr(segment_mod, "_pwritev", enospc)
    fake.free = 10  # the disk filled up behind the estimate's back
    with pytest.raises(DiskFullError, match=r"disk full: .*data dir .* bytes free"):
        await mgr.append(plog, make_batch(3))
    assert plog.log_end_offset == 2 and mgr.disk.full
    monkeypatch.setattr(segment_mod, "_pwritev", os.pwritev)
    with pytest.raises(DiskFullError):  # refused without trying until space is seen
        await mgr.append(plog, make_batch(3))
    fake.free, fake.now = 1 << 30, fake.now + 1
    assert (await mgr.append(plog, make_batch(3))).first_offset == 2
    assert [o for o, _ in read_all(plog)] == list(range(5))


async def test_deleting_a_log_on_a_full_disk_frees_its_space(tmp_path, monkeypatch):
    """The no-resume bug: delete flushed the active index first, which failed on ENOSPC,
    so the directory (and its space) stayed until a restart."""
    mgr = LogManager(tmp_path)
    plog = mgr.create_log("big", 0, {"index.interval.bytes": "128"})
    for i in range(20):
        await mgr.append(plog, make_batch(3, tag=i))
    monkeypatch.setattr(index.os, "pwrite", enospc)
    mgr.delete_log("big", 0)
    assert not any(p.name.startswith("big-0") for p in tmp_path.iterdir())
    assert mgr.get_log("big", 0) is None


def test_metrics_show_free_space_and_the_full_state():
    from logmq.broker.metrics import BrokerMetrics

    fake = FakeDisk(free=5000)
    d = disk_space(fake)
    metrics = BrokerMetrics()
    metrics.register_storage(d)
    d.refresh()
    text = metrics.render().decode()
    assert "logmq_storage_free_bytes 5000.0" in text
    assert "logmq_storage_min_free_bytes 1000.0" in text
    assert "logmq_storage_disk_full 0.0" in text
    fake.free, fake.now = 10, 1.0
    d.poll()
    assert "logmq_storage_disk_full 1.0" in metrics.render().decode()
