"""Tiered storage (KIP-405) beside the same topic without tiering, in one run.

Starts its own ``logmq-server`` processes (temp data dirs, free ports) and measures:

* **produce with copying on**: a confluent-kafka producer writes ``--mb`` MB of 1 KiB
  records into an untiered topic and into a tiered one (``segment.bytes`` 16 MiB,
  ``local.retention.bytes`` 64 MiB) on one broker whose remote tier is a directory on
  the same disk, ``remote.log.manager.task.interval.ms`` 100 so the copier runs while
  the producer does. Each tiered produce is followed by the wait until every closed
  segment is copied and local retention has deleted the copied ones (the copy time is
  reported; the legs alternate in ``--rounds`` rounds on fresh topics).
* **consume from the remote tier, cold**: the broker restarts (an empty chunk cache; the
  OS page cache is not dropped), then one confluent-kafka consumer reads each topic from
  offset 0, timed from its first record; the untiered topic holds the same bytes
  locally.
* **RSS and restart with 10,000 remote segments**: a broker with no tiering, a tiered
  broker with a tiered topic and no remote segments, and a tiered broker whose topic
  has ``--segments`` remote segments, each restarted ``--restarts`` times (SIGTERM,
  then process start to the ``logmq-server ready`` line), VmRSS from /proc/PID/status
  two seconds after the ready line. The segments are written from this process over
  the native door's AlterRemoteSegments (each segment's COPY_STARTED and COPY_FINISHED
  in one request, 1,000 changes a request): the controller judges and commits them
  through the metadata quorum as it does a copier's, so the broker's image holds what
  10,000 real copies leave there. Their objects are not written (the broker reads
  none of them unless a fetch asks), which makes this take seconds, not hours.
* with ``--s3``, the produce and consume legs again on moto's S3 server.

Usage: ``python benchmarks/bench_tiered.py [--mb 300] [--segments 10000] [--s3]
[--json FILE]``. Speed goals are reported here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness import BrokerProcess, free_port  # noqa: E402

MiB = 1 << 20
RECORD = 1024
SEGMENT_BYTES = 16 * MiB
LOCAL_RETENTION_BYTES = 64 * MiB
FS_RSM = "io.aiven.kafka.tieredstorage.storage.filesystem.FileSystemStorage"
S3_RSM = "io.aiven.kafka.tieredstorage.storage.s3.S3Storage"
TIER_COMMON = (
    "remote.log.storage.system.enable=true",
    "remote.log.manager.task.interval.ms=100",
)
MAX_CHANGES = 1000  # per AlterRemoteSegments request (cluster/remote_segments.py)
SETTLE_S = 2.0  # after the ready line, before RSS is read (the tier's first passes run)

PRODUCER = textwrap.dedent(
    """
    import json, sys, time
    from confluent_kafka import Producer
    bootstrap, topic, n, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    p = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 5,
                  "batch.size": 1 << 20, "queue.buffering.max.messages": 2_000_000,
                  "queue.buffering.max.kbytes": 1 << 20, "compression.type": "none"})
    value = b"x" * size
    start = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(topic, value, partition=0)
                break
            except BufferError:
                p.poll(0.01)
    left = p.flush(120)
    secs = time.perf_counter() - start
    if left:
        sys.exit(f"{left} records not delivered")
    print(json.dumps({"seconds": secs, "records_per_sec": n / secs,
                      "mb_per_sec": n * size / secs / 1e6}))
    """
)

CONSUMER = textwrap.dedent(
    """
    import json, sys, time
    from confluent_kafka import Consumer, TopicPartition
    bootstrap, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                  "enable.auto.commit": False, "fetch.max.bytes": 64 << 20,
                  "max.partition.fetch.bytes": 16 << 20, "queued.max.messages.kbytes": 1 << 20,
                  "queued.min.messages": 1_000_000, "fetch.queue.backoff.ms": 10})
    t0 = time.perf_counter()
    c.assign([TopicPartition(topic, 0, 0)])
    got = nbytes = 0
    start = None  # from the first record: librdkafka's start-up (offset lookup) apart
    deadline = t0 + 300
    while got < n and time.perf_counter() < deadline:
        for m in c.consume(10000, 1.0):
            if m.error() is None:
                if start is None:
                    start = time.perf_counter()
                got += 1
                nbytes += len(m.value())
            else:
                sys.exit(f"consume error: {m.error()}")
    end = time.perf_counter()
    c.close()
    if got < n:
        sys.exit(f"read {got} of {n} records")
    secs = end - start
    print(json.dumps({"seconds": secs, "first_record_s": start - t0,
                      "records_per_sec": got / secs, "mb_per_sec": nbytes / secs / 1e6}))
    """
)


# -- small helpers -------------------------------------------------------------------------
def run(cmd: list[str], timeout: float = 600) -> dict[str, Any]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed: {(proc.stderr or proc.stdout).strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    """Polls every 0.1 s: a metrics scrape costs the broker a few ms of CPU."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def metrics(port: int) -> dict[str, float]:
    """The broker's unlabelled samples (the remote tier's counters and gauges)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+) ([0-9.eE+-]+)$", line)
        if m:  # counters by their names without prometheus_client's _total
            out[m.group(1).removesuffix("_total")] = float(m.group(2))
    return out


def overrides(*pairs: str) -> list[str]:
    out: list[str] = []
    for kv in pairs:
        out += ["--override", kv]
    return out


def local_bytes(broker: BrokerProcess, topic: str) -> int:
    return sum(p.stat().st_size for p in (broker.data_dir / f"{topic}-0").glob("*.log"))


def local_log_start(broker: BrokerProcess, topic: str) -> int:
    return min(int(p.name[:20]) for p in (broker.data_dir / f"{topic}-0").glob("*.log"))


def create_topic(broker: BrokerProcess, name: str, config: dict[str, str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.kafka_bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(30)


# -- produce and consume, tiered beside untiered -------------------------------------------
def tiered_topic_config() -> dict[str, str]:
    return {
        "remote.storage.enable": "true",
        "segment.bytes": str(SEGMENT_BYTES),
        "local.retention.bytes": str(LOCAL_RETENTION_BYTES),
    }


def produce_consume(tier_args: list[str], mb: int, rounds: int, label: str) -> dict[str, Any]:
    n = mb * 1_000_000 // RECORD
    total = n * RECORD
    mport = free_port()
    out: dict[str, Any] = {"backend": label, "records": n, "record_bytes": RECORD}
    with tempfile.TemporaryDirectory(prefix="logmq-bench-tiered-") as tmp:
        broker = BrokerProcess(
            Path(tmp) / "data",
            port=free_port(),
            extra_args=[*tier_args, "--metrics-port", str(mport)],
            log_level="warning",
        )
        with broker:
            pid = broker.pid
            assert pid is not None
            produce_rows: list[dict[str, Any]] = []
            pairs = []
            for r in range(rounds):
                plain, tiered = f"untiered-{r}", f"tiered-{r}"
                create_topic(broker, plain, {"segment.bytes": str(SEGMENT_BYTES)})
                create_topic(broker, tiered, tiered_topic_config())
                pairs.append((plain, tiered))
                legs = [(plain, False), (tiered, True)]
                for topic, is_tiered in legs if r % 2 == 0 else legs[::-1]:
                    before = cpu_seconds(pid)
                    copied0 = metrics(mport).get("logmq_remote_copy_segments", 0)
                    res = run([sys.executable, "-c", PRODUCER, broker.kafka_bootstrap, topic,
                               str(n), str(RECORD)])  # fmt: skip
                    res["broker_cpu_s"] = cpu_seconds(pid) - before
                    res.update(topic=topic, tiered=is_tiered)
                    if is_tiered:
                        m = metrics(mport)
                        res["copied_during_produce"] = m["logmq_remote_copy_segments"] - copied0
                        res["copy_lag_segments_at_end"] = m["logmq_remote_copy_lag_segments"]
                        t = time.perf_counter()
                        wait_for(
                            lambda: metrics(mport)["logmq_remote_copy_lag_segments"] == 0,
                            300,
                            "the copy to catch up",
                        )
                        wait_for(
                            lambda t=topic: (
                                local_bytes(broker, t) <= LOCAL_RETENTION_BYTES + 2 * SEGMENT_BYTES
                            ),
                            120,
                            "local retention to delete copied segments",
                        )
                        res["copy_done_after_produce_s"] = time.perf_counter() - t
                        secs = res["seconds"] + res["copy_done_after_produce_s"]
                        res["produce_and_copy_mb_per_sec"] = total / secs / 1e6
                        res["broker_cpu_s_incl_copy"] = cpu_seconds(pid) - before
                    produce_rows.append(res)
            out["produce"] = produce_rows
            # a cold chunk cache: restart, then read every topic from offset 0
            broker.stop()
            broker.start()
            pid = broker.pid
            assert pid is not None
            consume_rows = []
            for r, (plain, tiered) in enumerate(pairs):
                legs = [(tiered, True), (plain, False)]
                for topic, is_tiered in legs if r % 2 == 0 else legs[::-1]:
                    before = cpu_seconds(pid)
                    res = run([sys.executable, "-c", CONSUMER, broker.kafka_bootstrap, topic,
                               str(n)])  # fmt: skip
                    res["broker_cpu_s"] = cpu_seconds(pid) - before
                    res.update(topic=topic, tiered=is_tiered)
                    if is_tiered:
                        start = local_log_start(broker, topic)
                        res["remote_share"] = start / n
                        m = metrics(mport)
                        res["remote_fetch_requests"] = m.get("logmq_remote_fetch_requests")
                        res["cache_misses"] = m.get("logmq_remote_cache_misses")
                    consume_rows.append(res)
            out["consume"] = consume_rows
            out["broker_log_warnings"] = [
                line
                for line in broker.log_path.read_text(errors="replace").splitlines()
                if " WARNING " in line or " ERROR " in line
            ][-10:]
    return out


# -- 10,000 remote segments through AlterRemoteSegments -------------------------------------
async def write_remote_segments(broker: BrokerProcess, topic: str, tid: str, count: int) -> float:
    """COPY_STARTED then COPY_FINISHED for ``count`` segments of 1,000 records each,
    as the partition leader (broker 1, its registration epoch and the partition's
    leader epoch) asks; returns the seconds the 2 x count changes took."""
    from logmq.net.codec import ApiKey
    from tests.net.raw_client import RawClient

    records_per_segment = 1000
    async with await RawClient.connect(broker.port) as c:
        cluster = (await c.call(ApiKey.DESCRIBE_CLUSTER, {})).body
        (me,) = [b for b in cluster["brokers"] if b["node_id"] == broker.node_id]
        md = (await c.call(ApiKey.METADATA, {"topics": [topic]})).body
        epoch = md["topics"][0]["partitions"][0]["leader_epoch"]
        now = int(time.time() * 1000)

        def started(i: int) -> dict[str, Any]:
            base = i * records_per_segment
            return {
                "topic_id": tid,
                "partition": 0,
                "leader_epoch": epoch,
                "segment_id": f"{i:032x}",
                "state": 0,
                "checksum": "",
                "event_ms": now,
                "segment": {
                    "base_offset": base,
                    "end_offset": base + records_per_segment - 1,
                    "max_timestamp": now,
                    "size_bytes": records_per_segment * (RECORD + 70),
                    "leader_epochs": [[epoch, base]],
                    "copier_epoch": epoch,
                    "broker_id": broker.node_id,
                    "topic": topic,
                },
            }

        def finished(i: int) -> dict[str, Any]:
            return {
                "topic_id": tid,
                "partition": 0,
                "leader_epoch": epoch,
                "segment_id": f"{i:032x}",
                "state": 1,
                "checksum": f"{i:016x}",
                "event_ms": now,
                "segment": None,
            }

        t = time.perf_counter()
        # each segment's COPY_STARTED and COPY_FINISHED in one request: the leader's
        # tier pass takes a COPY_STARTED segment it is not copying for a dead copy's
        # orphan and deletes it, as it should
        per_request = MAX_CHANGES // 2
        for first in range(0, count, per_request):
            ids = range(first, min(count, first + per_request))
            body = {
                "broker_id": broker.node_id,
                "broker_epoch": me["broker_epoch"],
                "changes": [change for i in ids for change in (started(i), finished(i))],
            }
            resp = (await c.call(ApiKey.ALTER_REMOTE_SEGMENTS, body)).body
            bad = [r for r in resp["changes"] if r["error"] != 0]
            if resp.get("error") or bad:
                code = resp.get("error")
                raise RuntimeError(f"AlterRemoteSegments refused: {code} {bad[:3]}")
        return time.perf_counter() - t


async def create_native_topic(broker: BrokerProcess, topic: str, config: dict[str, str]) -> str:
    from tests.net.raw_client import RawClient

    async with await RawClient.connect(broker.port) as c:
        r = await c.create_topic(topic, 1, config)
    if r.get("error"):
        raise RuntimeError(f"create {topic}: {r}")
    return r["topic_id"]


async def tiered_offsets(broker: BrokerProcess, topic: str) -> dict[str, Any]:
    """ListOffsets earliest (-2) and latest tiered (-5): the image holds the segments."""
    from tests.net.raw_client import RawClient

    async with await RawClient.connect(broker.port) as c:
        return {ts: await c.list_offset(topic, 0, ts) for ts in (-2, -5)}


def restarts(broker: BrokerProcess, times: int) -> list[dict[str, float]]:
    rows = []
    for _ in range(times):
        broker.stop()
        t = time.perf_counter()
        broker.start()
        ready = time.perf_counter() - t
        pid = broker.pid
        assert pid is not None
        cpu0 = cpu_seconds(pid)
        time.sleep(SETTLE_S)  # a benchmark's settle time, not a test's synchronisation
        rows.append(
            {
                "ready_s": ready,
                "rss_mb": proc_status_kb(pid, "VmRSS") / 1024,
                "hwm_mb": proc_status_kb(pid, "VmHWM") / 1024,
                "idle_cpu_pct": 100 * (cpu_seconds(pid) - cpu0) / SETTLE_S,
            }
        )
    return rows


def many_segments(backend_args: list[str], segments: int, times: int) -> list[dict[str, Any]]:
    """The three brokers at Kafka's default remote.log.manager.task.interval.ms (30 s),
    and the one with the segments again at the 100 ms of the produce legs, whose idle
    CPU shows what the tier's pass over every remote segment costs."""
    system = overrides("remote.log.storage.system.enable=true")
    fast = overrides("remote.log.manager.task.interval.ms=100")
    tiered = [*system, *backend_args]
    cases = (
        ("untiered broker, untiered topic", [], 0, times),
        ("tiered broker, tiered topic, no remote segments", tiered, 0, times),
        (f"tiered broker, {segments:,} remote segments", tiered, segments, times),
        ("the same, task interval 100 ms", [*tiered, *fast], segments, 1),
    )
    out = []
    for label, args, count, n_restarts in cases:
        with tempfile.TemporaryDirectory(prefix="logmq-bench-tiered-") as tmp:
            broker = BrokerProcess(
                Path(tmp) / "data", port=free_port(), extra_args=args, log_level="warning"
            )
            with broker:
                config = {"retention.ms": "-1", "segment.bytes": str(SEGMENT_BYTES)}
                if args:
                    config["remote.storage.enable"] = "true"
                tid = asyncio.run(create_native_topic(broker, "meta", config))
                row: dict[str, Any] = {"case": label, "remote_segments": count}
                if count:
                    row["alter_seconds"] = asyncio.run(
                        write_remote_segments(broker, "meta", tid, count)
                    )
                rows = restarts(broker, n_restarts)
                if count:
                    row["offsets_after_restart"] = asyncio.run(tiered_offsets(broker, "meta"))
                    latest = row["offsets_after_restart"][-5]["offset"]
                    if latest != count * 1000 - 1:
                        raise RuntimeError(f"after the restart the tier ends at {latest}")
                row["restarts"] = rows
                for key in ("ready_s", "rss_mb", "hwm_mb", "idle_cpu_pct"):
                    row[key] = statistics.median(x[key] for x in rows)
                row["broker_log_warnings"] = [
                    line
                    for line in broker.log_path.read_text(errors="replace").splitlines()
                    if " WARNING " in line or " ERROR " in line
                ][-10:]
            out.append(row)
    return out


