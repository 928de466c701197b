"""Stateful model of the transaction coordinator and a shell that misbehaves.

Producers (current ones and zombies left behind by epoch bumps) send InitProducerId,
AddPartitionsToTxn, EndTxn in any order; appends to ``__transaction_state`` finish late
or fail; marker jobs complete late, twice, or after newer transactions began (KAFKA-17754's
scenario); timeouts and id expiry fire whenever. Invariants: every record written is a
legal transition from the id's previous record (so at most one transaction is open per
id and a commit decided is a commit done); epochs never go down for a producer id; a stale
completion changes nothing; replaying the records written so far rebuilds the same state.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from logmq.errors import ErrorCode
from logmq.txn import (
    InitProducerIdResult,
    MarkerJob,
    Pending,
    TransactionCoordinator,
    TxnConfig,
    TxnRecord,
    TxnState,
    TxnStateValue,
    decode_key,
    decode_value,
)

E = ErrorCode
S = TxnState
IDS = ["a", "b"]
PARTS = [("t", 0), ("t", 1), ("u", 0)]
CONFIG = TxnConfig(max_timeout_ms=10_000, id_expiration_ms=60_000)
FENCED = {E.PRODUCER_FENCED, E.INVALID_PRODUCER_ID_MAPPING}
APPEND_ERRORS = [E.NOT_ENOUGH_REPLICAS, E.NOT_LEADER_OR_FOLLOWER, E.REQUEST_TIMED_OUT]
IDLE = (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT)
PREPARED = (S.PREPARE_COMMIT, S.PREPARE_ABORT)


def legal(prev: TxnStateValue | None, new: TxnStateValue | None) -> bool:
    """Is ``new`` a transition Kafka's state machine allows from ``prev``?"""
    if new is None:
        return prev is not None and prev.state in IDLE
    same_producer = prev is not None and (prev.producer_id, prev.producer_epoch) == (
        new.producer_id,
        new.producer_epoch,
    )
    if new.state is S.EMPTY:
        if prev is None:
            return new.producer_epoch == 0
        if prev.state not in IDLE or new.partitions:
            return False
        bumped = new.producer_id == prev.producer_id and new.producer_epoch in (
            prev.producer_epoch,  # a KIP-360 retry
            prev.producer_epoch + 1,
        )
        return bumped or (new.producer_id != prev.producer_id and new.producer_epoch == 0)
    if prev is None:
        return False
    if new.state is S.ONGOING:
        return (
            same_producer
            and prev.state in (*IDLE, S.ONGOING)
            and set(new.partitions) > (set(prev.partitions) if prev.state is S.ONGOING else set())
        )
    if new.state is S.PREPARE_COMMIT:
        return same_producer and prev.state is S.ONGOING and new.partitions == prev.partitions
    if new.state is S.PREPARE_ABORT:
        return (
            prev.state is S.ONGOING
            and new.producer_id == prev.producer_id
            and new.producer_epoch in (prev.producer_epoch, prev.producer_epoch + 1)
            and new.partitions == prev.partitions
        )
    if new.state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
        wanted = S.PREPARE_COMMIT if new.state is S.COMPLETE_COMMIT else S.PREPARE_ABORT
        return same_producer and prev.state is wanted and not new.partitions
    return False


class TxnMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.c = TransactionCoordinator(0, 1, CONFIG, coordinator_epoch=1)
        self.c.load_complete(0)
        self.now = 1000
        self.next_pid = 100
        self.inflight: list[Pending] = []
        self.log: list[TxnRecord] = []
        self.last: dict[str, TxnStateValue | None] = {}  # newest written value per id
        self.max_epoch: dict[int, int] = {}  # producer id -> highest epoch written
        self.seen_epoch: dict[int, int] = {}  # producer id -> highest epoch in memory
        self.jobs_out: list[MarkerJob] = []  # sent, completion not yet reported
        self.live_jobs: dict[str, int] = {}  # id -> job issued whose Complete* is not written
        self.completing: dict[int, MarkerJob] = {}  # id(pending) -> job it completes
        self.all_jobs: list[MarkerJob] = []
        self.clients: dict[str, tuple[int, int] | None] = dict.fromkeys(IDS)
        self.zombies: dict[str, list[tuple[int, int]]] = {t: [] for t in IDS}

    def alloc(self) -> int:
        self.next_pid += 1
        return self.next_pid

    def memory(self, txn: str) -> tuple[int, int] | None:
        meta = self.c.metadata(txn)
        return None if meta is None else (meta.producer_id, meta.producer_epoch)

    def take(self, result):
        if isinstance(result, Pending):
            assert all(p.transactional_id != result.transactional_id for p in self.inflight)
            self.inflight.append(result)
        return result

    def producer(self, txn: str, zombie: bool, data) -> tuple[int, int] | None:
        if zombie:
            return data.draw(st.sampled_from(self.zombies[txn])) if self.zombies[txn] else None
        return self.clients[txn]

    @initialize()
    def producers_start(self):
        for txn in IDS:
            self.take(
                self.c.init_producer_id(txn, 5000, now_ms=self.now, allocate_producer_id=self.alloc)
            )
        self.settle()

    # ---- producers -------------------------------------------------------------------

    @rule(txn=st.sampled_from(IDS), expected=st.sampled_from(["none", "current", "zombie"]),
          timeout=st.sampled_from([1000, 5000]), data=st.data())  # fmt: skip
    def init(self, txn, expected, timeout, data):
        pid, epoch = -1, -1
        if expected != "none":
            chosen = self.producer(txn, expected == "zombie", data)
            if chosen is None:
                return
            pid, epoch = chosen
        result = self.c.init_producer_id(
            txn, timeout, pid, epoch, now_ms=self.now, allocate_producer_id=self.alloc
        )
        if not isinstance(result, Pending):
            assert result.error in {E.CONCURRENT_TRANSACTIONS, E.PRODUCER_FENCED}, result
            assert result.error is E.CONCURRENT_TRANSACTIONS or expected != "none"
        self.take(result)

    @rule(txn=st.sampled_from(IDS), zombie=st.booleans(), data=st.data(),
          parts=st.lists(st.sampled_from(PARTS), min_size=1, max_size=2))  # fmt: skip
    def add(self, txn, zombie, data, parts):
        producer = self.producer(txn, zombie, data)
        if producer is None:
            return
        meta = self.c.metadata(txn)
        busy = meta is not None and (meta.pending is not None or meta.state in PREPARED)
        result = self.take(self.c.add_partitions(txn, *producer, parts, self.now))
        if producer != self.memory(txn):
            assert result in FENCED, result
        elif busy:
            assert result is E.CONCURRENT_TRANSACTIONS
        else:
            assert result is E.NONE or (isinstance(result, Pending) and result.answer is E.NONE)

    @rule(txn=st.sampled_from(IDS), zombie=st.booleans(), commit=st.booleans(), data=st.data())
    def end(self, txn, zombie, commit, data):
        producer = self.producer(txn, zombie, data)
        if producer is None:
            return
        meta = self.c.metadata(txn)
        state = None if meta is None else meta.state
        was_pending = meta is not None and meta.pending is not None
        result = self.take(self.c.end_txn(txn, *producer, commit, self.now))
        if producer != self.memory(txn):
            assert result in FENCED, result  # a delayed EndTxn of an older epoch
        elif isinstance(result, Pending):
            assert state is S.ONGOING and result.answer is E.NONE
        elif state is S.ONGOING:
            assert result is E.CONCURRENT_TRANSACTIONS and was_pending
        else:
            assert result in {E.NONE, E.CONCURRENT_TRANSACTIONS, E.INVALID_TXN_STATE}

    @rule(txn=st.sampled_from(IDS), commit=st.booleans(), data=st.data())
    def whole_transaction(self, txn, commit, data):
        """The current producer adds, the shell catches up, it ends; markers stay out."""
        self.add(txn, False, data, [PARTS[0]])
        self.settle()
        self.end(txn, False, commit, data)
        self.settle_appends()

    @rule(txn=st.sampled_from(IDS), data=st.data())
    def verify(self, txn, data):
        producer = self.producer(txn, data.draw(st.booleans()), data)
        if producer is None:
            return
        answer = self.c.add_partitions(txn, *producer, PARTS, self.now, verify_only=True)
        meta = self.c.metadata(txn)
        for tp, error in answer.items():
            if error is E.NONE:
                assert meta.state is S.ONGOING and tp in meta.partitions
                assert producer == self.memory(txn)

    # ---- the shell -------------------------------------------------------------------

    @precondition(lambda self: self.inflight)
    @rule(data=st.data(), ok=st.booleans())
    def finish_append(self, data, ok):
        pending = self.inflight.pop(data.draw(st.integers(0, len(self.inflight) - 1)))
        self._finish(pending, None if ok else data.draw(st.sampled_from(APPEND_ERRORS)))

    def _finish(self, pending: Pending, error: ErrorCode | None) -> None:
        job = self.completing.pop(id(pending), None)
        txn = pending.transactional_id
        if error is not None:
            answer = self.c.write_failed(pending, error)
            if job is not None:
                self.jobs_out.append(job)  # the shell tries to complete it again
            assert answer is None or answer != E.NONE
            return
        new = pending.target
        prev = self.last.get(txn)
        assert legal(prev, new), (prev, new)
        if new is not None:
            assert new.producer_epoch >= self.max_epoch.get(new.producer_id, -1)
            self.max_epoch[new.producer_id] = new.producer_epoch
        self.log += pending.records
        self.last[txn] = new
        if job is not None:
            assert self.live_jobs.pop(txn) == job.job_id
        jobs = self.c.written(pending)
        for new_job in jobs:
            # never a second marker job for an id before the first one's end is durable
            assert txn not in self.live_jobs
            self.live_jobs[txn] = new_job.job_id
            meta = self.c.metadata(txn)
            assert new_job.commit == (meta.state is S.PREPARE_COMMIT)
            assert (new_job.producer_id, new_job.producer_epoch) == self.memory(txn)
            assert set(new_job.partitions) == meta.partitions
            assert new_job.coordinator_epoch == 1
        self.jobs_out += jobs
        self.all_jobs += jobs
        answer = pending.answer
        if isinstance(answer, InitProducerIdResult) and answer.error is E.NONE:
            old, new_client = self.clients[txn], (answer.producer_id, answer.producer_epoch)
            if old is not None and old != new_client:
                if old[0] == new_client[0]:
                    assert new_client[1] > old[1]
                self.zombies[txn].append(old)
            self.clients[txn] = new_client

    @precondition(lambda self: self.jobs_out)
    @rule(data=st.data(), duplicate=st.booleans())
    def markers_done(self, data, duplicate):
        """A job's markers are all written; a duplicate report may follow any time later."""
        job = self.jobs_out[data.draw(st.integers(0, len(self.jobs_out) - 1))]
        if not duplicate:
            self.jobs_out.remove(job)
        meta = self.c.metadata(job.transactional_id)
        current = (
            meta is not None
            and meta.pending is None
            and meta.state in PREPARED
            and meta.marker_job_id == job.job_id
        )
        before = self.c.describe(IDS)
        result = self.c.markers_written(
            job.transactional_id, job.producer_id, job.producer_epoch, self.now, job_id=job.job_id
        )
        if not current:
            assert result is None and self.c.describe(IDS) == before
            return
        assert isinstance(result, Pending)
        self.take(result)
        self.completing[id(result)] = job

    @precondition(lambda self: self.all_jobs)
    @rule(data=st.data(), with_job_id=st.booleans())
    def stale_markers_done(self, data, with_job_id):
        """A completion of a job that is no longer outstanding: delayed or duplicated."""
        job = data.draw(st.sampled_from(self.all_jobs))
        outstanding = job in self.jobs_out or job in self.completing.values()
        meta = self.c.metadata(job.transactional_id)
        if outstanding or (not with_job_id and meta is not None and meta.state in PREPARED):
            return  # without the job id, a report of the same epoch cannot be told apart
        before = self.c.describe(IDS)
        result = self.c.markers_written(
            job.transactional_id,
            job.producer_id,
            job.producer_epoch,
            self.now,
            job_id=job.job_id if with_job_id else None,
        )
        assert result is None
        assert self.c.describe(IDS) == before

    @rule()
    def settle_appends(self):
        while self.inflight:
            self._finish(self.inflight.pop(0), None)

    @rule()
    def settle(self):
        """The shell catches up: every append succeeds, every marker job completes."""
        for _ in range(8):
            if not self.inflight and not self.jobs_out:
                return
            while self.inflight:
                self._finish(self.inflight.pop(0), None)
            while self.jobs_out:
                job = self.jobs_out.pop(0)
                result = self.c.markers_written(
                    job.transactional_id,
                    job.producer_id,
                    job.producer_epoch,
                    self.now,
                    job_id=job.job_id,
                )
                if result is not None:
                    self.take(result)
                    self.completing[id(result)] = job

    @rule(dt=st.sampled_from([0, 100, 700, 3000, 70_000]))
    def tick(self, dt):
        self.now += dt
        for pending in self.c.expire(self.now):
            assert pending.answer is None
            self.take(pending)

    # ---- invariants ------------------------------------------------------------------

    @invariant()
    def one_open_transaction_and_one_change_per_id(self):
        for txn in IDS:
            assert sum(p.transactional_id == txn for p in self.inflight) <= 1
            meta = self.c.metadata(txn)
            if meta is not None and meta.state in PREPARED:
                assert meta.marker_job_id == self.live_jobs[txn]
            else:
                assert txn not in self.live_jobs

    @invariant()
    def epochs_never_go_down(self):
        for txn in self.c.transactional_ids():
            pid, epoch = self.memory(txn)
            assert epoch >= self.seen_epoch.get(pid, -1)
            self.seen_epoch[pid] = epoch

    @invariant()
    def records_rebuild_the_state(self):
        fresh = TransactionCoordinator(0, 1, CONFIG)
        for record in self.log:
            fresh.replay(record.key, record.value)
        assert fresh.transactional_ids() == self.c.transactional_ids()
        for txn in self.c.transactional_ids():
            rebuilt, live = fresh.metadata(txn).value(), self.c.metadata(txn).value()
            assert rebuilt == self.last[txn] == decode_value(_newest(self.log, txn))
            if self.c.metadata(txn).has_failed_epoch_fence:
                # the one deliberate difference: the bumped epoch stays in memory
                assert rebuilt.producer_epoch + 1 == live.producer_epoch
                live = replace(
                    live,
                    producer_epoch=rebuilt.producer_epoch,
                    last_producer_epoch=rebuilt.last_producer_epoch,
                )
            assert rebuilt == live


def _newest(log: list[TxnRecord], txn: str) -> bytes:
    return next(r.value for r in reversed(log) if decode_key(r.key) == txn)


TxnMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_txn_coordinator_model = TxnMachine.TestCase
