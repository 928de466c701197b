"""BrokerConnection and ClusterMetadata against a scripted in-process server."""

from __future__ import annotations

import asyncio

import pytest

from logmq.client.cluster import ClusterMetadata, parse_bootstrap
from logmq.client.connection import BrokerConnection
from logmq.errors import ConnectionError_, ErrorCode, UnsupportedVersionError
from logmq.net.codec import decode_request, encode_response
from logmq.net.frame_reader import FrameReader


class ScriptedServer:
    """Answers each request with ``reply(request)``; None means stay silent."""

    def __init__(self, reply):
        self.reply = reply
        self.requests = []
        self.writers = []
        self.got_request = asyncio.Event()

    async def handle(self, reader, writer):
        self.writers.append(writer)
        dec = FrameReader()
        while data := await reader.read(65536):
            for frame in dec.feed(data):
                req = decode_request(frame)
                self.requests.append(req)
                self.got_request.set()
                out = self.reply(req)
                if out is not None:
                    corr, body, tail = out
                    writer.writelines(encode_response(corr, body, tail))
        writer.close()

    async def __aenter__(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc):
        for w in self.writers:
            w.close()
        self.server.close()
        await self.server.wait_closed()


async def test_pipelined_requests_match_responses_in_order():
    def echo(req):
        return req.correlation_id, {"n": req.body["n"]}, [bytes(req.tail)]

    async with ScriptedServer(echo) as srv:
        conn = await BrokerConnection.open("127.0.0.1", srv.port)
        futs = [conn.send(3, {"n": i}, [b"x" * i]) for i in range(50)]
        resps = await asyncio.gather(*futs)
        assert [r.body["n"] for r in resps] == list(range(50))
        assert [len(r.tail) for r in resps] == list(range(50))
        resp = await conn.request(3, {"n": 99}, timeout=5)
        assert resp.body == {"n": 99}
        conn.close()
        await conn.wait_closed()


async def test_request_level_error_raises_its_exception():
    def refuse(req):
        return req.correlation_id, {"error": int(ErrorCode.UNSUPPORTED_VERSION)}, []

    async with ScriptedServer(refuse) as srv:
        conn = await BrokerConnection.open("127.0.0.1", srv.port)
        with pytest.raises(UnsupportedVersionError):
            await conn.request(3, {}, timeout=5)
        assert conn.is_open  # the connection stays usable
        conn.close()


async def test_connection_loss_fails_pending_requests():
    async with ScriptedServer(lambda req: None) as srv:
        conn = await BrokerConnection.open("127.0.0.1", srv.port)
        futs = [conn.send(1, {}) for _ in range(3)]
        async with asyncio.timeout(5):
            while len(srv.requests) < 3:
                srv.got_request.clear()
                await srv.got_request.wait()
        srv.writers[0].close()
        for f in futs:
            with pytest.raises(ConnectionError_):
                await f
        assert not conn.is_open
        with pytest.raises(ConnectionError_):
            conn.send(1, {})


async def test_wrong_correlation_id_closes_the_connection():
    async with ScriptedServer(lambda req: (req.correlation_id + 1, {}, [])) as srv:
        conn = await BrokerConnection.open("127.0.0.1", srv.port)
        with pytest.raises(ConnectionError_):
            await conn.request(3, {}, timeout=5)


async def test_request_timeout_closes_connection():
    async with ScriptedServer(lambda req: None) as srv:
        conn = await BrokerConnection.open("127.0.0.1", srv.port)
        with pytest.raises(ConnectionError_):
            await conn.request(3, {}, timeout=0.05)
        assert not conn.is_open


async def test_connect_refused_is_connection_error():
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(ConnectionError_):
        await BrokerConnection.open("127.0.0.1", port, connect_timeout=2)


def test_metadata_snapshot_routes_to_leaders():
    body = {
        "cluster_id": "c",
        "controller_id": 1,
        "brokers": [{"node_id": 1, "host": "127.0.0.1", "port": 9}],
        "topics": [
            {
                "topic": "a",
                "error": 0,
                "internal": False,
                "partitions": [
                    {
                        "partition": 1,
                        "error": 0,
                        "leader": 2,
                        "leader_epoch": 3,
                        "replicas": [2],
                        "isr": [2],
                    },
                    {
                        "partition": 0,
                        "error": 0,
                        "leader": 1,
                        "leader_epoch": 0,
                        "replicas": [1],
                        "isr": [1],
                    },
                ],
            },
            {"topic": "gone", "error": 3, "partitions": []},
        ],
    }
    md = ClusterMetadata.from_response(body)
    assert md.partition_count("a") == 2 and md.partition_count("gone") == 0
    assert md.leader_for("a", 0) == 1 and md.leader_for("a", 1) == 2
    assert md.leader_for("a", 2) == -1 and md.leader_for("nope", 0) == -1
    older = ClusterMetadata.from_response({"topics": [{"topic": "b", "partitions": []}]})
    merged = older.merged(md, ["a", "gone"])
    assert set(merged.topics) == {"a", "b"}  # errors are not cached; other topics kept


def test_parse_bootstrap():
    assert parse_bootstrap("h1:1, h2:2") == [("h1", 1), ("h2", 2)]
    assert parse_bootstrap("[::1]:9092") == [("::1", 9092)]
    with pytest.raises(ValueError):
        parse_bootstrap("nohost")
    with pytest.raises(ValueError):
        parse_bootstrap("")


async def test_clients_fail_cleanly_without_a_broker():
    from logmq import AsyncAdmin, AsyncConsumer, AsyncProducer
    from logmq.errors import LogMQError

    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    for cls in (AsyncAdmin, AsyncProducer, AsyncConsumer):
        with pytest.raises(LogMQError) as e:
            async with cls(f"127.0.0.1:{port}", request_timeout_ms=300, retry_backoff_ms=20):
                pass
        assert e.value.retriable
