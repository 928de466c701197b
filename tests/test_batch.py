"""The record batch format: round trips, validation and broker stamping."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.errors import CorruptRecordError
from logmq.storage import batch as b

keys = st.one_of(st.none(), st.binary(max_size=20))
headers = st.lists(
    st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))), max_size=3
)
records = st.lists(
    st.tuples(st.integers(0, 2**42), keys, st.one_of(st.none(), st.binary(max_size=200)), headers),
    min_size=1,
    max_size=40,
)
codecs = st.sampled_from(
    [b.Compression.NONE, b.Compression.GZIP, b.Compression.ZSTD, b.Compression.LZ4]
)


@settings(max_examples=150, deadline=None)
@given(records, codecs, st.integers(0, 2**40), st.integers(0, 2**20))
def test_round_trip_and_stamping(recs, codec, base_offset, epoch):
    data = bytearray(
        b.encode_batch(recs, compression=codec, producer_id=7, producer_epoch=1, base_sequence=3)
    )
    b.validate(data)
    b.stamp(data, 0, base_offset, epoch)
    h = b.validate(data)  # stamping does not invalidate the checksum
    assert (h.base_offset, h.leader_epoch, h.record_count) == (base_offset, epoch, len(recs))
    assert h.first_timestamp == recs[0][0] and h.max_timestamp == max(r[0] for r in recs)
    assert h.last_sequence == 3 + len(recs) - 1 and h.compression == codec
    out = b.decode_records(data)
    assert [o for o, *_ in out] == list(range(base_offset, base_offset + len(recs)))
    assert [(ts, k, v, hs) for _, ts, k, v, hs in out] == [
        (ts, k, v, [tuple(x) for x in hs]) for ts, k, v, hs in recs
    ]


def test_encode_values_bulk_path():
    data = b.encode_values([b"x" * 100] * 1000, timestamp=123, keys=[b"k"] * 1000)
    h = b.validate(data)
    assert h.record_count == 1000 and h.size == len(data)
    rows = b.decode_rows(data)
    assert rows[999] == (999, 0, b"k", b"x" * 100, None)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_flipped_byte_after_stamped_fields_is_detected(data):
    raw = bytearray(b.encode_batch([(1, b"k", b"v" * 30, [("h", b"1")])] * 3))
    pos = data.draw(st.integers(b.MAGIC_POS, len(raw) - 1))
    bit = data.draw(st.integers(0, 7))
    raw[pos] ^= 1 << bit
    with pytest.raises(CorruptRecordError):
        b.validate(raw)


@pytest.mark.parametrize("cut", [0, 10, b.HEADER_SIZE - 1, b.HEADER_SIZE, 100])
def test_truncated_batch_is_rejected(cut):
    raw = b.encode_batch([(1, None, b"v" * 200, None)])
    with pytest.raises(CorruptRecordError, match="truncated"):
        b.validate(raw[:cut])


def test_bad_length_and_counts_are_rejected():
    raw = bytearray(b.encode_batch([(1, None, b"v", None)] * 2))
    struct.pack_into(">i", raw, b.LENGTH_POS, 3)
    with pytest.raises(CorruptRecordError, match="length"):
        b.validate(raw)
    raw = bytearray(b.encode_batch([(1, None, b"v", None)] * 2))
    struct.pack_into(">i", raw, b.LENGTH_POS, 2**31 - 1)
    with pytest.raises(CorruptRecordError, match="length"):
        b.validate(raw)


def test_iter_headers_stops_at_partial_tail():
    one = b.encode_values([b"a"] * 5, timestamp=1)
    buf = one * 3 + one[:30]
    got = list(b.iter_headers(buf))
    assert [pos for pos, _ in got] == [0, len(one), 2 * len(one)]


def test_gapped_offsets_allowed_only_when_not_contiguous():
    raw = b.encode_batch([(1, b"a", b"1", None), (2, b"b", b"2", None)], offset_deltas=[0, 5])
    with pytest.raises(CorruptRecordError, match="offset delta"):
        b.validate(raw)
    h = b.validate(raw, contiguous=False)
    assert h.last_offset == 5 and h.next_offset == 6
    assert [r[0] for r in b.decode_records(raw)] == [0, 5]
