"""Every (API, version) the Kafka listener advertises, sent raw to a live broker.

Each request is the smallest valid one of its version (one element in every array, names
pointing at a real topic and group), built from the same message types the broker reads
(kio's, and legacy.py's for the versions kio no longer has). The answer must decode at
that version, not be UNSUPPORTED_VERSION (except the refused old Produce versions), and
the broker's log must hold no traceback: a version advertised is a version served.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import socket
import struct
import types
import typing
import uuid

import pytest
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from logmq.kafka.codec import _request_class, response_class
from logmq.kafka.registry import ADVERTISED as SUPPORTED
from logmq.kafka.registry import SERVED
from logmq.storage import batch
from tests.harness import BrokerProcess

TOPIC = "versions"
UNSUPPORTED_VERSION = 35
UNKNOWN_TOPIC_ID = 100

CASES = [(k, v) for k, (lo, hi) in sorted(SUPPORTED.items()) for v in range(lo, hi + 1)]


@pytest.fixture(scope="module")
def vbroker(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("versions") / "data")
    broker.start()
    with socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=10) as s:
        topics = _request_class(19, 4)
        m = _module(topics)
        body = topics(
            topics=(
                m.CreatableTopic(
                    name=TOPIC, num_partitions=1, replication_factor=1, assignments=(), configs=()
                ),
            ),
            timeout=datetime.timedelta(seconds=10),
            validate_only=False,
        )
        answer = _call(s, 19, 4, body, 1)
        assert int(answer.topics[0].error_code) == 0, answer
        meta = _request_class(3, 12)
        mm = _module(meta)
        body = meta(
            topics=(mm.MetadataRequestTopic(topic_id=uuid.UUID(int=0), name=TOPIC),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        broker.topic_id = _call(s, 3, 12, body, 2).topics[0].topic_id
    yield broker
    broker.stop()


def _module(cls: type):
    return __import__(cls.__module__, fromlist=["x"])


def _read_exactly(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, "the broker closed the connection"
        buf += chunk
    return buf


def _call(s: socket.socket, api_key: int, version: int, body, corr: int):
    cls = _request_class(api_key, version)
    header = cls.__header_schema__(
        request_api_key=api_key, request_api_version=version, correlation_id=corr, client_id="v"
    )
    out = io.BytesIO()
    entity_writer(type(header))(out, header)
    entity_writer(cls)(out, body)
    s.sendall(struct.pack(">i", out.tell()) + out.getvalue())
    (size,) = struct.unpack(">i", _read_exactly(s, 4))
    frame = _read_exactly(s, size)
    resp = response_class(api_key, version)
    head, pos = entity_reader(resp.__header_schema__)(frame, 0)
    assert head.correlation_id == corr
    answer, used = entity_reader(resp)(frame, pos)
    assert pos + used == len(frame), "bytes left after the answer"
    return answer


# -- the smallest valid request of any version ---------------------------------------


def _value(name: str, hint, api_key: int, version: int, ctx: dict):
    if name in ctx["overrides"]:
        return ctx["overrides"][name]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = next(a for a in typing.get_args(hint) if a is not type(None))
        if typing.get_origin(inner) is tuple or name in ("name", "topic"):
            return _value(name, inner, api_key, version, ctx)
        return None
    if origin is tuple:
        item = typing.get_args(hint)[0]
        if dataclasses.is_dataclass(item):
            return (minimal(item, api_key, version, ctx),)
        return (_value(name, item, api_key, version, ctx),)
    if dataclasses.is_dataclass(hint):
        return minimal(hint, api_key, version, ctx)
    if hint is uuid.UUID:
        return ctx["topic_id"]
    if hint is bool:
        return False
    if hint in (bytes,):
        return b""
    type_name = getattr(hint, "__name__", str(hint))
    if "Timedelta" in type_name:
        return hint.parse(datetime.timedelta(0))
    if type_name in ("TopicName",) or name in ("name", "topic", "topic_names", "resource_name"):
        return TOPIC
    if type_name == "GroupId" or name in ("key", "coordinator_keys", "groups_names"):
        return ctx["group"]
    if type_name in ("str", "TransactionalId"):
        return "x"
    if type_name in ("BrokerId",) or name.endswith("replica_id"):
        return -1
    return 0


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def minimal(cls: type, api_key: int, version: int, ctx: dict):
    hints = typing.get_type_hints(cls)
    fields = {}
    for f in dataclasses.fields(cls):
        if f.name in ctx["overrides"]:
            fields[f.name] = ctx["overrides"][f.name]
        elif f.name == "topic_id":
            fields[f.name] = ctx["topic_id"]
        elif f.name != "topic_names" and _has_default(f):
            continue  # kio's default is Kafka's
        else:
            fields[f.name] = _value(f.name, hints[f.name], api_key, version, ctx)
    return cls(**fields)


def _records() -> bytes:
    return batch.encode_values([b"v"], timestamp=1_700_000_000_000)


# Values that make a request meaningful (a real answer, not a refusal) or quick.
OVERRIDES = {
    0: {"acks": 1, "timeout": datetime.timedelta(seconds=5), "records": _records(),
        "transactional_id": None},
    1: {"replica_id": -1, "max_bytes": 1 << 20, "partition_max_bytes": 1 << 20,
        "session_epoch": -1, "current_leader_epoch": -1, "last_fetched_epoch": -1,
        "log_start_offset": -1, "rack_id": "", "forgotten_topics_data": ()},
    2: {"timestamp": -1, "current_leader_epoch": -1, "max_num_offsets": 1},
    3: {"topics": None, "allow_auto_topic_creation": False},
    8: {"generation_id_or_member_epoch": -1, "member_id": "", "committed_leader_epoch": -1,
        "group_instance_id": None},
    9: {"require_stable": False},
    11: {"session_timeout": datetime.timedelta(seconds=10),
         "rebalance_timeout": datetime.timedelta(seconds=10), "member_id": "",
         "protocol_type": "consumer", "group_instance_id": None, "reason": None},
    12: {"group_instance_id": None},
    13: {"group_instance_id": None, "reason": None},
    14: {"group_instance_id": None, "protocol_type": None, "protocol_name": None},
    18: {"client_software_name": "raw", "client_software_version": "1"},
    19: {"num_partitions": 1, "replication_factor": 1, "assignments": (), "configs": (),
         "validate_only": True, "timeout": datetime.timedelta(seconds=10)},
    20: {"timeout": datetime.timedelta(seconds=10), "topic_names": ("absent",), "name": None,
         "topic_id": uuid.UUID(int=1)},  # the topic stays
    21: {"offset": -1, "timeout": datetime.timedelta(seconds=10)},
    22: {"transactional_id": None, "producer_id": -1, "producer_epoch": -1},
    23: {"leader_epoch": 0, "current_leader_epoch": -1},
    32: {"resource_type": 2},
    33: {"resource_type": 2, "configs": ()},
    35: {"topics": None},
    37: {"count": 1, "assignments": None, "validate_only": True},
    43: {"topic_partitions": None, "election_type": 0},
    44: {"resource_type": 2, "configs": ()},
    45: {"topics": ()},
    46: {"topics": None},
    68: {"member_epoch": 0, "instance_id": None, "rack_id": None,
         "rebalance_timeout": datetime.timedelta(seconds=10), "subscribed_topic_names": (TOPIC,),
         "server_assignor": None, "topic_partitions": ()},
}  # fmt: skip


def _error_codes(entity) -> list[int]:
    """Every error code in an answer, nested ones too."""
    out = []
    for f in dataclasses.fields(entity):
        v = getattr(entity, f.name)
        if f.name == "error_code":
            out.append(int(v))
        items = v if isinstance(v, tuple) else (v,)
        for item in items:
            if dataclasses.is_dataclass(item) and getattr(item, "__type__", None) is not None:
                out += _error_codes(item)
    return out


@pytest.mark.parametrize(("api_key", "version"), CASES, ids=[f"{k}v{v}" for k, v in CASES])
def test_every_advertised_version_is_served(vbroker, api_key, version):
    if version < SERVED[api_key][0]:  # advertised, refused: a header and the code
        head = struct.pack(">hhih", api_key, version, 7, 1) + b"v" + b"\x00" * 16
        with socket.create_connection(("127.0.0.1", vbroker.kafka_port), timeout=20) as s:
            s.sendall(struct.pack(">i", len(head)) + head)
            (size,) = struct.unpack(">i", _read_exactly(s, 4))
            assert struct.unpack(">ih", _read_exactly(s, size)) == (7, UNSUPPORTED_VERSION)
        return
    cls = _request_class(api_key, version)
    assert cls.__type__ is EntityType.request
    ctx = {
        "overrides": OVERRIDES.get(api_key, {}),
        "topic_id": vbroker.topic_id,
        "group": f"g{api_key}v{version}",
    }
    body = minimal(cls, api_key, version, ctx)
    seen = vbroker.log_path.stat().st_size
    with socket.create_connection(("127.0.0.1", vbroker.kafka_port), timeout=20) as s:
        answer = _call(s, api_key, version, body, 7)
    assert UNSUPPORTED_VERSION not in _error_codes(answer), answer
    with open(vbroker.log_path, "rb") as log:  # the handler logs before it answers
        log.seek(seen)
        news = log.read().decode(errors="replace")
    assert "Traceback" not in news, news


def test_fetch_by_topic_id_answers_unknown_ids_per_topic(vbroker):
    cls = _request_class(1, 13)
    unknown = uuid.uuid4()
    ctx = {"overrides": OVERRIDES[1], "topic_id": vbroker.topic_id, "group": "g"}
    known = minimal(cls, 1, 13, ctx)
    ctx["topic_id"] = unknown
    other = minimal(cls, 1, 13, ctx)
    body = dataclasses.replace(known, topics=known.topics + other.topics)
    with socket.create_connection(("127.0.0.1", vbroker.kafka_port), timeout=20) as s:
        answer = _call(s, 1, 13, body, 9)
    by_id = {t.topic_id: [int(p.error_code) for p in t.partitions] for t in answer.responses}
    assert by_id[unknown] == [UNKNOWN_TOPIC_ID]
    # the known topic is read (0, or OFFSET_OUT_OF_RANGE once DeleteRecords has run)
    assert by_id[vbroker.topic_id] in ([0], [1]), answer


def test_fetch_by_topic_id_reads_what_the_newest_produce_wrote(vbroker):
    ctx = {"overrides": OVERRIDES[0], "topic_id": vbroker.topic_id, "group": "g"}
    produce = minimal(_request_class(0, 11), 0, 11, ctx)
    with socket.create_connection(("127.0.0.1", vbroker.kafka_port), timeout=20) as s:
        written = _call(s, 0, 11, produce, 3).responses[0].partition_responses[0]
        assert int(written.error_code) == 0 and written.base_offset >= 0
        ctx["overrides"] = {**OVERRIDES[1], "fetch_offset": written.base_offset}
        for version in (12, 17):
            fetched = _call(s, 1, version, minimal(_request_class(1, version), 1, version, ctx), 4)
            part = fetched.responses[0].partitions[0]
            assert int(part.error_code) == 0 and part.records, (version, fetched)
            assert part.high_watermark == written.base_offset + 1


@pytest.mark.parametrize("version", range(13, 18))
def test_fetch_responses_by_topic_id_match_kafkas_layout(version):
    from logmq.broker.replica.fetch_results import PartitionRead
    from logmq.kafka.fetch_response import encode_fetch_response

    known, unknown = uuid.uuid4(), uuid.uuid4()
    head, rest = encode_fetch_response(
        version,
        [
            (known, [PartitionRead(0, 0, 7, 1, b"R" * 40), PartitionRead(1, 0, 3, 0, None)]),
            (unknown, [PartitionRead(0, UNKNOWN_TOPIC_ID, -1, -1, None)]),
        ],
        session_id=5,
    )
    body = head + b"".join(bytes(p) for p in rest)
    resp = response_class(1, version)
    answer, used = entity_reader(resp)(body, 0)
    assert used == len(body) and answer.session_id == 5
    got = {
        (t.topic_id, p.partition_index): (int(p.error_code), p.high_watermark, p.records)
        for t in answer.responses
        for p in t.partitions
    }
    assert got == {
        (known, 0): (0, 7, b"R" * 40),
        (known, 1): (0, 3, b""),
        (unknown, 0): (UNKNOWN_TOPIC_ID, -1, b""),
    }


def test_create_topics_v7_answers_configs_and_id_and_delete_topics_v6_takes_the_id(vbroker):
    create = _request_class(19, 7)
    m = _module(create)
    body = create(
        topics=(
            m.CreatableTopic(
                name="by-id",
                num_partitions=2,
                replication_factor=1,
                assignments=(),
                configs=(m.CreatableTopicConfig(name="retention.ms", value="60000"),),
            ),
        ),
        timeout=datetime.timedelta(seconds=10),
        validate_only=False,
    )
    delete = _request_class(20, 6)
    dm = _module(delete)
    with socket.create_connection(("127.0.0.1", vbroker.kafka_port), timeout=20) as s:
        [made] = _call(s, 19, 7, body, 5).topics
        assert int(made.error_code) == 0 and made.num_partitions == 2
        configs = {c.name: (c.value, c.config_source) for c in made.configs}
        assert configs["retention.ms"] == ("60000", 1)  # DYNAMIC_TOPIC_CONFIG
        assert configs["cleanup.policy"] == ("delete", 5)  # DEFAULT_CONFIG
        assert made.topic_id not in (None, uuid.UUID(int=0))
        gone = delete(
            topics=(
                dm.DeleteTopicState(name=None, topic_id=made.topic_id),
                dm.DeleteTopicState(name=None, topic_id=uuid.UUID(int=7)),
            ),
            timeout=datetime.timedelta(seconds=10),
        )
        answer = _call(s, 20, 6, gone, 6).responses
    assert [(r.name, r.topic_id, int(r.error_code)) for r in answer] == [
        ("by-id", made.topic_id, 0),
        (None, uuid.UUID(int=7), UNKNOWN_TOPIC_ID),
    ]


def test_list_offsets_v0_answers_a_list_and_v9_knows_nothing_is_tiered(vbroker):
    with socket.create_connection(("127.0.0.1", vbroker.kafka_port), timeout=20) as s:
        found = {}
        for version, ts in ((0, -1), (0, -2), (1, -1), (8, -4), (9, -5)):
            ctx = {"overrides": {**OVERRIDES[2], "timestamp": ts}, "topic_id": None, "group": ""}
            body = minimal(_request_class(2, version), 2, version, ctx)
            [part] = _call(s, 2, version, body, 8).topics[0].partitions
            assert int(part.error_code) == 0
            found[version, ts] = part.old_style_offsets if version == 0 else part.offset
    assert found[0, -1] == (found[1, -1],) and found[1, -1] >= 0
    assert len(found[0, -2]) == 1 and found[8, -4] == found[0, -2][0]
    assert found[9, -5] == -1
