"""kill -9 during heavy produce: every acknowledged record survives exactly once, in order.

The topic flushes every message (flush.messages=1), so an acknowledgement means the
batch is on disk. After the SIGKILL and a restart, a full read must contain every
acknowledged batch at the offsets it was acknowledged with; batches that were sent but
not acknowledged may be there or not, but never twice; new appends continue after the
recovered end without reusing an offset.
"""

from __future__ import annotations

import asyncio
import contextlib

from logmq.net.codec import ApiKey
from logmq.storage import batch as b
from tests.net.raw_client import RawClient, produce_body

PRODUCERS = 6
PIPELINE = 4
KILL_AFTER_ACKS = 150


async def produce_until_killed(port: int, pid_tag: int, partition: int, acked: list, enough):
    """Pipelined acks=1 produce; records (partition, base_offset, values) of every ack."""
    c = await RawClient.connect(port)
    in_flight: dict[int, list[bytes]] = {}
    seq = 0
    try:
        while True:
            while len(in_flight) < PIPELINE:
                values = [b"p%d-s%d-r%d" % (pid_tag, seq, i) for i in range(20)]
                data = b.encode_values(values, timestamp=seq)
                corr = c.send(ApiKey.PRODUCE, produce_body("crash", {partition: data}), [data])
                in_flight[corr] = values
                seq += 1
            resp = await c.recv(timeout=30)
            values = in_flight.pop(resp.correlation_id)
            part = resp.body["topics"][0]["partitions"][0]
            assert part["error"] == 0, part
            acked.append((partition, part["base_offset"], values))
            if len(acked) >= KILL_AFTER_ACKS:
                enough.set()
    except (asyncio.IncompleteReadError, ConnectionError, OSError):
        return  # the broker died under us: expected
    finally:
        with contextlib.suppress(Exception):
            await c.close()


async def read_partition(c: RawClient, partition: int) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    offset = 0
    while True:
        meta, data = await c.fetch("crash", partition, offset)
        assert meta["error"] == 0, meta
        records = [
            (off, val)
            for pos, _h in b.iter_headers(data)
            for off, _ts, _k, val, _hd in b.decode_records(data, pos)
            if off >= offset
        ]
        if not records:
            assert offset == meta["high_watermark"]
            return out
        out.extend(records)
        offset = records[-1][0] + 1


async def test_kill_9_during_heavy_produce_keeps_every_acked_record(broker):
    async with await RawClient.connect(broker.port) as c:
        r = await c.create_topic("crash", 2, {"flush.messages": "1"})
        assert r["error"] == 0
    acked: list = []
    enough = asyncio.Event()
    producers = [
        asyncio.create_task(produce_until_killed(broker.port, i, i % 2, acked, enough))
        for i in range(PRODUCERS)
    ]
    async with asyncio.timeout(120):
        await enough.wait()
    broker.kill()  # SIGKILL while requests are in flight
    async with asyncio.timeout(60):
        await asyncio.gather(*producers)
    assert not (broker.data_dir / ".clean-shutdown").exists()
    snapshot = list(acked)

    broker.start()
    async with await RawClient.connect(broker.port) as c:
        for partition in (0, 1):
            records = await read_partition(c, partition)
            offsets = [o for o, _ in records]
            assert offsets == list(range(len(records)))  # dense, ordered, from 0
            values = [v for _, v in records]
            assert len(set(values)) == len(values)  # nothing twice
            by_offset = dict(records)
            for p, base, vals in snapshot:
                if p != partition:
                    continue
                got = [by_offset.get(base + i) for i in range(len(vals))]
                assert got == vals, f"acked batch at {partition}:{base} lost or changed"
            # offsets continue after the recovered end, none reused
            nxt = await c.produce("crash", partition, b.encode_values([b"after"], timestamp=1))
            assert nxt["error"] == 0 and nxt["base_offset"] == len(records)
    assert len(snapshot) >= KILL_AFTER_ACKS
