"""The Kafka front door's sans-IO parts: request frames, response heads, Fetch encoding.

Responses are read back with kio's own parsers (generated from Kafka's schemas), so
the hand-encoded Fetch response is checked against Kafka's layout for every version.
"""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from logmq.broker.replica.fetch_results import PartitionRead
from logmq.errors import ErrorCode, InvalidFrameError
from logmq.kafka.codec import encode_error_response, response_class
from logmq.kafka.fetch_response import encode_fetch_response
from logmq.kafka.registry import ADVERTISED as SUPPORTED
from logmq.kafka.registry import kafka_wire
from logmq.kafka.versions import api_versions_response
from logmq.net.codec import Request
from logmq.net.connection import ProtocolError
from logmq.net.reply import Reply
from tests.kafka.kafka_frames import produce_v9

wire = kafka_wire()


def request_frame(api_key: int, version: int, body, corr: int = 7) -> memoryview:
    cls = load_request_schema(api_key, version)
    header = cls.__header_schema__(
        request_api_key=api_key, request_api_version=version, correlation_id=corr, client_id="t"
    )
    out = io.BytesIO()
    entity_writer(type(header))(out, header)
    entity_writer(cls)(out, body)
    return memoryview(out.getvalue())


def read_response(api_key: int, version: int, frame: bytes):
    """Parse a whole response frame (with its size prefix) the way a Kafka client does."""
    (size,) = struct.unpack_from(">i", frame, 0)
    assert size == len(frame) - 4
    cls = load_response_schema(api_key, version)
    header, pos = entity_reader(cls.__header_schema__)(frame[4:], 0)
    body, n = entity_reader(cls)(frame[4:], pos)
    assert pos + n == size, "trailing bytes"
    return header, body


@pytest.mark.parametrize("version", range(0, 4))
def test_api_versions_round_trip_in_every_version(version):
    cls = load_request_schema(18, version)
    fields = {"client_software_name": "t", "client_software_version": "1"} if version >= 3 else {}
    req = wire.decode_request(request_frame(18, version, cls(**fields)))
    assert (req.api_key, req.api_version, req.correlation_id, req.client_id) == (
        18,
        version,
        7,
        "t",
    )
    reply = Reply(api_versions_response(version, SUPPORTED))
    header, body = read_response(18, version, wire.encode_head(req, reply, 0))
    assert header.correlation_id == 7
    assert {k.api_key: (k.min_version, k.max_version) for k in body.api_keys} == SUPPORTED


def test_an_unknown_api_versions_version_gets_v0_with_the_list():
    frame = struct.pack(">hhih", 18, 99, 5, 1) + b"x" + b"\x00" * 8
    with pytest.raises(InvalidFrameError) as e:
        wire.decode_request(memoryview(frame))
    error = ProtocolError(5, e.value.code, str(e.value), False, 18, 99)
    header, body = read_response(18, 0, wire.encode_error(error))
    assert header.correlation_id == 5 and int(body.error_code) == ErrorCode.UNSUPPORTED_VERSION
    assert {k.api_key for k in body.api_keys} == set(SUPPORTED)


def test_unsupported_versions_and_apis_are_answered_not_dropped():
    # Produce v2 (the old message format): UNSUPPORTED_VERSION, and the correlation id
    frame = struct.pack(">hhih", 0, 2, 11, 0) + b"\x00" * 20
    with pytest.raises(InvalidFrameError) as e:
        wire.decode_request(memoryview(frame))
    assert e.value.code is ErrorCode.UNSUPPORTED_VERSION
    answer = wire.encode_error(ProtocolError(11, e.value.code, "", False, 0, 2))
    assert struct.unpack_from(">ii", answer) == (len(answer) - 4, 11)
    # an API key nobody knows
    answer = encode_error_response(31_000, 0, 12, ErrorCode.UNSUPPORTED_VERSION, SUPPORTED)
    assert struct.unpack(">iih", answer) == (6, 12, ErrorCode.UNSUPPORTED_VERSION)
    # a frame too short for a header: nothing can be matched, nothing is said
    assert wire.encode_error(ProtocolError(0, ErrorCode.INVALID_FRAME, "", True)) is None


def test_a_truncated_body_is_invalid_request_and_trailing_bytes_are_ignored():
    cls = load_request_schema(3, 12)
    good = request_frame(3, 12, cls(topics=None, include_topic_authorized_operations=False))
    with pytest.raises(InvalidFrameError) as e:
        wire.decode_request(good[:-1])
    assert e.value.code is ErrorCode.INVALID_REQUEST
    assert wire.peek_correlation_id(good[:-1]) == 7
    # as on Kafka's brokers (librdkafka's all-topics Metadata carries a few)
    padded = wire.decode_request(memoryview(bytes(good) + b"\x01\x00\x00"))
    assert padded.body.topics is None


