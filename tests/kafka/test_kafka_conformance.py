"""Conformance gaps real Kafka clients hit, each proven with a real client or raw frames.

Metadata answers a missing or invalid topic in its own entry beside the others (at every
served version); Fetch keeps to the request's ``max_bytes`` but for the answer's first
batch; Produce names the records that failed a batch (KIP-467 ``record_errors``).
"""

from __future__ import annotations

import datetime
import os
import time
import uuid

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader

from logmq.client import Admin
from logmq.errors import ErrorCode
from logmq.kafka.messages import build  # the fields this version has
from logmq.kafka.registry import ADVERTISED as SUPPORTED
from logmq.storage import batch as b
from tests.harness import BrokerProcess
from tests.kafka.test_kafka_clients import create
from tests.kafka.test_kafka_listener import api_versions, connect, read_frame, request

ZERO_UUID = uuid.UUID(int=0)
BAD_NAMES = ("bad topic!", "x" * 300)


def call(broker: BrokerProcess, api_key: int, version: int, **fields):
    """One request on a fresh connection, its answer decoded with kio."""
    cls = load_request_schema(api_key, version)
    return answer_of(broker, api_key, version, build(cls, **fields), sized=True)


def answer_of(broker: BrokerProcess, api_key: int, version: int, body, *, sized=False):
    resp = load_response_schema(api_key, version)
    with connect(broker) as s:
        s.sendall(request(api_key, version, body, 7))
        frame = read_frame(s)
    assert frame is not None, "connection closed without an answer"
    header, pos = entity_reader(resp.__header_schema__)(frame, 0)
    assert header.correlation_id == 7
    answer = entity_reader(resp)(frame, pos)[0]
    return (answer, len(frame)) if sized else answer


def module_of(api_key: int, version: int):
    cls = load_request_schema(api_key, version)
    return __import__(cls.__module__, fromlist=["_"])


