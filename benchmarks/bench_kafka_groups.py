"""Rebalance time of a confluent-kafka consumer group on logmq (issue 15).

One broker (``logmq.testing.LogmqBroker``: ``--group-initial-rebalance-delay-ms 0``, group
sessions of 6 s, heartbeats every 500 ms), a 6-partition topic, a producer process
sending ``--rate`` records/s round-robin over the partitions (each record carries its
send time), and a group of 3 confluent-kafka consumers, each in its own process, with
one of three protocols:

* ``range``: the classic protocol, eager: every rebalance revokes every partition;
* ``cooperative-sticky``: the classic protocol, incremental (KIP-429);
* ``consumer``: KIP-848 (``group.protocol=consumer``), the broker assigns.

Once the 3 members share the partitions and consume, two events, each measured until
the group is settled again (every partition owned by one live member, consumed by it
since its last assignment, no assignment change for ``SETTLE_S``):

1. **join**: a 4th member subscribes (the time it calls ``subscribe()`` is t0);
2. **kill**: one of the original members is killed with SIGKILL (t0: the signal). Its
   partitions wait for its session to expire (6 s), then move.

Per event:

* **rebalance**: from t0 until every partition is consumed again by its final owner
  (its first batch after t0 and after its last assignment of that partition);
* **moved**: partitions whose owner changed; **gap, moved**: for those, the longest
  time between two batches consumed (by anyone) from the last batch before t0 until
  settled;
* **gap, unmoved**: the same for partitions that kept their owner (for ``range`` they
  pause too; for incremental protocols they should flow on);
* **latency, unmoved**: the age (now minus send time) of the oldest record consumed
  from an unmoved partition after t0: how late the pause made them;
* **baseline**: the longest gap on any partition in the 3 s before the event (for the
  join, before the 4th member's process was spawned).

Each consumer reports, per batch it consumes (``consume(1000, 0.01)``), one line per
partition with the monotonic time (system-wide on Linux), and its rebalance callbacks.
Usage:

    python benchmarks/bench_kafka_groups.py [--runs 3] [--rate 2000] [--json]
        [--protocols range cooperative-sticky consumer]

The medians (min-max) of ``--runs`` runs are printed; each run has a new broker.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

PARTITIONS = 6
MEMBERS = 3
SESSION_MS = 6000
HEARTBEAT_MS = 500
SETTLE_S = 2.0  # no assignment change for this long, every partition flowing: settled
BASELINE_S = 3.0  # steady consumption observed before each event
EVENT_TIMEOUT_S = 60.0
SERVER_ARGS = [
    "--group-initial-rebalance-delay-ms", "0",
    "--group-session-timeout-ms", str(SESSION_MS),
    "--group-heartbeat-interval-ms", str(HEARTBEAT_MS),
]  # fmt: skip


# -- the child processes -------------------------------------------------------------
def run_producer(bootstrap: str, topic: str, rate: int) -> None:
    """Send ``rate`` records/s (value: the send time in monotonic ns) until SIGTERM."""
    import confluent_kafka as ck

    running = True

    def stop(*_: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "acks": 1})
    start = time.monotonic()
    sent = 0
    while running:
        due = int((time.monotonic() - start) * rate)
        while sent < due:
            try:
                value = str(time.monotonic_ns()).encode()
                producer.produce(topic, value=value, partition=sent % PARTITIONS)
                sent += 1
            except BufferError:
                break
        producer.poll(0.002)
    producer.flush(10)


def run_member(bootstrap: str, topic: str, group: str, protocol: str) -> None:
    """A group member that reports its rebalance callbacks and every batch it consumes:

    ``S t`` (about to subscribe), ``A t P...`` / ``R t P...`` / ``L t P...`` (assigned,
    revoked, lost), ``C P t N LAT`` (N records of P consumed at t, the oldest LAT s old).
    """
    import confluent_kafka as ck

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "latest",
        "enable.auto.commit": True,
        "auto.commit.interval.ms": 1000,
    }
    if protocol == "consumer":
        conf["group.protocol"] = "consumer"
    else:
        conf.update(
            {
                "partition.assignment.strategy": protocol,
                "session.timeout.ms": SESSION_MS,
                "heartbeat.interval.ms": HEARTBEAT_MS,
            }
        )
    consumer = ck.Consumer(conf)
    running = True

    def stop(*_: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    out = sys.stdout

    def callback(tag: str) -> Any:
        def report(c: Any, partitions: list[Any]) -> None:
            ps = " ".join(str(p.partition) for p in partitions)
            out.write(f"{tag} {time.monotonic():.6f} {ps}\n")
            out.flush()

        return report

    out.write(f"S {time.monotonic():.6f}\n")
    out.flush()
    consumer.subscribe(
        [topic], on_assign=callback("A"), on_revoke=callback("R"), on_lost=callback("L")
    )
    while running:
        msgs = consumer.consume(1000, 0.01)
        if not msgs:
            continue
        now = time.monotonic()
        oldest: dict[int, float] = {}
        counts: dict[int, int] = {}
        for m in msgs:
            if m.error() is not None:
                continue
            p = m.partition()
            counts[p] = counts.get(p, 0) + 1
            lat = now - int(m.value()) / 1e9
            oldest[p] = max(oldest.get(p, 0.0), lat)
        for p, n in counts.items():
            out.write(f"C {p} {now:.6f} {n} {oldest[p]:.6f}\n")
        out.flush()
    consumer.close()


# -- the parent: processes and their reports -----------------------------------------
@dataclass
class Member:
    index: int
    proc: subprocess.Popen
    started: float | None = None  # its "S" line
    dead: bool = False


@dataclass
class Reports:
    """Everything the members said, in arrival order, under one lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    # (t, member, kind, partitions) for S/A/R/L; batches separately
    assignments: list[tuple[float, int, str, tuple[int, ...]]] = field(default_factory=list)
    batches: list[tuple[float, int, int, int, float]] = field(default_factory=list)  # t,m,p,n,lat

    def read(self, member: Member) -> None:
        assert member.proc.stdout is not None
        for line in member.proc.stdout:
            parts = line.split()
            if not parts:
                continue
            with self.lock:
                if parts[0] == "C":
                    p, t, n, lat = int(parts[1]), float(parts[2]), int(parts[3]), float(parts[4])
                    self.batches.append((t, member.index, p, n, lat))
                elif parts[0] == "S":
                    member.started = float(parts[1])
                else:
                    ps = tuple(int(p) for p in parts[2:])
                    self.assignments.append((float(parts[1]), member.index, parts[0], ps))

    def owners(self, at: float, members: list[Member]) -> dict[int, set[int]]:
        """partition -> the live members owning it at ``at``, from their callbacks."""
        owned: dict[int, set[int]] = {m.index: set() for m in members}
        with self.lock:
            events = sorted(a for a in self.assignments if a[0] <= at)
        for _, m, kind, ps in events:
            if kind == "A":
                owned[m] |= set(ps)
            else:
                owned[m] -= set(ps)
        out: dict[int, set[int]] = {p: set() for p in range(PARTITIONS)}
        for m in members:
            if not m.dead:
                for p in owned[m.index]:
                    out[p].add(m.index)
        return out

    def last_assigned(self, member: int, partition: int) -> float:
        with self.lock:
            times = [
                t
                for t, m, kind, ps in self.assignments
                if m == member and kind == "A" and partition in ps
            ]
        return max(times, default=float("-inf"))

    def last_change(self) -> float:
        with self.lock:
            return max((a[0] for a in self.assignments), default=float("-inf"))

    def latency(self, partition: int, since: float, until: float) -> float:
        """The oldest record of ``partition`` consumed in (since, until], its age in s."""
        with self.lock:
            return max(
                (lat for t, _, p, _, lat in self.batches if p == partition and since < t <= until),
                default=0.0,
            )

    def consumed(self, partition: int, since: float, by: int | None = None) -> list[float]:
        with self.lock:
            return sorted(
                t
                for t, m, p, _, _ in self.batches
                if p == partition and t > since and (by is None or m == by)
            )


