"""SASL/OAUTHBEARER (RFC 7628) with JWT validation against a JWKS, as Kafka's broker does it.

The client's one message is ``n,[a=<authzid>],\\x01auth=Bearer <jwt>\\x01[key=value\\x01]*\\x01``.
The JWT's signature is checked (PyJWT) with a key from a JWKS picked by ``kid``, then its
claims: ``exp`` required, ``nbf`` honoured, both with a clock-skew allowance; issuer and
audience when configured; the principal is a configured claim (``sub`` by default). A bad
token is answered as Kafka answers it: the challenge ``{"status":"invalid_token"}``, to which
the client replies ``\\x01``, and only then does the exchange fail; why it failed goes to the
broker's log (``OAuthBearerServer.failure``), not to the client.

No network here: ``read_jwks`` reads a file, ``fetch_jwks`` is a small blocking function the
shell runs off the event loop (and again on an unknown ``kid``, to follow key rotation),
handing the result to ``OAuthBearerValidator.update_keys``.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt

from logmq.errors import ErrorCode, LogMQError
from logmq.security.sasl import SaslAuthenticationError
from logmq.security.scram import unescape_username

ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
_EC_CURVES = {"ES256": "P-256", "ES384": "P-384", "ES512": "P-521"}
MAX_INITIAL_RESPONSE = 64 * 1024  # a JWT with many claims is a few KiB
MAX_JWKS_BYTES = 1 << 20
INVALID_TOKEN = b'{"status":"invalid_token"}'

_KEY = re.compile(r"[A-Za-z]+")
_VALUE = re.compile(r"[\x21-\x7e \t\r\n]*")
_AUTH = re.compile(r"([A-Za-z]+) +([-_.A-Za-z0-9+/=~]+)")


@dataclass(frozen=True)
class OAuthBearerConfig:
    """The broker-side settings, named after Kafka's ``sasl.oauthbearer.*`` properties."""

    jwks_endpoint_url: str | None = None
    expected_audience: tuple[str, ...] = ()
    expected_issuer: str | None = None
    clock_skew_seconds: int = 30
    sub_claim_name: str = "sub"
    scope_claim_name: str = "scope"

    @classmethod
    def from_kafka_config(cls, props: Mapping[str, Any], prefix: str = "") -> OAuthBearerConfig:
        """From Kafka property names; ``prefix`` (e.g. ``listener.name.sasl_ssl.oauthbearer.``)
        is tried before the bare name, as Kafka's listener overrides are."""

        def get(name: str) -> Any:
            full = "sasl.oauthbearer." + name
            if prefix and prefix + full in props:
                return props[prefix + full]
            return props.get(full)

        aud = get("expected.audience")
        if isinstance(aud, str):
            aud = [a.strip() for a in aud.split(",")]
        skew = get("clock.skew.seconds")
        return cls(
            jwks_endpoint_url=get("jwks.endpoint.url") or None,
            expected_audience=tuple(a for a in (aud or ()) if a),
            expected_issuer=get("expected.issuer") or None,
            clock_skew_seconds=30 if skew in (None, "") else int(skew),
            sub_claim_name=get("sub.claim.name") or "sub",
            scope_claim_name=get("scope.claim.name") or "scope",
        )


class OAuthBearerValidationError(LogMQError):
    """Why a token was refused (for the broker's log; the client only sees invalid_token).
    ``unknown_kid`` tells the shell a JWKS refresh may help."""

    code = ErrorCode.SASL_AUTHENTICATION_FAILED

    def __init__(self, reason: str, *, unknown_kid: bool = False) -> None:
        super().__init__(reason)
        self.unknown_kid = unknown_kid


@dataclass(frozen=True)
class _Jwk:
    kid: str | None
    kty: str
    alg: str | None
    crv: str | None
    key: Any


