"""Kafka's ConsumerProtocol: the subscription and assignment bytes of classic groups.

The broker relays these bytes without needing them (the classic protocol leaves
assignment to the clients); it reads them only to show a group: which topics a member
subscribes to and which partitions it was given (``logmq group describe``, lag), and it
writes an assignment for groups whose assignment the broker computes (describing a
native group to Kafka admin clients). Versions 0-3 (Kafka's ConsumerProtocolSubscription
and ConsumerProtocolAssignment schemas); fields after those a version has are ignored.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from .assignors import TopicPartition

CONSUMER_PROTOCOL_TYPE = "consumer"


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.take(">h")
        if n < 0:
            raise ValueError("null string")
        raw = self.data[self.pos : self.pos + n]
        if len(raw) != n:
            raise ValueError("string past the end")
        self.pos += n
        return raw.decode()

    def partitions(self) -> list[TopicPartition]:
        out = []
        for _ in range(self._count()):
            topic = self.string()
            out += [(topic, self.take(">i")) for _ in range(self._count())]
        return out

    def _count(self) -> int:
        n = self.take(">i")
        if n < 0 or n > len(self.data):
            raise ValueError(f"bad array length {n}")
        return n


def decode_subscription(data: bytes) -> tuple[list[str], list[TopicPartition]]:
    """(subscribed topics, owned partitions) of a Subscription; ValueError if malformed."""
    try:
        r = _Reader(data)
        version = r.take(">h")
        topics = [r.string() for _ in range(r._count())]
        user_data = r.take(">i")
        r.pos += max(user_data, 0)
        owned = r.partitions() if version >= 1 else []
        return topics, owned
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"not a ConsumerProtocol subscription: {exc}") from None


def decode_assignment(data: bytes) -> list[TopicPartition]:
    """The partitions of an Assignment (empty bytes: none); ValueError if malformed."""
    if not data:
        return []
    try:
        r = _Reader(data)
        r.take(">h")
        return r.partitions()
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"not a ConsumerProtocol assignment: {exc}") from None


def encode_assignment(partitions: Iterable[TopicPartition]) -> bytes:
    """An Assignment v0 of ``partitions`` (no user data)."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    out = bytearray(struct.pack(">hi", 0, len(by_topic)))
    for topic, parts in by_topic.items():
        name = topic.encode()
        out += struct.pack(">h", len(name)) + name + struct.pack(">i", len(parts))
        out += b"".join(struct.pack(">i", p) for p in parts)
    out += struct.pack(">i", -1)  # no user data
    return bytes(out)
