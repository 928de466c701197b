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


async def test_a_clean_stop_writes_epochs_and_snapshots_of_all_logs_with_two_syncs(
    tmp_path, monkeypatch
):
    """Closing many logs writes each one's epoch checkpoint and producer snapshot with
    two file-system syncs in all (no fsync per file), and the next start reads them."""
    if checkpoint._libc_syncfs() is None:
        import pytest

        pytest.skip("no syncfs that reports write-back errors here")
    mgr = LogManager(tmp_path)
    await mgr.start()
    logs = mgr.create_logs([("t", p) for p in range(40)])
    for i, plog in enumerate(logs):
        batch = make_batch(2, producer_id=100 + i, producer_epoch=0, base_sequence=0)
        await mgr.append(plog, batch, leader_epoch=5)
    await mgr._dirs_made()
    for plog in logs:
        await mgr.sync(plog)  # the segments are durable: only the small files remain
        plog.leader_epochs.assign(6, 1, flush=False)  # (an epoch must start below the end)
    assert all(p.leader_epochs.unflushed and p.needs_snapshot for p in logs)

    fsyncs: list[int] = []
    syncs: list[int] = []
    real_fsync, real_syncfs = checkpoint.fsync, checkpoint.syncfs
    monkeypatch.setattr(checkpoint, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd)))
    monkeypatch.setattr(checkpoint, "syncfs", lambda fd: (syncs.append(fd), real_syncfs(fd)))
    await mgr.stop()
    assert len(syncs) == 2
    # Three offset checkpoints and the clean-shutdown marker, each file and directory
    # (not 4 more for each of the 40 logs).
    assert len(fsyncs) <= 8
    assert not any(n.endswith(".tmp") for _, _, ns in os.walk(tmp_path) for n in ns)
    monkeypatch.undo()

    mgr = LogManager(tmp_path)
    await mgr.start()
    for i in range(40):
        plog = mgr.get_log("t", i)
        assert plog.leader_epochs.entries() == [(5, 0), (6, 1)]
        assert plog.producer_state.producers[100 + i].batches[-1].last_seq == 1
    await mgr.stop()


def test_atomic_write_many_replaces_what_it_can_and_nothing_when_a_sync_fails(
    tmp_path, monkeypatch
):
    for name in ("a", "b"):
        (tmp_path / name).write_bytes(b"old")
    monkeypatch.setattr(checkpoint, "SYNCFS_MIN_FILES", 2)
    items = [(tmp_path / "a", b"new a"), (tmp_path / "gone" / "c", b"c"), (tmp_path / "b", b"B")]
    failed = checkpoint.atomic_write_many(items, tmp_path)
    assert list(failed) == [1] and isinstance(failed[1], FileNotFoundError)
    assert (tmp_path / "a").read_bytes() == b"new a" and (tmp_path / "b").read_bytes() == b"B"

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    if checkpoint._libc_syncfs() is not None:
        monkeypatch.setattr(checkpoint, "syncfs", broken)
        import pytest

        with pytest.raises(OSError):
            checkpoint.atomic_write_many([(tmp_path / "a", b"newer")] * 2, tmp_path)
        assert (tmp_path / "a").read_bytes() == b"new a"  # the old content stays
        assert sorted(os.listdir(tmp_path)) == ["a", "b"]  # and no temp file
    # Without a syncfs that reports errors, each file goes through atomic_write.
    monkeypatch.setattr(checkpoint, "_libc_syncfs", lambda: None)
    assert checkpoint.atomic_write_many([(tmp_path / "b", b"bb")], tmp_path) == {}
    assert (tmp_path / "b").read_bytes() == b"bb"


async def test_a_stop_writes_no_epoch_file_for_an_epoch_begun_at_the_log_end(tmp_path, monkeypatch):
    """A restarted leader starts a new epoch at the log end of every partition; with no
    record in it, a start drops it again (truncate_from_end), so a clean stop need not
    write 10,000 files for it. An epoch with records in it is written."""
    mgr = LogManager(tmp_path)
    await mgr.start()
    logs = mgr.create_logs([("t", p) for p in range(5)])
    for plog in logs:
        await mgr.append(plog, make_batch(2), leader_epoch=5)
    await mgr.stop()
    mgr = LogManager(tmp_path)
    await mgr.start()
    for plog in mgr.logs():
        plog.leader_epochs.assign(7, plog.log_end_offset, flush=False)  # a new leadership
    written: list[Path] = []
    real = checkpoint.atomic_write_many
    monkeypatch.setattr(
        checkpoint,
        "atomic_write_many",
        lambda items, d, **kw: (written.extend(Path(p) for p, _ in items), real(items, d, **kw))[1],
    )
    await mgr.stop()
    assert written == []
    mgr = LogManager(tmp_path)
    await mgr.start()
    plog = mgr.get_log("t", 3)
    assert plog.leader_epochs.entries() == [(5, 0)]
    plog.leader_epochs.assign(8, plog.log_end_offset, flush=False)
    await mgr.append(plog, make_batch(1), leader_epoch=8)
    await mgr.stop()
    epoch_files = [p for p in written if p.name == "leader-epoch-checkpoint"]
    assert epoch_files == [plog.dir / "leader-epoch-checkpoint"]  # and its producer snapshot
    mgr = LogManager(tmp_path)
    await mgr.start()
    assert mgr.get_log("t", 3).leader_epochs.entries() == [(5, 0), (8, 2)]
    await mgr.stop()
