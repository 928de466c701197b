"""Transactions on a partition against a model that recomputes everything from the list
of batches: random interleavings of plain batches, several producers' transactional
batches (fenced epochs included), commit/abort markers (repeated ones included),
segment rolls, HW moves, snapshots and truncations (hypothesis stateful test).

The real side is what PartitionLog will run: a TxnPartitionState fed batch by batch,
an on-disk TxnIndex per segment receiving the aborted entries, rebuilds from a
snapshot plus the rows after it on truncation, and collect_aborted for fetches.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import NamedTuple

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from logmq.storage.batch import ATTR_CONTROL, ATTR_TRANSACTIONAL, BatchHeader
from logmq.storage.batch_scan import row_of
from logmq.storage.txn_index import AbortedTxn, TxnIndex, collect_aborted, txn_index_path
from logmq.storage.txn_state import CONTROL_ABORT, CONTROL_COMMIT, TxnPartitionState

PIDS = st.integers(0, 3)
EPOCH_STEP = st.sampled_from([0, 0, 0, 0, 1, -1])  # -1: a fenced producer's late write
GAPS = st.sampled_from([0, 0, 0, 0, 2])  # follower data of a compacted leader has gaps
SIZES = st.integers(1, 3)


class Batch(NamedTuple):
    base: int
    last: int
    attrs: int
    pid: int
    epoch: int
    ctype: int | None


class Txn(NamedTuple):
    pid: int
    first: int
    end: int | None  # the marker's offset, None while open
    ctype: int | None


# -- the model: everything from the full list of batches ------------------------------


def model_txns(batches: list[Batch]) -> tuple[list[Txn], dict[int, int]]:
    """Every transaction with data, and each producer's newest epoch."""
    epochs: dict[int, int] = {}
    open_: dict[int, int] = {}  # pid -> index in txns
    txns: list[Txn] = []
    for bt in batches:
        if bt.pid < 0 or not bt.attrs & (ATTR_TRANSACTIONAL | ATTR_CONTROL):
            continue
        if bt.epoch < epochs.get(bt.pid, -1):
            continue  # fenced
        if bt.attrs & ATTR_CONTROL:
            if bt.ctype not in (CONTROL_ABORT, CONTROL_COMMIT):
                continue
            epochs[bt.pid] = bt.epoch
            if bt.pid in open_:
                i = open_.pop(bt.pid)
                txns[i] = txns[i]._replace(end=bt.base, ctype=bt.ctype)
        else:
            epochs[bt.pid] = bt.epoch
            if bt.pid not in open_:
                open_[bt.pid] = len(txns)
                txns.append(Txn(bt.pid, bt.base, None, None))
    return txns, epochs


def unstable(txns: list[Txn], hw: int) -> list[int]:
    return [t.first for t in txns if t.end is None or t.end >= hw]


def model_lso(txns: list[Txn], hw: int) -> int:
    return min([hw, *unstable(txns, hw)])


def model_aborted(txns: list[Txn], f: int, u: int) -> list[tuple[int, int]]:
    hits = [t for t in txns if t.ctype == CONTROL_ABORT and t.end >= f and t.first < u]
    return [(t.pid, t.first) for t in sorted(hits, key=lambda t: t.end)] if u > f else []


def model_entries(txns: list[Txn]) -> list[AbortedTxn]:
    """The txn index entries: last stable offset = the first transaction still open
    right after the marker, else just past it."""
    out = []
    for t in sorted((t for t in txns if t.ctype == CONTROL_ABORT), key=lambda t: t.end):
        m = t.end
        still_open = [o.first for o in txns if o.first < m and (o.end is None or o.end > m)]
        out.append(AbortedTxn(t.pid, t.first, m, min(still_open, default=m + 1)))
    return out


# -- the machine ---------------------------------------------------------------------


class TxnModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="txnmodel")
        self.batches: list[Batch] = []
        self.rows: list[tuple] = []
        self.types: dict[int, int] = {}
        self.leo = self.hw = 0
        self.segments = [TxnIndex(txn_index_path(self.dir, 0), 0, fresh=True)]
        self.state = TxnPartitionState()
        self.snapshots: dict[int, bytes] = {}
        self.gen_epochs: dict[int, int] = {}
        self.last_lso: int | None = None
        self.truncations = 0

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def _append(self, attrs: int, pid: int, epoch: int, n: int, gap: int, ctype=None) -> None:
        base = self.leo + gap
        h = BatchHeader(base, 0, 0, 2, 0, attrs, n - 1, 0, 0, pid, epoch, -1, n)
        entry = self.state.on_batch(h, ctype)
        if entry is not None:
            self.segments[-1].append(entry)  # the segment holding the marker
        self.batches.append(Batch(base, base + n - 1, attrs, pid, epoch, ctype))
        self.rows.append(row_of(0, h))
        if ctype is not None:
            self.types[base] = ctype
        self.leo = base + n

    def _epoch(self, pid: int, step: int) -> int:
        cur = self.gen_epochs.get(pid, 0)
        epoch = max(0, cur + step)
        self.gen_epochs[pid] = max(cur, epoch)
        return epoch

    @rule(n=SIZES, gap=GAPS, pid=st.sampled_from([-1, -1, 9]))
    def plain(self, n, gap, pid):
        # pid 9: an idempotent, non-transactional producer, which transactions ignore
        self._append(0, pid, 0 if pid >= 0 else -1, n, gap)

    @rule(pid=PIDS, step=EPOCH_STEP, n=SIZES, gap=GAPS)
    def txn_data(self, pid, step, n, gap):
        self._append(ATTR_TRANSACTIONAL, pid, self._epoch(pid, step), n, gap)

    @rule(pid=PIDS, step=EPOCH_STEP, ctype=st.sampled_from([0, 0, 1, 1, 2]), gap=GAPS)
    def end_marker(self, pid, step, ctype, gap):
        # type 2 is a control record of another kind; repeated markers come for free
        self._append(ATTR_CONTROL | ATTR_TRANSACTIONAL, pid, self._epoch(pid, step), 1, gap, ctype)

    @precondition(lambda self: bool(self.state.ongoing))
    @rule(data=st.data(), ctype=st.sampled_from([0, 0, 1]), gap=GAPS)
    def end_open(self, data, ctype, gap):
        """The usual case: the coordinator ends a transaction that has data here."""
        pid = data.draw(st.sampled_from(sorted(self.state.ongoing)))
        epoch = self.gen_epochs.get(pid, 0)
        self._append(ATTR_CONTROL | ATTR_TRANSACTIONAL, pid, epoch, 1, gap, ctype)

    @precondition(lambda self: self.leo > self.segments[-1].base_offset)
    @rule()
    def roll(self):
        self.segments.append(TxnIndex(txn_index_path(self.dir, self.leo), self.leo, fresh=True))

    @rule(data=st.data())
    def move_hw(self, data):
        self.hw = data.draw(st.integers(self.hw, self.leo))
        self.state.on_high_watermark(self.hw)

    @rule()
    def snapshot(self):
        self.snapshots[self.leo] = self.state.to_snapshot(self.leo)

    @rule()
    def reopen_indexes(self):
        for idx in self.segments:
            idx.close()  # entries are read back from the files on next use

    @precondition(lambda self: bool(self.batches))
    @rule(data=st.data())
    def truncate(self, data):
        # At a recent batch, at an indexed ABORT marker, or anywhere.
        choices = [st.sampled_from([bt.base for bt in self.batches[-6:]])]
        markers = [e.last_offset for idx in self.segments for e in idx.entries()]
        if markers:
            choices.append(st.sampled_from(markers))
        offset = data.draw(st.one_of(*choices, st.integers(0, self.leo - 1)))
        # As PartitionLog: batches whose last offset is >= offset go; the log end
        # becomes the base of the first of them.
        keep = sum(1 for bt in self.batches if bt.last < offset)
        if keep == len(self.batches):
            return
        new_leo = self.batches[keep].base
        self.batches, self.rows = self.batches[:keep], self.rows[:keep]
        self.types = {o: t for o, t in self.types.items() if o < new_leo}
        while len(self.segments) > 1 and self.segments[-1].base_offset >= new_leo:
            self.segments.pop().delete()
        last = self.segments[-1]
        if last.base_offset >= new_leo:
            last.delete()
            self.segments[-1] = TxnIndex(txn_index_path(self.dir, new_leo), new_leo, fresh=True)
        else:
            last.truncate_to(new_leo)
        self.leo, self.hw = new_leo, min(self.hw, new_leo)
        self.snapshots = {o: s for o, s in self.snapshots.items() if o <= new_leo}
        snap = self.snapshots[max(self.snapshots)] if self.snapshots else None
        self.state, _ = TxnPartitionState.rebuild(
            snap, self.rows, self.types, high_watermark=self.hw
        )
        self.last_lso = None  # the LSO may go back on truncation only
        self.truncations += 1

    def _fetch(self, txns: list[Txn], f: int, u: int) -> None:
        start = max(i for i, s in enumerate(self.segments) if s.base_offset <= f)
        got = collect_aborted(iter(self.segments[start:]), f, u)
        assert got == model_aborted(txns, f, u), (f, u)

    @rule(data=st.data())
    def fetch(self, data):
        f = data.draw(st.integers(0, self.leo))
        u = data.draw(st.integers(f, self.leo + 2))
        self._fetch(model_txns(self.batches)[0], f, u)

    # -- invariants -------------------------------------------------------------------

    def _same(self, other: TxnPartitionState, lso: int) -> None:
        assert other.ongoing == self.state.ongoing
        assert other.epochs == self.state.epochs
        assert other.lso(self.hw) == lso
        assert other.first_unstable_offset() == self.state.first_unstable_offset()

    @invariant()
    def matches_model(self):
        txns, epochs = model_txns(self.batches)
        s = self.state
        assert s.ongoing == {t.pid: t.first for t in txns if t.end is None}
        firsts = list(s.ongoing.values())
        assert firsts == sorted(firsts)  # what first_unstable_offset relies on
        assert s.epochs == epochs
        lso = s.lso(self.hw)
        assert lso == model_lso(txns, self.hw)
        assert s.first_unstable_offset() == min(unstable(txns, self.hw), default=None)
        if self.last_lso is not None:
            assert lso >= self.last_lso, "the LSO went back without a truncation"
        self.last_lso = lso
        entries = [e for idx in self.segments for e in idx.entries()]
        assert entries == model_entries(txns)
        for idx in self.segments:
            assert all(idx.base_offset <= e.last_offset < self.leo for e in idx.entries())
            assert TxnIndex(idx.path, idx.base_offset).entries() == idx.entries()

    @invariant()
    def fetches_at_the_edges(self):
        """Fetch ranges that start or end at transaction and segment edges, where an
        off-by-one or a too-early stop in the index scan would show."""
        txns = model_txns(self.batches)[0]
        edges = {0, self.hw, self.leo, *(s.base_offset for s in self.segments)}
        for t in txns:
            edges.update((t.first, t.first + 1))
            if t.end is not None:
                edges.update((t.end, t.end + 1))
        points = sorted(edges)
        for i, f in enumerate(points):
            for u in {*points[i : i + 4], self.leo + 1}:
                self._fetch(txns, f, u)

    @invariant()
    def rebuilds_agree(self):
        lso = self.state.lso(self.hw)
        entries = [e for idx in self.segments for e in idx.entries()]
        full, aborted = TxnPartitionState.rebuild(
            None, self.rows, self.types, high_watermark=self.hw
        )
        self._same(full, lso)
        assert aborted == entries
        if self.snapshots:
            at = max(self.snapshots)
            part, aborted = TxnPartitionState.rebuild(
                self.snapshots[at], self.rows, self.types, high_watermark=self.hw
            )
            self._same(part, lso)
            assert aborted == [e for e in entries if e.last_offset >= at]
            # A snapshot of the live state reads back the same.
            again = TxnPartitionState.from_snapshot(self.state.to_snapshot(self.leo))
            self._same(again, lso)


TxnModel.TestCase.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
TestTxnModel = TxnModel.TestCase
