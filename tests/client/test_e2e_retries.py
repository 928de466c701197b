"""Retries after a lost response: idempotence turns them into exactly-once appends."""

from __future__ import annotations

import asyncio

import pytest

from logmq import AsyncAdmin, AsyncConsumer, AsyncProducer
from logmq.client import cluster as cluster_module
from logmq.client.connection import BrokerConnection
from logmq.net.codec import ApiKey
from logmq.storage.batch import encode_batch
from tests.client.proxy import CutProxy


@pytest.fixture
async def proxy(shared_broker, monkeypatch):
    """Route every client connection through a CutProxy in front of the broker."""
    p = await CutProxy(shared_broker.port).start()
    real = cluster_module.ClusterMetadata.from_response.__func__

    def via_proxy(cls, body):
        for b in body.get("brokers") or []:
            b["port"] = p.port
        return real(cls, body)

    monkeypatch.setattr(cluster_module.ClusterMetadata, "from_response", classmethod(via_proxy))
    yield p
    await p.stop()


async def read_all(bootstrap, topic, n):
    out = []
    async with AsyncConsumer(bootstrap, auto_offset_reset="earliest") as c:
        c.assign([(topic, 0)])
        async with asyncio.timeout(20):
            while len(out) < n:
                out.extend(await c.poll(timeout=1))
        out.extend(await c.poll(timeout=0.2))  # anything beyond n would be a duplicate
    return out


@pytest.mark.parametrize("idempotent", [True, False])
async def test_lost_response_is_retried(shared_broker, topic_name, proxy, idempotent):
    async with AsyncAdmin(shared_broker.bootstrap) as admin:
        await admin.create_topic(topic_name)
    async with AsyncProducer(
        f"127.0.0.1:{proxy.port}", enable_idempotence=idempotent, retry_backoff_ms=10
    ) as producer:
        await producer.send(topic_name, b"first")  # opens the broker connection
        proxy.arm()
        producer._cluster._connections.clear()  # next request opens a new (armed) connection
        handles = [producer.send(topic_name, b"%d" % i) for i in range(50)]
        metas = [await h for h in handles]
        assert proxy.cut.is_set()
    records = await read_all(shared_broker.bootstrap, topic_name, 51)
    values = [r.value for r in records]
    if idempotent:
        assert values == [b"first"] + [b"%d" % i for i in range(50)]
        assert [m.offset for m in metas] == list(range(1, 51))
    else:
        assert len(values) > 51  # the lost-response batch was appended twice
        assert set(values) == {b"first"} | {b"%d" % i for i in range(50)}


async def test_resending_the_same_batch_bytes_is_deduplicated(shared_broker, topic_name):
    async with AsyncAdmin(shared_broker.bootstrap) as admin:
        await admin.create_topic(topic_name)
    conn = await BrokerConnection.open("127.0.0.1", shared_broker.port)
    init = await conn.request(
        ApiKey.INIT_PRODUCER_ID, {"transactional_id": None, "producer_id": -1, "producer_epoch": -1}
    )
    pid, epoch = init.body["producer_id"], init.body["producer_epoch"]
    batch = encode_batch(
        [(1, None, b"once", None)], producer_id=pid, producer_epoch=epoch, base_sequence=0
    )
    body = {
        "acks": 1,
        "timeout_ms": 5000,
        "topics": [{"topic": topic_name, "partitions": [{"partition": 0, "size": len(batch)}]}],
    }
    r1 = await conn.request(ApiKey.PRODUCE, body, [batch])
    r2 = await conn.request(ApiKey.PRODUCE, body, [batch])
    conn.close()
    p1 = r1.body["topics"][0]["partitions"][0]
    p2 = r2.body["topics"][0]["partitions"][0]
    assert p1["error"] == 0 and p2["error"] in (0, 46)
    assert p1["base_offset"] == p2["base_offset"] == 0
    records = await read_all(shared_broker.bootstrap, topic_name, 1)
    assert [r.value for r in records] == [b"once"]


async def test_broker_restart_mid_stream_loses_nothing(broker, topic_name):
    async with AsyncAdmin(broker.bootstrap) as admin:
        await admin.create_topic(topic_name)
    async with AsyncProducer(broker.bootstrap, retry_backoff_ms=50) as producer:
        first = [producer.send(topic_name, b"a%d" % i) for i in range(100)]
        for h in first:
            await h
        await asyncio.to_thread(broker.restart)
        second = [producer.send(topic_name, b"b%d" % i) for i in range(100)]
        metas = [await h for h in second]
    assert [m.offset for m in metas] == list(range(100, 200))
    records = await read_all(broker.bootstrap, topic_name, 200)
    assert len(records) == 200 and len({r.value for r in records}) == 200
