"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) the way Kafka speaks them.

Two messages each way: client-first ``n,,n=<user>,r=<cnonce>`` -> server-first
``r=<cnonce><snonce>,s=<salt>,i=<iterations>`` -> client-final ``c=biws,r=<nonce>,p=<proof>``
-> server-final ``v=<server signature>``. A failure is not an ``e=`` message: as in Kafka the
server raises and the door answers SASL_AUTHENTICATION_FAILED. Passwords are used as UTF-8
without SASLprep, as Kafka does, so credentials made by Kafka's tools verify here.

The broker stores only ``ScramCredential`` (salt, StoredKey, ServerKey, iterations), the
same fields as Kafka's UserScramCredentialRecord; a password never reaches the metadata log.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from logmq.security.sasl import SaslAuthenticationError

_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
SCRAM_MECHANISMS = tuple(_HASHES)
# Kafka's bounds for both SHA-256 and SHA-512 credentials.
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 4096
MAX_MESSAGE_BYTES = 4096  # a SCRAM message is a few hundred bytes; refuse anything large

# One secret per process derives the decoy salt shown for an unknown user: the same name
# always gets the same salt (a changing salt would itself reveal that the user is fake).
_DECOY_SECRET = secrets.token_bytes(32)


def _hash_name(mechanism: str) -> str:
    try:
        return _HASHES[mechanism]
    except KeyError:
        raise ValueError(
            f"unknown SCRAM mechanism {mechanism!r} (expected one of {SCRAM_MECHANISMS})"
        ) from None


def _hmac(name: str, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, name).digest()


def _check_iterations(iterations: int) -> None:
    if not isinstance(iterations, int) or isinstance(iterations, bool):
        raise ValueError(f"SCRAM iterations must be an integer, got {iterations!r}")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(
            f"SCRAM iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}, "
            f"got {iterations}"
        )


def _salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(_hash_name(mechanism), password.encode("utf-8"), salt, iterations)


def escape_username(name: str) -> str:
    """RFC 5802 saslname: ',' -> '=2C' and '=' -> '=3D' (order matters)."""
    return name.replace("=", "=3D").replace(",", "=2C")


def unescape_username(saslname: str) -> str:
    """Inverse of escape_username; any other '=' sequence is malformed."""
    out: list[str] = []
    i = 0
    while i < len(saslname):
        c = saslname[i]
        if c == "=":
            code = saslname[i + 1 : i + 3]
            if code == "2C":
                out.append(",")
            elif code == "3D":
                out.append("=")
            else:
                raise SaslAuthenticationError("Invalid SCRAM username: bad '=' escape")
            i += 3
        else:
            out.append(c)
            i += 1
    return "".join(out)


_NONCE = re.compile(r"[\x21-\x2b\x2d-\x7e]+")  # printable ASCII except ','


def _valid_nonce(nonce: str) -> bool:
    return _NONCE.fullmatch(nonce) is not None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise SaslAuthenticationError(f"Invalid SCRAM message: {what} is not base64")