class Run:
    def __init__(self, protocol: str, rate: int, topic: str) -> None:
        self.protocol = protocol
        self.rate = rate
        self.topic = topic
        self.group = f"bench-{protocol}"
        self.reports = Reports()
        self.members: list[Member] = []
        self.children: list[subprocess.Popen] = []

    def spawn(self, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, __file__, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.children.append(proc)
        return proc

    def add_member(self, bootstrap: str) -> Member:
        proc = self.spawn("--member", bootstrap, self.topic, self.group, self.protocol)
        member = Member(len(self.members), proc)
        self.members.append(member)
        threading.Thread(target=self.reports.read, args=(member,), daemon=True).start()
        return member

    def live(self) -> list[Member]:
        return [m for m in self.members if not m.dead]

    def settled(self, t0: float) -> dict[int, int] | None:
        """partition -> owner once the group is settled after ``t0``, else None."""
        now = time.monotonic()
        owners = self.reports.owners(now, self.members)
        if any(len(o) != 1 for o in owners.values()):
            return None
        final = {p: next(iter(o)) for p, o in owners.items()}
        if {m.index for m in self.live()} != set(final.values()):
            return None  # someone holds nothing yet
        if now - max(t0, self.reports.last_change()) < SETTLE_S:
            return None
        for p, m in final.items():
            since = max(t0, self.reports.last_assigned(m, p))
            if not self.reports.consumed(p, since, by=m):
                return None
        return final

    def wait_settled(self, t0: float, what: str) -> dict[int, int]:
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        while True:
            final = self.settled(t0)
            if final is not None:
                return final
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.protocol}: not settled after {what}")
            time.sleep(0.05)  # between looks at the members' reports

    def measure(
        self, t0: float, before: dict[int, int], final: dict[int, int], calm_until: float
    ) -> dict:
        """The figures of one event at ``t0``; the baseline window ends at ``calm_until``
        (for a join: when the 4th member's process was spawned, whose start-up takes CPU)."""
        rebalance = 0.0
        gaps: dict[int, float] = {}
        end = time.monotonic()
        for p in range(PARTITIONS):
            owner = final[p]
            since = max(t0, self.reports.last_assigned(owner, p))
            resumed = self.reports.consumed(p, since, by=owner)[0]
            rebalance = max(rebalance, resumed - t0)
            times = [t for t in self.reports.consumed(p, t0 - BASELINE_S) if t <= end]
            last_before = [t for t in times if t <= t0][-1:]
            after = [t for t in times if t > t0]
            series = last_before + after
            gaps[p] = max((b - a for a, b in itertools.pairwise(series)), default=0.0)
        baseline = 0.0
        for p in range(PARTITIONS):
            times = [
                t for t in self.reports.consumed(p, calm_until - BASELINE_S) if t <= calm_until
            ]
            baseline = max(baseline, max((b - a for a, b in itertools.pairwise(times)), default=0))
        moved = sorted(p for p in range(PARTITIONS) if before.get(p) != final[p])
        unmoved = [p for p in range(PARTITIONS) if p not in moved]
        return {
            "rebalance_s": rebalance,
            "moved": len(moved),
            "gap_moved_s": max((gaps[p] for p in moved), default=None),
            "gap_unmoved_s": max((gaps[p] for p in unmoved), default=None),
            "latency_unmoved_s": max(
                (self.reports.latency(p, t0, end) for p in unmoved), default=None
            ),
            "baseline_gap_s": baseline,
        }

    def execute(self) -> dict[str, dict]:
        from logmq.testing import LogmqBroker

        results: dict[str, dict] = {}
        with LogmqBroker(server_args=SERVER_ARGS) as broker:
            broker.create_topic(self.topic, PARTITIONS)
            bootstrap = broker.bootstrap_servers
            try:
                self.spawn("--producer", bootstrap, self.topic, str(self.rate))
                for _ in range(MEMBERS):
                    self.add_member(bootstrap)
                start = time.monotonic()
                before = self.wait_settled(start, "the start")
                self.wait_steady(BASELINE_S)

                # 1. a 4th member joins
                spawned = time.monotonic()
                joiner = self.add_member(bootstrap)
                deadline = time.monotonic() + EVENT_TIMEOUT_S
                while joiner.started is None:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the 4th member did not start")
                    time.sleep(0.01)  # until its "S" line arrives
                t0 = joiner.started
                final = self.wait_settled(t0, "the join")
                results["join"] = self.measure(t0, before, final, spawned)
                self.wait_steady(BASELINE_S)

                # 2. an original member is killed
                victim = self.members[0]
                before = self.reports.owners(time.monotonic(), self.members)
                before_owner = {p: next(iter(o)) for p, o in before.items() if o}
                t0 = time.monotonic()
                victim.proc.send_signal(signal.SIGKILL)
                victim.proc.wait(10)
                victim.dead = True
                final = self.wait_settled(t0, "the kill")
                results["kill"] = self.measure(t0, before_owner, final, t0)
            finally:
                self.stop_children()
        return results

    def wait_steady(self, seconds: float) -> None:
        """Let the group consume undisturbed for the baseline window (nothing to wait on:
        the window is part of the measurement)."""
        time.sleep(seconds)

    def stop_children(self) -> None:
        for proc in self.children:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.children:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


