"""Stateful model of the transaction coordinator as the coordinator shard drives it.

The core is driven through its shard interface only (operations, then ``take_records``
and ``take_effects``), by a model of ``CoordinatorShard``: operations gather into a
round; a round is appended to the partition (or its append fails, and the core is
loaded again from the log); appended rounds become durable in order when the high
watermark passes them (their answers are delivered and their effects released then),
or time out (answers lost, effects held for the next durable round); a failover loads a
new core, one coordinator epoch up, from the log truncated anywhere above the high
watermark.

Producers (current ones and zombies left behind by epoch bumps) send InitProducerId,
AddPartitionsToTxn (and its KIP-890 verification), EndTxn in any order; marker jobs
complete late, twice, or after newer transactions began, or are reported to a core
that did not issue them (KAFKA-17754's scenario); timeouts and id expiry fire whenever.

Invariants: every record appended is a legal transition from the id's previous record
(so at most one transaction is open per id and a commit decided is a commit done);
epochs never go down for a producer id; a marker job is released only once its
Prepare* record is durable, never twice, and a core has at most one job per id; a stale
completion changes nothing; a core rebuilt from the log (plus the round being built)
equals the live one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

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
    NEED_PRODUCER_ID,
    InitProducerIdResult,
    MarkerJob,
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
CONFIG = TxnConfig(max_timeout_ms=10_000, id_expiration_ms=60_000, abort_check_interval_ms=500)
FENCED = {E.PRODUCER_FENCED, E.INVALID_PRODUCER_ID_MAPPING}
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


@dataclass
class Round:
    """Operations applied together: their records, answers and effects."""

    records: list[TxnRecord] = field(default_factory=list)
    answers: list[tuple[str, Any]] = field(default_factory=list)  # (txn id, InitProducerId)
    effects: list[MarkerJob] = field(default_factory=list)
    end: int = 0  # the log length once appended: durable when the HW reaches it


class ShardedTxnMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1000
        self.next_pid = 100
        self.disk: list[TxnRecord] = []  # the partition's records
        self.hw = 0  # records below are on every in-sync replica
        self.epoch = 1  # the partition's leader epoch: the coordinator epoch
        self.generation = itertools.count(1)
        self.open = Round()  # applied, not appended yet
        self.appended: list[Round] = []  # appended, waiting for the HW, oldest first
        self.held: list[MarkerJob] = []  # effects of rounds that timed out
        self.clients: dict[str, tuple[int, int] | None] = dict.fromkeys(IDS)
        self.zombies: dict[str, list[tuple[int, int]]] = {t: [] for t in IDS}
        self.durable_epoch: dict[int, int] = {}  # producer id -> highest durable epoch
        self.checked = 0  # durable records whose epochs were checked
        self.released: set[tuple[int, int]] = set()  # (core, job id) of released jobs
        self.all_jobs: list[tuple[int, MarkerJob]] = []  # (core, job) of every job
        self.load(len(self.disk))

    # ---- the shard ------------------------------------------------------------------

    def load(self, keep: int) -> None:
        """Drop the core and everything in flight; load a new core from ``disk[:keep]``."""
        del self.disk[keep:]
        self.gen = next(self.generation)
        self.core = TransactionCoordinator(
            0, 1, CONFIG, self.epoch, first_job_id=self.gen * 1_000_000
        )
        for record in self.disk:
            self.core.replay(record.key, record.value)
        self.core.load_complete(self.now, coordinator_epoch=self.epoch)
        self.live_jobs: dict[str, int] = {}  # id -> job of this core not completed
        self.jobs_out: list[MarkerJob] = []  # released, completion not reported yet
        self.done_jobs: set[int] = set()  # job ids of this core completed
        self.prepares_with_job: set[int] = set()  # disk index of each job's Prepare*
        self.open, self.appended, self.held = Round(), [], []
        self.collect(self.open, None)  # the first operation takes what the loader owes

    def collect(self, into: Round, answer: tuple[str, Any] | None) -> None:
        """After an operation, as the shard's worker: take its records and effects."""
        into.records += self.core.take_records()
        for job in self.core.take_effects():
            # never a second job for an id before the first one's Complete* is decided
            assert job.transactional_id not in self.live_jobs
            self.live_jobs[job.transactional_id] = job.job_id
            meta = self.core.metadata(job.transactional_id)
            assert job.commit == (meta.state is S.PREPARE_COMMIT)
            assert (job.producer_id, job.producer_epoch) == (meta.producer_id, meta.producer_epoch)
            assert set(job.partitions) == meta.partitions
            assert len(set(job.partitions)) == len(job.partitions)
            assert job.coordinator_epoch == self.epoch
            into.effects.append(job)
            self.all_jobs.append((self.gen, job))
        assert self.core.take_completions() == []
        if answer is not None:
            into.answers.append(answer)

    def op(self, fn, txn: str | None = None) -> Any:
        answer = fn(self.core)
        self.collect(self.open, (txn, answer) if isinstance(answer, InitProducerIdResult) else None)
        return answer

    def release(self, jobs: list[MarkerJob]) -> None:
        for job in jobs:
            assert (self.gen, job.job_id) not in self.released, job
            self.released.add((self.gen, job.job_id))
            # its Prepare* is durable: the newest durable record of the id says so
            index = max(
                i for i in range(self.hw) if decode_key(self.disk[i].key) == job.transactional_id
            )
            value = decode_value(self.disk[index].value)
            assert value.state is (S.PREPARE_COMMIT if job.commit else S.PREPARE_ABORT)
            assert (value.producer_id, value.producer_epoch) == (
                job.producer_id,
                job.producer_epoch,
            )
            assert value.partitions == job.partitions
            assert index not in self.prepares_with_job  # one job per decision per core
            self.prepares_with_job.add(index)
            self.jobs_out.append(job)

    def deliver(self, txn: str, answer: InitProducerIdResult) -> None:
        if answer.error is not E.NONE:
            return
        new_client = (answer.producer_id, answer.producer_epoch)
        assert any(  # what the client hears is on disk
            decode_key(r.key) == txn
            and r.value is not None
            and (decode_value(r.value).producer_id, decode_value(r.value).producer_epoch)
            == new_client
            for r in self.disk[: self.hw]
        )
        old = self.clients[txn]
        if old is not None and old != new_client:
            if old[0] == new_client[0]:
                assert new_client[1] > old[1]
            self.zombies[txn].append(old)
        self.clients[txn] = new_client

    @rule(fails=st.booleans())
    def append_round(self, fails):
        """The worker appends the round (one batch), or the append fails: reload."""
        if fails and self.open.records:
            self.load(len(self.disk))  # the local log keeps everything appended before
            return
        prev = {}
        for record in self.disk:
            prev[decode_key(record.key)] = record.value
        for record in self.open.records:
            txn = decode_key(record.key)
            old = None if prev.get(txn) is None else decode_value(prev[txn])
            new = None if record.value is None else decode_value(record.value)
            assert legal(old, new), (old, new)
            prev[txn] = record.value
        self.disk += self.open.records
        self.open.end = len(self.disk)
        self.appended.append(self.open)
        self.open = Round()

    @precondition(lambda self: self.appended or self.held)
    @rule()
    def replicate(self):
        """The HW passes the oldest appended round: answered, effects released."""
        if not self.appended:  # the shard's retry of held effects: an empty round
            self.appended.append(Round(end=len(self.disk)))
        round_ = self.appended.pop(0)
        self.hw = max(self.hw, round_.end)
        for record in self.disk[self.checked : self.hw]:
            if record.value is not None:
                value = decode_value(record.value)
                pid = value.producer_id
                assert value.producer_epoch >= self.durable_epoch.get(pid, -1)
                self.durable_epoch[pid] = value.producer_epoch
        self.checked = self.hw
        for txn, answer in round_.answers:
            self.deliver(txn, answer)
        jobs, self.held = self.held + round_.effects, []
        self.release(jobs)

    @precondition(lambda self: self.appended)
    @rule()
    def round_times_out(self):
        """Not replicated in time: the answers are lost, the effects wait."""
        self.held += self.appended.pop(0).effects

    @rule(data=st.data())
    def failover(self, data):
        """A new leader, one epoch up, with the log above the HW cut anywhere."""
        keep = data.draw(st.integers(self.hw, len(self.disk)))
        self.epoch += 1
        self.load(keep)

    @rule()
    def settle(self):
        """Everything is appended and replicated, every marker job completes."""
        for _ in range(6):
            self.append_round(False)
            while self.appended or self.held:
                self.replicate()
            if not self.jobs_out:
                return
            while self.jobs_out:
                self.markers_done_of(self.jobs_out.pop(0))

    # ---- producers -------------------------------------------------------------------

    def alloc(self) -> int:
        self.next_pid += 1
        return self.next_pid

    def memory(self, txn: str) -> tuple[int, int] | None:
        meta = self.core.metadata(txn)
        return None if meta is None else (meta.producer_id, meta.producer_epoch)

    def producer(self, txn: str, zombie: bool, data) -> tuple[int, int] | None:
        if zombie:
            return data.draw(st.sampled_from(self.zombies[txn])) if self.zombies[txn] else None
        return self.clients[txn]

    @initialize()
    def producers_start(self):
        for txn in IDS:
            self.init(txn, "none", 5000, None)
        self.settle()

    @rule(txn=st.sampled_from(IDS), expected=st.sampled_from(["none", "current", "zombie"]),
          timeout=st.sampled_from([1000, 5000]), data=st.data())  # fmt: skip
    def init(self, txn, expected, timeout, data):
        pid, epoch = -1, -1
        if expected != "none":
            chosen = self.producer(txn, expected == "zombie", data)
            if chosen is None:
                return
            pid, epoch = chosen
        before = self.core.describe(IDS)
        needs = self.core.needs_producer_id(txn)
        result = self.core.init_producer_id(txn, timeout, pid, epoch, now_ms=self.now)
        if result is NEED_PRODUCER_ID:
            assert needs and self.core.take_records() == [] and self.core.describe(IDS) == before
            fresh = self.alloc()
            result = self.op(
                lambda c: c.init_producer_id(
                    txn, timeout, pid, epoch, now_ms=self.now, producer_id=fresh
                ),
                txn,
            )
        else:
            self.collect(self.open, (txn, result))
        if result.error is not E.NONE:
            assert result.error in {E.CONCURRENT_TRANSACTIONS, E.PRODUCER_FENCED}, result
            assert result.error is E.CONCURRENT_TRANSACTIONS or expected != "none"

    @rule(txn=st.sampled_from(IDS), zombie=st.booleans(), data=st.data(),
          parts=st.lists(st.sampled_from(PARTS), min_size=1, max_size=2))  # fmt: skip
    def add(self, txn, zombie, data, parts):
        producer = self.producer(txn, zombie, data)
        if producer is None:
            return
        meta = self.core.metadata(txn)
        busy = meta is not None and meta.state in PREPARED
        result = self.op(lambda c: c.add_partitions(txn, *producer, parts, self.now))
        if producer != self.memory(txn):
            assert result in FENCED, result
        elif busy:
            assert result is E.CONCURRENT_TRANSACTIONS
        else:
            assert result is E.NONE
            assert set(parts) <= self.core.metadata(txn).partitions

    @rule(txn=st.sampled_from(IDS), zombie=st.booleans(), commit=st.booleans(), data=st.data())
    def end(self, txn, zombie, commit, data):
        producer = self.producer(txn, zombie, data)
        if producer is None:
            return
        meta = self.core.metadata(txn)
        state = None if meta is None else meta.state
        result = self.op(lambda c: c.end_txn(txn, *producer, commit, self.now))
        if producer != self.memory(txn):
            assert result in FENCED, result  # a delayed EndTxn of an older epoch
        elif state is S.ONGOING:
            assert result is E.NONE
            assert self.core.metadata(txn).state is (
                S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
            )
        else:
            assert result in {E.NONE, E.CONCURRENT_TRANSACTIONS, E.INVALID_TXN_STATE}

    @rule(txn=st.sampled_from(IDS), commit=st.booleans(), data=st.data())
    def whole_transaction(self, txn, commit, data):
        """The current producer adds, the shard catches up, it ends; markers stay out."""
        self.add(txn, False, data, [PARTS[0]])
        self.settle()
        self.end(txn, False, commit, data)
        self.append_round(False)

    @rule(txn=st.sampled_from(IDS), data=st.data())
    def verify(self, txn, data):
        producer = self.producer(txn, data.draw(st.booleans()), data)
        if producer is None:
            return
        answer = self.op(lambda c: c.verify_partitions(txn, *producer, PARTS))
        meta = self.core.metadata(txn)
        for tp, error in answer.items():
            if error is E.NONE:
                assert meta.state is S.ONGOING and tp in meta.partitions
                assert producer == self.memory(txn)

    # ---- markers and time -------------------------------------------------------------

    def markers_done_of(self, job: MarkerJob) -> None:
        current = self.live_jobs.get(job.transactional_id) == job.job_id
        before, records = self.core.describe(IDS), len(self.open.records)
        done = self.op(lambda c: c.markers_written(job, self.now))
        assert done is current
        if done:
            del self.live_jobs[job.transactional_id]
            self.done_jobs.add(job.job_id)
        else:
            assert self.core.describe(IDS) == before and len(self.open.records) == records

    @precondition(lambda self: self.jobs_out)
    @rule(data=st.data(), duplicate=st.booleans())
    def markers_done(self, data, duplicate):
        """A job's markers are all written; a duplicate report may follow any time later."""
        job = self.jobs_out[data.draw(st.integers(0, len(self.jobs_out) - 1))]
        if not duplicate:
            self.jobs_out.remove(job)
        self.markers_done_of(job)

    @precondition(lambda self: self.all_jobs)
    @rule(data=st.data())
    def stale_markers_done(self, data):
        """A completion of a job no longer outstanding: delayed, duplicated, or of a core
        that was dropped (the shard would not even deliver it; the job id must not match)."""
        gen, job = data.draw(st.sampled_from(self.all_jobs))
        if gen == self.gen and job.job_id not in self.done_jobs:
            return  # still this core's job
        before, records = self.core.describe(IDS), len(self.open.records)
        assert self.op(lambda c: c.markers_written(job, self.now)) is False
        assert self.core.describe(IDS) == before and len(self.open.records) == records

    @rule(dt=st.sampled_from([0, 100, 700, 3000, 70_000]))
    def tick(self, dt):
        self.now += dt
        deadline = self.core.next_deadline_ms()
        assert deadline is not None
        if deadline <= self.now:
            self.op(lambda c: c.tick(self.now))
            assert self.core.next_deadline_ms() == self.now + CONFIG.abort_check_interval_ms

    # ---- invariants ------------------------------------------------------------------

    @invariant()
    def one_job_per_open_decision(self):
        for txn in IDS:
            meta = self.core.metadata(txn)
            if meta is not None and meta.state in PREPARED:
                assert meta.marker_job_id == self.live_jobs[txn]
            else:
                assert txn not in self.live_jobs

    @invariant()
    def durable_epochs_never_go_down(self):
        for txn in self.core.transactional_ids():
            pid, epoch = self.memory(txn)
            assert epoch >= self.durable_epoch.get(pid, -1)

    @invariant()
    def a_core_rebuilt_from_the_log_equals_the_live_one(self):
        fresh = TransactionCoordinator(0, 1, CONFIG, self.epoch)
        for record in [*self.disk, *self.open.records]:
            fresh.replay(record.key, record.value)
        assert fresh.transactional_ids() == self.core.transactional_ids()
        for txn in self.core.transactional_ids():
            assert fresh.metadata(txn).value() == self.core.metadata(txn).value()
        fresh.load_complete(self.now)
        owed = {(j.transactional_id, j.producer_epoch, j.commit) for j in fresh.take_effects()}
        live = {
            (txn, meta.producer_epoch, meta.state is S.PREPARE_COMMIT)
            for txn in self.core.transactional_ids()
            if (meta := self.core.metadata(txn)).state in PREPARED
        }
        assert owed == live


ShardedTxnMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_txn_coordinator_model = ShardedTxnMachine.TestCase
