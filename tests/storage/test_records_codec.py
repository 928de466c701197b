"""The records section codec: C extension and pure-Python fallback, checked against each
other and against kafka-python's independent RecordBatch v2 reader and writer."""

from __future__ import annotations

import struct
from array import array

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record import default_records

from logmq.storage import records_codec, records_py

if records_codec.COMPILED:
    from logmq.storage import _recordsv2 as records_c
else:  # the extension did not build: its cases are skipped, the fallback still runs
    records_c = None

IMPLS = [
    pytest.param(
        records_c,
        id="c",
        marks=pytest.mark.skipif(records_c is None, reason="C extension not built"),
    ),
    pytest.param(records_py, id="py"),
]
BOTH = pytest.mark.skipif(records_c is None, reason="C extension not built")
FEW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
DATA = st.none() | st.binary(max_size=40)
HEADERS = st.none() | st.lists(st.tuples(st.text(max_size=8), DATA), max_size=3)
ROW = st.tuples(INT32, INT64, DATA, DATA, HEADERS)


@st.composite
def kafka_rows(draw, deltas=INT64):
    """Rows as a producer or the compactor writes them: offset deltas ascending, with gaps."""
    n = draw(st.integers(1, 8))
    od, rows = draw(st.integers(0, 100)), []
    for _ in range(n):
        rows.append((od, draw(deltas), draw(DATA), draw(DATA), draw(HEADERS)))
        od += draw(st.integers(1, 1 << 20))
    return rows


def expected(rows):
    """What decode_rows returns for rows: bytes parts, str header names, None for 0 headers."""
    out = []
    for od, td, key, value, headers in rows:
        hs = tuple((n, None if v is None else bytes(v)) for n, v in headers or ()) or None
        out.append((od, td, key and bytes(key), value and bytes(value), hs))
    return out


def other_buffers(rows, kind):
    """The same rows with keys, values and header values as bytearray or memoryview."""
    conv = {"bytes": bytes, "bytearray": bytearray, "memoryview": lambda b: memoryview(b)}[kind]

    def c(b):
        return None if b is None else conv(b)

    return [
        [od, td, c(k), c(v), None if h is None else [(n, c(hv)) for n, hv in h]]
        for od, td, k, v, h in rows
    ]


# ---- round trips ----


@pytest.mark.parametrize("impl", IMPLS)
@FEW
@given(rows=st.lists(ROW, max_size=10), kind=st.sampled_from(["bytes", "bytearray", "memoryview"]))
def test_round_trip(impl, rows, kind):
    data = impl.encode_rows(other_buffers(rows, kind))
    assert impl.decode_rows(data, len(rows)) == expected(rows)
    # a slice of a larger buffer decodes in place
    padded = bytearray(b"\xff" * 3 + data + b"\xee" * 2)
    assert impl.decode_rows(memoryview(padded)[3:-2], len(rows)) == expected(rows)


@pytest.mark.parametrize("impl", IMPLS)
@FEW
@given(values=st.lists(DATA, max_size=10), keyed=st.booleans(), data=st.data())
def test_encode_values(impl, values, keyed, data):
    keys = data.draw(st.lists(DATA, min_size=len(values), max_size=len(values))) if keyed else None
    out = impl.encode_values(values, keys)
    rows = [(i, 0, keys[i] if keyed else None, v, None) for i, v in enumerate(values)]
    assert out == impl.encode_rows(rows)
    assert impl.decode_rows(out, len(values)) == expected(rows)
    assert impl.encode_values(values, keys=keys) == out


@BOTH
@FEW
@given(rows=st.lists(ROW, max_size=10))
def test_c_and_python_agree(rows):
    data = records_c.encode_rows(rows)
    assert records_py.encode_rows(rows) == data
    assert records_c.decode_rows(data, len(rows)) == records_py.decode_rows(data, len(rows))
    values = [r[3] for r in rows]
    keys = [r[2] for r in rows]
    assert records_c.encode_values(values, keys) == records_py.encode_values(values, keys)


