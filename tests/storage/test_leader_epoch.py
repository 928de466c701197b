from __future__ import annotations

from logmq.storage.checkpoint import read_offsets, write_offsets
from logmq.storage.leader_epoch import LeaderEpochCache


def test_end_offset_for_epoch(tmp_path):
    c = LeaderEpochCache(tmp_path / "leader-epoch-checkpoint")
    c.assign(1, 0)
    c.assign(3, 10)
    c.assign(4, 25)
    c.assign(2, 30)  # older epoch: ignored
    assert c.entries() == [(1, 0), (3, 10), (4, 25)]
    assert c.end_offset_for_epoch(0, 40) == (-1, -1)
    assert c.end_offset_for_epoch(1, 40) == (1, 10)
    assert c.end_offset_for_epoch(2, 40) == (1, 10)  # unknown epoch: largest below it
    assert c.end_offset_for_epoch(3, 40) == (3, 25)
    assert c.end_offset_for_epoch(9, 40) == (4, 40)
    assert LeaderEpochCache(c.path).entries() == c.entries()  # persisted


def test_truncation(tmp_path):
    c = LeaderEpochCache(tmp_path / "e")
    for e, s in [(1, 0), (2, 10), (3, 20)]:
        c.assign(e, s)
    c.truncate_from_end(15)
    assert c.entries() == [(1, 0), (2, 10)]
    c.truncate_from_start(12)
    assert c.entries() == [(2, 12)]
    assert LeaderEpochCache(c.path).entries() == [(2, 12)]


def test_offset_checkpoint_round_trip(tmp_path):
    p = tmp_path / "recovery-point-checkpoint"
    offsets = {("a-b", 0): 5, ("c", 3): 0}
    write_offsets(p, offsets)
    assert read_offsets(p) == offsets
    assert read_offsets(tmp_path / "missing") == {}
    assert not list(tmp_path.glob("*.tmp"))


def test_epochs_reach_disk_with_the_log_flush_and_recovery_rebuilds_unflushed_ones(tmp_path):
    import shutil

    from logmq.storage.partition_log import PartitionLog

    from .helpers import make_batch
    from .test_partition_log import SMALL

    c = LeaderEpochCache(tmp_path / "e")
    c.assign(1, 0, flush=False)  # many partitions becoming leader: written later
    assert c.unflushed and not (tmp_path / "e").exists()
    c.flush()
    assert not c.unflushed and LeaderEpochCache(c.path).entries() == [(1, 0)]

    log = PartitionLog(tmp_path / "t-0", SMALL)
    log.leader_epochs.assign(5, 0, flush=False)
    log.append(make_batch(2, tag=1), leader_epoch=5)
    log.append(make_batch(2, tag=2), leader_epoch=7)
    epoch_file = tmp_path / "t-0" / "leader-epoch-checkpoint"
    assert log.leader_epochs.unflushed and not epoch_file.exists()  # no fsync per append
    # A crash now: recovery takes the epochs past the recovery point from the batches.
    shutil.copytree(tmp_path / "t-0", tmp_path / "crashed-0")
    crashed = PartitionLog(tmp_path / "crashed-0", SMALL, clean_shutdown=False, recovery_point=0)
    assert crashed.leader_epochs.entries() == [(5, 0), (7, 2)]
    crashed.close()
    log.flush()  # the log's flush writes them before its recovery point moves on
    assert not log.leader_epochs.unflushed
    assert LeaderEpochCache(epoch_file).entries() == [(5, 0), (7, 2)]
    log.close()
