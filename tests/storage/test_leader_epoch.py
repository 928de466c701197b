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


def test_a_deferred_epoch_is_written_by_flush_or_before_the_epochs_first_append(tmp_path):
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
    assert not log.leader_epochs.unflushed
    log.close()
    assert LeaderEpochCache(tmp_path / "t-0" / "leader-epoch-checkpoint").entries() == [(5, 0)]
