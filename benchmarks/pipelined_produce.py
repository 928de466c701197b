"""The produce load of the broker-side benchmarks: one pre-encoded batch sent over and
over on one connection, ``in_flight`` requests pipelined, with per-request latency.

Shared by bench_replication.py and bench_reassignment.py so both measure the same load.
"""

from __future__ import annotations

import asyncio
import time

from logmq.client.connection import BrokerConnection
from logmq.net.codec import ApiKey


async def pipelined_produce(
    conn: BrokerConnection,
    topic: str,
    partition: int,
    batch: bytes,
    *,
    acks: int = -1,
    count: int | None = None,
    stop: asyncio.Event | None = None,
    in_flight: int = 8,
    mb: float = 1e6,
) -> dict:
    """Produce ``batch`` until ``count`` requests were sent or ``stop`` is set.

    Returns the elapsed seconds, throughput in ``mb``-byte units per second, requests
    acknowledged, refused ones, and p50/p99 latency in ms.
    """
    body = {
        "acks": acks,
        "timeout_ms": 30_000,
        "topics": [{"topic": topic, "partitions": [{"partition": partition, "size": len(batch)}]}],
    }
    done = errors = sent = 0
    latencies: list[float] = []
    window = asyncio.Semaphore(in_flight)
    tasks: set[asyncio.Task] = set()

    async def one() -> None:
        nonlocal done, errors
        t0 = time.perf_counter()
        try:
            fut = conn.send(ApiKey.PRODUCE, body, [batch])
            assert fut is not None
            resp = await fut
            if resp.body["topics"][0]["partitions"][0]["error"]:
                errors += 1
            else:
                done += 1
                latencies.append(time.perf_counter() - t0)
        finally:
            window.release()

    start = time.perf_counter()
    while (count is None or sent < count) and (stop is None or not stop.is_set()):
        await window.acquire()
        await conn.drain()
        sent += 1
        task = asyncio.get_running_loop().create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    latencies.sort()
    return {
        "seconds": elapsed,
        "mb_per_sec": done * len(batch) / elapsed / mb,
        "requests": done,
        "errors": errors,
        "p50_ms": latencies[len(latencies) // 2] * 1000 if latencies else None,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000 if latencies else None,
    }
