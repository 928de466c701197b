"""TLS for logmq listeners and clients, configured with Kafka's ``ssl.*`` property names.

A Kafka operator's PEM settings carry over unchanged: ``TlsSettings.from_properties`` reads
the same keys (optionally under a listener prefix, ``listener.name.<name>.ssl.*``, which
overrides the bare key one property at a time, as Kafka's ``valuesWithPrefixOverride``
does), and ``server_context``/``client_context`` turn them into ``ssl.SSLContext`` objects
for asyncio. Only PEM stores exist here; a JKS or PKCS12 store is refused with the
``keytool``/``openssl`` route to PEM, since Python's ssl cannot read either.

Client identity: ``distinguished_name`` prints a certificate subject the way Java's
``X500Principal.getName()`` does (RFC 2253), which is the string Kafka's
``ssl.principal.mapping.rules`` are written against, and ``PrincipalMapper`` applies those
rules with Kafka's parsing. ``CertificateReloader`` notices rotated keystore/truststore files
and builds a new context for new connections; it does no IO beyond stat and read, and keeps
no clock: the caller decides when to look.

Differences from Kafka, all forced by Python's ssl module (3.11, OpenSSL 3):
  * ``ssl.cipher.suites`` restricts TLS 1.2 suites only; Python cannot restrict TLS 1.3
    suites, so OpenSSL's three TLS 1.3 defaults stay on while TLS 1.3 is enabled.
  * ``ssl.enabled.protocols`` sets a minimum and maximum version (1.2 and 1.3 only).
  * Client authentication (requested/required) needs a configured truststore: Kafka would
    fall back to the JVM's public CAs, which would let any publicly issued certificate
    name itself a principal.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import re
import ssl
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from logmq.errors import ErrorCode, InvalidConfigError, LogMQError

__all__ = [
    "CertificateReloader",
    "NoMatchingRuleError",
    "PrincipalMapper",
    "TlsSettings",
    "client_context",
    "distinguished_name",
    "listener_prefix",
    "principal_from_peer_cert",
    "server_context",
]

ANONYMOUS = "User:ANONYMOUS"

ClientAuth = Literal["none", "requested", "required"]
_CLIENT_AUTH_MODES = {
    "none": ssl.CERT_NONE,
    "requested": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}
_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_OLD_VERSIONS = {"SSLv2", "SSLv3", "TLSv1", "TLSv1.1", "SSL", "SSLv2Hello"}

# Kafka's key names, without the prefix.
KEYSTORE_TYPE = "ssl.keystore.type"
KEYSTORE_LOCATION = "ssl.keystore.location"
KEYSTORE_PASSWORD = "ssl.keystore.password"
KEYSTORE_CHAIN = "ssl.keystore.certificate.chain"
KEYSTORE_KEY = "ssl.keystore.key"
KEY_PASSWORD = "ssl.key.password"
TRUSTSTORE_TYPE = "ssl.truststore.type"
TRUSTSTORE_LOCATION = "ssl.truststore.location"
TRUSTSTORE_PASSWORD = "ssl.truststore.password"
TRUSTSTORE_CERTS = "ssl.truststore.certificates"
CLIENT_AUTH = "ssl.client.auth"
ENABLED_PROTOCOLS = "ssl.enabled.protocols"
PROTOCOL = "ssl.protocol"
CIPHER_SUITES = "ssl.cipher.suites"
ENDPOINT_IDENTIFICATION = "ssl.endpoint.identification.algorithm"
PRINCIPAL_MAPPING_RULES = "ssl.principal.mapping.rules"


def listener_prefix(listener_name: str) -> str:
    """Kafka's per-listener prefix: ``listener.name.<lower-cased name>.``."""
    return f"listener.name.{listener_name.lower()}."


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class TlsSettings:
    """One listener's (or one client's) TLS configuration, validated.

    Inline PEM values are kept normalised (see ``_normalize_pem``); file locations are kept
    as given and read when a context is built, so a rotated file is picked up by a rebuild.
    """

    keystore_location: str | None = None
    keystore_certificate_chain: str | None = None
    keystore_key: str | None = None
    key_password: str | None = None
    truststore_location: str | None = None
    truststore_certificates: str | None = None
    client_auth: ClientAuth = "none"
    enabled_protocols: tuple[str, ...] = ("TLSv1.2", "TLSv1.3")
    protocol: str = "TLSv1.3"
    cipher_suites: tuple[str, ...] = ()
    endpoint_identification_algorithm: str = "https"
    principal_mapping_rules: str = "DEFAULT"

    @property
    def has_keystore(self) -> bool:
        return bool(self.keystore_location or self.keystore_certificate_chain)

    @property
    def has_truststore(self) -> bool:
        return bool(self.truststore_location or self.truststore_certificates)

    @property
    def watched_files(self) -> tuple[str, ...]:
        """The files a rebuild would read (inline PEMs have none)."""
        return tuple(p for p in (self.keystore_location, self.truststore_location) if p)

    @classmethod
    def from_properties(cls, props: Mapping[str, str], prefix: str = "") -> TlsSettings:
        """Read Kafka's ``ssl.*`` keys; ``prefix`` (e.g. ``listener_prefix("SSL")``) wins
        over the bare key for each property. Unrelated keys are ignored."""
        if prefix and not prefix.endswith("."):
            prefix += "."

        def get(key: str) -> str | None:
            for k in (prefix + key, key) if prefix else (key,):
                v = props.get(k)
                if v is not None:
                    v = str(v).strip()
                    return v or None
            return None

        def where(key: str) -> str:
            return f"{prefix}{key}" if prefix and props.get(prefix + key) is not None else key

        for type_key in (KEYSTORE_TYPE, TRUSTSTORE_TYPE):
            store_type = (get(type_key) or "PEM").upper()
            if store_type != "PEM":
                raise InvalidConfigError(
                    f"{where(type_key)}={store_type} is not supported: logmq reads PEM stores "
                    f"only. Convert with `keytool -importkeystore -srckeystore store.jks "
                    f"-destkeystore store.p12 -deststoretype PKCS12` then `openssl pkcs12 "
                    f"-in store.p12 -out store.pem` (key and certificate chain in one PEM "
                    f"file; use -nokeys for a truststore), and set {where(type_key)}=PEM"
                )
        if get(KEYSTORE_PASSWORD) is not None:
            raise InvalidConfigError(
                f"{where(KEYSTORE_PASSWORD)} cannot be used with a PEM keystore: set only "
                f"{KEY_PASSWORD} (the password of an encrypted private key), as Kafka does"
            )
        if get(TRUSTSTORE_PASSWORD) is not None:
            raise InvalidConfigError(
                f"{where(TRUSTSTORE_PASSWORD)} cannot be used with a PEM truststore"
            )

        ks_location = get(KEYSTORE_LOCATION)
        ks_chain = get(KEYSTORE_CHAIN)
        ks_key = get(KEYSTORE_KEY)
        if ks_location and (ks_chain or ks_key):
            raise InvalidConfigError(
                f"set either {KEYSTORE_LOCATION} or {KEYSTORE_CHAIN} + {KEYSTORE_KEY}, not both"
            )
        if bool(ks_chain) != bool(ks_key):
            raise InvalidConfigError(
                f"inline keystore needs both {KEYSTORE_CHAIN} and {KEYSTORE_KEY}"
            )
        if ks_location:
            _check_readable(ks_location, where(KEYSTORE_LOCATION))
        if ks_chain:
            ks_chain = _normalize_pem(ks_chain, KEYSTORE_CHAIN, kind="CERTIFICATE")
            ks_key = _normalize_pem(ks_key or "", KEYSTORE_KEY, kind="PRIVATE KEY")

        ts_location = get(TRUSTSTORE_LOCATION)
        ts_certs = get(TRUSTSTORE_CERTS)
        if ts_location and ts_certs:
            raise InvalidConfigError(
                f"set either {TRUSTSTORE_LOCATION} or {TRUSTSTORE_CERTS}, not both"
            )
        if ts_location:
            _check_readable(ts_location, where(TRUSTSTORE_LOCATION))
        if ts_certs:
            ts_certs = _normalize_pem(ts_certs, TRUSTSTORE_CERTS, kind="CERTIFICATE")

        client_auth = (get(CLIENT_AUTH) or "none").lower()
        if client_auth not in _CLIENT_AUTH_MODES:
            raise InvalidConfigError(
                f"{where(CLIENT_AUTH)}={client_auth!r}: expected none, requested or required"
            )

        enabled = tuple(p.strip() for p in (get(ENABLED_PROTOCOLS) or "TLSv1.2,TLSv1.3").split(","))
        enabled = tuple(p for p in enabled if p)
        for p in enabled:
            if p in _OLD_VERSIONS:
                raise InvalidConfigError(
                    f"{where(ENABLED_PROTOCOLS)}: {p} is insecure and not supported; "
                    f"use TLSv1.2 and/or TLSv1.3"
                )
            if p not in _VERSIONS:
                raise InvalidConfigError(f"{where(ENABLED_PROTOCOLS)}: unknown protocol {p!r}")
        if not enabled:
            raise InvalidConfigError(f"{where(ENABLED_PROTOCOLS)} is empty")

        protocol = get(PROTOCOL) or "TLSv1.3"
        if protocol not in ("TLS", "TLSv1.2", "TLSv1.3"):
            raise InvalidConfigError(
                f"{where(PROTOCOL)}={protocol!r}: expected TLSv1.3, TLSv1.2 or TLS"
            )
        if protocol == "TLSv1.2" and "TLSv1.2" not in enabled:
            raise InvalidConfigError(
                f"{where(PROTOCOL)}=TLSv1.2 allows no version in {where(ENABLED_PROTOCOLS)}"
            )

        suites = tuple(s.strip() for s in (get(CIPHER_SUITES) or "").split(",") if s.strip())
        if suites:
            _openssl_cipher_string(suites)  # validates names now, not at first connection

        algo = get(ENDPOINT_IDENTIFICATION) or ""
        if props.get(prefix + ENDPOINT_IDENTIFICATION) is None and (
            props.get(ENDPOINT_IDENTIFICATION) is None
        ):
            algo = "https"  # Kafka's default; an explicit empty value turns checking off
        if algo.lower() not in ("https", ""):
            raise InvalidConfigError(
                f"{where(ENDPOINT_IDENTIFICATION)}={algo!r}: expected https or empty"
            )

        rules = get(PRINCIPAL_MAPPING_RULES)
        if rules is None:
            rules = "DEFAULT"
        try:
            PrincipalMapper(rules)
        except ValueError as e:
            raise InvalidConfigError(f"{where(PRINCIPAL_MAPPING_RULES)}: {e}")

        return cls(
            keystore_location=ks_location,
            keystore_certificate_chain=ks_chain,
            keystore_key=ks_key,
            key_password=get(KEY_PASSWORD),
            truststore_location=ts_location,
            truststore_certificates=ts_certs,
            client_auth=client_auth,  # type: ignore[arg-type]
            enabled_protocols=enabled,
            protocol=protocol,
            cipher_suites=suites,
            endpoint_identification_algorithm=algo.lower(),
            principal_mapping_rules=rules,
        )


