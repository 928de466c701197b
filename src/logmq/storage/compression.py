"""The batch codecs (gzip, snappy, lz4, zstd), with decompression under a byte budget.

Compressed records are untrusted bytes: 32 KB of zstd or 1 MB of gzip can inflate to
gigabytes, and a header's declared sizes (zstd's and lz4's content size, snappy's
length varint, xerial's block lengths) can lie. Every decompression here therefore
takes a ``budget`` and stops producing output once it passes it, so a bomb costs at
most ``budget`` bytes of memory and the CPU to produce them, never what it claims:
gzip and lz4 through their decompressors' ``max_length``, zstd fed in slices small
enough that none can overshoot the budget by more than two blocks, snappy by
checking each block's declared length before inflating it. Over budget is
InflateLimitError (MESSAGE_TOO_LARGE on a produce); bytes that do not decompress are
CorruptRecordError. See docs/design.md, "Untrusted bytes".
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

from logmq.errors import CorruptRecordError, LogMQError, MessageTooLargeError


class Compression:
    """Kafka's codec ids, stored in attribute bits 0-2."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4
    MASK = 0x07
    LAST = ZSTD

    NAMES = {"none": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}

    @classmethod
    def parse(cls, value: str | int | None) -> int:
        if value is None:
            return cls.NONE
        if isinstance(value, int):
            if value not in cls.NAMES.values():
                raise ValueError(f"unknown compression codec id {value}")
            return value
        try:
            return cls.NAMES[value.lower()]
        except KeyError:
            raise ValueError(f"unknown compression codec {value!r}") from None


# A batch may always inflate to its partition's max.message.bytes; beyond that, to
# INFLATE_RATIO times its compressed size (legitimate data rarely compresses better),
# but never past MAX_INFLATED_SIZE.
INFLATE_RATIO = 64
MAX_INFLATED_SIZE = 64 << 20
# What a client lets a fetched batch inflate to: generous, since the broker it trusts
# chose to store it, but still a bound against a hostile or broken broker.
CLIENT_MAX_INFLATED = 256 << 20


class InflateLimitError(MessageTooLargeError):
    """Compressed records that inflate past their budget (a decompression bomb, or a
    batch too big to take apart): MESSAGE_TOO_LARGE, as for any batch over
    max.message.bytes, so a Kafka producer splits the batch and retries."""


def inflate_budget(compressed_size: int, max_message_bytes: int = MAX_INFLATED_SIZE) -> int:
    """How far the broker lets a batch of ``compressed_size`` bytes inflate."""
    return max(max_message_bytes, min(INFLATE_RATIO * compressed_size, MAX_INFLATED_SIZE))


def _too_big(budget: int) -> InflateLimitError:
    return InflateLimitError(f"records decompress to more than {budget} bytes")


def _zstd():
    try:
        import zstandard
    except ImportError:  # pragma: no cover - depends on extras
        raise LogMQError("zstd compression needs the 'zstandard' package") from None
    return zstandard


def _lz4():
    try:
        import lz4.frame
    except ImportError:  # pragma: no cover - depends on extras
        raise LogMQError("lz4 compression needs the 'lz4' package") from None
    return lz4.frame


def _snappy():
    try:
        import cramjam
    except ImportError:  # pragma: no cover - depends on extras
        raise LogMQError("snappy compression needs the 'cramjam' package") from None
    return cramjam.snappy


_I = struct.Struct(">i")
# Kafka's Java client writes snappy in xerial's stream framing: this magic, a version and
# a compatible version (i32 each), then blocks of [i32 length][raw snappy]. librdkafka
# writes raw snappy; readers take both.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024
# zstd: no block inflates past 128 KiB and none takes fewer than 4 input bytes, so a
# slice of n input bytes yields at most (n // 4 + 2) blocks of output (one may have
# been pending from the slice before).
_ZSTD_BLOCK = 128 * 1024
_ZSTD_MIN_SLICE = 64


def compress(codec: int, data: Any) -> Any:
    if codec == Compression.NONE:
        return data
    if codec == Compression.GZIP:
        c = zlib.compressobj(6, zlib.DEFLATED, 31)
        return c.compress(data) + c.flush()
    if codec == Compression.SNAPPY:
        return _snappy_compress(data)
    if codec == Compression.LZ4:
        return _lz4().compress(data)
    if codec == Compression.ZSTD:
        return _zstd().ZstdCompressor(level=3).compress(data)
    raise CorruptRecordError(f"unknown compression codec {codec}")


