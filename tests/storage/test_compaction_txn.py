"""Compaction of logs holding transactions: the LSO bound, aborted data, markers, and
the txn indexes of cleaned segments (through crashes of the swap too)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logmq.storage import batch as b
from logmq.storage import segment_swap
from logmq.storage.compaction import AbortedRanges
from logmq.storage.config import LogConfig
from logmq.storage.partition_log import PartitionLog
from logmq.storage.txn_index import TXN_INDEX_SUFFIX, AbortedTxn, txn_index_path
from logmq.storage.txn_state import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    control_record,
    encode_control_batch,
)

from .compaction_helpers import COMPACT, T0, Clock, CrashAfter, SimulatedCrash, kbatch

RETENTION = 1000  # delete.retention.ms of COMPACT
P, Q, R = 7, 8, 9  # transactional producer ids


class Writer:
    """Appends plain, transactional and marker batches, tracking what read_committed
    should see (the model): every record with its offset and transaction fate."""

    def __init__(self, plog: PartitionLog) -> None:
        self.plog = plog
        self.seq: dict[int, int] = {}
        self.open: dict[int, list[int]] = {}  # pid -> indexes into records
        self.records: list[list] = []  # [offset, key, value, fate]; fate None/"open"/...

    def plain(self, key: bytes, value: bytes | None) -> int:
        off = self.plog.append(kbatch([(key, value)], ts=self.plog.clock())).first_offset
        self.records.append([off, key, value, "plain"])
        return off

    def txn(self, pid: int, key: bytes, value: bytes | None) -> int:
        seq = self.seq.get(pid, 0)
        data = kbatch(
            [(key, value)],
            ts=self.plog.clock(),
            compression=b.ATTR_TRANSACTIONAL,
            producer_id=pid,
            producer_epoch=0,
            base_sequence=seq,
        )
        off = self.plog.append(data).first_offset
        self.seq[pid] = seq + 1
        self.open.setdefault(pid, []).append(len(self.records))
        self.records.append([off, key, value, "open"])
        return off

    def end(self, pid: int, commit: bool) -> int:
        kind = CONTROL_COMMIT if commit else CONTROL_ABORT
        data = encode_control_batch(
            kind, producer_id=pid, producer_epoch=0, timestamp=self.plog.clock()
        )
        off = self.plog.append(data, control=True).first_offset
        for i in self.open.pop(pid, []):
            self.records[i][3] = "commit" if commit else "abort"
        return off

    def expected_latest(self, below: int) -> dict:
        """Key -> newest visible value below ``below`` (keys whose newest is a tombstone
        are absent: cleaning may remove the tombstone)."""
        out: dict = {}
        for off, key, value, fate in self.records:
            if off < below and fate in ("plain", "commit"):
                out[key] = value
        return {k: v for k, v in out.items() if v is not None}

    def aborted_offsets(self) -> set[int]:
        return {r[0] for r in self.records if r[3] == "abort"}


def open_log(path: Path, clock: Clock | None = None, **overrides) -> PartitionLog:
    cfg = LogConfig.from_dict({**COMPACT, **overrides})
    return PartitionLog(path / "topic-0", cfg, clock=clock or Clock())


def batches(plog: PartitionLog) -> list[tuple[b.BatchHeader, int | None, list, bytes]]:
    """(header, control type, records, raw bytes) of every batch in the log."""
    out = []
    offset = plog.log_start_offset
    while offset < plog.log_end_offset:
        sl = plog.read(offset, 1 << 16)
        if sl is None:
            break
        data = sl.read()
        for pos, h in b.iter_headers(data):
            if h.next_offset <= offset:
                continue
            recs = b.decode_records(data, pos)
            ctype = control_record(data, pos).type if h.attributes & b.ATTR_CONTROL else None
            out.append((h, ctype, recs, bytes(data[pos : pos + h.size])))
            offset = h.next_offset
    return out


def read_committed(plog: PartitionLog) -> list[tuple]:
    """(offset, key, value) a read_committed consumer sees, filtering by the log's
    aborted_transactions as a Kafka consumer does."""
    lso = plog.last_stable_offset
    aborted = sorted(plog.aborted_transactions(plog.log_start_offset, lso), key=lambda a: a[1])
    active: set[int] = set()
    i, out = 0, []
    for h, ctype, recs, _ in batches(plog):
        if h.base_offset >= lso:
            break
        while i < len(aborted) and aborted[i][1] <= h.base_offset + h.last_offset_delta:
            active.add(aborted[i][0])
            i += 1
        if h.attributes & b.ATTR_CONTROL:
            if ctype == CONTROL_ABORT:
                active.discard(h.producer_id)
            continue
        if h.attributes & b.ATTR_TRANSACTIONAL and h.producer_id in active:
            continue
        out += [(off, k, v) for off, _, k, v, _ in recs]
    return out


def latest(visible: list[tuple]) -> dict:
    out: dict = {}
    for _, k, v in visible:
        out[k] = v
    return {k: v for k, v in out.items() if v is not None}


def raw_from(plog: PartitionLog, offset: int) -> list[bytes]:
    return [raw for h, _, _, raw in batches(plog) if h.base_offset >= offset]


def markers(plog: PartitionLog) -> list[tuple[int, int, int]]:
    """(offset, producer id, type) of every marker in the log."""
    return [(h.base_offset, h.producer_id, t) for h, t, _, _ in batches(plog) if t is not None]


def settle(plog: PartitionLog) -> None:
    plog.high_watermark = plog.log_end_offset


def check(w: Writer, before: list[tuple]) -> list[tuple]:
    """The model's invariants after a cleaning; returns what read_committed sees now."""
    plog = w.plog
    now = read_committed(plog)
    assert latest(now) == w.expected_latest(plog.last_stable_offset)
    assert {r for r in now if r[2] is not None} <= set(before)  # nothing reappears
    return now


