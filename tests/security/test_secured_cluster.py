"""A 3-broker cluster whose Kafka listeners are SASL_SSL only survives a leader kill -9.

Each broker registers its SASL_SSL endpoint by listener name, so Metadata sends clients
to the other brokers' SASL_SSL ports; after the leader is killed the client follows the
new leader over TLS and SASL and loses no acknowledged record.
"""

from __future__ import annotations

import pytest

from logmq.testing.certs import make_ca, make_cert
from tests.harness import BrokerCluster, free_port

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import admin as kadmin  # noqa: E402

# the brokers log in to each other as "broker" on the native listener, which takes the
# SASL_SSL listener's protocol and settings (docs/security.md)
JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="broker" password="broker-secret" '
    'user_broker="broker-secret" user_app="app-secret";'
)


def test_a_sasl_ssl_cluster_keeps_acknowledged_records_across_a_leader_kill(tmp_path):
    ca = make_ca(tmp_path / "pki")
    cert = make_cert(ca, tmp_path / "pki", "127.0.0.1")
    cluster = BrokerCluster(
        3,
        base_dir=tmp_path / "cluster",
        log_level="warning",
        extra_args=["--broker-session-timeout-ms", "2000"],
    )
    common = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(cert.keystore_path),
        "ssl.truststore.location": str(ca.cert_path),
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
    }
    for node in cluster.nodes.values():
        port = free_port()
        props = {**common, "listeners": f"SASL_SSL://127.0.0.1:{port}"}
        for key, value in props.items():
            node.extra_args += ["--override", f"{key}={value}"]
        node.kafka_port = port
    cluster.start()
    try:
        conf = {
            "bootstrap.servers": ",".join(n.kafka_bootstrap for n in cluster.nodes.values()),
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(ca.cert_path),
            "sasl.mechanism": "PLAIN",
            "sasl.username": "app",
            "sasl.password": "app-secret",
        }
        admin = kadmin.AdminClient(conf)
        admin.create_topics([kadmin.NewTopic("orders", 1, 3)])["orders"].result(timeout=30)
        md = admin.list_topics(timeout=10)
        ports = {b.id: b.port for b in md.brokers.values()}
        assert ports == {i: n.kafka_port for i, n in cluster.nodes.items()}

        producer = confluent_kafka.Producer(
            {**conf, "acks": "all", "enable.idempotence": True, "linger.ms": 5}
        )

        def send(start: int, n: int) -> None:
            failed: list = []
            for i in range(start, start + n):
                producer.produce(
                    "orders", b"%d" % i, on_delivery=lambda e, m: e and failed.append(e)
                )
            assert producer.flush(60) == 0
            assert failed == []

        send(0, 100)
        leader = admin.list_topics("orders", timeout=10).topics["orders"].partitions[0].leader
        cluster.nodes[leader].kill()
        send(100, 100)  # after the failover, through the new leader's SASL_SSL port

        consumer = confluent_kafka.Consumer(
            {**conf, "group.id": "audit", "auto.offset.reset": "earliest"}
        )
        consumer.subscribe(["orders"])
        got: set[bytes] = set()
        try:
            for _ in range(600):
                if len(got) >= 200:
                    break
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    got.add(msg.value())
        finally:
            consumer.close()
        assert got == {b"%d" % i for i in range(200)}
    finally:
        cluster.close()


def test_the_metadata_quorum_speaks_mutual_tls(tmp_path):
    """controller.listener.names mapped to SSL: the Raft port takes only peers with a
    certificate the truststore signs; the quorum forms and a topic is created."""
    import socket
    import ssl

    from logmq.client.admin import NewTopic
    from logmq.client.sync import Admin

    ca = make_ca(tmp_path / "pki")
    cert = make_cert(ca, tmp_path / "pki", "127.0.0.1")
    other = make_ca(tmp_path / "other", "rogue-ca")
    rogue = make_cert(other, tmp_path / "other", "127.0.0.1")
    props = {
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "CONTROLLER:SSL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(cert.keystore_path),
        "ssl.truststore.location": str(ca.cert_path),
    }
    args: list[str] = []
    for key, value in props.items():
        args += ["--override", f"{key}={value}"]
    cluster = BrokerCluster(3, base_dir=tmp_path / "cluster", log_level="warning", extra_args=args)
    cluster.start()
    try:
        with Admin(cluster.bootstrap) as admin:
            admin.create_topics([NewTopic("raft-tls", 1, 3)])
            assert "raft-tls" in admin.list_topics()
        # a stranger's certificate is refused at the handshake
        raft_port = int(cluster.voters.split(",")[0].rsplit(":", 1)[1])
        ctx = ssl.create_default_context(cafile=str(ca.cert_path))
        ctx.load_cert_chain(str(rogue.keystore_path))
        raw = socket.create_connection(("127.0.0.1", raft_port), timeout=10)
        with raw, pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            tls = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
            tls.sendall(b"\x00\x00\x00\x04junk")
            assert tls.recv(1) == b""  # refused after the handshake at the latest
            raise ConnectionError("closed")
        with Admin(cluster.bootstrap) as admin:
            assert "raft-tls" in admin.list_topics()
    finally:
        cluster.close()
