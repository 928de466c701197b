"""Kafka's listener model, read from Kafka's property names.

``listeners`` names each listener and where it binds (``SASL_SSL://0.0.0.0:9093``),
``listener.security.protocol.map`` gives each name its protocol (a name that is itself a
protocol needs no entry), ``advertised.listeners`` what clients are told, and
``inter.broker.listener.name`` the one brokers use between themselves. logmq serves two
protocols: listeners named in ``native.listener.names`` (default ``NATIVE``) speak the
native one (logmq's clients, the CLI, replication), every other one speaks Kafka's.
Per-listener settings take Kafka's prefix ``listener.name.<name lowercased>.`` before the
property (``listener.name.sasl_ssl.ssl.keystore.location``), falling back to the bare one.

Kafka has one door, so a Kafka user secures the Kafka listeners and thinks of no other:
a native listener whose protocol nothing names (no ``listener.security.protocol.map``
entry) takes the protocol of the first Kafka listener that authenticates (SASL, or TLS
with client certificates), else of the first TLS one, and that listener's prefixed
settings (``inherited_settings``). Only with every Kafka listener PLAINTEXT is it
PLAINTEXT by default.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from logmq.errors import InvalidConfigError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
DEFAULT_PROTOCOL_MAP = {p: p for p in PROTOCOLS}
NATIVE_DEFAULT = "NATIVE"


@dataclass(frozen=True, slots=True)
class Listener:
    name: str  # upper case, as Kafka normalises it
    host: str  # "" binds every address
    port: int
    protocol: str  # one of PROTOCOLS
    native: bool  # the native protocol; else Kafka's
    # the Kafka listener whose protocol and settings this (native) one took
    inherited_from: str | None = None

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def prefix(self) -> str:
        """Kafka's per-listener property prefix."""
        return f"listener.name.{self.name.lower()}."

    def __str__(self) -> str:
        return f"{self.name}://{self.host}:{self.port}"


def listener_setting(props: Mapping[str, str], listener: Listener, key: str) -> str | None:
    """A property as this listener sees it: its prefixed form first, then the bare one."""
    value = props.get(listener.prefix + key)
    return value if value is not None else props.get(key)


def parse_endpoints(value: str, key: str) -> list[tuple[str, str, int]]:
    """``NAME://host:port,...`` as (NAME, host, port); an IPv6 host goes in brackets."""
    out: list[tuple[str, str, int]] = []
    seen: set[str] = set()
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        name, sep, rest = item.partition("://")
        if not sep or not name:
            raise InvalidConfigError(f"{key}: {item!r} is not NAME://host:port")
        if rest.startswith("["):
            host, _, port_text = rest[1:].partition("]:")
        else:
            host, _, port_text = rest.rpartition(":")
        try:
            port = int(port_text)
        except ValueError:
            raise InvalidConfigError(f"{key}: {item!r} has no port number") from None
        if not 0 <= port <= 65535:
            raise InvalidConfigError(f"{key}: port {port} of {item!r} is out of range")
        name = name.upper()
        if name in seen:
            raise InvalidConfigError(f"{key}: listener {name} is named twice")
        seen.add(name)
        out.append((name, host, port))
    return out


def mapped_protocols(props: Mapping[str, str]) -> dict[str, str]:
    """The entries ``listener.security.protocol.map`` gives (NAME:PROTOCOL,...)."""
    out: dict[str, str] = {}
    raw = props.get("listener.security.protocol.map")
    if raw:
        for item in (part.strip() for part in raw.split(",")):
            if not item:
                continue
            name, sep, protocol = item.partition(":")
            protocol = protocol.strip().upper()
            if not sep or protocol not in PROTOCOLS:
                raise InvalidConfigError(
                    f"listener.security.protocol.map: {item!r} is not NAME:PROTOCOL "
                    f"with a protocol of {', '.join(PROTOCOLS)}"
                )
            out[name.strip().upper()] = protocol
    return out


def protocol_map(props: Mapping[str, str]) -> dict[str, str]:
    """``listener.security.protocol.map`` (NAME:PROTOCOL,...) over Kafka's defaults."""
    out = dict(DEFAULT_PROTOCOL_MAP)
    out[NATIVE_DEFAULT] = "PLAINTEXT"
    out.update(mapped_protocols(props))
    return out


