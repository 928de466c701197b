"""The aborted-transaction index: file format, the file's life, and fetch searches."""

from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.errors import StorageError
from logmq.storage import checkpoint
from logmq.storage.index import IndexCorruptError
from logmq.storage.txn_index import (
    ENTRY_SIZE,
    AbortedTxn,
    TxnIndex,
    TxnIndexCorruptError,
    collect_aborted,
    collect_from,
    decode_entries,
    encode_entries,
    encode_entry,
    txn_index_path,
)

I64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def entry_lists(draw):
    n = draw(st.integers(0, 20))
    out, last = [], draw(st.integers(0, 10**12))
    for _ in range(n):
        last += draw(st.integers(1, 10**6))
        first = last - draw(st.integers(0, 10**6))
        out.append(AbortedTxn(draw(I64), first, last, draw(I64)))
    return out


def test_entry_layout():
    e = AbortedTxn(7, 100, 120, 121)
    raw = encode_entry(e)
    assert len(raw) == ENTRY_SIZE == 34
    assert raw == (
        b"\x00\x00"  # version 0
        + (7).to_bytes(8, "big")
        + (100).to_bytes(8, "big")
        + (120).to_bytes(8, "big")
        + (121).to_bytes(8, "big")
    )
    assert decode_entries(raw) == [e]


@given(entry_lists())
def test_round_trip(entries):
    assert decode_entries(encode_entries(entries)) == entries


@settings(max_examples=200)
@given(entry_lists(), st.data())
def test_damaged_bytes_raise_only_corrupt_error(entries, data):
    """Any cut or byte flip either still decodes to checked entries or raises the one
    error that tells the caller to rebuild (a subclass of the offset index's)."""
    raw = bytearray(encode_entries(entries))
    if raw and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= data.draw(st.integers(1, 255))
    raw = raw[: data.draw(st.integers(0, len(raw)))]
    try:
        out = decode_entries(bytes(raw), base_offset=0)
    except TxnIndexCorruptError as e:
        assert isinstance(e, IndexCorruptError) and isinstance(e, StorageError)
        assert e.entries == decode_entries(bytes(raw[: len(e.entries) * ENTRY_SIZE]))
        return
    assert len(out) * ENTRY_SIZE == len(raw)
    assert all(a.last_offset < b.last_offset for a, b in itertools.pairwise(out))


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (encode_entry(AbortedTxn(1, 5, 9, 10))[:-1], "not a multiple"),
        (b"\x00\x01" + encode_entry(AbortedTxn(1, 5, 9, 10))[2:], "version 1"),
        (encode_entry(AbortedTxn(1, 9, 5, 10)), "after last offset"),
        (encode_entries([AbortedTxn(1, 5, 9, 10), AbortedTxn(2, 6, 9, 10)]), "does not follow"),
        (encode_entry(AbortedTxn(1, 5, 9, 10)), "before the segment base"),
    ],
)
def test_corrupt_entries(raw, why):
    with pytest.raises(TxnIndexCorruptError, match=why):
        decode_entries(raw, base_offset=9 if "base" not in why else 50)


def test_torn_tail_keeps_the_valid_prefix():
    good = [AbortedTxn(1, 0, 3, 4), AbortedTxn(2, 5, 8, 9)]
    raw = encode_entries(good) + b"\x00\x00\x00"
    with pytest.raises(TxnIndexCorruptError) as info:
        decode_entries(raw)
    assert info.value.entries == good


def test_file_is_made_lazily_and_read_back(tmp_path):
    path = txn_index_path(tmp_path, 100)
    assert path.name == "00000000000000000100.txnindex"
    idx = TxnIndex(path, 100, fresh=True)
    assert idx.entries() == [] and idx.last_offset == -1 and len(idx) == 0
    idx.flush()
    idx.close()
    assert not path.exists()  # no entry, no file
    idx = TxnIndex(path, 100)  # opening an index with no file is fine too
    assert idx.entries() == []
    idx.append(AbortedTxn(3, 90, 104, 105))
    assert path.stat().st_size == ENTRY_SIZE  # written at once
    idx.append((4, 102, 110, 111))
    assert TxnIndex(path, 100).entries() == [
        AbortedTxn(3, 90, 104, 105),
        AbortedTxn(4, 102, 110, 111),
    ]
    idx.close()
    assert idx.last_offset == 110  # re-read after close