@dataclass(frozen=True)
class ScramCredential:
    """What the broker keeps for one user and mechanism (never the password)."""

    mechanism: str
    salt: bytes
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)
    iterations: int

    def __post_init__(self) -> None:
        name = _hash_name(self.mechanism)
        _check_iterations(self.iterations)
        size = hashlib.new(name).digest_size
        if len(self.stored_key) != size or len(self.server_key) != size:
            raise ValueError(f"{self.mechanism} keys must be {size} bytes")
        if not self.salt:
            raise ValueError("SCRAM salt must not be empty")

    @classmethod
    def from_salted_password(
        cls, mechanism: str, salted_password: bytes, salt: bytes, iterations: int
    ) -> ScramCredential:
        name = _hash_name(mechanism)
        client_key = _hmac(name, salted_password, b"Client Key")
        return cls(
            mechanism=mechanism,
            salt=salt,
            stored_key=hashlib.new(name, client_key).digest(),
            server_key=_hmac(name, salted_password, b"Server Key"),
            iterations=iterations,
        )

    @classmethod
    def from_password(
        cls,
        mechanism: str,
        password: str,
        iterations: int = DEFAULT_ITERATIONS,
        salt: bytes | None = None,
    ) -> ScramCredential:
        _hash_name(mechanism)
        _check_iterations(iterations)
        if salt is None:
            salt = secrets.token_bytes(32)
        salted = _salted_password(mechanism, password, salt, iterations)
        return cls.from_salted_password(mechanism, salted, salt, iterations)

    def to_record(self) -> dict[str, Any]:
        """A msgpack-friendly dict for the metadata log."""
        return {
            "mechanism": self.mechanism,
            "salt": self.salt,
            "stored_key": self.stored_key,
            "server_key": self.server_key,
            "iterations": self.iterations,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ScramCredential:
        try:
            return cls(
                mechanism=str(record["mechanism"]),
                salt=bytes(record["salt"]),
                stored_key=bytes(record["stored_key"]),
                server_key=bytes(record["server_key"]),
                iterations=record["iterations"],
            )
        except KeyError as e:
            raise ValueError(f"SCRAM credential record lacks {e.args[0]!r}") from None


def _failed(mechanism: str) -> SaslAuthenticationError:
    # Kafka's wording; identical for an unknown user and a wrong password.
    return SaslAuthenticationError(
        "Authentication failed during authentication due to invalid credentials with "
        f"SASL mechanism {mechanism}"
    )


def _decode(data: bytes) -> str:
    if len(data) > MAX_MESSAGE_BYTES:
        raise SaslAuthenticationError("Invalid SCRAM message: too long")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslAuthenticationError("Invalid SCRAM message: not UTF-8")


def _attr(part: str, key: str, what: str) -> str:
    if not part.startswith(key + "="):
        raise SaslAuthenticationError(f"Invalid SCRAM {what}: expected '{key}=' attribute")
    return part[len(key) + 1 :]


class ScramServer:
    """One server-side SCRAM exchange: ``step(client_first)`` -> server-first, then
    ``step(client_final)`` -> server-final; after that ``complete`` is true and
    ``username`` is the authenticated (unescaped) name.

    An unknown user gets a decoy credential (a 32-byte salt derived from the name, and
    ``decoy_iterations``: set it to the iteration count the deployment's users have) and
    the exchange runs to the end, failing with the same message and at the same step as a
    wrong password. ``nonce`` makes the server's nonce part deterministic for tests.
    ``strict_nonce`` refuses a client-final nonce that is not exactly the server-first one
    (``sasl.scram.strict.nonce``); by default one that ends with it passes, as in Kafka 3.9.
    """

    def __init__(
        self,
        mechanism: str,
        lookup: Callable[[str], ScramCredential | None],
        nonce: Callable[[], str] | None = None,
        decoy_iterations: int = DEFAULT_ITERATIONS,
        strict_nonce: bool = False,
    ) -> None:
        self.mechanism = mechanism
        self.strict_nonce = strict_nonce
        self._hash = _hash_name(mechanism)
        _check_iterations(decoy_iterations)
        self._decoy_iterations = decoy_iterations
        self._lookup = lookup
        self._nonce = nonce or (lambda: secrets.token_urlsafe(24))
        self.complete = False
        self.username: str | None = None
        self.credential_expiry_ms: int | None = None
        self._state = "first"
        self._name = ""
        self._cred: ScramCredential | None = None
        self._real = False
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce_full = ""

    @property
    def attempted_username(self) -> str | None:
        """The name the client gave (for a failed login's log line), or None yet."""
        return self._name or None

    def step(self, data: bytes) -> bytes:
        state, self._state = self._state, "failed"  # any exception leaves it failed
        if state == "first":
            out = self._client_first(_decode(data))
            self._state = "final"
            return out
        if state == "final":
            out = self._client_final(_decode(data))
            self._state = "done"
            self.complete = True
            self.username = self._name
            return out
        raise SaslAuthenticationError("SCRAM exchange is already " + state)

    def _decoy(self, name: str) -> ScramCredential:
        size = hashlib.new(self._hash).digest_size
        seed = _hmac("sha256", _DECOY_SECRET, f"{self.mechanism}\0{name}".encode())
        return ScramCredential(
            mechanism=self.mechanism,
            salt=seed,  # 32 bytes, the length of from_password's salts
            stored_key=_hmac(self._hash, seed, b"stored")[:size],
            server_key=_hmac(self._hash, seed, b"server")[:size],
            iterations=self._decoy_iterations,
        )

    def _client_first(self, text: str) -> bytes:
        parts = text.split(",", 2)
        if len(parts) != 3:
            raise SaslAuthenticationError("Invalid SCRAM client-first message")
        flag, authz, bare = parts
        if flag.startswith("p"):
            raise SaslAuthenticationError("SCRAM channel binding is not supported")
        if flag not in ("n", "y"):
            raise SaslAuthenticationError("Invalid SCRAM client-first message: bad gs2 flag")
        authzid = unescape_username(_attr(authz, "a", "authzid")) if authz else ""
        attrs = bare.split(",")
        if attrs[0].startswith("m="):
            raise SaslAuthenticationError("SCRAM mandatory extensions are not supported")
        if len(attrs) < 2:
            raise SaslAuthenticationError("Invalid SCRAM client-first message")
        name = unescape_username(_attr(attrs[0], "n", "client-first message"))
        cnonce = _attr(attrs[1], "r", "client-first message")
        if not name:
            raise SaslAuthenticationError("Invalid SCRAM client-first message: empty username")
        if not _valid_nonce(cnonce):
            raise SaslAuthenticationError("Invalid SCRAM client-first message: bad nonce")
        for ext in attrs[2:]:
            key, sep, value = ext.partition("=")
            if not sep or not key:
                raise SaslAuthenticationError("Invalid SCRAM extension " + repr(ext[:40]))
            if key == "tokenauth" and value.lower() == "true":
                raise SaslAuthenticationError(
                    "Delegation token authentication (tokenauth=true) is not supported"
                )
        if authzid and authzid != name:
            raise SaslAuthenticationError(
                "Authentication failed: Client requested an authorization id that is "
                "different from username"
            )
        cred = self._lookup(name)
        self._real = cred is not None and cred.mechanism == self.mechanism
        self._cred = cred if self._real else self._decoy(name)
        snonce = self._nonce()
        if not _valid_nonce(snonce):  # pragma: no cover - a bad injected generator
            raise ValueError("server nonce must be printable ASCII without ','")
        self._name = name
        self._gs2_header = f"{flag},{authz},"
        self._client_first_bare = bare
        self._nonce_full = cnonce + snonce
        assert self._cred is not None
        self._server_first = (
            f"r={self._nonce_full},s={_b64(self._cred.salt)},i={self._cred.iterations}"
        )
        return self._server_first.encode("ascii")

    def _client_final(self, text: str) -> bytes:
        head, sep, proof_b64 = text.rpartition(",p=")
        if not sep or "," in proof_b64:
            raise SaslAuthenticationError("Invalid SCRAM client-final message: no proof")
        attrs = head.split(",")
        if len(attrs) < 2:
            raise SaslAuthenticationError("Invalid SCRAM client-final message")
        cbind = _attr(attrs[0], "c", "client-final message")
        nonce = _attr(attrs[1], "r", "client-final message")
        expected_cbind = _b64(self._gs2_header.encode("utf-8"))
        if not hmac.compare_digest(cbind.encode(), expected_cbind.encode()):
            raise SaslAuthenticationError("Invalid SCRAM client-final message: channel binding")
        self._check_final_nonce(nonce)
        proof = _unb64(proof_b64, "proof")
        cred = self._cred
        assert cred is not None
        if len(proof) != len(cred.stored_key):
            raise _failed(self.mechanism)
        # the client-final-without-proof as received, a repeated client nonce included
        auth_message = f"{self._client_first_bare},{self._server_first},{head}".encode()
        client_signature = _hmac(self._hash, cred.stored_key, auth_message)
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
        computed = hashlib.new(self._hash, client_key).digest()
        if not (hmac.compare_digest(computed, cred.stored_key) and self._real):
            raise _failed(self.mechanism)
        server_signature = _hmac(self._hash, cred.server_key, auth_message)
        return f"v={_b64(server_signature)}".encode("ascii")

    def _check_final_nonce(self, nonce: str) -> None:
        """Equal to the server-first nonce, or (tolerant) ending with it: Kafka 3.9's
        ``endsWith``. Either way the server's fresh part must be there."""
        full = self._nonce_full
        if nonce == full:
            return
        if not nonce.endswith(full) or not _valid_nonce(nonce):
            raise SaslAuthenticationError("Invalid SCRAM client-final message: nonce mismatch")
        if self.strict_nonce:
            raise SaslAuthenticationError(
                "Invalid SCRAM client-final message: nonce mismatch (the client repeats its "
                "nonce before the server's, as librdkafka before 2.6.1 does; the broker's "
                "sasl.scram.strict.nonce refuses it)"
            )


class ScramClient:
    """The client side of one exchange (logmq's native client, tests)."""

    def __init__(
        self, mechanism: str, username: str, password: str, nonce: str | None = None
    ) -> None:
        self.mechanism = mechanism
        self._hash = _hash_name(mechanism)
        self.username = username
        self._password = password
        self._nonce = nonce if nonce is not None else secrets.token_urlsafe(24)
        if not _valid_nonce(self._nonce):
            raise ValueError("client nonce must be printable ASCII without ','")
        self._bare = f"n={escape_username(username)},r={self._nonce}"
        self._server_signature: bytes | None = None
        self.complete = False

    def first(self) -> bytes:
        return ("n,," + self._bare).encode("utf-8")

    def final(self, server_first: bytes) -> bytes:
        text = _decode(server_first)
        attrs = text.split(",")
        if attrs and attrs[0].startswith("e="):
            raise SaslAuthenticationError("SCRAM server error: " + attrs[0][2:])
        if attrs and attrs[0].startswith("m="):
            raise SaslAuthenticationError("SCRAM mandatory extensions are not supported")
        if len(attrs) < 3:
            raise SaslAuthenticationError("Invalid SCRAM server-first message")
        nonce = _attr(attrs[0], "r", "server-first message")
        salt = _unb64(_attr(attrs[1], "s", "server-first message"), "salt")
        try:
            iterations = int(_attr(attrs[2], "i", "server-first message"))
            _check_iterations(iterations)
        except ValueError as e:
            raise SaslAuthenticationError(f"Invalid SCRAM server-first message: {e}")
        if not nonce.startswith(self._nonce) or len(nonce) <= len(self._nonce):
            raise SaslAuthenticationError("SCRAM server nonce does not extend the client nonce")
        if not _valid_nonce(nonce):
            raise SaslAuthenticationError("Invalid SCRAM server-first message: bad nonce")
        salted = _salted_password(self.mechanism, self._password, salt, iterations)
        head = f"c=biws,r={nonce}"
        auth_message = f"{self._bare},{text},{head}".encode()
        client_key = _hmac(self._hash, salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        client_signature = _hmac(self._hash, stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, client_signature, strict=True))
        server_key = _hmac(self._hash, salted, b"Server Key")
        self._server_signature = _hmac(self._hash, server_key, auth_message)
        return f"{head},p={_b64(proof)}".encode("ascii")

    def verify(self, server_final: bytes) -> None:
        """Raise SaslAuthenticationError unless the server proved it knows the credential."""
        if self._server_signature is None:
            raise SaslAuthenticationError("SCRAM server-final before server-first")
        text = _decode(server_final)
        if text.startswith("e="):
            raise SaslAuthenticationError("SCRAM server error: " + text[2:])
        got = _unb64(_attr(text.split(",")[0], "v", "server-final message"), "signature")
        if not hmac.compare_digest(got, self._server_signature):
            raise SaslAuthenticationError("SCRAM server signature does not verify")
        self.complete = True


# -- kafka-storage format --add-scram ---------------------------------------------------

_ADD_SCRAM = re.compile(r"\s*(?P<mech>[A-Za-z0-9-]+)\s*=\s*\[(?P<body>.*)\]\s*", re.S)
_ADD_SCRAM_KEYS = ("name", "password", "saltedpassword", "salt", "iterations")


def _split_options(body: str) -> dict[str, str]:
    """``k=v,k="v, with comma",...``; quoted values may escape '"' and '\\' with '\\'."""
    out: dict[str, str] = {}
    i, n = 0, len(body)
    while i < n:
        eq = body.find("=", i)
        if eq < 0:
            raise ValueError(f"--add-scram: expected key=value at {body[i:]!r}")
        key = body[i:eq].strip()
        i = eq + 1
        while i < n and body[i] == " ":
            i += 1
        if i < n and body[i] == '"':
            chars: list[str] = []
            i += 1
            while True:
                if i >= n:
                    raise ValueError("--add-scram: unterminated quoted value")
                c = body[i]
                if c == "\\" and i + 1 < n:
                    chars.append(body[i + 1])
                    i += 2
                elif c == '"':
                    i += 1
                    break
                else:
                    chars.append(c)
                    i += 1
            value = "".join(chars)
            rest = body[i:].lstrip(" ")
            if rest and not rest.startswith(","):
                raise ValueError(f"--add-scram: junk after quoted value of {key!r}")
            i = n - len(rest) + (1 if rest else 0)
        else:
            comma = body.find(",", i)
            end = n if comma < 0 else comma
            value = body[i:end].strip()
            i = end + 1
        if key in out:
            raise ValueError(f"--add-scram: {key!r} given twice")
        out[key] = value
    return out


@dataclass(frozen=True)
class AddScramUser:
    """One ``--add-scram`` value, salted once. ``same_secret`` tells whether a credential
    already stored has this value's password, so a broker restarted with the option it
    was formatted with (or that another broker wrote) has nothing to say."""

    name: str
    credential: ScramCredential
    password: str | None = field(default=None, repr=False)

    @property
    def mechanism(self) -> str:
        return self.credential.mechanism

    def same_secret(self, stored: ScramCredential) -> bool:
        if stored == self.credential:
            return True
        if self.password is None or stored.mechanism != self.mechanism:
            return False  # saltedpassword=: its credential is the only one it can match
        again = ScramCredential.from_password(
            stored.mechanism, self.password, stored.iterations, stored.salt
        )
        return hmac.compare_digest(again.stored_key, stored.stored_key) and hmac.compare_digest(
            again.server_key, stored.server_key
        )


def parse_add_scram(spec: str) -> tuple[str, str, ScramCredential]:
    """Parse one ``--add-scram`` value (parse_add_scram_user): (mechanism, name, credential)."""
    user = parse_add_scram_user(spec)
    return user.mechanism, user.name, user.credential


def parse_add_scram_user(spec: str) -> AddScramUser:
    """Parse one ``--add-scram`` value as ``kafka-storage format`` takes it:
    ``SCRAM-SHA-512=[name=admin,password=secret]``, optionally with ``iterations=N``,
    ``salt=<base64>``, or ``saltedpassword=<base64>`` (with ``salt``) instead of
    ``password``. Values may be double-quoted."""
    m = _ADD_SCRAM.fullmatch(spec)
    if m is None:
        raise ValueError(
            f"--add-scram: expected 'SCRAM-SHA-256=[name=...,password=...]', got {spec!r}"
        )
    mechanism = m.group("mech").upper()
    _hash_name(mechanism)
    opts = _split_options(m.group("body"))
    unknown = set(opts) - set(_ADD_SCRAM_KEYS)
    if unknown:
        raise ValueError(f"--add-scram: unknown option(s) {', '.join(sorted(unknown))}")
    name = opts.get("name", "")
    if not name:
        raise ValueError("--add-scram: name= is required")
    try:
        iterations = int(opts.get("iterations", DEFAULT_ITERATIONS))
    except ValueError:
        raise ValueError(f"--add-scram: iterations must be an integer: {opts['iterations']!r}")
    _check_iterations(iterations)
    salt = None
    if "salt" in opts:
        try:
            salt = base64.b64decode(opts["salt"], validate=True)
        except binascii.Error:
            raise ValueError("--add-scram: salt must be base64")
        if not salt:
            raise ValueError("--add-scram: salt must not be empty")
    if ("password" in opts) == ("saltedpassword" in opts):
        raise ValueError("--add-scram: give exactly one of password= and saltedpassword=")
    if "password" in opts:
        cred = ScramCredential.from_password(mechanism, opts["password"], iterations, salt)
    else:
        if salt is None:
            raise ValueError("--add-scram: saltedpassword= needs salt=")
        try:
            salted = base64.b64decode(opts["saltedpassword"], validate=True)
        except binascii.Error:
            raise ValueError("--add-scram: saltedpassword must be base64")
        cred = ScramCredential.from_salted_password(mechanism, salted, salt, iterations)
    return AddScramUser(name, cred, opts.get("password"))
