"""A minimal test-only protocol client on top of codec.py (no retries, no batching).

Speaks raw requests so tests can send exactly the bytes they mean, including broken ones.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable
from typing import Any

from logmq.net.codec import SIZE, ApiKey, Response, decode_response, encode_request

TIMEOUT = 30.0


class RawClient:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client_id: str = "raw-test",
    ):
        self.reader = reader
        self.writer = writer
        self.client_id = client_id
        self._corr = itertools.count(1)

    @classmethod
    async def connect(
        cls, port: int, host: str = "127.0.0.1", client_id: str = "raw-test"
    ) -> RawClient:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 26)
        return cls(reader, writer, client_id)

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass

    async def __aenter__(self) -> RawClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def send(
        self,
        api_key: int,
        body: dict[str, Any],
        tail: Iterable[bytes] = (),
        *,
        version: int = 0,
        correlation_id: int | None = None,
    ) -> int:
        corr = next(self._corr) if correlation_id is None else correlation_id
        self.writer.writelines(encode_request(api_key, version, corr, self.client_id, body, tail))
        return corr

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def recv(self, timeout: float = TIMEOUT) -> Response:
        async with asyncio.timeout(timeout):
            (size,) = SIZE.unpack(await self.reader.readexactly(4))
            frame = await self.reader.readexactly(size)
        return decode_response(frame)

    async def call(
        self, api_key: int, body: dict[str, Any], tail: Iterable[bytes] = (), *, version: int = 0
    ) -> Response:
        corr = self.send(api_key, body, tail, version=version)
        resp = await self.recv()
        assert resp.correlation_id == corr
        return resp

    # -- conveniences -----------------------------------------------------------------
    async def create_topic(
        self,
        name: str,
        partitions: int = 1,
        configs: dict | None = None,
        replication_factor: int = 1,
    ) -> dict:
        resp = await self.call(
            ApiKey.CREATE_TOPICS,
            {
                "topics": [
                    {
                        "topic": name,
                        "partitions": partitions,
                        "replication_factor": replication_factor,
                        "configs": configs or {},
                    }
                ],
                "timeout_ms": 5000,
                "validate_only": False,
            },
        )
        return resp.body["topics"][0]

    async def produce(self, topic: str, partition: int, data: bytes, acks: int = 1) -> dict | None:
        corr = self.send(ApiKey.PRODUCE, produce_body(topic, {partition: data}, acks), [data])
        if acks == 0:
            return None
        resp = await self.recv()
        assert resp.correlation_id == corr
        return resp.body["topics"][0]["partitions"][0]

    async def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_wait_ms: int = 0,
        min_bytes: int = 1,
        max_bytes: int = 50 << 20,
        partition_max_bytes: int = 10 << 20,
    ) -> tuple[dict, bytes]:
        resp = await self.call(
            ApiKey.FETCH,
            fetch_body(
                {topic: [(partition, offset, partition_max_bytes)]},
                max_wait_ms,
                min_bytes,
                max_bytes,
            ),
        )
        p = resp.body["topics"][0]["partitions"][0]
        return p, bytes(resp.tail)

    async def list_offset(self, topic: str, partition: int, timestamp: int) -> dict:
        resp = await self.call(
            ApiKey.LIST_OFFSETS,
            {
                "replica_id": -1,
                "isolation_level": 0,
                "topics": [
                    {
                        "topic": topic,
                        "partitions": [{"partition": partition, "timestamp": timestamp}],
                    }
                ],
            },
        )
        return resp.body["topics"][0]["partitions"][0]


def produce_body(topic: str, parts: dict[int, bytes], acks: int = 1) -> dict[str, Any]:
    return {
        "acks": acks,
        "timeout_ms": 5000,
        "topics": [
            {
                "topic": topic,
                "partitions": [{"partition": p, "size": len(d)} for p, d in parts.items()],
            }
        ],
    }


def fetch_body(
    wanted: dict[str, list[tuple[int, int, int]]],
    max_wait_ms: int = 0,
    min_bytes: int = 1,
    max_bytes: int = 50 << 20,
) -> dict[str, Any]:
    return {
        "replica_id": -1,
        "max_wait_ms": max_wait_ms,
        "min_bytes": min_bytes,
        "max_bytes": max_bytes,
        "isolation_level": 0,
        "topics": [
            {
                "topic": t,
                "partitions": [
                    {
                        "partition": p,
                        "fetch_offset": o,
                        "partition_max_bytes": m,
                        "current_leader_epoch": -1,
                    }
                    for p, o, m in parts
                ],
            }
            for t, parts in wanted.items()
        ],
    }
