"""FrameReader, the one frame reader: fed like a BufferedProtocol, by copy, or a stream."""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.errors import FrameTooLargeError
from logmq.net.codec import SIZE, decode_request, encode_request
from logmq.net.frame_reader import FrameReader, read_frame


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


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.binary(min_size=0, max_size=3000), min_size=1, max_size=6),
    st.lists(st.integers(1, 2000), min_size=1, max_size=20),
)
def test_frames_bigger_than_the_eager_size_grow_into_the_same_bytes(payloads, sizes):
    reader = FrameReader(max_frame_size=10_000, scratch_size=64, eager_size=100)

    def cycle():
        while True:
            yield from sizes

    assert read_like_a_socket(reader, framed(payloads), cycle()) == payloads
    assert reader.buffered == 0


def test_a_claimed_size_costs_memory_only_as_its_bytes_arrive():
    """Four bytes announcing 100 MB must not make the broker hold 100 MB."""
    reader = FrameReader(max_frame_size=200 << 20)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert reader.feed(SIZE.pack(100 << 20) + b"\x00" * 100_000) == []
        grown = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert grown < 2 << 20  # the eager 1 MiB, not the 100 MB claimed
    assert reader.buffered == 100_000


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
            reader.feed(SIZE.pack(0xFFFFFFFF) + b"\x00" * 16)  # announces 4 GiB
        grown = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert grown < 1 << 16
    assert reader.buffered == 0


def test_feed_matches_small_and_empty_frames():
    reader = FrameReader(scratch_size=64)
    frames = reader.feed(framed([b"", b"a", b"x" * 60, b"b"]))
    assert [bytes(f) for f in frames] == [b"", b"a", b"x" * 60, b"b"]
    frames[1][0] = ord("z")  # frames are writable (the storage stamps offsets in place)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.binary(max_size=300), min_size=1, max_size=8),
    st.sampled_from([64, 256, 64 * 1024]),
    st.randoms(),
)
def test_feed_in_random_chunks(payloads, scratch_size, rnd):
    reader = FrameReader(scratch_size=scratch_size)
    wire = framed(payloads)
    got = []
    pos = 0
    while pos < len(wire):
        n = rnd.randint(1, 40)
        got.extend(bytes(f) for f in reader.feed(wire[pos : pos + n]))
        pos += n
    assert got == payloads
    assert reader.buffered == 0


def test_byte_by_byte_feed():
    wire = b"".join(bytes(p) for p in encode_request(18, 0, 7, "me", {"a": 1}, [b"xyz"]))
    reader = FrameReader()
    frames = []
    for i in range(len(wire)):
        frames.extend(reader.feed(wire[i : i + 1]))
        if i < len(wire) - 1:
            assert frames == []
    (frame,) = frames
    assert bytes(decode_request(frame).tail) == b"xyz"


# -- read_frame: the same framing over an asyncio stream (the Raft transport) -----------


def stream(data: bytes, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


async def test_read_frame_reads_frames_one_at_a_time():
    reader = stream(framed([b"hello", b"", b"x" * 1000]))
    assert [await read_frame(reader, 1000) for _ in range(3)] == [b"hello", b"", b"x" * 1000]
    with pytest.raises(asyncio.IncompleteReadError):
        await read_frame(reader, 1000)


async def test_read_frame_refuses_oversize_like_frame_reader():
    # the size alone decides: the body is never awaited (the stream holds none of it)
    reader = stream(SIZE.pack(1001), eof=False)
    with pytest.raises(FrameTooLargeError) as streamed:
        await read_frame(reader, 1000)
    with pytest.raises(FrameTooLargeError) as buffered:
        FrameReader(max_frame_size=1000).feed(SIZE.pack(1001))
    assert str(streamed.value) == str(buffered.value)


async def test_read_frame_stream_ending_mid_frame():
    with pytest.raises(asyncio.IncompleteReadError):
        await read_frame(stream(SIZE.pack(10) + b"abc"), 1000)
