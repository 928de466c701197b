"""What compression.type costs the broker, printed as a markdown table (issue 12).

Starts its own ``logmq-server`` on a free 127.0.0.1 port with a temp data dir and, for
each case, creates a topic with that compression.type and produces the same
compressible records (JSON-like text, ~200 B) with the case's producer codec through
``send_batch`` (acks=1). Reports producer throughput, the broker's CPU time (user +
system, from /proc) per MB of record data, the part of it ``recompress.to_codec``
alone takes (timed in this process on the same batches), and what the log holds on
disk. Cases
where the producer's codec already matches store batches untouched; the others make
the leader decompress and recompress every batch. Usage:

    python benchmarks/bench_compression.py [--quick] [--json] [--batch-bytes N]

Each case runs in a fresh topic; the whole run takes well under a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from logmq.client.admin import AsyncAdmin  # noqa: E402
from logmq.client.producer import AsyncProducer  # noqa: E402
from logmq.storage.batch import Compression, encode_values  # noqa: E402
from logmq.storage.config import BROKER_CODECS  # noqa: E402
from logmq.storage.recompress import to_codec  # noqa: E402
from tests.harness import BrokerProcess  # noqa: E402

# (producer codec, topic compression.type)
CASES = [
    ("none", "producer"),
    ("lz4", "producer"),
    ("lz4", "lz4"),
    ("none", "lz4"),
    ("none", "zstd"),
    ("none", "gzip"),
    ("gzip", "lz4"),
    ("lz4", "uncompressed"),
]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def records(n: int) -> list[bytes]:
    """Log-like JSON values: repetitive enough to compress about as real events do."""
    pages = ["/", "/search", "/cart", "/checkout", "/account"] + [f"/item/{i}" for i in range(50)]
    return [
        json.dumps(
            {
                "ts": 1_700_000_000_000 + i * 7,
                "user": f"user-{(i * 7919) % 5000:05d}",
                "event": ("view", "click", "add_to_cart", "purchase")[i % 4],
                "page": pages[(i * 31) % len(pages)],
                "session": f"{(i * 2654435761) % (1 << 32):08x}",
                "latency_ms": (i * 37) % 900,
                "agent": "Mozilla/5.0 (X11; Linux x86_64) Firefox/118.0",
            }
        ).encode()
        for i in range(n)
    ]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def log_bytes(data_dir: Path, topic: str) -> int:
    return sum(p.stat().st_size for p in (data_dir / f"{topic}-0").glob("*.log"))


async def run_case(
    broker: BrokerProcess, values: list[bytes], codec: str, topic_type: str, batch_bytes: int
) -> dict[str, Any]:
    topic = f"c-{codec}-{topic_type}"
    async with AsyncAdmin(broker.bootstrap) as admin:
        await admin.create_topic(topic, 1, configs={"compression.type": topic_type})
    async with AsyncProducer(
        broker.bootstrap, compression=codec, bulk_batch_bytes=batch_bytes
    ) as producer:
        await producer.send_batch(topic, values[:1000], partition=0)  # warm up: metadata
        cpu0, t0 = cpu_seconds(broker.pid), time.perf_counter()
        await producer.send_batch(topic, values, partition=0)
        seconds = time.perf_counter() - t0
        cpu = cpu_seconds(broker.pid) - cpu0
    mb = sum(map(len, values)) / 1e6
    return {
        "producer_codec": codec,
        "compression_type": topic_type,
        "records_per_sec": len(values) / seconds,
        "mb_per_sec": mb / seconds,
        "broker_cpu_ms_per_mb": 1000 * cpu / mb,
        "stored_mb": log_bytes(broker.data_dir, topic) / 1e6,
        "data_mb": mb,
    }


def recompress_cost(values: list[bytes], codec: str, topic_type: str, batch_bytes: int) -> float:
    """CPU ms per MB of record data that ``to_codec`` alone spends (no broker, no I/O)."""
    src = Compression.parse(codec)
    dst = BROKER_CODECS[topic_type]
    per_batch = max(1, batch_bytes // (len(values[0]) + 8))
    batches = [
        encode_values(values[i : i + per_batch], timestamp=0, compression=src)
        for i in range(0, len(values), per_batch)
    ]
    if dst is None:
        return 0.0
    t0 = time.process_time()
    for data in batches:
        to_codec(data, dst, 1 << 30)
    return 1000 * (time.process_time() - t0) / (sum(map(len, values)) / 1e6)


async def main_async(opts: argparse.Namespace) -> list[dict[str, Any]]:
    values = records(100_000 if opts.quick else 500_000)
    out = []
    with BrokerProcess(log_level="warning") as broker:
        for codec, topic_type in CASES:
            out.append(await run_case(broker, values, codec, topic_type, opts.batch_bytes))
    for r in out:
        cost = recompress_cost(values, r["producer_codec"], r["compression_type"], opts.batch_bytes)
        r["to_codec_cpu_ms_per_mb"] = cost
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fifth of the records")
    parser.add_argument("--json", action="store_true", help="also print raw results as JSON")
    parser.add_argument(
        "--batch-bytes", type=int, default=64 << 10, help="producer batch size (default 64 KiB)"
    )
    opts = parser.parse_args()
    results = asyncio.run(main_async(opts))
    cmd = "python benchmarks/bench_compression.py" + (" --quick" if opts.quick else "")
    if opts.batch_bytes != 64 << 10:
        cmd += f" --batch-bytes {opts.batch_bytes}"
    n = "100,000" if opts.quick else "500,000"
    mb = results[0]["data_mb"]
    print(f"Command: `{cmd}` ({os.cpu_count()} CPUs, Python {sys.version.split()[0]}; "
          f"{n} records, {mb:.1f} MB of JSON text per case)\n")  # fmt: skip
    print("| producer codec | compression.type | broker work | records/s | MB/s "
          "| broker CPU ms/MB | of which to_codec | stored MB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        kept = r["compression_type"] in ("producer", r["producer_codec"])
        work = "stored as sent" if kept else "recompressed"
        print(f"| {r['producer_codec']} | {r['compression_type']} | {work} "
              f"| {r['records_per_sec']:,.0f} | {r['mb_per_sec']:,.1f} "
              f"| {r['broker_cpu_ms_per_mb']:,.1f} | {r['to_codec_cpu_ms_per_mb']:,.1f} "
              f"| {r['stored_mb']:,.1f} |")  # fmt: skip
    if opts.json:
        print("\n" + json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