def test_append_refuses_disorder(tmp_path):
    idx = TxnIndex(tmp_path / "0.txnindex", 10, fresh=True)
    idx.append(AbortedTxn(1, 5, 12, 13))
    for bad in (AbortedTxn(2, 3, 12, 13), AbortedTxn(2, 3, 11, 13), AbortedTxn(2, 20, 15, 21)):
        with pytest.raises(ValueError):
            idx.append(bad)
    with pytest.raises(ValueError):
        TxnIndex(tmp_path / "1.txnindex", 10, fresh=True).append(AbortedTxn(1, 2, 9, 10))
    assert idx.entries() == [AbortedTxn(1, 5, 12, 13)]
    assert TxnIndex(idx.path, 10).entries() == idx.entries()


def test_truncate_reset_delete(tmp_path):
    path = tmp_path / "0.txnindex"
    idx = TxnIndex(path, 0, fresh=True)
    es = [AbortedTxn(1, 0, 4, 5), AbortedTxn(2, 3, 7, 8), AbortedTxn(1, 8, 9, 10)]
    for e in es:
        idx.append(e)
    idx.truncate_to(10)
    assert idx.entries() == es
    idx.truncate_to(7)  # the marker at 7 goes
    assert idx.entries() == es[:1]
    assert TxnIndex(path, 0).entries() == es[:1]
    idx.append(AbortedTxn(2, 3, 6, 7))  # a new tail after truncation
    assert TxnIndex(path, 0).entries() == [es[0], AbortedTxn(2, 3, 6, 7)]
    idx.reset()
    assert idx.entries() == [] and path.stat().st_size == 0
    idx.append(es[0])
    idx.delete()
    assert not path.exists() and idx.entries() == []
    TxnIndex(tmp_path / "gone.txnindex", 0).delete()  # no file: fine


def test_corrupt_file_raises_on_use(tmp_path):
    path = tmp_path / "0.txnindex"
    path.write_bytes(encode_entry(AbortedTxn(1, 0, 4, 5)) + b"\x00" * 5)
    idx = TxnIndex(path, 0)
    with pytest.raises(TxnIndexCorruptError):
        idx.sanity_check()
    with pytest.raises(TxnIndexCorruptError):
        idx.collect(0, 10)
    idx.reset()  # the caller's rebuild starts here
    idx.append(AbortedTxn(1, 0, 4, 5))
    assert TxnIndex(path, 0).entries() == [AbortedTxn(1, 0, 4, 5)]


