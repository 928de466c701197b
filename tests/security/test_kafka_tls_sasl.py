"""TLS and SASL on the Kafka listeners, with the real clients (issue 28).

One broker with four Kafka listeners (PLAINTEXT, SSL with optional client certificates,
SASL_PLAINTEXT and SASL_SSL), configured with Kafka's property names through
``--override``, exactly as a Kafka user writes them. The SASL listeners offer PLAIN and
both SCRAMs; SASL_PLAINTEXT takes only the RFC's exact client-final nonce
(``sasl.scram.strict.nonce``), SASL_SSL also the repeated one of librdkafka < 2.6.1.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid

import pytest

from logmq.testing.certs import make_ca, make_cert
from tests.faults.processes import wait_for
from tests.harness import BrokerProcess, free_port

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import admin as kadmin  # noqa: E402

PLAIN_JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="admin" password="admin-secret" '
    'user_admin="admin-secret" user_alice="alice-secret";'
)
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d)
    server = make_cert(ca, d, "127.0.0.1", server=True)
    alice = make_cert(ca, d, "alice", server=False)
    other_ca = make_ca(d / "other", "someone-else")
    mallory = make_cert(other_ca, d / "other", "mallory", server=False)
    return {"ca": ca, "server": server, "alice": alice, "mallory": mallory}


@pytest.fixture(scope="module")
def secured(pki, tmp_path_factory):
    ports = {name: free_port() for name in ("SSL", "SASL_PLAINTEXT", "SASL_SSL")}
    broker = BrokerProcess(tmp_path_factory.mktemp("secured") / "data")
    listeners = f"PLAINTEXT://127.0.0.1:{broker.kafka_port}," + ",".join(
        f"{name}://127.0.0.1:{port}" for name, port in ports.items()
    )
    overrides = {
        "listeners": listeners,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(pki["server"].keystore_path),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(pki["ca"].cert_path),
        "listener.name.ssl.ssl.client.auth": "requested",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
        "listener.name.sasl_ssl.plain.sasl.jaas.config": PLAIN_JAAS,
        "listener.name.sasl_plaintext.sasl.scram.strict.nonce": "true",
    }
    for key, value in overrides.items():
        broker.extra_args += ["--override", f"{key}={value}"]
    for mechanism in SCRAM_MECHANISMS:
        broker.extra_args += ["--add-scram", f"{mechanism}=[name=carol,password=carol-secret]"]
    broker.start()
    broker.ports = ports
    yield broker
    broker.stop()


def _conf(broker, listener: str, pki, **extra) -> dict:
    port = broker.kafka_port if listener == "PLAINTEXT" else broker.ports[listener]
    conf = {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": listener}
    if listener.endswith("SSL"):
        conf["ssl.ca.location"] = str(pki["ca"].cert_path)
    conf.update(extra)
    return conf


def _round_trip(conf: dict, topic: str, n: int = 20) -> list[bytes]:
    """Produce ``n`` records and read them back on one listener; the values read."""
    admin = kadmin.AdminClient(conf)
    futures = admin.create_topics([kadmin.NewTopic(topic, 1, 1)])
    futures[topic].result(timeout=30)
    producer = confluent_kafka.Producer({**conf, "linger.ms": 5})
    for i in range(n):
        producer.produce(topic, b"v%d" % i)
    assert producer.flush(30) == 0
    consumer = confluent_kafka.Consumer(
        {**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    got: list[bytes] = []
    try:
        for _ in range(300):
            if len(got) >= n:
                break
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append(msg.value())
    finally:
        consumer.close()
    return got


def _topic(prefix: str, broker=None) -> str:
    """A fresh topic name; created (on the PLAINTEXT listener) when ``broker`` is given."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    if broker is not None:
        admin = kadmin.AdminClient({"bootstrap.servers": broker.kafka_bootstrap})
        admin.create_topics([kadmin.NewTopic(name, 1, 1)])[name].result(timeout=30)
    return name


@pytest.mark.parametrize("listener", ["PLAINTEXT", "SSL"])
def test_confluent_kafka_round_trip_in_clear_and_over_tls(secured, pki, listener):
    got = _round_trip(_conf(secured, listener, pki), _topic(listener.lower()))
    assert got == [b"v%d" % i for i in range(20)]


def test_confluent_kafka_with_a_client_certificate(secured, pki):
    alice = pki["alice"]
    conf = _conf(
        secured,
        "SSL",
        pki,
        **{
            "ssl.certificate.location": str(alice.chain_path),
            "ssl.key.location": str(alice.key_path),
        },
    )
    assert len(_round_trip(conf, _topic("mtls"))) == 20


def test_a_certificate_from_another_ca_is_refused(secured, pki):
    mallory = pki["mallory"]
    conf = _conf(
        secured,
        "SSL",
        pki,
        **{
            "ssl.certificate.location": str(mallory.chain_path),
            "ssl.key.location": str(mallory.key_path),
        },
    )
    admin = kadmin.AdminClient(conf)
    with pytest.raises(confluent_kafka.KafkaException):
        admin.list_topics(timeout=3)