# -- unit -----------------------------------------------------------------------------------


def test_aborted_ranges_per_producer():
    ranges = AbortedRanges(
        [AbortedTxn(P, 3, 9, 10), AbortedTxn(Q, 5, 6, 7), AbortedTxn(P, 12, 15, 16)]
    )
    assert ranges.contains(P, 3) and ranges.contains(P, 9) and ranges.contains(P, 13)
    assert not ranges.contains(P, 2) and not ranges.contains(P, 10) and not ranges.contains(P, 16)
    assert not ranges.contains(Q, 4) and ranges.contains(Q, 5) and not ranges.contains(R, 5)
    assert not AbortedRanges()


# -- the LSO bound ------------------------------------------------------------------------


def test_cleaning_stops_at_the_first_unstable_offset(tmp_path):
    plog = open_log(tmp_path)
    w = Writer(plog)
    for i in range(40):
        w.plain(b"k%d" % (i % 5), b"v%d" % i)
    first_open = w.txn(Q, b"k1", b"open")  # Q's transaction stays open
    for i in range(40, 120):
        w.plain(b"k%d" % (i % 5), b"v%d" % i)
        if i % 10 == 0:
            w.txn(P, b"k2", b"p%d" % i)
            w.end(P, commit=True)
    plog.roll()
    settle(plog)
    assert plog.last_stable_offset == first_open
    plan = plog.cleaning_plan(force=True)
    assert plan is not None and plan.segments[-1].end_offset <= first_open
    seg_base = max(s.base_offset for s in plog.segments if s.base_offset <= first_open)
    untouched = raw_from(plog, seg_base)
    before = read_committed(plog)
    plog.clean()
    assert raw_from(plog, seg_base) == untouched  # the open transaction's segment and on
    check(w, before)
    assert len(read_committed(plog)) < len(before)  # below it, compaction did happen

    w.end(Q, commit=True)  # decided: the cleaner may now go past it
    plog.roll()
    settle(plog)
    before = read_committed(plog)
    assert before[-1][0] > first_open
    plog.clean()
    now = check(w, before)
    assert (first_open, b"k1", b"open") not in now  # superseded by later plain writes
    plan = plog.cleaning_plan(force=True)
    assert plan is not None and plan.segments[-1].end_offset > first_open


def test_an_unreplicated_marker_keeps_its_transaction_unstable(tmp_path):
    plog = open_log(tmp_path)
    w = Writer(plog)
    for i in range(30):
        w.plain(b"k%d" % (i % 3), b"v%d" % i)
    first = w.txn(P, b"k0", b"t")
    for i in range(30):
        w.plain(b"k%d" % (i % 3), b"w%d" % i)
    settle(plog)
    w.end(P, commit=False)  # the marker is above the HW: P is not decided yet
    plog.roll()
    plan = plog.cleaning_plan(force=True)
    assert plan is None or plan.segments[-1].end_offset <= first


# -- aborted data, markers, txn indexes ------------------------------------------------------


def _aborted_then_committed(plog: PartitionLog) -> Writer:
    """P aborts a transaction of many records, then commits one; Q aborts and never
    writes again (its aborted batch is its last: it stays, with its index entry)."""
    w = Writer(plog)
    for i in range(20):
        w.plain(b"k%d" % (i % 4), b"v%d" % i)
    for i in range(20):
        w.txn(P, b"k%d" % (i % 4), b"aborted%d" % i)
    w.plain(b"k9", b"between")
    w.end(P, commit=False)
    w.txn(Q, b"k1", b"q-aborted")
    w.end(Q, commit=False)
    for i in range(20):
        w.plain(b"k%d" % (i % 4), b"x%d" % i)
    w.txn(P, b"k2", b"committed")
    w.end(P, commit=True)
    w.plain(b"k5", b"tail")
    plog.roll()
    settle(plog)
    return w


