"""OAUTHBEARER with confluent-kafka (a token it is given) and KIP-368 re-authentication:
a producer keeps producing across its session's end, logging in again on the same
connection; an expired token is refused."""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid

import pytest

from tests.harness import BrokerProcess, free_port

confluent_kafka = pytest.importorskip("confluent_kafka")
jwt = pytest.importorskip("jwt")
from cryptography.hazmat.primitives.asymmetric import rsa  # noqa: E402
from jwt.algorithms import RSAAlgorithm  # noqa: E402

JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret";'


@pytest.fixture(scope="module")
def key(tmp_path_factory):
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(RSAAlgorithm.to_jwk(private.public_key()))
    jwk.update(kid="k1", use="sig", alg="RS256")
    path = tmp_path_factory.mktemp("jwks") / "jwks.json"
    path.write_text(json.dumps({"keys": [jwk]}))
    return private, path


@pytest.fixture(scope="module")
def broker(key, tmp_path_factory):
    _, jwks = key
    port, metrics = free_port(), free_port()
    b = BrokerProcess(tmp_path_factory.mktemp("oauth") / "data", log_level="info")
    props = {
        "listeners": f"SASL_PLAINTEXT://127.0.0.1:{port}",
        "sasl.enabled.mechanisms": "PLAIN,OAUTHBEARER",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "sasl.oauthbearer.jwks.endpoint.url": jwks.as_uri(),
        "sasl.oauthbearer.expected.audience": "logmq",
        "connections.max.reauth.ms": "1500",
    }
    for k, v in props.items():
        b.extra_args += ["--override", f"{k}={v}"]
    b.extra_args += ["--metrics-port", str(metrics), "--auto-create-topics"]
    b.kafka_port = port
    b.metrics_port = metrics
    b.start()
    yield b
    b.stop()


def token(key, *, expires_in: float = 300, sub: str = "svc-orders") -> tuple[str, float]:
    private, _ = key
    exp = time.time() + expires_in
    claims = {"sub": sub, "aud": "logmq", "iat": int(time.time()), "exp": int(exp)}
    return jwt.encode(claims, private, algorithm="RS256", headers={"kid": "k1"}), exp


def logins(broker, outcome: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics").read()
    total = 0.0
    for line in text.decode().splitlines():
        if line.startswith("logmq_sasl_logins_total") and f'outcome="{outcome}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def produce(conf: dict, topic: str, seconds: float) -> tuple[int, list]:
    delivered = [0]
    errors: list = []

    def on_delivery(err, msg):
        if err is None:
            delivered[0] += 1
        else:
            errors.append(err)

    producer = confluent_kafka.Producer({**conf, "error_cb": errors.append, "linger.ms": 5})
    start = time.monotonic()
    sent = 0
    while time.monotonic() - start < seconds:
        producer.produce(topic, b"x", on_delivery=on_delivery)
        sent += 1
        producer.poll(0.01)
    producer.flush(30)
    assert delivered[0] == sent
    return sent, errors


def test_oauthbearer_with_a_token_confluent_kafka_is_given(broker, key):
    conf = {
        "bootstrap.servers": broker.kafka_bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "OAUTHBEARER",
        "oauth_cb": lambda _config: token(key),
    }
    before = logins(broker, "ok")
    sent, errors = produce(conf, f"oauth-{uuid.uuid4().hex[:6]}", 1.0)
    assert sent and not errors
    assert logins(broker, "ok") > before


def test_an_expired_token_is_refused(broker, key):
    errors: list = []
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": broker.kafka_bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER",
            # the JWT expired two minutes ago; librdkafka is told it is good for five
            "oauth_cb": lambda _config: (token(key, expires_in=-120)[0], time.time() + 300),
            "error_cb": errors.append,
        }
    )
    for _ in range(100):
        if errors:
            break
        producer.poll(0.1)
    assert errors, "the broker refused the expired token"
    assert any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors)
    log = broker.log_path.read_text()
    assert re.search(r"failed OAUTHBEARER login", log)


def test_a_session_ends_and_the_client_logs_in_again_on_its_connection(broker):
    """connections.max.reauth.ms=1500: a producer running for 5 s re-authenticates
    (KIP-368) without losing a record or an error."""
    conf = {
        "bootstrap.servers": broker.kafka_bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "alice",
        "sasl.password": "alice-secret",
    }
    before = logins(broker, "ok")
    sent, errors = produce(conf, f"reauth-{uuid.uuid4().hex[:6]}", 5.0)
    assert sent and not errors, errors
    # one login per connection to begin with, then one per session of 1.5 s
    assert logins(broker, "ok") - before >= 4
