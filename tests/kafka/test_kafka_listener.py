"""The Kafka listener of a real broker under hostile and odd input, over raw sockets.

Whatever arrives, the broker answers what it can (Kafka's error codes, the request's
correlation id), closes only when nothing can be matched, and keeps serving everyone.
"""

from __future__ import annotations

import io
import socket
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from logmq.errors import ErrorCode
from tests.harness import BrokerProcess


def connect(broker: BrokerProcess) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=10)
    return s


def read_frame(s: socket.socket) -> bytes | None:
    head = _read_exactly(s, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    return _read_exactly(s, size)


def _read_exactly(s: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def request(api_key: int, version: int, body, corr: int) -> bytes:
    cls = load_request_schema(api_key, version)
    header = cls.__header_schema__(
        request_api_key=api_key, request_api_version=version, correlation_id=corr, client_id="raw"
    )
    out = io.BytesIO()
    entity_writer(type(header))(out, header)
    entity_writer(cls)(out, body)
    data = out.getvalue()
    return struct.pack(">i", len(data)) + data


def api_versions(s: socket.socket, corr: int, version: int = 3):
    cls = load_request_schema(18, version)
    fields = {"client_software_name": "raw", "client_software_version": "1"} if version >= 3 else {}
    s.sendall(request(18, version, cls(**fields), corr))
    frame = read_frame(s)
    assert frame is not None
    resp_cls = load_response_schema(18, version)
    header, pos = entity_reader(resp_cls.__header_schema__)(frame, 0)
    body, _ = entity_reader(resp_cls)(frame, pos)
    return header.correlation_id, body


def test_api_versions_then_a_newer_version_falls_back_to_v0(kbroker):
    with connect(kbroker) as s:
        corr, body = api_versions(s, 1)
        assert corr == 1 and int(body.error_code) == 0
        keys = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
        assert keys[0][0] == 0 and keys[0][1] >= 3 and keys[1][0] <= 4  # v2 batches
        # a version from the future: v0 with UNSUPPORTED_VERSION and the list (KIP-511)
        future = struct.pack(">hhih", 18, 42, 2, 3) + b"raw" + b"\x00\x00\x00\x00"
        s.sendall(struct.pack(">i", len(future)) + future)
        frame = read_frame(s)
        header, pos = entity_reader(load_response_schema(18, 0).__header_schema__)(frame, 0)
        body, _ = entity_reader(load_response_schema(18, 0))(frame, pos)
        assert header.correlation_id == 2 and int(body.error_code) == ErrorCode.UNSUPPORTED_VERSION
        assert {k.api_key for k in body.api_keys} == set(keys)
        # and the connection still serves
        assert api_versions(s, 3)[0] == 3


def test_unknown_apis_old_formats_and_garbage_are_answered(kbroker):
    with connect(kbroker) as s:
        for corr, (key, version) in enumerate([(9999, 0), (0, 2), (3, 40)], start=10):
            s.sendall(struct.pack(">ihhih", 10, key, version, corr, 0))
            frame = read_frame(s)
            assert frame is not None and struct.unpack_from(">i", frame)[0] == corr
        # a Metadata v12 header with a body that is not one: INVALID_REQUEST, still open
        junk = struct.pack(">hhih", 3, 12, 20, 3) + b"raw" + b"\x00" + b"\xff" * 9
        s.sendall(struct.pack(">i", len(junk)) + junk)
        frame = read_frame(s)
        assert frame is not None and struct.unpack_from(">i", frame)[0] == 20
        assert api_versions(s, 21)[0] == 21
    with connect(kbroker) as s:
        s.sendall(struct.pack(">i", 3) + b"abc")  # no header at all: closed, nothing said
        assert read_frame(s) is None
    with connect(kbroker) as s:  # the broker goes on for everyone
        assert api_versions(s, 1)[0] == 1


def test_a_frame_over_the_limit_is_refused_before_it_is_read(kbroker):
    with connect(kbroker) as s:
        s.sendall(struct.pack(">i", 0x7FFFFFF0) + b"\x00" * 16)
        assert read_frame(s) is None  # closed: the stream cannot be trusted any more
    with connect(kbroker) as s:
        assert api_versions(s, 5)[0] == 5


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    key=st.sampled_from([0, 1, 2, 3, 18, 21, 22, 23, 35, 43, 45, 46]),
    version=st.integers(0, 15),
    junk=st.binary(max_size=120),
)
def test_fuzzed_requests_never_hurt_the_broker(kbroker, key, version, junk):
    payload = struct.pack(">hhih", key, version, 77, 1) + b"f" + junk
    with connect(kbroker) as s:
        s.sendall(struct.pack(">i", len(payload)) + payload)
        s.settimeout(3)
        try:
            frame = read_frame(s)
        except TimeoutError:
            frame = None  # an acks=0 produce that parsed: nothing to answer
        if frame is not None:
            assert struct.unpack_from(">i", frame)[0] == 77
    with connect(kbroker) as s:
        assert api_versions(s, 1, version=0)[0] == 1


def _unserved_requests() -> list[tuple[int, int, object]]:
    """Requests the door does not serve whose answers have fields with no obvious empty
    value: timestamps (the delegation-token APIs v1+), an int64 producer id
    (AllocateProducerIds), a nested struct (UpdateRaftVoter)."""
    import datetime
    import uuid

    from kio.static.primitive import i64Timedelta

    hour = i64Timedelta.parse(datetime.timedelta(hours=1))
    create = load_request_schema(38, 1)(renewers=(), max_lifetime=hour)
    create_v3 = load_request_schema(38, 3)(
        owner_principal_type="User", owner_principal_name="x", renewers=(), max_lifetime=hour
    )
    renew = load_request_schema(39, 2)(hmac=b"h", renew_period=hour)
    expire = load_request_schema(40, 1)(hmac=b"h", expiry_time_period=hour)
    allocate = load_request_schema(67, 0)(broker_id=1, broker_epoch=0)
    voter_cls = load_request_schema(82, 0)
    voter_mod = __import__(voter_cls.__module__, fromlist=["KRaftVersionFeature"])
    feature = voter_mod.KRaftVersionFeature(min_supported_version=0, max_supported_version=1)
    voter = voter_cls(
        cluster_id="c",
        current_leader_epoch=1,
        voter_id=1,
        voter_directory_id=uuid.uuid4(),
        listeners=(),
        k_raft_version_feature=feature,
    )
    return [(38, 1, create), (38, 3, create_v3), (39, 2, renew), (40, 1, expire),
            (67, 0, allocate), (82, 0, voter)]  # fmt: skip


def test_unserved_requests_pipelined_between_metadata_requests_are_all_answered(kbroker):
    """Each refused request gets UNSUPPORTED_VERSION in its own response type (once,
    encoding some of those killed the connection's writer and every answer behind it
    was lost), and the Metadata requests around them are answered, in order."""
    meta_cls = load_request_schema(3, 12)
    meta = meta_cls(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    sent: list[tuple[int, int, int]] = []  # (corr, api key, version)
    frames = [request(3, 12, meta, 100)]
    sent.append((100, 3, 12))
    for i, (key, version, body) in enumerate(_unserved_requests()):
        corr = 101 + 2 * i
        frames += [request(key, version, body, corr), request(3, 12, meta, corr + 1)]
        sent += [(corr, key, version), (corr + 1, 3, 12)]
    with connect(kbroker) as s:
        s.sendall(b"".join(frames))  # all pipelined on one connection
        for corr, key, version in sent:
            frame = read_frame(s)
            assert frame is not None, f"no answer to API {key} v{version}: {kbroker.log_tail()}"
            cls = load_response_schema(key, version)
            header, pos = entity_reader(cls.__header_schema__)(frame, 0)
            body, n = entity_reader(cls)(frame, pos)
            assert (header.correlation_id, pos + n) == (corr, len(frame)), (key, version)
            if key == 3:
                assert body.brokers and body.cluster_id
            else:
                assert int(body.error_code) == ErrorCode.UNSUPPORTED_VERSION, (key, version)
    assert "writer failed" not in kbroker.log_path.read_text(errors="replace")


def test_an_array_over_a_million_elements_is_refused_and_the_connection_kept(kbroker):
    """Kafka 4.4's limit: 1,000,001 empty group states (a well-formed megabyte) get
    INVALID_REQUEST in ListGroups' own answer, and the connection goes on serving."""
    from tests.kafka.kafka_frames import list_groups_with_empty_states

    over = list_groups_with_empty_states(1_000_001, corr=31)
    meta = load_request_schema(3, 12)(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    with connect(kbroker) as s:
        s.sendall(struct.pack(">i", len(over)) + over + request(3, 12, meta, 32))
        frame = read_frame(s)
        cls = load_response_schema(16, 4)
        header, pos = entity_reader(cls.__header_schema__)(frame, 0)
        body, _ = entity_reader(cls)(frame, pos)
        assert header.correlation_id == 31 and int(body.error_code) == ErrorCode.INVALID_REQUEST
        assert body.groups == ()
        frame = read_frame(s)
        assert frame is not None and struct.unpack_from(">i", frame)[0] == 32
    assert "over the limit of 1,000,000 per array" in kbroker.log_path.read_text(errors="replace")


def test_a_newer_clients_unknown_tagged_fields_are_skipped(kbroker):
    """KIP-482: ApiVersions v3 whose header carries tags no schema here knows is
    answered as without them (kio alone would refuse it INVALID_REQUEST)."""
    from tests.kafka.kafka_frames import api_versions_with_header_tags

    frame = api_versions_with_header_tags(3, corr=41)
    with connect(kbroker) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame)
        answer = read_frame(s)
    cls = load_response_schema(18, 3)
    header, pos = entity_reader(cls.__header_schema__)(answer, 0)
    body, _ = entity_reader(cls)(answer, pos)
    assert header.correlation_id == 41 and int(body.error_code) == ErrorCode.NONE
    assert any(k.api_key == 3 for k in body.api_keys)


def test_metadata_v12_finds_topics_by_id(kbroker):
    """KIP-848 consumers resolve their assignments by topic id alone."""
    import uuid

    from logmq.client import Admin

    with Admin(kbroker.bootstrap) as admin:
        admin.create_topic("by-id", 2)
    cls = load_request_schema(3, 12)
    mod = __import__(cls.__module__, fromlist=["MetadataRequestTopic"])
    resp_cls = load_response_schema(3, 12)

    def ask(topics, corr):
        body = cls(
            topics=topics,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        with connect(kbroker) as s:
            s.sendall(request(3, 12, body, corr))
            frame = read_frame(s)
        _, pos = entity_reader(resp_cls.__header_schema__)(frame, 0)
        return entity_reader(resp_cls)(frame, pos)[0]

    [by_name] = ask((mod.MetadataRequestTopic(topic_id=uuid.UUID(int=0), name="by-id"),), 1).topics
    assert by_name.name == "by-id" and len(by_name.partitions) == 2
    stranger = uuid.uuid4()
    topics = (
        mod.MetadataRequestTopic(topic_id=by_name.topic_id, name=None),
        mod.MetadataRequestTopic(topic_id=stranger, name=None),
    )
    found, missing = ask(topics, 2).topics
    assert (found.name, found.topic_id, int(found.error_code)) == ("by-id", by_name.topic_id, 0)
    assert len(found.partitions) == 2
    assert missing.topic_id == stranger and missing.name is None
    assert int(missing.error_code) == ErrorCode.UNKNOWN_TOPIC_ID
