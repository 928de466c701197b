"""Partition transaction state: control records, open transactions, the LSO, aborted
entries, snapshots and rebuilds."""

from __future__ import annotations

import struct

import msgpack
import pytest

from logmq.errors import CorruptRecordError
from logmq.storage import batch as b
from logmq.storage import records_codec
from logmq.storage.batch_scan import row_of, scan_batches
from logmq.storage.txn_index import AbortedTxn
from logmq.storage.txn_state import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    ControlRecord,
    TxnPartitionState,
    TxnSnapshotError,
    control_record,
    control_types_in,
    encode_control_batch,
    is_control,
)

TXN = b.ATTR_TRANSACTIONAL
CTRL = b.ATTR_CONTROL | b.ATTR_TRANSACTIONAL


def hdr(base, *, n=1, attrs=0, pid=-1, epoch=-1):
    return b.BatchHeader(base, 0, 0, 2, 0, attrs, n - 1, 0, 0, pid, epoch, -1, n)


def data(base, pid, n=1, epoch=0):
    return hdr(base, n=n, attrs=TXN, pid=pid, epoch=epoch)


def marker(base, pid, epoch=0):
    return hdr(base, attrs=CTRL, pid=pid, epoch=epoch)


# -- control records -----------------------------------------------------------------


@pytest.mark.parametrize("ctype", [CONTROL_ABORT, CONTROL_COMMIT])
def test_control_batch_round_trip(ctype):
    raw = encode_control_batch(
        ctype, producer_id=42, producer_epoch=3, coordinator_epoch=17, base_offset=9
    )
    h = b.validate(raw)
    assert h.attributes & b.ATTR_CONTROL and h.attributes & b.ATTR_TRANSACTIONAL
    assert (h.producer_id, h.producer_epoch, h.base_offset, h.record_count) == (42, 3, 9, 1)
    assert h.base_sequence == b.NO_SEQUENCE
    assert is_control(h.attributes, h.producer_id)
    assert control_record(raw) == ControlRecord(ctype, 17)
    [(offset, _, key, value, _)] = b.decode_records(raw)
    assert offset == 9 and key == struct.pack(">hh", 0, ctype)
    assert value == struct.pack(">hi", 0, 17)
    assert control_record(b"xx" + raw, 2, verify=False) == (ctype, 17)


def control_with(key, value, *, count=1, attrs=CTRL, records=None):
    rows = records if records is not None else [(0, 0, key, value, None)]
    return b.assemble(
        records_codec.encode_rows(rows),
        count=count,
        last_offset_delta=count - 1,
        first_timestamp=0,
        max_timestamp=0,
        attributes=attrs,
        producer_id=1,
        producer_epoch=0,
    )


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (
            control_with(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", attrs=TXN),
            "not a control",
        ),
        (
            control_with(None, None, count=2, records=[(0, 0, b"\0\0\0\0", None, None)] * 2),
            "2 records",
        ),
        (control_with(b"\x00\x00\x00", b"\x00" * 6), "shorter than 4"),
        (control_with(None, b"\x00" * 6), "shorter than 4"),
        (control_with(b"\xff\xff\x00\x00", b"\x00" * 6), "key version -1"),
        (control_with(b"\x00\x00\x00\x01", b"\x00\x00\x00"), "shorter than 6"),
        (control_with(b"\x00\x00\x00\x01", None), "shorter than 6"),
        (control_with(b"\x00\x00\x00\x00", b"\xff\xfe\x00\x00\x00\x00"), "marker version -2"),
        (encode_control_batch(0, producer_id=1, producer_epoch=0)[:-1], "truncated"),
        (b"\x00" * 10, "truncated"),
    ],
)
def test_malformed_control_records(raw, why):
    with pytest.raises(CorruptRecordError, match=why):
        control_record(raw)


