"""A key lands on the same partition whichever client produced it (issue 27).

The native producer's default is Kafka's Java one, murmur2; kafka-python and aiokafka
use it by default, librdkafka with ``partitioner=murmur2_random`` (its default hashes with
CRC-32 instead). Each client writes
the same keys to one topic, and the native consumer reads back where each went.
"""

from __future__ import annotations

import collections
import zlib

import pytest

from logmq.client import Producer
from logmq.client.partitioner import murmur2_partition, xxh3_partition
from tests.kafka.test_kafka_clients import create, native_read

PARTITIONS = 7
# lengths 1..40 (every murmur2 tail case), text and binary
KEYS = [b"user-%d" % i for i in range(40)] + [bytes(range(n)) for n in range(1, 41)]


def placements(broker, topic: str, producers: int) -> dict[bytes, dict[bytes, int]]:
    """{producer name (the record value): {key: partition}} as read back."""
    out: dict[bytes, dict[bytes, int]] = collections.defaultdict(dict)
    for r in native_read(broker, topic, PARTITIONS, producers * len(KEYS)):
        out[r.value][r.key] = r.partition
    return out


async def test_native_kafka_python_aiokafka_and_librdkafka_murmur2_agree(kbroker):
    kafka = pytest.importorskip("kafka")
    aiokafka = pytest.importorskip("aiokafka")
    ck = pytest.importorskip("confluent_kafka")
    topic = "same-key-same-partition"
    create(kbroker, topic, PARTITIONS)

    with Producer(kbroker.bootstrap, acks="all") as native:  # the default partitioner
        for key in KEYS:
            native.send(topic, b"native", key=key)
        native.flush(30)

    kp = kafka.KafkaProducer(bootstrap_servers=kbroker.kafka_bootstrap, acks="all")
    for key in KEYS:
        kp.send(topic, value=b"kafka-python", key=key)
    kp.flush(30)
    kp.close()

    aio = aiokafka.AIOKafkaProducer(bootstrap_servers=kbroker.kafka_bootstrap, acks="all")
    await aio.start()
    try:
        for key in KEYS:
            await aio.send(topic, b"aiokafka", key=key)
        await aio.flush()
    finally:
        await aio.stop()

    rd = ck.Producer(
        {"bootstrap.servers": kbroker.kafka_bootstrap, "partitioner": "murmur2_random"}
    )
    for key in KEYS:
        rd.produce(topic, value=b"librdkafka", key=key)
    assert rd.flush(30) == 0
    # librdkafka's own default, consistent_random: CRC-32 of the key, elsewhere
    rd_default = ck.Producer({"bootstrap.servers": kbroker.kafka_bootstrap})
    for key in KEYS:
        rd_default.produce(topic, value=b"librdkafka-default", key=key)
    assert rd_default.flush(30) == 0

    placed = placements(kbroker, topic, 5)
    want = {key: murmur2_partition(key, PARTITIONS) for key in KEYS}
    assert len(set(want.values())) == PARTITIONS  # the keys do spread
    for name in (b"native", b"kafka-python", b"aiokafka", b"librdkafka"):
        assert placed[name] == want, name
    crc32 = {key: zlib.crc32(key) % PARTITIONS for key in KEYS}
    assert placed[b"librdkafka-default"] == crc32 != want  # as kafka-compatibility.md says


def test_the_old_xxh3_partitioner_stays_available(kbroker):
    topic = "xxh3-keys"
    create(kbroker, topic, PARTITIONS)
    with Producer(kbroker.bootstrap, partitioner="xxh3") as p:
        meta = [p.send(topic, b"v", key=key) for key in KEYS]
        assert [m.result(30).partition for m in meta] == [
            xxh3_partition(key, PARTITIONS) for key in KEYS
        ]
    with pytest.raises(ValueError, match="partitioner must be one of 'murmur2', 'xxh3'"):
        Producer(kbroker.bootstrap, partitioner="crc32")
