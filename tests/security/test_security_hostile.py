"""Hostile input on secured listeners: TLS garbage, SASL exchanges cut at every step,
10,000 failed logins. The broker keeps serving others and its memory stays bounded."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import ssl
import struct

import pytest

from logmq.testing.certs import make_ca, make_cert
from tests.harness import BrokerProcess, free_port
from tests.kafka.kafka_frames import encode_frame

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import admin as kadmin  # noqa: E402
from kio.index import load_request_schema  # noqa: E402

JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret";'
FAILED_LOGINS = int(os.environ.get("LOGMQ_FAILED_LOGINS", "10000"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    ca = make_ca(d / "pki")
    cert = make_cert(ca, d / "pki", "127.0.0.1")
    b = BrokerProcess(d / "data", log_level="warning")
    b.ssl_port, b.sasl_port = free_port(), free_port()
    props = {
        "listeners": (
            f"PLAINTEXT://127.0.0.1:{b.kafka_port},SSL://127.0.0.1:{b.ssl_port},"
            f"SASL_PLAINTEXT://127.0.0.1:{b.sasl_port}"
        ),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(cert.keystore_path),
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "connection.failed.authentication.delay.ms": "20",
    }
    for key, value in props.items():
        b.extra_args += ["--override", f"{key}={value}"]
    b.ca = ca
    b.start()
    yield b
    b.stop()


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def framed(api_key: int, version: int, body, corr: int = 1) -> bytes:
    frame = encode_frame(api_key, version, body, corr=corr, client="hostile")
    return struct.pack(">i", len(frame)) + frame


def handshake(mechanism: str, corr: int = 1) -> bytes:
    return framed(17, 1, load_request_schema(17, 1)(mechanism=mechanism), corr)


def authenticate(data: bytes, corr: int = 2) -> bytes:
    return framed(36, 2, load_request_schema(36, 2)(auth_bytes=data), corr)


def assert_serving(broker) -> None:
    """A real client still gets through on the plain listener and over TLS."""
    plain = kadmin.AdminClient({"bootstrap.servers": broker.kafka_bootstrap})
    assert plain.list_topics(timeout=10).brokers
    tls = kadmin.AdminClient(
        {
            "bootstrap.servers": f"127.0.0.1:{broker.ssl_port}",
            "security.protocol": "SSL",
            "ssl.ca.location": str(broker.ca.cert_path),
        }
    )
    assert tls.list_topics(timeout=10).brokers
    assert broker.running


def test_tls_garbage_and_plaintext_on_a_tls_port(broker):
    rnd = random.Random(28)
    payloads = [bytes(rnd.getrandbits(8) for _ in range(n)) for n in (1, 5, 64, 600, 20_000)]
    payloads.append(framed(18, 3, load_request_schema(18, 3)(
        client_software_name="x", client_software_version="1"
    )))  # fmt: skip
    payloads.append(b"\x16\x03\x01\xff\xff" + b"\x00" * 100)  # a lying TLS record length
    for payload in payloads:
        with socket.create_connection(("127.0.0.1", broker.ssl_port), timeout=10) as s:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(10)
            try:
                while s.recv(65536):
                    pass
            except OSError:
                pass  # reset: also fine
    # a ClientHello, then the client goes away mid-handshake
    ctx = ssl.create_default_context(cafile=str(broker.ca.cert_path))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    with socket.create_connection(("127.0.0.1", broker.ssl_port), timeout=10) as raw:
        raw.sendall(outgoing.read())
    assert_serving(broker)


async def _exchange(port: int, steps: list[bytes], read_each: bool) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for step in steps:
            writer.write(step)
            await writer.drain()
            if read_each:
                head = await asyncio.wait_for(reader.readexactly(4), 10)
                await reader.readexactly(struct.unpack(">i", head)[0])
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def test_sasl_exchanges_cut_at_every_step(broker):
    from logmq.security.scram import ScramClient

    client = ScramClient("SCRAM-SHA-256", "alice", "whatever")
    first = client.first()
    full = [handshake("SCRAM-SHA-256"), authenticate(first)]
    for cut in range(len(full) + 1):
        steps = full[:cut]
        for read_each in (True, False):
            await _exchange(broker.sasl_port, steps, read_each)
        # and cut inside a frame: half of the next step
        if cut < len(full):
            await _exchange(broker.sasl_port, [*steps, full[cut][: len(full[cut]) // 2]], False)
    # a request other than the handshake before logging in: answered, then closed
    reader, writer = await asyncio.open_connection("127.0.0.1", broker.sasl_port)
    writer.write(framed(3, 12, load_request_schema(3, 12)(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )))  # fmt: skip
    await writer.drain()
    head = await asyncio.wait_for(reader.readexactly(4), 10)
    await reader.readexactly(struct.unpack(">i", head)[0])
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the broker
    writer.close()
    # SaslAuthenticate without a handshake; a second handshake; garbage auth bytes
    for steps in (
        [authenticate(b"n,,n=alice,r=abc")],
        [handshake("PLAIN"), handshake("PLAIN", 2)],
        [handshake("PLAIN"), authenticate(b"\x00" * 70_000)],
        [handshake("GSSAPI")],
    ):
        await _exchange(broker.sasl_port, steps, True)
    assert_serving(broker)


async def test_ten_thousand_failed_logins_leave_memory_bounded(broker):
    pid = broker.pid
    assert pid is not None
    before = rss_kb(pid)
    wrong = authenticate(b"\x00alice\x00guess")
    sem = asyncio.Semaphore(200)
    refused = 0

    async def one(i: int) -> None:
        nonlocal refused
        async with sem:
            reader, writer = await asyncio.open_connection("127.0.0.1", broker.sasl_port)
            try:
                writer.write(handshake("PLAIN") + wrong)
                await writer.drain()
                for _ in range(2):
                    head = await asyncio.wait_for(reader.readexactly(4), 30)
                    body = await reader.readexactly(struct.unpack(">i", head)[0])
                # the second answer is SaslAuthenticate v2's: correlation id, an empty
                # tag section (a flexible header), then SASL_AUTHENTICATION_FAILED (58)
                if struct.unpack(">h", body[5:7])[0] == 58:
                    refused += 1
            finally:
                writer.close()

    await asyncio.gather(*(one(i) for i in range(FAILED_LOGINS)))
    assert refused == FAILED_LOGINS
    grown_mb = (rss_kb(pid) - before) / 1024
    assert grown_mb < 64, f"RSS grew {grown_mb:.0f} MB over {FAILED_LOGINS} failed logins"
    assert_serving(broker)