def test_control_record_checks_crc_unless_told_not_to():
    raw = bytearray(encode_control_batch(1, producer_id=1, producer_epoch=0, coordinator_epoch=5))
    raw[-2] ^= 1  # the coordinator epoch's low byte (before the header count)
    with pytest.raises(CorruptRecordError, match="checksum"):
        control_record(raw)
    assert control_record(raw, verify=False) == (1, 4)
    with pytest.raises(CorruptRecordError, match="truncated"):
        control_record(b"\x00" * 20, verify=False)


def test_other_control_types_and_newer_versions():
    # A KRaft-style control record (type 2): no end-transaction value to read.
    assert control_record(control_with(b"\x00\x00\x00\x02", b"whatever")) == (2, -1)
    # Later key and value versions read as version 0 (they may only add fields).
    raw = control_with(b"\x00\x01\x00\x00extra", b"\x00\x03\x00\x00\x00\x07more")
    assert control_record(raw) == (CONTROL_ABORT, 7)


# -- appends ---------------------------------------------------------------------------


def test_commit_and_abort():
    s = TxnPartitionState()
    assert s.on_batch(hdr(0, n=2)) is None  # a plain batch
    assert s.on_batch(data(2, pid=7, n=3)) is None
    assert s.ongoing == {7: 2}
    assert s.on_batch(data(5, pid=8)) is None
    assert s.on_batch(data(6, pid=7)) is None  # the same transaction goes on
    assert s.ongoing == {7: 2, 8: 5} and s.first_unstable_offset() == 2
    # Aborting 7 while 8 is open: the last stable offset after it is 8's start.
    assert s.on_batch(marker(7, pid=7), CONTROL_ABORT) == AbortedTxn(7, 2, 7, 5)
    assert s.ongoing == {8: 5}
    assert s.on_batch(marker(8, pid=8), CONTROL_COMMIT) is None
    assert s.ongoing == {} and s.next_offset == 9
    assert s.on_batch(data(9, pid=8)) is None
    assert s.on_batch(marker(10, pid=8), CONTROL_ABORT) == AbortedTxn(8, 9, 10, 11)


def test_markers_without_data_change_nothing():
    s = TxnPartitionState()
    assert s.on_batch(marker(0, pid=1), CONTROL_ABORT) is None
    assert s.on_batch(marker(1, pid=1), CONTROL_COMMIT) is None
    s.on_batch(data(2, pid=1))
    assert s.on_batch(marker(3, pid=1), CONTROL_ABORT) == AbortedTxn(1, 2, 3, 4)
    assert s.on_batch(marker(4, pid=1), CONTROL_ABORT) is None  # a repeated marker
    assert s.ongoing == {} and list(s.ended) == [(3, 1, 2)]
    # A control batch of another type (or without producer) is not a marker.
    s.on_batch(data(5, pid=1))
    assert s.on_batch(marker(6, pid=1), 3) is None
    assert s.on_batch(hdr(7, attrs=b.ATTR_CONTROL)) is None
    assert s.ongoing == {1: 5}


def test_fenced_epochs_are_ignored():
    s = TxnPartitionState()
    s.on_batch(data(0, pid=1, epoch=4))
    # The coordinator fences epoch 4 and aborts with the bumped epoch.
    assert s.on_batch(marker(1, pid=1, epoch=5), CONTROL_ABORT) == AbortedTxn(1, 0, 1, 2)
    # A zombie's late write at epoch 4 must not open a transaction nobody will end.
    s.on_batch(data(2, pid=1, epoch=4))
    assert s.ongoing == {} and s.lso(3) == 3
    s.on_batch(data(3, pid=1, epoch=5))
    assert s.on_batch(marker(4, pid=1, epoch=4), CONTROL_ABORT) is None  # stale marker
    assert s.ongoing == {1: 3}
    # A newer epoch on data keeps the open transaction (Kafka does the same).
    s.on_batch(data(5, pid=1, epoch=6))
    assert s.ongoing == {1: 3} and s.epochs == {1: 6}