def _check_readable(path: str, key: str) -> None:
    if not os.path.isfile(path):
        raise InvalidConfigError(f"{key}={path}: no such file")
    if not os.access(path, os.R_OK):
        raise InvalidConfigError(f"{key}={path}: not readable")


_PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----(.*?)-----END \1-----", re.S)


def _normalize_pem(text: str, key: str, kind: str) -> str:
    """Rebuild PEM blocks with standard line breaks.

    Kafka accepts inline PEM with its line breaks flattened (a properties file holds one
    line per value unless continued), OpenSSL does not; so the base64 body is re-wrapped.
    """
    blocks = []
    for label, body in _PEM_BLOCK.findall(text):
        if kind not in label:
            continue
        b64 = re.sub(r"\s+", "", body)
        try:
            base64.b64decode(b64, validate=True)
        except binascii.Error:
            raise InvalidConfigError(f"{key}: bad base64 in the {label} block")
        lines = [b64[i : i + 64] for i in range(0, len(b64), 64)]
        blocks.append(
            f"-----BEGIN {label}-----\n" + "\n".join(lines) + f"\n-----END {label}-----\n"
        )
    if not blocks:
        raise InvalidConfigError(f"{key}: no PEM {kind} block found")
    return "".join(blocks)


_KX = {
    "ECDHE_RSA": "ECDHE-RSA-",
    "ECDHE_ECDSA": "ECDHE-ECDSA-",
    "DHE_RSA": "DHE-RSA-",
    "RSA": "",
}
_ENC = {
    "AES_128_GCM": "AES128-GCM",
    "AES_256_GCM": "AES256-GCM",
    "AES_128_CBC": "AES128",
    "AES_256_CBC": "AES256",
    "AES_128_CCM": "AES128-CCM",
    "AES_256_CCM": "AES256-CCM",
    "CHACHA20_POLY1305": "CHACHA20-POLY1305",
}
_TLS13_SUITES = {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"}
_IANA = re.compile(r"TLS_([A-Z0-9_]+?)_WITH_([A-Z0-9_]+?)(?:_(SHA|SHA256|SHA384))?$")


def _openssl_cipher_string(suites: tuple[str, ...]) -> str:
    """Kafka lists suites by their IANA (Java) names; OpenSSL wants its own for TLS 1.2.

    OpenSSL names are accepted as they are. TLS 1.3 names are accepted and dropped (Python's
    ssl cannot restrict TLS 1.3 suites). Every name must be one this OpenSSL knows.
    """
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    probe.set_ciphers("ALL:@SECLEVEL=0")
    known = {c["name"] for c in probe.get_ciphers()}
    out = []
    for s in suites:
        if s in _TLS13_SUITES:
            continue
        name = s
        m = _IANA.match(s)
        if m and m.group(1) in _KX and m.group(2) in _ENC:
            enc = _ENC[m.group(2)]
            mac = m.group(3)
            name = _KX[m.group(1)] + enc
            if mac and "CHACHA20" not in enc and "CCM" not in enc:
                name += "-" + mac
        if name not in known:
            raise InvalidConfigError(f"{CIPHER_SUITES}: unknown or unsupported suite {s!r}")
        out.append(name)
    return ":".join(out)


# --------------------------------------------------------------------------- contexts


@contextlib.contextmanager
def _private_file(data: str) -> Iterator[str]:
    """A 0600 temp file holding ``data``, removed on exit (OpenSSL loads keys from paths)."""
    fd, path = tempfile.mkstemp(prefix="logmq-tls-", suffix=".pem")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(data)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _apply_common(ctx: ssl.SSLContext, s: TlsSettings) -> None:
    versions = sorted(_VERSIONS[p] for p in s.enabled_protocols)
    ctx.minimum_version = versions[0]
    top = versions[-1]
    if s.protocol == "TLSv1.2":
        top = ssl.TLSVersion.TLSv1_2
    ctx.maximum_version = top
    if s.cipher_suites:
        cipher_string = _openssl_cipher_string(s.cipher_suites)
        if cipher_string:
            ctx.set_ciphers(cipher_string)
        elif ssl.TLSVersion.TLSv1_2 in versions:
            # only TLS 1.3 suites listed: Java would then never negotiate TLS 1.2
            ctx.minimum_version = ssl.TLSVersion.TLSv1_3
            ctx.maximum_version = ssl.TLSVersion.TLSv1_3
    ctx.options |= ssl.OP_NO_COMPRESSION


def _load_keystore(ctx: ssl.SSLContext, s: TlsSettings) -> None:
    password = s.key_password
    try:
        if s.keystore_location:
            ctx.load_cert_chain(s.keystore_location, password=password)
        elif s.keystore_certificate_chain and s.keystore_key:
            with _private_file(s.keystore_key + s.keystore_certificate_chain) as path:
                ctx.load_cert_chain(path, password=password)
    except ssl.SSLError as e:
        where = s.keystore_location or "inline ssl.keystore.key/ssl.keystore.certificate.chain"
        raise InvalidConfigError(
            f"cannot load keystore {where}: {e.reason or e} (an encrypted key needs "
            f"{KEY_PASSWORD}; the key must match the first certificate of the chain)"
        )


def _load_truststore(ctx: ssl.SSLContext, s: TlsSettings) -> None:
    try:
        if s.truststore_location:
            ctx.load_verify_locations(cafile=s.truststore_location)
        elif s.truststore_certificates:
            ctx.load_verify_locations(cadata=s.truststore_certificates)
    except ssl.SSLError as e:
        where = s.truststore_location or TRUSTSTORE_CERTS
        raise InvalidConfigError(f"cannot load truststore {where}: {e.reason or e}")


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """The context a TLS listener hands to ``loop.create_server(ssl=...)``."""
    if not settings.has_keystore:
        raise InvalidConfigError(
            f"a TLS listener needs {KEYSTORE_LOCATION} (or inline {KEYSTORE_CHAIN} + "
            f"{KEYSTORE_KEY})"
        )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _apply_common(ctx, settings)
    _load_keystore(ctx, settings)
    if settings.client_auth != "none" and not settings.has_truststore:
        raise InvalidConfigError(
            f"{CLIENT_AUTH}={settings.client_auth} needs {TRUSTSTORE_LOCATION} or "
            f"{TRUSTSTORE_CERTS}: the CAs that sign client certificates"
        )
    _load_truststore(ctx, settings)
    ctx.verify_mode = _CLIENT_AUTH_MODES[settings.client_auth]
    return ctx


def client_context(settings: TlsSettings) -> ssl.SSLContext:
    """The context a client (or a broker talking to another) connects with.

    Without a truststore the system CAs are trusted (Kafka trusts the JVM's). A keystore,
    when set, is presented to servers that ask for a client certificate.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _apply_common(ctx, settings)
    if settings.has_truststore:
        _load_truststore(ctx, settings)
    else:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if settings.has_keystore:
        _load_keystore(ctx, settings)
    ctx.check_hostname = settings.endpoint_identification_algorithm == "https"
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


# --------------------------------------------------------------------------- principals


class NoMatchingRuleError(LogMQError, ValueError):
    """No rule mapped the name; Kafka fails the authentication in this case."""

    code = ErrorCode.SASL_AUTHENTICATION_FAILED


_RULE = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_RULE_SPLITTER = re.compile(r"\s*(" + _RULE + r")\s*(,\s*|$)", re.ASCII)
_RULE_PARSER = re.compile(_RULE, re.ASCII)
_BACK_REFERENCE = re.compile(r"\$(\d+)", re.ASCII)
_JAVA_TRIM = "".join(chr(i) for i in range(33))
_JAVA_NAMED_GROUP = re.compile(r"(?<!\\)\(\?<([A-Za-z][A-Za-z0-9]*)>")


def _java_regex(pattern: str) -> re.Pattern[str]:
    """Compile a Java regex with ``re``; the two agree on what DN rules use (classes,
    groups, lazy/possessive quantifiers, anchors); Java's ``(?<name>`` is rewritten."""
    return re.compile(_JAVA_NAMED_GROUP.sub(r"(?P<\1>", pattern))


def _escape_literal_back_references(value: str, groups: int) -> str:
    """Kafka's rewrite of ``$N`` for N beyond the group count into a literal ``\\$N``.

    Kept exactly as Kafka's, including that match positions come from the original string
    while insertions shift the edited one.
    """
    if groups == 0:
        return value
    original = value
    for m in _BACK_REFERENCE.finditer(original):
        digits = m.group(1)
        if digits.startswith("0"):
            continue
        index = int(digits)
        while index > groups and index >= 10:
            index //= 10
        if index > groups:
            start = m.start(1)
            value = value[: start - 1] + "\\" + value[start - 1 :]
    return value


def _java_replacement(replacement: str, pattern: re.Pattern[str]) -> list[str | int]:
    """Parse a ``Matcher.replaceAll`` replacement: ``\\x`` is x, ``$N`` takes the longest
    group number that exists (first digit always), ``${name}`` a named group."""
    groups = pattern.groups
    parts: list[str | int] = []
    lit: list[str] = []
    i, n = 0, len(replacement)
    while i < n:
        c = replacement[i]
        if c == "\\":
            i += 1
            if i == n:
                raise ValueError(f"character to be escaped is missing in {replacement!r}")
            lit.append(replacement[i])
            i += 1
        elif c == "$":
            i += 1
            if i == n:
                raise ValueError(f"illegal group reference in {replacement!r}")
            if replacement[i] == "{":
                end = replacement.find("}", i)
                name = replacement[i + 1 : end] if end > 0 else ""
                if not name or name not in pattern.groupindex:
                    raise ValueError(f"no group named {name!r} in {pattern.pattern!r}")
                ref = pattern.groupindex[name]
                i = end + 1
            else:
                if not replacement[i].isascii() or not replacement[i].isdigit():
                    raise ValueError(f"illegal group reference in {replacement!r}")
                ref = int(replacement[i])
                i += 1
                while i < n and replacement[i].isascii() and replacement[i].isdigit():
                    longer = ref * 10 + int(replacement[i])
                    if longer > groups:
                        break
                    ref = longer
                    i += 1
                if ref > groups:
                    raise ValueError(f"no group {ref} in {pattern.pattern!r}")
            if lit:
                parts.append("".join(lit))
                lit = []
            parts.append(ref)
        else:
            lit.append(c)
            i += 1
    if lit:
        parts.append("".join(lit))
    return parts


@dataclass(frozen=True)
class _Rule:
    default: bool
    pattern: re.Pattern[str] | None = None
    pattern_text: str = ""
    replacement: str | None = None
    parts: tuple[str | int, ...] = ()
    lower: bool = False
    upper: bool = False

    def apply(self, dn: str) -> str | None:
        if self.default:
            return dn
        assert self.pattern is not None
        if self.pattern.fullmatch(dn) is None:
            return None

        def expand(m: re.Match[str]) -> str:
            return "".join(p if isinstance(p, str) else (m.group(p) or "") for p in self.parts)

        out = self.pattern.sub(expand, dn)
        if self.lower:
            out = _java_lower(out)
        elif self.upper:
            out = _java_upper(out)
        return out

    def __str__(self) -> str:
        if self.default:
            return "DEFAULT"
        s = "RULE:" + self.pattern_text
        if self.replacement is not None:
            s += "/" + self.replacement
        if self.lower:
            s += "/L"
        elif self.upper:
            s += "/U"
        return s


def _java_lower(s: str) -> str:
    # Locale.ENGLISH lower-casing; str.lower differs only for U+0130 (dotted capital I)
    return s.replace("\u0130", "i\u0307").lower()


def _java_upper(s: str) -> str:
    return s.upper()


class PrincipalMapper:
    """Kafka's ``ssl.principal.mapping.rules``: comma-separated ``RULE:pattern/replacement/``
    (optionally ``/L`` or ``/U`` for lower/upper case) and ``DEFAULT`` (the name as is).

    The first rule whose pattern matches the whole distinguished name gives the name; a
    rule's output is ``replaceAll(pattern, replacement)`` on the DN, as in Java. Rules are
    split and parsed with Kafka's own expressions, so what Kafka accepts or refuses, this
    does too; one deliberate difference: a replacement that refers to a group that cannot
    exist (or is malformed) is refused here when the rules are parsed, where Java throws
    only when the rule first matches.
    """

    def __init__(self, rules: str | None = "DEFAULT"):
        if rules is None:
            rules = "DEFAULT"
        self.rules: tuple[_Rule, ...] = tuple(self._parse(r) for r in self._split(rules))
        self.rules = tuple(r for r in self.rules if r is not None)  # type: ignore[misc]

    @staticmethod
    def _split(rules: str) -> list[str]:
        return [m.group(1) for m in _RULE_SPLITTER.finditer(rules.strip(_JAVA_TRIM))]

    @staticmethod
    def _parse(rule: str) -> _Rule | None:
        m = _RULE_PARSER.match(rule)
        if m is None:
            raise ValueError(f"invalid rule: {rule}")
        if m.end() != len(rule):
            raise ValueError(f"invalid rule: `{rule}`, unmatched substring: `{rule[m.end() :]}`")
        if m.group(1) is not None:
            return _Rule(default=True)
        if m.group(2) is None:
            return None  # empty rules are ignored
        pattern_text, replacement, case = m.group(2), m.group(4), m.group(6)
        try:
            pattern = _java_regex(pattern_text)
        except re.error as e:
            raise ValueError(f"invalid pattern in rule `{rule}`: {e}")
        escaped = _escape_literal_back_references(replacement, pattern.groups)
        parts = tuple(_java_replacement(escaped, pattern))
        return _Rule(
            default=False,
            pattern=pattern,
            pattern_text=pattern_text,
            replacement=replacement,
            parts=parts,
            lower=case == "L",
            upper=case == "U",
        )

    def name(self, distinguished_name: str) -> str:
        """The short name for a DN; raises ``NoMatchingRuleError`` when no rule applies
        (there is no DEFAULT at the end), which should fail the authentication."""
        for rule in self.rules:
            out = rule.apply(distinguished_name)
            if out is not None:
                return out
        raise NoMatchingRuleError(
            f"no rules apply to {distinguished_name}, rules [{', '.join(map(str, self.rules))}]"
        )

    def __str__(self) -> str:
        return f"SslPrincipalMapper(rules = [{', '.join(map(str, self.rules))}])"

    __repr__ = __str__


# X.500 attribute types that Java's RFC 2253 printer names by keyword; others print as OID.
_RFC2253_KEYWORDS = {
    "2.5.4.3": "CN",
    "2.5.4.6": "C",
    "2.5.4.7": "L",
    "2.5.4.8": "ST",
    "2.5.4.10": "O",
    "2.5.4.11": "OU",
    "2.5.4.9": "STREET",
    "0.9.2342.19200300.100.1.25": "DC",
    "0.9.2342.19200300.100.1.1": "UID",
}
# DER string types Java prints as text (its non-canonical isDerString), with their decoding.
_STRING_TAGS = {
    0x13: "ascii",  # PrintableString
    0x14: "latin-1",  # T61String
    0x16: "ascii",  # IA5String
    0x1B: "latin-1",  # GeneralString
    0x1E: "utf-16-be",  # BMPString
    0x0C: "utf-8",  # UTF8String
}
_RFC2253_ESCAPEES = ',=+<>#;"\\'
_PRINTABLE_STRING_CHARS = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 '()+,-./:=?"
)


