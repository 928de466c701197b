"""FrameReader: readinto-style framing, fed the way a BufferedProtocol loop feeds it."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.errors import FrameTooLargeError
from logmq.net.codec import SIZE
from logmq.net.frame_reader import FrameReader


def framed(payloads: list[bytes]) -> bytes:
    return b"".join(SIZE.pack(len(p)) + p for p in payloads)


def read_like_a_socket(reader: FrameReader, wire: bytes, read_sizes) -> list[bytes]:
    """Copy at most ``next(read_sizes)`` bytes into each lent buffer, like recv_into."""
    out: list[bytes] = []
    pos = 0
    while pos < len(wire):
        buf = reader.get_buffer()
        assert len(buf) > 0
        n = min(len(buf), len(wire) - pos, next(read_sizes))
        buf[:n] = wire[pos : pos + n]
        pos += n
        out.extend(bytes(f) for f in reader.buffer_updated(n))
    return out


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(st.binary(max_size=50), st.binary(min_size=100, max_size=700)),
        min_size=1,
        max_size=12,
    ),
    st.lists(st.integers(1, 900), min_size=1, max_size=30),
)
def test_any_read_pattern_yields_the_frames(payloads, sizes):
    reader = FrameReader(max_frame_size=10_000, scratch_size=256)  # small: exercise big mode

    def cycle():
        while True:
            yield from sizes

    assert read_like_a_socket(reader, framed(payloads), cycle()) == payloads
    assert reader.buffered == 0


def test_large_frame_is_read_straight_into_its_own_buffer():
    reader = FrameReader(scratch_size=1024)
    payload = bytes(range(256)) * 400  # 100 KiB
    wire = framed([payload])
    head = reader.get_buffer()
    head[:100] = wire[:100]
    assert reader.buffer_updated(100) == []
    lent = reader.get_buffer()  # from here on the socket writes into the frame itself
    assert len(lent) == len(payload) - 96
    lent[:] = wire[100:]
    (frame,) = reader.buffer_updated(len(lent))
    assert frame.obj is lent.obj  # no copy after the first 96 bytes
    assert bytes(frame) == payload and not frame.readonly


def test_oversize_frame_refused_before_allocation():
    reader = FrameReader(max_frame_size=1 << 20)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        with pytest.raises(FrameTooLargeError):
            reader.feed(SIZE.pack(0xFFFFFFFF) + b"\x00" * 16)
        grown = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert grown < 1 << 16


def test_feed_matches_small_and_empty_frames():
    reader = FrameReader(scratch_size=64)
    frames = reader.feed(framed([b"", b"a", b"x" * 60, b"b"]))
    assert [bytes(f) for f in frames] == [b"", b"a", b"x" * 60, b"b"]
    frames[1][0] = ord("z")  # frames are writable (the storage stamps offsets in place)