def test_order_and_missing_types_are_refused():
    s = TxnPartitionState()
    s.on_batch(data(0, pid=1, n=5))
    with pytest.raises(ValueError, match="below the next offset"):
        s.on_batch(data(3, pid=2))
    with pytest.raises(ValueError, match="control type"):
        s.on_batch(marker(5, pid=1))
    assert s.ongoing == {1: 0} and s.next_offset == 5
    s.on_batch(hdr(9))  # gaps (compacted follower data) are fine
    assert s.next_offset == 10
    s.on_row(row_of(0, marker(10, pid=1)), CONTROL_COMMIT)
    assert s.ongoing == {}


# -- the LSO ---------------------------------------------------------------------------


def test_lso_waits_for_the_marker_to_be_replicated():
    s = TxnPartitionState()
    s.on_batch(hdr(0, n=3))
    assert s.lso(0) == 0 and s.lso(3) == 3 and s.first_unstable_offset() is None
    s.on_batch(data(3, pid=1, n=2))
    s.on_batch(data(5, pid=2))
    assert s.lso(2) == 2 and s.lso(6) == 3
    s.on_batch(marker(6, pid=1), CONTROL_COMMIT)
    # The commit is written, but until the HW passes it a truncation could reopen it.
    assert s.lso(6) == 3 and s.lso(7) == 5
    s.on_high_watermark(7)
    assert s.first_unstable_offset() == 5 and list(s.ended) == []
    s.on_batch(marker(7, pid=2), CONTROL_ABORT)
    assert s.first_unstable_offset() == 5 and s.lso(7) == 5 and s.lso(8) == 8
    s.on_high_watermark(8)
    assert s.first_unstable_offset() is None and s.lso(8) == 8


def test_ended_below_the_hw_are_not_kept():
    s = TxnPartitionState()
    s.on_high_watermark(100)  # a follower learning a HW ahead of its own log end
    s.on_batch(data(0, pid=1))
    s.on_batch(marker(1, pid=1), CONTROL_ABORT)
    assert list(s.ended) == [] and s.lso(100) == 100


# -- snapshots and rebuilds ------------------------------------------------------------


def sample_state():
    s = TxnPartitionState()
    s.on_batch(data(0, pid=3, epoch=1))
    s.on_batch(data(1, pid=1, epoch=2))
    s.on_batch(data(2, pid=2))
    s.on_batch(marker(3, pid=1, epoch=2), CONTROL_ABORT)
    s.on_batch(data(4, pid=1, epoch=3))
    return s


def test_snapshot_round_trip():
    s = sample_state()
    t = TxnPartitionState.from_snapshot(s.to_snapshot())
    assert t.ongoing == s.ongoing and list(t.ongoing) == [3, 2, 1]  # first-offset order
    assert t.epochs == s.epochs and list(t.ended) == list(s.ended) == [(3, 1, 1)]
    assert t.next_offset == 5 and t.high_watermark == 0
    t2 = TxnPartitionState.from_snapshot(s.to_snapshot(20))
    assert t2.next_offset == 20
    with pytest.raises(ValueError):
        s.to_snapshot(4)


@pytest.mark.parametrize(
    "doc",
    [
        b"\xc1",  # never used in msgpack
        msgpack.packb([1, 2]),
        msgpack.packb({"v": 2, "offset": 0}),
        msgpack.packb({"v": 1, "offset": 0}),
        msgpack.packb({"v": 1, "offset": "0", "hw": 0, "ongoing": [], "epochs": [], "ended": []}),
        msgpack.packb({"v": 1, "offset": 0, "hw": 0, "ongoing": [[1]], "epochs": [], "ended": []}),
        msgpack.packb({"v": 1, "offset": 0, "hw": 0, "ongoing": 5, "epochs": [], "ended": []}),
        msgpack.packb({"v": 1, "offset": 0, "hw": 0, "ongoing": [], "epochs": [], "ended": [[1]]}),
        b"",
    ],
)
def test_unreadable_snapshots(doc):
    with pytest.raises(TxnSnapshotError):
        TxnPartitionState.from_snapshot(doc)


