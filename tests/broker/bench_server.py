"""Quick in-process benchmark of the broker's per-request overhead (not a test).

    python -m tests.broker.bench_server [--batches 2000] [--profile]
    python -m tests.broker.bench_server --process-fetch [--passes 10] [--fetch-mib 4]

Produce: batches of 1,000 records of 100 bytes, pre-encoded (client cost excluded),
acks=1, one at a time and pipelined. Fetch: read the whole partition back with 1 MiB
partition_max_bytes, zero-copy and buffered. Reports wall time per request, the time
spent inside the broker's request handler, and process CPU time per request/per GB.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import uvloop

from logmq.net.codec import ApiKey
from logmq.storage import batch as b
from tests.harness import inprocess_broker
from tests.net.raw_client import RawClient, produce_body


class HandlerTimer:
    def __init__(self, broker):
        self.inner = broker.server.handler
        self.total = 0.0
        self.calls = 0
        broker.server.handler = self

    async def __call__(self, req):
        t = time.perf_counter()
        try:
            return await self.inner(req)
        finally:
            self.total += time.perf_counter() - t
            self.calls += 1

    def reset(self):
        self.total, self.calls = 0.0, 0


def report(name, n, wall, cpu, timer, nbytes=None):
    line = (
        f"{name:<28} {n:>6} req  wall {wall / n * 1e6:8.1f} us/req  "
        f"cpu {cpu / n * 1e6:8.1f} us/req  "
        f"handler {timer.total / max(timer.calls, 1) * 1e6:7.1f} us/req"
    )
    if nbytes:
        line += f"  {nbytes / wall / 1e6:8.1f} MB/s  cpu {cpu / (nbytes / 1e9):6.2f} s/GB"
    print(line)


async def bench(batches: int, zero_copy: bool, profile: bool, configs: dict | None = None) -> None:
    payload = [bytes([65 + i % 26]) * 100 for i in range(1000)]
    data = b.encode_values(payload, timestamp=1)
    with tempfile.TemporaryDirectory() as tmp:
        async with inprocess_broker(Path(tmp) / "d", zero_copy=zero_copy) as br:
            timer = HandlerTimer(br)
            async with await RawClient.connect(br.port) as c:
                await c.create_topic("bench", 1, configs or {})
                body = produce_body("bench", {0: data})
                profiler = None
                if profile:
                    from pyinstrument import Profiler

                    profiler = Profiler(async_mode="disabled")
                    profiler.start()
                # sequential produce
                timer.reset()
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(batches):
                    c.send(ApiKey.PRODUCE, body, [data])
                    await c.recv()
                report(
                    "produce acks=1 sequential",
                    batches,
                    time.perf_counter() - t0,
                    time.process_time() - c0,
                    timer,
                    batches * len(data),
                )
                # pipelined produce, 16 in flight
                timer.reset()
                t0, c0 = time.perf_counter(), time.process_time()
                inflight = 0
                for _ in range(batches):
                    c.send(ApiKey.PRODUCE, body, [data])
                    inflight += 1
                    if inflight == 16:
                        await c.recv()
                        inflight -= 1
                for _ in range(inflight):
                    await c.recv()
                report(
                    "produce acks=1 pipelined16",
                    batches,
                    time.perf_counter() - t0,
                    time.process_time() - c0,
                    timer,
                    batches * len(data),
                )
                if profiler is not None:
                    profiler.stop()
                    print(profiler.output_text(unicode=False, color=False, show_all=False))
                # fetch everything back
                timer.reset()
                t0, c0 = time.perf_counter(), time.process_time()
                offset, n, nbytes = 0, 0, 0
                end = 2 * batches * 1000
                while offset < end:
                    resp = await c.call(
                        ApiKey.FETCH,
                        {
                            "max_wait_ms": 0,
                            "min_bytes": 1,
                            "max_bytes": 64 << 20,
                            "topics": [
                                {
                                    "topic": "bench",
                                    "partitions": [
                                        {
                                            "partition": 0,
                                            "fetch_offset": offset,
                                            "partition_max_bytes": 1 << 20,
                                        }
                                    ],
                                }
                            ],
                        },
                    )
                    tail = resp.tail
                    nbytes += len(tail)
                    n += 1
                    last = None
                    for _pos, h in b.iter_headers(tail):
                        last = h
                    offset = last.next_offset
                mode = "zero-copy" if zero_copy else "buffered"
                report(
                    f"fetch 1MiB {mode}",
                    n,
                    time.perf_counter() - t0,
                    time.process_time() - c0,
                    timer,
                    nbytes,
                )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--process-fetch", action="store_true", help="broker CPU per GB served")
    ap.add_argument("--group-commit", action="store_true", help="topic with group.commit=true")
    ap.add_argument("--passes", type=int, default=10, help="--process-fetch: reads per round")
    ap.add_argument("--fetch-mib", type=int, default=4, help="--process-fetch: MiB per fetch")
    ap.add_argument("--rounds", type=int, default=3, help="--process-fetch: rounds per mode")
    ap.add_argument("--only", choices=["zero-copy", "buffered"], help="--process-fetch: one mode")
    args = ap.parse_args()
    if args.process_fetch:
        for zc in (True, False):
            if args.only in (None, "zero-copy" if zc else "buffered"):
                bench_process_fetch(args.batches, zc, args.passes, args.fetch_mib, args.rounds)
        return
    print(
        f"batch: 1000 records x 100 B = {len(b.encode_values([b'x' * 100] * 1000, timestamp=1))} B"
    )
    for zc in (True, False):
        configs = {"group.commit": "true"} if args.group_commit else None
        uvloop.run(bench(args.batches, zc, args.profile and zc, configs))


def _proc_cpu(pid: int) -> tuple[float, float]:
    """(utime, stime) of a process, in seconds."""
    import os

    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def bench_process_fetch(
    batches: int, zero_copy: bool, passes: int = 10, fetch_mib: int = 4, rounds: int = 3
) -> None:
    """Broker in its own process; a blocking client recv_into()s one reused buffer.

    Reports the broker process's CPU per GB served (user + system, from /proc, whose
    10 ms ticks are why each round reads the partition ``passes`` times): the number
    zero-copy is about.
    """
    import socket

    from logmq.net.codec import RESPONSE_HEADER, SIZE, encode_request, unpack_body
    from tests.harness import BrokerProcess

    args = [] if zero_copy else ["--no-zero-copy"]
    data = b.encode_values([b"y" * 100] * 1000, timestamp=1)
    with BrokerProcess(extra_args=args, log_level="warning") as br:
        s = socket.create_connection(("127.0.0.1", br.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        buf = bytearray((fetch_mib + 4) << 20)
        view = memoryview(buf)

        def call(key, body, tail=()):
            s.sendall(b"".join(bytes(p) for p in encode_request(key, 0, 1, "bench", body, tail)))
            got = 0
            while got < 4:
                got += s.recv_into(view[got:4])
            (size,) = SIZE.unpack_from(buf, 0)
            got = 0
            while got < size:
                got += s.recv_into(view[got:size])
            _corr, blen = RESPONSE_HEADER.unpack_from(buf, 0)
            return unpack_body(view[8 : 8 + blen]), view[8 + blen : size]

        call(
            ApiKey.CREATE_TOPICS,
            {"topics": [{"topic": "f", "partitions": 1, "replication_factor": 1, "configs": {}}]},
        )
        for _ in range(batches):
            call(ApiKey.PRODUCE, produce_body("f", {0: data}), [data])
        end = batches * 1000
        for _round in range(rounds):
            offset, nbytes, n, left = 0, 0, 0, passes
            (user0, sys0), t0 = _proc_cpu(br.pid), time.perf_counter()
            while left:
                if offset >= end:
                    offset = 0
                    left -= 1
                    continue
                body = {
                    "max_wait_ms": 0,
                    "min_bytes": 1,
                    "max_bytes": 64 << 20,
                    "topics": [
                        {
                            "topic": "f",
                            "partitions": [
                                {"partition": 0, "fetch_offset": offset,
                                 "partition_max_bytes": fetch_mib << 20}
                            ],
                        }
                    ],
                }  # fmt: skip
                _resp, tail = call(ApiKey.FETCH, body)
                nbytes += len(tail)
                n += 1
                last = None
                for _pos, h in b.iter_headers(tail):
                    last = h
                offset = last.next_offset
            wall = time.perf_counter() - t0
            user1, sys1 = _proc_cpu(br.pid)
            gb = nbytes / 1e9
            cpu = user1 - user0 + sys1 - sys0
            mode = "zero-copy" if zero_copy else "buffered"
            print(
                f"fetch {fetch_mib}MiB {mode:<9} (broker process): "
                f"{nbytes / wall / 1e6:7.1f} MB/s, "
                f"broker cpu {cpu / gb:5.3f} s/GB (user {(user1 - user0) / gb:5.3f}, "
                f"sys {(sys1 - sys0) / gb:5.3f}), {gb:.2f} GB in {n} requests",
                flush=True,
            )
        s.close()


if __name__ == "__main__":
    main()
