"""Public record types returned by the clients."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True, frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    timestamp: int  # milliseconds since the epoch
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)


@dataclass(slots=True, frozen=True)
class RecordMetadata:
    """What an acknowledged send tells the producer."""

    topic: str
    partition: int
    offset: int  # -1 with acks=0
    timestamp: int
