"""The transaction coordinator's shard against a real LogManager (no network).

A commit end to end (markers only once Prepare* is replicated, then Complete*), the
retry of InitProducerId that needs a fresh producer id, a reload after a failed or
refused append (with Kafka's error codes), a new coordinator over the same log finishing
a PrepareCommit, and a timed-out transaction aborted by the timer on a fake clock.
"""

from __future__ import annotations

import asyncio

import pytest

from logmq.broker.coordinator.group_service import OFFSETS_TOPIC_CONFIGS
from logmq.broker.coordinator.shard_runtime import CoordinatorError, ShardState
from logmq.broker.coordinator.txn_shard import NEED_PRODUCER_ID, TxnShard
from logmq.errors import ErrorCode, StorageError
from logmq.storage.log_manager import LogManager
from logmq.txn import TXN_STATE_TOPIC, MarkerJob, TxnConfig
from tests.broker.test_group_shard_replication import ScriptedReplication
from tests.harness import wait_until

CONFIG = TxnConfig(abort_check_interval_ms=1_000)
TXN = "tx"  # hashes to partition 0 of a one-partition topic


@pytest.fixture
async def txn_logs(tmp_path):
    manager = LogManager(tmp_path / "data")
    await manager.start()
    manager.create_log(TXN_STATE_TOPIC, 0, dict(OFFSETS_TOPIC_CONFIGS))
    yield manager
    await manager.stop()


class Clock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class Markers:
    """Stands in for the service's delivery: records jobs; a gate holds them back."""

    def __init__(self) -> None:
        self.jobs: list[MarkerJob] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def deliver(self, job: MarkerJob) -> bool:
        self.jobs.append(job)
        await self.gate.wait()
        return True


def make_shard(logs, repl, markers, clock=None, epoch=0, timeout_ms=60_000) -> TxnShard:
    return TxnShard(
        0,
        1,
        logs,
        lambda: logs.get_log(TXN_STATE_TOPIC, 0),
        CONFIG,
        replication=repl,
        deliver_markers=markers.deliver,
        leader_epoch=epoch,
        replication_timeout_ms=timeout_ms,
        clock=clock or Clock(),
    )


async def loaded(logs, repl, markers, clock=None, epoch=0, timeout_ms=60_000) -> TxnShard:
    shard = make_shard(logs, repl, markers, clock, epoch, timeout_ms)
    shard.load()
    await wait_until(lambda: shard.state is ShardState.ACTIVE, what="shard loaded")
    return shard


def replicated() -> ScriptedReplication:
    repl = ScriptedReplication()
    repl.advance(10**9)
    return repl


async def state(shard: TxnShard, txn: str = TXN) -> str:
    return (await shard.describe([txn]))[0].state


async def begin(shard: TxnShard, partitions=(("t", 0), ("t", 1)), timeout_ms=60_000):
    """A producer with an open transaction over ``partitions``: (producer id, epoch)."""
    assert await shard.init_producer_id(TXN, timeout_ms) is NEED_PRODUCER_ID
    init = await shard.init_producer_id(TXN, timeout_ms, producer_id=42)
    assert init.error is ErrorCode.NONE and (init.producer_id, init.producer_epoch) == (42, 0)
    assert await shard.add_partitions(TXN, 42, 0, partitions) is ErrorCode.NONE
    return init.producer_id, init.producer_epoch


