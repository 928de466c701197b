"""A broker whose ``listeners`` secure only Kafka's door: the native port (``--port``)
takes the SASL_SSL listener's protocol and settings, the admin's ``logmq`` CLI logs in
there with -X, and a CLI pointed at the wrong kind of port says what it is.

Before, the native listener stayed PLAINTEXT with no login (anyone was ANONYMOUS there),
the admin's SASL settings got "the broker does not offer SASL", and the Kafka port
answered "body runs past the frame".
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from logmq.testing.certs import make_ca, make_cert
from tests.harness import BrokerProcess, free_port

DEADLINE = 60  # seconds for one CLI run


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    d = tmp_path_factory.mktemp("inherits")
    ca = make_ca(d / "pki")
    cert = make_cert(ca, d / "pki", "broker", sans=("127.0.0.1", "localhost"))
    broker = BrokerProcess(d / "data")
    broker.sasl_ssl_port = free_port()
    props = {
        # a PLAINTEXT Kafka listener for local tools, and the secured one: the native
        # listener takes after the one that authenticates
        "listeners": (
            f"PLAINTEXT://127.0.0.1:{broker.kafka_port},SASL_SSL://127.0.0.1:{broker.sasl_ssl_port}"
        ),
        "ssl.keystore.type": "PEM",
        "listener.name.sasl_ssl.ssl.keystore.location": str(cert.keystore_path),
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin",
    }
    for key, value in props.items():
        broker.extra_args += ["--override", f"{key}={value}"]
    broker.extra_args += ["--add-scram", "SCRAM-SHA-512=[name=admin,password=admin-secret]"]
    broker.ca = ca
    broker.start()
    yield broker
    broker.stop()


def logmq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOGMQ_")}
    return subprocess.run(
        [sys.executable, "-m", "logmq_cli.main", *args],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=DEADLINE,
    )


def admin_x(broker) -> list[str]:
    return [
        "-X", "security.protocol=SASL_SSL",
        "-X", f"ssl.ca.location={broker.ca.cert_path}",
        "-X", "sasl.mechanism=SCRAM-SHA-512",
        "-X", "sasl.username=admin",
        "-X", "sasl.password=admin-secret",
    ]  # fmt: skip


def test_the_start_log_says_what_the_native_listener_uses(secured):
    log = secured.log_path.read_text()
    assert (
        f"native listener NATIVE://127.0.0.1:{secured.port} (logmq clients, the logmq CLI, "
        "brokers): SASL_SSL (SCRAM-SHA-512), as Kafka listener SASL_SSL" in log
    )


def test_the_admin_cli_logs_in_on_the_native_listener(secured, tmp_path):
    made = logmq("topic", "create", "inherits", "-b", secured.bootstrap, *admin_x(secured))
    assert made.returncode == 0, made.stderr
    # the same with a Kafka tool's --command-config file
    config = tmp_path / "admin.properties"
    config.write_text(
        "security.protocol=SASL_SSL\n"
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={secured.ca.cert_path}\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        '  username="admin" password="admin-secret";\n'
    )
    listed = logmq("topic", "list", "--json", "-b", secured.bootstrap, "--command-config", config)
    assert listed.returncode == 0, listed.stderr
    assert "inherits" in listed.stdout
    # and with the environment
    env = {
        "LOGMQ_SECURITY_PROTOCOL": "SASL_SSL",
        "LOGMQ_SSL_CA_LOCATION": str(secured.ca.cert_path),
        "LOGMQ_SASL_MECHANISM": "SCRAM-SHA-512",
        "LOGMQ_SASL_USERNAME": "admin",
        "LOGMQ_SASL_PASSWORD": "admin-secret",
    }
    listed = logmq("topic", "list", "--json", "-b", secured.bootstrap, env=env)
    assert listed.returncode == 0 and "inherits" in listed.stdout, listed.stderr
    # -X wins over the environment: a wrong password given with -X fails
    wrong = logmq("topic", "list", "-b", secured.bootstrap, "-X", "sasl.password=no", env=env)
    assert wrong.returncode == 1 and "SASL_AUTHENTICATION_FAILED" in wrong.stderr


def test_an_anonymous_cli_is_refused_on_the_native_listener(secured):
    proc = logmq("topic", "list", "-b", secured.bootstrap)
    assert proc.returncode == 1
    assert f"{secured.bootstrap} speaks TLS, and this client is set for PLAINTEXT" in proc.stderr
    # TLS without a login: the listener says it wants one
    proc = logmq(
        "topic", "list", "-b", secured.bootstrap,
        "-X", "security.protocol=SSL", "-X", f"ssl.ca.location={secured.ca.cert_path}",
    )  # fmt: skip
    assert proc.returncode == 1
    assert "listener NATIVE is SASL_SSL and takes a SASL login (SCRAM-SHA-512" in proc.stderr


def test_the_cli_at_a_kafka_port_says_so_over_tls_and_sasl(secured):
    at = f"127.0.0.1:{secured.sasl_ssl_port}"
    proc = logmq("topic", "list", "-b", at, *admin_x(secured))
    assert proc.returncode == 1
    assert f"Error: NETWORK_EXCEPTION: {at} is a Kafka listener (over TLS)" in proc.stderr
    assert "body runs past the frame" not in proc.stderr
    # no settings at all, on the TLS Kafka port: a Kafka listener too
    proc = logmq("topic", "list", "-b", at)
    assert proc.returncode == 1 and f"{at} is a Kafka listener (over TLS)" in proc.stderr
    # TLS settings on the PLAINTEXT Kafka port
    proc = logmq("topic", "list", "-b", secured.kafka_bootstrap, *admin_x(secured))
    assert proc.returncode == 1
    assert f"{secured.kafka_bootstrap} is a Kafka listener;" in proc.stderr


def test_a_tls_cli_at_a_plaintext_native_port_says_it_is_not_tls(broker, tmp_path):
    ca = make_ca(tmp_path)
    proc = logmq(
        "topic", "list", "-b", broker.bootstrap,
        "-X", "security.protocol=SASL_SSL", "-X", f"ssl.ca.location={ca.cert_path}",
        "-X", "sasl.username=a", "-X", "sasl.password=b",
    )  # fmt: skip
    assert proc.returncode == 1
    assert f"{broker.bootstrap} does not speak TLS, and this client is set for SASL_SSL" in (
        proc.stderr
    )
    # SASL settings on a PLAINTEXT native listener: it takes no login
    proc = logmq(
        "topic", "list", "-b", broker.bootstrap,
        "-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.username=a",
    )  # fmt: skip
    assert proc.returncode == 1 and f"{broker.bootstrap} takes no SASL login" in proc.stderr


async def test_the_native_listener_advertises_its_advertised_listeners_entry(tmp_path):
    """advertised.listeners=NATIVE://... is what native Metadata names (it was --host)."""
    from logmq.client.cluster import ClusterClient
    from logmq.net.codec import ApiKey

    broker = BrokerProcess(tmp_path / "data")
    advertised = f"NATIVE://localhost:{broker.port}"
    broker.extra_args += ["--override", f"advertised.listeners={advertised}"]
    broker.start()
    try:
        cluster = ClusterClient(broker.bootstrap)
        try:
            answer = (await cluster.request_any(ApiKey.METADATA, {"topics": []})).body
        finally:
            await cluster.close()
        assert [(b["host"], b["port"]) for b in answer["brokers"]] == [("localhost", broker.port)]
    finally:
        broker.stop()
