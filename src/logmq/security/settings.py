"""The broker's security settings, read once from Kafka's property names.

What each listener demands (TLS, SASL and which mechanisms, client certificates), who
the super users are, whether ACLs are enforced, and the session rules of KIP-368. Built
at start from ``BrokerConfig.properties`` so a bad setting stops the broker with a message
naming the property, before it listens anywhere. docs/security.md lists every property.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from logmq.errors import InvalidConfigError
from logmq.security.listeners import (
    Listener,
    advertised_endpoints,
    inherited_settings,
    listener_setting,
    mapped_protocols,
    parse_listeners,
    protocol_map,
)
from logmq.security.oauthbearer import OAuthBearerConfig, OAuthBearerValidator
from logmq.security.sasl import MECHANISMS, PlainUsers, parse_jaas_entries
from logmq.security.tls import (
    CertificateReloader,
    NoMatchingRuleError,
    PrincipalMapper,
    TlsSettings,
    client_context,
    principal_from_peer_cert,
    server_context,
)

log = logging.getLogger("logmq.security")

# authorizer.class.name values that turn ACLs on (Kafka's two and logmq's own)
AUTHORIZERS = frozenset(
    {
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "kafka.security.authorizer.AclAuthorizer",
        "logmq",
    }
)
DEFAULT_FAILED_AUTH_DELAY_MS = 100
CLIENT_MECHANISMS = frozenset(
    {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}
)  # logmq's clients  # Kafka's connection.failed.authentication.delay.ms


@dataclass(slots=True)
class ListenerSecurity:
    """What one listener requires of a connection, and what it checks it with."""

    listener: Listener
    tls: CertificateReloader | None = None
    principal_mapper: PrincipalMapper | None = None
    mechanisms: tuple[str, ...] = ()  # SASL mechanisms offered, in Kafka's order
    plain_users: PlainUsers | None = None
    oauth: OAuthBearerValidator | None = None
    # logmq's sasl.scram.strict.nonce: refuse the repeated client nonce of librdkafka < 2.6.1
    scram_strict_nonce: bool = False

    @property
    def name(self) -> str:
        return self.listener.name


@dataclass(slots=True)
class SecuritySettings:
    listeners: list[Listener]
    per_listener: dict[str, ListenerSecurity]
    advertised: dict[str, tuple[str, int]] = field(default_factory=dict)
    inter_broker_listener: str = "NATIVE"
    acls_enabled: bool = False
    super_users: frozenset[str] = frozenset()
    allow_everyone_if_no_acl_found: bool = True
    max_reauth_ms: int | None = None  # connections.max.reauth.ms; None: sessions never end
    failed_auth_delay_ms: int = DEFAULT_FAILED_AUTH_DELAY_MS
    quota_window_num: int = 11  # Kafka's quota.window.num
    quota_window_seconds: int = 1  # Kafka's quota.window.size.seconds
    # how often keystore and truststore files are looked at (logmq's own property)
    tls_reload_check_s: float = 10.0
    # the broker's properties as the listeners read them: with the native listener's
    # settings taken from the Kafka listener it inherits from (listeners.py)
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def native(self) -> Listener:
        return next(listener for listener in self.listeners if listener.native)

    @property
    def kafka(self) -> list[Listener]:
        return [listener for listener in self.listeners if not listener.native]

    def of(self, name: str) -> ListenerSecurity:
        return self.per_listener[name]

    @classmethod
    def from_properties(
        cls,
        props: Mapping[str, str],
        *,
        native: tuple[str, int],
        kafka: tuple[str, int] | None,
    ) -> SecuritySettings:
        listeners = parse_listeners(props, native=native, kafka=kafka)
        props = inherited_settings(props, next(n for n in listeners if n.native))
        # the Kafka listeners first: a setting missing from one the native listener
        # inherits from is reported under the listener the user configured
        ordered = sorted(listeners, key=lambda listener: listener.native)
        per = {listener.name: _listener_security(props, listener) for listener in ordered}
        authorizer = props.get("authorizer.class.name", "").strip()
        if authorizer and authorizer not in AUTHORIZERS:
            raise InvalidConfigError(
                f"authorizer.class.name: {authorizer!r} is not available; use "
                "org.apache.kafka.metadata.authorizer.StandardAuthorizer (logmq's ACLs)"
            )
        acls = bool(authorizer)
        super_users = frozenset(
            u.strip() for u in props.get("super.users", "").split(";") if u.strip()
        )
        for user in super_users:
            if ":" not in user:
                raise InvalidConfigError(f"super.users: {user!r} is not Type:name (User:admin)")
        names = {listener.name for listener in listeners}
        inter = props.get("inter.broker.listener.name", "").strip().upper() or next(
            listener.name for listener in listeners if listener.native
        )
        if inter not in names:
            raise InvalidConfigError(f"inter.broker.listener.name: no listener named {inter}")
        advertised = advertised_endpoints(props)
        for name in advertised:
            if name not in names:
                raise InvalidConfigError(f"advertised.listeners: no listener named {name}")
        return cls(
            listeners=listeners,
            per_listener=per,
            advertised=advertised,
            inter_broker_listener=inter,
            acls_enabled=acls,
            super_users=super_users,
            # Kafka's default is false; logmq's too once an authorizer is on
            allow_everyone_if_no_acl_found=_bool(props, "allow.everyone.if.no.acl.found", False),
            max_reauth_ms=_int(props, "connections.max.reauth.ms", 0) or None,
            failed_auth_delay_ms=_int(
                props, "connection.failed.authentication.delay.ms", DEFAULT_FAILED_AUTH_DELAY_MS
            ),
            quota_window_num=max(2, _int(props, "quota.window.num", 11)),
            quota_window_seconds=max(1, _int(props, "quota.window.size.seconds", 1)),
            tls_reload_check_s=max(0.1, _int(props, "ssl.reload.check.interval.ms", 10_000) / 1000),
            properties=props,
        )

    def native_summary(self) -> str:
        """What the native listener demands, and why: said once at start."""
        native = self.native
        sec = self.of(native.name)
        what = native.protocol
        if sec.mechanisms:
            what += " (" + ", ".join(sec.mechanisms) + ")"
        if native.inherited_from is not None:
            why = (
                f"as Kafka listener {native.inherited_from}, with its settings; "
                f"listener.security.protocol.map={native.name}:<protocol> chooses another"
            )
        elif native.name in mapped_protocols(self.properties):
            why = "as listener.security.protocol.map names it"
        else:
            why = "as no Kafka listener is secured"
        return f"native listener {native} (logmq clients, the logmq CLI, brokers): {what}, {why}"

    def warnings(self) -> list[str]:
        """What an operator must hear at start (an open broker on a network)."""
        out = []
        for listener in self.listeners:
            exposed = listener.host not in ("127.0.0.1", "localhost", "::1")
            if exposed and listener.protocol == "PLAINTEXT" and not self.acls_enabled:
                where = listener.host or "every address"
                out.append(
                    f"listener {listener} accepts anyone on {where} in clear text with no "
                    "authorizer: anyone who reaches it can read, write and delete everything"
                )
        native = self.of(self.native.name)
        if native.listener.sasl and not set(native.mechanisms) & CLIENT_MECHANISMS:
            out.append(
                f"native listener {native.listener} offers SASL {', '.join(native.mechanisms)}"
                " only, which logmq's clients and the logmq CLI cannot use (they log in with "
                f"PLAIN or SCRAM): enable one ({native.listener.prefix}sasl.enabled.mechanisms)"
                f" or give it its own protocol (listener.security.protocol.map="
                f"{native.listener.name}:<protocol>)"
            )
        return out


def _listener_security(props: Mapping[str, str], listener: Listener) -> ListenerSecurity:
    out = ListenerSecurity(listener)
    if listener.tls:
        settings = TlsSettings.from_properties(props, listener.prefix)
        if not settings.has_keystore:
            raise InvalidConfigError(
                f"listener {listener.name} ({listener.protocol}) needs ssl.keystore.location "
                f"(or {listener.prefix}ssl.keystore.location)"
            )
        out.tls = reloader = CertificateReloader(settings)

        def current(ssl_object, _server_name, context) -> None:
            # The listener keeps the context it started with; each handshake moves to
            # the latest one the reloader built (its certificate and key).
            latest = reloader.context
            if latest is not context:
                ssl_object.context = latest

        reloader.context.sni_callback = current
        out.principal_mapper = PrincipalMapper(settings.principal_mapping_rules or "DEFAULT")
    if listener.sasl:
        _sasl(props, listener, out)
    return out


def _sasl(props: Mapping[str, str], listener: Listener, out: ListenerSecurity) -> None:
    raw = listener_setting(props, listener, "sasl.enabled.mechanisms") or "GSSAPI"
    wanted = [m.strip().upper() for m in raw.split(",") if m.strip()]
    unknown = [m for m in wanted if m not in MECHANISMS]
    if unknown:
        raise InvalidConfigError(
            f"sasl.enabled.mechanisms of {listener.name}: {', '.join(unknown)} not available "
            f"(logmq has {', '.join(MECHANISMS)})"
        )
    if "PLAIN" in wanted:
        out.plain_users = _plain_users(props, listener)
    if "OAUTHBEARER" in wanted:
        config = OAuthBearerConfig.from_kafka_config(props, listener.prefix + "oauthbearer.")
        try:
            out.oauth = OAuthBearerValidator.from_config(config)
        except (OSError, ValueError) as e:
            raise InvalidConfigError(
                f"OAUTHBEARER on {listener.name}: {e} (sasl.oauthbearer.jwks.endpoint.url "
                "names a JWKS file or file: URL)"
            ) from None
    out.mechanisms = tuple(m for m in MECHANISMS if m in wanted)
    strict = "sasl.scram.strict.nonce"
    if listener.prefix + strict in props:
        strict = listener.prefix + strict
    out.scram_strict_nonce = _bool(props, strict, False)


def _plain_users(props: Mapping[str, str], listener: Listener) -> PlainUsers:
    """PLAIN's users: Kafka's JAAS option (per listener, then bare) or a users file."""
    for key in (
        listener.prefix + "plain.sasl.jaas.config",
        "plain.sasl.jaas.config",
        listener.prefix + "sasl.jaas.config",
        "sasl.jaas.config",
    ):
        text = props.get(key)
        if text:
            try:
                entries = parse_jaas_entries(text)
            except ValueError as e:
                raise InvalidConfigError(f"{key}: {e}") from None
            plain = [e for e in entries if e.login_module.endswith("PlainLoginModule")]
            if plain:
                return PlainUsers.from_jaas(plain[0])
    path = listener_setting(props, listener, "sasl.plain.users.file")
    if path:
        try:
            return PlainUsers.from_file(path)
        except (OSError, ValueError) as e:
            raise InvalidConfigError(f"sasl.plain.users.file: {e}") from None
    raise InvalidConfigError(
        f"PLAIN on {listener.name} has no users: set {listener.prefix}plain.sasl.jaas.config "
        '(PlainLoginModule with user_<name>="<password>" options) or sasl.plain.users.file'
    )


@dataclass(frozen=True)
class RaftTls:
    """Mutual TLS on the Raft port: the contexts both ends use and who may speak."""

    server: Any
    client: Any
    admit: Callable[[Any], str | None]


def raft_tls(props: Mapping[str, str], settings: SecuritySettings) -> RaftTls | None:
    """The Raft port's security, from Kafka's ``controller.listener.names``: its first
    name's protocol (``listener.security.protocol.map``) is PLAINTEXT (none) or SSL,
    which here means mutual TLS with that listener's ``ssl.*`` settings. With ACLs on,
    a member's certificate must map to a super user."""
    names = [n.strip().upper() for n in props.get("controller.listener.names", "").split(",")]
    if not names or not names[0]:
        return None
    name = names[0]
    protocol = protocol_map(props).get(name)
    if protocol in (None, "PLAINTEXT"):
        return None
    if protocol != "SSL":
        raise InvalidConfigError(
            f"controller.listener.names: {name} is {protocol}; the Raft port takes "
            "PLAINTEXT or SSL (mutual TLS between the brokers), not SASL"
        )
    prefix = f"listener.name.{name.lower()}."
    tls = TlsSettings.from_properties(props, prefix)
    if not tls.has_keystore or not tls.has_truststore:
        raise InvalidConfigError(
            f"the Raft port ({name}, SSL) needs ssl.keystore.location and "
            f"ssl.truststore.location (or {prefix}ssl.*): each broker proves itself to "
            "the others with its certificate"
        )
    mapper = PrincipalMapper(tls.principal_mapping_rules or "DEFAULT")

    def admit(ssl_object: Any) -> str | None:
        if not settings.acls_enabled:
            return None  # any certificate the truststore signs
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        try:
            principal = principal_from_peer_cert(der, mapper)
        except (NoMatchingRuleError, ValueError):
            return "its certificate maps to no principal"
        if principal in settings.super_users:
            return None
        return f"{principal} is not in super.users"

    return RaftTls(
        server_context(dataclasses.replace(tls, client_auth="required")),
        client_context(tls),
        admit,
    )


