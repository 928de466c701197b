"""Decompression bombs at a live broker, through both doors.

A batch of about 1 MB or less whose records inflate to a gigabyte or more (or claim to)
is refused with MESSAGE_TOO_LARGE wherever the broker has to decompress it — a compacted
topic's key check, a topic's compression.type — while its memory stays bounded; a bomb
in a topic that stores batches as sent is stored (as Kafka does) and ListOffsets still
answers for it. Afterwards the broker serves a normal round trip and logged no traceback.
"""

from __future__ import annotations

import pytest
from kio.index import load_response_schema
from kio.serial import entity_reader

from logmq.errors import ErrorCode
from logmq.storage import batch as b
from tests.harness import BrokerProcess
from tests.kafka.kafka_frames import produce_v9
from tests.kafka.test_kafka_clients import create, native_read
from tests.kafka.test_kafka_listener import connect, read_frame, request
from tests.net.raw_client import RawClient
from tests.storage.test_compression import (
    bomb_batch,
    gzip_bomb,
    lz4_bomb,
    snappy_raw_bomb,
    snappy_xerial_bomb,
    zstd_bomb,
)

C = b.Compression
BOMB_TOPIC_MAX = 2_000_000  # max.message.bytes: every bomb here fits it compressed
BOMBS = {
    "gzip": (C.GZIP, gzip_bomb),  # 1 GiB of zeros in about 1 MB
    "zstd": (C.ZSTD, zstd_bomb),  # 1 GiB in about 32 KB
    "lz4": (C.LZ4, lz4_bomb),  # 64 MiB that claims 1 TiB, in about 256 KB
    "snappy": (C.SNAPPY, snappy_raw_bomb),  # claims 4 GiB, in 70 bytes
    "xerial": (C.SNAPPY, snappy_xerial_bomb),  # 500 blocks claiming 4 GiB each
}
RSS_BOUND_KIB = 200 * 1024  # growth of the broker's peak RSS over all the bombs


def vm_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field}")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("bombs") / "data") as bp:
        yield bp


@pytest.fixture(scope="module")
def bombs():
    return {name: bomb_batch(codec, make()) for name, (codec, make) in BOMBS.items()}


def topic_configs(kind: str, codec: int) -> dict[str, str]:
    configs = {"max.message.bytes": str(BOMB_TOPIC_MAX)}
    if kind == "compact":
        configs["cleanup.policy"] = "compact"
    elif kind == "recompress":  # another codec than the bomb's, so the broker must inflate
        configs["compression.type"] = "lz4" if codec == C.GZIP else "gzip"
    return configs


def kafka_produce(broker: BrokerProcess, topic: str, records: bytes) -> int:
    """The partition error of a raw Produce v9 on the Kafka listener."""
    body = produce_v9(topic, records)
    with connect(broker) as s:
        s.settimeout(30)
        s.sendall(request(0, 9, body, 77))
        frame = read_frame(s)
    assert frame is not None, broker.log_tail()
    resp_cls = load_response_schema(0, 9)
    header, pos = entity_reader(resp_cls.__header_schema__)(frame, 0)
    assert header.correlation_id == 77
    resp, _ = entity_reader(resp_cls)(frame, pos)
    return resp.responses[0].partition_responses[0].error_code


@pytest.mark.parametrize("kind", ["compact", "recompress"])
@pytest.mark.parametrize("name", list(BOMBS))
async def test_a_bomb_is_refused_with_bounded_memory_through_both_doors(broker, bombs, kind, name):
    codec = BOMBS[name][0]
    topic = f"{kind}-{name}"
    peak_before = vm_kib(broker.pid, "VmHWM")
    async with await RawClient.connect(broker.port) as c:
        assert (await c.create_topic(topic, 1, topic_configs(kind, codec)))["error"] == 0
        native = await c.produce(topic, 0, bombs[name])
        assert native["error"] == ErrorCode.MESSAGE_TOO_LARGE, native
        assert "decompress to more than" in native["message"]
        assert kafka_produce(broker, topic, bombs[name]) == ErrorCode.MESSAGE_TOO_LARGE
        assert vm_kib(broker.pid, "VmHWM") - peak_before < RSS_BOUND_KIB, "memory not bounded"
        # the partition still takes and serves a normal batch, in the topic's codec
        good = b.encode_batch([(2_000, b"key", b"value", None)], compression=codec)
        assert (await c.produce(topic, 0, good))["error"] == 0
        meta, data = await c.fetch(topic, 0, 0)
        assert meta["error"] == 0
        assert [r[2:4] for r in b.decode_records(data)] == [(b"key", b"value")]
    assert broker.running
    assert "Traceback" not in broker.log_path.read_text()


async def test_a_bomb_stored_as_sent_is_answered_for_not_inflated(broker, bombs):
    """A topic that stores batches as sent never inflates them (nor does Kafka); the
    rare paths that decode a stored batch (ListOffsets by time) answer for the batch."""
    async with await RawClient.connect(broker.port) as c:
        configs = {"max.message.bytes": str(BOMB_TOPIC_MAX)}
        assert (await c.create_topic("stored", 1, configs))["error"] == 0
        assert (await c.produce("stored", 0, bombs["zstd"]))["error"] == 0
        assert (await c.produce("stored", 0, bombs["gzip"]))["error"] == 0
        got = await c.list_offset("stored", 0, 500)
        assert got["error"] == 0 and got["offset"] == 0, got
        got = await c.list_offset("stored", 0, -3)  # the newest timestamp's record
        assert got["error"] == 0 and got["offset"] in (0, 1), got
    assert broker.running
    assert "Traceback" not in broker.log_path.read_text()


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python"])
@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_real_clients_batches_pass_the_bounded_decompressors(broker, client, codec):
    """What real producers send (librdkafka's raw snappy and lz4 frames, kafka-python's
    xerial snappy) inflates within budget on both paths that inflate on the broker."""
    topics = {
        f"{client}-{codec}-compact": {"cleanup.policy": "compact"},
        f"{client}-{codec}-recompress": {"compression.type": "lz4" if codec != "lz4" else "zstd"},
    }
    for topic, configs in topics.items():
        create(broker, topic, 1, **configs)
    sent = [(f"k{i}".encode(), (f"value-{i}-" * 20).encode()) for i in range(500)]
    if client == "confluent-kafka":
        from confluent_kafka import Producer as CkProducer

        p = CkProducer({"bootstrap.servers": broker.kafka_bootstrap, "compression.type": codec})
        for topic in topics:
            for k, v in sent:
                p.produce(topic, v, k, partition=0)
        assert p.flush(30) == 0
    else:
        from kafka import KafkaProducer

        p = KafkaProducer(bootstrap_servers=broker.kafka_bootstrap, compression_type=codec)
        futures = [p.send(t, v, k, partition=0) for t in topics for k, v in sent]
        p.flush(30)
        for f in futures:
            f.get(timeout=30)
        p.close()
    for topic in topics:
        got = native_read(broker, topic, 1, len(sent))
        assert [(r.key, r.value) for r in got] == sent
    assert "Traceback" not in broker.log_path.read_text()
