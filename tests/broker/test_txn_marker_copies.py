"""KAFKA-17754 at a partition: late or repeated copies of a coordinator's marker requests
never end a later transaction of the same producer id and epoch.

A producer runs transactions one after another on one partition, each ended by a marker
job of its coordinator. Between any two steps hypothesis delivers copies of earlier
jobs' requests (a retry whose first attempt had landed, or the first attempt arriving
late). The partition must hold exactly the model's transactions: the current one open
from its first offset, every ended one ended by its own marker, aborts indexed as the
model says.
"""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.broker.coordinator.txn_markers import MarkerWriter
from logmq.errors import OK
from logmq.storage import batch as b
from logmq.storage.config import LogConfig
from logmq.storage.partition_log import PartitionLog

PID, TP = 5, ("t", 0)


class OneLeader:
    """What MarkerWriter uses of the replica manager (``leader_log``) and of the leader's
    appends (``append``), over one partition log."""

    def __init__(self, plog: PartitionLog) -> None:
        self.plog = plog

    def leader_log(self, topic: str, partition: int) -> PartitionLog:
        return self.plog

    async def append(self, tp, plog, data, acks, timeout_ms, *, control=False):
        info = plog.append(data, control=control)
        plog.high_watermark = plog.log_end_offset
        return info


def txn_batch(seq: int) -> bytes:
    return b.encode_values(
        [b"v"],
        timestamp=1000,
        compression=b.ATTR_TRANSACTIONAL,
        producer_id=PID,
        producer_epoch=0,
        base_sequence=seq,
    )


# a transaction: how many batches, commit or abort, and which earlier jobs' copies
# arrive before its data, between its batches, and after its marker
TXN = st.tuples(
    st.integers(1, 3),
    st.booleans(),
    st.lists(st.integers(0, 50), max_size=3),
    st.lists(st.integers(0, 50), max_size=3),
)


@settings(max_examples=60, deadline=None)
@given(txns=st.lists(TXN, min_size=1, max_size=8), coordinator_epoch=st.integers(0, 3))
def test_copies_of_earlier_markers_never_end_a_later_transaction(
    tmp_path_factory, txns, coordinator_epoch
):
    plog = PartitionLog(tmp_path_factory.mktemp("p") / "t-0", LogConfig())
    leader = OneLeader(plog)
    writer = MarkerWriter(leader, leader)  # type: ignore[arg-type]
    jobs: list[tuple[int, bool]] = []  # (job id, commit) of each ended transaction
    aborted: list[tuple[int, int]] = []  # the model's (producer id, first offset)

    async def copies(which: list[int]) -> None:
        for i in which:
            if jobs:
                job_id, commit = jobs[i % len(jobs)]
                codes = await writer.write(PID, 0, coordinator_epoch, commit, [TP], job_id)
                assert codes == {TP: OK}

    async def run() -> None:
        seq = 0
        for n, commit, before, after in txns:
            await copies(before)
            first = plog.log_end_offset
            for _ in range(n):
                plog.append(txn_batch(seq))
                seq += 1
                await copies(before)
                assert plog.producer_state.txn.ongoing == {PID: first}
            job_id = 1000 + len(jobs)
            codes = await writer.write(PID, 0, coordinator_epoch, commit, [TP], job_id)
            assert codes == {TP: OK}
            jobs.append((job_id, commit))
            if not commit:
                aborted.append((PID, first))
            assert plog.producer_state.txn.ongoing == {}
            await copies(after)
            assert plog.producer_state.txn.ongoing == {}

    try:
        asyncio.run(run())
        plog.high_watermark = plog.log_end_offset
        assert plog.last_stable_offset == plog.log_end_offset
        assert plog.aborted_transactions(0, plog.log_end_offset) == aborted
    finally:
        plog.close()


def test_a_marker_without_a_job_is_always_written(tmp_path):
    """Kafka's WriteTxnMarkers (an admin's abort) names no job: nothing to recognise."""
    plog = PartitionLog(tmp_path / "t-0", LogConfig())
    leader = OneLeader(plog)
    writer = MarkerWriter(leader, leader)  # type: ignore[arg-type]

    async def run() -> None:
        plog.append(txn_batch(0))
        await writer.write(PID, 0, 0, False, [TP])
        end = plog.log_end_offset
        await writer.write(PID, 0, 0, False, [TP])
        assert plog.log_end_offset == end + 1

    try:
        asyncio.run(run())
    finally:
        plog.close()
