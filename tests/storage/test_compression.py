"""Bounded decompression (storage/compression.py): bombs stop at the budget, and within
it every codec gives back exactly what plain decompression gives."""

from __future__ import annotations

import resource
import struct
import zlib

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logmq.errors import CorruptRecordError
from logmq.storage import batch as b
from logmq.storage import compression as c
from logmq.storage.compression import Compression as C
from logmq.storage.compression import InflateLimitError, decompress, inflate_budget
from logmq.storage.offset_search import offset_for

from .helpers import commit
from .test_compaction import fill, open_log

GIB = 1 << 30
CODECS = [C.GZIP, C.SNAPPY, C.LZ4, C.ZSTD]


# -- bombs, built cheaply -------------------------------------------------------------------


def gzip_bomb(total: int = GIB, member: int = 8 << 20) -> bytes:
    """``total`` zero bytes as gzip members of ``member`` bytes (one is compressed once)."""
    co = zlib.compressobj(9, zlib.DEFLATED, 31)
    one = co.compress(bytes(member)) + co.flush()
    return one * (total // member)


def zstd_bomb(total: int = GIB) -> bytes:
    """One zstd frame of ``total`` zeros, streamed: no content size in its header."""
    import zstandard

    co = zstandard.ZstdCompressor(level=1).compressobj()
    zeros = bytes(1 << 20)
    return b"".join(co.compress(zeros) for _ in range(total >> 20)) + co.flush()


def lz4_bomb(actual: int = 64 << 20, declared: int = 1 << 40) -> bytes:
    """An lz4 frame of ``actual`` zeros whose header claims ``declared`` bytes."""
    import lz4.frame

    frame = bytearray(lz4.frame.compress(bytes(actual), store_size=True))
    # magic(4) FLG BD content_size(8) HC: rewrite the size and its header checksum
    struct.pack_into("<Q", frame, 6, declared)
    frame[14] = (xxhash.xxh32_intdigest(bytes(frame[4:14])) >> 8) & 0xFF
    return bytes(frame)


def snappy_raw_bomb(declared: int = 0xFFFFFFFF) -> bytes:
    """Raw snappy whose length varint claims ``declared`` bytes, followed by little."""
    out = bytearray()
    n = declared
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + b"\x00" * 64


def snappy_xerial_bomb(blocks: int = 500) -> bytes:
    """xerial framing (Kafka's Java client) of blocks each claiming 4 GiB."""
    one = snappy_raw_bomb()
    head = c.compress(C.SNAPPY, b"")[:16]
    return head + (struct.pack(">i", len(one)) + one) * blocks


def bomb_batch(codec: int, payload: bytes, key: bytes = b"k") -> bytes:
    """A valid batch (header, CRC) whose codec bits say ``codec`` over ``payload``."""
    data = bytearray(b.encode_batch([(1_000, key, b"v", None)]))
    data[b.HEADER_SIZE :] = b""
    data += payload
    struct.pack_into(">i", data, b.LENGTH_POS, len(data) - b.LOG_OVERHEAD)
    struct.pack_into(">h", data, b.ATTRIBUTES_POS, codec)
    struct.pack_into(">I", data, b.CHECKSUM_POS, b.compute_checksum(data, 0, len(data)))
    b.validate(data)
    return bytes(data)


BOMBS = {
    C.GZIP: gzip_bomb,
    C.ZSTD: zstd_bomb,
    C.LZ4: lz4_bomb,
    C.SNAPPY: snappy_raw_bomb,
}


def peak_rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


@pytest.mark.parametrize("codec", [*CODECS, "xerial"])
def test_a_bomb_stops_at_the_budget(codec):
    bomb = snappy_xerial_bomb() if codec == "xerial" else BOMBS[codec]()
    codec = C.SNAPPY if codec == "xerial" else codec
    assert len(bomb) < 2 << 20  # a small request...
    before = peak_rss_kib()
    with pytest.raises(InflateLimitError, match="decompress to more than 1048576 bytes"):
        decompress(codec, bomb, 1 << 20)  # ...that would be a gigabyte or more
    assert peak_rss_kib() - before < 64 * 1024  # KiB: nothing near the inflated size


def test_the_budget_follows_max_message_bytes_and_the_ratio():
    assert inflate_budget(1000, 1 << 20) == 1 << 20  # a small bomb: max.message.bytes
    assert inflate_budget(100_000, 1 << 20) == 64 * 100_000  # a big batch: 64x
    assert inflate_budget(10 << 20, 1 << 20) == c.MAX_INFLATED_SIZE  # but capped
    assert inflate_budget(10 << 20, 100 << 20) == 100 << 20  # unless the topic allows more


@pytest.mark.parametrize("codec", CODECS)
def test_truncated_or_damaged_input_is_corrupt_not_a_crash(codec):
    packed = c.compress(codec, bytes(range(256)) * 100)
    for bad in (packed[: len(packed) // 2], packed[:5], b"", b"\xff" * 40):
        with pytest.raises(CorruptRecordError):
            decompress(codec, bad, 1 << 20)


@pytest.mark.parametrize("codec", [C.GZIP, C.LZ4, C.ZSTD])
def test_concatenated_frames_are_all_read(codec):
    a, b = c.compress(codec, b"first " * 50), c.compress(codec, b"second " * 70)
    assert bytes(decompress(codec, a + b, 1 << 20)) == b"first " * 50 + b"second " * 70
    with pytest.raises(InflateLimitError):
        decompress(codec, a + b, 300 + 489)


def plain(codec: int, packed: bytes) -> bytes:
    """The unbounded reference decompression each codec's own library does."""
    if codec == C.GZIP:
        return zlib.decompress(packed, 47)
    if codec == C.LZ4:
        import lz4.frame

        return lz4.frame.decompress(packed)
    if codec == C.ZSTD:
        import zstandard

        return zstandard.ZstdDecompressor().decompress(packed)
    import cramjam

    head, pos, out = packed[:16], 16, []
    assert head.startswith(b"\x82SNAPPY\x00")
    while pos < len(packed):
        (n,) = struct.unpack_from(">i", packed, pos)
        out.append(bytes(cramjam.snappy.decompress_raw(packed[pos + 4 : pos + 4 + n])))
        pos += 4 + n
    return b"".join(out)


data = st.one_of(
    st.binary(max_size=3000),
    st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=8), st.integers(1, 40_000)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CODECS), data, st.integers(0, 400_000))
def test_bounded_decompression_never_exceeds_the_budget_and_equals_plain(codec, raw, budget):
    packed = c.compress(codec, raw)
    try:
        out = bytes(decompress(codec, packed, budget))
    except InflateLimitError:
        assert len(raw) > budget
    else:
        assert len(out) <= budget
        assert out == plain(codec, packed) == raw


# -- where the broker decompresses stored batches --------------------------------------------


def test_the_cleaner_keeps_a_bomb_whole_and_cleans_around_it(tmp_path):
    """A bomb stored before its topic became compacted: the cleaner neither inflates it
    nor gives up on the log; it keeps the batch as it is and cleans the rest."""
    plog = open_log(tmp_path, **{"max.message.bytes": "2000000"})
    fill(plog, 30, committed=False)
    bomb = bomb_batch(C.ZSTD, zstd_bomb())
    bomb_offset = plog.append(bomb).first_offset
    fill(plog, 30)
    plog.roll()
    stats = plog.clean()
    assert stats is not None and stats.oversized_kept >= 1
    assert stats.records_out < 60  # the other records were cleaned
    kept = [
        h for seg in plog.segments for _, h in seg.iter_headers() if h.base_offset == bomb_offset
    ]
    assert len(kept) == 1 and kept[0].size == len(bomb)
    plog.close()


def test_list_offsets_answers_for_a_bomb_without_inflating_it(tmp_path):
    plog = open_log(tmp_path, **{"max.message.bytes": "2000000", "cleanup.policy": "delete"})
    plog.append(bomb_batch(C.GZIP, gzip_bomb()))
    commit(plog)
    before = peak_rss_kib()
    assert offset_for(plog, 0) == (0, 1_000)  # the batch's offset and max timestamp
    assert offset_for(plog, -3) == (0, 1_000)
    assert peak_rss_kib() - before < 128 * 1024
    plog.close()


def test_a_client_refuses_a_bomb_from_its_broker_clearly(monkeypatch):
    from logmq.client import fetcher

    monkeypatch.setattr(fetcher, "CLIENT_MAX_INFLATED", 1 << 20)  # 256 MiB in real life
    bomb = bytearray(bomb_batch(C.ZSTD, zstd_bomb(64 << 20)))
    b.stamp(bomb, 0, 42, 1)
    with pytest.raises(InflateLimitError, match="batch at offset 42: records decompress to"):
        fetcher.decode_batch_rows(bomb, 0, b.read_header(bomb))