def test_aborted_records_go_and_markers_follow_after_delete_retention(tmp_path):
    clock = Clock()
    plog = open_log(tmp_path, clock)
    w = _aborted_then_committed(plog)
    aborted = w.aborted_offsets()
    before = read_committed(plog)
    assert len(plog.aborted_transactions(0, plog.log_end_offset)) == 2
    first_abort = markers(plog)[0]

    stats = plog.clean()
    assert stats is not None and stats.aborted_removed == 20
    before = check(w, before)
    left = {off for h, _, recs, _ in batches(plog) for off, *_ in recs} & aborted
    q_batch = next(r[0] for r in w.records if r[2] == b"q-aborted")
    assert left == {q_batch}  # Q's last batch stays (its sequence), still aborted
    assert (Q, q_batch) in plog.aborted_transactions(0, plog.log_end_offset)
    assert first_abort in markers(plog)  # P's aborted data was there in this pass

    clock.now += 1
    plog.clean()  # P's abort has no data left: its marker gets a delete horizon
    before = check(w, before)
    assert first_abort in markers(plog)
    clock.now += RETENTION + 1
    stats = plog.clean()
    assert stats is not None and stats.markers_removed == 1
    check(w, before)
    assert first_abort not in markers(plog)
    # its entry went with it; Q's (data left) stays; P's last marker stays (epoch)
    assert plog.aborted_transactions(0, plog.log_end_offset) == [(Q, q_batch)]
    assert (Q, CONTROL_ABORT) in {(m[1], m[2]) for m in markers(plog)}
    assert (P, CONTROL_COMMIT) in {(m[1], m[2]) for m in markers(plog)}


def test_cleaned_segment_carries_the_txn_index_across_reopens(tmp_path, no_fsync):
    plog = open_log(tmp_path, **{"segment.bytes": "100000"})  # one cleaned segment
    w = _aborted_then_committed(plog)
    before = read_committed(plog)
    plog.clean()
    check(w, before)
    names = os.listdir(plog.dir)
    assert txn_index_path(plog.dir, 0).name in names
    assert not [n for n in names if n.endswith((".cleaned", ".swap"))]
    expected = plog.aborted_transactions(0, plog.log_end_offset)
    assert len(expected) == 2
    now = read_committed(plog)
    plog.close()
    for clean in (True, False):
        plog = PartitionLog(
            tmp_path / "topic-0",
            LogConfig.from_dict({**COMPACT, "segment.bytes": "100000"}),
            clock=Clock(),
            clean_shutdown=clean,
            recovery_point=None if clean else 0,
            high_watermark=1 << 62,
        )
        assert plog.aborted_transactions(0, plog.log_end_offset) == expected
        assert read_committed(plog) == now
        plog.close_handles() if not clean else plog.close()


def test_committed_transactional_records_are_compacted(tmp_path):
    plog = open_log(tmp_path)
    w = Writer(plog)
    for i in range(30):
        w.txn(P, b"k%d" % (i % 3), b"t%d" % i)
        if i % 5 == 4:
            w.end(P, commit=True)
    w.end(P, commit=True)
    w.plain(b"k0", b"plain")
    plog.roll()
    settle(plog)
    before = read_committed(plog)
    plog.clean()
    now = check(w, before)
    assert len(now) < 10


# -- crashes -----------------------------------------------------------------------------------


CRASH_CFG = {**COMPACT, "segment.bytes": "2048", "file.delete.delay.ms": "60000"}


def _build_txn_log(path: Path) -> None:
    plog = PartitionLog(path, LogConfig.from_dict(CRASH_CFG), clock=Clock())
    w = Writer(plog)
    for rnd in range(3):
        for i in range(25):
            w.plain(b"k%d" % (i % 6), b"v%d-%d" % (rnd, i))
            if i % 4 == 0:
                w.txn(P, b"k%d" % (i % 6), b"p%d-%d" % (rnd, i))
            if i % 6 == 0:
                w.txn(R, b"r%d" % (i % 3), b"r%d-%d" % (rnd, i))
            if i % 8 == 7:
                w.end(P, commit=i % 16 == 7)
                w.end(R, commit=False)
    w.end(P, commit=False)
    w.end(R, commit=True)
    plog.roll()
    settle(plog)
    plog.close()


