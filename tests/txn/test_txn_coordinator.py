"""The transaction coordinator core, request by request: happy paths, errors, retries,
epoch exhaustion, KIP-360 recovery, failed rounds, timeouts, expiry and reloading."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from logmq.errors import ErrorCode
from logmq.txn import (
    NEED_PRODUCER_ID,
    Expired,
    InitProducerIdResult,
    MarkerJob,
    TransactionCoordinator,
    TxnConfig,
    TxnRecord,
    TxnState,
    TxnStateValue,
    coordinator_partition,
    decode_key,
    decode_value,
    state_record,
)

E = ErrorCode
T0 = 1_000_000


class Shell:
    """Drives the core as the coordinator shard does: after each operation it appends the
    records the core left and collects the marker jobs it handed out; a round that cannot
    be appended drops the core, which is loaded again from the log."""

    def __init__(self, config: TxnConfig | None = None, partition_count: int = 1) -> None:
        self.c = TransactionCoordinator(0, partition_count, config, coordinator_epoch=3)
        self.log: list[TxnRecord] = []
        self.ids = itertools.count(1000)
        self.jobs: list[MarkerJob] = []
        self.cores = itertools.count(1)

    def alloc(self) -> int:
        return next(self.ids)

    def run(self, op):
        """``op(core)`` in a round that becomes durable: its answer."""
        answer = op(self.c)
        self.log += self.c.take_records()
        self.jobs += self.c.take_effects()
        return answer

    def fail(self, op, now=T0):
        """``op(core)`` in a round whose append fails: the core is dropped with what it
        decided and loaded again from the log (its jobs replace the dropped core's).
        Returns the answer nobody hears."""
        answer = op(self.c)
        self.c = self.replayed(epoch=3, first_job_id=next(self.cores) * 1_000_000)
        self.c.load_complete(now)
        self.jobs = self.c.take_effects()
        return answer

    def init(self, txn="tx", timeout=60_000, pid=-1, epoch=-1, now=T0):
        """InitProducerId as the service runs it: again with a fresh id if one is needed."""
        answer = self.run(lambda c: c.init_producer_id(txn, timeout, pid, epoch, now_ms=now))
        if answer is NEED_PRODUCER_ID:
            fresh = self.alloc()
            answer = self.run(
                lambda c: c.init_producer_id(
                    txn, timeout, pid, epoch, now_ms=now, producer_id=fresh
                )
            )
        return answer

    def add(self, txn, pid, epoch, parts, now=T0):
        return self.run(lambda c: c.add_partitions(txn, pid, epoch, parts, now))

    def end(self, txn, pid, epoch, commit, now=T0):
        return self.run(lambda c: c.end_txn(txn, pid, epoch, commit, now))

    def tick(self, now):
        return self.run(lambda c: c.tick(now))

    def finish_markers(self, now=T0):
        jobs, self.jobs = self.jobs, []
        for job in jobs:
            assert self.run(lambda c, job=job: c.markers_written(job, now)) is True
        return jobs

    def state(self, txn="tx"):
        return self.c.describe([txn])[0]

    def replayed(self, epoch: int = 0, first_job_id: int = 1) -> TransactionCoordinator:
        fresh = TransactionCoordinator(
            0, self.c.partition_count, self.c.config, epoch, first_job_id=first_job_id
        )
        for record in self.log:
            fresh.replay(record.key, record.value)
        return fresh


@pytest.fixture
def shell():
    return Shell()


def test_first_init_needs_a_producer_id_and_leaves_its_record():
    c = TransactionCoordinator()
    assert c.needs_producer_id("tx")
    assert c.init_producer_id("tx", 60_000, now_ms=T0) is NEED_PRODUCER_ID
    assert c.transactional_ids() == [] and c.take_records() == []  # nothing changed
    result = c.init_producer_id("tx", 60_000, now_ms=T0, producer_id=1000)
    assert result == InitProducerIdResult(E.NONE, 1000, 0)
    [record] = c.take_records()
    value = decode_value(record.value)
    assert (value.state, value.producer_id, value.producer_epoch) == (TxnState.EMPTY, 1000, 0)
    assert c.take_records() == [] and c.take_effects() == []
    assert not c.needs_producer_id("tx")
    d = c.describe(["tx"])[0]
    assert (d.error, d.state, d.producer_id, d.producer_epoch, d.timeout_ms) == (
        E.NONE, "Empty", 1000, 0, 60_000,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("txn", "timeout", "error"),
    [
        ("", 1000, E.INVALID_REQUEST),
        ("tx", 0, E.INVALID_TRANSACTION_TIMEOUT),
        ("tx", -5, E.INVALID_TRANSACTION_TIMEOUT),
        ("tx", 900_001, E.INVALID_TRANSACTION_TIMEOUT),
    ],
)
def test_init_refusals(shell, txn, timeout, error):
    assert shell.init(txn, timeout) == InitProducerIdResult(error)


def test_not_coordinator_for_ids_of_other_partitions():
    shell = Shell(partition_count=50)
    other = next(t for t in (f"tx{i}" for i in range(100)) if coordinator_partition(t, 50) != 0)
    assert shell.init(other).error is E.NOT_COORDINATOR
    assert shell.c.init_producer_id(other, 1000, now_ms=T0).error is E.NOT_COORDINATOR
    assert shell.c.add_partitions(other, 1, 0, [("t", 0)], T0) is E.NOT_COORDINATOR
    assert shell.c.describe([other])[0].error is E.NOT_COORDINATOR


def test_init_with_one_expected_field_only_is_invalid(shell):
    assert shell.init(pid=5).error is E.INVALID_REQUEST


def test_reinit_bumps_epoch_and_fences_the_old_producer(shell):
    first = shell.init()
    second = shell.init()
    assert (second.producer_id, second.producer_epoch) == (first.producer_id, 1)
    assert shell.add("tx", first.producer_id, 0, [("t", 0)]) is E.PRODUCER_FENCED
    assert shell.add("tx", first.producer_id, 1, [("t", 0)]) is E.NONE


def test_commit_flow(shell):
    r = shell.init()
    pid = r.producer_id
    assert shell.add("tx", pid, 0, [("t", 1), ("t", 0)], now=T0 + 5) is E.NONE
    d = shell.state()
    assert (d.state, d.partitions, d.txn_start_ms) == ("Ongoing", (("t", 0), ("t", 1)), T0 + 5)
    records = len(shell.log)
    assert shell.add("tx", pid, 0, [("t", 0)]) is E.NONE  # already in: nothing written
    assert len(shell.log) == records
    assert shell.add("tx", pid, 0, [("u", 0)], now=T0 + 9) is E.NONE
    assert shell.state().txn_start_ms == T0 + 5  # still the first add
    assert shell.end("tx", pid, 0, True, now=T0 + 10) is E.NONE
    assert decode_value(shell.log[-1].value).state is TxnState.PREPARE_COMMIT
    assert shell.end("tx", pid, 0, True, now=T0 + 10) is E.CONCURRENT_TRANSACTIONS
    [job] = shell.jobs
    assert job == MarkerJob("tx", pid, 0, 3, True, (("t", 0), ("t", 1), ("u", 0)), job.job_id)
    assert shell.state().state == "PrepareCommit"
    # while markers are out: retries wait, the other outcome is refused, nothing new starts
    assert shell.c.end_txn("tx", pid, 0, True, T0) is E.CONCURRENT_TRANSACTIONS
    assert shell.c.end_txn("tx", pid, 0, False, T0) is E.INVALID_TXN_STATE
    assert shell.c.add_partitions("tx", pid, 0, [("t", 0)], T0) is E.CONCURRENT_TRANSACTIONS
    assert shell.init().error is E.CONCURRENT_TRANSACTIONS
    shell.jobs = [job]
    shell.finish_markers(now=T0 + 20)
    d = shell.state()
    assert (d.state, d.partitions, d.producer_epoch) == ("CompleteCommit", (), 0)
    assert shell.end("tx", pid, 0, True) is E.NONE  # a retry after completion
    assert shell.end("tx", pid, 0, False) is E.INVALID_TXN_STATE
    # the next transaction starts from CompleteCommit with the same epoch
    assert shell.add("tx", pid, 0, [("v", 0)], now=T0 + 30) is E.NONE
    assert shell.state().txn_start_ms == T0 + 30
    assert shell.end("tx", pid, 0, False) is E.NONE
    [job2] = shell.finish_markers()
    assert job2.commit is False and job2.partitions == (("v", 0),)
    assert shell.state().state == "CompleteAbort"


def test_add_partitions_checks_in_kafkas_order(shell):
    assert shell.add("nobody", 1, 0, [("t", 0)]) is E.INVALID_PRODUCER_ID_MAPPING
    pid = shell.init().producer_id
    assert shell.add("tx", pid + 1, 0, [("t", 0)]) is E.INVALID_PRODUCER_ID_MAPPING
    assert shell.add("tx", pid + 1, 7, [("t", 0)]) is E.INVALID_PRODUCER_ID_MAPPING
    assert shell.add("tx", pid, 7, [("t", 0)]) is E.PRODUCER_FENCED
    # two requests in one round: the second sees the first, each leaves its record
    assert shell.c.add_partitions("tx", pid, 0, [("t", 0)], T0) is E.NONE
    assert shell.c.add_partitions("tx", pid, 0, [("t", 1)], T0) is E.NONE
    assert shell.c.add_partitions("tx", pid, 5, [("t", 1)], T0) is E.PRODUCER_FENCED
    first, second = shell.c.take_records()
    assert decode_value(first.value).partitions == (("t", 0),)
    assert decode_value(second.value).partitions == (("t", 0), ("t", 1))
    assert shell.add("tx", pid, 0, []) is E.NONE


def test_end_txn_errors(shell):
    assert shell.end("nobody", 1, 0, True) is E.INVALID_PRODUCER_ID_MAPPING
    pid = shell.init().producer_id
    assert shell.end("tx", pid, 0, True) is E.INVALID_TXN_STATE  # Empty: nothing to end
    assert shell.end("tx", pid + 1, 0, True) is E.INVALID_PRODUCER_ID_MAPPING
    shell.init()
    shell.add("tx", pid, 1, [("t", 0)])
    assert shell.end("tx", pid, 0, True) is E.PRODUCER_FENCED  # older epoch
    assert shell.end("tx", pid, 2, True) is E.PRODUCER_FENCED  # not its epoch either


def test_add_offsets_adds_the_groups_offsets_partition(shell):
    pid = shell.init().producer_id
    assert shell.run(lambda c: c.add_offsets("tx", pid, 0, "g", 17, T0)) is E.NONE
    assert shell.state().partitions == (("__consumer_offsets", 17),)
    assert shell.c.add_offsets("tx", pid, 0, "", 17, T0) is E.INVALID_GROUP_ID
    assert shell.c.add_offsets("tx", pid, 1, "g", 17, T0) is E.PRODUCER_FENCED


def test_verify_only_answers_per_partition_without_writing(shell):
    pid = shell.init().producer_id
    verify = shell.c.add_partitions
    assert verify("tx", pid, 0, [("t", 0)], T0, verify_only=True) == {("t", 0): E.INVALID_TXN_STATE}
    shell.add("tx", pid, 0, [("t", 0)])
    records = len(shell.log)
    answer = verify("tx", pid, 0, [("t", 0), ("t", 1)], T0, verify_only=True)
    assert answer == {("t", 0): E.NONE, ("t", 1): E.INVALID_TXN_STATE}
    assert verify("tx", pid, 1, [("t", 0)], T0, verify_only=True) == {("t", 0): E.PRODUCER_FENCED}
    assert verify("tx", 99, 0, [("t", 0)], T0, verify_only=True) == {
        ("t", 0): E.INVALID_PRODUCER_ID_MAPPING
    }
    assert len(shell.log) == records
    assert shell.end("tx", pid, 0, True) is E.NONE
    assert verify("tx", pid, 0, [("t", 0)], T0, verify_only=True) == {
        ("t", 0): E.CONCURRENT_TRANSACTIONS
    }
    shell.finish_markers()
    assert verify("tx", pid, 0, [("t", 0)], T0, verify_only=True) == {("t", 0): E.INVALID_TXN_STATE}


def test_init_during_ongoing_aborts_first_with_an_epoch_fence(shell):
    pid = shell.init().producer_id
    shell.add("tx", pid, 0, [("t", 0)])
    assert shell.init() == InitProducerIdResult(E.CONCURRENT_TRANSACTIONS)
    fence = decode_value(shell.log[-1].value)
    assert (fence.state, fence.producer_epoch) == (TxnState.PREPARE_ABORT, 1)
    [job] = shell.jobs
    assert (job.commit, job.producer_epoch, job.partitions) == (False, 1, (("t", 0),))
    assert shell.state().state == "PrepareAbort"
    assert shell.end("tx", pid, 0, True) is E.PRODUCER_FENCED  # the zombie
    assert shell.init().error is E.CONCURRENT_TRANSACTIONS  # markers still out
    shell.jobs = [job]
    shell.finish_markers()
    assert shell.state().state == "CompleteAbort"
    assert shell.init() == InitProducerIdResult(E.NONE, pid, 2)


def test_epoch_exhaustion_rotates_the_producer_id(shell):
    shell.c.replay(*_rec("tx", TxnStateValue(500, 32765, 60_000, TxnState.COMPLETE_COMMIT)))
    assert shell.init() == InitProducerIdResult(E.NONE, 500, 32766)
    assert shell.init() == InitProducerIdResult(E.NONE, 1000, 0)
    meta = shell.c.metadata("tx")
    assert (meta.previous_producer_id, meta.last_producer_epoch) == (500, -1)


def test_a_rotation_without_a_fresh_id_changes_nothing():
    c = TransactionCoordinator()
    c.replay(*_rec("tx", TxnStateValue(500, 32766, 60_000, TxnState.COMPLETE_COMMIT)))
    assert c.needs_producer_id("tx")
    assert c.init_producer_id("tx", 60_000, now_ms=T0) is NEED_PRODUCER_ID
    assert c.take_records() == [] and c.metadata("tx").producer_id == 500
    assert c.init_producer_id("tx", 60_000, now_ms=T0, producer_id=7) == InitProducerIdResult(
        E.NONE, 7, 0
    )


def test_fence_of_an_exhausted_epoch_then_rotation(shell):
    shell.c.replay(*_rec("tx", TxnStateValue(500, 32766, 60_000, TxnState.ONGOING, (("t", 0),), 1)))
    shell.c.load_complete(T0)
    assert shell.init().error is E.CONCURRENT_TRANSACTIONS
    [job] = shell.jobs
    assert job.producer_epoch == 32767  # the epoch kept free for exactly this
    shell.finish_markers()
    assert shell.init() == InitProducerIdResult(E.NONE, 1000, 0)


def test_kip360_expected_epoch_bumps_and_retries_are_idempotent(shell):
    pid = shell.init().producer_id  # epoch 0
    assert shell.init(pid=pid, epoch=0) == InitProducerIdResult(E.NONE, pid, 1)
    assert shell.c.metadata("tx").last_producer_epoch == 0
    # the answer was lost: the same request again gets the same id and epoch
    assert shell.init(pid=pid, epoch=0) == InitProducerIdResult(E.NONE, pid, 1)
    # a producer that is two bumps behind is fenced, as is a foreign producer id
    assert shell.init(pid=pid, epoch=1) == InitProducerIdResult(E.NONE, pid, 2)
    assert shell.init(pid=pid, epoch=0).error is E.PRODUCER_FENCED
    assert shell.init(pid=pid + 77, epoch=2).error is E.PRODUCER_FENCED
    # a plain InitProducerId (a new producer instance) forgets the last epoch
    assert shell.init() == InitProducerIdResult(E.NONE, pid, 3)
    assert shell.init(pid=pid, epoch=2).error is E.PRODUCER_FENCED


def test_kip360_retry_of_a_rotation(shell):
    shell.c.replay(*_rec("tx", TxnStateValue(500, 32766, 60_000, TxnState.COMPLETE_ABORT)))
    assert shell.init(pid=500, epoch=32766) == InitProducerIdResult(E.NONE, 1000, 0)
    meta = shell.c.metadata("tx")
    assert (meta.previous_producer_id, meta.last_producer_epoch) == (500, 32766)
    assert shell.init(pid=500, epoch=32766) == InitProducerIdResult(E.NONE, 1000, 0)
    assert shell.init(pid=500, epoch=32000).error is E.PRODUCER_FENCED


def test_kip360_recovery_after_an_abort(shell):
    """A producer hit an abortable error: it aborts, then bumps its own epoch."""
    pid = shell.init().producer_id
    shell.add("tx", pid, 0, [("t", 0)])
    assert shell.end("tx", pid, 0, False) is E.NONE
    shell.finish_markers()
    assert shell.init(pid=pid, epoch=0) == InitProducerIdResult(E.NONE, pid, 1)


def test_a_failed_round_leaves_the_state_on_disk(shell):
    """What an operation decided is gone with its round: the error the client gets is
    the shard's (test_txn_shard.py); the retry goes through."""
    pid = shell.init().producer_id
    before = shell.state()
    assert shell.fail(lambda c: c.add_partitions("tx", pid, 0, [("t", 0)], T0 + 1)) is E.NONE
    assert shell.state() == before
    assert shell.add("tx", pid, 0, [("t", 0)]) is E.NONE  # the retry goes through
    assert shell.fail(lambda c: c.end_txn("tx", pid, 0, True, T0)) is E.NONE
    assert shell.state().state == "Ongoing" and shell.jobs == []
    assert shell.end("tx", pid, 0, True) is E.NONE
    assert [job.commit for job in shell.jobs] == [True]


def test_failed_first_init_leaves_no_trace(shell):
    fresh = shell.alloc()
    answer = shell.fail(lambda c: c.init_producer_id("tx", 1000, now_ms=T0, producer_id=fresh))
    assert answer == InitProducerIdResult(E.NONE, 1000, 0)  # nobody hears it
    assert shell.c.metadata("tx") is None and shell.c.transactional_ids() == []
    assert shell.init() == InitProducerIdResult(E.NONE, 1001, 0)


def test_a_failed_epoch_fence_is_retried_from_the_log_bumping_once(shell):
    """The fence's round failed, so the reloaded core never saw the bump: the producer's
    retry fences from the state on disk, one epoch up, and the zombie is fenced then."""
    pid = shell.init().producer_id
    shell.add("tx", pid, 0, [("t", 0)])
    answer = shell.fail(lambda c: c.init_producer_id("tx", 60_000, now_ms=T0))
    assert answer == InitProducerIdResult(E.CONCURRENT_TRANSACTIONS)
    assert (shell.state().state, shell.state().producer_epoch) == ("Ongoing", 0)
    assert shell.jobs == []
    assert shell.init().error is E.CONCURRENT_TRANSACTIONS
    [job] = shell.jobs
    assert job.producer_epoch == 1  # bumped once, not twice
    assert shell.end("tx", pid, 0, True) is E.PRODUCER_FENCED
    shell.finish_markers()
    assert shell.init().producer_epoch == 2


def test_ticks_follow_the_abort_check_interval():
    c = TransactionCoordinator(config=TxnConfig(abort_check_interval_ms=250))
    assert c.next_deadline_ms() is None  # not loaded yet
    c.load_complete(T0)
    assert c.next_deadline_ms() == T0 + 250
    assert c.tick(T0 + 300) == Expired()
    assert c.next_deadline_ms() == T0 + 550
    assert c.take_records() == [] and c.take_completions() == []


def test_timed_out_transaction_is_aborted_with_a_fence():
    shell = Shell(TxnConfig(max_timeout_ms=10_000))
    pid = shell.init(timeout=1000).producer_id
    shell.add("tx", pid, 0, [("t", 0)], now=T0)
    assert shell.tick(T0 + 1000) == Expired()
    assert shell.tick(T0 + 1001) == Expired(timed_out=("tx",))
    fence = decode_value(shell.log[-1].value)
    assert (fence.state, fence.producer_epoch) == (TxnState.PREPARE_ABORT, 1)
    assert shell.tick(T0 + 1002) == Expired()  # already under way
    [job] = shell.jobs
    assert (job.commit, job.producer_epoch) == (False, 1)
    assert shell.end("tx", pid, 0, True) is E.PRODUCER_FENCED
    shell.finish_markers()
    assert shell.state().state == "CompleteAbort"
    assert shell.init(timeout=1000) == InitProducerIdResult(E.NONE, pid, 2)


def test_idle_ids_expire_with_a_tombstone():
    shell = Shell(TxnConfig(id_expiration_ms=5000))
    pid = shell.init(now=T0).producer_id
    shell.init("busy", now=T0)
    shell.add("busy", pid + 1, 0, [("t", 0)], now=T0)
    assert shell.tick(T0 + 4999) == Expired()
    assert shell.tick(T0 + 5000) == Expired(removed=("tx",))
    assert shell.log[-1].value is None and decode_key(shell.log[-1].key) == "tx"
    assert shell.state().error is E.TRANSACTIONAL_ID_NOT_FOUND
    assert shell.add("tx", pid, 0, [("t", 0)]) is E.INVALID_PRODUCER_ID_MAPPING
    assert shell.c.transactional_ids() == ["busy"]  # open transactions time out instead
    assert shell.replayed().transactional_ids() == ["busy"]
    assert shell.init().producer_epoch == 0  # a new life


def test_failed_tombstone_keeps_the_id(shell):
    pid = shell.init().producer_id
    assert shell.fail(lambda c: c.tick(T0 + 604_800_000)) == Expired(removed=("tx",))
    assert shell.state().producer_id == pid


def test_stale_marker_completions_are_ignored(shell):
    pid = shell.init().producer_id
    shell.add("tx", pid, 0, [("t", 0)])
    shell.end("tx", pid, 0, True)
    [job1] = shell.finish_markers()
    # the next transaction of the same producer id and epoch
    shell.add("tx", pid, 0, [("t", 1)])
    shell.end("tx", pid, 0, True)
    [job2] = shell.jobs
    c = shell.c
    assert c.markers_written(job1, T0) is False  # a duplicate
    assert c.markers_written(replace(job2, job_id=job1.job_id), T0) is False  # an older job
    assert c.markers_written(replace(job2, producer_epoch=1), T0) is False  # wrong epoch
    assert c.markers_written(replace(job2, producer_id=pid + 1), T0) is False
    assert c.markers_written(replace(job2, transactional_id="nobody"), T0) is False
    assert c.take_records() == [] and shell.state().state == "PrepareCommit"
    assert shell.run(lambda c: c.markers_written(job2, T0)) is True
    assert c.markers_written(job2, T0) is False  # after: Complete
    assert c.take_records() == [] and shell.state().state == "CompleteCommit"


def test_failed_complete_write_keeps_the_job(shell):
    pid = shell.init().producer_id
    shell.add("tx", pid, 0, [("t", 0)])
    shell.end("tx", pid, 0, False)
    [job] = shell.jobs
    assert shell.fail(lambda c: c.markers_written(job, T0)) is True
    assert shell.state().state == "PrepareAbort"
    # the reloaded core owes the same markers, under a job id of its own
    [again] = shell.jobs
    assert again == replace(job, job_id=again.job_id) and again.job_id != job.job_id
    assert shell.c.markers_written(job, T0) is False  # the dropped core's job
    shell.finish_markers()
    assert shell.state().state == "CompleteAbort"


def _rec(txn: str, value: TxnStateValue | None) -> tuple[bytes, bytes | None]:
    record = state_record(txn, value)
    return record.key, record.value


def test_replay_of_every_state_then_load_complete():
    parts = (("t", 0), ("u", 3))
    states = {
        "e": TxnStateValue(1, 4, 1000, TxnState.EMPTY, (), -1, 50),
        "o": TxnStateValue(2, 4, 1000, TxnState.ONGOING, parts, 40, 50),
        "pc": TxnStateValue(3, 4, 1000, TxnState.PREPARE_COMMIT, parts, 40, 50),
        "pa": TxnStateValue(4, 5, 1000, TxnState.PREPARE_ABORT, parts, 40, 50),
        "cc": TxnStateValue(5, 4, 1000, TxnState.COMPLETE_COMMIT, (), 40, 50),
        "ca": TxnStateValue(6, 4, 1000, TxnState.COMPLETE_ABORT, (), 40, 50),
    }
    c = TransactionCoordinator()
    c.replay(*_rec("gone", states["e"]))
    for txn, value in states.items():
        c.replay(*_rec(txn, TxnStateValue(9, 0, 500, TxnState.EMPTY)))  # older, overwritten
        c.replay(*_rec(txn, value))
    c.replay(*_rec("gone", None))
    c.replay(*_rec("dead", TxnStateValue(7, 0, 500, TxnState.DEAD)))
    assert c.transactional_ids() == sorted(states)
    c.load_complete(T0, coordinator_epoch=9)
    jobs = c.take_effects()
    assert [
        (j.transactional_id, j.commit, j.producer_epoch, j.coordinator_epoch) for j in jobs
    ] == [
        ("pa", False, 5, 9),
        ("pc", True, 4, 9),
    ]
    assert all(j.partitions == parts for j in jobs)
    for txn, value in states.items():
        assert c.metadata(txn).value() == value
    # a new coordinator finishes what the log decided
    for job in jobs:
        assert c.markers_written(job, T0) is True
    assert len(c.take_records()) == 2 and c.take_effects() == []
    assert c.describe(["pa", "pc"])[0].state == "CompleteAbort"
    assert c.describe(["pa", "pc"])[1].state == "CompleteCommit"
    # the Ongoing one is left to its timeout: then aborted under a new epoch
    assert c.tick(T0) == Expired(timed_out=("o",))
    [job] = c.take_effects()
    assert (job.commit, job.producer_epoch) == (False, 5)


def test_replay_refuses_garbage_and_the_never_written_fence_state():
    c = TransactionCoordinator()
    with pytest.raises(ValueError):
        c.replay(b"\xc1", None)
    with pytest.raises(ValueError):
        c.replay(*_rec("x", TxnStateValue(1, 0, 10, TxnState.PREPARE_EPOCH_FENCE)))
    assert c.transactional_ids() == []


def test_replayed_log_equals_memory(shell):
    pid = shell.init().producer_id
    shell.add("tx", pid, 0, [("t", 0)])
    shell.end("tx", pid, 0, True)
    shell.init("other")
    assert shell.replayed().describe(["tx", "other"]) == shell.c.describe(["tx", "other"])
    shell.finish_markers()
    shell.init()
    assert shell.replayed().describe(["tx", "other"]) == shell.c.describe(["tx", "other"])


def test_describe_and_list(shell):
    pid = shell.init("a").producer_id
    shell.init("b")
    shell.add("a", pid, 0, [("t", 0)], now=T0)
    d = shell.c.describe(["a", "zz", ""])
    assert (d[0].state, d[0].partitions, d[0].txn_start_ms) == ("Ongoing", (("t", 0),), T0)
    assert d[1].error is E.TRANSACTIONAL_ID_NOT_FOUND and d[2].error is E.INVALID_REQUEST
    everything = shell.c.list_transactions()
    assert [(t.transactional_id, t.state) for t in everything.transactions] == [
        ("a", "Ongoing"),
        ("b", "Empty"),
    ]
    by_state = shell.c.list(["Empty", "Bogus"])
    assert [t.transactional_id for t in by_state.transactions] == ["b"]
    assert by_state.unknown_state_filters == ["Bogus"]
    assert [t.transactional_id for t in shell.c.list(producer_ids_filter=[pid]).transactions] == [
        "a"
    ]
    long = shell.c.list(duration_filter_ms=500, now_ms=T0 + 501).transactions
    assert [t.transactional_id for t in long] == ["a"]
    assert shell.c.list(duration_filter_ms=500, now_ms=T0 + 500).transactions == []
