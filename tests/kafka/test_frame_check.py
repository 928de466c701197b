"""The Kafka request decoder against hostile frames: every length and count is bounded
before kio's native reader (which aborts the process on a lying count) sees the bytes."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logmq.errors import ErrorCode, InvalidFrameError
from logmq.kafka.frame_check import FrameShapeError, check_request, checker
from logmq.kafka.registry import kafka_wire
from logmq.net.limits import MAX_ARRAY_ELEMENTS, MAX_TAGGED_FIELDS
from tests.kafka.kafka_frames import (
    api_versions_with_header_tags,
    describe_groups_with_empty_ids,
    encode_frame,
    list_groups_with_empty_states,
    served,
    uvarint,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
wire = kafka_wire()

# Frames of a few dozen bytes whose first array claims billions of elements: each
# aborted a broker (kio allocating before reading) before the check existed.
HEAD = struct.Struct(">hhih")
LYING_FRAMES = {
    "Metadata v12, compact count 2^32-2": HEAD.pack(3, 12, 1, 1) + b"c\x00\xff\xff\xff\xff\x0f",
    "Metadata v4, int32 count 2^31-1": HEAD.pack(3, 4, 1, 1) + b"c" + b"\x7f\xff\xff\xff",
    "Fetch v12, partitions of a topic": HEAD.pack(1, 12, 1, 1)
    + b"c\x00"
    + b"\xff\xff\xff\xff" * 4
    + b"\x00\xff\xff\xff\xff"
    + b"\x02\x02t"
    + b"\xff\xff\xff\xff\x0f",
    "OffsetCommit v8, topics": HEAD.pack(8, 8, 1, 1)
    + b"c\x00\x02g\x00\x00\x00\x01\x02m\x00"
    + b"\xf0\xff\xff\xff\x0f",
    "Produce v9, a tagged field larger than the frame": HEAD.pack(0, 9, 1, 1)
    + b"c\x00\x00\xff\xff\x00\x00\x03\xe8\x01"
    + b"\x01\x00\xff\xff\xff\xff\x0f",
}


def _decode_in_child(frames: list[bytes]) -> subprocess.CompletedProcess:
    """Decode in a separate process: an abort there cannot take the test run with it."""
    code = (
        "import sys\n"
        "from logmq.kafka.registry import kafka_wire\n"
        "from logmq.errors import InvalidFrameError\n"
        "w = kafka_wire()\n"
        "for line in sys.stdin.read().split():\n"
        "    try:\n"
        "        w.decode_request(memoryview(bytes.fromhex(line)))\n"
        "        print('decoded')\n"
        "    except InvalidFrameError as e:\n"
        "        print(e.code.name)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        input="\n".join(f.hex() for f in frames),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_a_lying_count_is_refused_before_kio_reads_it():
    done = _decode_in_child(list(LYING_FRAMES.values()))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["INVALID_REQUEST"] * len(LYING_FRAMES)


@pytest.mark.parametrize("name", sorted(LYING_FRAMES))
def test_the_refusal_names_the_field(name):
    frame = LYING_FRAMES[name]
    api_key, version = HEAD.unpack_from(frame)[:2]
    from kio.index import load_request_schema

    cls = load_request_schema(api_key, version)
    start = check_request(cls.__header_schema__, frame, 0, len(frame))
    with pytest.raises(FrameShapeError) as e:
        check_request(cls, frame, start, len(frame))
    assert cls.__name__.removesuffix("Request") in str(e.value) or "Fetch" in str(e.value)


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_every_served_request_passes_the_check_whole(data):
    api_key, version, cls = data.draw(st.sampled_from(served()))
    body = data.draw(st.from_type(cls))
    frame = encode_frame(api_key, version, body)
    start = check_request(cls.__header_schema__, frame, 0, len(frame))
    assert check_request(cls, frame, start, len(frame)) == len(frame)
    req = wire.decode_request(memoryview(frame))
    assert (req.api_key, req.api_version, req.body) == (api_key, version, body)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), cut=st.integers(1, 64))
def test_any_truncation_is_refused_by_the_check(data, cut):
    api_key, version, cls = data.draw(st.sampled_from(served()))
    frame = encode_frame(api_key, version, data.draw(st.from_type(cls)))
    short = frame[: max(len(frame) - cut, 8)]
    start = 0
    with pytest.raises(FrameShapeError):
        start = check_request(cls.__header_schema__, short, 0, len(short))
        check_request(cls, short, start, len(short))


def test_a_null_array_where_kafka_allows_none_is_invalid_request():
    # OffsetCommit v2 with a null topics array (it used to reach the handler, TypeError)
    frame = HEAD.pack(8, 2, 5, 1) + b"c" + b"\x00\x01g" + b"\xff\xff\xff\xff"
    frame += b"\x00\x01m" + b"\x00" * 7 + b"\x01" + b"\xff\xff\xff\xff"
    with pytest.raises(InvalidFrameError) as e:
        wire.decode_request(memoryview(frame))
    assert e.value.code is ErrorCode.INVALID_REQUEST
    assert "not nullable" in str(e.value)
    # Metadata's topics may be null (all topics): accepted
    req = wire.decode_request(memoryview(HEAD.pack(3, 4, 5, 1) + b"c" + b"\xff\xff\xff\xff\x01"))
    assert req.body.topics is None


@pytest.mark.parametrize(
    "build, field, small_claim",
    [  # compact count, 1 byte an element; int32 count, 2 bytes an element
        (list_groups_with_empty_states, "states_filter", HEAD.pack(16, 4, 9, 1) + b"c\x00"),
        (describe_groups_with_empty_ids, "groups", HEAD.pack(15, 0, 9, 1) + b"c"),
    ],
    ids=["compact-count", "int32-count"],
)
def test_an_array_over_a_million_elements_is_refused_whatever_follows(build, field, small_claim):
    """As Kafka 4.4's readers do: the frame is well formed (every element is there), but
    a request may not make the broker build a list of more than a million objects."""
    assert MAX_ARRAY_ELEMENTS == 1_000_000
    req = wire.decode_request(memoryview(build(MAX_ARRAY_ELEMENTS, corr=3)))
    assert len(getattr(req.body, field)) == MAX_ARRAY_ELEMENTS
    over = memoryview(build(MAX_ARRAY_ELEMENTS + 1, corr=4))
    with pytest.raises(InvalidFrameError) as e:
        wire.decode_request(over)
    assert e.value.code is ErrorCode.INVALID_REQUEST
    assert f"{field}: 1000001 elements, over the limit of 1,000,000 per array" in str(e.value)
    assert wire.peek_correlation_id(over) == 4  # answered, the connection kept
    # a small frame claiming as many names the limit too, not the bytes missing
    flexible = build is list_groups_with_empty_states
    count = uvarint(1_000_002) if flexible else struct.pack(">i", 1_000_001)
    with pytest.raises(InvalidFrameError, match="over the limit of 1,000,000"):
        wire.decode_request(memoryview(small_claim + count + b"\x01" * 8))


def test_a_tagged_field_section_over_ten_thousand_fields_is_refused():
    """Kafka 4.4's limit, which also bounds the walk over unknown tags."""
    ok = api_versions_with_header_tags(MAX_TAGGED_FIELDS)
    from kio.index import load_request_schema

    header_cls = load_request_schema(18, 3).__header_schema__
    assert check_request(header_cls, ok, 0, len(ok)) < len(ok)  # the shape passes
    over = api_versions_with_header_tags(MAX_TAGGED_FIELDS + 1)
    with pytest.raises(InvalidFrameError, match="10001 tagged fields, over the limit of 10,000"):
        wire.decode_request(memoryview(over))


