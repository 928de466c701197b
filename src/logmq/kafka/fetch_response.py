"""Kafka Fetch responses (v4-v17) encoded by hand, so record bytes stay file regions.

A generic encoder would need every partition's records in memory. Here the response is
a list of parts: struct bytes, then the partition's file region (sent with sendfile, as
for native fetches), then the struct bytes that follow it, and so on. Each partition's
records field is only a length prefix before its region. Sans-IO.

Layout, per Kafka's FetchResponse schema: v7+ adds the top-level error code and session
id; v11+ the preferred read replica (always -1: read from the leader); v12+ is flexible
(compact arrays, strings and bytes, whose lengths are unsigned varints of n + 1, and an
empty tagged-field section closing every struct); v13+ names each topic by its id (16
bytes) instead of its name; v14-v17 change only requests and tagged fields.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence

from logmq.broker.replica.fetch_results import PartitionRead
from logmq.net.reply import TailPart

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PARTITION_HEAD = struct.Struct(">ihqqq")  # index, error, HW, last stable, log start
_PARTITION_V4 = struct.Struct(">ihqq")  # v4 has no log start offset
_ABORTED = struct.Struct(">qq")  # producer id, first offset
_NO_TAGS = b"\x00"
LOGMQ_ONLY = 1000  # logmq's own error codes start here (errors.py)


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_fetch_response(
    version: int,
    topics: Sequence[tuple[str | uuid.UUID, Sequence[PartitionRead]]],
    *,
    error: int = 0,
    session_id: int = 0,
    throttle_ms: int = 0,
) -> tuple[bytes, list[TailPart]]:
    """(the body up to the first records, the parts after it) for ``version`` 4..17.

    Topics are named by name before v13 and by id (a UUID) from v13.

    The first part is returned apart so the server can put the response header in front
    of it; joining them gives the whole body.
    """
    flexible = version >= 12
    parts: list[TailPart] = []
    buf = bytearray(_I32.pack(throttle_ms))
    if version >= 7:
        buf += _I16.pack(error) + _I32.pack(session_id)
    buf += _count(len(topics), flexible)
    for name, partitions in topics:
        if isinstance(name, uuid.UUID):
            buf += name.bytes
        else:
            encoded = name.encode()
            buf += uvarint(len(encoded) + 1) if flexible else _I16.pack(len(encoded))
            buf += encoded
        buf += _count(len(partitions), flexible)
        for p in partitions:
            code = p.error if p.error < LOGMQ_ONLY else -1  # UNKNOWN_SERVER_ERROR to Kafka
            if version >= 5:
                buf += _PARTITION_HEAD.pack(
                    p.partition, code, p.high_watermark, p.last_stable_offset, p.log_start_offset
                )
            else:
                buf += _PARTITION_V4.pack(p.partition, code, p.high_watermark, p.last_stable_offset)
            aborted = p.aborted
            if not aborted:
                buf += _count(0, flexible)  # aborted transactions: none (empty, not null)
            else:
                buf += _count(len(aborted), flexible)
                for producer_id, first_offset in aborted:
                    buf += _ABORTED.pack(producer_id, first_offset)
                    if flexible:
                        buf += _NO_TAGS
            if version >= 11:
                buf += _I32.pack(-1)  # preferred read replica: none
            records = p.records
            size = (
                0
                if records is None
                else (records.length if not isinstance(records, bytes) else len(records))
            )
            buf += uvarint(size + 1) if flexible else _I32.pack(size)
            if size:
                if isinstance(records, bytes):
                    buf += records
                else:
                    parts.append(bytes(buf))
                    parts.append(records)  # type: ignore[arg-type]
                    buf = bytearray()
            if flexible:
                buf += _NO_TAGS  # partition
        if flexible:
            buf += _NO_TAGS  # topic
    if flexible:
        buf += _NO_TAGS  # response
    parts.append(bytes(buf))
    return parts[0], parts[1:]  # type: ignore[return-value]


def _count(n: int, flexible: bool) -> bytes:
    return uvarint(n + 1) if flexible else _I32.pack(n)