@pytest.mark.parametrize("listener", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_confluent_kafka_sasl_plain(secured, pki, listener):
    conf = _conf(
        secured,
        listener,
        pki,
        **{"sasl.mechanism": "PLAIN", "sasl.username": "alice", "sasl.password": "alice-secret"},
    )
    assert len(_round_trip(conf, _topic(listener.lower()))) == 20


def test_a_wrong_password_is_refused_and_the_broker_keeps_serving(secured, pki):
    conf = _conf(
        secured,
        "SASL_SSL",
        pki,
        **{"sasl.mechanism": "PLAIN", "sasl.username": "alice", "sasl.password": "guess"},
    )
    errors: list = []
    producer = confluent_kafka.Producer({**conf, "error_cb": errors.append})
    for _ in range(100):
        if any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors):
            break
        producer.poll(0.1)
    auth = [e for e in errors if e.code() == confluent_kafka.KafkaError._AUTHENTICATION]
    assert auth and "Invalid username or password" in auth[0].str()
    del producer
    good = _conf(
        secured,
        "SASL_SSL",
        pki,
        **{"sasl.mechanism": "PLAIN", "sasl.username": "admin", "sasl.password": "admin-secret"},
    )
    assert kadmin.AdminClient(good).list_topics(timeout=10).brokers


def test_a_sasl_listener_refuses_requests_before_login(secured):
    """A plain Kafka request on a SASL listener: answered, then the connection closed."""
    from kafka.errors import KafkaError

    from kafka import KafkaAdminClient

    with pytest.raises((KafkaError, OSError, ValueError)):
        KafkaAdminClient(
            bootstrap_servers=f"127.0.0.1:{secured.ports['SASL_PLAINTEXT']}",
            request_timeout_ms=3000,
            api_version_auto_timeout_ms=3000,
        ).list_topics()
    assert secured.running


def test_metadata_advertises_the_listener_the_client_came_in_on(secured, pki):
    conf = _conf(
        secured,
        "SASL_SSL",
        pki,
        **{"sasl.mechanism": "PLAIN", "sasl.username": "admin", "sasl.password": "admin-secret"},
    )
    md = kadmin.AdminClient(conf).list_topics(timeout=10)
    (broker,) = md.brokers.values()
    assert broker.port == secured.ports["SASL_SSL"]


def test_kafka_python_over_tls_and_sasl(secured, pki):
    from kafka import KafkaConsumer, KafkaProducer

    topic = _topic("kp", secured)
    common = {
        "bootstrap_servers": f"127.0.0.1:{secured.ports['SASL_SSL']}",
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(pki["ca"].cert_path),
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "alice",
        "sasl_plain_password": "alice-secret",
    }
    producer = KafkaProducer(**common)
    for i in range(10):
        producer.send(topic, b"k%d" % i)
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(
        topic, auto_offset_reset="earliest", consumer_timeout_ms=10_000, **common
    )
    got = [m.value for m in consumer]
    consumer.close()
    assert got == [b"k%d" % i for i in range(10)]


async def test_aiokafka_over_tls(secured, pki):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context

    topic = _topic("aio", secured)
    ctx = create_ssl_context(cafile=str(pki["ca"].cert_path))
    bootstrap = f"127.0.0.1:{secured.ports['SSL']}"
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, security_protocol="SSL", ssl_context=ctx
    )
    await producer.start()
    try:
        for i in range(10):
            await producer.send_and_wait(topic, b"a%d" % i)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        security_protocol="SSL",
        ssl_context=ctx,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    got = []
    try:
        while len(got) < 10:
            batch = await consumer.getmany(timeout_ms=10_000)
            assert batch, "no records within 10 s"
            for records in batch.values():
                got += [r.value for r in records]
    finally:
        await consumer.stop()
    assert got == [b"a%d" % i for i in range(10)]


def _kcat_librdkafka() -> tuple[int, ...]:
    """The librdkafka version the installed kcat is built on, e.g. (2, 0, 2)."""
    out = subprocess.run(["kcat", "-V"], capture_output=True, text=True, timeout=10).stdout
    match = re.search(r"librdkafka (\d+)\.(\d+)\.(\d+)", out)
    assert match, out
    return tuple(int(g) for g in match.groups())


