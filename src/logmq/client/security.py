"""How a native client reaches a secured listener: TLS and a SASL login.

Settings take librdkafka's property names (``security.protocol``, ``ssl.ca.location``,
``ssl.certificate.location``, ``ssl.key.location``, ``ssl.key.password``,
``ssl.endpoint.identification.algorithm``, ``sasl.mechanism``, ``sasl.username``,
``sasl.password``), so one dict configures a confluent-kafka client and a logmq one; the
Java client's names for the same things (PEM ``ssl.truststore.location``,
``ssl.keystore.location``, ``sasl.jaas.config``) too, so a kafka-*.sh ``--command-config``
file works unchanged. The CLI reads them from ``LOGMQ_SECURITY_PROTOCOL``-style
environment variables too.
The login is the Kafka exchange over the native door's SaslHandshake and
SaslAuthenticate (native/sasl_api.py): PLAIN and SCRAM-SHA-256/512.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from logmq.errors import ErrorCode, LogMQError
from logmq.net.codec import ApiKey
from logmq.security.sasl import parse_jaas_config
from logmq.security.scram import SCRAM_MECHANISMS, ScramClient

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
PROPERTIES = (
    "security.protocol",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
    "sasl.mechanism",
    "sasl.username",
    "sasl.password",
)
# Kafka's Java client names, read as the librdkafka ones above (java_names)
JAVA_PROPERTIES = (
    "ssl.truststore.location",
    "ssl.truststore.type",
    "ssl.keystore.location",
    "ssl.keystore.type",
    "sasl.jaas.config",
)


class AuthenticationError(LogMQError):
    code = ErrorCode.SASL_AUTHENTICATION_FAILED


@dataclass(frozen=True)
class ClientSecurity:
    protocol: str = "PLAINTEXT"
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False)
    check_hostname: bool = True
    sasl_mechanism: str = "PLAIN"
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> ClientSecurity:
        """From librdkafka's property names (or the Java client's, ``java_names``);
        ValueError names a wrong one."""
        props = java_names(props)
        protocol = str(props.get("security.protocol", "PLAINTEXT")).upper()
        if protocol not in PROTOCOLS:
            raise ValueError(f"security.protocol: {protocol!r} is not one of {PROTOCOLS}")
        context = None
        if protocol in ("SSL", "SASL_SSL"):
            context = ssl.create_default_context(cafile=props.get("ssl.ca.location") or None)
            cert = props.get("ssl.certificate.location")
            if cert:
                context.load_cert_chain(
                    cert, props.get("ssl.key.location") or None, props.get("ssl.key.password")
                )
        check = str(props.get("ssl.endpoint.identification.algorithm", "https")).lower()
        mechanism = str(props.get("sasl.mechanism", "PLAIN")).upper()
        if protocol.startswith("SASL") and mechanism not in ("PLAIN", *SCRAM_MECHANISMS):
            raise ValueError(f"sasl.mechanism: {mechanism!r} (logmq's clients: PLAIN, SCRAM)")
        if protocol.startswith("SASL") and not props.get("sasl.username"):
            raise ValueError("sasl.username is required with " + protocol)
        if context is not None and check in ("", "none"):
            context.check_hostname = False
        return cls(
            protocol,
            context,
            check not in ("", "none"),
            mechanism,
            props.get("sasl.username"),
            props.get("sasl.password"),
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClientSecurity | None:
        """``LOGMQ_SECURITY_PROTOCOL``, ``LOGMQ_SSL_CA_LOCATION``, ``LOGMQ_SASL_USERNAME``...
        (each property upper-cased, dots as underscores); None when none is set."""
        env = os.environ if environ is None else environ
        props = {
            key: env[name]
            for key in PROPERTIES
            if (name := "LOGMQ_" + key.upper().replace(".", "_")) in env
        }
        return cls.from_properties(props) if props else None


def java_names(props: Mapping[str, Any]) -> dict[str, Any]:
    """``props`` with the Java client's names read as librdkafka's: a PEM truststore is
    ``ssl.ca.location``, a PEM keystore (key and chain in one file) the client
    certificate, and the ``username``/``password`` options of ``sasl.jaas.config`` the
    SASL login. librdkafka's own names win when both are given."""
    out = {k: v for k, v in props.items() if k not in JAVA_PROPERTIES}
    for kind in ("truststore", "keystore"):
        store_type = str(props.get(f"ssl.{kind}.type") or "PEM").upper()
        if props.get(f"ssl.{kind}.location") and store_type != "PEM":
            raise ValueError(
                f"ssl.{kind}.type {store_type}: logmq's clients read PEM files; convert the "
                f"{kind} to PEM (openssl pkcs12 -in FILE -nodes, or keytool -exportcert -rfc)"
            )
    if props.get("ssl.truststore.location"):
        out.setdefault("ssl.ca.location", props["ssl.truststore.location"])
    if props.get("ssl.keystore.location"):
        out.setdefault("ssl.certificate.location", props["ssl.keystore.location"])
        out.setdefault("ssl.key.location", props["ssl.keystore.location"])
    jaas = props.get("sasl.jaas.config")
    if jaas:
        try:
            options = parse_jaas_config(str(jaas)).options
        except ValueError as e:
            raise ValueError(f"sasl.jaas.config: {e}") from None
        for option in ("username", "password"):
            if option in options:
                out.setdefault(f"sasl.{option}", options[option])
    return out


async def login(conn: Any, security: ClientSecurity) -> None:
    """The SASL exchange on a fresh connection (``conn.request``); raises on failure."""
    mechanism = security.sasl_mechanism
    resp = await _call(conn, ApiKey.SASL_HANDSHAKE, {"mechanism": mechanism})
    if resp.get("error"):
        offered = ", ".join(resp.get("mechanisms") or [])
        where = f"{getattr(conn, 'host', '?')}:{getattr(conn, 'port', '?')}"
        if not offered:
            raise AuthenticationError(
                f"{where} takes no SASL login (a PLAINTEXT or SSL listener): set "
                "security.protocol to PLAINTEXT or SSL for it, or give the broker's SASL port"
            )
        raise AuthenticationError(
            f"the broker at {where} does not offer SASL {mechanism} (it offers {offered})"
        )
    user, password = security.sasl_username or "", security.sasl_password or ""
    if mechanism == "PLAIN":
        await _step(conn, f"\0{user}\0{password}".encode())
        return
    client = ScramClient(mechanism, user, password)
    server_first = await _step(conn, client.first())
    server_final = await _step(conn, client.final(server_first))
    client.verify(server_final)


async def _step(conn: Any, data: bytes) -> bytes:
    resp = await _call(conn, ApiKey.SASL_AUTHENTICATE, {"auth_bytes": data})
    if resp.get("error"):
        raise AuthenticationError(resp.get("message") or "SASL authentication failed")
    return bytes(resp.get("auth_bytes") or b"")


async def _call(conn: Any, api_key: int, body: dict[str, Any]) -> dict[str, Any]:
    fut = conn.send(api_key, body)
    resp = await fut
    return resp.body