def metadata(broker: BrokerProcess, version: int, names, *, auto_create: bool = False):
    m = module_of(3, version)
    topics = tuple(build(m.MetadataRequestTopic, name=n, topic_id=None) for n in names)
    answer, _ = call(
        broker,
        3,
        version,
        topics=topics,
        allow_auto_topic_creation=auto_create,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    return {t.name: t for t in answer.topics}


# -- Metadata ----------------------------------------------------------------------------
def test_a_topic_named_twice_is_answered_once(kbroker):
    create(kbroker, "md-twice", 1)
    m = module_of(3, 12)
    topics = tuple(
        build(m.MetadataRequestTopic, name=n, topic_id=None)
        for n in ("md-twice", "md-missing-twice", "md-twice", "md-missing-twice")
    )
    answer, _ = call(kbroker, 3, 12, topics=topics, allow_auto_topic_creation=False,
                     include_topic_authorized_operations=False)  # fmt: skip
    assert sorted(t.name for t in answer.topics) == ["md-missing-twice", "md-twice"]


def test_metadata_answers_good_missing_and_invalid_topics_at_every_version(kbroker):
    create(kbroker, "md-good", 2)
    lo, hi = SUPPORTED[3]
    for version in range(lo, hi + 1):
        got = metadata(kbroker, version, ["md-good", "md-missing", *BAD_NAMES])
        assert set(got) == {"md-good", "md-missing", *BAD_NAMES}, version
        good = got["md-good"]
        assert int(good.error_code) == 0 and len(good.partitions) == 2, version
        missing = got["md-missing"]
        assert int(missing.error_code) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, version
        assert missing.partitions == ()
        for name in BAD_NAMES:
            assert int(got[name].error_code) == ErrorCode.INVALID_TOPIC_EXCEPTION, version
            assert got[name].partitions == ()
        if version >= 1:
            assert not missing.is_internal and not got["bad topic!"].is_internal
        if version >= 10:
            # the zero id, which kio reads as None
            assert missing.topic_id in (None, ZERO_UUID) and good.topic_id not in (None, ZERO_UUID)


def test_librdkafka_producer_to_a_missing_topic_fails_promptly(kbroker):
    ck = pytest.importorskip("confluent_kafka")
    producer = ck.Producer(
        {
            "bootstrap.servers": kbroker.kafka_bootstrap,
            "topic.metadata.propagation.max.ms": 1000,
            "message.timeout.ms": 60000,
        }
    )
    errors = []
    producer.produce("rd-missing", b"v", on_delivery=lambda err, msg: errors.append(err))
    producer.flush(30)
    assert len(errors) == 1 and errors[0] is not None
    # the broker's answer failed it, not message.timeout.ms (_MSG_TIMED_OUT)
    assert errors[0].code() in (ck.KafkaError.UNKNOWN_TOPIC_OR_PART, ck.KafkaError._UNKNOWN_TOPIC)


def test_librdkafka_consumer_of_an_invalid_topic_gets_the_error(kbroker):
    ck = pytest.importorskip("confluent_kafka")
    create(kbroker, "rd-valid", 1)
    consumer = ck.Consumer(
        {
            "bootstrap.servers": kbroker.kafka_bootstrap,
            "group.id": "rd-invalid-group",
            "topic.metadata.propagation.max.ms": 1000,
        }
    )
    try:
        consumer.subscribe(["rd-valid", "bad topic!"])
        deadline = time.monotonic() + 30
        codes = set()
        # librdkafka reports INVALID_TOPIC_EXCEPTION as a missing topic
        while not codes & {ck.KafkaError.TOPIC_EXCEPTION, ck.KafkaError.UNKNOWN_TOPIC_OR_PART}:
            assert time.monotonic() < deadline, f"no topic error, saw {codes}"
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is not None:
                codes.add(msg.error().code())
    finally:
        consumer.close()


def test_librdkafka_offsets_for_times_on_a_missing_topic(kbroker):
    ck = pytest.importorskip("confluent_kafka")
    consumer = ck.Consumer({"bootstrap.servers": kbroker.kafka_bootstrap, "group.id": "oft"})
    try:
        with pytest.raises(ck.KafkaException) as e:
            consumer.offsets_for_times([ck.TopicPartition("oft-missing", 0, 0)], timeout=20)
        unknown = (
            ck.KafkaError.UNKNOWN_TOPIC_OR_PART,
            ck.KafkaError._UNKNOWN_TOPIC,
            ck.KafkaError._UNKNOWN_PARTITION,  # librdkafka 2.x's word for it here
        )
        assert e.value.args[0].code() in unknown  # not _TIMED_OUT
    finally:
        consumer.close()


def test_metadata_still_auto_creates_beside_invalid_names(tmp_path):
    ck = pytest.importorskip("confluent_kafka")
    with BrokerProcess(tmp_path / "data", extra_args=["--auto-create-topics"]) as broker:
        got = metadata(broker, SUPPORTED[3][1], ["auto-new", *BAD_NAMES], auto_create=True)
        assert int(got["auto-new"].error_code) == 0 and len(got["auto-new"].partitions) == 1
        for name in BAD_NAMES:
            assert int(got[name].error_code) == ErrorCode.INVALID_TOPIC_EXCEPTION
        # and a librdkafka producer's first record creates its topic
        producer = ck.Producer({"bootstrap.servers": broker.kafka_bootstrap})
        errors = []
        producer.produce("auto-rd", b"v", on_delivery=lambda err, msg: errors.append(err))
        assert producer.flush(30) == 0 and errors == [None]
        with Admin(broker.bootstrap) as admin:
            assert "auto-rd" in admin.list_topics()


# -- Fetch -------------------------------------------------------------------------------
BIG = 900_000  # one record, one batch of a little more


def produce_body(topic, partition, batches, version=8, acks=-1):
    m = module_of(0, version)
    return build(
        load_request_schema(0, version),
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            m.TopicProduceData(
                name=topic,
                partition_data=(
                    m.PartitionProduceData(index=partition, records=b"".join(batches)),
                ),
            ),
        ),
    )