@settings(max_examples=300, deadline=None)
@given(
    api_key=st.sampled_from(sorted(SUPPORTED)),
    version=st.integers(-1, 20),
    junk=st.binary(max_size=200),
)
def test_garbage_after_any_header_raises_only_invalid_frame(api_key, version, junk):
    frame = memoryview(struct.pack(">hhih", api_key, version, 3, 1) + b"c" + junk)
    try:
        wire.decode_request(frame)
    except InvalidFrameError as e:
        answer = wire.encode_error(ProtocolError(3, e.code, str(e), False, api_key, version))
        assert answer is not None and struct.unpack_from(">i", answer, 4)[0] == 3


class _Region:
    """A file region stand-in: what the server would sendfile."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.file = None
        self.position = 0
        self.length = len(data)

    def read(self) -> bytes:
        return self.data


@pytest.mark.parametrize("version", range(4, 13))
def test_fetch_response_matches_kafka_layout_in_every_version(version):
    topics = [
        (
            "orders",
            [
                PartitionRead(0, 0, 10, 2, _Region(b"A" * 70)),
                PartitionRead(1, 0, 5, 0, None),
                PartitionRead(2, 6, -1, -1, None),
            ],
        ),
        ("clicks", [PartitionRead(3, 0, 9, 0, b"B" * 30)]),
    ]
    head, rest = encode_fetch_response(version, topics)
    body = head + b"".join(p.read() if hasattr(p, "read") else bytes(p) for p in rest)
    assert any(isinstance(p, _Region) for p in rest), "records stay a region"
    header = b"\x00\x00\x00\x09" + (b"\x00" if version >= 12 else b"")
    frame = struct.pack(">i", len(header) + len(body)) + header + body
    _, parsed = read_response(1, version, frame)
    got = {
        (t.topic, p.partition_index): (
            int(p.error_code),
            p.high_watermark,
            p.last_stable_offset,
            p.records,
        )
        for t in parsed.responses
        for p in t.partitions
    }
    assert got == {
        ("orders", 0): (0, 10, 10, b"A" * 70),
        ("orders", 1): (0, 5, 5, b""),
        ("orders", 2): (6, -1, -1, b""),
        ("clicks", 3): (0, 9, 9, b"B" * 30),
    }
    if version >= 11:
        assert all(p.preferred_read_replica == -1 for t in parsed.responses for p in t.partitions)


def test_produce_request_records_arrive_as_sent():
    body = produce_v9("t", b"xyz", timeout_s=5)
    req = wire.decode_request(request_frame(0, 9, body))
    assert req.body.topic_data[0].partition_data[0].records == b"xyz"


def test_the_pipelines_error_answer_encodes_for_every_served_version():
    """A refused or failed request is answered in its own response type at its version,
    with the message where that type has a top-level one (ConsumerGroupHeartbeat)."""
    from logmq.kafka.apis import kafka_error_reply
    from logmq.kafka.codec import encode_entity
    from tests.kafka.kafka_frames import served

    for api_key, version, _cls in served():
        req = Request(api_key, version, 1, "c", None, memoryview(b""))
        reply = kafka_error_reply(req, ErrorCode.INVALID_REQUEST, "a reason")
        assert encode_entity(reply.body)
        if hasattr(reply.body, "error_message"):
            assert reply.body.error_message == "a reason", (api_key, version)


def kio_versions() -> list[tuple[int, int]]:
    """Every (api key, version) kio has a request schema for, and the legacy.py ones."""
    from kio.schema.index import api_key_map, schema_name_map
    from kio.static.constants import EntityType

    from logmq.kafka.legacy import _LEGACY

    pairs = {
        (api_key, version)
        for api_key, name in api_key_map.items()
        for version, entities in schema_name_map[name].items()
        if EntityType.request in entities
    }
    return sorted(pairs | set(_LEGACY))


def test_the_error_answer_of_every_api_and_version_kio_knows_decodes():
    """Served or not: an API the door does not serve (CreateDelegationToken v1+, whose
    timestamps have no empty value; AllocateProducerIds v0, an int64 producer id;
    UpdateRaftVoter v0, a nested struct) is answered in its own response type at the
    version asked, and kio's reader takes the whole frame back with the error in it."""
    pairs = kio_versions()
    assert len(pairs) > 300 and (38, 3) in pairs and (67, 0) in pairs and (82, 0) in pairs
    code = ErrorCode.UNSUPPORTED_VERSION
    for api_key, version in pairs:
        frame = encode_error_response(api_key, version, 4321, code, SUPPORTED)
        answered = 0 if api_key == 18 else version  # ApiVersions: v0 (KIP-511)
        cls = response_class(api_key, answered)
        (size,) = struct.unpack_from(">i", frame, 0)
        assert size == len(frame) - 4, (api_key, version)
        header, pos = entity_reader(cls.__header_schema__)(frame[4:], 0)
        body, n = entity_reader(cls)(frame[4:], pos)
        assert pos + n == size, (api_key, version, "trailing bytes")
        assert header.correlation_id == 4321, (api_key, version)
        if "error_code" in cls.__dataclass_fields__:
            assert int(body.error_code) == code, (api_key, version)