# -- report ----------------------------------------------------------------------------------
def ratio(rows: list[dict[str, Any]], key: str) -> float:
    tiered = statistics.median(r[key] for r in rows if r["tiered"])
    plain = statistics.median(r[key] for r in rows if not r["tiered"])
    return tiered / plain


def print_report(results: dict[str, Any]) -> None:
    for pc in results["produce_consume"]:
        print(f"\n## {pc['backend']}: {pc['records']:,} records of {pc['record_bytes']} B")
        print("| case | topic | records/s | MB/s | broker CPU s | notes |")
        print("|---|---|---:|---:|---:|---|")
        for r in pc["produce"]:
            notes = ""
            if r["tiered"]:
                notes = (
                    f"{r['copied_during_produce']:.0f} segments copied during the produce, "
                    f"{r['copy_lag_segments_at_end']:.0f} waiting at its end, all copied "
                    f"{r['copy_done_after_produce_s']:.1f} s later; produce+copy "
                    f"{r['produce_and_copy_mb_per_sec']:.0f} MB/s, "
                    f"broker CPU with the copy {r['broker_cpu_s_incl_copy']:.1f} s"
                )
            print(f"| produce | {r['topic']} | {r['records_per_sec']:,.0f} | "
                  f"{r['mb_per_sec']:,.1f} | {r['broker_cpu_s']:.1f} | {notes} |")  # fmt: skip
        for r in pc["consume"]:
            notes = f"first record {r['first_record_s']:.2f} s after assign()"
            if r["tiered"]:
                notes += f"; {r['remote_share']:.0%} of the records from the remote tier"
            print(f"| consume | {r['topic']} | {r['records_per_sec']:,.0f} | "
                  f"{r['mb_per_sec']:,.1f} | {r['broker_cpu_s']:.1f} | {notes} |")  # fmt: skip
        print(f"\nproduce tiered/untiered (median MB/s): {ratio(pc['produce'], 'mb_per_sec'):.0%}"
              f" (target >= 90%)")  # fmt: skip
        print(f"consume tiered cold/untiered (median MB/s): "
              f"{ratio(pc['consume'], 'mb_per_sec'):.0%} (target >= 50%)")  # fmt: skip
        if pc["broker_log_warnings"]:
            print("broker warnings:", *pc["broker_log_warnings"], sep="\n  ")
    rows = results.get("many_segments") or []
    if rows:
        print("\n## restart and RSS (medians over restarts)")
        print("| case | ready after start (s) | VmRSS (MB) | VmHWM (MB) | idle CPU % |")
        print("|---|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['case']} | {r['ready_s']:.2f} | {r['rss_mb']:.1f} | {r['hwm_mb']:.1f} |"
                  f" {r['idle_cpu_pct']:.1f} |")  # fmt: skip
        base, many = rows[0], rows[2]
        print(f"\nRSS {many['rss_mb'] / base['rss_mb']:.2f}x untiered (target <= 1.2x); "
              f"restart {many['ready_s'] / base['ready_s']:.2f}x (target <= 1.2x); "
              f"{2 * many['remote_segments']:,} AlterRemoteSegments changes took "
              f"{many.get('alter_seconds', 0):.2f} s")  # fmt: skip
        for r in rows:
            if r["broker_log_warnings"]:
                print(f"broker warnings ({r['case']}):", *r["broker_log_warnings"], sep="\n  ")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=300, help="MB produced into each topic")
    ap.add_argument("--rounds", type=int, default=2, help="tiered/untiered pairs, alternated")
    ap.add_argument("--segments", type=int, default=10_000)
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--s3", action="store_true", help="also on moto's S3 server")
    ap.add_argument("--s3-mb", type=int, default=150)
    ap.add_argument("--skip", default="", help="comma list of: directory,segments")
    ap.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    opts = ap.parse_args()
    skip = set(filter(None, opts.skip.split(",")))
    results: dict[str, Any] = {"produce_consume": []}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="logmq-bench-remote-") as remote:
        fs_backend = overrides(
            f"rsm.config.storage.backend.class={FS_RSM}", f"rsm.config.storage.root={remote}"
        )
        fs_args = [*overrides(*TIER_COMMON), *fs_backend]
        if "directory" not in skip:
            results["produce_consume"].append(
                produce_consume(fs_args, opts.mb, opts.rounds, "directory back end")
            )
        if "segments" not in skip:
            results["many_segments"] = many_segments(fs_backend, opts.segments, opts.restarts)
    if opts.s3:
        from logmq.testing.s3 import ACCESS_KEY_ID, SECRET_ACCESS_KEY, MotoS3Server

        with MotoS3Server() as s3:
            s3.create_bucket("bench-tiered")
            s3_args = overrides(
                *TIER_COMMON,
                f"rsm.config.storage.backend.class={S3_RSM}",
                "rsm.config.storage.s3.bucket.name=bench-tiered",
                f"rsm.config.storage.s3.endpoint.url={s3.endpoint_url}",
                "rsm.config.storage.s3.region=us-east-1",
                "rsm.config.storage.s3.path.style.access.enabled=true",
                f"rsm.config.storage.aws.access.key.id={ACCESS_KEY_ID}",
                f"rsm.config.storage.aws.secret.access.key={SECRET_ACCESS_KEY}",
            )
            results["produce_consume"].append(
                produce_consume(s3_args, opts.s3_mb, opts.rounds, "moto S3")
            )
    results["wall_seconds"] = time.perf_counter() - started
    print_report(results)
    print(f"\n(wall time {results['wall_seconds']:.0f} s)")
    if opts.json:
        Path(opts.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
