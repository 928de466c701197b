"""Public record types returned by the clients.

``Record`` is a tuple subclass with named read-only properties rather than a frozen
dataclass: consumers build hundreds of thousands of them per second, and building a
tuple subclass with ``tuple.__new__`` from C-level ``map``/``zip`` loops costs a third of
a frozen dataclass ``__init__``. The fields stay the public API; the tuple layout is
an implementation detail.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Any

Header = tuple[str, bytes | None]

_tuple_new = tuple.__new__


class Record(tuple):
    """One consumed record: topic, partition, offset, timestamp (ms), key, value, headers.

    Immutable and hashable when it has no headers. Equal only to another Record with
    the same fields. ``headers`` is a list of ``(name, value)`` pairs (empty if none).
    """

    __slots__ = ()
    _fields = ("topic", "partition", "offset", "timestamp", "key", "value", "headers")
    __match_args__ = _fields

    def __new__(
        cls,
        topic: str,
        partition: int,
        offset: int,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[Header] | None = None,
    ) -> Record:
        # No headers are stored as None: the fetcher builds records that way, and a
        # shared [] would be one mutable list aliased by every record.
        h = list(headers) if headers else None
        return _tuple_new(cls, (topic, partition, offset, timestamp, key, value, h))

    topic: str = property(itemgetter(0), doc="Topic name.")  # type: ignore[assignment]
    partition: int = property(itemgetter(1), doc="Partition number.")  # type: ignore[assignment]
    offset: int = property(itemgetter(2), doc="Offset in the partition.")  # type: ignore[assignment]
    timestamp: int = property(itemgetter(3), doc="Milliseconds since the epoch.")  # type: ignore[assignment]
    key: bytes | None = property(itemgetter(4), doc="Key bytes or None.")  # type: ignore[assignment]
    value: bytes | None = property(itemgetter(5), doc="Value bytes or None.")  # type: ignore[assignment]

    @property
    def headers(self) -> list[Header]:
        h = tuple.__getitem__(self, 6)
        return [] if h is None else h

    def __getnewargs__(self) -> tuple[Any, ...]:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not (isinstance(other, Record) and tuple.__eq__(self, other))

    __hash__ = tuple.__hash__

    def __repr__(self) -> str:
        return (
            f"Record(topic={self[0]!r}, partition={self[1]!r}, offset={self[2]!r}, "
            f"timestamp={self[3]!r}, key={self[4]!r}, value={self[5]!r}, "
            f"headers={self.headers!r})"
        )


@dataclass(slots=True, frozen=True)
class RecordMetadata:
    """What an acknowledged send tells the producer."""

    topic: str
    partition: int
    offset: int  # -1 with acks=0
    timestamp: int
