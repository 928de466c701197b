"""Idempotent producer state across segment rolls, restarts and crashes, end to end.

The producer state of a partition comes back from the latest snapshot (written at every
roll and at a clean stop) plus a replay of the batch headers after it. Whatever the mix,
a retried batch must be answered with its original offset and the next sequence must
be accepted.
"""

from __future__ import annotations

from logmq.net.codec import ApiKey
from logmq.storage import batch as b
from tests.net.raw_client import RawClient

ROLL_OFTEN = {"segment.bytes": "4096"}


class Producer:
    """Tracks one idempotent producer's sequences on partition 0 of topic ``t``."""

    def __init__(self, pid: int):
        self.pid, self.seq, self.end = pid, 0, 0
        self.sent: list[tuple[bytes, int]] = []

    def batch(self, n: int) -> bytes:
        values = [b"i%d" % (self.seq + i) for i in range(n)]
        return b.encode_values(
            values, timestamp=1, producer_id=self.pid, producer_epoch=0, base_sequence=self.seq
        )

    async def send(self, c: RawClient, n: int) -> None:
        data = self.batch(n)
        r = await c.produce("t", 0, data)
        assert (r["error"], r["base_offset"]) == (0, self.end), r
        self.sent.append((data, self.end))
        self.seq += n
        self.end += n

    async def plain(self, c: RawClient, size: int, batches: int = 1) -> None:
        data = b"".join(b.encode_values([b"p" * size], timestamp=1000) for _ in range(batches))
        r = await c.produce("t", 0, data)
        assert (r["error"], r["base_offset"]) == (0, self.end), r
        self.end += batches

    async def retry(self, c: RawClient, back: int = 1) -> None:
        data, base = self.sent[-back]
        r = await c.produce("t", 0, data)
        assert (r["error"], r["base_offset"]) == (0, base), r


async def setup(port: int) -> Producer:
    async with await RawClient.connect(port) as c:
        assert (await c.create_topic("t", 1, ROLL_OFTEN))["error"] == 0
        resp = await c.call(ApiKey.INIT_PRODUCER_ID, {"producer_id": -1, "producer_epoch": -1})
        return Producer(resp.body["producer_id"])


async def test_sequences_survive_rolls_restarts_and_crashes(broker):
    p = await setup(broker.port)
    steps = [
        # (restart kind before the step, actions)
        (None, ["idem1", "idem1", "big", "idem2", "retry"]),
        ("restart", ["retry", "idem1", "big3", "retry", "idem3"]),
        ("restart", ["retry", "big", "idem1"]),
        ("crash", ["retry", "idem2", "big", "big", "idem1"]),
        ("crash", ["retry", "retry2", "idem1", "retry"]),
        ("restart", ["retry", "idem1"]),
    ]
    for kind, actions in steps:
        if kind == "restart":
            broker.restart()
        elif kind == "crash":
            broker.kill()
            broker.start()
        async with await RawClient.connect(broker.port) as c:
            for a in actions:
                if a.startswith("idem"):
                    await p.send(c, int(a[4:]))
                elif a.startswith("big"):
                    await p.plain(c, 3000, int(a[3:] or 1))  # each one rolls a segment
                elif a == "retry2":
                    await p.retry(c, back=2)
                else:
                    await p.retry(c)
            assert (await c.list_offset("t", 0, -1))["offset"] == p.end
