"""Fetch-response parsing and record decoding, without a broker."""

from __future__ import annotations

import gc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.client.fetcher import PartitionData, build_records, parse_fetch_response
from logmq.errors import CorruptRecordError, ErrorCode
from logmq.records import Record
from logmq.storage import records_codec
from logmq.storage.batch import HEADER_SIZE, Compression, encode_batch, stamp


def make_log(batches, base=0, compression=Compression.NONE):
    """Concatenated batches as the broker stores them, with offsets stamped in."""
    out = bytearray()
    offset = base
    for records in batches:
        raw = bytearray(encode_batch(records, compression=compression))
        stamp(raw, 0, offset, 0)
        out += raw
        offset += len(records)
    return bytes(out)


def pdata(data, fetch_offset=0):
    return PartitionData("t", 0, fetch_offset, ErrorCode.NONE, data=memoryview(data))


records_st = st.lists(
    st.tuples(
        st.integers(0, 2**41),
        st.one_of(st.none(), st.binary(max_size=20)),
        st.one_of(st.none(), st.binary(max_size=60)),
        st.one_of(
            st.none(), st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=5)), max_size=2)
        ),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(records_st, min_size=1, max_size=4),
    st.sampled_from(["none", "gzip", "zstd", "lz4"]),
    st.integers(0, 1000),
)
def test_round_trip_through_encode_batch(batches, codec, base):
    log = make_log(batches, base, Compression.parse(codec))
    got = pdata(log, base).take(10_000)
    flat = [r for b in batches for r in b]
    assert [r.offset for r in got] == list(range(base, base + len(flat)))
    for rec, (ts, key, value, headers) in zip(got, flat, strict=True):
        assert isinstance(rec, Record)
        assert (rec.timestamp, rec.key, rec.value) == (ts, key, value)
        assert rec.headers == [tuple(h) for h in headers or []]


def test_skips_records_before_fetch_offset_and_ignores_partial_tail():
    batches = [[(10, None, b"%d" % i, None) for i in range(j, j + 5)] for j in (0, 5, 10)]
    log = make_log(batches)
    cut = log[:-7]  # the last batch is cut short, as partition_max_bytes may do
    pd = pdata(cut, 3)
    got = pd.take(100)
    assert [r.offset for r in got] == [3, 4, 5, 6, 7, 8, 9]
    assert pd.position == 10 and pd.exhausted
    assert pdata(cut, 3).next_fetch_offset() == 10
    assert pdata(b"", 42).next_fetch_offset() == 42


@pytest.mark.skipif(not records_codec.COMPILED, reason="the compiled codec untracks")
def test_records_without_headers_are_left_out_of_the_cyclic_gc():
    """CPython never untracks a tuple subclass itself: a poll of 200,000 Records was a
    scan of each at every full collection. Records with headers hold lists: tracked."""
    log = make_log([[(1, b"k", b"v", None), (1, None, None, [("h", b"x")])]])
    plain, headed = pdata(log).take(10)
    assert (plain.key, plain.value, headed.headers) == (b"k", b"v", [("h", b"x")])
    assert not gc.is_tracked(plain)
    assert gc.is_tracked(headed)


def test_max_records_splits_a_batch_and_resumes():
    log = make_log([[(1, None, b"%d" % i, None) for i in range(10)]])
    pd = pdata(log)
    assert [r.value for r in pd.take(4)] == [b"0", b"1", b"2", b"3"]
    assert pd.position == 4 and not pd.exhausted
    assert [r.offset for r in pd.take(100)] == list(range(4, 10))
    pd = pdata(log, 2)
    batches = pd.take_batches(5)
    assert len(batches) == 1 and batches[0].offsets() == [2, 3, 4, 5, 6]
    assert pd.position == 7
    rest = pd.take_batches(100)
    assert rest[0].values() == [b"7", b"8", b"9"] and rest[0].next_offset == 10


def test_corrupt_batch_raises_and_nothing_after_it_is_returned():
    good = [[(1, None, b"a", None)], [(1, None, b"b", None)], [(1, None, b"c", None)]]
    log = bytearray(make_log(good))
    second = len(make_log(good[:1]))
    log[second + HEADER_SIZE + 3] ^= 0xFF  # a record byte of the second batch
    pd = pdata(bytes(log))
    assert [r.value for r in pd.take(1)] == [b"a"]
    with pytest.raises(CorruptRecordError):
        pd.take(10)
    assert pd.position == 1  # still before the corrupt batch


def test_garbage_header_is_corrupt_not_partial():
    with pytest.raises(CorruptRecordError):
        pdata(b"\x00" * 100).take(10)


def test_parse_fetch_response_slices_tail_in_body_order():
    a = make_log([[(1, None, b"a", None)]])
    b = make_log([[(1, None, b"b", None)]], base=7)
    body = {
        "error": 0,
        "topics": [
            {
                "topic": "x",
                "partitions": [
                    {"partition": 0, "error": 0, "high_watermark": 1, "size": len(a)},
                    {"partition": 1, "error": 1, "high_watermark": 0, "size": 0},
                ],
            },
            {"topic": "y", "partitions": [{"partition": 0, "error": 0, "size": len(b)}]},
        ],
    }
    parts = parse_fetch_response(body, memoryview(a + b), {("x", 0): 0, ("x", 1): 0, ("y", 0): 7})
    assert [(p.tp, p.error) for p in parts] == [
        (("x", 0), ErrorCode.NONE),
        (("x", 1), ErrorCode.OFFSET_OUT_OF_RANGE),
        (("y", 0), ErrorCode.NONE),
    ]
    assert parts[0].take(5)[0].value == b"a"
    assert parts[2].take(5)[0].offset == 7
    with pytest.raises(CorruptRecordError):
        parse_fetch_response(body, memoryview(a), {("x", 0): 0})


def test_build_records_matches_constructor():
    rows = [[0, 0, b"k", b"v", None], [1, 5, None, None, [["h", b"x"]]]]
    assert build_records("t", 3, 10, 100, rows) == [
        Record("t", 3, 10, 100, b"k", b"v", []),
        Record("t", 3, 11, 105, None, None, [("h", b"x")]),
    ]


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 250), st.integers(0, 255))
def test_damaged_fetch_data_never_escapes_as_another_error(noise, at, xor):
    """Random bytes, or a valid log with one byte flipped: records or CorruptRecordError."""
    log = bytearray(make_log([[(1, b"k", b"v%d" % i, None) for i in range(3)]] * 2))
    if at < len(log):
        log[at] ^= xor
    for data in (noise, bytes(log), bytes(log) + noise):
        pd = pdata(data)
        try:
            got = pd.take(100)
        except CorruptRecordError:
            continue
        assert all(isinstance(r, Record) for r in got)
