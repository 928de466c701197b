"""SASL parts shared by every mechanism: errors, PLAIN, users from Kafka's JAAS syntax, the
mechanism registry and KIP-368 session lifetimes.

Every mechanism server here is sans-IO and has the same shape (``SaslServer``): the Kafka
door feeds it each SaslAuthenticate ``auth_bytes`` through ``step`` and sends back what
``step`` returns; ``step`` raises ``SaslAuthenticationError`` when the exchange fails (the
door answers SASL_AUTHENTICATION_FAILED with the error's message and closes). When
``complete`` turns true, ``username`` is the authenticated name (the door builds the
principal ``User:<username>``) and ``credential_expiry_ms`` is when the credential stops
being valid (an OAuth token's ``exp``), or None.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from logmq.errors import ErrorCode, LogMQError

if TYPE_CHECKING:
    from logmq.security.oauthbearer import OAuthBearerValidator
    from logmq.security.scram import ScramCredential

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")

# Kafka's own failure text for PLAIN: the same for an unknown user and a wrong password.
PLAIN_FAILED = "Authentication failed: Invalid username or password"
MAX_PLAIN_BYTES = 16 * 1024  # authzid, authcid and password together; far above any real one


class SaslAuthenticationError(LogMQError):
    """The exchange failed; str() is safe to send to the client (it names no secret and
    does not tell an unknown user from a wrong password)."""

    code = ErrorCode.SASL_AUTHENTICATION_FAILED


class UnsupportedSaslMechanismError(LogMQError):
    """A mechanism this listener does not enable (SaslHandshake answers
    UNSUPPORTED_SASL_MECHANISM with ``enabled`` as its mechanism list)."""

    code = ErrorCode.UNSUPPORTED_SASL_MECHANISM

    def __init__(self, mechanism: str, enabled: Iterable[str]) -> None:
        self.mechanism = mechanism
        self.enabled = tuple(enabled)
        super().__init__(
            f"Unsupported SASL mechanism {mechanism!r}; enabled: {', '.join(self.enabled) or '-'}"
        )


class SaslServer(Protocol):
    mechanism: str
    complete: bool
    username: str | None
    credential_expiry_ms: int | None

    def step(self, data: bytes) -> bytes: ...


# -- PLAIN (RFC 4616) -------------------------------------------------------------------


class PlainServer:
    """One SASL/PLAIN exchange: a single message ``authzid NUL authcid NUL passwd``."""

    mechanism = "PLAIN"

    def __init__(self, verify: Callable[[str, str], bool]) -> None:
        self._verify = verify
        self.attempted_username: str | None = None
        self.complete = False
        self.username: str | None = None
        self.credential_expiry_ms: int | None = None
        self._used = False

    def step(self, data: bytes) -> bytes:
        if self._used:
            raise SaslAuthenticationError("PLAIN takes exactly one message")
        self._used = True
        if len(data) > MAX_PLAIN_BYTES:
            raise SaslAuthenticationError("Invalid SASL/PLAIN response: too long")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslAuthenticationError("Invalid SASL/PLAIN response: not UTF-8")
        parts = text.split("\0")
        if len(parts) != 3:
            raise SaslAuthenticationError(
                "Invalid SASL/PLAIN response: expected 3 tokens, got " + str(len(parts))
            )
        authzid, authcid, password = parts
        if not authcid:
            raise SaslAuthenticationError("Authentication failed: username not specified")
        if not password:
            raise SaslAuthenticationError("Authentication failed: password not specified")
        if authzid and authzid != authcid:
            raise SaslAuthenticationError(
                "Authentication failed: Client requested an authorization id that is "
                "different from username"
            )
        self.attempted_username = authcid  # for a failed login's log line
        if not self._verify(authcid, password):
            raise SaslAuthenticationError(PLAIN_FAILED)
        self.username = authcid
        self.complete = True
        return b""


# -- JAAS option syntax -----------------------------------------------------------------

CONTROL_FLAGS = ("required", "requisite", "sufficient", "optional")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "a": "\a", "v": "\v"}
_WORD = re.compile(r"[^\s=;\"{}]+")


@dataclass(frozen=True)
class JaasConfig:
    login_module: str
    control_flag: str
    options: dict[str, str] = field(default_factory=dict)


class _JaasLexer:
    """Tokens of Kafka's JAAS syntax: words, double-quoted strings (backslash escapes),
    the punctuation ``= ; { }``, and // or /* */ comments, which are skipped."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def _skip(self) -> None:
        t = self.text
        while self.pos < len(t):
            if t[self.pos].isspace():
                self.pos += 1
            elif t.startswith("//", self.pos) or t.startswith("#", self.pos):
                end = t.find("\n", self.pos)
                self.pos = len(t) if end < 0 else end + 1
            elif t.startswith("/*", self.pos):
                end = t.find("*/", self.pos + 2)
                if end < 0:
                    raise ValueError("JAAS config: unterminated /* comment")
                self.pos = end + 2
            else:
                return

    def peek(self) -> tuple[str, str] | None:
        save = self.pos
        try:
            return self.next()
        finally:
            self.pos = save

    def next(self) -> tuple[str, str] | None:
        """("word"|"str"|"punct", value), or None at the end."""
        self._skip()
        t = self.text
        if self.pos >= len(t):
            return None
        c = t[self.pos]
        if c in "=;{}":
            self.pos += 1
            return ("punct", c)
        if c == '"':
            out: list[str] = []
            i = self.pos + 1
            while i < len(t):
                ch = t[i]
                if ch == '"':
                    self.pos = i + 1
                    return ("str", "".join(out))
                if ch == "\\" and i + 1 < len(t):
                    nxt = t[i + 1]
                    out.append(_ESCAPES.get(nxt, nxt))
                    i += 2
                    continue
                out.append(ch)
                i += 1
            raise ValueError("JAAS config: unterminated quoted value")
        m = _WORD.match(t, self.pos)
        if m is None:  # pragma: no cover - every other character starts a word
            raise ValueError(f"JAAS config: unexpected {c!r} at {self.pos}")
        self.pos = m.end()
        return ("word", m.group())