class JwksKeys:
    """The verification keys of a JWKS document (RSA and EC signing keys; others, such as
    symmetric 'oct' keys, are ignored so a token can never be checked against a shared
    secret)."""

    def __init__(self, keys: list[_Jwk]) -> None:
        self._keys = keys

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def kids(self) -> tuple[str | None, ...]:
        return tuple(k.kid for k in self._keys)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> JwksKeys:
        raw = doc.get("keys") if isinstance(doc, Mapping) else None
        if not isinstance(raw, list):
            raise ValueError("JWKS document has no 'keys' list")
        keys = []
        for entry in raw:
            if not isinstance(entry, dict) or entry.get("kty") not in ("RSA", "EC"):
                continue
            if entry.get("use", "sig") != "sig":
                continue
            alg = entry.get("alg")
            if alg is not None and alg not in ALGORITHMS:
                continue
            try:
                key = jwt.PyJWK(entry).key
            except jwt.PyJWTError:
                continue
            keys.append(_Jwk(entry.get("kid"), entry["kty"], alg, entry.get("crv"), key))
        return cls(keys)

    @classmethod
    def from_json(cls, text: str | bytes) -> JwksKeys:
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise ValueError(f"JWKS is not JSON: {e}") from None
        return cls.from_dict(doc)

    @classmethod
    def from_file(cls, path: str | Path) -> JwksKeys:
        return cls.from_json(Path(path).read_bytes())

    def candidates(self, kid: str | None, alg: str) -> list[Any]:
        """Keys that may verify a token with this header. With a ``kid``, the keys that carry
        it; without one, the only key fitting ``alg`` (several would be ambiguous)."""
        kty = "EC" if alg.startswith("ES") else "RSA"
        fit = [
            k
            for k in self._keys
            if k.kty == kty
            and (k.alg is None or k.alg == alg)
            and (kty != "EC" or k.crv == _EC_CURVES[alg])
        ]
        if kid is not None:
            with_kid = [k.key for k in self._keys if k.kid == kid]
            if not with_kid:
                raise OAuthBearerValidationError(f"no JWKS key has kid {kid!r}", unknown_kid=True)
            fit_kid = [k.key for k in fit if k.kid == kid]
            if not fit_kid:
                raise OAuthBearerValidationError(f"JWKS key {kid!r} does not fit alg {alg}")
            return fit_kid
        if len(fit) != 1:
            raise OAuthBearerValidationError(
                f"token has no kid and {len(fit)} JWKS keys fit alg {alg}"
            )
        return [fit[0].key]


def read_jwks(source: str | Path) -> JwksKeys:
    """A JWKS from a file path or a ``file:`` URL (Kafka accepts ``file:`` for the JWKS
    endpoint, which is how tests and air-gapped brokers configure it)."""
    src = str(source)
    if src.startswith("file:"):
        src = urllib.request.url2pathname(urllib.parse.urlparse(src).path)
    return JwksKeys.from_file(src)


