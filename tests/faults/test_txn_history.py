"""The transactional history checker: correct runs pass, each broken promise is caught.

Runs are generated from a model of a correct broker and correct workers: every input
value is eventually transformed by one committed transaction, after zero or more
attempts that aborted (told so, or left pending by a kill -9, or with an unknown
outcome); a committed transaction's records are all visible to read_committed, an
aborted one's to read_uncommitted only; live read_committed reads happen after the
commit was called; LSO samples only grow. Then one mutation breaks one promise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.faults.txn_history import Kind, Outcome, TxnHistory, output_value, parse_output

OUT = "out"
PARTITIONS = 3
LIMIT = 20_000  # the hang limit, ms


@dataclass
class Txn:
    id: str
    worker: str
    inputs: list[str]
    outcome: Outcome  # what the worker was told
    commits: bool  # what the broker did
    called: bool  # commit_transaction was called
    begin: int
    records: list[tuple[int, int, bytes]] = field(default_factory=list)  # (partition, offset, v)


@dataclass
class Run:
    inputs: list[str]
    txns: list[Txn]
    ends: dict[int, int]
    reads: list[tuple[int, int, bytes, int]] = field(default_factory=list)
    lso: list[tuple[int, int, int, int]] = field(default_factory=list)  # (p, lso, hw, at)
    states: dict[str, str] = field(default_factory=dict)

    def build(self) -> TxnHistory:
        h = TxnHistory(self.inputs)
        for t in self.txns:
            h.begin(t.id, t.worker, t.inputs, t.begin)
            if t.called:
                h.commit_called(t.id, t.begin + 5)
            if t.outcome is Outcome.COMMITTED:
                h.committed(t.id, t.begin + 9)
            elif t.outcome is Outcome.ABORTED:
                h.aborted(t.id, t.begin + 9, "abortable")
            elif t.outcome is Outcome.UNKNOWN:
                h.unknown(t.id, t.begin + 9, "fatal")
        for p, offset, value, at in self.reads:
            h.read("reader", OUT, p, offset, value, at)
        for p, lso, hw, at in self.lso:
            h.lso(OUT, p, lso, hw, at)
        for p in range(PARTITIONS):
            every = [(o, v) for t in self.txns for (q, o, v) in t.records if q == p]
            visible = [(o, v) for t in self.txns if t.commits for (q, o, v) in t.records if q == p]
            h.final_read(OUT, p, visible, every)
        h.final_state(self.states, {(OUT, p): (end, end) for p, end in self.ends.items()})
        return h


FAILED = st.sampled_from(
    [
        (Outcome.ABORTED, False),
        (Outcome.ABORTED, True),
        (Outcome.PENDING, False),  # killed mid-transaction
        (Outcome.PENDING, True),  # killed after calling commit: the broker aborted it
        (Outcome.UNKNOWN, False),
    ]
)
SUCCEEDED = st.sampled_from([Outcome.COMMITTED, Outcome.COMMITTED, Outcome.UNKNOWN])


@st.composite
def runs(draw: st.DrawFn) -> Run:
    n = draw(st.integers(1, 16))
    inputs = [f"in-{i}" for i in range(n)]
    txns: list[Txn] = []
    ends = dict.fromkeys(range(PARTITIONS), 0)
    clock = 1000
    i = 0

    def write(t: Txn) -> None:
        touched = set()
        for value in t.inputs:
            p = int(value.split("-")[1]) % PARTITIONS
            t.records.append((p, ends[p], output_value(value, t.worker, t.id)))
            ends[p] += 1
            touched.add(p)
        for p in touched:
            ends[p] += 1  # the marker

    while i < n:
        size = draw(st.integers(1, 4))
        chunk = inputs[i : i + size]
        i += size
        for _ in range(draw(st.integers(0, 2))):
            outcome, called = draw(FAILED)
            worker = str(draw(st.integers(0, 2)))
            t = Txn(f"{worker}.0.{len(txns)}", worker, chunk, outcome, False, called, clock)
            clock += 20
            if draw(st.booleans()):  # it wrote its records before it failed
                write(t)
            txns.append(t)
        worker = str(draw(st.integers(0, 2)))
        t = Txn(f"{worker}.0.{len(txns)}", worker, chunk, draw(SUCCEEDED), True, True, clock)
        clock += 20
        write(t)
        txns.append(t)
    run = Run(inputs, txns, dict(ends))
    # live read_committed reads: committed records, after the commit was called
    for t in txns:
        if t.commits and draw(st.booleans()):
            for p, offset, value in t.records:
                run.reads.append((p, offset, value, t.begin + 5 + draw(st.integers(0, 50))))
    # LSO samples: growing, each partition's LSO never stuck below its HW for long
    for p in range(PARTITIONS):
        lso = 0
        at = 0
        for _ in range(draw(st.integers(0, 5))):
            hw = draw(st.integers(lso, ends[p]))
            lso = draw(st.integers(lso, hw))
            at += draw(st.integers(1, LIMIT // 2))
            run.lso.append((p, lso, hw, at))
    run.states = {
        f"txn-worker-{w}": draw(st.sampled_from(["CompleteCommit", "Empty"])) for w in "012"
    }
    return run


FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(runs())
def test_correct_runs_pass(run: Run) -> None:
    result = run.build().check(LIMIT)
    assert result.ok, result.report()
    assert result.stats["inputs"] == len(run.inputs)


@FAST
@given(runs(), st.data())
def test_a_committed_record_missing_is_caught(run: Run, data: st.DataObject) -> None:
    t = data.draw(st.sampled_from([t for t in run.txns if t.commits]))
    h = run.build()
    p, offset, _ = data.draw(st.sampled_from(t.records))
    del h.final.committed[(OUT, p)][offset]
    kinds = h.check(LIMIT).kinds()
    assert kinds & {Kind.PARTIAL, Kind.LOST}
    if len(t.records) == 1:
        assert Kind.LOST in kinds


@FAST
@given(runs(), st.data())
def test_an_acknowledged_commit_that_aborted_is_lost(run: Run, data: st.DataObject) -> None:
    told = [t for t in run.txns if t.outcome is Outcome.COMMITTED]
    if not told:
        return
    t = data.draw(st.sampled_from(told))
    t.commits = False
    result = run.build().check(LIMIT)
    assert Kind.LOST in result.kinds(), result.report()


@FAST
@given(runs(), st.data())
def test_an_aborted_transaction_made_visible_is_caught(run: Run, data: st.DataObject) -> None:
    aborted = [t for t in run.txns if not t.commits and t.records]
    if not aborted:
        return
    t = data.draw(st.sampled_from(aborted))
    t.commits = True
    kinds = run.build().check(LIMIT).kinds()
    assert Kind.DUPLICATE in kinds  # its inputs were committed by a later attempt too
    if t.outcome is Outcome.ABORTED:
        assert Kind.ABORTED_READ in kinds
    if not t.called:
        assert Kind.EARLY_READ in kinds


@FAST
@given(runs(), st.data())
def test_a_dirty_read_is_caught(run: Run, data: st.DataObject) -> None:
    aborted = [t for t in run.txns if not t.commits and t.records]
    if not aborted:
        return
    t = data.draw(st.sampled_from(aborted))
    p, offset, value = data.draw(st.sampled_from(t.records))
    run.reads.append((p, offset, value, t.begin + 3))
    assert Kind.ABORTED_READ in run.build().check(LIMIT).kinds()


@FAST
@given(runs(), st.data())
def test_a_read_before_the_commit_call_is_early(run: Run, data: st.DataObject) -> None:
    t = data.draw(st.sampled_from([t for t in run.txns if t.commits]))
    p, offset, value = data.draw(st.sampled_from(t.records))
    run.reads.append((p, offset, value, t.begin + data.draw(st.integers(0, 4))))
    result = run.build().check(LIMIT)
    assert result.kinds() == {Kind.EARLY_READ}, result.report()


@FAST
@given(runs(), st.data())
def test_a_lost_input_is_caught(run: Run, data: st.DataObject) -> None:
    t = data.draw(st.sampled_from([t for t in run.txns if t.commits]))
    run.txns.remove(t)  # never happened: its inputs have no output
    result = run.build().check(LIMIT)
    assert Kind.LOST in result.kinds(), result.report()
    assert len(result.of_kind(Kind.LOST)) == len(t.inputs)


@FAST
@given(runs(), st.data())
def test_lso_going_back_is_caught(run: Run, data: st.DataObject) -> None:
    if not any(lso > 0 for _, lso, _, _ in run.lso):
        return
    p, lso, hw, at = data.draw(st.sampled_from([s for s in run.lso if s[1] > 0]))
    run.lso.append((p, lso - 1, hw, at + 1_000_000))
    assert Kind.LSO_BACKWARDS in run.build().check(LIMIT).kinds()


def test_an_lso_stuck_below_the_hw_for_too_long_is_hanging() -> None:
    h = TxnHistory()
    for at, lso, hw in [(0, 5, 9), (LIMIT // 2, 5, 12), (LIMIT + 1, 5, 14), (LIMIT + 5, 5, 15)]:
        h.lso(OUT, 0, lso, hw, at)
    hanging = h.check(LIMIT).of_kind(Kind.HANGING)
    assert len(hanging) == 1 and "stuck at 5" in hanging[0].detail
    # an LSO that reaches the HW, or moves on, is not stuck
    h = TxnHistory()
    for at, lso, hw in [(0, 5, 9), (LIMIT, 9, 9), (LIMIT + 10, 9, 12), (2 * LIMIT, 10, 12)]:
        h.lso(OUT, 0, lso, hw, at)
    assert h.check(LIMIT).ok


def test_open_transactions_at_the_end_are_hanging() -> None:
    h = TxnHistory()
    h.final_state({"txn-worker-0": "Ongoing", "txn-worker-1": "CompleteAbort"}, {(OUT, 0): (3, 7)})
    hanging = h.check(LIMIT).of_kind(Kind.HANGING)
    assert len(hanging) == 2
    assert "txn-worker-0" in str(hanging[0]) and "LSO 3 != HW 7" in str(hanging[1])


def test_output_values_round_trip() -> None:
    assert parse_output(output_value("in-7", "2", "2.0.14")) == ("in-7", "2", "2.0.14")
    assert parse_output(b"no separators") is None
    assert parse_output(b"\xff|a|b") is None
    with pytest.raises(ValueError):
        output_value("a|b", "1", "1.0.0")


def test_worker_logs_feed_the_history() -> None:
    lines = [
        json.dumps({"ev": "start", "t": 1, "pid": 9, "incarnation": 0}) + "\n",
        json.dumps({"ev": "begin", "t": 2, "txn": "0.0.0", "worker": "0", "inputs": ["a"]}) + "\n",
        json.dumps({"ev": "commit-called", "t": 3, "txn": "0.0.0"}) + "\n",
        json.dumps({"ev": "committed", "t": 4, "txn": "0.0.0"}) + "\n",
        json.dumps({"ev": "begin", "t": 5, "txn": "0.0.1", "worker": "0", "inputs": ["b"]}) + "\n",
        '{"ev": "commit-cal',  # cut short by a kill -9
    ]
    h = TxnHistory(["a", "b"])
    h.apply_log(lines)
    assert h.attempts["0.0.0"].outcome is Outcome.COMMITTED
    assert h.attempts["0.0.0"].commit_called_ms == 3
    assert h.attempts["0.0.1"].outcome is Outcome.PENDING
    assert not h.problems
    h.apply_log(['{"ev": "nonsense"\n', "\n"])
    assert [v.kind for v in h.problems] == [Kind.UNEXPECTED]


def test_a_record_nobody_logged_is_unexpected() -> None:
    h = TxnHistory(["a"])
    h.begin("0.0.0", "0", ["a"], 1)
    h.commit_called("0.0.0", 2)
    h.committed("0.0.0", 3)
    good = output_value("a", "0", "0.0.0")
    h.final_read(OUT, 0, [(0, good), (1, b"x|1|9.9.9")], [(0, good), (1, b"x|1|9.9.9")])
    result = h.check(LIMIT)
    assert result.kinds() == {Kind.UNEXPECTED}, result.report()
    assert "no worker logged" in result.report()