def jaas_options(props: Mapping[str, str], listener: Listener, mechanism: str) -> dict[str, str]:
    """The options of the JAAS config Kafka reads for ``mechanism`` on ``listener``
    (``listener.name.<l>.<mechanism>.sasl.jaas.config``, then without the listener,
    then ``sasl.jaas.config``): a broker's own ``username``/``password`` are there."""
    mech = mechanism.lower()
    for key in (
        f"{listener.prefix}{mech}.sasl.jaas.config",
        f"{mech}.sasl.jaas.config",
        f"{listener.prefix}sasl.jaas.config",
        "sasl.jaas.config",
    ):
        text = props.get(key)
        if text:
            try:
                entries = parse_jaas_entries(text)
            except ValueError as e:
                raise InvalidConfigError(f"{key}: {e}") from None
            if entries:
                return dict(entries[0].options)
    return {}


def _bool(props: Mapping[str, str], key: str, default: bool) -> bool:
    raw = props.get(key)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise InvalidConfigError(f"{key}: expected true or false, got {raw!r}")
    return value == "true"


def _int(props: Mapping[str, str], key: str, default: int) -> int:
    raw = props.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidConfigError(f"{key}: expected a number, got {raw!r}") from None
    if value < 0:
        raise InvalidConfigError(f"{key}: must be >= 0, got {value}")
    return value
