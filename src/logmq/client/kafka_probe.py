"""Whether an address that failed logmq's native protocol is a Kafka listener instead.

A broker serves two ports, and a user who points the native client (or the ``logmq``
CLI) at the Kafka one gets a frame it cannot decode or a closed connection: "undecodable
msgpack body" says nothing useful. So when an address has never answered natively, the
client asks it a Kafka ApiVersions v0 (the one request every Kafka broker answers, in a
layout that has not changed since 0.10) on a fresh connection; an exact answer means
the user gave a Kafka port, and the error says so and where the native port is. Only on
that failure path: a working client never probes.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct

from logmq.errors import BootstrapError

NATIVE_DEFAULT_PORT = 9192  # logmq-server --port
PROBE_TIMEOUT = 2.0
API_VERSIONS = 18
_CORRELATION = 0x6C6D7170  # "lmqp": an answer echoing it is to this probe
_CLIENT_ID = b"logmq-probe"
_MAX_ANSWER = 64 * 1024  # a few hundred bytes in practice; anything larger is not it


class KafkaListenerError(BootstrapError):
    """The bootstrap address speaks Kafka's protocol, not logmq's native one."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        hint = f": try {host}:{NATIVE_DEFAULT_PORT}" if port != NATIVE_DEFAULT_PORT else ""
        super().__init__(
            f"{host}:{port} is a Kafka listener; logmq's native port (for logmq clients and "
            f"the logmq CLI) is the broker's --port, default {NATIVE_DEFAULT_PORT}{hint}. "
            "Kafka clients (kcat, confluent-kafka, ...) use the Kafka port."
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


async def speaks_kafka(host: str, port: int, timeout: float = PROBE_TIMEOUT) -> bool:
    """Ask ``host:port`` a Kafka ApiVersions v0; True only for an exact answer."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(api_versions_request())
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                if not 10 <= size <= _MAX_ANSWER:
                    return False
                return is_api_versions_answer(await reader.readexactly(size))
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return False
