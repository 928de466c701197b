"""Putting produce data into a topic's compression.type (sans-IO, per batch).

Kafka's rule: with ``producer`` the leader stores batches as sent; with a named codec it
recompresses every batch in another codec before it appends it, and leaves batches
already in that codec alone. Only the leader does this, once: followers copy the
leader's bytes. The cost is per batch (one decompression and one compression, in C),
and data whose batches all match costs one header peek per batch and no copy.
"""

from __future__ import annotations

import struct
from typing import Any

from logmq.storage import batch as b
from logmq.storage.stamping import F_LENGTH, check_batch

_ATTR = struct.Struct(">h")
_ATTRIBUTES_POS = b.ATTRIBUTES_POS
_CODEC_MASK = b.Compression.MASK


def to_codec(data: Any, codec: int, max_batch_bytes: int) -> Any:
    """``data`` (one or more batches) with every batch in ``codec``.

    Returns ``data`` itself when every batch already is (or when the data is too
    malformed to tell: the append's validation then names the problem). Each batch to
    recompress is validated first, so damage is CORRUPT_MESSAGE and an oversized batch
    MESSAGE_TOO_LARGE, both before anything is appended, as is one whose records
    inflate past ``inflate_budget`` (a decompression bomb); the append validates the
    result again, so a batch that grew past max.message.bytes is refused too.
    """
    mv = memoryview(data)
    if _all_in(mv, codec):
        return data
    end = len(mv)
    parts: list[Any] = []
    pos = 0
    while pos < end:
        f = check_batch(mv, pos, end, max_batch_bytes, True)
        size = f[F_LENGTH] + b.LOG_OVERHEAD
        h = b.BatchHeader(*f)
        if h.compression == codec:
            parts.append(mv[pos : pos + size])
        else:
            parts.append(b.recompress(mv, pos, h, codec, b.inflate_budget(size, max_batch_bytes)))
        pos += size
    return b"".join(parts)


def _all_in(mv: memoryview, codec: int) -> bool:
    """Whether every batch's codec bits say ``codec`` (header peeks, no CRC)."""
    end = len(mv)
    pos = 0
    while pos < end:
        if end - pos < b.HEADER_SIZE:
            return True  # truncated: left for validation to refuse
        size = b.peek_size(mv, pos)
        if size < b.HEADER_SIZE:
            return True  # a bad length: likewise
        if _ATTR.unpack_from(mv, pos + _ATTRIBUTES_POS)[0] & _CODEC_MASK != codec:
            return False
        pos += size
    return True
