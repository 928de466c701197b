"""Mutation fuzzer of the Kafka request decoder, run as its own process.

A decoder fault that aborts (kio's native reader allocating a lying count) kills the
process, which no ``except`` in a test could catch: so the test suite runs this as a
subprocess and checks its exit status. Longer runs: ``python -m tests.kafka.fuzz_frames
--seconds 1800``. The seed frames are hypothesis-built requests of every served API and
version plus, with ``--corpus``, frames recorded from real clients (one file a frame).
"""

from __future__ import annotations

import argparse
import pathlib
import random
import sys
import time
import warnings

from logmq.errors import InvalidFrameError
from logmq.kafka.registry import kafka_wire


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--frames", type=int, default=0, help="stop after this many (0: time only)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-request", type=int, default=2)
    ap.add_argument("--corpus", type=pathlib.Path, action="append", default=[])
    args = ap.parse_args(argv)

    warnings.simplefilter("ignore")  # hypothesis's .example() outside a test
    from tests.kafka.kafka_frames import example_frames, mutate

    rnd = random.Random(args.seed)
    seeds = example_frames(rnd, args.per_request)
    for folder in args.corpus:
        seeds += [p.read_bytes() for p in sorted(folder.glob("*.bin"))]
    wire = kafka_wire()
    decoded = refused = 0
    start = time.monotonic()
    deadline = start + args.seconds
    n = 0
    while time.monotonic() < deadline and (not args.frames or n < args.frames):
        for _ in range(200):
            frame = mutate(rnd.choice(seeds), rnd)
            if rnd.random() < 0.3:
                frame = mutate(frame, rnd)
            n += 1
            try:
                wire.decode_request(memoryview(frame))
                decoded += 1
            except InvalidFrameError:
                refused += 1
            except Exception as e:  # anything else is a bug of the decoder
                print(f"FAIL {type(e).__name__}: {e}\nframe: {frame.hex()}", flush=True)
                return 1
    took = time.monotonic() - start
    print(
        f"fuzz_frames: {n} frames in {took:.1f} s ({n / took:,.0f}/s): "
        f"{decoded} decoded, {refused} refused, {len(seeds)} seeds",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
