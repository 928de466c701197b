"""The many-batches-per-call walkers (batch_scan): the C extension against the pure-Python
versions on valid, damaged and cut buffers, and against batch.validate; producer state
rebuilt from scan rows against the per-header replay."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logmq.records import Record
from logmq.storage import batch as b
from logmq.storage import batch_scan
from logmq.storage.producer_state import ProducerStateManager

if batch_scan.COMPILED:
    from logmq.storage import _recordsv2 as c
else:
    c = None

NEEDS_C = pytest.mark.skipif(c is None, reason="C extension not built")
FEW = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

DATA = st.none() | st.binary(max_size=30)
HEADERS = st.none() | st.lists(st.tuples(st.text(max_size=6), DATA), max_size=2)


@st.composite
def batch_specs(draw):
    """(records, compression, producer fields, leader epoch) for one batch."""
    n = draw(st.integers(1, 5))
    ts = draw(st.integers(0, 10**12))
    recs = [(ts + draw(st.integers(0, 9)), draw(DATA), draw(DATA), draw(HEADERS)) for _ in range(n)]
    codec = draw(st.sampled_from([b.Compression.NONE, b.Compression.NONE, b.Compression.GZIP]))
    pid = draw(st.sampled_from([-1, 7, 8]))
    return recs, codec, pid, draw(st.integers(0, 3))


def build_log(specs, *, append_time: bool = False) -> bytes:
    """Batches stamped with chained offsets and non-decreasing epochs, as a log holds them."""
    out, offset, epoch, seqs = bytearray(), 0, 0, {}
    for recs, codec, pid, bump in specs:
        epoch += bump
        seq = seqs.get(pid, 0) if pid >= 0 else -1
        batch = bytearray(
            b.encode_batch(
                recs, compression=codec, producer_id=pid,
                producer_epoch=0 if pid >= 0 else -1, base_sequence=seq,
            )
        )  # fmt: skip
        if pid >= 0:
            seqs[pid] = seq + len(recs)
        if append_time:  # the log-append-time flag is inside the CRC: set it and re-hash
            attrs = int.from_bytes(batch[21:23], "big") | b.ATTR_LOG_APPEND_TIME
            batch[21:23] = attrs.to_bytes(2, "big")
            crc = b.compute_checksum(batch, 0, len(batch))
            batch[17:21] = crc.to_bytes(4, "big")
        b.stamp(batch, 0, offset, epoch)
        offset += len(recs)
        out += batch
    return bytes(out)


def damage(buf: bytes, where: int, how: int) -> bytes:
    if not buf:
        return buf
    where %= len(buf)
    if how == 0:  # flip a byte
        return buf[:where] + bytes([buf[where] ^ 0x5A]) + buf[where + 1 :]
    return buf[:where]  # cut short


@NEEDS_C
@FEW
@given(st.lists(batch_specs(), min_size=1, max_size=6), st.integers(0, 10**6), st.integers(0, 2),
       st.booleans(), st.booleans())  # fmt: skip
def test_scan_batches_c_matches_python(specs, where, how, allow_gaps, contiguous):
    buf = build_log(specs)
    if how < 2:
        buf = damage(buf, where, how)
    for expect in (0, -1, 3):
        args = (buf, 0, len(buf), expect, -1, allow_gaps, contiguous, 100)
        assert c.scan_batches(*args) == batch_scan.py_scan_batches(*args)


@FEW
@given(st.lists(batch_specs(), min_size=1, max_size=6))
def test_scan_rows_are_the_validated_headers(specs):
    buf = build_log(specs)
    rows, stop, need, reason = batch_scan.scan_batches(buf, 0, len(buf), 0, -1, False, False)
    assert (stop, need, reason) == (len(buf), 0, "")
    headers = [b.validate(buf, pos) for pos, _ in b.iter_headers(buf)]
    assert [batch_scan.header_of(r) for r in rows] == headers
    assert [batch_scan.row_of(r[0], h) for r, h in zip(rows, headers, strict=True)] == rows


def test_scan_reports_a_batch_cut_by_the_buffer_end_so_a_file_reader_refills():
    buf = build_log([([(1, b"k", b"v" * 100, None)], b.Compression.NONE, -1, 0)] * 3)
    one = len(buf) // 3
    rows, stop, need, reason = batch_scan.scan_batches(buf, 0, one * 2 + 20, 0, -1, False, False)
    assert len(rows) == 2 and stop == one * 2 and need == one and "truncated" in reason


def test_scan_stops_at_a_broken_chain():
    a = build_log([([(1, None, b"a", None)], b.Compression.NONE, -1, 0)])
    gap = bytearray(a)
    b.stamp(gap, 0, 5, 0)
    buf = a + bytes(gap)
    rows, stop, _, reason = batch_scan.scan_batches(buf, 0, len(buf), 0, -1, False, False)
    assert len(rows) == 1 and stop == len(a) and "does not follow 1" in reason
    rows, stop, _, reason = batch_scan.scan_batches(buf, 0, len(buf), 0, -1, True, False)
    assert len(rows) == 2 and reason == ""  # a compacted log may skip offsets
    back = bytearray(a)
    b.stamp(back, 0, 1, -1)
    b.stamp(gap, 0, 0, 3)
    rows, _, _, reason = batch_scan.scan_batches(bytes(gap) + back, 0, -1, 0, -1, False, False)
    assert len(rows) == 1 and "goes back from 3" in reason


@NEEDS_C
def test_crc32c_hardware_and_tables_agree():
    import crc32c

    for n in (0, 1, 7, 8, 9, 63, 64, 1000, 4099):
        data = bytes(range(256)) * (n // 256 + 1)
        data = data[:n]
        assert c.crc32c(data) == c.crc32c(data, False) == crc32c.crc32c(data)


@NEEDS_C
@FEW
@given(st.lists(batch_specs(), min_size=1, max_size=6), st.integers(0, 10**6), st.integers(0, 2),
       st.integers(0, 40), st.integers(1, 40), st.booleans())  # fmt: skip
def test_take_records_c_matches_python(specs, where, how, position, most, append_time):
    buf = build_log(specs, append_time=append_time)
    if how < 2:
        buf = damage(buf, where, how)
    for pos in (0,):
        args = (buf, pos, position, most, "t", 3, Record)
        got, want = c.take_records(*args), batch_scan.py_take_records(*args)
        assert got == want
        assert all(type(r) is Record for r in got[0])
    assert c.batches_end(buf, 0) == batch_scan.py_batches_end(buf, 0)


@FEW
@given(st.lists(batch_specs(), min_size=1, max_size=6), st.integers(0, 40), st.integers(1, 40))
def test_take_records_hands_out_what_decode_records_reads(specs, position, most):
    """Records at or after ``position``, in order, up to the first compressed batch that
    holds any (batches wholly before the position are skipped unread)."""
    buf = build_log(specs)
    want = []
    for pos, h in b.iter_headers(buf):
        if h.next_offset <= position:
            continue
        if h.compression:
            break
        want += [
            Record("t", 3, off, ts, k, v, [tuple(x) for x in hs] if hs else None)
            for off, ts, k, v, hs in b.decode_records(buf, pos)
            if off >= position
        ]
    recs, _, nxt, stop = batch_scan.take_records(buf, 0, position, most, "t", 3, Record)
    assert recs == want[:most]
    assert stop in ("", "compressed") or len(recs) == most
    if len(want) > most:
        assert nxt == want[most].offset  # the next take starts at the first record left


def test_take_records_returns_nothing_of_a_batch_that_fails_its_checksum():
    good = build_log([([(1, None, b"a", None)] * 2, b.Compression.NONE, -1, 0)] * 2)
    bad = bytearray(good)
    bad[-3] ^= 0xFF
    recs, pos, position, stop = batch_scan.take_records(bytes(bad), 0, 0, 100, "t", 0, Record)
    assert [r.offset for r in recs] == [0, 1] and position == 2 and pos == len(good) // 2
    assert "checksum" in stop


@FEW
@given(st.lists(st.tuples(st.sampled_from([-1, 4, 5]), st.integers(0, 2), st.integers(1, 4)),
                max_size=30))  # fmt: skip
def test_replay_rows_matches_replaying_each_header(spec):
    """Recovery's bulk replay keeps exactly what per-batch replay would keep."""
    buf, offset, seqs = bytearray(), 0, {}
    for pid, epoch, n in spec:
        key = (pid, epoch)
        seq = seqs.get(key, 0) if pid >= 0 else -1
        batch = bytearray(
            b.encode_values([b"x"] * n, timestamp=offset, producer_id=pid,
                            producer_epoch=epoch if pid >= 0 else -1, base_sequence=seq)
        )  # fmt: skip
        b.stamp(batch, 0, offset, 0)
        seqs[key] = seq + n if pid >= 0 else -1
        offset += n
        buf += batch
    one, bulk = ProducerStateManager(), ProducerStateManager()
    for _, h in b.iter_headers(buf):
        one.replay(h)
    rows, *_ = batch_scan.scan_batches(bytes(buf), 0, len(buf), 0, -1, False, False)
    bulk.replay_rows(rows)
    assert bulk.producers == one.producers
