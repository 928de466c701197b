"""Transactions in a partition's log: the LSO and the aborted-transaction index as the
log appends, replicates, recovers, truncates and rolls (issue 29's partition side)."""

from __future__ import annotations

import os

import pytest

from logmq.errors import (
    InvalidProducerEpochError,
    InvalidRecordError,
    TransactionCoordinatorFencedError,
)
from logmq.storage import batch as b
from logmq.storage.config import LogConfig
from logmq.storage.partition_log import PartitionLog
from logmq.storage.txn_state import CONTROL_ABORT, CONTROL_COMMIT, encode_control_batch

P, Q = 7, 9  # producer ids


def txn_batch(pid: int, seq: int, n: int = 2, epoch: int = 0) -> bytes:
    values = [b"v%d" % i for i in range(n)]
    return b.encode_values(
        values,
        timestamp=1000,
        compression=b.ATTR_TRANSACTIONAL,  # the attributes byte: no codec, transactional
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


def marker(pid: int, kind: int, epoch: int = 0, coordinator_epoch: int = 0) -> bytes:
    return encode_control_batch(
        kind,
        producer_id=pid,
        producer_epoch=epoch,
        coordinator_epoch=coordinator_epoch,
        timestamp=1000,
    )


def plain(n: int = 1) -> bytes:
    return b.encode_values([b"p"] * n, timestamp=1000)


def open_log(path, **config) -> PartitionLog:
    return PartitionLog(path / "t-0", LogConfig(**config))


def test_an_open_transaction_holds_the_lso_and_an_abort_is_indexed(tmp_path):
    log = open_log(tmp_path)
    log.append(plain())  # 0
    log.append(txn_batch(P, 0))  # 1-2: P's transaction opens at 1
    log.append(plain())  # 3
    log.append(txn_batch(Q, 0))  # 4-5
    log.high_watermark = log.log_end_offset
    assert log.last_stable_offset == 1
    log.append(marker(P, CONTROL_ABORT), control=True)  # 6
    log.high_watermark = log.log_end_offset
    assert log.last_stable_offset == 4  # Q's still open
    assert log.aborted_transactions(0, log.log_end_offset) == [(P, 1)]
    assert log.aborted_transactions(3, 4) == [(P, 1)]  # the range overlaps [1, 6]
    assert log.aborted_transactions(7, 8) == []
    log.append(marker(Q, CONTROL_COMMIT), control=True)  # 7
    assert log.last_stable_offset == 4  # the commit marker is not below the HW yet
    log.high_watermark = log.log_end_offset
    assert log.last_stable_offset == log.log_end_offset == 8
    assert log.aborted_transactions(0, 8) == [(P, 1)]  # a commit is not indexed


def test_a_client_may_not_write_a_marker(tmp_path):
    log = open_log(tmp_path)
    log.append(txn_batch(P, 0))
    with pytest.raises(InvalidRecordError, match="coordinator"):
        log.append(marker(P, CONTROL_ABORT))
    with pytest.raises(InvalidRecordError):
        log.append(marker(-1, CONTROL_ABORT))  # without a producer id too
    assert log.log_end_offset == 2


def test_a_marker_continues_the_producers_sequence_and_fences_older_epochs(tmp_path):
    log = open_log(tmp_path)
    log.append(txn_batch(P, 0))  # sequences 0-1
    log.append(marker(P, CONTROL_COMMIT), control=True)
    log.append(txn_batch(P, 2))  # the next transaction goes on at sequence 2
    log.append(marker(P, CONTROL_ABORT, epoch=1), control=True)  # an abort that fences
    with pytest.raises(InvalidProducerEpochError):
        log.append(txn_batch(P, 4, epoch=0))
    log.append(txn_batch(P, 0, epoch=1))  # the new epoch starts at 0
    assert log.log_end_offset == 8


def test_a_marker_from_an_older_coordinator_is_fenced_everywhere(tmp_path):
    """A coordinator that lost ``__transaction_state``'s partition but has not noticed
    may still send markers: a partition that heard from a newer one refuses them
    (TRANSACTION_COORDINATOR_FENCED), on the leader, after a follower replicated the
    newer marker, and after a restart with or without a snapshot."""
    log = open_log(tmp_path)
    log.append(txn_batch(P, 0))  # 0-1
    log.append(marker(P, CONTROL_COMMIT, coordinator_epoch=3), control=True)  # 2
    log.append(txn_batch(P, 2))  # 3-4
    with pytest.raises(TransactionCoordinatorFencedError, match="coordinator epoch 2"):
        log.append(marker(P, CONTROL_ABORT, coordinator_epoch=2), control=True)
    assert log.log_end_offset == 5
    follower = PartitionLog(tmp_path / "u-0", LogConfig())
    follower.append_as_follower(log.read(0, 1 << 20).read())
    with pytest.raises(TransactionCoordinatorFencedError):
        follower.append(marker(P, CONTROL_ABORT, coordinator_epoch=2), control=True)
    log.append(marker(P, CONTROL_ABORT, coordinator_epoch=3), control=True)  # 5: same epoch
    log.append(marker(Q, CONTROL_ABORT, coordinator_epoch=1), control=True)  # another producer
    log.high_watermark = log.log_end_offset
    log.close()  # a clean restart: from the snapshot
    log = PartitionLog(tmp_path / "t-0", LogConfig(), high_watermark=7)
    with pytest.raises(TransactionCoordinatorFencedError):
        log.append(marker(P, CONTROL_COMMIT, coordinator_epoch=2), control=True)
    log.close_handles()  # a crash: recovery replays the markers
    for name in os.listdir(tmp_path / "t-0"):
        if name.endswith(".snapshot"):
            os.unlink(tmp_path / "t-0" / name)
    log = PartitionLog(
        tmp_path / "t-0", LogConfig(), clean_shutdown=False, recovery_point=0, high_watermark=7
    )
    with pytest.raises(TransactionCoordinatorFencedError):
        log.append(marker(P, CONTROL_COMMIT, coordinator_epoch=2), control=True)
    log.append(marker(P, CONTROL_COMMIT, coordinator_epoch=4), control=True)  # a newer one


def test_the_state_survives_a_clean_restart_and_a_crash(tmp_path):
    log = open_log(tmp_path)
    log.append(txn_batch(P, 0))  # 0-1
    log.append(txn_batch(Q, 0))  # 2-3
    log.append(marker(P, CONTROL_ABORT), control=True)  # 4
    log.high_watermark = log.log_end_offset
    log.close()
    log = PartitionLog(tmp_path / "t-0", LogConfig(), high_watermark=5)
    assert log.last_stable_offset == 2
    assert log.aborted_transactions(0, 5) == [(P, 0)]
    log.append(marker(Q, CONTROL_ABORT), control=True)  # 5
    log.high_watermark = 6
    log.close_handles()  # a crash: no flush, no snapshot
    log = PartitionLog(
        tmp_path / "t-0", LogConfig(), clean_shutdown=False, recovery_point=0, high_watermark=6
    )
    assert log.last_stable_offset == 6
    assert log.aborted_transactions(0, 6) == [(P, 0), (Q, 2)]


def test_truncating_a_marker_reopens_its_transaction(tmp_path):
    log = open_log(tmp_path)
    log.append(txn_batch(P, 0))  # 0-1
    log.append(marker(P, CONTROL_ABORT), control=True)  # 2
    log.append(plain())  # 3
    log.high_watermark = 2
    log.truncate_to(2)
    assert log.aborted_transactions(0, 2) == []
    assert log.last_stable_offset == 0
    log.append(marker(P, CONTROL_ABORT), control=True)  # the new leader's marker
    log.high_watermark = log.log_end_offset
    assert log.aborted_transactions(0, 3) == [(P, 0)]
    assert log.last_stable_offset == 3


def test_a_follower_builds_the_same_state_from_the_leaders_bytes(tmp_path):
    leader = PartitionLog(tmp_path / "t-0", LogConfig())
    leader.append(txn_batch(P, 0))
    leader.append(plain())
    leader.append(marker(P, CONTROL_ABORT), control=True)
    leader.append(txn_batch(Q, 0))
    data = leader.read(0, 1 << 20).read()
    follower = PartitionLog(tmp_path / "u-0", LogConfig())
    follower.append_as_follower(data)
    for log in (leader, follower):
        log.high_watermark = log.log_end_offset
    assert follower.last_stable_offset == leader.last_stable_offset == 4
    assert follower.aborted_transactions(0, 6) == leader.aborted_transactions(0, 6) == [(P, 0)]


def test_aborts_are_found_across_segments(tmp_path):
    log = open_log(tmp_path, segment_bytes=300)
    expected = []
    for i in range(6):
        first = log.log_end_offset
        log.append(txn_batch(P, 2 * i))
        log.append(plain(3))
        kind = CONTROL_ABORT if i % 2 == 0 else CONTROL_COMMIT
        log.append(marker(P, kind), control=True)
        if kind == CONTROL_ABORT:
            expected.append((P, first))
    assert len(log.segments) > 2
    log.high_watermark = log.log_end_offset
    end = log.log_end_offset
    assert log.aborted_transactions(0, end) == expected
    assert log.aborted_transactions(end - 1, end) == []
    # reopened, each segment's index is read from its file
    log.close()
    log = PartitionLog(tmp_path / "t-0", LogConfig(segment_bytes=300), high_watermark=end)
    assert log.aborted_transactions(0, end) == expected


def test_a_lost_index_is_rebuilt_from_the_log_when_no_snapshot_covers_it(tmp_path):
    log = open_log(tmp_path)
    log.append(txn_batch(P, 0))  # 0-1
    log.append(marker(P, CONTROL_ABORT), control=True)  # 2
    log.append(txn_batch(Q, 0))  # 3-4, still open
    log.close_handles()
    for path in (tmp_path / "t-0").iterdir():
        if path.suffix in (".txnindex", ".snapshot"):
            path.unlink()
    log = PartitionLog(
        tmp_path / "t-0", LogConfig(), clean_shutdown=False, recovery_point=0, high_watermark=5
    )
    assert log.aborted_transactions(0, 5) == [(P, 0)]
    assert log.last_stable_offset == 3
    assert (tmp_path / "t-0" / "00000000000000000000.txnindex").stat().st_size == 34


def test_unsequenced_transactional_batches_are_all_written(tmp_path):
    """A coordinator's own transactional batches carry no sequence: each is new data,
    never taken for a retry of the one before (which would drop it silently)."""
    log = open_log(tmp_path)
    for _ in range(3):
        log.append(txn_batch(P, -1))
    assert log.log_end_offset == 6
    log.append(marker(P, CONTROL_COMMIT), control=True)
    log.append(txn_batch(P, -1))
    assert log.log_end_offset == 9


def test_the_lso_never_falls_below_a_log_start_moved_past_an_open_transaction(tmp_path):
    """DeleteRecords (or retention) past an open transaction's first offset: those
    offsets are gone for every reader, so read_committed's end is the log start, as in
    Kafka, never an offset below the earliest one."""
    log = open_log(tmp_path)
    log.append(txn_batch(P, 0))  # 0-1: open
    log.append(plain(3))  # 2-4
    log.high_watermark = log.log_end_offset
    assert log.last_stable_offset == 0
    log.advance_log_start_offset(3)
    assert log.last_stable_offset == 3
    log.append(marker(P, CONTROL_COMMIT), control=True)  # 5
    log.high_watermark = log.log_end_offset
    assert log.last_stable_offset == 6