def produce_raw(broker, topic, partition, batches, version=8):
    answer = answer_of(broker, 0, version, produce_body(topic, partition, batches, version))
    [topic_answer] = answer.responses
    [part] = topic_answer.partition_responses
    return part


def big_batch(i: int) -> bytes:
    return b.encode_values([os.urandom(BIG)], timestamp=1_700_000_000_000 + i)


@pytest.fixture(scope="module")
def big_topic(kbroker):
    """Two partitions of two ~900 KB batches each."""
    create(kbroker, "fetch-big", 2, **{"max.message.bytes": str(4 << 20)})
    for p in range(2):
        for i in range(2):
            assert int(produce_raw(kbroker, "fetch-big", p, [big_batch(i)]).error_code) == 0
    return "fetch-big"


def fetch_raw(broker, topic, version, max_bytes, partition_max_bytes, partitions=(0, 1)):
    m = module_of(1, version)
    parts = tuple(
        m.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=partition_max_bytes)
        for p in partitions
    )
    answer, size = call(
        broker,
        1,
        version,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=0),
        min_bytes=1,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(m.FetchTopic(topic=topic, partitions=parts),),
        forgotten_topics_data=(),
        rack_id="",
    )
    sizes = {
        p.partition_index: len(p.records or b"") for t in answer.responses for p in t.partitions
    }
    return sizes, size


@pytest.mark.parametrize("version", [4, 12])
def test_fetch_keeps_to_max_bytes_but_for_the_first_batch(kbroker, big_topic, version):
    one = BIG + 200  # a batch: the record and its framing
    # the budget fits one batch: the second partition's would pass it, so it waits
    sizes, frame = fetch_raw(kbroker, big_topic, version, 1_000_000, 10 << 20)
    assert sizes[0] > BIG and sizes[0] < one and sizes[1] == 0
    assert frame < 1_000_000 + 1000
    # a budget smaller than any batch: still the first one, so the consumer goes on
    sizes, _ = fetch_raw(kbroker, big_topic, version, 1000, 10 << 20)
    assert BIG < sizes[0] < one and sizes[1] == 0
    # partition_max_bytes likewise: only the answer's first batch may pass it
    sizes, _ = fetch_raw(kbroker, big_topic, version, 10 << 20, 500_000)
    assert BIG < sizes[0] < one and sizes[1] == 0
    # room for everything: both batches of both partitions
    sizes, _ = fetch_raw(kbroker, big_topic, version, 10 << 20, 10 << 20)
    assert 2 * BIG < sizes[0] < 2 * one and 2 * BIG < sizes[1] < 2 * one


def test_librdkafka_with_fetch_max_bytes_reads_every_big_record(kbroker, big_topic):
    ck = pytest.importorskip("confluent_kafka")
    consumer = ck.Consumer(
        {
            "bootstrap.servers": kbroker.kafka_bootstrap,
            "group.id": "fetch-big-reader",
            "fetch.max.bytes": 1000512,
            "receive.message.max.bytes": 1001024,  # the least librdkafka allows with it
            "enable.auto.commit": False,
        }
    )
    errors = []
    try:
        consumer.assign([ck.TopicPartition(big_topic, p, 0) for p in range(2)])
        got = []
        deadline = time.monotonic() + 60
        while len(got) < 4:
            assert time.monotonic() < deadline, f"read {len(got)} of 4, errors {errors}"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                errors.append(msg.error())
                continue
            got.append((msg.partition(), msg.offset(), len(msg.value())))
        assert sorted(got) == [(p, o, BIG) for p in range(2) for o in range(2)]
    finally:
        consumer.close()


