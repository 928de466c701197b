"""Client quotas through Kafka's APIs, enforced as Kafka does (KIP-219): a producer over
its byte-rate quota is throttled to it, another client on the broker is not.

Alter/DescribeClientQuotas are sent as raw Kafka frames (kio's types): none of the
Python clients has them (Kafka's Java admin does).
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time

import pytest
from kio.index import load_request_schema
from kio.serial import entity_reader

from logmq.kafka.codec import response_class
from tests.harness import BrokerProcess
from tests.kafka.kafka_frames import encode_frame

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import admin as kadmin  # noqa: E402

QUOTA = 200_000  # bytes per second
SECONDS = float(os.environ.get("LOGMQ_QUOTA_SECONDS", "10"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("quotas") / "data", log_level="warning")
    b.start()
    yield b
    b.stop()


def kafka_call(broker, api_key: int, version: int, body):
    """One request on a fresh connection; the decoded answer."""
    frame = encode_frame(api_key, version, body, corr=9, client="quota-test")
    with socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=10) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        data = s.recv(size, socket.MSG_WAITALL)
    offset = 5 if version >= 1 else 4  # correlation id, then (flexible) an empty tag section
    answer, _ = entity_reader(response_class(api_key, version))(data, offset)
    return answer


def alter(broker, client_id: str, key: str, value: float | None):
    req = load_request_schema(49, 1)
    m = __import__(req.__module__, fromlist=["x"])
    entry = m.EntryData(
        entity=(m.EntityData(entity_type="client-id", entity_name=client_id),),
        ops=(m.OpData(key=key, value=value or 0.0, remove=value is None),),
    )
    return kafka_call(broker, 49, 1, req(entries=(entry,), validate_only=False))


def describe(broker):
    req = load_request_schema(48, 1)
    m = __import__(req.__module__, fromlist=["x"])
    comp = m.ComponentData(entity_type="client-id", match_type=2, match=None)  # specified
    return kafka_call(broker, 48, 1, req(components=(comp,), strict=False))


def produce_for(broker, client_id: str, topic: str, seconds: float, out: dict) -> None:
    """Produce 10 KB records as fast as the broker lets ``client_id``; ``out[client_id]``
    gets (the acknowledged bytes over time, the throttle events with their times)."""
    throttled: list = []
    acked = [0]
    start = time.monotonic()

    def delivered(err, msg):
        if err is None:
            acked[0] += len(msg.value())

    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": broker.kafka_bootstrap,
            "client.id": client_id,
            "linger.ms": 5,
            "batch.size": 50_000,
            "max.in.flight.requests.per.connection": 1,
            "queue.buffering.max.kbytes": 256,
            "throttle_cb": lambda e: throttled.append(time.monotonic() - start),
        }
    )
    value = b"x" * 10_000
    samples = [(0.0, 0)]
    while (now := time.monotonic() - start) < seconds:
        try:
            producer.produce(topic, value, on_delivery=delivered)
        except BufferError:
            producer.poll(0.02)
        producer.poll(0)
        samples.append((now, acked[0]))
    producer.flush(30)
    out[client_id] = (samples, throttled)


def acked_at(samples: list, t: float) -> int:
    return max(a for s, a in samples if s <= t)


def test_alter_and_describe_client_quotas(broker):
    answer = alter(broker, "described", "producer_byte_rate", 12345.0)
    assert [int(e.error_code) for e in answer.entries] == [0]
    found = describe(broker)
    entries = {
        tuple((e.entity_type, e.entity_name) for e in entry.entity): {
            v.key: v.value for v in entry.values
        }
        for entry in found.entries
    }
    assert entries[(("client-id", "described"),)] == {"producer_byte_rate": 12345.0}
    answer = alter(broker, "described", "producer_byte_rate", None)
    assert [int(e.error_code) for e in answer.entries] == [0]
    answer = alter(broker, "bad", "producer_byte_rate", -5.0)
    assert int(answer.entries[0].error_code) != 0


def test_a_producer_over_its_quota_is_throttled_and_others_are_not(broker):
    admin = kadmin.AdminClient({"bootstrap.servers": broker.kafka_bootstrap})
    admin.create_topics([kadmin.NewTopic("quota-t", 1, 1)])["quota-t"].result(timeout=30)
    assert int(alter(broker, "slow", "producer_byte_rate", float(QUOTA)).entries[0].error_code) == 0
    results: dict = {}
    threads = [
        threading.Thread(target=produce_for, args=(broker, c, "quota-t", SECONDS, results))
        for c in ("slow", "fast")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    slow, slow_throttles = results["slow"]
    fast, fast_throttles = results["fast"]
    assert slow_throttles, "the broker told the producer to back off (throttle_time_ms)"
    # Kafka lets the first windows' worth pass before a throttle (the rate is measured
    # over quota.window.num windows); from the first throttle on it holds to the quota
    first = slow_throttles[0]
    end = slow[-1][0]
    held = (slow[-1][1] - acked_at(slow, first)) / (end - first)
    assert held < QUOTA * 1.25, f"{held:.0f} B/s after throttling against a quota of {QUOTA}"
    assert slow[-1][1] > acked_at(slow, first), "a throttled client still makes progress"
    assert not fast_throttles
    fast_rate = fast[-1][1] / fast[-1][0]
    assert fast_rate > 3 * QUOTA, f"the unthrottled client ran at {fast_rate:.0f} B/s"


def test_a_client_over_its_request_percentage_is_throttled(broker):
    """request_percentage: a share of the broker's request-handling time (here the one
    event loop's); 0.1% is a millisecond a second, which a busy producer passes at once."""
    admin = kadmin.AdminClient({"bootstrap.servers": broker.kafka_bootstrap})
    admin.create_topics([kadmin.NewTopic("busy-t", 1, 1)])["busy-t"].result(timeout=30)
    assert int(alter(broker, "busy", "request_percentage", 0.1).entries[0].error_code) == 0
    results: dict = {}
    produce_for(broker, "busy", "busy-t", 3.0, results)
    _, throttled = results["busy"]
    assert throttled, "the request-time quota throttled the busy client"
