"""Storage engine benchmark: PartitionLog append/read beside raw os.write/os.read.

In-process, 100-byte records in batches of 1,000, on the same file system in the same
run, the legs alternating in short rounds (whose median ratio shrugs off a neighbour's
burst of CPU use). A third leg, raw os.write plus the CRC-32C the broker must
verify, shows the floor any validating append has. Also times reopening the cleanly
closed log (it must not scan) and the first read of data written before the reopen
(checksummed once). Not a test: it prints a table, and ``--json FILE`` writes the
figures. ``--mb 256`` keeps the writes at page-cache speed; 1 GB mostly measures
writeback throttling.

    python benchmarks/bench_storage.py --mb 1024
    python benchmarks/bench_storage.py --compaction --mb 256   # the log cleaner instead
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from logmq.storage import batch as b
from logmq.storage.config import LogConfig
from logmq.storage.log_manager import LogManager
from logmq.storage.partition_log import PartitionLog

RECORD = 100
PER_BATCH = 1000
READ_CHUNK = 1 << 20
ROUND = 32  # batches per alternation round (about 3.5 MB)
READ_RUNS = 3
READ_ROUND = 16  # 1 MiB reads per alternation round


def make_batches(k: int) -> list[bytes]:
    out = []
    for j in range(k):
        values = [bytes([65 + (i + j) % 26]) * RECORD for i in range(PER_BATCH)]
        out.append(b.encode_values(values, timestamp=1_700_000_000_000 + j))
    return out


def raw_read(path: Path) -> tuple[float, int]:
    fd = os.open(path, os.O_RDONLY)
    total = 0
    t = time.perf_counter()
    while chunk := os.read(fd, READ_CHUNK):
        total += len(chunk)
    dt = time.perf_counter() - t
    os.close(fd)
    return dt, total


def log_append(plog: PartitionLog, batches: list[bytes], n: int) -> float:
    t = time.perf_counter()
    for i in range(n):
        plog.append(batches[i % len(batches)])
    return time.perf_counter() - t


def log_read(plog: PartitionLog, copy: bool) -> tuple[float, int]:
    offset, total = plog.log_start_offset, 0
    end = plog.log_end_offset
    t = time.perf_counter()
    while offset < end:
        sl = plog.read(offset, READ_CHUNK)
        if copy:
            sl.read()  # the bytes a buffered sender would copy
        offset = sl.end_offset  # where the next fetch continues
        total += sl.length
    return time.perf_counter() - t, total


def read_rounds(raw_path: Path, plog: PartitionLog) -> list[float]:
    """Log read rate / raw read rate per round of READ_ROUND reads, alternating.

    Like the append rounds, robust to a neighbour's burst of CPU use (which the
    whole-file passes above are not). Rates, since a slice holds whole batches and so
    a little less than a raw 1 MiB chunk; the leg that goes first alternates.
    """
    fd = os.open(raw_path, os.O_RDONLY)
    state = {"offset": plog.log_start_offset}
    end = plog.log_end_offset

    def raw_leg() -> tuple[float, int]:
        got = 0
        t = time.perf_counter()
        for _ in range(READ_ROUND):
            got += len(os.read(fd, READ_CHUNK))
        return time.perf_counter() - t, got

    def log_leg() -> tuple[float, int]:
        got, offset = 0, state["offset"]
        t = time.perf_counter()
        for _ in range(READ_ROUND):
            if offset >= end:
                break
            sl = plog.read(offset, READ_CHUNK)
            got += len(sl.read())
            offset = sl.end_offset
        state["offset"] = offset
        return time.perf_counter() - t, got

    ratios = []
    try:
        while state["offset"] < end:
            if len(ratios) % 2:
                (log_s, log_b), (raw_s, raw_b) = log_leg(), raw_leg()
            else:
                (raw_s, raw_b), (log_s, log_b) = raw_leg(), log_leg()
            if raw_b and log_b:
                ratios.append((log_b / log_s) / (raw_b / raw_s))
    finally:
        os.close(fd)
    return ratios


async def group_commit(directory: Path, producers: int, per_producer: int) -> dict:
    mgr = LogManager(directory)
    await mgr.start()
    plog = mgr.create_log("gc", 0, {"group.commit": "true"})
    small = b.encode_values([b"x" * RECORD] * 10, timestamp=1)

    async def producer() -> None:
        for _ in range(per_producer):
            await mgr.append(plog, small)

    t = time.perf_counter()
    await asyncio.gather(*(producer() for _ in range(producers)))
    dt = time.perf_counter() - t
    await mgr.stop()
    appends = producers * per_producer
    return {"appends_per_s": appends / dt, "producers": producers, "seconds": dt}


COMPACTION_CASES = (
    # (name, distinct keys, codec): a few keys (most records superseded), every key
    # distinct (nothing to drop: the copy path), and a compressed log.
    ("10k keys, uncompressed", 10_000, b.Compression.NONE),
    ("all keys distinct, uncompressed", 0, b.Compression.NONE),
    ("10k keys, zstd", 10_000, b.Compression.ZSTD),
)


def compaction(base: Path, mb: int) -> list[dict]:
    """Time one full cleaning (offset map, rewrite, swap) of an all-dirty compacted log.

    Keys are 16 bytes, values 100 random bytes (from a pool of 256, so zstd has a
    little to find), 1,000 records a batch, 64 MB segments. The cleaning runs inline
    (``PartitionLog.clean``): the same work the cleaner task does in a worker thread.
    MB/s counts segment bytes read; "data MB/s" counts keys and values (116 B a record).
    """
    out = []
    for name, keys, codec in COMPACTION_CASES:
        cfg = LogConfig.from_dict(
            {
                "cleanup.policy": "compact",
                "segment.bytes": str(64 << 20),
                "file.delete.delay.ms": "0",
            }
        )
        plog = PartitionLog(base / f"compact-{len(out)}", cfg)
        n = max(1, mb * 1_000_000 // (PER_BATCH * (RECORD + 16)))
        pool = [os.urandom(RECORD) for _ in range(256)]
        for j in range(n):
            first = j * PER_BATCH
            ids = range(first, first + PER_BATCH)
            rows = [
                (1_700_000_000_000, b"%016d" % (i % keys if keys else i), pool[i % 256], None)
                for i in ids
            ]
            plog.append(b.encode_batch(rows, compression=codec))
        plog.roll()
        plog.flush()
        t = time.perf_counter()
        stats = plog.clean(buffer_bytes=1 << 30)
        dt = time.perf_counter() - t
        assert stats is not None and stats.records_in == n * PER_BATCH
        out.append(
            {
                "case": name,
                "records": stats.records_in,
                "kept": stats.records_out,
                "bytes_in": stats.bytes_in,
                "bytes_out": stats.bytes_out,
                "seconds": dt,
                "mb_per_s": stats.bytes_in / dt / 1e6,
                "data_mb_per_s": stats.records_in * (RECORD + 16) / dt / 1e6,
                "records_per_s": stats.records_in / dt,
            }
        )
        plog.close()
        shutil.rmtree(base / f"compact-{len(out) - 1}", ignore_errors=True)
    return out


async def compaction_loop_stall(base: Path, mb: int) -> dict:
    """``LogManager.clean`` with the heavy steps in a worker thread: how long the event
    loop is blocked at most (installs: renames and a directory fsync per new segment),
    seen by a task that wakes every millisecond."""
    mgr = LogManager(base / "stall", cleaner_enabled=False)
    plog = mgr.create_log(
        "compact", 0, {"cleanup.policy": "compact", "segment.bytes": str(16 << 20)}
    )
    pool = [os.urandom(RECORD) for _ in range(256)]
    for j in range(max(1, mb * 1_000_000 // (PER_BATCH * (RECORD + 16)))):
        rows = [
            (1_700_000_000_000, b"%016d" % (i % 10_000), pool[i % 256], None)
            for i in range(j * PER_BATCH, (j + 1) * PER_BATCH)
        ]
        plog.append(b.encode_batch(rows))
    plog.roll()
    plog.flush()
    worst = 0.0
    done = False

    async def ticker() -> None:
        nonlocal worst
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            worst = max(worst, now - last - 0.001)
            last = now

    tick = asyncio.get_running_loop().create_task(ticker())
    t = time.perf_counter()
    stats = await mgr.clean(plog)
    dt = time.perf_counter() - t
    done = True
    await tick
    plog.close()
    assert stats is not None
    return {
        "segments_out": stats.segments_out,
        "seconds": dt,
        "mb_per_s": stats.bytes_in / dt / 1e6,
        "max_loop_stall_ms": worst * 1000,
    }


def print_compaction(results: list[dict]) -> None:
    print(
        f"{'log cleaner, one full pass':<34}{'MB in':>8}{'MB out':>9}{'MB/s':>8}"
        f"{'data MB/s':>11}{'records/s':>13}{'kept':>10}"
    )
    for r in results:
        print(
            f"{r['case']:<34}{r['bytes_in'] / 1e6:>8.0f}{r['bytes_out'] / 1e6:>9.1f}"
            f"{r['mb_per_s']:>8.0f}{r['data_mb_per_s']:>11.0f}{r['records_per_s']:>13,.0f}"
            f"{r['kept']:>10,}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=1024, help="data volume per pass (MB)")
    ap.add_argument("--dir", default=None, help="directory on the file system to test")
    ap.add_argument("--json", default=None, help="also write the figures as JSON here")
    ap.add_argument("--no-group-commit", action="store_true")
    ap.add_argument("--compaction", action="store_true", help="benchmark the log cleaner instead")
    args = ap.parse_args()

    base = Path(tempfile.mkdtemp(prefix="logmq-bench-", dir=args.dir))
    if args.compaction:
        try:
            results = compaction(base, args.mb)
            print_compaction(results)
            stall = asyncio.run(compaction_loop_stall(base, args.mb))
            print(
                f"LogManager.clean (worker thread), 10k keys: {stall['mb_per_s']:.0f} MB/s, "
                f"{stall['segments_out']} segments installed, event loop blocked at most "
                f"{stall['max_loop_stall_ms']:.1f} ms"
            )
            if args.json:
                Path(args.json).write_text(
                    json.dumps({"cases": results, "loop_stall": stall}, indent=2)
                )
        finally:
            shutil.rmtree(base, ignore_errors=True)
        return
    try:
        batches = make_batches(16)
        bsize = len(batches[0])
        n = max(1, args.mb * 1_000_000 // bsize)
        nbytes = n * bsize
        records = n * PER_BATCH
        results: dict[str, dict] = {}

        # Raw and log writes alternate in small rounds so that page-cache writeback
        # (which throttles writers unpredictably on a shared machine) hits both alike.
        cfg = LogConfig()  # 1 GiB segments, Kafka defaults
        plog = PartitionLog(base / "bench-0", cfg)
        raw_fd = os.open(base / "raw.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        sum_fd = os.open(base / "sum.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        views = [memoryview(x) for x in batches]

        def raw_leg(first: int, k: int) -> float:
            t = time.perf_counter()
            for i in range(first, first + k):
                os.write(raw_fd, batches[i % len(batches)])
            return time.perf_counter() - t

        def sum_leg(first: int, k: int) -> float:
            t = time.perf_counter()
            for i in range(first, first + k):
                mv = views[i % len(views)]
                b.compute_checksum(mv, 0, len(mv))
                os.write(sum_fd, mv)
            return time.perf_counter() - t

        def log_leg(first: int, k: int) -> float:
            t = time.perf_counter()
            for i in range(first, first + k):
                plog.append(batches[i % len(batches)])
            return time.perf_counter() - t

        # One untimed batch per leg first: the log's first append writes its
        # leader-epoch checkpoint (two fsyncs) and opens its segment, the raw files
        # their first blocks; steady-state appends are what the rates are about.
        for leg in (raw_leg, sum_leg, log_leg):
            leg(0, 1)
        raw_s = sum_s = log_s = 0.0
        round_ratios = []  # raw / log per round: robust to a neighbour's burst of CPU use
        done = 0
        while done < n:
            k = min(ROUND, n - done)
            if len(round_ratios) % 2:  # alternate the order: neither leg always goes first
                dt_log, dt_sum, dt_raw = log_leg(done, k), sum_leg(done, k), raw_leg(done, k)
            else:
                dt_raw, dt_sum, dt_log = raw_leg(done, k), sum_leg(done, k), log_leg(done, k)
            round_ratios.append(dt_raw / dt_log)
            raw_s += dt_raw
            sum_s += dt_sum
            log_s += dt_log
            done += k
        os.close(raw_fd)
        os.close(sum_fd)
        os.unlink(base / "sum.bin")
        results["raw os.write"] = {"seconds": raw_s}
        results["raw os.write + checksum"] = {"seconds": sum_s}
        results["log append"] = {"seconds": log_s}
        # Reads alternate too (raw, log, raw, log); each figure is the mean of its runs.
        # They cover the warm-up batch as well: both files hold n + 1 batches.
        stored = {"bytes": nbytes + bsize, "records": records + PER_BATCH}
        raw_s = log_s = 0.0
        for _ in range(READ_RUNS):
            dt, got = raw_read(base / "raw.bin")
            assert got == stored["bytes"]
            raw_s += dt / READ_RUNS
            dt, got = log_read(plog, copy=True)
            assert got == stored["bytes"], (got, stored)
            log_s += dt / READ_RUNS
        results["raw os.read"] = {"seconds": raw_s, **stored}
        results["log read (slice.read)"] = {"seconds": log_s, **stored}
        read_ratios = read_rounds(base / "raw.bin", plog)
        dt, got = log_read(plog, copy=False)
        results["log read (FileSlice only)"] = {"seconds": dt, **stored}
        t = time.perf_counter()
        plog.close()
        results["close (fsync)"] = {"seconds": time.perf_counter() - t, "skip_rate": True}

        t = time.perf_counter()
        reopened = PartitionLog(base / "bench-0", cfg)
        reopen_s = time.perf_counter() - t
        assert reopened.log_end_offset == stored["records"]
        dt, got = log_read(reopened, copy=True)
        results["first read after reopen (checksums)"] = {"seconds": dt, **stored}
        reopened.close()

        for r in results.values():
            if not r.get("skip_rate"):
                r["records_per_s"] = r.get("records", records) / r["seconds"]
                r["mb_per_s"] = r.get("bytes", nbytes) / r["seconds"] / 1e6
        summary = {
            "bytes": nbytes,
            "records": records,
            "batch_bytes": bsize,
            "append_vs_raw": results["raw os.write"]["seconds"] / results["log append"]["seconds"],
            "append_vs_raw_median_round": statistics.median(round_ratios),
            "append_vs_raw_checksum": results["raw os.write + checksum"]["seconds"]
            / results["log append"]["seconds"],
            "append_us_per_batch": results["log append"]["seconds"] / n * 1e6,
            "raw_write_us_per_batch": results["raw os.write"]["seconds"] / n * 1e6,
            "checksum_us_per_batch": (
                results["raw os.write + checksum"]["seconds"] - results["raw os.write"]["seconds"]
            )
            / n
            * 1e6,
            "read_vs_raw_median_round": statistics.median(read_ratios),
            "read_vs_raw": results["raw os.read"]["seconds"]
            / results["log read (slice.read)"]["seconds"],
            "reopen_ms": reopen_s * 1000,
        }
        if not args.no_group_commit:
            summary["group_commit"] = asyncio.run(group_commit(base / "gc", 64, 20))

        print(f"{nbytes / 1e6:.0f} MB, {records:,} records of {RECORD} B, {bsize} B batches")
        print(f"{'path':<38}{'records/s':>14}{'MB/s':>10}{'seconds':>10}")
        for name, r in results.items():
            rate = (
                f"{r['records_per_s']:>14,.0f}{r['mb_per_s']:>10,.0f}"
                if "mb_per_s" in r
                else " " * 24
            )
            print(f"{name:<38}{rate}{r['seconds']:>10.3f}")
        print(
            f"append / raw write: {summary['append_vs_raw']:.0%} "
            f"(median of {len(round_ratios)} rounds: {summary['append_vs_raw_median_round']:.0%})"
        )
        print(f"append / (raw write + checksum): {summary['append_vs_raw_checksum']:.0%}")
        print(
            f"per batch: raw write {summary['raw_write_us_per_batch']:.1f} us, "
            f"checksum {summary['checksum_us_per_batch']:.1f} us, "
            f"append {summary['append_us_per_batch']:.1f} us"
        )
        print(
            f"read / raw read:    {summary['read_vs_raw']:.0%} "
            f"(median of {len(read_ratios)} rounds: {summary['read_vs_raw_median_round']:.0%})"
        )
        print(
            f"reopen of the cleanly closed {nbytes / 1e9:.2f} GB log: {summary['reopen_ms']:.1f} ms"
        )
        if "group_commit" in summary:
            g = summary["group_commit"]
            print(
                f"group commit, {g['producers']} concurrent producers: "
                f"{g['appends_per_s']:,.0f} durable appends/s"
            )
        if args.json:
            Path(args.json).write_text(json.dumps({"results": results, **summary}, indent=2))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
