"""``logmq bench produce|consume|latency``: perf tools in the spirit of Kafka's.

Each run prints a live progress line to stderr and, with ``--json``, one JSON object on
stdout: records, seconds, records_per_sec, mb_per_sec (MB = 10**6 bytes of record
values), plus latency percentiles for ``latency``. The clients run on uvloop in this
process; the rate limiter, statistics and progress text live in ``logmq_cli.perf``.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import operator
import os
import struct
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import click
import uvloop

from logmq.client import AsyncAdmin, AsyncConsumer, AsyncProducer, BufferFullError
from logmq.client.security import ClientSecurity
from logmq.errors import ErrorCode, LogMQError
from logmq_cli.common import CliContext, client_errors
from logmq_cli.perf import Progress, TokenBucket, summarize_latencies, throughput
from logmq_cli.produce import ACKS_CHOICES, acks_value

F = TypeVar("F", bound=Callable[..., Any])
STAMP = struct.Struct("<q")  # latency records start with the send time in ns
_VALUE = operator.attrgetter("value")
MIN_SLEEP = 0.001  # the event loop's timer resolution


@dataclass(slots=True)
class BenchConfig:
    bootstrap: str
    request_timeout_ms: int
    topic: str
    records: int
    record_size: int
    batch_size: int | None
    acks: str
    rate: float | None
    seconds: float | None
    partitions: int
    partition: int | None
    linger_ms: float | None
    progress: bool
    security: ClientSecurity | None = None  # -X, --command-config, LOGMQ_*


class ProgressLine:
    """The shell around perf.Progress: rewrites one stderr line on a terminal."""

    def __init__(self, label: str, total: int | None, enabled: bool) -> None:
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.progress = Progress(label, total, time.perf_counter(), 0.5 if self.tty else 2.0)
        self.shown = False

    def update(self, records: int, nbytes: int, force: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or not (self.progress.due(now) or force):
            return
        text = self.progress.line(records, nbytes, now)
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + text)
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()
        self.shown = True

    def finish(self, records: int, nbytes: int) -> None:
        self.update(records, nbytes, force=True)
        if self.enabled and self.tty and self.shown:
            sys.stderr.write("\n")


# -- shared helpers ------------------------------------------------------------------
async def ensure_topic(cfg: BenchConfig) -> dict[int, tuple[int, int]]:
    """Create the topic if missing; returns ``{partition: (log start, log end)}``."""
    async with AsyncAdmin(
        cfg.bootstrap, request_timeout_ms=cfg.request_timeout_ms, security=cfg.security
    ) as admin:
        if cfg.topic not in await admin.list_topics():
            try:
                await admin.create_topic(cfg.topic, cfg.partitions)
            except LogMQError as e:
                if e.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                    raise
        return await log_offsets(admin, cfg.topic)


async def log_offsets(admin: AsyncAdmin, topic: str) -> dict[int, tuple[int, int]]:
    desc = (await admin.describe_topics([topic]))[topic]
    return {p.partition: (p.log_start_offset, p.log_end_offset) for p in desc.partitions}


def make_payload(size: int) -> bytes:
    """Incompressible bytes, so compression (if enabled) cannot flatter the numbers."""
    return os.urandom(size)


def _time_up(cfg: BenchConfig, start: float, now: float) -> bool:
    return cfg.seconds is not None and now - start >= cfg.seconds


# -- produce -------------------------------------------------------------------------
async def run_produce(cfg: BenchConfig, per_record: bool, show: bool = True) -> dict[str, Any]:
    before = await ensure_topic(cfg)
    payload = make_payload(cfg.record_size)
    settings: dict[str, Any] = {
        "acks": acks_value(cfg.acks),
        "linger_ms": 5 if cfg.linger_ms is None else cfg.linger_ms,
        "request_timeout_ms": cfg.request_timeout_ms,
        "security": cfg.security,
    }
    if cfg.batch_size is not None:
        settings["batch_size" if per_record else "bulk_batch_bytes"] = cfg.batch_size
    progress = ProgressLine("produce", cfg.records, cfg.progress and show)
    async with AsyncProducer(cfg.bootstrap, **settings) as producer:
        bulk_bytes = cfg.batch_size or producer.bulk_batch_bytes
        chunk = max(1, bulk_bytes // (cfg.record_size + 8)) if not per_record else 1000
        bucket = None
        if cfg.rate is not None:
            chunk = max(1, min(chunk, int(cfg.rate / 100)))
            bucket = TokenBucket(cfg.rate, burst=chunk, now=time.perf_counter())
        values = [payload] * chunk
        pending: collections.deque[tuple[Any, int]] = collections.deque()
        sent = acked = 0
        start = time.perf_counter()
        while sent < cfg.records:
            now = time.perf_counter()
            if _time_up(cfg, start, now):
                break
            n = min(chunk, cfg.records - sent)
            if bucket is not None:
                wait = bucket.reserve(n, now)
                if wait > 0:
                    await asyncio.sleep(wait)
            if per_record:
                last = await _send_records(producer, cfg, payload, n)
            else:
                last = await _send_bulk(producer, cfg, values if n == chunk else values[:n])
            pending.append((last, n))
            sent += n
            while pending and pending[0][0].done():
                handle, count = pending.popleft()
                handle.result()  # raises the batch's error
                acked += count
            progress.update(acked, acked * cfg.record_size)
            await asyncio.sleep(0)  # let the sender task run
        await producer.flush()
        for handle, count in pending:
            await handle
            acked += count
        seconds = time.perf_counter() - start
    progress.finish(acked, acked * cfg.record_size)
    result = throughput(acked, acked * cfg.record_size, seconds)
    if cfg.acks != "0":
        await _verify_landed(cfg, before, acked)
    return result


async def _send_bulk(producer: AsyncProducer, cfg: BenchConfig, values: list[bytes]) -> Any:
    while True:
        try:
            return producer.send_batch(cfg.topic, values, partition=cfg.partition)
        except BufferFullError:
            await producer.wait_for_space()


async def _send_records(producer: AsyncProducer, cfg: BenchConfig, value: bytes, n: int) -> Any:
    send, topic, partition = producer.send, cfg.topic, cfg.partition
    last = None
    i = 0
    while i < n:
        try:
            while i < n:
                last = send(topic, value, None, partition)
                i += 1
        except BufferFullError:
            await producer.wait_for_space()
    return last


async def _verify_landed(cfg: BenchConfig, before: dict[int, tuple[int, int]], n: int) -> None:
    """Acknowledged records must show up as log end offset growth; say so if not."""
    async with AsyncAdmin(
        cfg.bootstrap, request_timeout_ms=cfg.request_timeout_ms, security=cfg.security
    ) as admin:
        after = await log_offsets(admin, cfg.topic)
    grown = sum(after[p][1] - before.get(p, (0, 0))[1] for p in after)
    if grown < n:
        raise LogMQError(f"{n} records acknowledged but the log grew by only {grown}")


# -- consume -------------------------------------------------------------------------
async def run_consume(cfg: BenchConfig, batches: bool, fetch_bytes: int) -> dict[str, Any]:
    offsets = await ensure_topic(cfg)
    available = sum(end - start for start, end in offsets.values())
    if available < cfg.records:
        click.echo(
            f"topic has {available} records; producing {cfg.records - available} first", err=True
        )
        fill = BenchConfig(
            **{**_fields(cfg), "records": cfg.records - available, "rate": None, "seconds": None}
        )
        await run_produce(fill, per_record=False, show=cfg.progress)
        offsets = await ensure_topic(cfg)
    parts = sorted(offsets) if cfg.partition is None else [cfg.partition]
    progress = ProgressLine("consume", cfg.records, cfg.progress)
    count = nbytes = 0
    async with AsyncConsumer(
        cfg.bootstrap,
        request_timeout_ms=cfg.request_timeout_ms,
        security=cfg.security,
        max_partition_fetch_bytes=fetch_bytes,
        fetch_max_bytes=max(fetch_bytes * len(parts), 50 << 20),
        max_poll_records=cfg.records,
    ) as consumer:
        consumer.assign([(cfg.topic, p) for p in parts])
        for p in parts:
            consumer.seek(cfg.topic, p, offsets[p][0])
        start = last_data = time.perf_counter()
        while count < cfg.records:
            now = time.perf_counter()
            if _time_up(cfg, start, now):
                break
            if now - last_data > cfg.request_timeout_ms / 1000:
                raise LogMQError(f"no records for {now - last_data:.0f}s after {count} records")
            want = cfg.records - count
            if batches:
                got = await consumer.poll_batches(timeout=1.0, max_records=want)
                for b in got:
                    count += len(b.rows)
                    nbytes += sum(map(len, filter(None, b.values())))
            else:
                recs = await consumer.poll(timeout=1.0, max_records=want)
                count += len(recs)
                nbytes += sum(map(len, filter(None, map(_VALUE, recs))))
                got = recs
            if got:
                last_data = time.perf_counter()
            progress.update(count, nbytes)
        seconds = time.perf_counter() - start
    progress.finish(count, nbytes)
    return throughput(count, nbytes, seconds)


def _fields(cfg: BenchConfig) -> dict[str, Any]:
    return {name: getattr(cfg, name) for name in cfg.__dataclass_fields__}


# -- latency -------------------------------------------------------------------------
async def run_latency(cfg: BenchConfig, warmup: int) -> dict[str, Any]:
    """End-to-end: each value starts with its send time; a consumer in this process
    measures arrival (both use one monotonic clock, so no clock skew)."""
    if cfg.record_size < STAMP.size:
        raise ValueError(f"--record-size must be at least {STAMP.size} for latency")
    rate = cfg.rate or 10_000.0
    offsets = await ensure_topic(cfg)
    parts = sorted(offsets) if cfg.partition is None else [cfg.partition]
    pad = make_payload(cfg.record_size - STAMP.size)
    total = cfg.records + warmup
    latencies: list[int] = []
    progress = ProgressLine("latency", total, cfg.progress)
    async with (
        AsyncProducer(
            cfg.bootstrap,
            acks=acks_value(cfg.acks),
            linger_ms=0 if cfg.linger_ms is None else cfg.linger_ms,
            request_timeout_ms=cfg.request_timeout_ms,
            security=cfg.security,
        ) as producer,
        AsyncConsumer(
            cfg.bootstrap,
            request_timeout_ms=cfg.request_timeout_ms,
            security=cfg.security,
            fetch_max_wait_ms=100,
            max_poll_records=10_000,
        ) as consumer,
    ):
        consumer.assign([(cfg.topic, p) for p in parts])
        for p in parts:
            consumer.seek(cfg.topic, p, offsets[p][1])
        # What a latency-sensitive service does after start-up: the objects made so far
        # live for the whole run, so frozen they are not rescanned by full collections.
        gc.collect()
        gc.freeze()
        sent = [0]
        start = time.perf_counter()

        async def produce() -> None:
            # 20 ms of burst: a late wake-up (timer resolution, a busy loop) loses no tokens.
            bucket = TokenBucket(rate, burst=max(1.0, rate / 50), now=time.perf_counter())
            clock, pack, send = time.perf_counter_ns, STAMP.pack, producer.send
            while sent[0] < total and not _time_up(cfg, start, time.perf_counter()):
                n = min(bucket.available(time.perf_counter()), total - sent[0])
                if n == 0:
                    # uvloop rounds timers to whole milliseconds: a shorter sleep returns
                    # at once and the loop would spin, starving the broker of a core.
                    wait = bucket.reserve(1, time.perf_counter())
                    await asyncio.sleep(max(wait, MIN_SLEEP))
                    n = 1 + min(bucket.available(time.perf_counter()), total - sent[0] - 1)
                    bucket.reserve(n - 1, time.perf_counter())
                else:
                    bucket.reserve(n, time.perf_counter())
                for _ in range(n):
                    send(cfg.topic, pack(clock()) + pad, None, cfg.partition)
                sent[0] += n
            await producer.flush()

        received = 0
        measured_from = start  # when the last warm-up record arrived
        async with asyncio.TaskGroup() as tg:
            producing = tg.create_task(produce())
            idle_since = time.perf_counter()
            while received < sent[0] or not producing.done():
                recs = await consumer.poll(timeout=0.2)
                now_ns = time.perf_counter_ns()
                if recs:
                    idle_since = time.perf_counter()
                elif time.perf_counter() - idle_since > cfg.request_timeout_ms / 1000:
                    raise LogMQError(f"{sent[0] - received} records never arrived")
                for r in recs:
                    if received >= warmup:
                        latencies.append(now_ns - STAMP.unpack_from(r.value)[0])
                    received += 1
                if warmup > 0 and received - len(recs) < warmup <= received:
                    measured_from = now_ns / 1e9
                progress.update(received, received * cfg.record_size)
        seconds = time.perf_counter() - measured_from
    progress.finish(received, received * cfg.record_size)
    # Warm-up records count nowhere: not in the latencies, the records or the rates.
    measured = len(latencies)
    result = throughput(measured, measured * cfg.record_size, seconds)
    result["warmup_records"] = min(warmup, received)
    stats = summarize_latencies(latencies)
    result.update(
        p50_ms=round(stats.p50_ms, 3),
        p99_ms=round(stats.p99_ms, 3),
        p999_ms=round(stats.p999_ms, 3),
        max_ms=round(stats.max_ms, 3),
        mean_ms=round(stats.mean_ms, 3),
        target_rate=rate,
    )
    return result


# -- click commands ------------------------------------------------------------------
def bench_options(default_records: int) -> Callable[[F], F]:
    def decorate(fn: F) -> F:
        options = [
            click.option("--topic", "-t", default="logmq-bench", show_default=True),
            click.option(
                "--records",
                "-n",
                type=click.IntRange(min=1),
                default=default_records,
                show_default=True,
            ),
            click.option(
                "--record-size",
                "-s",
                type=click.IntRange(min=0),
                default=100,
                show_default=True,
                help="Value size in bytes.",
            ),
            click.option(
                "--batch-size",
                type=click.IntRange(min=1),
                default=None,
                help="Producer batch size in bytes (send_batch: bytes per batch).",
            ),
            click.option("--acks", type=click.Choice(ACKS_CHOICES), default="1", show_default=True),
            click.option(
                "--rate",
                type=click.FloatRange(min=0, min_open=True),
                default=None,
                help="Cap in records/s (token bucket).",
            ),
            click.option(
                "--seconds",
                type=click.FloatRange(min=0, min_open=True),
                default=None,
                help="Stop after this many seconds.",
            ),
            click.option(
                "--partitions",
                type=click.IntRange(min=1),
                default=1,
                show_default=True,
                help="Partitions when creating the topic.",
            ),
            click.option(
                "--partition",
                type=click.IntRange(min=0),
                default=None,
                help="Use only this partition.",
            ),
            click.option("--linger-ms", type=click.FloatRange(min=0), default=None),
            click.option("--json", "as_json", is_flag=True, help="Print one JSON object."),
            click.option("--no-progress", is_flag=True, help="No progress line on stderr."),
        ]
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


def _config(ctx: CliContext, kw: dict[str, Any]) -> tuple[BenchConfig, bool]:
    as_json = kw.pop("as_json")
    progress = not kw.pop("no_progress")
    config = BenchConfig(
        ctx.bootstrap, ctx.request_timeout_ms, progress=progress, security=ctx.security(), **kw
    )
    return config, as_json


def _run(coro: Coroutine[Any, Any, dict[str, Any]], as_json: bool, label: str) -> None:
    try:
        result = uvloop.run(coro)
    except BaseExceptionGroup as group:  # from the latency run's TaskGroup
        raise group.exceptions[0] from None
    if as_json:
        click.echo(json.dumps(result))
        return
    line = (
        f"{label}: {result['records']:,} records in {result['seconds']:.2f} s = "
        f"{result['records_per_sec']:,.0f} records/s, {result['mb_per_sec']:,.1f} MB/s"
    )
    if result.get("warmup_records"):
        line += f" (after {result['warmup_records']:,} warm-up records, not counted)"
    if "p50_ms" in result:
        line += (
            f"; latency p50 {result['p50_ms']:.3f} ms, p99 {result['p99_ms']:.3f} ms, "
            f"p99.9 {result['p999_ms']:.3f} ms, max {result['max_ms']:.3f} ms"
        )
    click.echo(line)


@click.group()
def bench() -> None:
    """Measure produce throughput, consume throughput and end-to-end latency."""


@bench.command("produce")
@bench_options(1_000_000)
@click.option("--per-record", is_flag=True, help="Use send() per record instead of send_batch.")
@click.pass_obj
@client_errors
def bench_produce(ctx: CliContext, per_record: bool, **kw: Any) -> None:
    """Produce --records values of --record-size bytes as fast as allowed."""
    cfg, as_json = _config(ctx, kw)
    _run(run_produce(cfg, per_record), as_json, "produce")


@bench.command("consume")
@bench_options(1_000_000)
@click.option("--batches", is_flag=True, help="Use poll_batches() instead of poll().")
@click.option(
    "--fetch-bytes",
    type=click.IntRange(min=1024),
    default=4 << 20,
    show_default=True,
    help="Max bytes per partition per fetch.",
)
@click.pass_obj
@client_errors
def bench_consume(ctx: CliContext, batches: bool, fetch_bytes: int, **kw: Any) -> None:
    """Read --records records from the start of the topic (producing them first if missing)."""
    cfg, as_json = _config(ctx, kw)
    _run(run_consume(cfg, batches, fetch_bytes), as_json, "consume")


@bench.command("latency")
@bench_options(50_000)
@click.option(
    "--warmup",
    type=click.IntRange(min=0),
    default=1000,
    show_default=True,
    help="Records sent first and left out of every figure (latencies, records, rates).",
)
@click.pass_obj
@client_errors
def bench_latency(ctx: CliContext, warmup: int, **kw: Any) -> None:
    """End-to-end latency at --rate records/s (default 10,000): send time to poll arrival."""
    cfg, as_json = _config(ctx, kw)
    _run(run_latency(cfg, warmup), as_json, "latency")
