"""compression.type end to end: what a producer sends, what the broker stores and serves."""

from __future__ import annotations

import asyncio

import pytest

from logmq.client.admin import AsyncAdmin
from logmq.client.consumer import AsyncConsumer
from logmq.client.producer import AsyncProducer
from logmq.errors import ErrorCode, InvalidConfigError
from logmq.net.codec import ApiKey
from logmq.storage import batch as b
from tests.broker.test_api import decode_all, values_batch
from tests.harness import BrokerCluster, inprocess_broker, wait_until
from tests.net.raw_client import RawClient
from tests.storage.test_recompress import undecodable

C = b.Compression


@pytest.fixture
async def client(inproc_broker):
    c = await RawClient.connect(inproc_broker.port)
    yield c
    await c.close()


def codecs_of(data: bytes) -> list[int]:
    return [b.validate(data, pos).compression for pos, _ in b.iter_headers(data)]


def on_disk(broker, topic: str) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((broker.data_dir / f"{topic}-0").glob("*.log")))


async def alter(c: RawClient, topic: str, configs: dict[str, str]) -> dict:
    resp = await c.call(
        ApiKey.ALTER_CONFIGS, {"resources": [{"type": "topic", "name": topic, "set": configs}]}
    )
    return resp.body["resources"][0]


@pytest.mark.parametrize(
    ("topic_codec", "want"),
    [("lz4", C.LZ4), ("producer", C.GZIP), ("uncompressed", C.NONE), (None, C.GZIP)],
)
async def test_gzip_batches_are_stored_in_the_topic_codec(inproc_broker, client, topic_codec, want):
    configs = {} if topic_codec is None else {"compression.type": topic_codec}
    assert (await client.create_topic("t", 1, configs))["error"] == 0
    sent = [values_batch(20, tag=b"a", compression=C.GZIP), values_batch(5, tag=b"b")]
    for batch in sent:
        assert (await client.produce("t", 0, batch))["error"] == 0
    meta, data = await client.fetch("t", 0, 0)
    assert meta["error"] == 0
    expected = [want, C.NONE if topic_codec in (None, "producer") else want]
    assert codecs_of(data) == expected
    assert codecs_of(on_disk(inproc_broker, "t")) == expected
    assert decode_all(data) == [(i, b"a%d" % i) for i in range(20)] + [
        (20 + i, b"b%d" % i) for i in range(5)
    ]


async def test_unknown_values_are_invalid_config(client):
    bad = await client.create_topic("t", 1, {"compression.type": "brotli"})
    assert bad["error"] == ErrorCode.INVALID_CONFIG and "brotli" in bad["message"]
    assert (await client.create_topic("t", 1))["error"] == 0
    res = await alter(client, "t", {"compression.type": "brotli"})
    assert res["error"] == ErrorCode.INVALID_CONFIG and "compression.type" in res["message"]


async def test_alter_applies_to_the_next_batches(client):
    assert (await client.create_topic("t", 1))["error"] == 0
    assert (await client.produce("t", 0, values_batch(3, compression=C.GZIP)))["error"] == 0
    assert (await alter(client, "t", {"compression.type": "zstd"}))["error"] == 0
    assert (await client.produce("t", 0, values_batch(3, compression=C.GZIP)))["error"] == 0
    _, data = await client.fetch("t", 0, 0)
    assert codecs_of(data) == [C.GZIP, C.ZSTD]


async def test_an_undecodable_batch_is_corrupt_message_and_nothing_is_appended(client):
    assert (await client.create_topic("t", 1, {"compression.type": "lz4"}))["error"] == 0
    bad = undecodable(C.GZIP)  # plain records under gzip codec bits, checksum valid
    resp = await client.produce("t", 0, bad)
    assert resp["error"] == ErrorCode.CORRUPT_MESSAGE
    meta, data = await client.fetch("t", 0, 0)
    assert meta["high_watermark"] == 0 and data == b""


