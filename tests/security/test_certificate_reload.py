"""A broker's TLS certificate is replaced on disk: new connections get the new one
without a restart; a broken file keeps the old one serving."""

from __future__ import annotations

import os
import socket
import ssl
import time

from logmq.testing.certs import make_ca, make_cert
from tests.harness import BrokerProcess, free_port


def served_certificate(port: int, ca_path: str) -> bytes:
    ctx = ssl.create_default_context(cafile=ca_path)
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    with raw, ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        return tls.getpeercert(binary_form=True)


def start_with_ssl(tmp_path, props: dict[str, str]) -> tuple[BrokerProcess, int]:
    """A broker with an SSL listener beside PLAINTEXT, looking at its PEM files every
    200 ms; the broker and the SSL port."""
    ssl_port = free_port()
    broker = BrokerProcess(tmp_path / "data", log_level="info")
    props = {
        "listeners": f"PLAINTEXT://127.0.0.1:{broker.kafka_port},SSL://127.0.0.1:{ssl_port}",
        "ssl.keystore.type": "PEM",
        "ssl.reload.check.interval.ms": "200",
        **props,
    }
    for key, value in props.items():
        broker.extra_args += ["--override", f"{key}={value}"]
    broker.start()
    return broker, ssl_port


def test_a_rotated_certificate_is_served_without_a_restart(tmp_path):
    ca = make_ca(tmp_path / "pki")
    first = make_cert(ca, tmp_path / "pki", "127.0.0.1", file_stem="first")
    second = make_cert(ca, tmp_path / "pki", "127.0.0.1", file_stem="second")
    live = tmp_path / "pki" / "broker-keystore.pem"
    live.write_bytes(first.keystore_path.read_bytes())
    broker, ssl_port = start_with_ssl(tmp_path, {"ssl.keystore.location": str(live)})
    try:
        before = served_certificate(ssl_port, str(ca.cert_path))
        # replaced atomically, as operators (and cert-manager) do
        tmp = live.with_suffix(".tmp")
        tmp.write_bytes(second.keystore_path.read_bytes())
        os.replace(tmp, live)
        deadline = time.monotonic() + 20
        after = before
        while after == before and time.monotonic() < deadline:
            time.sleep(0.2)  # the broker looks at the files every 200 ms
            after = served_certificate(ssl_port, str(ca.cert_path))
        assert after != before, "the new certificate is served"
        # a half-written file: the broker says so and keeps serving the certificate it has
        live.write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot a key")
        deadline = time.monotonic() + 20
        while "keeps its TLS certificates" not in broker.log_path.read_text():
            assert time.monotonic() < deadline, "the broken keystore was never noticed"
            time.sleep(0.1)  # polling the log for the broker's next look at the files
        assert served_certificate(ssl_port, str(ca.cert_path)) == after
    finally:
        broker.stop()


def test_a_rotated_truststore_admits_the_new_cas_clients_without_a_restart(tmp_path):
    """mTLS with ``ssl.client.auth=required``: a client whose CA the truststore does not
    hold is refused; once the truststore file gains that CA, it is let in."""
    pki = tmp_path / "pki"
    ca = make_ca(pki)
    server = make_cert(ca, pki, "127.0.0.1")
    new_ca = make_ca(pki / "new", "new-ca")
    client = make_cert(new_ca, pki / "new", "alice", server=False)
    truststore = pki / "truststore.pem"
    truststore.write_bytes(ca.cert_path.read_bytes())
    props = {
        "ssl.keystore.location": str(server.keystore_path),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(truststore),
        "ssl.client.auth": "required",
    }
    broker, ssl_port = start_with_ssl(tmp_path, props)

    def handshake() -> bool:
        """Does an ApiVersions request over mTLS with ``client``'s certificate get an answer?"""
        from tests.kafka.test_kafka_listener import api_versions

        ctx = ssl.create_default_context(cafile=str(ca.cert_path))
        ctx.load_cert_chain(str(client.chain_path), str(client.key_path))
        raw = socket.create_connection(("127.0.0.1", ssl_port), timeout=10)
        try:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                # TLS 1.3: the server checks the client's certificate after the client
                # thinks the handshake is done; a refusal shows on the first read
                return api_versions(tls, 5)[0] == 5
        except (ssl.SSLError, ConnectionError, AssertionError):
            return False
        finally:
            raw.close()

    try:
        assert not handshake(), "a client of a CA the broker does not trust is refused"
        tmp = truststore.with_suffix(".tmp")
        tmp.write_bytes(ca.cert_path.read_bytes() + new_ca.cert_path.read_bytes())
        os.replace(tmp, truststore)
        deadline = time.monotonic() + 20
        while not handshake():
            assert time.monotonic() < deadline, "the new CA was never trusted"
            time.sleep(0.2)  # the broker looks at the files every 200 ms
    finally:
        broker.stop()
