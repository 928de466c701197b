"""A client that closes right after sending still gets its requests carried out.

acks=0 producers typically send and hang up; everything the broker fully received
must be appended even though nobody is left to read an answer.
"""

from __future__ import annotations

import asyncio

from logmq.storage import batch as b
from tests.net.raw_client import RawClient

DEADLINE_S = 20.0


async def _wait_for_end_offset(port: int, topic: str, want: int) -> int:
    """Poll ListOffsets(latest) on a fresh connection until it reaches ``want`` or time out."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    async with await RawClient.connect(port) as c:
        while True:
            r = await c.list_offset(topic, 0, -1)
            if r["offset"] >= want or loop.time() > deadline:
                return r["offset"]
            await c.fetch(topic, 0, r["offset"], max_wait_ms=200)  # long poll, not a sleep


async def test_acks_zero_produces_land_when_the_client_closes_at_once(broker):
    n = 20
    async with await RawClient.connect(broker.port) as admin:
        assert (await admin.create_topic("fire-and-forget", 1))["error"] == 0
    c = await RawClient.connect(broker.port)
    for i in range(n):
        await c.produce("fire-and-forget", 0, b.encode_values([b"v%d" % i], timestamp=1), acks=0)
    await c.close()
    assert await _wait_for_end_offset(broker.port, "fire-and-forget", n) == n


async def test_pipelined_acks_zero_produces_beyond_the_in_flight_limit(broker_factory):
    # max_in_flight makes the broker stop reading; the rest waits in the socket buffer
    # and must still be read and appended after the peer's FIN.
    br = broker_factory(extra_args=["--max-in-flight", "4"])
    n = 40
    async with await RawClient.connect(br.port) as admin:
        assert (await admin.create_topic("burst", 1))["error"] == 0
    c = await RawClient.connect(br.port)
    for i in range(n):
        await c.produce("burst", 0, b.encode_values([b"x" * 100, b"%d" % i], timestamp=1), acks=0)
    await c.close()
    assert await _wait_for_end_offset(br.port, "burst", 2 * n) == 2 * n
