"""Just enough of the Kafka wire protocol to see that a broker serves Kafka clients and to
create topics: Metadata v4 and CreateTopics v2, hand-encoded with ``struct``.

Why not a Kafka client or kio: the pytest plugin is imported by every test session of
every project that installs logmq, so this package imports nothing but the standard
library, and it must not depend on which Kafka client the project happens to use.
"""

from __future__ import annotations

import itertools
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass

METADATA = 3
CREATE_TOPICS = 19

# the Kafka error codes this package acts on; others are reported by number
NO_ERROR = 0
LEADER_NOT_AVAILABLE = 5
REQUEST_TIMED_OUT = 7
TOPIC_ALREADY_EXISTS = 36
NOT_CONTROLLER = 41
ERROR_NAMES = {
    LEADER_NOT_AVAILABLE: "LEADER_NOT_AVAILABLE",
    REQUEST_TIMED_OUT: "REQUEST_TIMED_OUT",
    TOPIC_ALREADY_EXISTS: "TOPIC_ALREADY_EXISTS",
    NOT_CONTROLLER: "NOT_CONTROLLER",
    3: "UNKNOWN_TOPIC_OR_PARTITION",
    17: "INVALID_TOPIC_EXCEPTION",
    37: "INVALID_PARTITIONS",
    38: "INVALID_REPLICATION_FACTOR",
    40: "INVALID_CONFIG",
}

CLIENT_ID = "logmq.testing"


class KafkaError(RuntimeError):
    """A Kafka error code in a response, with its name when known."""

    def __init__(self, code: int, message: str | None = None):
        self.code = code
        self.name = ERROR_NAMES.get(code, f"error {code}")
        super().__init__(f"{self.name}: {message}" if message else self.name)


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    error_code: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    error_code: int
    partitions: tuple[PartitionInfo, ...]


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    brokers: tuple[tuple[int, str, int], ...]  # (node id, host, Kafka port)
    controller_id: int
    topics: tuple[TopicInfo, ...]


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes):
        self.buf = buf
        self.pos = 0

    def _take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def int8(self) -> int:
        return self._take(">b")

    def int16(self) -> int:
        return self._take(">h")

    def int32(self) -> int:
        return self._take(">i")

    def string(self) -> str | None:
        n = self.int16()
        if n < 0:
            return None
        s = self.buf[self.pos : self.pos + n].decode()
        self.pos += n
        return s

    def int32s(self) -> tuple[int, ...]:
        return tuple(self.int32() for _ in range(max(self.int32(), 0)))


def _string(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">h", -1)
    b = s.encode()
    return struct.pack(">h", len(b)) + b


class KafkaConnection:
    """One blocking connection to a broker's Kafka listener."""

    _correlation = itertools.count(1)

    def __init__(self, host: str, port: int, timeout: float):
        self.sock = socket.create_connection((host, port), timeout=timeout)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> KafkaConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, api_key: int, version: int, body: bytes) -> _Reader:
        correlation_id = next(self._correlation) & 0x7FFFFFFF
        header = struct.pack(">hhi", api_key, version, correlation_id) + _string(CLIENT_ID)
        frame = header + body
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        (size,) = struct.unpack(">i", self._read(4))
        reply = _Reader(self._read(size))
        if reply.int32() != correlation_id:
            raise ConnectionError("Kafka response for another request")
        return reply

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            buf += chunk
        return bytes(buf)

    def metadata(self, topics: list[str] | None = None) -> ClusterInfo:
        """Metadata v4, never auto-creating: ``None`` asks for every topic."""
        if topics is None:
            body = struct.pack(">i", -1)
        else:
            body = struct.pack(">i", len(topics)) + b"".join(_string(t) for t in topics)
        r = self.request(METADATA, 4, body + b"\x00")  # allow_auto_topic_creation=false
        r.int32()  # throttle time
        brokers = []
        for _ in range(r.int32()):
            node_id, host, port = r.int32(), r.string(), r.int32()
            r.string()  # rack
            brokers.append((node_id, host or "", port))
        r.string()  # cluster id
        controller_id = r.int32()
        topics_out = []
        for _ in range(r.int32()):
            error_code, name = r.int16(), r.string()
            r.int8()  # is_internal
            partitions = []
            for _ in range(r.int32()):
                p_error, index, leader = r.int16(), r.int32(), r.int32()
                partitions.append(PartitionInfo(index, p_error, leader, r.int32s(), r.int32s()))
            topics_out.append(TopicInfo(name or "", error_code, tuple(partitions)))
        return ClusterInfo(tuple(brokers), controller_id, tuple(topics_out))

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: Mapping[str, str],
        timeout_ms: int,
    ) -> None:
        """CreateTopics v2 for one topic; raises KafkaError for an error code."""
        body = struct.pack(">i", 1) + _string(name)
        body += struct.pack(">ihi", partitions, replication_factor, 0)  # no assignments
        body += struct.pack(">i", len(configs))
        body += b"".join(_string(k) + _string(v) for k, v in configs.items())
        body += struct.pack(">ib", timeout_ms, 0)  # validate_only=false
        r = self.request(CREATE_TOPICS, 2, body)
        r.int32()  # throttle time
        for _ in range(r.int32()):
            r.string()  # name
            code, message = r.int16(), r.string()
            if code != NO_ERROR:
                raise KafkaError(code, message)