def _parse_entry(lx: _JaasLexer) -> JaasConfig:
    tok = lx.next()
    if tok is None or tok[0] != "word":
        raise ValueError("JAAS config: expected a login module class name")
    module = tok[1]
    tok = lx.next()
    if tok is None or tok[0] != "word" or tok[1].lower() not in CONTROL_FLAGS:
        raise ValueError(
            f"JAAS config: expected a control flag ({'/'.join(CONTROL_FLAGS)}) after {module}"
        )
    flag = tok[1].lower()
    options: dict[str, str] = {}
    while True:
        tok = lx.next()
        if tok is None:
            raise ValueError("JAAS config: missing ';' at the end of the login module entry")
        if tok == ("punct", ";"):
            return JaasConfig(module, flag, options)
        if tok[0] == "punct":
            raise ValueError(f"JAAS config: unexpected {tok[1]!r} where an option was expected")
        key = tok[1]
        if lx.next() != ("punct", "="):
            raise ValueError(f"JAAS config: option {key!r} has no '=value'")
        val = lx.next()
        if val is None or val[0] == "punct":
            raise ValueError(f"JAAS config: option {key!r} has no value")
        options[key] = val[1]


def parse_jaas_entries(text: str) -> list[JaasConfig]:
    """Every login module entry in ``text``: bare entries (the ``sasl.jaas.config`` form) or
    entries inside ``Section { ... };`` blocks (the classic JAAS file form)."""
    lx = _JaasLexer(text)
    entries: list[JaasConfig] = []
    while (tok := lx.peek()) is not None:
        if tok[0] == "punct":
            raise ValueError(f"JAAS config: unexpected {tok[1]!r}")
        save = lx.pos
        lx.next()
        if lx.peek() == ("punct", "{"):
            lx.next()
            while lx.peek() != ("punct", "}"):
                if lx.peek() is None:
                    raise ValueError("JAAS config: missing '}'")
                entries.append(_parse_entry(lx))
            lx.next()
            if lx.peek() == ("punct", ";"):
                lx.next()
        else:
            lx.pos = save
            entries.append(_parse_entry(lx))
    return entries