@pytest.mark.parametrize("impl", IMPLS)
def test_known_bytes_and_edges(impl):
    # one record: length 7, attrs 0, ts 0, offset 0, key null, value b"a", no headers
    assert impl.encode_values([b"a"]) == bytes([14, 0, 0, 0, 1, 2, ord("a"), 0])
    rows = [
        (0, 0, b"", b"", []),  # empty key and value; [] headers decode as None
        (2**31 - 1, -(2**63), None, None, [("", None), ("k\u00e9", b"")]),
        (-(2**31), 2**63 - 1, bytearray(b"k"), memoryview(b"xvx")[1:2], [(b"raw", b"v")]),
        (True, 5, array("i", [1]), None, ()),  # any integer-like, any C-contiguous buffer
    ]
    assert impl.decode_rows(impl.encode_rows(rows), 4) == [
        (0, 0, b"", b"", None),
        (2**31 - 1, -(2**63), None, None, (("", None), ("k\u00e9", b""))),
        (-(2**31), 2**63 - 1, b"k", b"v", (("raw", b"v"),)),
        (1, 5, array("i", [1]).tobytes(), None, None),
    ]
    assert impl.encode_rows([]) == b"" and impl.decode_rows(b"", 0) == []
    assert impl.encode_rows(iter([(0, 0, None, b"x", None)])) == impl.encode_values((b"x",))


# ---- kafka-python as an independent reader and writer ----

HEADER = struct.Struct(">qiibIhiqqqhii")  # the 61-byte RecordBatch v2 header


def full_batch(records: bytes, rows, base_offset: int, base_ts: int) -> bytes:
    size = HEADER.size + len(records)
    max_ts = base_ts + max(r[1] for r in rows)
    fields = [base_offset, size - 12, 0, 2, 0, 0, rows[-1][0], base_ts, max_ts, -1, -1, -1]
    batch = bytearray(HEADER.pack(*fields, len(rows)) + records)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


@pytest.mark.parametrize("impl", IMPLS)
@FEW
@given(rows=kafka_rows())
def test_kafka_python_reads_our_records(impl, rows):
    base_offset, base_ts = 1000, 0
    batch = default_records.DefaultRecordBatch(
        full_batch(impl.encode_rows(rows), rows, base_offset, base_ts)
    )
    assert batch.validate_crc()
    assert batch.records_count == len(rows)
    got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in batch]
    assert got == [
        (base_offset + od, base_ts + td, k, v, [(n, hv) for n, hv in h or ()])
        for od, td, k, v, h in rows
    ]


@pytest.mark.parametrize("impl", IMPLS)
@FEW
@given(rows=kafka_rows(st.integers(-(2**62), 2**62)), base_ts=st.integers(0, 2**40))
def test_we_read_kafka_python_records(impl, rows, base_ts):
    builder = default_records.DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    rows = [(od, td if i else 0, k, v, h) for i, (od, td, k, v, h) in enumerate(rows)]
    for od, td, k, v, h in rows:
        assert builder.append(od, base_ts + td, k, v, list(h or ())) is not None
    buf = builder.build()
    records = memoryview(buf)[HEADER.size :]
    assert impl.decode_rows(records, len(rows)) == expected(rows)
    assert impl.encode_rows(rows) == records  # and we write the very same bytes


# ---- malformed input ----


def decode_or_error(impl, data, count):
    try:
        rows = impl.decode_rows(data, count)
    except ValueError as e:
        return ("error", str(e))
    assert isinstance(rows, list) and len(rows) == count
    return ("ok", rows)


def check_both(data, count):
    results = [decode_or_error(impl, data, count) for impl in (records_c, records_py) if impl]
    assert all(r == results[0] for r in results), results
    return results[0]


@FEW
@given(data=st.binary(max_size=64), count=st.integers(-1, 6))
def test_fuzz_random_bytes(data, count):
    check_both(data, count)


@FEW
@given(rows=st.lists(ROW, min_size=1, max_size=5), data=st.data())
def test_fuzz_truncations_and_mutations(rows, data):
    valid = records_py.encode_rows(rows)
    n = len(rows)
    cut = data.draw(st.integers(0, len(valid) - 1))
    assert check_both(valid[:cut], n)[0] == "error"
    pos = data.draw(st.integers(0, len(valid) - 1))
    byte = data.draw(st.integers(0, 255))
    check_both(valid[:pos] + bytes([byte]) + valid[pos + 1 :], n)
    check_both(valid, n + data.draw(st.sampled_from([-1, 1])))
    assert check_both(valid + b"\x00", n)[0] == "error"


def record(body: bytes) -> bytes:
    return records_py._varint(len(body)) + body