def fetch_jwks(source: str, timeout: float = 10.0) -> JwksKeys:
    """Blocking: read ``source`` (http(s) URL, ``file:`` URL or path). Run it in an executor."""
    scheme = urllib.parse.urlparse(source).scheme
    if scheme not in ("http", "https"):
        return read_jwks(source)
    req = urllib.request.Request(source, headers={"Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read(MAX_JWKS_BYTES + 1)
    if len(body) > MAX_JWKS_BYTES:
        raise ValueError(f"JWKS at {source} is larger than {MAX_JWKS_BYTES} bytes")
    return JwksKeys.from_json(body)


@dataclass(frozen=True)
class OAuthBearerToken:
    """A validated token: who it names and until when it is valid."""

    value: str = field(repr=False)
    principal: str
    lifetime_ms: int  # the token's exp, in ms since the epoch
    start_ms: int | None  # its iat, if any
    scope: frozenset[str]
    claims: dict[str, Any] = field(repr=False)


def _numeric(claims: Mapping[str, Any], name: str) -> float | None:
    v = claims.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise OAuthBearerValidationError(f"claim {name!r} is not a number")
    return float(v)


class OAuthBearerValidator:
    """Checks a JWT as Kafka's broker-side validator does. Sans-IO: the caller passes now."""

    def __init__(self, config: OAuthBearerConfig, keys: JwksKeys) -> None:
        self.config = config
        self.keys = keys

    @classmethod
    def from_config(
        cls, config: OAuthBearerConfig, keys: JwksKeys | None = None
    ) -> OAuthBearerValidator:
        """With ``keys`` None, read them from a file/``file:`` jwks_endpoint_url; an http(s)
        one must be fetched first (fetch_jwks, off the event loop) and passed in."""
        if keys is None:
            url = config.jwks_endpoint_url
            if not url:
                raise ValueError("sasl.oauthbearer.jwks.endpoint.url is not set")
            if urllib.parse.urlparse(url).scheme in ("http", "https"):
                raise ValueError("an http(s) JWKS must be fetched with fetch_jwks and passed in")
            keys = read_jwks(url)
        return cls(config, keys)

    def update_keys(self, keys: JwksKeys) -> None:
        self.keys = keys

    def validate(self, token: str, now: float) -> OAuthBearerToken:
        """``now`` in seconds since the epoch. Raises OAuthBearerValidationError."""
        cfg = self.config
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as e:
            raise OAuthBearerValidationError(f"malformed JWT: {e}") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise OAuthBearerValidationError(f"JWT alg {alg!r} is not allowed")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise OAuthBearerValidationError("JWT kid is not a string")
        claims: dict[str, Any] | None = None
        last: Exception | None = None
        for key in self.keys.candidates(kid, alg):
            try:
                claims = jwt.decode(
                    token,
                    key,
                    algorithms=[alg],
                    audience=list(cfg.expected_audience) or None,
                    issuer=cfg.expected_issuer,
                    options={
                        "verify_exp": False,  # time claims use the injected clock below
                        "verify_nbf": False,
                        "verify_iat": False,
                        "verify_aud": bool(cfg.expected_audience),
                        "verify_iss": cfg.expected_issuer is not None,
                    },
                )
                break
            except jwt.InvalidSignatureError as e:
                last = e
            except jwt.PyJWTError as e:
                raise OAuthBearerValidationError(f"JWT rejected: {e}") from None
        if claims is None:
            raise OAuthBearerValidationError(f"JWT signature does not verify: {last}")
        skew = cfg.clock_skew_seconds
        exp = _numeric(claims, "exp")
        if exp is None:
            raise OAuthBearerValidationError("JWT has no exp claim")
        if now > exp + skew:
            raise OAuthBearerValidationError(f"JWT expired at {exp:.0f} (now {now:.0f})")
        nbf = _numeric(claims, "nbf")
        if nbf is not None and now + skew < nbf:
            raise OAuthBearerValidationError(f"JWT not valid before {nbf:.0f} (now {now:.0f})")
        iat = _numeric(claims, "iat")
        principal = claims.get(cfg.sub_claim_name)
        if not isinstance(principal, str) or not principal.strip():
            raise OAuthBearerValidationError(
                f"JWT principal claim {cfg.sub_claim_name!r} is missing or not a string"
            )
        raw_scope = claims.get(cfg.scope_claim_name)
        if isinstance(raw_scope, str):
            scope = frozenset(raw_scope.split())
        elif isinstance(raw_scope, list) and all(isinstance(s, str) for s in raw_scope):
            scope = frozenset(raw_scope)
        elif raw_scope is None:
            scope = frozenset()
        else:
            raise OAuthBearerValidationError(f"JWT scope claim {cfg.scope_claim_name!r} malformed")
        return OAuthBearerToken(
            value=token,
            principal=principal,
            lifetime_ms=int(exp * 1000),
            start_ms=None if iat is None else int(iat * 1000),
            scope=scope,
            claims=claims,
        )


@dataclass(frozen=True)
class ClientInitialResponse:
    authzid: str
    token: str
    extensions: dict[str, str]


def parse_initial_response(data: bytes) -> ClientInitialResponse:
    """Parse RFC 7628's client initial response; raise SaslAuthenticationError if malformed."""
    if len(data) > MAX_INITIAL_RESPONSE:
        raise SaslAuthenticationError("Invalid OAUTHBEARER initial response: too long")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise SaslAuthenticationError("Invalid OAUTHBEARER initial response: not ASCII")
    parts = text.split(",", 2)
    if len(parts) != 3 or parts[0] not in ("n", "y"):
        if parts and parts[0].startswith("p"):
            raise SaslAuthenticationError("OAUTHBEARER channel binding is not supported")
        raise SaslAuthenticationError("Invalid OAUTHBEARER initial response: bad gs2 header")
    authz, rest = parts[1], parts[2]
    authzid = ""
    if authz:
        if not authz.startswith("a="):
            raise SaslAuthenticationError("Invalid OAUTHBEARER initial response: bad authzid")
        authzid = unescape_username(authz[2:])
    if not rest.startswith("\x01") or not rest.endswith("\x01\x01") or len(rest) < 3:
        raise SaslAuthenticationError("Invalid OAUTHBEARER initial response: bad framing")
    kvs: dict[str, str] = {}
    for pair in rest[1:-2].split("\x01"):
        key, sep, value = pair.partition("=")
        if not sep or not _KEY.fullmatch(key) or not _VALUE.fullmatch(value) or key in kvs:
            raise SaslAuthenticationError("Invalid OAUTHBEARER initial response: bad key/value")
        kvs[key] = value
    auth = kvs.pop("auth", None)
    if auth is None:
        raise SaslAuthenticationError("Invalid OAUTHBEARER initial response: no auth value")
    m = _AUTH.fullmatch(auth)
    if m is None or m.group(1).lower() != "bearer":
        raise SaslAuthenticationError("Invalid OAUTHBEARER initial response: not a Bearer token")
    return ClientInitialResponse(authzid, m.group(2), kvs)


class OAuthBearerServer:
    """One server-side OAUTHBEARER exchange.

    ``step(initial_response)`` returns b"" on success (``complete``, ``username`` = the
    token's principal, ``credential_expiry_ms`` = its exp, ``token``, ``extensions``), or
    the invalid_token JSON challenge on a bad token; the client's ``\\x01`` that follows
    makes ``step`` raise. Malformed framing raises at once. Unlike Kafka, a second token
    after a failure is not accepted: one exchange, one token.
    """

    mechanism = "OAUTHBEARER"

    def __init__(
        self, validator: OAuthBearerValidator, clock: Callable[[], float] = time.time
    ) -> None:
        self._validator = validator
        self._clock = clock
        self.complete = False
        self.username: str | None = None
        self.credential_expiry_ms: int | None = None
        self.token: OAuthBearerToken | None = None
        self.extensions: dict[str, str] = {}
        self.failure: OAuthBearerValidationError | None = None
        self._state = "initial"

    def step(self, data: bytes) -> bytes:
        state, self._state = self._state, "failed"
        if state == "challenged":
            # The client's \x01 (or anything else) after our error ends the exchange.
            raise SaslAuthenticationError(INVALID_TOKEN.decode())
        if state != "initial":
            raise SaslAuthenticationError("OAUTHBEARER exchange is already " + state)
        resp = parse_initial_response(data)
        try:
            token = self._validator.validate(resp.token, self._clock())
        except OAuthBearerValidationError as e:
            self.failure = e
            self._state = "challenged"
            return INVALID_TOKEN
        if resp.authzid and resp.authzid != token.principal:
            raise SaslAuthenticationError(
                "Authentication failed: Client requested an authorization id that is "
                "different from the token's principal name"
            )
        self.token = token
        self.username = token.principal
        self.credential_expiry_ms = token.lifetime_ms
        self.extensions = resp.extensions
        self.complete = True
        self._state = "done"
        return b""