def parse_jaas_config(text: str) -> JaasConfig:
    """One ``sasl.jaas.config`` value, e.g. ``org.apache.kafka.common.security.plain.
    PlainLoginModule required username="admin" user_admin="admin-secret";``. Like Kafka's,
    it must hold exactly one login module."""
    entries = parse_jaas_entries(text)
    if len(entries) != 1:
        raise ValueError(f"JAAS config must hold exactly one login module, found {len(entries)}")
    return entries[0]


# -- PLAIN users ------------------------------------------------------------------------


def _digest(s: str) -> bytes:
    # Comparing fixed-size digests keeps compare_digest from leaking the length.
    return hashlib.sha256(s.encode("utf-8")).digest()


class PlainUsers:
    """The PLAIN user table: name -> password, as Kafka's ``user_<name>="<password>"``
    JAAS options hold it (so a Kafka server's config carries over unchanged)."""

    def __init__(self, users: Mapping[str, str] | None = None) -> None:
        self._users = {name: _digest(pw) for name, pw in (users or {}).items()}
        self._dummy = _digest("\0logmq-no-such-user\0")

    def __len__(self) -> int:
        return len(self._users)

    def __contains__(self, name: object) -> bool:
        return name in self._users

    @classmethod
    def from_jaas(cls, config: JaasConfig | str) -> PlainUsers:
        """Users from the ``user_<name>`` options (other options, such as the broker's own
        ``username``/``password``, are not users)."""
        if isinstance(config, str):
            config = parse_jaas_config(config)
        users = {
            k[len("user_") :]: v
            for k, v in config.options.items()
            if k.startswith("user_") and len(k) > len("user_")
        }
        return cls(users)

    @classmethod
    def from_file(cls, path: str | Path) -> PlainUsers:
        """Read a users file in either of two formats.

        1. Kafka JAAS: a ``sasl.jaas.config`` value, or a JAAS file with a section such as
           ``KafkaServer { org.apache.kafka.common.security.plain.PlainLoginModule required
           user_admin="admin-secret" user_alice="alice-secret"; };``. Users are the
           ``user_<name>`` options of the PlainLoginModule entry (or of the only entry).
        2. Simple lines ``name=password``: the first '=' splits, so a password may hold '='
           while a name may not; surrounding whitespace is stripped; blank lines and lines
           starting with '#' are skipped.

        A file whose first meaningful text is a word followed by a JAAS control flag
        (required/requisite/sufficient/optional) or by ``{`` is read as JAAS.
        """
        text = Path(path).read_text(encoding="utf-8")
        if _looks_like_jaas(text):
            entries = parse_jaas_entries(text)
            plain = [e for e in entries if e.login_module.endswith("PlainLoginModule")]
            chosen = plain or entries
            if len(chosen) != 1:
                raise ValueError(
                    f"{path}: expected one PlainLoginModule entry, found {len(chosen)}"
                )
            return cls.from_jaas(chosen[0])
        users: dict[str, str] = {}
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, password = line.partition("=")
            name, password = name.strip(), password.strip()
            if not sep or not name:
                raise ValueError(f"{path}:{lineno}: expected name=password")
            users[name] = password
        return cls(users)

    def verify(self, name: str, password: str) -> bool:
        """Constant-time in the password, and an unknown name costs the same comparison."""
        expected = self._users.get(name)
        ok = hmac.compare_digest(expected or self._dummy, _digest(password))
        return ok and expected is not None

    __call__ = verify