async def test_idempotent_retries_dedupe_after_recompression(client):
    assert (await client.create_topic("t", 1, {"compression.type": "lz4"}))["error"] == 0
    resp = await client.call(
        ApiKey.INIT_PRODUCER_ID, {"transactional_id": None, "producer_id": -1, "producer_epoch": -1}
    )
    pid, epoch = resp.body["producer_id"], resp.body["producer_epoch"]
    kw = {"producer_id": pid, "producer_epoch": epoch, "compression": C.GZIP}
    first = values_batch(3, tag=b"x", base_sequence=0, **kw)
    assert (await client.produce("t", 0, first))["base_offset"] == 0
    retry = await client.produce("t", 0, first)
    assert (retry["error"], retry["base_offset"]) == (0, 0)
    assert (await client.produce("t", 0, values_batch(2, base_sequence=3, **kw)))[
        "base_offset"
    ] == 3
    meta, data = await client.fetch("t", 0, 0)
    assert meta["high_watermark"] == 5 and codecs_of(data) == [C.LZ4, C.LZ4]
    assert [h.producer_id for _, h in b.iter_headers(data)] == [pid, pid]


async def test_broker_wide_default(tmp_path):
    async with (
        inprocess_broker(tmp_path / "d", topic_defaults={"compression.type": "zstd"}) as br,
        await RawClient.connect(br.port) as c,
    ):
        assert (await c.create_topic("t", 1))["error"] == 0
        assert (await c.produce("t", 0, values_batch(3)))["error"] == 0
        _, data = await c.fetch("t", 0, 0)
        assert codecs_of(data) == [C.ZSTD]
    with pytest.raises(InvalidConfigError, match=r"compression\.type"):
        async with inprocess_broker(tmp_path / "e", topic_defaults={"compression.type": "x"}):
            pass


async def test_the_clients_read_what_the_broker_recompressed(inproc_broker, client):
    assert (await client.create_topic("t", 1, {"compression.type": "lz4"}))["error"] == 0
    bootstrap = f"127.0.0.1:{inproc_broker.port}"
    async with AsyncProducer(bootstrap, compression="gzip", acks="all") as p:
        for i in range(50):
            p.send("t", b"v%d" % i, b"k", 0, [("h", b"%d" % i)], 1_000 + i)
        await p.flush()
    got = []
    async with AsyncConsumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([("t", 0)])
        while len(got) < 50:
            got.extend(await consumer.poll(timeout=1.0))
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in got] == [
        (i, 1_000 + i, b"k", b"v%d" % i, [("h", b"%d" % i)]) for i in range(50)
    ]
    _, data = await client.fetch("t", 0, 0)
    assert set(codecs_of(data)) == {C.LZ4}


async def test_followers_keep_the_leaders_recompressed_bytes(tmp_path):
    """Only the leader recompresses; replicas end up byte for byte alike."""
    cluster = BrokerCluster(2, base_dir=tmp_path, log_level="warning")
    await asyncio.to_thread(cluster.start)
    try:
        async with AsyncAdmin(cluster.bootstrap) as admin:
            await admin.create_topic("r", 1, 2, {"compression.type": "lz4"})
            async with AsyncProducer(cluster.bootstrap, compression="gzip", acks="all") as p:
                await p.send_batch("r", [b"v%d" % i for i in range(1000)], partition=0)
        files = {
            n: node.data_dir / "r-0" / ("0" * 20 + ".log") for n, node in cluster.nodes.items()
        }

        def replicas_alike() -> bool:
            data = {n: f.read_bytes() if f.exists() else b"" for n, f in files.items()}
            return bool(data[1]) and data[1] == data[2]

        await wait_until(replicas_alike, what="the follower to copy the leader's batches")
        data = files[1].read_bytes()
        assert set(codecs_of(data)) == {C.LZ4}
        assert [v for _, v in decode_all(data)] == [b"v%d" % i for i in range(1000)]
    finally:
        await asyncio.to_thread(cluster.close)