# -- output --------------------------------------------------------------------------
def summarize(values: list[float | None]) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    med = statistics.median(got)
    if len(got) == 1:
        return f"{med:.2f}"
    return f"{med:.2f} ({min(got):.2f}-{max(got):.2f})"


def ms(values: list[float | None]) -> str:
    got = [v * 1000 if v is not None else None for v in values]
    got = [v for v in got if v is not None]
    if not got:
        return "-"
    med = statistics.median(got)
    if len(got) == 1:
        return f"{med:.0f}"
    return f"{med:.0f} ({min(got):.0f}-{max(got):.0f})"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--producer":
        run_producer(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--member":
        run_member(*sys.argv[2:6])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rate", type=int, default=2000, help="records/s produced")
    parser.add_argument(
        "--protocols", nargs="+", default=["range", "cooperative-sticky", "consumer"]
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, dict[str, list[dict]]] = {}
    for protocol in args.protocols:
        for i in range(args.runs):
            run = Run(protocol, args.rate, f"rebalance-{i}")
            for event, figures in run.execute().items():
                results.setdefault(protocol, {}).setdefault(event, []).append(figures)
                if not args.json:
                    print(f"# {protocol} run {i + 1} {event}: {figures}", file=sys.stderr)
    if args.json:
        print(json.dumps(results))
        return
    print(
        f"{os.cpu_count()} cores; {args.rate} records/s over {PARTITIONS} partitions; "
        f"{MEMBERS} members; session {SESSION_MS} ms, heartbeat {HEARTBEAT_MS} ms; "
        f"median (min-max) of {args.runs} runs"
    )
    header = (
        "| protocol | event | rebalance (s) | moved | gap, moved (ms) | gap, unmoved (ms) "
        "| latency, unmoved (ms) | baseline gap (ms) |"
    )
    print(header)
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for protocol, events in results.items():
        for event, runs in events.items():
            moved = sorted(r["moved"] for r in runs)
            print(
                f"| {protocol} | {event} | {summarize([r['rebalance_s'] for r in runs])} "
                f"| {'/'.join(map(str, moved))} | {ms([r['gap_moved_s'] for r in runs])} "
                f"| {ms([r['gap_unmoved_s'] for r in runs])} "
                f"| {ms([r['latency_unmoved_s'] for r in runs])} "
                f"| {ms([r['baseline_gap_s'] for r in runs])} |"
            )


if __name__ == "__main__":
    main()