# -- Produce: record_errors (KIP-467) ----------------------------------------------------
@pytest.mark.parametrize("version", [8, SUPPORTED[0][1]])
def test_produce_names_the_keyless_records_of_a_compacted_topic(kbroker, version):
    topic = f"rec-errors-{version}"
    create(kbroker, topic, 1, **{"cleanup.policy": "compact"})
    keyless = [3, 9, 17, 30, 41, 55, 62, 77, 88, 99]
    keys = [None if i in keyless else f"k{i}".encode() for i in range(100)]
    batch = b.encode_values([b"v"] * 100, timestamp=1_700_000_000_000, keys=keys)
    part = produce_raw(kbroker, topic, 0, [batch], version)
    assert int(part.error_code) == ErrorCode.INVALID_RECORD
    assert [e.batch_index for e in part.record_errors] == keyless
    assert all(e.batch_index_error_message for e in part.record_errors)
    assert part.error_message and "without a key" in part.error_message
    # nothing of the batch was appended; a keyed one is
    good = b.encode_values([b"v"], timestamp=1_700_000_000_000, keys=[b"k"])
    ok = produce_raw(kbroker, topic, 0, [good], version)
    assert int(ok.error_code) == 0 and ok.base_offset == 0 and ok.record_errors == ()


def test_librdkafka_fails_only_the_keyless_records_with_invalid_record(kbroker):
    """librdkafka reads record_errors: the named records fail with INVALID_RECORD, the
    rest of their batch with _INVALID_DIFFERENT_RECORD (a retry could take them)."""
    ck = pytest.importorskip("confluent_kafka")
    create(kbroker, "rd-rec-errors", 1, **{"cleanup.policy": "compact"})
    producer = ck.Producer(
        {
            "bootstrap.servers": kbroker.kafka_bootstrap,
            "linger.ms": 1000,
            "batch.num.messages": 1000,
        }
    )
    producer.list_topics("rd-rec-errors", timeout=10)  # its partition known: one batch
    outcomes: list[tuple[bytes | None, int]] = []
    for i in range(100):
        key = None if i % 10 == 3 else b"k%d" % i
        producer.produce(
            "rd-rec-errors",
            key=key,
            value=b"v%d" % i,
            on_delivery=lambda err, msg: outcomes.append((msg.key(), err.code() if err else 0)),
        )
    assert producer.flush(30) == 0 and len(outcomes) == 100
    codes = {code for key, code in outcomes if key is None}
    assert codes == {ck.KafkaError.INVALID_RECORD}
    # a keyed record failed only for its batch's sake (or landed, had its batch none)
    codes = {code for key, code in outcomes if key is not None}
    assert ck.KafkaError._INVALID_DIFFERENT_RECORD in codes
    assert codes <= {ck.KafkaError._INVALID_DIFFERENT_RECORD, 0}


# -- Produce with acks=0 -------------------------------------------------------------------
def test_acks_0_is_not_answered_and_a_failed_one_closes_the_connection(kbroker):
    """As Kafka: no answer to an acks=0 Produce; a partition that fails closes the
    connection, the only way the client can learn of it (it then refreshes metadata)."""
    create(kbroker, "acks0", 1)
    batch = b.encode_values([b"v"], timestamp=1_700_000_000_000)
    with connect(kbroker) as s:
        s.sendall(request(0, 8, produce_body("acks0", 0, [batch], acks=0), 5))
        assert api_versions(s, 6)[0] == 6  # the next answer is ApiVersions': none for 5
        s.sendall(request(0, 8, produce_body("acks0", 7, [batch], acks=0), 8))  # no such partition
        assert read_frame(s) is None
    m = module_of(1, 4)
    part = m.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)
    fetch = build(
        load_request_schema(1, 4),
        replica_id=-1,
        max_wait=datetime.timedelta(0),
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        topics=(m.FetchTopic(topic="acks0", partitions=(part,)),),
    )
    [topic] = answer_of(kbroker, 1, 4, fetch).responses  # the first one's record is there
    assert topic.partitions[0].high_watermark == 1
