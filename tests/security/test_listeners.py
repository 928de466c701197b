"""The native listener's security when only the Kafka listeners are secured.

Kafka has one door, so a Kafka user secures ``listeners`` and thinks of no other port:
the native listener must then not stay PLAINTEXT with no login. These tests read the
settings the broker starts with (no processes); tests/docs/test_security_recipe.py runs
the same through real brokers and clients.
"""

from __future__ import annotations

import pytest

from logmq.errors import InvalidConfigError
from logmq.security.inter_broker import inter_broker_client_properties
from logmq.security.settings import SecuritySettings
from logmq.testing.certs import make_ca, make_cert

SCRAM_JAAS = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required "
    'username="broker" password="broker-secret";'
)
PLAIN_USERS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_a="a";'


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d)
    cert = make_cert(ca, d, "broker")
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(cert.keystore_path),
        "ssl.truststore.location": str(ca.cert_path),
    }


def settings(props: dict[str, str]) -> SecuritySettings:
    return SecuritySettings.from_properties(
        props, native=("127.0.0.1", 9192), kafka=("127.0.0.1", 9092)
    )


def test_without_secured_kafka_listeners_the_native_one_stays_plaintext():
    s = settings({"listeners": "PLAINTEXT://127.0.0.1:9092"})
    assert (s.native.protocol, s.native.inherited_from) == ("PLAINTEXT", None)
    assert "PLAINTEXT" in s.native_summary()


def test_the_native_listener_takes_the_first_authenticating_kafka_listener(tls):
    s = settings(
        {
            **tls,
            # SSL without client certificates authenticates no one: SASL_SSL is the model
            "listeners": "PLAINTEXT://:9092,SSL://:9093,SASL_SSL://:9094",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": SCRAM_JAAS,
        }
    )
    native = s.native
    assert (native.host, native.port) == ("127.0.0.1", 9192)  # --host:--port still
    assert (native.protocol, native.inherited_from) == ("SASL_SSL", "SASL_SSL")
    sec = s.of(native.name)
    assert sec.mechanisms == ("SCRAM-SHA-512",) and sec.tls is not None
    # the Kafka listener's prefixed settings are the native listener's too
    assert s.properties["listener.name.native.scram-sha-512.sasl.jaas.config"] == SCRAM_JAAS
    summary = s.native_summary()
    assert "SASL_SSL (SCRAM-SHA-512)" in summary and "Kafka listener SASL_SSL" in summary


def test_tls_with_client_certificates_authenticates_and_tls_alone_still_counts(tls):
    s = settings(
        {
            **tls,
            "listeners": "SSL://:9093,OTHER://:9094",
            "listener.security.protocol.map": "OTHER:SSL",
            "listener.name.other.ssl.client.auth": "required",
        }
    )
    assert s.native.inherited_from == "OTHER"
    assert s.of("NATIVE").tls.settings.client_auth == "required"
    s = settings({**tls, "listeners": "PLAINTEXT://:9092,SSL://:9093"})
    assert (s.native.protocol, s.native.inherited_from) == ("SSL", "SSL")


def test_a_native_listener_named_in_listeners_inherits_too_unless_mapped(tls):
    props = {
        **tls,
        "listeners": "SASL_SSL://:9093,NATIVE://:9192",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": (
            'org.apache.kafka.common.security.plain.PlainLoginModule required user_a="a";'
        ),
    }
    s = settings(props)
    assert (s.native.host, s.native.protocol) == ("", "SASL_SSL")
    assert s.of("NATIVE").plain_users is not None  # PLAIN's users came along
    s = settings({**props, "listener.security.protocol.map": "NATIVE:SSL,SASL_SSL:SASL_SSL"})
    assert (s.native.protocol, s.native.inherited_from) == ("SSL", None)
    assert "listener.security.protocol.map names it" in s.native_summary()


def test_own_prefixed_settings_win_over_inherited_ones(tls, tmp_path):
    other = make_cert(make_ca(tmp_path), tmp_path, "native-only")
    s = settings(
        {
            **tls,
            "listeners": "SSL://:9093",
            "listener.name.ssl.ssl.keystore.location": tls["ssl.keystore.location"],
            "listener.name.native.ssl.keystore.location": str(other.keystore_path),
        }
    )
    assert s.of("NATIVE").tls.settings.keystore_location == str(other.keystore_path)


def test_a_native_listener_clients_cannot_log_in_to_is_warned_about(tmp_path):
    jwks = tmp_path / "jwks.json"
    jwks.write_text('{"keys": []}')
    s = settings(
        {
            "listeners": "SASL_PLAINTEXT://:9093",
            "sasl.enabled.mechanisms": "OAUTHBEARER",
            "sasl.oauthbearer.jwks.endpoint.url": str(jwks),
        }
    )
    assert s.native.protocol == "SASL_PLAINTEXT"
    (warning,) = [w for w in s.warnings() if "cannot use" in w]
    assert "listener.security.protocol.map=NATIVE:<protocol>" in warning


def test_a_single_broker_needs_no_login_of_its_own(tls):
    s = settings(
        {**tls, "listeners": "SASL_SSL://:9093", "sasl.enabled.mechanisms": "SCRAM-SHA-512"}
    )
    assert inter_broker_client_properties(s, s.properties, replicated=False) is None


def test_a_cluster_without_the_brokers_login_refuses_naming_the_setting(tls):
    s = settings(
        {**tls, "listeners": "SASL_SSL://:9093", "sasl.enabled.mechanisms": "SCRAM-SHA-512"}
    )
    with pytest.raises(InvalidConfigError) as e:
        inter_broker_client_properties(s, s.properties, replicated=True)
    msg = str(e.value)
    assert "Kafka listener SASL_SSL" in msg and "PLAIN is not enabled" in msg
    assert "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512" in msg
    assert "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config" in msg


def test_a_cluster_login_takes_the_inherited_jaas_and_mechanism(tls):
    s = settings(
        {
            **tls,
            "listeners": "SASL_SSL://:9093",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": SCRAM_JAAS,
        }
    )
    client = inter_broker_client_properties(s, s.properties, replicated=True)
    assert client is not None and client["security.protocol"] == "SASL_SSL"
    assert (client["sasl.mechanism"], client["sasl.username"]) == ("SCRAM-SHA-512", "broker")


def test_a_cluster_login_with_a_mechanism_not_enabled_is_refused(tls):
    s = settings(
        {
            **tls,
            "listeners": "SASL_SSL://:9093",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "sasl.jaas.config": SCRAM_JAAS,  # PLAIN (the default inter-broker one) is not on
        }
    )
    with pytest.raises(InvalidConfigError, match="PLAIN is not enabled"):
        inter_broker_client_properties(s, s.properties, replicated=True)
    s = settings(
        {
            **tls,
            "listeners": "SASL_SSL://:9093",
            "sasl.enabled.mechanisms": "PLAIN",
            "sasl.jaas.config": PLAIN_USERS,
        }
    )
    with pytest.raises(InvalidConfigError, match="no username is set for PLAIN"):
        inter_broker_client_properties(s, s.properties, replicated=True)


def test_a_cluster_over_tls_needs_a_truststore(tls):
    props = {k: v for k, v in tls.items() if "truststore" not in k}
    s = settings({**props, "listeners": "SSL://:9093"})
    with pytest.raises(InvalidConfigError, match=r"ssl\.truststore\.location"):
        inter_broker_client_properties(s, s.properties, replicated=True)
    assert inter_broker_client_properties(s, s.properties, replicated=False) is not None
