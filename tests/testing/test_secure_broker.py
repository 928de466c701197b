"""logmq.testing's secured brokers (issue 28): ``LogmqBroker(security=...)`` makes its own
CA and users, and ``client_config()`` / ``kafka_python_config()`` are all a real Kafka
client needs to produce and consume through TLS and SASL, or to be refused."""

from __future__ import annotations

import time

import pytest

from logmq.testing import LogmqBroker

ck = pytest.importorskip("confluent_kafka")
pytest.importorskip("cryptography")

USERS = {"admin": "admin-secret", "bob": "bob-secret"}


@pytest.fixture(scope="module")
def secured():
    """SASL_SSL with SCRAM-SHA-512 and the authorizer on: admin is a super user, bob has
    no ACLs."""
    with LogmqBroker(security="SASL_SSL", users=USERS, acls=True) as b:
        yield b


def _produce(conf: dict, topic: str, values: list[bytes]) -> list:
    """Each record's delivery error (None: delivered)."""
    errors: list = []
    producer = ck.Producer({**conf, "message.timeout.ms": 10_000, "enable.idempotence": False})
    for value in values:
        producer.produce(topic, value, on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(30)
    return errors


def _consume(conf: dict, topic: str, count: int) -> list[bytes]:
    consumer = ck.Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append(msg.value())
    finally:
        consumer.close()
    return got


def test_the_ready_line_names_every_kafka_listener(secured):
    (node,) = secured.nodes
    assert set(node.listeners) == {"PLAINTEXT", "SASL_SSL"}
    assert node.listeners["PLAINTEXT"] == node.bootstrap_servers
    assert secured.secure_bootstrap_servers == node.listeners["SASL_SSL"]
    assert secured.secure_bootstrap_servers != secured.bootstrap_servers


def test_client_config_and_kafka_python_config(secured):
    ca = str(secured.ca_path)
    assert secured.ca_path.read_text().startswith("-----BEGIN CERTIFICATE-----")
    assert secured.client_config() == {
        "bootstrap.servers": secured.secure_bootstrap_servers,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": ca,
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "admin",
        "sasl.password": "admin-secret",
    }
    assert secured.kafka_python_config("bob") == {
        "bootstrap_servers": secured.secure_bootstrap_servers,
        "security_protocol": "SASL_SSL",
        "ssl_cafile": ca,
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "bob",
        "sasl_plain_password": "bob-secret",
    }
    with pytest.raises(KeyError):
        secured.client_config("nobody")


def test_confluent_kafka_produces_and_consumes_over_sasl_ssl(secured):
    topic = secured.create_topic("secured-ck", partitions=2)
    values = [b"v%d" % i for i in range(10)]
    assert _produce(secured.client_config(), topic, values) == [None] * 10
    assert sorted(_consume(secured.client_config(), topic, 10)) == sorted(values)


def test_kafka_python_produces_and_consumes_over_sasl_ssl(secured):
    kafka = pytest.importorskip("kafka")
    topic = secured.create_topic("secured-kp")
    conf = secured.kafka_python_config()
    producer = kafka.KafkaProducer(**conf)
    try:
        for i in range(5):
            producer.send(topic, b"kp%d" % i).get(timeout=30)
    finally:
        producer.close()
    consumer = kafka.KafkaConsumer(
        topic, **conf, auto_offset_reset="earliest", consumer_timeout_ms=10_000
    )
    try:
        got = [next(consumer).value for _ in range(5)]
    finally:
        consumer.close()
    assert got == [b"kp%d" % i for i in range(5)]


async def test_aiokafka_config_produces_over_sasl_ssl(secured):
    aiokafka = pytest.importorskip("aiokafka")
    topic = await secured.acreate_topic("secured-aio")
    producer = aiokafka.AIOKafkaProducer(**secured.aiokafka_config())
    await producer.start()
    try:
        meta = await producer.send_and_wait(topic, b"aio")
    finally:
        await producer.stop()
    assert meta.offset == 0


def test_a_wrong_password_is_refused(secured):
    errors: list = []
    producer = ck.Producer({**secured.client_config(password="guess"), "error_cb": errors.append})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors):
            break
        producer.poll(0.1)
    assert any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors), errors
    del producer