async def test_a_commit_end_to_end_sends_markers_only_once_prepare_is_replicated(txn_logs):
    repl, markers = replicated(), Markers()
    shard = await loaded(txn_logs, repl, markers)
    pid, epoch = await begin(shard)
    assert await shard.add_offsets(TXN, pid, epoch, "g", 3) is ErrorCode.NONE
    assert await shard.verify_partitions(TXN, pid, epoch, [("t", 0), ("u", 0)]) == {
        ("t", 0): ErrorCode.NONE,
        ("u", 0): ErrorCode.INVALID_TXN_STATE,
    }
    markers.gate.clear()
    repl.hw = repl.leo  # from here the HW moves only when the test says
    ended = shard.end_txn(TXN, pid, epoch, commit=True)
    await wait_until(lambda: repl.leo > repl.hw, what="PrepareCommit appended")
    for _ in range(20):
        await asyncio.sleep(0)
    assert not ended.done() and markers.jobs == []  # not replicated: nobody hears of it
    repl.advance()
    assert await ended is ErrorCode.NONE
    await wait_until(lambda: markers.jobs, what="markers sent")
    [job] = markers.jobs
    assert job.commit and (job.producer_id, job.producer_epoch) == (pid, epoch)
    assert set(job.partitions) == {("t", 0), ("t", 1), ("__consumer_offsets", 3)}
    assert await state(shard) == "PrepareCommit"
    assert await shard.end_txn(TXN, pid, epoch, True) is ErrorCode.CONCURRENT_TRANSACTIONS
    markers.gate.set()
    await wait_until(lambda: repl.leo > repl.hw, what="CompleteCommit appended")
    repl.advance()
    while await state(shard) != "CompleteCommit":
        await asyncio.sleep(0.01)
    assert await shard.end_txn(TXN, pid, epoch, True) is ErrorCode.NONE  # a retry
    listed = await shard.list_transactions(["CompleteCommit"])
    assert [t.transactional_id for t in listed.transactions] == [TXN]
    await shard.unload()
    again = await loaded(txn_logs, repl, markers)  # the log holds the same state
    assert await state(again) == "CompleteCommit"
    assert len(markers.jobs) == 1  # nothing owed after a completed transaction
    await again.unload()


async def test_a_failed_append_reloads_the_state_on_disk(txn_logs, monkeypatch):
    repl, markers = replicated(), Markers()
    shard = await loaded(txn_logs, repl, markers)
    pid, epoch = await begin(shard)
    plog = txn_logs.get_log(TXN_STATE_TOPIC, 0)
    real = plog.append

    def broken(data, **kw):
        monkeypatch.setattr(plog, "append", real)
        raise StorageError("disk on fire")

    monkeypatch.setattr(plog, "append", broken)
    with pytest.raises(CoordinatorError) as failed:
        await shard.end_txn(TXN, pid, epoch, commit=True)
    assert failed.value.code is ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert shard.state is ShardState.LOADING
    await wait_until(lambda: shard.state is ShardState.ACTIVE, what="reloaded")
    # memory had PrepareCommit; the log never did: no markers, the transaction is open
    assert await state(shard) == "Ongoing" and markers.jobs == []
    assert await shard.end_txn(TXN, pid, epoch, commit=False) is ErrorCode.NONE
    await wait_until(lambda: markers.jobs, what="abort markers")
    assert not markers.jobs[0].commit
    await shard.unload()


@pytest.mark.parametrize(
    ("error", "client_error"),
    [
        (ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.COORDINATOR_NOT_AVAILABLE),
        (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NOT_COORDINATOR),
    ],
)
async def test_a_refused_append_answers_kafkas_code_and_rolls_back(txn_logs, error, client_error):
    """The partition refuses the round (too few in-sync replicas, leadership gone): the
    client gets what Kafka's coordinator answers, and the core is rebuilt from the log."""
    repl, markers = replicated(), Markers()
    shard = await loaded(txn_logs, repl, markers)
    pid, epoch = await begin(shard)
    repl.check_error = error
    with pytest.raises(CoordinatorError) as failed:
        await shard.end_txn(TXN, pid, epoch, commit=True)
    assert failed.value.code is client_error
    repl.check_error = ErrorCode.NONE
    await wait_until(lambda: shard.state is ShardState.ACTIVE, what="reloaded")
    assert await state(shard) == "Ongoing" and markers.jobs == []
    assert await shard.end_txn(TXN, pid, epoch, commit=True) is ErrorCode.NONE
    await wait_until(lambda: markers.jobs, what="commit markers")
    await shard.unload()