def decompress(codec: int, data: Any, budget: int = CLIENT_MAX_INFLATED) -> Any:
    """The records of a compressed batch, at most ``budget`` bytes of them.

    Raises InflateLimitError past the budget (having produced at most about that much),
    CorruptRecordError when the bytes do not decompress or stop mid-stream.
    """
    if codec == Compression.NONE:
        return data
    try:
        if codec == Compression.GZIP:
            return _gunzip(data, budget)
        if codec == Compression.SNAPPY:
            return _snappy_decompress(data, budget)
        if codec == Compression.LZ4:
            return _lz4_decompress(data, budget)
        if codec == Compression.ZSTD:
            return _zstd_decompress(data, budget)
    except LogMQError:
        raise
    except Exception as e:  # zlib.error, lz4's RuntimeError, ZstdError, cramjam's errors
        raise CorruptRecordError(f"cannot decompress records: {e}") from None
    raise CorruptRecordError(f"unknown compression codec {codec}")


def _gunzip(data: Any, budget: int) -> bytes:
    """gzip or zlib, members one after another (Java's GZIPInputStream reads them all)."""
    out: list[bytes] = []
    left = budget
    rest: Any = data
    while True:
        d = zlib.decompressobj(47)
        chunk = d.decompress(rest, left + 1)
        if len(chunk) > left:
            raise _too_big(budget)
        out.append(chunk)
        left -= len(chunk)
        if not d.eof:
            if d.unconsumed_tail:  # output stopped exactly at the budget, input remains
                raise _too_big(budget)
            raise CorruptRecordError("truncated gzip stream")
        rest = d.unused_data
        if not rest:
            return out[0] if len(out) == 1 else b"".join(out)


def _lz4_decompress(data: Any, budget: int) -> bytes:
    """LZ4 frames (Kafka's v2 format); ``max_length`` keeps a lying content size from
    sizing the output."""
    lz4 = _lz4()
    out: list[bytes] = []
    left = budget
    rest = bytes(data)
    while True:
        d = lz4.LZ4FrameDecompressor()
        chunk = d.decompress(rest, max_length=left + 1)
        if len(chunk) > left:
            raise _too_big(budget)
        out.append(chunk)
        left -= len(chunk)
        if not d.eof:
            if not d.needs_input:
                raise _too_big(budget)
            raise CorruptRecordError("truncated lz4 frame")
        rest = d.unused_data
        if not rest:
            return out[0] if len(out) == 1 else b"".join(out)


def _zstd_decompress(data: Any, budget: int) -> bytes:
    """zstd frames, never trusting a declared content or window size for the output."""
    dctx = _zstd().ZstdDecompressor()
    mv = memoryview(data)
    out: list[bytes] = []
    produced = 0
    pos, end = 0, len(mv)
    d = dctx.decompressobj()
    while pos < end:
        left = budget - produced
        n = max(_ZSTD_MIN_SLICE, 4 * (left // _ZSTD_BLOCK))
        piece = mv[pos : pos + n]
        chunk = d.decompress(piece)
        pos += len(piece)
        produced += len(chunk)
        if produced > budget:
            raise _too_big(budget)
        out.append(chunk)
        if d.eof:
            extra = d.unused_data
            if extra or pos < end:  # another frame follows
                pos -= len(extra)
                d = dctx.decompressobj()
    if not d.eof:
        raise CorruptRecordError("truncated zstd frame")
    return b"".join(out)


def _snappy_compress(data: Any) -> bytes:
    raw = _snappy().compress_raw
    mv = memoryview(data)
    out = [_XERIAL_HEADER]
    for i in range(0, len(mv), _XERIAL_BLOCK):
        block = bytes(raw(mv[i : i + _XERIAL_BLOCK]))
        out.append(_I.pack(len(block)))
        out.append(block)
    return b"".join(out)


def _snappy_decompress(data: Any, budget: int) -> bytes:
    """Raw snappy or xerial blocks; each block's declared length is checked against
    what is left of the budget before it is inflated."""
    s = _snappy()
    mv = memoryview(data)
    if bytes(mv[:8]) != _XERIAL_MAGIC:
        blocks = [mv]
    else:
        if len(mv) < len(_XERIAL_HEADER):
            raise CorruptRecordError("truncated snappy stream header")
        blocks, pos = [], len(_XERIAL_HEADER)
        while pos < len(mv):
            if len(mv) - pos < 4:
                raise CorruptRecordError("truncated snappy block length")
            (n,) = _I.unpack_from(mv, pos)
            if n < 0 or pos + 4 + n > len(mv):
                raise CorruptRecordError("snappy block runs past the batch")
            blocks.append(mv[pos + 4 : pos + 4 + n])
            pos += 4 + n
    out: list[bytes] = []
    left = budget
    for blk in blocks:
        raw = bytes(blk)
        declared = s.decompress_raw_len(raw)
        if declared > left:
            raise _too_big(budget)
        chunk = bytes(s.decompress_raw(raw))
        if len(chunk) != declared:
            raise CorruptRecordError("snappy block inflates to other than its declared length")
        left -= declared
        out.append(chunk)
    return out[0] if len(out) == 1 else b"".join(out)