def _der_read(data: bytes, pos: int) -> tuple[int, int, int, int]:
    """(tag, start of TLV, start of content, end) of the DER element at ``pos``."""
    tag = data[pos]
    n = data[pos + 1]
    i = pos + 2
    if n & 0x80:
        count = n & 0x7F
        n = int.from_bytes(data[i : i + count], "big")
        i += count
    if i + n > len(data):
        raise ValueError("truncated DER")
    return tag, pos, i, i + n


def _oid(content: bytes) -> str:
    first = content[0]
    arcs = [min(first // 40, 2), first - 40 * min(first // 40, 2)]
    value = 0
    for b in content[1:]:
        value = (value << 7) | (b & 0x7F)
        if not b & 0x80:
            arcs.append(value)
            value = 0
    return ".".join(map(str, arcs))


def _ava_rfc2253(oid: str, tlv: bytes, tag: int, content: bytes) -> str:
    keyword = _RFC2253_KEYWORDS.get(oid, oid)
    if keyword[0].isdigit() or tag not in _STRING_TAGS:
        return f"{keyword}=#{tlv.hex()}"
    text = content.decode(_STRING_TAGS[tag], errors="replace")
    chars: list[str] = []
    for c in text:
        if c in _RFC2253_ESCAPEES:
            chars.append("\\" + c)
        elif c == "\x00":
            chars.append("\\00")
        else:
            chars.append(c)
    flat = "".join(chars)
    lead = 0
    while lead < len(flat) and flat[lead] in " \r":
        lead += 1
    trail = len(flat) - 1
    while trail >= 0 and flat[trail] in " \r":
        trail -= 1
    out = [("\\" + c) if (i < lead or i > trail) else c for i, c in enumerate(flat)]
    return f"{keyword}=" + "".join(out)


def _ava_sort_key(oid: str) -> tuple[int, str | tuple[int, ...]]:
    # Java's AVAComparator: keyword types alphabetically, then OIDs numerically
    kw = _RFC2253_KEYWORDS.get(oid)
    if kw is not None:
        return (0, kw)
    return (1, tuple(int(a) for a in oid.split(".")))


def distinguished_name(subject_der: bytes) -> str:
    """Print a DER-encoded X.500 Name as Java's ``X500Principal.getName()`` does.

    That RFC 2253 string is what Kafka's mapping rules see: RDNs most specific first
    (``CN=alice,OU=eng,O=Acme,C=US``). It equals ``cryptography``'s ``rfc4514_string()``
    for ordinary names; they differ where Java escapes ``=`` and any ``#`` (RFC 4514 only
    a leading ``#``), escapes a leading/trailing carriage return, prints attribute types
    other than CN, C, L, ST, O, OU, STREET, DC, UID as ``<oid>=#<hex DER>`` (so
    emailAddress is ``1.2.840.113549.1.9.1=#16...``, where cryptography prints
    ``1.2.840.113549.1.9.1=alice@example.com``), and sorts multi-valued RDNs.
    """
    tag, _, start, end = _der_read(subject_der, 0)
    if tag != 0x30:
        raise ValueError("not a DER Name")
    rdns: list[str] = []
    pos = start
    while pos < end:
        set_tag, _, set_start, set_end = _der_read(subject_der, pos)
        if set_tag != 0x31:
            raise ValueError("RDN is not a SET")
        avas: list[tuple[str, str]] = []
        p = set_start
        while p < set_end:
            _, _, seq_start, seq_end = _der_read(subject_der, p)
            oid_tag, _, oid_start, oid_end = _der_read(subject_der, seq_start)
            if oid_tag != 0x06:
                raise ValueError("AVA without an OID")
            oid = _oid(subject_der[oid_start:oid_end])
            v_tag, v_pos, v_start, v_end = _der_read(subject_der, oid_end)
            avas.append(
                (
                    oid,
                    _ava_rfc2253(oid, subject_der[v_pos:v_end], v_tag, subject_der[v_start:v_end]),
                )
            )
            p = seq_end
        if len(avas) > 1:
            avas.sort(key=lambda a: _ava_sort_key(a[0]))
        rdns.append("+".join(text for _, text in avas))
        pos = set_end
    return ",".join(reversed(rdns))


def principal_from_peer_cert(der: bytes | None, mapper: PrincipalMapper) -> str:
    """``User:<mapped subject DN>`` for a peer certificate in DER (from
    ``SSLObject.getpeercert(binary_form=True)``); ``User:ANONYMOUS`` without one.

    Raises ``NoMatchingRuleError`` when no rule maps the DN (the caller fails the
    connection's authentication, as Kafka does).
    """
    if not der:
        return ANONYMOUS
    from cryptography import x509

    cert = x509.load_der_x509_certificate(der)
    return "User:" + mapper.name(distinguished_name(cert.subject.public_bytes()))


# --------------------------------------------------------------------------- reloading

_Fingerprint = tuple[int, int, int, int]  # st_dev, st_ino, st_mtime_ns, st_size


class CertificateReloader:
    """Rebuild a context when the keystore or truststore files change.

    ``check()`` stats the files (cheap enough to call every few seconds); when a stat
    differs it hashes the contents, and only a content change leads to a rebuild. A rebuild
    that fails (a half-written or mismatched file) keeps the current context and records
    the error in ``last_error``; the same contents are not retried until they change again.
    Inline PEMs have no files, so they never reload. The constructor builds the first
    context and raises if that fails: a broker should not start with bad certificates.

    A truststore truncated between two complete certificates still loads (with fewer CAs);
    writers should replace files atomically (write elsewhere, then rename).
    """

    def __init__(
        self,
        settings: TlsSettings,
        build: Callable[[TlsSettings], ssl.SSLContext] = server_context,
    ):
        self.settings = settings
        self._build = build
        self.last_error: Exception | None = None
        self.reloads = 0
        stats = self._stat_all()
        digests = self._hash_all()
        self.context = build(settings)
        self._stats = stats
        self._digests = digests

    def _stat_all(self) -> dict[str, _Fingerprint]:
        out = {}
        for path in self.settings.watched_files:
            st = os.stat(path)
            out[path] = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        return out

    def _hash_all(self) -> dict[str, str]:
        out = {}
        for path in self.settings.watched_files:
            with open(path, "rb") as f:
                out[path] = hashlib.sha256(f.read()).hexdigest()
        return out

    def check(self) -> ssl.SSLContext | None:
        """A new context if the files changed and load cleanly, else None."""
        if not self.settings.watched_files:
            return None
        try:
            stats = self._stat_all()
            if stats == self._stats:
                return None
            digests = self._hash_all()
        except OSError as e:  # mid-rename, or removed: keep serving with what we have
            self.last_error = e
            return None
        if digests == self._digests:
            self._stats = stats  # touched, not changed
            return None
        try:
            ctx = self._build(self.settings)
        except (InvalidConfigError, ssl.SSLError, OSError, ValueError) as e:
            self.last_error = e
            self._stats = stats  # not retried until the files change again
            return None
        self._stats, self._digests = stats, digests
        self.last_error = None
        self.context = ctx
        self.reloads += 1
        return ctx
