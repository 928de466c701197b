"""Fuzzing a live broker's Kafka listener: hypothesis-built requests of every served API
and version, mutated as an attacker would, and frames recorded from real clients
(tests/kafka/corpus/, see record_corpus.py).

Afterwards the broker must still serve a real round trip, its RSS must be back within
a bound, and its log must hold no traceback. Bounded in CI; LOGMQ_FUZZ_FRAMES sends more,
LOGMQ_FUZZ_SECONDS sends for that long instead (docs/testing.md#fuzzing).
"""

from __future__ import annotations

import os
import pathlib
import random
import socket
import struct
import time
import warnings

import pytest

from tests.harness import BrokerProcess
from tests.kafka.kafka_frames import example_frames, mutate

CORPUS = pathlib.Path(__file__).parent / "corpus"
FRAMES = int(os.environ.get("LOGMQ_FUZZ_FRAMES", "3000"))
SECONDS = float(os.environ.get("LOGMQ_FUZZ_SECONDS", "0"))
RSS_BOUND_KIB = 400 * 1024


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def corpus_frames() -> list[bytes]:
    return [p.read_bytes() for p in sorted(CORPUS.glob("*.bin"))]


def _send_batch(port: int, frames: list[bytes]) -> int:
    """Pipeline ``frames`` on one connection; read answers until all came, the broker
    closed, or it went quiet (a request may legitimately wait: a JoinGroup's rebalance).
    Returns how many answers arrived."""
    answers = 0
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(b"".join(struct.pack(">i", len(f)) + f for f in frames))
        except OSError:
            return 0  # closed on an earlier fatal frame while we were still sending
        s.settimeout(0.5)
        buf = b""
        while answers < len(frames):
            try:
                chunk = s.recv(1 << 16)
            except (TimeoutError, OSError):
                break
            if not chunk:
                break
            buf += chunk
            while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">i", buf)[0]:
                buf = buf[4 + struct.unpack_from(">i", buf)[0] :]
                answers += 1
    return answers


def _round_trip(broker: BrokerProcess, topic: str) -> None:
    from confluent_kafka import Consumer, Producer

    p = Producer({"bootstrap.servers": broker.kafka_bootstrap})
    p.produce(topic, b"after the fuzz", partition=0)
    assert p.flush(20) == 0
    c = Consumer(
        {
            "bootstrap.servers": broker.kafka_bootstrap,
            "group.id": "fuzz-check",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        c.assign([__import__("confluent_kafka").TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        seen = []
        while time.monotonic() < deadline and b"after the fuzz" not in seen:
            m = c.poll(1.0)
            if m is not None and m.error() is None:
                seen.append(m.value())
        assert b"after the fuzz" in seen
    finally:
        c.close()


@pytest.fixture(scope="module")
def fuzzed_broker(tmp_path_factory):
    b = BrokerProcess(
        tmp_path_factory.mktemp("kfuzz") / "data",
        extra_args=["--max-fetch-wait-ms", "50", "--max-frame-size", str(1 << 20)],
        log_level="INFO",
    )
    with b:
        yield b


def test_hostile_frames_leave_the_broker_serving(fuzzed_broker):
    pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = fuzzed_broker
    admin = AdminClient({"bootstrap.servers": broker.kafka_bootstrap})
    admin.create_topics([NewTopic("fuzz-canary", 1, 1)])["fuzz-canary"].result(30)
    rss_before = rss_kib(broker.pid)

    rnd = random.Random(int(os.environ.get("LOGMQ_FUZZ_SEED", "27")))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seeds = example_frames(rnd, 1) + corpus_frames()
    sent = answered = 0
    peak = rss_before
    deadline = time.monotonic() + SECONDS
    while (time.monotonic() < deadline) if SECONDS else (sent < FRAMES):
        batch = []
        for _ in range(20):
            frame = rnd.choice(seeds)
            if rnd.random() < 0.8:
                frame = mutate(frame, rnd)
            batch.append(frame)
        answered += _send_batch(broker.kafka_port, batch)
        sent += len(batch)
        assert broker.running, broker.log_tail(80)
        if sent % 2000 == 0:
            peak = max(peak, rss_kib(broker.pid))

    log = broker.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[log.index("Traceback") - 2000 :][:6000]
    _round_trip(broker, "fuzz-canary")
    assert rss_kib(broker.pid) < max(RSS_BOUND_KIB, rss_before * 3)
    print(
        f"kafka fuzz: {sent} frames sent, {answered} answered; broker RSS "
        f"{rss_before // 1024} MB before, peak {peak // 1024} MB, "
        f"{rss_kib(broker.pid) // 1024} MB after"
    )
