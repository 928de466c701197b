"""What a request handler answers: a body plus a tail of raw parts. Sans-IO.

The server encodes the body into the response head (``codec.encode_response_head``) and
then writes the tail parts in order. A part is either bytes (anything exposing a buffer)
or a ``FileRegion``, a range of an open file the server sends with ``os.sendfile`` so
record bytes never enter Python. Parts may interleave freely (bytes, region, bytes,
region, ...): a response that mixes encoded structure with file ranges keeps the zero-copy
path. ``storage.segment.FileSlice`` is the region the storage hands out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard, runtime_checkable

Bytes = bytes | bytearray | memoryview


@runtime_checkable
class FileRegion(Protocol):
    """``length`` bytes of ``file`` from ``position``, e.g. storage.segment.FileSlice.

    ``file`` has ``fileno()`` and stays open while the region is referenced (the sender
    may run after the segment was evicted or deleted). ``read()`` returns the bytes, for
    the buffered route small responses take; it may come up short if the file shrank.
    """

    file: Any
    position: int
    length: int

    def read(self) -> bytes: ...


TailPart = Bytes | FileRegion
Tail = Sequence[TailPart]


@dataclass(slots=True)
class Reply:
    """A response body (encoded by the server into the head) plus its tail parts."""

    body: dict[str, Any]
    tail: Tail = ()
    # close the connection once this answer is sent (a failed login, a request a SASL
    # listener refuses before authentication), as Kafka does
    close: bool = False
    # a client over its quota (KIP-219): the answer goes out at once, carrying this in
    # its throttle_time, and the connection then reads no request for this long
    throttle_ms: int = 0
    # nothing is written (Kafka's acks=0 Produce): the connection is still muted for
    # throttle_ms and closed if close is set, as Kafka's sendNoOpResponse and
    # closeConnection do
    silent: bool = False
    # the connection's codec from this answer on (net/wire.py): SaslHandshake v0 switches
    # to raw SASL tokens and the last token back (kafka/sasl.py). Frames after this
    # answer are read with it; this answer is still written with the old one.
    wire: Any = None


# Part class -> is it a FileRegion. isinstance() against a runtime_checkable protocol
# inspects every member each time (about 13 µs on CPython 3.11, per part of every fetch
# response); the answer depends only on the class, so it is worked out once per class.
_IS_REGION: dict[type, bool] = {bytes: False, bytearray: False, memoryview: False}


def is_region(part: TailPart) -> TypeGuard[FileRegion]:
    """True for a FileRegion, False for bytes; TypeError for anything else."""
    region = _IS_REGION.get(type(part))
    if region is None:
        region = _classify(part)
    return region


def _classify(part: object) -> bool:
    if isinstance(part, Bytes):
        region = False
    elif isinstance(part, FileRegion):
        region = True
    else:
        raise TypeError(f"a reply tail holds bytes or file regions, not {type(part).__name__}")
    _IS_REGION[type(part)] = region
    return region


def tail_size(tail: Tail) -> tuple[int, bool]:
    """Bytes the tail puts on the wire, and whether any part is a file region."""
    size = 0
    has_region = False
    kinds = _IS_REGION
    for part in tail:
        region = kinds.get(type(part))
        if region is None:
            region = _classify(part)
        if region:
            has_region = True
            size += part.length  # type: ignore[union-attr]
        else:
            size += len(part)  # type: ignore[arg-type]
    return size, has_region
