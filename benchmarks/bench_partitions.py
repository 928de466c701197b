"""Partition count against throughput, memory, idle CPU and recovery (issue 16).

For each partition count (``--partitions``, default 1,100,1000,10000) a fresh
``logmq-server`` (its own temp data dir, 127.0.0.1 only, ``--log-level warning``) gets
one topic with that many partitions, and this measures:

* **create**: ``Admin.create_topic`` until every partition has a leader and answers
  (``describe_topics``: Metadata plus ListOffsets for every partition);
* **produce, spread**: ``--records`` records of 100 bytes with the native
  ``AsyncProducer.send()`` per record, ``partition = i % partitions`` (even spread, one
  batch per partition per request: the worst case the issue names), acks=1, linger 5 ms;
* **consume**: one native ``AsyncConsumer`` assigned to every partition (seeked to 0)
  reads those records back with ``poll()``; its own CPU seconds and number of polls;
* **the compiled decode alone**: the same records decoded in this process straight from
  the segment files (``decode_floor``): no broker, socket or per-partition Python, the
  lower bound of any consume of that data;
* **broker RSS** (VmRSS) after produce and consume, and the broker's CPU seconds (from
  /proc/PID/stat) during produce and during consume;
* **produce, keyless (sticky)**: the same count again with ``send()`` and no key and no
  partition (the client's sticky partitioner), after the consume, into the same topic;
* **idle CPU**: the broker's CPU over ``--idle-seconds`` with the topic present and no
  client connected, in per cent of one core;
* **3-broker idle** (``--cluster 10000``): three brokers, one topic at replication
  factor 3; the time until every partition's ISR is full, then each broker's CPU over
  ``--idle-seconds`` (no client connected) and its RSS;
* **restart after kill -9**: SIGKILL, start on the same data dir, time to the ready
  line and until Metadata plus ListOffsets for every partition answer with the same
  log end offsets as before the kill; ``--restarts`` times (default 3), each from a copy
  of the same crashed data dir, reported as the median with the range;
* **clean stop and start**: SIGTERM until the process exits (it writes every log's
  producer snapshot after that recovery), a start until every partition answers, and
  a second stop (a broker that only started: every partition has a new leader epoch).

Producer and consumer run in their own processes (``--worker``), so they compete with
the broker for the cores as real clients would and their CPU is their own. Every wait
has a deadline. Usage::

    python benchmarks/bench_partitions.py [--partitions 1,100,1000,10000]
        [--records 200000] [--large-records N] [--idle-seconds 10] [--restarts 3] [--json]
        [--profile-consume /tmp/consume.prof] [--cluster 10000]

``--large-records`` (default: ``--records``) is used for counts of 5,000 partitions or
more. ``--profile-consume PATH`` re-reads the data at the largest partition count, after
the measured consume, with cProfile on around the polls (for at most 60 s; the assign and
seeks before them are not profiled). The row's figures exclude that run.
Speed goals are reported here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RECORD_SIZE = 100
TOPIC = "parts"
LARGE = 5000  # partition counts from here on use --large-records
PROFILE_SECONDS = 60.0  # how long a --profile-consume run reads for


# -- /proc --------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def own_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# -- workers (run in their own process) ---------------------------------------------
async def produce(bootstrap: str, topic: str, parts: int, n: int, mode: str) -> dict[str, Any]:
    from logmq.client import AsyncProducer, BufferFullError

    value = os.urandom(RECORD_SIZE)
    async with AsyncProducer(bootstrap, acks=1, linger_ms=5) as producer:
        await producer.partitions_for(topic)  # metadata first: not part of the timing
        send = producer.send
        cpu0, start = own_cpu(), time.perf_counter()
        i = 0
        while i < n:
            try:
                stop = min(n, i + 1000)
                if mode == "spread":
                    while i < stop:
                        send(topic, value, None, i % parts)
                        i += 1
                else:
                    while i < stop:
                        send(topic, value)
                        i += 1
            except BufferFullError:
                await producer.wait_for_space()
            await asyncio.sleep(0)  # let the sender task run
        await producer.flush()
        secs = time.perf_counter() - start
        cpu = own_cpu() - cpu0
    return {"records": n, "seconds": secs, "records_per_sec": n / secs, "client_cpu_s": cpu}


async def consume(
    bootstrap: str,
    topic: str,
    parts: int,
    n: int,
    timeout: float,
    stop_after: float | None,
    profile: str | None = None,
) -> dict[str, Any]:
    from logmq.client import AsyncConsumer

    async with AsyncConsumer(bootstrap, max_poll_records=n) as consumer:
        cpu0, start = own_cpu(), time.perf_counter()
        consumer.assign([(topic, p) for p in range(parts)])
        for p in range(parts):
            consumer.seek(topic, p, 0)
        assigned = time.perf_counter()
        prof = None
        if profile:  # the polls only: assign and seek show up in the row's assign_seek_s
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        count = polls = empty = 0
        deadline = start + timeout
        while count < n:
            if stop_after is not None and time.perf_counter() - assigned > stop_after:
                break  # a profiling run: a sample of the consume is enough
            if time.perf_counter() > deadline:
                raise TimeoutError(f"consumed {count} of {n} records in {timeout}s")
            got = await consumer.poll(timeout=1.0, max_records=n - count)
            polls += 1
            empty += not got
            count += len(got)
        secs = time.perf_counter() - start
        cpu = own_cpu() - cpu0
        if prof is not None:
            prof.disable()
            prof.dump_stats(profile)
    return {
        "assign_seek_s": assigned - start,
        "records": count,
        "seconds": secs,
        "records_per_sec": count / secs,
        "client_cpu_s": cpu,
        "polls": polls,
        "empty_polls": empty,
    }


def worker_main(opts: argparse.Namespace) -> None:
    import uvloop

    if opts.worker == "consume":
        coro = consume(
            opts.bootstrap,
            opts.topic,
            opts.count,
            opts.records,
            opts.timeout,
            opts.stop_after,
            opts.profile_consume,
        )
    else:
        coro = produce(opts.bootstrap, opts.topic, opts.count, opts.records, opts.worker)
    print(json.dumps(uvloop.run(coro)))


# -- orchestration ------------------------------------------------------------------
def run_worker(
    broker: Any, role: str, parts: int, n: int, timeout: float, profile: str | None = None
) -> dict[str, Any]:
    post = ["--stop-after", str(PROFILE_SECONDS), "--profile-consume", profile] if profile else []
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", role, "--bootstrap",
           broker.bootstrap, "--topic", TOPIC, "--count", str(parts),
           "--records", str(n), "--timeout", str(timeout), *post]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 60)
    if proc.returncode != 0:
        raise RuntimeError(f"{role} worker failed: {proc.stderr.strip()[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def timed_stop(broker: Any, timeout: float) -> float:
    """SIGTERM until the process has exited cleanly (exit code 0), in seconds."""
    start = time.perf_counter()
    code = broker.stop(timeout)
    if code != 0:
        raise RuntimeError(f"broker stop exited with {code}")
    return time.perf_counter() - start


def decode_floor(data_dir: Path, n: int) -> float:
    """Seconds the compiled decoder alone takes for the records just consumed.

    The consumer's own decode, without a broker, a socket or any per-partition Python:
    every partition's segment files read into memory first, then one ``take_records``
    call per partition (the consumer's call), all Records kept as a poll keeps them,
    with the cyclic GC paused. The lower bound of any consume of the same data; the
    best of three.
    """
    from logmq.gcpause import gc_paused
    from logmq.records import Record
    from logmq.storage.batch_scan import take_records

    files = sorted(data_dir.glob(f"{TOPIC}-*/*.log"))
    buffers = [(int(f.parent.name.rsplit("-", 1)[1]), f.read_bytes()) for f in files]
    best = float("inf")
    for _ in range(3):
        kept: list[list[Any]] = []
        count = 0
        with gc_paused():
            start = time.perf_counter()
            for partition, data in buffers:
                records, _, _, _ = take_records(data, 0, 0, n, TOPIC, partition, Record)
                kept.append(records)
                count += len(records)
            took = time.perf_counter() - start
        del kept
        if count != n:
            raise RuntimeError(f"decoded {count} records from the segments, not {n}")
        best = min(best, took)
    return best


def describe_until_ready(bootstrap: str, parts: int, timeout: float) -> dict[int, int]:
    """Metadata + ListOffsets for every partition until all have a leader: {p: end}."""
    from logmq.client import Admin
    from logmq.errors import LogMQError

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with Admin(bootstrap, request_timeout_ms=int(timeout * 1000)) as admin:
                while time.monotonic() < deadline:
                    desc = admin.describe_topics([TOPIC])[TOPIC]
                    ps = desc.partitions
                    if len(ps) == parts and all(p.leader >= 0 for p in ps):
                        return {p.partition: p.log_end_offset for p in ps}
                    last = RuntimeError(f"{sum(p.leader >= 0 for p in ps)} of {parts} led")
        except (LogMQError, OSError, TimeoutError) as e:  # not serving yet: ask again
            last = e
    raise TimeoutError(f"partitions not all answering after {timeout}s: {last}")


def measure(parts: int, n: int, opts: argparse.Namespace, profile: str | None) -> dict[str, Any]:
    from logmq.client import Admin
    from tests.harness import BrokerProcess

    row: dict[str, Any] = {"partitions": parts, "records": n}
    t = opts.timeout
    with tempfile.TemporaryDirectory(prefix="logmq-bench-parts-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", log_level="warning")
        broker.start(timeout=t)
        try:
            pid = broker.pid
            assert pid is not None
            row["rss_start_mb"] = rss_mb(pid)

            c0, start = cpu_seconds(pid), time.perf_counter()
            with Admin(broker.bootstrap, request_timeout_ms=int(t * 1000)) as admin:
                admin.create_topic(TOPIC, parts)
            row["create_call_s"] = time.perf_counter() - start
            describe_until_ready(broker.bootstrap, parts, t)
            row["create_s"] = time.perf_counter() - start
            row["create_broker_cpu_s"] = cpu_seconds(pid) - c0
            print(f"  [{parts}] topic ready in {row['create_s']:.2f} s", file=sys.stderr)

            def timed(role: str) -> dict[str, Any]:
                """A worker's figures plus the broker CPU spent while it ran."""
                c0 = cpu_seconds(pid)
                got = run_worker(broker, role, parts, n, t)
                got["broker_cpu_s"] = cpu_seconds(pid) - c0
                return got

            row["produce_spread"] = timed("spread")
            print(f"  [{parts}] produced {row['produce_spread']}", file=sys.stderr)

            row["consume"] = timed("consume")
            row["rss_after_produce_consume_mb"] = rss_mb(pid)
            print(f"  [{parts}] consumed {row['consume']}", file=sys.stderr)
            row["decode_floor_s"] = decode_floor(broker.data_dir, n)
            if profile:
                try:
                    got = run_worker(broker, "consume", parts, n, t, profile=profile)
                    row["profiled_consume"] = got
                    print(f"  [{parts}] consume profile in {profile}: {got}", file=sys.stderr)
                except (RuntimeError, subprocess.TimeoutExpired) as e:  # the row still counts
                    print(f"  [{parts}] consume profile failed: {e}", file=sys.stderr)

            row["produce_sticky"] = timed("sticky")
            row["rss_after_sticky_mb"] = rss_mb(pid)
            print(f"  [{parts}] sticky {row['produce_sticky']}", file=sys.stderr)

            ends = describe_until_ready(broker.bootstrap, parts, t)
            if sum(ends.values()) != 2 * n:
                raise RuntimeError(f"log end offsets add up to {sum(ends.values())}, not {2 * n}")

            # Idle: no client connected (the Admin above is closed). The sleep is the
            # measurement window, not synchronisation.
            c0, w0 = cpu_seconds(pid), time.perf_counter()
            time.sleep(opts.idle_seconds)
            row["idle_cpu_pct"] = 100 * (cpu_seconds(pid) - c0) / (time.perf_counter() - w0)
            row["rss_idle_mb"] = rss_mb(pid)

            broker.kill()
            # Each restart starts from the same crashed data directory (a copy taken
            # before the first), so the samples repeat one measurement on a machine
            # whose speed drifts by tens of per cent within minutes.
            crashed = Path(tmp) / "crashed"
            shutil.copytree(broker.data_dir, crashed, symlinks=True)
            samples = []
            for i in range(opts.restarts):
                if i:
                    broker.kill()
                    shutil.rmtree(broker.data_dir)
                    shutil.copytree(crashed, broker.data_dir, symlinks=True)
                start = time.perf_counter()
                broker.restart(timeout=t)  # same port and data dir; waits for the ready line
                ready = time.perf_counter() - start
                after = describe_until_ready(broker.bootstrap, parts, t)
                samples.append((ready, time.perf_counter() - start))
                if after != ends:
                    lost = sum(ends.values()) - sum(after.values())
                    raise RuntimeError(f"log end offsets differ after kill -9 ({lost} records)")
            shutil.rmtree(crashed)
            row["restart_samples"] = samples
            row["restart_ready_s"] = statistics.median(r for r, _ in samples)
            row["restart_serving_s"] = statistics.median(s for _, s in samples)
            assert broker.pid is not None
            row["rss_after_restart_mb"] = rss_mb(broker.pid)
            print(f"  [{parts}] restart {[round(s, 2) for _, s in samples]} s", file=sys.stderr)

            # Clean stop (after that recovery: producer snapshots for every log), clean
            # start, and a stop of a broker that only started (every partition has a
            # new leader epoch and nothing else).
            row["clean_stop_s"] = timed_stop(broker, t)
            start = time.perf_counter()
            broker.restart(timeout=t)
            row["clean_start_ready_s"] = time.perf_counter() - start
            if describe_until_ready(broker.bootstrap, parts, t) != ends:
                raise RuntimeError("log end offsets differ after a clean restart")
            row["clean_start_serving_s"] = time.perf_counter() - start
            row["restarted_stop_s"] = timed_stop(broker, t)
            print(
                f"  [{parts}] clean stop {row['clean_stop_s']:.2f} s, start "
                f"{row['clean_start_serving_s']:.2f} s, stop {row['restarted_stop_s']:.2f} s",
                file=sys.stderr,
            )
        finally:
            broker.close()
    return row


def measure_cluster(parts: int, opts: argparse.Namespace) -> dict[str, Any]:
    """Three brokers, one topic of ``parts`` partitions at replication factor 3: time
    until every ISR is full, then each broker's idle CPU and RSS."""
    from logmq.client import Admin
    from tests.harness import BrokerCluster

    t = opts.timeout
    row: dict[str, Any] = {"partitions": parts, "replicas": 3 * parts}
    with BrokerCluster(3, log_level="warning") as cluster:
        pids = {i: b.pid for i, b in cluster.nodes.items()}
        start = time.perf_counter()
        with Admin(cluster.bootstrap, request_timeout_ms=int(t * 1000)) as admin:
            admin.create_topic(TOPIC, parts, replication_factor=3)
            deadline = time.monotonic() + t
            while True:
                ps = admin.describe_topics([TOPIC])[TOPIC].partitions
                if len(ps) == parts and all(p.leader >= 0 and len(p.isr) == 3 for p in ps):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("ISRs not full")
        row["create_full_isr_s"] = time.perf_counter() - start
        print(f"  [cluster {parts}] every ISR full in {row['create_full_isr_s']:.2f} s",
              file=sys.stderr)  # fmt: skip
        # Creation leaves work behind (metadata snapshots, followers catching up): idle
        # starts once every broker has spent under 5% of a core for two seconds in a
        # row (at most --timeout).
        settle0 = time.perf_counter()
        quiet = 0
        while quiet < 2 and time.perf_counter() - settle0 < t:
            before = {i: cpu_seconds(pid) for i, pid in pids.items()}  # type: ignore[arg-type]
            time.sleep(1.0)  # a measurement window
            busy = max(cpu_seconds(pid) - before[i] for i, pid in pids.items())  # type: ignore[arg-type]
            quiet = quiet + 1 if busy < 0.05 else 0
        row["settle_s"] = time.perf_counter() - settle0
        c0 = {i: cpu_seconds(pid) for i, pid in pids.items()}  # type: ignore[arg-type]
        w0 = time.perf_counter()
        time.sleep(opts.idle_seconds)  # the measurement window, not synchronisation
        wall = time.perf_counter() - w0
        row["idle_cpu_pct"] = {
            i: 100 * (cpu_seconds(pid) - c0[i]) / wall  # type: ignore[arg-type]
            for i, pid in pids.items()
        }
        row["rss_mb"] = {i: rss_mb(pid) for i, pid in pids.items()}  # type: ignore[arg-type]
    return row


def cluster_table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| partitions x RF 3 | create until every ISR is full | then settled after "
        "| idle CPU per broker | RSS per broker |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cpu = " / ".join(f"{v:.1f}%" for v in r["idle_cpu_pct"].values())
        rss = " / ".join(f"{v:.0f}" for v in r["rss_mb"].values())
        out.append(
            f"| {r['partitions']:,} | {r['create_full_isr_s']:.2f} s | {r['settle_s']:.0f} s "
            f"| {cpu} | {rss} MB |"
        )
    return "\n".join(out)


# The "before" curves of the chart: the run of 2026-11-25 01:00 UTC, before issue 16
# (docs/benchmarks-history.md, "Ten thousand partitions (issue 16): before"), records/s.
BEFORE = {
    "consume": {1: 1_556_000, 100: 851_000, 1000: 74_000, 10000: 1_100},
    "produce, spread": {1: 584_000, 100: 394_000, 1000: 70_000, 10000: 7_000},
    "produce, keyless": {1: 576_000, 100: 551_000, 1000: 559_000, 10000: 495_000},
}
COLOURS = {"consume": "#1f77b4", "produce, spread": "#d62728", "produce, keyless": "#2ca02c"}


def chart_svg(rows: list[dict[str, Any]]) -> str:
    """Rates against partition count, log-log, after (solid) and before (dashed): a
    hand-written SVG, so the benchmark needs no plotting library."""
    import math

    after = {
        "consume": {r["partitions"]: r["consume"]["records_per_sec"] for r in rows},
        "produce, spread": {r["partitions"]: r["produce_spread"]["records_per_sec"] for r in rows},
        "produce, keyless": {r["partitions"]: r["produce_sticky"]["records_per_sec"] for r in rows},
    }
    w, h, left, right, top, bottom = 720, 420, 70, 190, 20, 50
    xs = sorted({p for series in (*after.values(), *BEFORE.values()) for p in series})
    x_lo, x_hi = math.log10(max(1, xs[0])), math.log10(max(10, xs[-1]))
    y_lo, y_hi = 2.0, 7.0  # 100 to 10 M records/s

    def px(p: float) -> float:
        return left + (math.log10(max(p, 1)) - x_lo) / (x_hi - x_lo or 1) * (w - left - right)

    def py(v: float) -> float:
        y = min(max(math.log10(max(v, 1)), y_lo), y_hi)
        return top + (y_hi - y) / (y_hi - y_lo) * (h - top - bottom)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
    ]
    for e in range(int(y_lo), int(y_hi) + 1):
        y = py(10**e)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{w - right}" y2="{y:.1f}" stroke="#ddd"/>')
        label = f"{10**e / 1000:,.0f} k" if e < 6 else f"{10**e / 1e6:,.0f} M"
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    for p in xs:
        x = px(p)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{h - bottom}" stroke="#eee"/>')
        out.append(f'<text x="{x:.1f}" y="{h - bottom + 16}" text-anchor="middle">{p:,}</text>')
    out.append(
        f'<text x="{(left + w - right) / 2:.0f}" y="{h - 12}" text-anchor="middle">'
        "partitions (one broker)</text>"
    )
    out.append(
        f'<text x="16" y="{(top + h - bottom) / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 16 {(top + h - bottom) / 2:.0f})">records/s</text>'
    )
    for i, (name, colour) in enumerate(COLOURS.items()):
        for series, dash in ((BEFORE[name], ' stroke-dasharray="5,4"'), (after[name], "")):
            pts = " ".join(f"{px(p):.1f},{py(v):.1f}" for p, v in sorted(series.items()))
            if pts:
                out.append(
                    f'<polyline points="{pts}" fill="none" stroke="{colour}" '
                    f'stroke-width="2"{dash}/>'
                )
        y = top + 20 + 40 * i
        out.append(f'<line x1="{w - right + 12}" y1="{y}" x2="{w - right + 40}" y2="{y}" '
                   f'stroke="{colour}" stroke-width="2"/>')  # fmt: skip
        out.append(f'<text x="{w - right + 46}" y="{y + 4}">{name}</text>')
        dashed = f'stroke="{colour}" stroke-width="2" stroke-dasharray="5,4"'
        out.append(f'<line x1="{w - right + 12}" y1="{y + 16}" x2="{w - right + 40}" '
                   f'y2="{y + 16}" {dashed}/>')  # fmt: skip
        out.append(f'<text x="{w - right + 46}" y="{y + 20}">before</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def k(v: float) -> str:
    return f"{v / 1000:,.0f} k" if v >= 10_000 else f"{v / 1000:,.1f} k"


def spread(values: list[float]) -> str:
    """The range of repeated samples, for a table cell next to their median."""
    if len(values) < 2:
        return "1 run"
    return f"{min(values):.2f} to {max(values):.2f} s over {len(values)}"


def table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| partitions | records | create topic | produce rec/s (spread) | broker CPU, "
        "produce | produce rec/s (keyless, sticky) | consume rec/s | the compiled decode alone "
        "| of which assign + seek "
        "| consumer CPU / polls "
        "| broker CPU, consume | broker RSS | idle CPU | restart after kill -9: ready / "
        "all partitions answer (median; range) "
        "| clean stop / clean start (all answer) / stop again |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ps, pk, c = r["produce_spread"], r["produce_sticky"], r["consume"]
        n = r["records"]
        out.append(
            f"| {r['partitions']:,} | {n:,} | {r['create_s']:.2f} s "
            f"| {k(ps['records_per_sec'])} "
            f"| {ps['broker_cpu_s']:.2f} s ({1e6 * ps['broker_cpu_s'] / n:.1f} µs/rec) "
            f"| {k(pk['records_per_sec'])} | {k(c['records_per_sec'])} "
            f"| {1000 * r['decode_floor_s']:.0f} ms ({k(n / r['decode_floor_s'])}) "
            f"| {c['assign_seek_s']:.2f} s "
            f"| {c['client_cpu_s']:.2f} s / {c['polls']:,} "
            f"| {c['broker_cpu_s']:.2f} s "
            f"| {r['rss_after_produce_consume_mb']:.0f} MB | {r['idle_cpu_pct']:.1f}% "
            f"| {r['restart_ready_s']:.2f} s / {r['restart_serving_s']:.2f} s "
            f"({spread([s for _, s in r['restart_samples']])}) "
            f"| {r['clean_stop_s']:.2f} s / {r['clean_start_serving_s']:.2f} s "
            f"/ {r['restarted_stop_s']:.2f} s |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", default="1,100,1000,10000", help="comma-separated counts")
    ap.add_argument("--records", type=int, default=200_000, help="records per produce")
    ap.add_argument("--large-records", type=int, default=None,
                    help=f"records per produce from {LARGE:,} partitions on")  # fmt: skip
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--restarts", type=int, default=3,
                    help="kill -9 restarts from the same crashed data dir (median)")  # fmt: skip
    ap.add_argument("--timeout", type=float, default=600.0, help="deadline for each phase (s)")
    ap.add_argument("--profile-consume", metavar="PATH", default=None)
    ap.add_argument("--cluster", default="",
                    help="comma-separated counts for the 3-broker RF 3 idle run")  # fmt: skip
    ap.add_argument("--json", action="store_true", help="print the raw results as JSON")
    ap.add_argument("--chart", metavar="SVG", default=None,
                    help="write rates against partition count, before and after")  # fmt: skip
    ap.add_argument("--worker", choices=["spread", "sticky", "consume"], help=argparse.SUPPRESS)
    ap.add_argument("--bootstrap", help=argparse.SUPPRESS)
    ap.add_argument("--topic", default=TOPIC, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--stop-after", type=float, default=None, help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.worker:
        worker_main(opts)
        return
    from tests.harness import compile_sources

    compile_sources()  # brokers start as an installed package does: bytecode written
    counts = [int(x.replace("_", "")) for x in opts.partitions.split(",") if x.strip()]
    large = opts.large_records or opts.records
    rows = []
    began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    t0 = time.perf_counter()
    for parts in counts:
        n = large if parts >= LARGE else opts.records
        n -= n % parts  # an even spread: the same number of records in every partition
        n = max(n, parts)
        profile = opts.profile_consume if parts == max(counts) else None
        rows.append(measure(parts, n, opts, profile))
        print(json.dumps(rows[-1]), file=sys.stderr)  # each row as soon as it is done
    cluster_rows = []
    for parts in (int(x.replace("_", "")) for x in opts.cluster.split(",") if x.strip()):
        cluster_rows.append(measure_cluster(parts, opts))
        print(json.dumps(cluster_rows[-1]), file=sys.stderr)
    took = time.perf_counter() - t0
    args = " ".join(a for a in sys.argv[1:] if a != "--json")
    print(f"Command: `{' '.join(['python benchmarks/bench_partitions.py', args]).strip()}`")
    print(f"Started {began}, took {took:.0f} s ({os.cpu_count()} CPUs, "
          f"Python {sys.version.split()[0]})\n")  # fmt: skip
    if rows:
        print(table(rows))
    if cluster_rows:
        print("\n" + cluster_table(cluster_rows))
    if opts.chart and rows:
        Path(opts.chart).write_text(chart_svg(rows))
    if opts.json:
        print("\n" + json.dumps({"single": rows, "cluster": cluster_rows}, indent=2))


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