def _tags(fields: list[tuple[int, bytes]]) -> bytes:
    return uvarint(len(fields)) + b"".join(uvarint(t) + uvarint(len(v)) + v for t, v in fields)


def _metadata_v12(header_tags: bytes, topic_tags: bytes, body_tags: bytes) -> bytes:
    """Metadata v12 naming topic "t" by name, with the tagged sections given."""
    head = struct.pack(">hhih", 3, 12, 9, 1) + b"c" + header_tags
    topic = b"\x00" * 16 + uvarint(2) + b"t" + topic_tags
    return head + uvarint(2) + topic + b"\x01\x00" + body_tags


def test_unknown_tagged_fields_are_skipped_as_kafka_skips_them():
    """KIP-482: a reader skips the tags its schema does not know (a newer client's), in
    the header, in the body and inside an array's elements; kio alone refuses them."""
    plain = wire.decode_request(memoryview(_metadata_v12(b"\x00", b"\x00", b"\x00")))
    tagged = _metadata_v12(
        _tags([(7, b"xyz")]),
        _tags([(0, b""), (130, b"\x01" * 200)]),  # a two-byte tag, a two-byte size
        _tags([(5, b"\x02\x00")]),
    )
    got = wire.decode_request(memoryview(tagged))
    assert (got.body, got.client_id, got.correlation_id) == (plain.body, "c", 9)
    # a lying unknown field is still refused by its size
    with pytest.raises(InvalidFrameError, match="tag 7"):
        wire.decode_request(
            memoryview(
                _metadata_v12(uvarint(1) + uvarint(7) + uvarint(50) + b"x", b"\x00", b"\x00")
            )
        )


def test_every_served_message_class_has_a_checker():
    for _api_key, _version, cls in served():
        checker(cls)
        checker(cls.__header_schema__)


def test_the_mutation_fuzzer_finds_nothing():
    """Bounded in CI; LOGMQ_FUZZ_SECONDS runs it longer (docs/testing.md)."""
    seconds = float(os.environ.get("LOGMQ_FUZZ_SECONDS", "6"))
    done = subprocess.run(
        [sys.executable, "-m", "tests.kafka.fuzz_frames", "--seconds", str(seconds)],
        capture_output=True,
        text=True,
        timeout=seconds + 300,
        cwd=ROOT,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "fuzz_frames:" in done.stdout