GOOD = record(b"\x00\x00\x00\x01\x02a\x00")  # null key, value b"a"
BIG = record(b"\x00\x00\x00\x01\x28" + b"x" * 20 + b"\x00")  # value of 20 bytes


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "data, count, message",
    [
        (BIG + b"\x80", 2, "record 1: length: truncated varint"),
        (record(b"\x00\x80\x80") + GOOD, 1, "record 0: timestamp delta: truncated varint"),
        (b"\xff" * 5 + b"\x01" + b"\x00" * 8, 1, "record 0: length: varint longer than 5 bytes"),
        (record(b"\x00" + b"\xff" * 10 + b"\x00" * 4), 1, "varint longer than 10 bytes"),
        (
            record(b"\x00\x00\xff\xff\xff\xff\x7f\x01\x01\x00"),
            1,
            "offset delta: varint out of range",
        ),
        (record(b"\x00\x00\x00\x03\x01\x00"), 1, "record 0: key: invalid length -2"),
        (record(b"\x00\x00\x00\x01\x40abc\x00"), 1, "value: length 32 runs past the end"),
        (bytes([0x40]) + GOOD[1:], 1, "length 32 is negative or runs past the end of the buffer"),
        (bytes([0x03]) + GOOD[1:] + bytes(7), 1, "length -2 is negative"),
        (record(b"\x00\x00\x00\x01\x02a\x00\x00"), 1, "record 0: length 8 but its fields use 7"),
        (GOOD + b"\x00", 1, "1 trailing bytes after 1 records"),
        (GOOD * 2, 1, "trailing bytes after 1 records"),
        (GOOD * 2 + bytes(7), 3, "record 2: attributes: truncated"),
        (GOOD, 2, "8 bytes cannot hold 2 records"),
        (GOOD, -1, "record count -1 is negative"),
        (record(b"\x00\x00\x00\x01\x01\x02\x02\xff\x01"), 1, "header key is not valid UTF-8"),
        (record(b"\x00\x00\x00\x01\x01\x02\x01\x01"), 1, "header key: invalid length -1"),
        (record(b"\x00\x00\x00\x01\x01\x01"), 1, "header count -1 is negative"),
        (record(b"\x00\x00\x00\x01\x01\x10\x00\x00"), 1, "header count 8 is negative or runs past"),
    ],
)
def test_malformed(impl, data, count, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        impl.decode_rows(data, count)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        impl.decode_rows(bytearray(data + b"tail")[: len(data)], count)


# ---- bad arguments: same exception types (and messages) from both ----

BAD_ENCODE_ROWS = [
    [(0, 0, None, "str value", None)],  # str is not bytes
    [(0, 0, "str key", b"v", None)],
    [5],  # a row that is not a sequence
    [b"abcde"],  # nor a bytes object of length 5
    [(0, 0, None, b"v")],  # 4 items
    5,  # rows not iterable
    [(0.5, 0, None, b"v", None)],
    [(0, "1", None, b"v", None)],
    [(2**31, 0, None, b"v", None)],
    [(0, 2**63, None, b"v", None)],
    [(0, -(2**63) - 1, None, b"v", None)],
    [(0, 0, None, b"v", "headers")],
    [(0, 0, None, b"v", [("name",)])],
    [(0, 0, None, b"v", [(None, b"x")])],
    [(0, 0, None, b"v", [("k", "str")])],
    [(0, 0, None, b"v", [(b"\xff", b"x")])],  # bytes header name not UTF-8
    [(0, 0, None, b"v", [("\udc80", b"x")])],  # str header name not encodable
    [(0, 0, None, memoryview(b"abcd")[::2], None)],  # not contiguous
    [(0, 0, None, object(), None)],
]


def raised(fn, *args):
    try:
        fn(*args)
    except Exception as e:
        return type(e), str(e)
    raise AssertionError(f"no exception for {args!r}")


@pytest.mark.parametrize("rows", BAD_ENCODE_ROWS, ids=range(len(BAD_ENCODE_ROWS)))
def test_encode_rows_bad_arguments(rows):
    py = raised(records_py.encode_rows, rows)
    assert issubclass(py[0], TypeError | ValueError | OverflowError)
    if records_c is not None:
        assert raised(records_c.encode_rows, rows) == py


@pytest.mark.parametrize("impl", IMPLS)
def test_type_errors(impl):
    with pytest.raises(TypeError):
        impl.encode_rows([(0, 0, None, "value", None)])
    with pytest.raises(TypeError):
        impl.encode_rows([7])
    with pytest.raises(TypeError):
        impl.encode_values(["value"])
    with pytest.raises(TypeError):
        impl.decode_rows("text", 0)
    with pytest.raises(ValueError, match="2 keys for 1 values"):
        impl.encode_values([b"v"], [b"k", b"k"])


@pytest.mark.parametrize(
    "args",
    [([b"v"], [b"k", b"k"]), ([b"v"], ["k"]), (["v"],), (5,), ([b"v"], 5), ([None, 3],)],
)
def test_encode_values_bad_arguments(args):
    py = raised(records_py.encode_values, *args)
    if records_c is not None:
        assert raised(records_c.encode_values, *args) == py