def test_flush_fsyncs_only_after_changes(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(checkpoint, "fsync", calls.append)
    idx = TxnIndex(tmp_path / "0.txnindex", 0, fresh=True)
    idx.flush()
    assert calls == []
    idx.append(AbortedTxn(1, 0, 4, 5))
    idx.flush()
    idx.flush()
    assert len(calls) == 1


def test_failed_write_stays_in_memory_and_flush_retries(tmp_path, monkeypatch):
    idx = TxnIndex(tmp_path / "0.txnindex", 0, fresh=True)
    real = os.pwrite

    def full(fd, data, pos):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    idx.append(AbortedTxn(1, 0, 4, 5))  # logged, not raised: the marker is in the log
    assert idx.collect(0, 10) == ([AbortedTxn(1, 0, 4, 5)], False)
    with pytest.raises(OSError):
        idx.flush()
    monkeypatch.setattr(os, "pwrite", real)
    idx.flush()
    assert TxnIndex(idx.path, 0).entries() == [AbortedTxn(1, 0, 4, 5)]


# -- searches ------------------------------------------------------------------------


def make_segments(tmp_path, layout):
    """``layout``: [(base_offset, [AbortedTxn...]), ...] -> TxnIndex per segment."""
    out = []
    for base, entries in layout:
        idx = TxnIndex(txn_index_path(tmp_path, base), base, fresh=True)
        for e in entries:
            idx.append(e)
        out.append(idx)
    return out


def test_collect_across_segments(tmp_path):
    # pid 1 aborts [2, 12] (marker in segment 10), pid 2 aborts [5, 25] (segment 20) while
    # pid 3's [14, 30] is open, pid 3 aborts [14, 30] (segment 30), pid 4 aborts [31, 33].
    segs = make_segments(
        tmp_path,
        [
            (0, []),
            (10, [AbortedTxn(1, 2, 12, 5)]),  # pid 2 still open at 5
            (20, [AbortedTxn(2, 5, 25, 14)]),  # pid 3 open at 14
            (30, [AbortedTxn(3, 14, 30, 31), AbortedTxn(4, 31, 33, 34)]),
        ],
    )

    def fetch(f, u):
        start = max(i for i, s in enumerate(segs) if s.base_offset <= f)
        return collect_aborted(segs[start:], f, u)

    assert fetch(0, 2) == []
    assert fetch(0, 3) == [(1, 2)]
    assert fetch(0, 6) == [(1, 2), (2, 5)]
    assert fetch(0, 40) == [(1, 2), (2, 5), (3, 14), (4, 31)]
    assert fetch(12, 13) == [(1, 2), (2, 5)]  # the marker offset itself still overlaps
    assert fetch(13, 15) == [(2, 5), (3, 14)]
    assert fetch(26, 31) == [(3, 14)]
    assert fetch(31, 32) == [(4, 31)]
    assert fetch(34, 40) == []
    assert fetch(5, 5) == []  # an empty range overlaps nothing
    # The scan stops in the first segment whose entries pass the upper bound.
    assert segs[1].collect(0, 4) == ([AbortedTxn(1, 2, 12, 5)], True)
    assert segs[1].collect(0, 6) == ([AbortedTxn(1, 2, 12, 5)], False)


def test_collect_aborted_stops_reading_indexes(tmp_path):
    segs = make_segments(tmp_path, [(0, [AbortedTxn(1, 0, 3, 4)])])

    class Boom:
        def collect(self, f, u):
            raise AssertionError("read past the upper bound")

    def gen():
        yield segs[0]
        yield Boom()

    assert collect_aborted(gen(), 0, 4) == [(1, 0)]


@settings(max_examples=150, deadline=None)
@given(
    events=st.lists(st.tuples(st.integers(0, 3), st.sampled_from("dab")), max_size=40),
    cuts=st.lists(st.integers(0, 60), max_size=4),
    f=st.integers(0, 60),
    span=st.integers(0, 30),
)
def test_collect_matches_brute_force(tmp_path_factory, events, cuts, f, span):
    """Entries made by TxnPartitionState from a random log (so their last stable
    offsets are Kafka's), cut into segments: the early stop never loses an entry."""
    from logmq.storage.batch import ATTR_CONTROL, ATTR_TRANSACTIONAL, BatchHeader
    from logmq.storage.txn_state import CONTROL_ABORT, CONTROL_COMMIT, TxnPartitionState

    state, entries = TxnPartitionState(), []
    for off, (pid, kind) in enumerate(events):
        attrs = ATTR_TRANSACTIONAL | (ATTR_CONTROL if kind != "d" else 0)
        h = BatchHeader(off, 0, 0, 2, 0, attrs, 0, 0, 0, pid, 0, -1, 1)
        ctype = None if kind == "d" else CONTROL_ABORT if kind == "a" else CONTROL_COMMIT
        e = state.on_batch(h, ctype)
        if e:
            entries.append(e)
    bases = sorted({0, *cuts})
    layout = [(base, [e for e in entries if base <= e.last_offset < nxt])
              for base, nxt in zip(bases, [*bases[1:], 10**9], strict=True)]  # fmt: skip
    segs = make_segments(tmp_path_factory.mktemp("txn"), layout)
    u = f + span
    start = max(i for i, s in enumerate(segs) if s.base_offset <= f)
    want = [(e.producer_id, e.first_offset) for e in entries
            if e.last_offset >= f and e.first_offset < u and u > f]  # fmt: skip
    assert collect_aborted(segs[start:], f, u) == want
    assert [(e.producer_id, e.first_offset) for e in collect_from(entries, f, u)[0]] == want
