"""What each partition may cost with thousands of them: files, fsyncs and scans.

Issue 16: creating, opening, checkpointing and closing a log that nobody writes to
must cost (next to) nothing, and a restart after a crash scans only what lies past
each log's recovery point.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from logmq.storage import checkpoint
from logmq.storage.leader_epoch import LeaderEpochCache
from logmq.storage.log_manager import RECOVERY_POINT_CHECKPOINT, LogManager
from logmq.storage.segment import LogSegment

from .helpers import make_batch, read_all
from .test_log_manager import SMALL, crash, wait_for


def count_scans(monkeypatch) -> list[tuple[str, int]]:
    """Record (log directory, segment base) of every segment recovery scans."""
    scanned: list[tuple[str, int]] = []
    real = LogSegment.recover

    def recover(self: LogSegment, **kw) -> int:
        scanned.append((self.dir.name, self.base_offset))
        return real(self, **kw)

    monkeypatch.setattr(LogSegment, "recover", recover)
    return scanned


async def test_new_logs_are_made_off_the_event_loop_with_one_fsync(tmp_path, monkeypatch):
    mgr = LogManager(tmp_path)
    await mgr.start()
    synced: list[Path] = []
    real_fsync_dir = checkpoint.fsync_dir
    monkeypatch.setattr(
        checkpoint, "fsync_dir", lambda path: (synced.append(Path(path)), real_fsync_dir(path))
    )
    made = mgr.create_logs([("t", p) for p in range(50)])
    assert len(made) == 50 and mgr.create_logs([("t", 7)]) == []  # exists already
    assert [p.log_end_offset for p in made[:2]] == [0, 0] and read_all(made[0]) == []
    plog = made[7]
    await mgr.append(plog, make_batch(2))  # before or after its directory: either works
    await mgr._dirs_made()
    assert synced.count(tmp_path) == 1  # all 50 directories, one fsync of the data dir
    assert all((tmp_path / f"t-{p}").is_dir() for p in range(50))
    assert [n for n in os.listdir(plog.dir) if n.endswith(".log")] == ["00000000000000000000.log"]
    # the worker made every first segment file too: a first write only opens it
    assert os.listdir(made[0].dir) == ["00000000000000000000.log"]
    assert os.path.getsize(made[0].dir / "00000000000000000000.log") == 0

    synced_fds: list[int] = []
    real_fsync = checkpoint.fsync
    monkeypatch.setattr(checkpoint, "fsync", lambda fd: (synced_fds.append(fd), real_fsync(fd)))
    await mgr.sync(plog)
    # Its first sync makes the new directory entries durable (2) and writes the epoch
    # its append began, kept in memory until then (the file and its directory: 2).
    assert len(synced_fds) == 4 and not plog.leader_epochs.unflushed
    await mgr.sync(plog)
    assert len(synced_fds) == 4
    monkeypatch.undo()
    await mgr.stop()

    mgr = LogManager(tmp_path)
    await mgr.start()
    assert len(mgr.logs()) == 50 and len(read_all(mgr.get_log("t", 7))) == 2
    await mgr.stop()


async def test_an_epoch_can_start_before_the_first_write(tmp_path):
    mgr = LogManager(tmp_path)
    await mgr.start()
    plog = mgr.create_log("t", 0)
    plog.leader_epochs.assign(3, 0)  # a new leader, before any record: makes the directory
    assert LeaderEpochCache(plog.dir / "leader-epoch-checkpoint").entries() == [(3, 0)]
    await mgr.append(plog, make_batch(2), leader_epoch=3)
    await mgr.stop()
    mgr = LogManager(tmp_path)
    await mgr.start()
    assert mgr.get_log("t", 0).leader_epochs.entries() == [(3, 0)]
    await mgr.stop()


async def test_crash_restart_scans_only_logs_past_their_recovery_point(tmp_path, monkeypatch):
    mgr = LogManager(tmp_path)
    await mgr.start()
    flushed, dirty, _idle, grown = (mgr.create_log("t", p) for p in range(4))
    for plog in (flushed, dirty, grown):
        await mgr.append(plog, make_batch(3))
    await mgr.sync(flushed)
    await mgr.sync(grown)
    await mgr.checkpoint()
    await mgr.append(grown, make_batch(2))  # past the checkpointed recovery point
    await crash(mgr)

    scanned = count_scans(monkeypatch)
    mgr = LogManager(tmp_path)
    await mgr.start()
    assert sorted(scanned) == [("t-1", 0), ("t-3", 0)]
    ends = {p.partition: p.log_end_offset for p in mgr.logs()}
    assert ends == {0: 3, 1: 3, 2: 0, 3: 5}
    assert len(read_all(mgr.get_log("t", 0))) == 3
    await mgr.stop()


async def test_crash_restart_scans_from_the_segment_holding_the_recovery_point(
    tmp_path, monkeypatch
):
    mgr = LogManager(tmp_path)
    await mgr.start()
    plog = mgr.create_log("s", 0, SMALL)
    for i in range(30):
        await mgr.append(plog, make_batch(2, tag=i))
    await mgr.sync(plog)
    rp = plog.recovery_point
    for i in range(30, 40):
        await mgr.append(plog, make_batch(2, tag=i))
    await mgr.checkpoint()
    bases = [s.base_offset for s in plog.segments]
    first = max(b for b in bases if b <= rp)
    assert 0 < first < bases[-1]  # segments on both sides of the one to scan from
    await crash(mgr)

    scanned = count_scans(monkeypatch)
    mgr = LogManager(tmp_path, topic_overrides={"s": SMALL})
    await mgr.start()
    assert scanned == [("s-0", b) for b in bases if b >= first]
    assert len(read_all(mgr.get_log("s", 0))) == 80
    await mgr.stop()


async def test_unchanged_checkpoints_are_not_rewritten(tmp_path, monkeypatch):
    mgr = LogManager(tmp_path)
    await mgr.start()
    plogs = mgr.create_logs([("t", p) for p in range(5)])
    await mgr.append(plogs[0], make_batch(2))
    await mgr.checkpoint()
    written: list[str] = []
    real = checkpoint.write_offsets

    def write_offsets(path, *args) -> None:
        written.append(Path(path).name)
        real(path, *args)

    monkeypatch.setattr(checkpoint, "write_offsets", write_offsets)
    await mgr.checkpoint()
    assert written == []  # idle: no rewrites, no fsyncs
    plogs[0].high_watermark = 2
    await mgr.checkpoint()
    assert written == ["replication-offset-checkpoint"]
    await mgr.stop()


async def test_stopping_unchanged_logs_fsyncs_nothing_but_the_marker(tmp_path, monkeypatch):
    mgr = LogManager(tmp_path)
    await mgr.start()
    for plog in mgr.create_logs([("t", p) for p in range(20)]):
        await mgr.append(plog, make_batch(2))
    await mgr.stop()
    snapshots = {p: p.stat().st_mtime_ns for p in tmp_path.glob("t-*/*.snapshot")}
    assert len(snapshots) == 20

    mgr = LogManager(tmp_path)
    await mgr.start()
    syncs: list[int] = []
    monkeypatch.setattr(checkpoint, "fsync", syncs.append)
    monkeypatch.setattr(checkpoint, "fdatasync", syncs.append)
    await mgr.stop()
    assert len(syncs) == 2  # the clean-shutdown marker and its directory
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("t-*/*.snapshot")} == snapshots


async def test_clean_restart_needs_no_segment_open(tmp_path):
    mgr = LogManager(tmp_path)
    await mgr.start()
    for plog in mgr.create_logs([("t", p) for p in range(10)]):
        await mgr.append(plog, make_batch(3))
    await mgr.stop()

    mgr = LogManager(tmp_path)
    await mgr.start()
    assert all(not s.is_open() for plog in mgr.logs() for s in plog.segments)
    assert {plog.log_end_offset for plog in mgr.logs()} == {3}
    await mgr.stop()


def test_recovery_point_checkpoint_keeps_positions_and_reads_version_0(tmp_path):
    path = tmp_path / RECOVERY_POINT_CHECKPOINT
    offsets = {("a", 0): 12, ("a", 1): 0, ("b-c", 3): 7}
    checkpoint.write_offsets(path, offsets, {("a", 0): (10, 4096), ("b-c", 3): (0, 99)})
    assert path.read_text().splitlines()[:3] == ["1", "3", "a 0 12 10 4096"]
    assert checkpoint.read_offsets_and_positions(path) == (
        offsets,
        {("a", 0): (10, 4096), ("b-c", 3): (0, 99)},
    )
    checkpoint.write_offsets(path, offsets)  # version 0: offsets only
    assert checkpoint.read_offsets_and_positions(path) == (offsets, {})


async def test_a_log_gone_quiet_is_flushed_in_the_background(tmp_path, monkeypatch):
    """Its recovery point catches up, so a crash later scans nothing of it."""
    mgr = LogManager(tmp_path, checkpoint_interval_ms=10)
    await mgr.start()
    quiet, busy = mgr.create_logs([("t", 0), ("t", 1)])
    await mgr.append(quiet, make_batch(3))
    await wait_for(lambda: quiet.recovery_point == quiet.log_end_offset == 3)
    assert busy.recovery_point == 0
    await wait_for(
        lambda: checkpoint.read_offsets(tmp_path / RECOVERY_POINT_CHECKPOINT).get(("t", 0)) == 3
    )
    await crash(mgr)

    scanned = count_scans(monkeypatch)
    mgr = LogManager(tmp_path)
    await mgr.start()
    assert scanned == [] and mgr.get_log("t", 0).log_end_offset == 3
    await mgr.stop()


async def test_produces_waiting_for_new_logs_keep_their_order(tmp_path, monkeypatch):
    """Requests that come while the worker makes the directories wait (once each, not
    once per partition) and leave in the order they came, later ones behind any still
    waiting: each starts its appends before the next resumes, so a partition's records
    keep their produce order."""
    import threading

    from logmq.storage import log_manager

    release = threading.Event()  # the worker makes nothing until the requests wait
    real = log_manager.make_log_dirs
    monkeypatch.setattr(log_manager, "make_log_dirs", lambda d, f: (release.wait(10), real(d, f)))
    mgr = LogManager(tmp_path)
    await mgr.start()
    made = mgr.create_logs([("t", p) for p in range(200)])
    keys = [("t", 198), ("t", 199)]
    gate = mgr._dir_gates[made[-1]]

    async def request(i: int) -> list[int]:
        await mgr.new_logs_made(keys)
        tasks = [asyncio.ensure_future(mgr.append(p, make_batch(1, tag=i))) for p in made[-2:]]
        return [info.first_offset for info in await asyncio.gather(*tasks)]

    later: list[asyncio.Future[list[int]]] = []
    real_open = gate.open

    def open_while_more_arrive() -> None:
        real_open()  # the first waiter is woken; none has resumed yet
        later.extend(asyncio.ensure_future(request(i)) for i in range(20, 40))

    gate.open = open_while_more_arrive
    first = [asyncio.ensure_future(request(i)) for i in range(20)]
    await wait_for(lambda: len(gate._queue) == 20)  # all waiting for the worker
    release.set()
    await wait_for(lambda: len(later) == 20)
    offsets = await asyncio.gather(*first, *later)
    assert offsets == [[i, i] for i in range(40)]
    for plog in made[-2:]:
        assert [v.split(b":")[0] for _, v in read_all(plog)] == [b"%d" % i for i in range(40)]
    assert not mgr._dir_gates  # drained: later requests go straight on
    await mgr.stop()