def _looks_like_jaas(text: str) -> bool:
    lx = _JaasLexer(text)
    try:
        first = lx.next()
        second = lx.next()
    except ValueError:
        return False
    if first is None or first[0] != "word" or second is None:
        return False
    return second == ("punct", "{") or (second[0] == "word" and second[1].lower() in CONTROL_FLAGS)


# -- the mechanism registry -------------------------------------------------------------


def enabled_mechanisms(
    *,
    plain_users: Callable[[str, str], bool] | None = None,
    scram_lookup: Callable[[str], ScramCredential | None] | None = None,
    oauth_validator: OAuthBearerValidator | None = None,
) -> tuple[str, ...]:
    """The mechanisms the given collaborators enable, in MECHANISMS order (the list a
    SaslHandshake response carries)."""
    out = []
    if plain_users is not None:
        out.append("PLAIN")
    if scram_lookup is not None:
        out += ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    if oauth_validator is not None:
        out.append("OAUTHBEARER")
    return tuple(out)


def new_server(
    mechanism: str,
    *,
    plain_users: Callable[[str, str], bool] | None = None,
    scram_lookup: Callable[[str], ScramCredential | None] | None = None,
    oauth_validator: OAuthBearerValidator | None = None,
    enabled: Iterable[str] | None = None,
    clock: Callable[[], float] | None = None,
) -> SaslServer:
    """A fresh server for one exchange. A mechanism is available when its collaborator is
    given and (if ``enabled`` is given, e.g. ``sasl.enabled.mechanisms``) it is listed;
    otherwise UnsupportedSaslMechanismError. ``clock`` (seconds) is for OAUTHBEARER's
    time claims; it defaults to time.time."""
    have = enabled_mechanisms(
        plain_users=plain_users, scram_lookup=scram_lookup, oauth_validator=oauth_validator
    )
    if enabled is not None:
        wanted = {m.upper() for m in enabled}
        have = tuple(m for m in have if m in wanted)
    if mechanism not in have:
        raise UnsupportedSaslMechanismError(mechanism, have)
    if mechanism == "PLAIN":
        assert plain_users is not None
        return PlainServer(plain_users)
    if mechanism.startswith("SCRAM-"):
        from logmq.security.scram import ScramServer

        assert scram_lookup is not None
        return ScramServer(mechanism, scram_lookup)
    from logmq.security.oauthbearer import OAuthBearerServer

    assert oauth_validator is not None
    kwargs: dict[str, Any] = {} if clock is None else {"clock": clock}
    return OAuthBearerServer(oauth_validator, **kwargs)


# -- KIP-368 re-authentication ----------------------------------------------------------


@dataclass(frozen=True)
class SaslSessionLifetime:
    """How long an authenticated session may live (KIP-368).

    ``session_lifetime_ms`` is what SaslAuthenticate v1+ answers: 0 means no limit (neither
    ``connections.max.reauth.ms`` nor a credential expiry applies); otherwise the client
    must re-authenticate within it and the broker closes a connection whose session has
    expired (a v0 client, which cannot re-authenticate, is closed at that time too). As in
    Kafka, the lifetime is min(max_reauth_ms, credential expiry - now), never below 0.
    """

    session_lifetime_ms: int
    expires_at_ms: int | None

    @classmethod
    def start(
        cls,
        authenticated_at_ms: int,
        max_reauth_ms: int | None = None,
        credential_expiry_ms: int | None = None,
    ) -> SaslSessionLifetime:
        reauth = max_reauth_ms if max_reauth_ms is not None and max_reauth_ms > 0 else None
        candidates = []
        if reauth is not None:
            candidates.append(reauth)
        if credential_expiry_ms is not None:
            candidates.append(credential_expiry_ms - authenticated_at_ms)
        if not candidates:
            return cls(0, None)
        lifetime = max(0, math.floor(min(candidates)))
        return cls(lifetime, authenticated_at_ms + lifetime)

    def expired(self, now_ms: int) -> bool:
        return self.expires_at_ms is not None and now_ms >= self.expires_at_ms