def test_kafka_python_with_a_wrong_password_is_refused(secured):
    """kafka-python retries a failed login until its timeout, then gives up bootstrapping
    (its log has SaslAuthenticationFailedError); the right password gets through."""
    kafka = pytest.importorskip("kafka")
    from kafka.errors import KafkaTimeoutError

    with pytest.raises(KafkaTimeoutError, match="bootstrap"):
        kafka.KafkaAdminClient(
            **secured.kafka_python_config("bob", password="guess"), bootstrap_timeout_ms=3000
        )
    admin = kafka.KafkaAdminClient(**secured.kafka_python_config("bob"), request_timeout_ms=10_000)
    admin.close()


def test_a_user_without_acls_is_refused_and_the_super_user_is_not(secured):
    topic = secured.create_topic("secured-acl")  # on the helper's PLAINTEXT listener
    denied = _produce(secured.client_config("bob"), topic, [b"x", b"y"])
    assert denied and all(
        e is not None and e.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED for e in denied
    ), denied
    assert _produce(secured.client_config("admin"), topic, [b"z"]) == [None]


@pytest.mark.parametrize(("security", "mechanism"), [("SSL", "PLAIN"), ("SASL_PLAINTEXT", "PLAIN")])
def test_the_other_protocols_and_plain(security, mechanism):
    with LogmqBroker(security=security, mechanism=mechanism) as broker:
        conf = broker.client_config()
        assert conf["security.protocol"] == security
        assert ("ssl.ca.location" in conf) == (security == "SSL")
        assert ("sasl.username" in conf) == (security == "SASL_PLAINTEXT")
        if security == "SASL_PLAINTEXT":
            assert (conf["sasl.username"], conf["sasl.password"]) == ("test", "test-secret")
        topic = broker.create_topic("other")
        assert _produce(conf, topic, [b"a", b"b"]) == [None, None]
        assert sorted(_consume(conf, topic, 2)) == [b"a", b"b"]
        ca_path = broker.ca_path
    assert broker.ca_path is None
    assert ca_path is None or not ca_path.exists()  # removed with the temp dir


def test_without_security_the_configs_name_the_plaintext_listener():
    with LogmqBroker() as broker:
        assert broker.secure_bootstrap_servers == broker.bootstrap_servers
        assert broker.client_config() == {"bootstrap.servers": broker.bootstrap_servers}
        assert broker.kafka_python_config() == {"bootstrap_servers": broker.bootstrap_servers}
        assert set(broker.nodes[0].listeners) == {"PLAINTEXT"}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"security": "KERBEROS"},
        {"security": "SASL_SSL", "mechanism": "GSSAPI"},
        {"security": "SASL_SSL", "users": {}},
        {"security": "SSL", "acls": True},
        {"acls": True},
        {"security": "SASL_SSL", "users": {"a b": "x"}},
        {"security": "SASL_SSL", "users": {"a": 'say "hi"'}},
    ],
)
def test_settings_that_cannot_work_are_refused_before_anything_starts(kwargs):
    with pytest.raises(ValueError):
        LogmqBroker(**kwargs)


def test_the_logmq_secure_broker_fixture(logmq_secure_broker):
    conf = logmq_secure_broker.client_config()
    assert conf["security.protocol"] == "SASL_SSL"
    assert conf["sasl.mechanism"] == "SCRAM-SHA-512"
    assert (conf["sasl.username"], conf["sasl.password"]) == ("test", "test-secret")
    topic = logmq_secure_broker.create_topic("fixture-secured")
    assert _produce(conf, topic, [b"f"]) == [None]
    assert _consume(conf, topic, 1) == [b"f"]
