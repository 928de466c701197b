"""ResponseReader: frames split right however the bytes arrive; pooled buffers are
never overwritten while a frame that uses them is still held."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.client.response_reader import ResponseReader
from logmq.errors import FrameTooLargeError
from logmq.net.codec import SIZE


def framed(body: bytes) -> bytes:
    return SIZE.pack(len(body)) + body


def receive(reader: ResponseReader, data: bytes, chunks: list[int]) -> list[bytes]:
    """Deliver ``data`` the way a buffered transport does: at most ``chunk`` bytes into
    each buffer the reader lends."""
    out: list[bytes] = []
    pos, i = 0, 0
    while pos < len(data):
        buf = reader.get_buffer()
        n = min(len(buf), len(data) - pos, chunks[i % len(chunks)] if chunks else len(data))
        buf[:n] = data[pos : pos + n]
        pos += n
        i += 1
        out.extend(bytes(f) for f in reader.buffer_updated(n))
    return out


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.binary(max_size=300), max_size=12),
    st.lists(st.integers(1, 200), min_size=1, max_size=8),
)
def test_frames_survive_any_chunking(bodies, chunks):
    reader = ResponseReader(scratch_size=128)
    data = b"".join(framed(b) for b in bodies)
    assert receive(reader, data, chunks) == bodies
    assert reader.buffered == 0


def test_held_big_frame_is_not_overwritten_and_free_buffer_is_reused():
    reader = ResponseReader(scratch_size=64)
    first = reader.feed(framed(b"a" * 1000))[0]
    second = reader.feed(framed(b"b" * 1000))[0]
    assert bytes(first) == b"a" * 1000  # still held: the second frame got its own buffer
    third = reader.feed(framed(b"c" * 900))[0]
    assert bytes(first) == b"a" * 1000 and bytes(second) == b"b" * 1000
    assert bytes(third) == b"c" * 900
    held = first.obj  # still referenced: must not be reused
    freed = {id(second.obj), id(third.obj)}
    del first, second, third
    again = reader.feed(framed(b"d" * 500))[0]
    assert bytes(again) == b"d" * 500
    assert bytes(held[:1000]) == b"a" * 1000
    assert id(again.obj) in freed  # a free pooled buffer was reused, not reallocated


def test_oversized_frame_is_rejected_before_allocation():
    reader = ResponseReader(max_frame_size=100, scratch_size=64)
    with pytest.raises(FrameTooLargeError):
        reader.feed(SIZE.pack(101) + b"x" * 10)