def authenticates(props: Mapping[str, str], listener: Listener) -> bool:
    """Does this listener know who its clients are (SASL, or TLS asking for a client
    certificate)?"""
    if listener.sasl:
        return True
    auth = (listener_setting(props, listener, "ssl.client.auth") or "none").strip().lower()
    return listener.tls and auth in ("required", "requested")


def _native_model(props: Mapping[str, str], kafka: list[Listener]) -> Listener | None:
    """The Kafka listener a native listener of unnamed protocol takes after."""
    for listener in kafka:
        if authenticates(props, listener):
            return listener
    return next((listener for listener in kafka if listener.tls), None)


def inherited_settings(props: Mapping[str, str], native: Listener) -> dict[str, str]:
    """``props`` with the native listener's settings taken from the Kafka listener it
    inherits from: each ``listener.name.<kafka>.X`` is also ``listener.name.<native>.X``
    unless that is set. Bare properties are every listener's already."""
    out = dict(props)
    if native.inherited_from is None:
        return out
    source = f"listener.name.{native.inherited_from.lower()}."
    for key, value in props.items():
        if key.startswith(source):
            out.setdefault(native.prefix + key[len(source) :], value)
    return out


def parse_listeners(
    props: Mapping[str, str],
    *,
    native: tuple[str, int],
    kafka: tuple[str, int] | None,
) -> list[Listener]:
    """Every listener this broker opens.

    Without ``listeners`` there is one native listener at ``native`` and, unless
    ``kafka`` is None, one Kafka listener named PLAINTEXT there (logmq's flags). With it,
    a native listener missing from it is still opened at ``native``: every broker has
    exactly one. Its protocol is the protocol map's for its name, else the one of the
    Kafka listener ``_native_model`` picks, else PLAINTEXT.
    """
    protocols = protocol_map(props)
    mapped = mapped_protocols(props)
    native_names = {
        n.strip().upper()
        for n in props.get("native.listener.names", NATIVE_DEFAULT).split(",")
        if n.strip()
    }
    raw = props.get("listeners")
    endpoints = parse_endpoints(raw, "listeners") if raw else []
    if not raw and kafka is not None:
        endpoints.append(("PLAINTEXT", kafka[0], kafka[1]))
    out = []
    for name, host, port in endpoints:
        protocol = protocols.get(name)
        if name in native_names and name not in mapped and name not in PROTOCOLS:
            protocol = None  # decided below, once the Kafka listeners are known
        elif protocol is None:
            raise InvalidConfigError(
                f"listeners: {name} has no security protocol: name one of "
                f"{', '.join(PROTOCOLS)} or map it in listener.security.protocol.map"
            )
        out.append(Listener(name, host, port, protocol or "", name in native_names))
    natives = [listener for listener in out if listener.native]
    if len(natives) > 1:
        raise InvalidConfigError(
            "listeners: one native listener per broker, got " + ", ".join(str(n) for n in natives)
        )
    if natives:
        out.remove(natives[0])
        name, host, port = natives[0].name, natives[0].host, natives[0].port
    else:
        name = sorted(native_names)[0] if native_names else NATIVE_DEFAULT
        host, port = native
    protocol = mapped.get(name) or (name if name in PROTOCOLS else None)
    model = None
    if protocol is None:
        model = _native_model(props, out)
        protocol = model.protocol if model is not None else "PLAINTEXT"
    inherited = model.name if model is not None else None
    out.insert(0, Listener(name, host, port, protocol, True, inherited))
    return out


@functools.cache
def registered_endpoints(value: str) -> dict[str, tuple[str, int]]:
    """Another broker's registered Kafka listeners by name (parsed once per value);
    a value that does not parse is no listeners (it came over the wire)."""
    try:
        return {name: (host, port) for name, host, port in parse_endpoints(value, "listeners")}
    except InvalidConfigError:
        return {}


def advertised_endpoints(props: Mapping[str, str]) -> dict[str, tuple[str, int]]:
    """``advertised.listeners`` by name (those not named advertise where they bind)."""
    raw = props.get("advertised.listeners")
    if not raw:
        return {}
    return {name: (host, port) for name, host, port in parse_endpoints(raw, "advertised.listeners")}
