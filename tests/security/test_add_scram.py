"""``--add-scram`` on a data directory that already holds a cluster (real brokers).

The first start writes the option's users with the cluster id (kafka-storage format's
behaviour). A later start given a user that does not exist creates it before its ready
line, through the controller; one that exists keeps its credential, and when the
option's password is not the stored one the broker says so once, at WARNING.
"""

from __future__ import annotations

import contextlib
import time

import pytest

from tests.harness import BrokerCluster, BrokerProcess, free_port

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import admin as kadmin  # noqa: E402

MECHANISMS = "SCRAM-SHA-256,SCRAM-SHA-512"


def _secure(broker: BrokerProcess) -> None:
    """A PLAINTEXT listener (the harness's) and a SASL_PLAINTEXT one offering SCRAM; the
    native listener stays PLAINTEXT (else it would take the SASL listener's protocol, and
    a cluster's brokers would need a login of their own on it)."""
    broker.sasl_port = free_port()
    listeners = (
        f"PLAINTEXT://127.0.0.1:{broker.kafka_port},SASL_PLAINTEXT://127.0.0.1:{broker.sasl_port}"
    )
    broker.extra_args += ["--override", f"listeners={listeners}"]
    broker.extra_args += ["--override", f"sasl.enabled.mechanisms={MECHANISMS}"]
    broker.extra_args += ["--override", "listener.security.protocol.map=NATIVE:PLAINTEXT"]


def _logs_in(broker: BrokerProcess, mechanism: str, user: str, password: str) -> bool:
    """Whether librdkafka logs in on the SASL listener (and gets Metadata), or is refused
    for its credentials; anything else fails the test at the deadline."""
    errors: list = []
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{broker.sasl_port}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": password,
            "error_cb": errors.append,
        }
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(confluent_kafka.KafkaException):
            producer.list_topics(timeout=0.5)
            return True
        producer.poll(0.1)  # delivers the errors
        if any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors):
            return False
    raise AssertionError(f"neither logged in nor refused: {errors}")


def _warnings(broker: BrokerProcess) -> list[str]:
    text = broker.log_path.read_text(errors="replace")
    return [line for line in text.splitlines() if "WARNING" in line and "--add-scram" in line]


def _credentials(broker: BrokerProcess, user: str) -> list[str]:
    admin = kadmin.AdminClient({"bootstrap.servers": broker.kafka_bootstrap})
    described = admin.describe_user_scram_credentials([user])[user].result(timeout=30)
    return sorted(info.mechanism.name for info in described.scram_credential_infos)


def _add(broker: BrokerProcess, spec: str) -> None:
    broker.extra_args += ["--add-scram", spec]


def _drop(broker: BrokerProcess, spec: str) -> None:
    i = broker.extra_args.index(spec)
    del broker.extra_args[i - 1 : i + 1]  # "--add-scram", spec


def test_a_new_user_on_an_existing_data_dir_is_created_and_logs_in(tmp_path):
    broker = BrokerProcess(tmp_path / "data")
    _secure(broker)
    _add(broker, "SCRAM-SHA-512=[name=admin,password=admin-secret]")
    broker.start()
    try:
        assert _logs_in(broker, "SCRAM-SHA-512", "admin", "admin-secret")
        broker.stop()
        # the same option again, and a new user (two mechanisms) besides
        _add(broker, "SCRAM-SHA-256=[name=bob,password=bob-secret]")
        _add(broker, "SCRAM-SHA-512=[name=bob,password=bob-secret]")
        broker.restart()
        assert _logs_in(broker, "SCRAM-SHA-256", "bob", "bob-secret")
        assert _logs_in(broker, "SCRAM-SHA-512", "bob", "bob-secret")
        assert not _logs_in(broker, "SCRAM-SHA-512", "bob", "wrong")
        assert _logs_in(broker, "SCRAM-SHA-512", "admin", "admin-secret")
        assert _credentials(broker, "bob") == ["SCRAM_SHA_256", "SCRAM_SHA_512"]
        # the admin's unchanged option has nothing to say
        assert _warnings(broker) == []
        log = broker.log_path.read_text(errors="replace")
        assert "created the SCRAM-SHA-256 user 'bob'" in log
        audited = [line for line in log.splitlines() if "credential of User:" in line]
        assert len(audited) == 2, audited  # logmq.audit, by the controller, once each
        for mechanism, line in zip(("SCRAM-SHA-256", "SCRAM-SHA-512"), audited, strict=True):
            assert f"{mechanism} credential of User:bob set (by the broker itself)" in line
    finally:
        broker.close()


def test_an_existing_user_keeps_its_credential_and_the_broker_says_so_once(tmp_path):
    broker = BrokerProcess(tmp_path / "data")
    _secure(broker)
    _add(broker, "SCRAM-SHA-512=[name=admin,password=admin-secret]")
    broker.start()
    try:
        broker.stop()
        _drop(broker, "SCRAM-SHA-512=[name=admin,password=admin-secret]")
        _add(broker, "SCRAM-SHA-512=[name=admin,password=new-secret]")
        broker.restart()
        warnings = _warnings(broker)
        assert len(warnings) == 1, warnings
        (warning,) = warnings
        assert "--add-scram SCRAM-SHA-512=[name=admin,...]" in warning
        assert "the existing credential is kept" in warning
        assert "logmq user add admin" in warning and "AlterUserScramCredentials" in warning
        assert "new-secret" not in broker.log_path.read_text(errors="replace")
        assert _logs_in(broker, "SCRAM-SHA-512", "admin", "admin-secret")
        assert not _logs_in(broker, "SCRAM-SHA-512", "admin", "new-secret")
    finally:
        broker.close()


def test_brokers_given_the_same_new_user_create_it_once(tmp_path):
    """Three brokers restarted with the same new ``--add-scram``: one of them writes it
    (keep_existing on the controller), none warns, and the password works on every one."""
    cluster = BrokerCluster(3, base_dir=tmp_path)
    for broker in cluster.nodes.values():
        _secure(broker)
    cluster.start()
    try:
        for broker in cluster.nodes.values():
            broker.stop()
            _add(broker, "SCRAM-SHA-512=[name=carol,password=carol-secret]")
        for broker in cluster.nodes.values():
            broker._fixed_port = True  # clients and peers keep their addresses
        cluster.start()
        for broker in cluster.nodes.values():
            assert _logs_in(broker, "SCRAM-SHA-512", "carol", "carol-secret")
            assert _warnings(broker) == []
        created = [
            node
            for node, broker in cluster.nodes.items()
            if "created the SCRAM-SHA-512 user 'carol'"
            in broker.log_path.read_text(errors="replace")
        ]
        assert len(created) == 1, created
        assert _credentials(cluster.nodes[1], "carol") == ["SCRAM_SHA_512"]
    finally:
        cluster.close()
