"""Client throughput against a real broker (not a test: run it by hand).

    python -m tests.client.bench_clients [bulk] [send] [sync] [consume] [batches]

Prints records/s (wall) and client CPU per record for 100-byte values on a
one-partition topic with acks=1. Set N to change the record count (default 1,000,000)
and PROFILE=1 for a pyinstrument profile of the client side.
"""

from __future__ import annotations

import os
import sys
import time

import uvloop

import logmq
from tests.harness import BrokerProcess

N = int(os.environ.get("N", "1000000"))
VALUE = b"x" * 100


class Timer:
    def __init__(self, label: str, n: int) -> None:
        self.label, self.n = label, n

    def __enter__(self) -> Timer:
        self.t, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        wall, cpu = time.perf_counter() - self.t, time.process_time() - self.c
        print(
            f"{self.label}: {self.n / wall:,.0f} rec/s wall; "
            f"client CPU {cpu / self.n * 1e6:.2f} us/rec",
            flush=True,
        )


async def run(bootstrap: str, modes: list[str]) -> None:
    async with logmq.AsyncAdmin(bootstrap) as admin:
        await admin.create_topic("bench", partitions=1)
    async with logmq.AsyncProducer(bootstrap, acks=1, batch_size=1 << 20) as p:
        if "bulk" in modes:
            values = [VALUE] * N
            with Timer("send_batch", N):
                handles = []
                for i in range(0, N, 100_000):
                    await p.wait_for_space()
                    handles.append(p.send_batch("bench", values[i : i + 100_000]))
                for h in handles:
                    await h
        if "send" in modes:
            with Timer("async send()", N):
                send = p.send
                for i in range(N):
                    send("bench", VALUE)
                    if i % 10_000 == 0:
                        await p.wait_for_space()
                await p.flush()
    if "sync" in modes:
        with (
            logmq.Producer(bootstrap, acks=1, batch_size=1 << 20) as sp,
            Timer("blocking send()", N),
        ):
            for _ in range(N):
                sp.send("bench", VALUE)
            sp.flush()
    for mode in ("consume", "batches"):
        if mode not in modes:
            continue
        async with logmq.AsyncConsumer(
            bootstrap, auto_offset_reset="earliest", max_partition_fetch_bytes=4 << 20
        ) as c:
            c.assign([("bench", 0)])
            n = 0
            with Timer("poll()" if mode == "consume" else "poll_batches()", N):
                while n < N:
                    if mode == "consume":
                        got = await c.poll(timeout=5, max_records=100_000)
                        n += len(got)
                    else:
                        got = await c.poll_batches(timeout=5, max_records=100_000)
                        n += sum(len(b) for b in got)
                    if not got:
                        break


def main() -> None:
    modes = sys.argv[1:] or ["bulk", "send", "sync", "consume", "batches"]
    broker = BrokerProcess().start()
    try:
        if os.environ.get("PROFILE"):
            from pyinstrument import Profiler

            profiler = Profiler()
            profiler.start()
            uvloop.run(run(broker.bootstrap, modes))
            profiler.stop()
            print(profiler.output_text(color=False))
        else:
            uvloop.run(run(broker.bootstrap, modes))
    finally:
        broker.close()


if __name__ == "__main__":
    main()