def _kcat_base(broker, pki, listener: str, mechanism: str, user: str, password: str):
    base = [
        "kcat",
        "-b",
        f"127.0.0.1:{broker.ports[listener]}",
        "-X",
        f"security.protocol={listener}",
        "-X",
        f"sasl.mechanism={mechanism}",
        "-X",
        f"sasl.username={user}",
        "-X",
        f"sasl.password={password}",
    ]
    if listener.endswith("SSL"):
        base += ["-X", f"ssl.ca.location={pki['ca'].cert_path}"]
    return base


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
@pytest.mark.parametrize(
    ("mechanism", "user", "password"),
    [
        ("PLAIN", "alice", "alice-secret"),
        ("SCRAM-SHA-256", "carol", "carol-secret"),
        ("SCRAM-SHA-512", "carol", "carol-secret"),
    ],
)
def test_kcat_over_sasl_ssl(secured, pki, mechanism, user, password):
    """kcat logs in and round-trips records; with SCRAM this is Debian 12's kcat
    (librdkafka 2.0.2), whose client-final message repeats its nonce (librdkafka #4895):
    Kafka 3.9 takes it, and so must the default listener here."""
    topic = _topic("kcat", secured)
    base = _kcat_base(secured, pki, "SASL_SSL", mechanism, user, password)
    data = "".join(f"line{i}\n" for i in range(5))
    subprocess.run([*base, "-P", "-t", topic], input=data.encode(), check=True, timeout=30)
    out = subprocess.run(
        [*base, "-C", "-t", topic, "-o", "beginning", "-e", "-q"],
        capture_output=True,
        check=True,
        timeout=30,
    )
    assert out.stdout.decode().split() == [f"line{i}" for i in range(5)]


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
@pytest.mark.parametrize("mechanism", SCRAM_MECHANISMS)
def test_strict_nonce_refuses_old_librdkafka_and_takes_a_fixed_one(secured, pki, mechanism):
    """SASL_PLAINTEXT has ``sasl.scram.strict.nonce``: Kafka 4's rule. The installed
    confluent-kafka (librdkafka >= 2.6.1) logs in there; a kcat on an older librdkafka
    is refused, and the broker's log says why."""
    conf = _conf(
        secured,
        "SASL_PLAINTEXT",
        pki,
        **{"sasl.mechanism": mechanism, "sasl.username": "carol", "sasl.password": "carol-secret"},
    )
    assert confluent_kafka.libversion()[1] >= 0x020601FF
    assert kadmin.AdminClient(conf).list_topics(timeout=10).brokers

    if _kcat_librdkafka() >= (2, 6, 1):
        pytest.skip("this kcat's librdkafka sends the exact nonce")
    base = _kcat_base(secured, pki, "SASL_PLAINTEXT", mechanism, "carol", "carol-secret")
    out = subprocess.run(
        [*base, "-L", "-m", "3"], capture_output=True, text=True, timeout=30, check=False
    )
    assert out.returncode != 0, out.stdout
    wait_for(
        lambda: "sasl.scram.strict.nonce" in secured.log_path.read_text(errors="replace"),
        "the broker to log the refused nonce",
        10,
    )


def _handshake_v0(s, mechanism: str) -> None:
    from kio.index import load_request_schema, load_response_schema
    from kio.serial import entity_reader

    from tests.kafka.test_kafka_listener import read_frame, request

    s.sendall(request(17, 0, load_request_schema(17, 0)(mechanism=mechanism), 3))
    frame = read_frame(s)
    resp = load_response_schema(17, 0)
    header, pos = entity_reader(resp.__header_schema__)(frame, 0)
    assert header.correlation_id == 3
    assert int(entity_reader(resp)(frame, pos)[0].error_code) == 0


@pytest.mark.parametrize("password", ["alice-secret", "guess"])
def test_sasl_handshake_v0_exchanges_raw_tokens(secured, password):
    """Handshake v0: the exchange goes on in raw size-prefixed tokens with no Kafka header
    (PLAIN's answer is an empty token), then Kafka's framing again; a wrong password gets
    no answer but the closed connection, as from Kafka."""
    import socket
    import struct

    from tests.kafka.test_kafka_listener import api_versions, read_frame

    with socket.create_connection(("127.0.0.1", secured.ports["SASL_PLAINTEXT"]), 10) as s:
        _handshake_v0(s, "PLAIN")
        token = b"\0alice\0" + password.encode()
        s.sendall(struct.pack(">i", len(token)) + token)
        if password == "guess":
            assert read_frame(s) is None  # closed, after the failure delay
            return
        assert read_frame(s) == b""  # the raw empty token
        assert api_versions(s, 4)[0] == 4  # Kafka framing, authenticated


def test_kafka_python_with_an_old_api_version_logs_in_with_handshake_v0(secured, monkeypatch):
    """kafka-python told a pre-1.0 broker version speaks SaslHandshake v0 and raw tokens."""
    from kafka.protocol import sasl

    from kafka import KafkaAdminClient

    raw_tokens: list[bytes] = []
    original = sasl.SaslBytesRequest.__init__

    def counted(self, data):
        raw_tokens.append(data)
        original(self, data)

    monkeypatch.setattr(sasl.SaslBytesRequest, "__init__", counted)

    topic = _topic("kp-v0", secured)
    admin = KafkaAdminClient(
        bootstrap_servers=f"127.0.0.1:{secured.ports['SASL_PLAINTEXT']}",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="alice",
        sasl_plain_password="alice-secret",
        api_version=(0, 11),
    )
    try:
        assert topic in admin.list_topics()
    finally:
        admin.close()
    assert raw_tokens, "the login went through raw tokens"