async def test_markers_of_a_prepare_not_replicated_in_time_wait_until_it_is(txn_logs):
    repl, markers = replicated(), Markers()
    shard = await loaded(txn_logs, repl, markers, timeout_ms=50)
    pid, epoch = await begin(shard)
    repl.hw = repl.leo
    with pytest.raises(CoordinatorError) as failed:
        await shard.end_txn(TXN, pid, epoch, commit=True)
    assert failed.value.code is ErrorCode.COORDINATOR_NOT_AVAILABLE  # outcome unknown
    await asyncio.sleep(0.2)
    assert markers.jobs == [] and shard.state is ShardState.ACTIVE
    repl.advance(10**9)  # the followers catch up: PrepareCommit is durable after all
    await wait_until(lambda: markers.jobs, what="markers once replicated")
    while await state(shard) != "CompleteCommit":
        await asyncio.sleep(0.01)
    await shard.unload()


async def test_a_new_coordinator_finishes_a_prepared_commit(txn_logs):
    repl, markers = replicated(), Markers()
    old = await loaded(txn_logs, repl, markers, epoch=3)
    pid, epoch = await begin(old)
    markers.gate.clear()  # the old coordinator dies before its markers are written
    assert await old.end_txn(TXN, pid, epoch, commit=True) is ErrorCode.NONE
    await wait_until(lambda: markers.jobs, what="markers started")
    assert markers.jobs[0].coordinator_epoch == 3
    await old.unload()
    markers.gate.set()
    new = await loaded(txn_logs, repl, markers, epoch=4)
    await wait_until(lambda: len(markers.jobs) == 2, what="markers sent again")
    resent = markers.jobs[1]
    assert resent.commit and resent.coordinator_epoch == 4
    assert set(resent.partitions) == {("t", 0), ("t", 1)}
    while await state(new) != "CompleteCommit":
        await asyncio.sleep(0.01)
    await new.unload()


async def test_the_timer_aborts_a_timed_out_transaction_and_fences_the_producer(txn_logs):
    repl, markers, clock = replicated(), Markers(), Clock()
    shard = await loaded(txn_logs, repl, markers, clock)
    pid, epoch = await begin(shard, timeout_ms=5_000)
    clock.now += 4_000
    await shard.describe([TXN])  # a round: the timer looks, nothing has timed out yet
    await asyncio.sleep(0.2)
    assert await state(shard) == "Ongoing" and markers.jobs == []
    clock.now += 2_000
    await shard.describe([TXN])
    await wait_until(lambda: markers.jobs, what="abort markers")
    [job] = markers.jobs
    assert not job.commit and job.producer_epoch == epoch + 1
    while await state(shard) != "CompleteAbort":
        await asyncio.sleep(0.01)
    assert await shard.end_txn(TXN, pid, epoch, True) is ErrorCode.PRODUCER_FENCED
    again = await shard.init_producer_id(TXN, 5_000)  # the producer's restart: epoch + 2
    assert (again.error, again.producer_id, again.producer_epoch) == (ErrorCode.NONE, 42, 2)
    await shard.unload()


async def test_requests_wait_for_the_load_and_fail_after_unload(txn_logs):
    shard = make_shard(txn_logs, replicated(), Markers())
    with pytest.raises(CoordinatorError) as unloaded:
        shard.describe([TXN])
    assert unloaded.value.code is ErrorCode.NOT_COORDINATOR
    shard.load()
    with pytest.raises(CoordinatorError) as loading:
        shard.end_txn(TXN, 1, 0, True)
    assert loading.value.code is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    await wait_until(lambda: shard.state is ShardState.ACTIVE)
    [missing] = await shard.describe([TXN])
    assert missing.error is ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
    await shard.unload()
