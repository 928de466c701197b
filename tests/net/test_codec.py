"""The sans-IO codec and server connection state machine, without sockets.

Framing itself (chunked input, size limits) is tested in test_frame_reader.py.
"""

from __future__ import annotations

import random
import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.errors import ErrorCode, InvalidFrameError
from logmq.net.codec import (
    SIZE,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from logmq.net.connection import (
    UNKNOWN_CORRELATION_ID,
    ProtocolError,
    RequestReceived,
    ServerConnection,
)
from logmq.net.frame_reader import FrameReader
from logmq.net.limits import MAX_ARRAY_ELEMENTS

bodies = st.dictionaries(
    st.text(max_size=10),
    st.one_of(
        st.integers(-(2**63), 2**63 - 1),
        st.text(max_size=20),
        st.binary(max_size=20),
        st.none(),
        st.lists(st.integers(-(2**31), 2**31), max_size=5),
    ),
    max_size=6,
)
tails = st.lists(st.binary(max_size=300), max_size=4)


def joined(parts) -> bytes:
    return b"".join(bytes(p) for p in parts)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 65535),
    st.integers(0, 65535),
    st.integers(0, 2**32 - 1),
    st.text(max_size=30),
    bodies,
    tails,
)
def test_request_round_trip(api_key, version, corr, client_id, body, tail):
    wire = joined(encode_request(api_key, version, corr, client_id, body, tail))
    (frame,) = FrameReader().feed(wire)
    req = decode_request(frame)
    assert (req.api_key, req.api_version, req.correlation_id) == (api_key, version, corr)
    assert req.client_id == client_id and req.body == body
    assert bytes(req.tail) == b"".join(tail)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1), bodies, tails)
def test_response_round_trip(corr, body, tail):
    wire = joined(encode_response(corr, body, tail))
    (frame,) = FrameReader().feed(wire)
    resp = decode_response(frame)
    assert resp.correlation_id == corr and resp.body == body
    assert bytes(resp.tail) == b"".join(tail)


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\x00\x03",
        b"\x00\x03\x00\x00\x00\x00\x00\x01\xff\xff",
        b"\x00\x03\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x05\x81",
    ],
)
def test_malformed_request_frames_raise_invalid_frame(frame):
    with pytest.raises(InvalidFrameError):
        decode_request(frame)


def test_body_must_be_a_map():
    frame = joined(encode_request(3, 0, 1, "c", {}))[4:]
    bad = frame[:-1] + b"\x90"  # {} replaced by []
    with pytest.raises(InvalidFrameError):
        decode_request(bad)


@pytest.mark.parametrize("kind", ["array", "map"])
def test_a_body_holding_over_a_million_elements_is_refused_whatever_follows(kind):
    """The Kafka door's limit (net/limits.py): a msgpack nil is one byte, so a frame of a
    megabyte could otherwise make the broker build a list of a million objects, and the
    default frame limit (100 MB) one of a hundred million."""

    def frame(n: int, corr: int) -> bytes:
        many = [None] * n if kind == "array" else dict.fromkeys(range(n))
        return joined(encode_request(3, 0, corr, "c", {"topics": many}))[4:]

    req = decode_request(frame(MAX_ARRAY_ELEMENTS, 1))
    assert len(req.body["topics"]) == MAX_ARRAY_ELEMENTS
    with pytest.raises(InvalidFrameError, match=f"1000001 exceeds max_{kind}_len") as e:
        decode_request(frame(MAX_ARRAY_ELEMENTS + 1, 2))
    assert "at most 1,000,000 elements" in str(e.value)
    assert e.value.code is ErrorCode.INVALID_FRAME
    # a small body claiming as many is refused before msgpack reads (or allocates) them
    claim = (b"\xdd" if kind == "array" else b"\xdf") + struct.pack(">I", 1_000_001)
    body = msgpack.packb({"topics": None})[:-1] + claim + b"\xc0" * 8
    small = struct.pack(">HHIH", 3, 0, 3, 1) + b"c" + struct.pack(">I", len(body)) + body
    with pytest.raises(InvalidFrameError, match=f"exceeds max_{kind}_len"):
        decode_request(small)


def test_a_body_of_millions_of_tiny_containers_is_refused_before_it_is_all_built():
    """Each array under the limit, but 4,000,001 empty arrays in all (a byte each): the
    total bound (net/limits.MAX_BODY_ITEMS) stops msgpack before it builds them all,
    however big the frame; a legitimate big body (100,000 partitions' entries) passes."""
    rows = [[] for _ in range(999_999)]
    many = {"topics": [rows, rows, rows, rows, [[]] * 10]}
    with pytest.raises(InvalidFrameError, match="over 4,000,000 arrays, maps and elements"):
        decode_request(joined(encode_request(3, 0, 1, "c", many))[4:])
    parts = [{"partition": i, "offset": 5, "max_bytes": 1 << 20} for i in range(100_000)]
    big = {"topics": [{"topic": "t", "partitions": parts}]}
    req = decode_request(joined(encode_request(1, 0, 2, "c", big))[4:])
    assert len(req.body["topics"][0]["partitions"]) == 100_000


# -- ServerConnection -------------------------------------------------------------------


def test_connection_yields_requests_and_counts_in_flight():
    conn = ServerConnection(max_in_flight=2)
    wire = b"".join(joined(encode_request(18, 0, i, "c", {})) for i in range(3))
    events = conn.receive_data(wire)
    assert [e.request.correlation_id for e in events if isinstance(e, RequestReceived)] == [0, 1, 2]
    assert conn.in_flight == 3 and not conn.wants_read
    conn.request_done()
    conn.request_done()
    assert conn.wants_read


def test_undecodable_body_is_answered_and_connection_stays_open():
    conn = ServerConnection()
    good = joined(encode_request(18, 0, 5, "c", {}))
    bad = bytearray(joined(encode_request(18, 0, 6, "c", {"k": 1})))
    bad[-1] = 0xC1  # never-used msgpack byte
    events = conn.receive_data(bytes(bad) + good)
    assert isinstance(events[0], ProtocolError)
    assert events[0].correlation_id == 6 and events[0].code == ErrorCode.INVALID_FRAME
    assert not events[0].fatal
    assert isinstance(events[1], RequestReceived) and events[1].request.correlation_id == 5
    assert conn.wants_read


def test_oversize_frame_is_fatal():
    conn = ServerConnection(max_frame_size=4096)
    (ev,) = conn.receive_data(SIZE.pack(1 << 31) + b"junk")
    assert isinstance(ev, ProtocolError) and ev.fatal and ev.code == ErrorCode.REQUEST_TOO_LARGE
    assert ev.correlation_id == UNKNOWN_CORRELATION_ID
    assert conn.receive_data(b"more") == [] and not conn.wants_read


def test_frame_without_correlation_id_is_fatal():
    conn = ServerConnection()
    (ev,) = conn.receive_data(SIZE.pack(3) + b"abc")
    assert isinstance(ev, ProtocolError) and ev.fatal


def test_request_done_without_request_is_a_bug():
    with pytest.raises(RuntimeError):
        ServerConnection().request_done()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_connection_survives_any_bytes(data):
    conn = ServerConnection(max_frame_size=1 << 16)
    for ev in conn.receive_data(data):
        assert isinstance(ev, RequestReceived | ProtocolError)


def test_random_garbage_never_raises():
    rnd = random.Random(1234)
    for _ in range(300):
        conn = ServerConnection(max_frame_size=1 << 16)
        for _ in range(5):
            conn.receive_data(rnd.randbytes(rnd.randint(0, 64)))
