"""compression.type: the leader recompresses batches into the topic's codec, and only those."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.errors import CorruptRecordError, InvalidConfigError, MessageTooLargeError
from logmq.storage import batch as b
from logmq.storage.compression import InflateLimitError
from logmq.storage.config import LogConfig
from logmq.storage.log_manager import LogManager
from logmq.storage.recompress import to_codec

from .helpers import make_batch, read_all

C = b.Compression
CODECS = [C.NONE, C.GZIP, C.ZSTD, C.LZ4]
codecs = st.sampled_from(CODECS)
headers = st.lists(
    st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))), max_size=3
)
records = st.lists(
    st.tuples(
        st.integers(0, 2**42),
        st.one_of(st.none(), st.binary(max_size=20)),
        st.one_of(st.none(), st.binary(max_size=200)),
        headers,
    ),
    min_size=1,
    max_size=30,
)
flags = st.sampled_from([0, b.ATTR_LOG_APPEND_TIME, b.ATTR_TRANSACTIONAL, b.ATTR_CONTROL])


def with_attributes(data: bytes, extra: int) -> bytes:
    """Set attribute bits the encoders do not (transactional, control...), re-hashed."""
    out = bytearray(data)
    attrs = struct.unpack_from(">h", out, b.CHECKSUM_START)[0] | extra
    struct.pack_into(">h", out, b.CHECKSUM_START, attrs)
    struct.pack_into(">I", out, b.CHECKSUM_POS, b.compute_checksum(out, 0, len(out)))
    return bytes(out)


def undecodable(codec: int) -> bytes:
    """A batch with a valid checksum whose codec bits say ``codec`` over plain bytes."""
    plain = bytearray(make_batch(3, size=64))
    struct.pack_into(">h", plain, b.CHECKSUM_START, codec)
    struct.pack_into(">I", plain, b.CHECKSUM_POS, b.compute_checksum(plain, 0, len(plain)))
    b.validate(plain)
    return bytes(plain)


@settings(max_examples=150, deadline=None)
@given(records, codecs, codecs, flags, st.integers(-1, 2**40), st.integers(0, 2**20))
def test_recompress_keeps_everything_but_the_codec(recs, src, dst, flag, pid, epoch):
    seq = 5 if pid >= 0 else b.NO_SEQUENCE
    pepoch = 2 if pid >= 0 else b.NO_PRODUCER_EPOCH
    data = bytearray(
        with_attributes(
            b.encode_batch(
                recs, compression=src, producer_id=pid, producer_epoch=pepoch, base_sequence=seq
            ),
            flag,
        )
    )
    b.stamp(data, 0, 1234, epoch)
    before = b.validate(data)
    out = b.recompress(data, 0, before, dst)
    after = b.validate(out)  # the result validates as any batch does
    assert after.compression == dst
    assert after.attributes & ~C.MASK == before.attributes & ~C.MASK
    keep = (
        "base_offset",
        "leader_epoch",
        "last_offset_delta",
        "first_timestamp",
        "max_timestamp",
        "producer_id",
        "producer_epoch",
        "base_sequence",
        "record_count",
    )
    assert [getattr(after, k) for k in keep] == [getattr(before, k) for k in keep]
    assert b.decode_records(out) == b.decode_records(data)
    if dst == src:
        assert out == data  # same codec, same bytes


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(records, codecs), min_size=1, max_size=4), codecs)
def test_to_codec_converts_every_batch_of_a_request(batches, dst):
    data = b"".join(b.encode_batch(recs, compression=c) for recs, c in batches)
    out = to_codec(data, dst, 1 << 20)
    if all(c == dst for _, c in batches):
        assert out is data  # the no-op path: nothing copied, nothing decoded
    got = [(pos, b.validate(out, pos)) for pos, _ in b.iter_headers(out)]
    assert len(got) == len(batches) and all(h.compression == dst for _, h in got)
    assert sum(h.size for _, h in got) == len(out)
    want = [r for pos, _ in b.iter_headers(data) for r in b.decode_records(data, pos)]
    assert [r for pos, _ in got for r in b.decode_records(out, pos)] == want


@pytest.mark.parametrize("codec", [C.GZIP, C.ZSTD, C.LZ4])
def test_a_payload_that_does_not_decompress_is_corrupt(codec):
    with pytest.raises(CorruptRecordError, match="cannot decompress"):
        to_codec(undecodable(codec), C.NONE, 1 << 20)


def test_a_damaged_batch_is_corrupt_before_any_decompression():
    data = bytearray(make_batch(5, compression=C.GZIP))
    data[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="checksum"):
        to_codec(bytes(data), C.LZ4, 1 << 20)


def test_config_values():
    assert LogConfig().broker_codec is None  # producer, the default
    kafka_ids = [("uncompressed", 0), ("none", 0), ("gzip", 1), ("snappy", 2), ("lz4", 3)]
    for name, codec in [*kafka_ids, ("zstd", 4)]:
        assert LogConfig.from_dict({"compression.type": name}).broker_codec == codec
    with pytest.raises(
        InvalidConfigError, match=r"compression\.type must be one of .*zstd, got 'brotli'"
    ):
        LogConfig.from_dict({"compression.type": "brotli"})


# -- the leader's append (LogManager.append) ------------------------------------------------


def stored(plog) -> list[b.BatchHeader]:
    data = plog.read(plog.log_start_offset, 1 << 24).read()
    return [b.validate(data, pos) for pos, _ in b.iter_headers(data)]


@pytest.fixture
async def mgr(tmp_path):
    m = LogManager(tmp_path)
    await m.start()
    yield m
    await m.stop()


@pytest.mark.parametrize(
    ("topic_codec", "sent", "want"),
    [
        ("lz4", C.GZIP, C.LZ4),
        ("zstd", C.NONE, C.ZSTD),
        ("uncompressed", C.LZ4, C.NONE),
        ("gzip", C.GZIP, C.GZIP),
        ("producer", C.GZIP, C.GZIP),
        ("producer", C.NONE, C.NONE),
    ],
)
async def test_leader_append_stores_the_topic_codec(mgr, topic_codec, sent, want):
    plog = mgr.create_log("t", 0, {"compression.type": topic_codec})
    batch = make_batch(50, tag=1, compression=sent)
    info = await mgr.append(plog, batch, leader_epoch=3)
    assert (info.first_offset, info.last_offset, info.record_count) == (0, 49, 50)
    (h,) = stored(plog)
    assert (h.compression, h.base_offset, h.leader_epoch, h.record_count) == (want, 0, 3, 50)
    assert read_all(plog) == [(i, f"1:{i}:".encode().ljust(20, b"x")) for i in range(50)]
    if sent == want:
        assert plog.read(0, 1 << 20).read()[b.MAGIC_POS :] == batch[b.MAGIC_POS :]


async def test_altering_compression_type_applies_to_the_next_batches(mgr):
    plog = mgr.create_log("t", 0)
    await mgr.append(plog, make_batch(3, tag=0, compression=C.GZIP))
    mgr.set_topic_config("t", {"compression.type": "lz4"})
    await mgr.append(plog, make_batch(3, tag=1, compression=C.GZIP))
    mgr.set_topic_config("t", {})
    await mgr.append(plog, make_batch(3, tag=2, compression=C.GZIP))
    assert [h.compression for h in stored(plog)] == [C.GZIP, C.LZ4, C.GZIP]
    assert len(read_all(plog)) == 9


async def test_undecodable_batch_appends_nothing(mgr):
    plog = mgr.create_log("t", 0, {"compression.type": "lz4"})
    await mgr.append(plog, make_batch(2, compression=C.LZ4))
    good = make_batch(2, compression=C.NONE)
    with pytest.raises(CorruptRecordError):
        await mgr.append(plog, good + undecodable(C.GZIP))  # all or nothing
    assert plog.log_end_offset == 2 and len(stored(plog)) == 1


async def test_a_batch_grown_past_max_message_bytes_is_refused(mgr):
    batch = make_batch(200, size=100, compression=C.GZIP)  # compresses well
    plog = mgr.create_log(
        "t", 0, {"compression.type": "uncompressed", "max.message.bytes": str(len(batch) + 100)}
    )
    with pytest.raises(MessageTooLargeError):
        await mgr.append(plog, batch)
    assert plog.log_end_offset == 0


async def test_idempotent_retries_still_dedupe(mgr):
    plog = mgr.create_log("t", 0, {"compression.type": "zstd"})
    kw = {"compression": C.GZIP, "producer_id": 9, "producer_epoch": 0}
    first = make_batch(4, tag=0, base_sequence=0, **kw)
    second = make_batch(4, tag=1, base_sequence=4, **kw)
    a = await mgr.append(plog, first)
    again = await mgr.append(plog, first)  # a retry of the same bytes
    assert again.duplicate and (again.first_offset, again.last_offset) == (0, 3)
    assert not a.duplicate
    b2 = await mgr.append(plog, second)
    assert (b2.first_offset, b2.duplicate) == (4, False)
    hs = stored(plog)
    assert [(h.compression, h.producer_id, h.base_sequence) for h in hs] == [
        (C.ZSTD, 9, 0),
        (C.ZSTD, 9, 4),
    ]
    assert plog.log_end_offset == 8


async def test_log_append_time_stamps_the_recompressed_batch(mgr):
    plog = mgr.create_log(
        "t", 0, {"compression.type": "lz4", "message.timestamp.type": "LogAppendTime"}
    )
    await mgr.append(plog, make_batch(3, ts=5, compression=C.NONE))
    (h,) = stored(plog)
    assert h.compression == C.LZ4 and h.attributes & b.ATTR_LOG_APPEND_TIME
    assert h.max_timestamp > 5


async def test_followers_store_the_leaders_bytes_as_they_are(mgr):
    plog = mgr.create_log("t", 0, {"compression.type": "lz4"})
    data = bytearray(make_batch(3, compression=C.GZIP))
    b.stamp(data, 0, 0, 1)
    plog.append_as_follower(bytes(data))
    (h,) = stored(plog)
    assert h.compression == C.GZIP


@pytest.mark.parametrize(
    "codec",
    [b.Compression.GZIP, b.Compression.SNAPPY, b.Compression.ZSTD, b.Compression.LZ4],
)
def test_decompression_is_bounded_so_a_small_batch_cannot_inflate_without_limit(codec):
    raw = bytes(100_000)  # compresses to a few hundred bytes
    packed = b.compress(codec, raw)
    assert bytes(b.decompress(codec, packed, len(raw))) == raw
    with pytest.raises(InflateLimitError, match="decompress to more than"):
        b.decompress(codec, packed, len(raw) - 1)