def test_a_crash_during_the_swap_keeps_the_txn_index_consistent(tmp_path, no_fsync):
    template = tmp_path / "template" / "topic-0"
    _build_txn_log(template)
    cfg = LogConfig.from_dict(CRASH_CFG)

    def fresh(n: int) -> Path:
        path = tmp_path / f"run{n}" / "topic-0"
        shutil.copytree(template, path)
        return path

    def visible(path: Path, **kw) -> tuple[PartitionLog, list[tuple]]:
        plog = PartitionLog(path, cfg, clock=Clock(), high_watermark=1 << 62, **kw)
        return plog, read_committed(plog)

    plog, old = visible(fresh(-1))
    assert plog.aborted_transactions(0, plog.log_end_offset)
    plog.clean()
    new = read_committed(plog)
    plog.close()
    assert set(new) < set(old)

    n = 0
    while True:
        path = fresh(n)
        plog = PartitionLog(path, cfg, clock=Clock(), high_watermark=1 << 62)
        with pytest.MonkeyPatch.context() as mp:
            crash = CrashAfter(mp, n)
            try:
                plog.clean()
            except SimulatedCrash:
                pass
            crashed = crash.crashed
        plog.close_handles()
        if not crashed:
            break
        plog, got = visible(path, clean_shutdown=False, recovery_point=0)
        assert got in (old, new) or (set(new) <= set(got) <= set(old)), f"crash at {n}"
        assert latest(got) == latest(old)
        names = os.listdir(path)
        assert not [x for x in names if x.endswith((".cleaned", ".swap", ".deleted"))], names
        assert segment_swap.MANIFEST not in names
        plog.clean()
        assert read_committed(plog) == new, f"crash at operation {n}"
        plog.close()
        shutil.rmtree(path.parent)
        n += 1
    assert n > 10


def test_recovery_of_a_swap_handles_the_txn_index(tmp_path):
    d = tmp_path / "topic-0"
    d.mkdir()
    # an uncommitted swap: the txn index already renamed, the log still .cleaned
    for name in ("00000000000000000000.log.cleaned", "00000000000000000000.txnindex.swap"):
        (d / name).write_bytes(b"")
    (d / "00000000000000000000.log").write_bytes(b"")
    (d / ("00000000000000000000" + TXN_INDEX_SUFFIX)).write_bytes(b"old")
    segment_swap.write_manifest(d, 0, [0])
    segment_swap.recover(d)
    assert sorted(os.listdir(d)) == ["00000000000000000000.log", "00000000000000000000.txnindex"]
    assert (d / "00000000000000000000.txnindex").read_bytes() == b"old"
    # a committed swap without a txn index: the old segment's index must not survive
    (d / "00000000000000000000.log.swap").write_bytes(b"")
    segment_swap.write_manifest(d, 0, [0])
    segment_swap.recover(d)
    assert sorted(os.listdir(d)) == ["00000000000000000000.log"]
    # a committed swap with one: it becomes the segment's
    (d / "00000000000000000000.log.swap").write_bytes(b"")
    (d / "00000000000000000000.txnindex.swap").write_bytes(b"new")
    segment_swap.write_manifest(d, 0, [0])
    segment_swap.recover(d)
    assert (d / "00000000000000000000.txnindex").read_bytes() == b"new"


# -- a model ---------------------------------------------------------------------------------

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("plain"), st.integers(0, 5), st.booleans()),
        st.tuples(st.just("txn"), st.sampled_from([P, Q, R]), st.integers(0, 5)),
        st.tuples(st.just("end"), st.sampled_from([P, Q, R]), st.booleans()),
        st.tuples(st.just("clean"), st.integers(0, 2 * RETENTION), st.just(0)),
    ),
    min_size=20,
    max_size=120,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_OPS)
def test_cleaning_keeps_what_read_committed_sees(tmp_path_factory, ops):
    tmp = tmp_path_factory.mktemp("model")
    clock = Clock(T0)
    plog = open_log(tmp, clock, **{"segment.bytes": "1024"})
    w = Writer(plog)
    for i, (kind, a, c) in enumerate(ops):
        if kind == "plain":
            w.plain(b"k%d" % a, None if c and i % 3 == 0 else b"v%d" % i)
        elif kind == "txn":
            w.txn(a, b"k%d" % c, b"t%d" % i)
        elif kind == "end":
            if a in w.open:
                w.end(a, commit=c)
        else:
            clock.now += a
            plog.roll()
            settle(plog)
            lso = plog.last_stable_offset
            before = read_committed(plog)
            stable_tail = raw_from(plog, lso)
            plog.clean(clock.now)
            check(w, before)
            assert raw_from(plog, lso) == stable_tail  # nothing at or after the LSO moved
            remaining = {off for h, _, recs, _ in batches(plog) for off, *_ in recs}
            covered = read_committed(plog)
            assert not (remaining & w.aborted_offsets()) & {r[0] for r in covered}
    plog.close()