def encode_log():
    """A real buffer of batches with two control batches, stamped with offsets."""
    parts = [
        b.encode_batch([(0, b"k", b"v", None)] * 2, producer_id=1, producer_epoch=0),
        b.encode_batch([(0, b"k", b"v", None)], producer_id=2, producer_epoch=0),
        encode_control_batch(CONTROL_ABORT, producer_id=1, producer_epoch=0),
        b.encode_batch([(0, None, b"plain", None)]),
        encode_control_batch(CONTROL_COMMIT, producer_id=2, producer_epoch=0),
    ]
    attrs = [TXN, TXN, 0, 0, 0]
    out, off = bytearray(), 0
    for raw, extra in zip(parts, attrs, strict=True):
        buf = bytearray(raw)
        if extra:  # set the transactional bit, then fix the CRC
            struct.pack_into(">h", buf, b.ATTRIBUTES_POS, b.read_header(buf).attributes | extra)
            struct.pack_into(">I", buf, b.CHECKSUM_POS, b.compute_checksum(buf, 0, len(buf)))
        b.stamp(buf, 0, off, 0)
        off = b.read_header(buf).next_offset
        out += buf
    return bytes(out)


def test_replay_real_batches():
    buf = b"junk" + encode_log()
    rows, stop, _, why = scan_batches(buf, 4, len(buf), 0, 0, False, True, 100)
    assert why == "" and stop == len(buf) and len(rows) == 5
    types = control_types_in(buf, rows, origin=100)
    assert types == {3: CONTROL_ABORT, 5: CONTROL_COMMIT}
    s = TxnPartitionState()
    assert s.replay_rows(rows, types) == [AbortedTxn(1, 0, 3, 2)]
    assert s.ongoing == {} and s.next_offset == 6 and list(s.ended) == [(3, 1, 0), (5, 2, 2)]
    # The same through a callable that reads each control batch as it is met.
    s2 = TxnPartitionState()
    got = s2.replay_rows(rows, lambda r: control_record(buf, r[0] - 100).type, high_watermark=4)
    assert got == [AbortedTxn(1, 0, 3, 2)] and list(s2.ended) == [(5, 2, 2)]
    with pytest.raises(ValueError, match="control type"):
        TxnPartitionState().replay_rows(rows)
    with pytest.raises(ValueError, match="no decoded type"):
        TxnPartitionState().replay_rows(rows, {3: CONTROL_ABORT})


def test_rebuild_after_truncation_reopens_transactions():
    batches = [
        (data(0, pid=1), None),
        (data(1, pid=2), None),
        (marker(2, pid=1), CONTROL_ABORT),
        (marker(3, pid=2), CONTROL_COMMIT),
        (data(4, pid=1), None),
    ]
    rows = [row_of(0, h) for h, _ in batches]
    types = {h.base_offset: t for h, t in batches if t is not None}
    live = TxnPartitionState()
    live.replay_rows(rows[:1], types)
    snap = live.to_snapshot()  # pid 1 is open at the snapshot: carried by it
    assert live.replay_rows(rows[1:], types) == [AbortedTxn(1, 0, 2, 1)]
    # Truncate to 3: the commit of pid 2 is gone, so its transaction is open again.
    state, aborted = TxnPartitionState.rebuild(snap, rows[:3], types, high_watermark=2)
    assert state.ongoing == {2: 1} and aborted == [AbortedTxn(1, 0, 2, 1)]
    assert state.lso(2) == 0 and state.lso(3) == 1  # the abort at 2 is stable from HW 3
    # Truncate to 2: both transactions reopen, from their first offsets.
    state, aborted = TxnPartitionState.rebuild(snap, rows[:2], types)
    assert state.ongoing == {1: 0, 2: 1} and aborted == []
    # No snapshot: replay from the log start.
    state, aborted = TxnPartitionState.rebuild(None, rows, types, start_offset=0)
    assert state.ongoing == {1: 4} and aborted == [AbortedTxn(1, 0, 2, 1)]
