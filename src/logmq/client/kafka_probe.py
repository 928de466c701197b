"""What an address that failed logmq's native protocol is instead: a Kafka listener, or
one whose TLS the client's settings do not match.

A broker serves two ports, and a user who points the native client (or the ``logmq``
CLI) at the Kafka one gets a frame it cannot decode or a closed connection: "undecodable
msgpack body" says nothing useful. Likewise a PLAINTEXT client on a TLS port sees a
closed connection, and a TLS client on a PLAINTEXT port an SSL error. So when an address
has never answered natively, the client looks at it once more on fresh connections: a
TLS handshake (with no certificate check: it only asks whether the peer speaks TLS),
and a Kafka ApiVersions v0 (the one request every Kafka broker answers, before any
SASL login, in a layout that has not changed since 0.10) in clear or over TLS. An exact
answer means a Kafka port, and the error says so and where the native port is. Only on
that failure path: a working client never probes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct

from logmq.errors import BootstrapError

NATIVE_DEFAULT_PORT = 9192  # logmq-server --port
PROBE_TIMEOUT = 2.0
CLOSE_WAIT = 0.25  # for a probe's connection to close
API_VERSIONS = 18
_CORRELATION = 0x6C6D7170  # "lmqp": an answer echoing it is to this probe
_CLIENT_ID = b"logmq-probe"
_MAX_ANSWER = 64 * 1024  # a few hundred bytes in practice; anything larger is not it
# OpenSSL's reasons for a peer that answered a ClientHello with something not TLS
_NOT_TLS = frozenset(
    {
        "WRONG_VERSION_NUMBER",
        "UNEXPECTED_EOF_WHILE_READING",
        "RECORD_LAYER_FAILURE",
        "PACKET_LENGTH_TOO_LONG",
        "HTTP_REQUEST",
        "UNKNOWN_PROTOCOL",
        "RECORD_TOO_LARGE",
    }
)


class ListenerMismatchError(BootstrapError):
    """The bootstrap address is a listener of another kind than the client expects."""


class KafkaListenerError(ListenerMismatchError):
    """The bootstrap address speaks Kafka's protocol, not logmq's native one."""

    def __init__(self, host: str, port: int, tls: bool = False):
        self.host, self.port = host, port
        hint = f": try {host}:{NATIVE_DEFAULT_PORT}" if port != NATIVE_DEFAULT_PORT else ""
        kind = " (over TLS)" if tls else ""
        super().__init__(
            f"{host}:{port} is a Kafka listener{kind}; logmq's native port (for logmq clients "
            f"and the logmq CLI) is the broker's --port, default {NATIVE_DEFAULT_PORT}{hint}. "
            "Kafka clients (kcat, confluent-kafka, ...) use the Kafka port."
        )


class TlsListenerError(ListenerMismatchError):
    """The address speaks TLS; the client was not told to."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        super().__init__(
            f"{host}:{port} speaks TLS, and this client is set for PLAINTEXT: set "
            "security.protocol to SSL or SASL_SSL and ssl.ca.location to the CA that signed "
            "the broker's certificate (the logmq CLI: -X security.protocol=SASL_SSL "
            "-X ssl.ca.location=CA.pem ..., --command-config FILE, or LOGMQ_SECURITY_PROTOCOL)"
        )


class NotTlsListenerError(ListenerMismatchError):
    """The client was told to use TLS; the address does not speak it."""

    def __init__(self, host: str, port: int, protocol: str):
        self.host, self.port = host, port
        plain = "SASL_PLAINTEXT" if protocol == "SASL_SSL" else "PLAINTEXT"
        super().__init__(
            f"{host}:{port} does not speak TLS, and this client is set for {protocol}: it is "
            f"a PLAINTEXT or SASL_PLAINTEXT listener (security.protocol={plain}), or not the "
            "broker's secured port"
        )


def api_versions_request() -> bytes:
    """An ApiVersions v0 request frame: header v1 (key, version, correlation, client id)
    and an empty body."""
    header = struct.pack(">hhih", API_VERSIONS, 0, _CORRELATION, len(_CLIENT_ID)) + _CLIENT_ID
    return struct.pack(">i", len(header)) + header


def is_api_versions_answer(frame: bytes) -> bool:
    """Is ``frame`` (without its size) a Kafka ApiVersions v0 answer to our probe?

    Correlation id echoed, then error code, then an array of (key, min, max) int16
    triples that ends exactly at the frame's end: random bytes do not pass."""
    if len(frame) < 10:
        return False
    corr, _error, count = struct.unpack_from(">ihi", frame)
    return corr == _CORRELATION and count >= 0 and len(frame) == 10 + 6 * count


def _unverified() -> ssl.SSLContext:
    """A context that only finds out whether the peer speaks TLS: no certificate check."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


async def speaks_kafka(
    host: str, port: int, timeout: float = PROBE_TIMEOUT, *, tls: bool = False
) -> bool:
    """Ask ``host:port`` a Kafka ApiVersions v0 (over TLS with ``tls``); True only for
    an exact answer."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=_unverified() if tls else None
            )
            try:
                writer.write(api_versions_request())
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                if not 10 <= size <= _MAX_ANSWER:
                    return False
                return is_api_versions_answer(await reader.readexactly(size))
            finally:
                await _closed(writer)
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return False


async def speaks_tls(host: str, port: int, timeout: float = PROBE_TIMEOUT) -> bool | None:
    """Does ``host:port`` answer a TLS handshake: True, False (it answered something
    else, or closed), None (no connection, no answer in time)."""
    try:
        async with asyncio.timeout(timeout):
            _, sock_writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        return None
    try:
        async with asyncio.timeout(timeout):
            await sock_writer.start_tls(_unverified(), server_hostname=host)
        return True
    except ssl.SSLError as e:
        # a TLS alert means the peer speaks TLS but refused this handshake
        return not (isinstance(e, ssl.SSLEOFError) or e.reason in _NOT_TLS)
    except (ConnectionResetError, BrokenPipeError, asyncio.IncompleteReadError):
        return False
    except (OSError, TimeoutError):
        return None
    finally:
        await _closed(sock_writer)


async def _closed(writer: asyncio.StreamWriter) -> None:
    """Close ``writer`` and wait for it, briefly: after a reset or a failed TLS handshake
    ``wait_closed`` may never return (seen on uvloop), and a probe on the failure path
    must not hang the client whose failure it explains."""
    writer.close()
    with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
        async with asyncio.timeout(CLOSE_WAIT):
            await writer.wait_closed()


async def diagnose(host: str, port: int, protocol: str) -> ListenerMismatchError | None:
    """What is wrong with this address for a client of ``protocol``, if it is another
    kind of listener than the client expects; None when nothing shows."""
    tls = await speaks_tls(host, port)
    if tls is None:
        return None
    if tls and await speaks_kafka(host, port, tls=True):
        return KafkaListenerError(host, port, tls=True)
    if not tls and await speaks_kafka(host, port):
        return KafkaListenerError(host, port)
    client_tls = protocol in ("SSL", "SASL_SSL")
    if tls and not client_tls:
        return TlsListenerError(host, port)
    if client_tls and not tls:
        return NotTlsListenerError(host, port, protocol)
    return None
