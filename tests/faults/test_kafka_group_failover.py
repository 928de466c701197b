"""A coordinator failover under running confluent-kafka groups (issue 15).

A 3-broker cluster (the fault harness's ``Cluster``), a 6-partition topic and
``__consumer_offsets`` both with replication factor 3 and min.insync.replicas=2. Two
groups consume the topic at once: a classic one (``range``, eager) and a KIP-848 one
(``group.protocol=consumer``), confluent-kafka consumers in subprocesses
(``tests/faults/group_committer.py``: synchronous commits, one ``committed P OFFSET``
line per commit the broker acknowledged). The group ids are chosen to hash to the same
``__consumer_offsets`` partition, so both have the same coordinator. A confluent-kafka
producer (idempotent, acks=all) sends unique values from a thread throughout.

Once both groups have acknowledged commits in every partition, their coordinator (found
with FindCoordinator) is killed with SIGKILL: ``steady``, with three members each and
nothing moving; ``rebalancing``, with two members each, just after a third one joined each
group, as soon as the classic group's members revoke their partitions (its eager
rebalance has begun; the KIP-848 group is reconciling meanwhile). Then:

* both groups make progress: each ends balanced over its members, and every partition
  gets a commit acknowledged after the kill, beyond what was acknowledged before it;
* no acknowledged commit rolls back: every read of a group's committed offsets (polled
  throughout, from the live brokers) is at least the highest commit acknowledged
  before the read began, in every partition;
* the killed broker comes back and, by a preferred-leader election, coordinates again
  (a clean handover): both groups make progress again in every partition;
* the producer stops: every acknowledged record is consumed by each group (duplicates
  allowed) and each group's committed offsets reach the end offsets (lag 0).

Every wait polls a condition with a deadline. ``LOGMQ_FAULTS_CLUSTER=0`` skips it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from logmq import Admin
from logmq.group import OFFSETS_TOPIC, coordinator_partition
from tests.faults.cluster_checks import admin_call, all_in_sync
from tests.faults.processes import Cluster

ck = pytest.importorskip("confluent_kafka")

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "grp-failover"
PARTITIONS = 6
OFFSETS_PARTITIONS = 10  # --offsets-topic-partitions: a light cluster on a small host
CONSUMERS = 3  # per group, in the end
COMMIT_EVERY = 20  # records between a member's synchronous commits
PACE_S = 0.004  # the producer's poll between sends: ~250 records/s
GROUP_OPTIONS = [
    "--group-initial-rebalance-delay-ms", "0",
    "--group-session-timeout-ms", "6000",
    "--group-heartbeat-interval-ms", "500",
]  # fmt: skip
WAIT_S = 30.0  # deadline of each wait for progress
STRATEGIES = {"classic": "range", "kip848": "consumer"}


# -- the clients ---------------------------------------------------------------------
class ProducerThread:
    """A confluent-kafka producer sending unique values round-robin over the partitions;
    ``acked`` holds every value whose delivery report came back without error."""

    def __init__(self, bootstrap: str) -> None:
        self.lock = threading.Lock()
        self.acked: dict[int, dict[int, str]] = {p: {} for p in range(PARTITIONS)}
        self.failed: list[str] = []
        self.left: int | None = None
        self._stop = threading.Event()
        self.producer = ck.Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 60_000,
                "request.timeout.ms": 5_000,
                "retry.backoff.ms": 50,
                "retry.backoff.max.ms": 500,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 500,
            }
        )
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            value = f"v{n:07d}"
            try:
                self.producer.produce(
                    TOPIC, value=value, partition=n % PARTITIONS, on_delivery=self._report
                )
                n += 1
            except BufferError:
                pass  # the local queue is full: the poll below drains it
            self.producer.poll(PACE_S)
        self.left = self.producer.flush(70)
        self.producer.close()  # librdkafka's threads stop before the cluster does

    def _report(self, err: Any, msg: Any) -> None:
        with self.lock:
            if err is None:
                self.acked[msg.partition()][msg.offset()] = msg.value().decode()
            else:
                self.failed.append(f"{msg.value()!r}: {err}")

    def start(self) -> ProducerThread:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(90)
        assert not self._thread.is_alive(), "the producer did not finish its flush"

    def values(self) -> set[str]:
        with self.lock:
            return {v for part in self.acked.values() for v in part.values()}


class Member:
    """tests/faults/group_committer.py in a subprocess; a thread parses its lines."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        strategy: str,
        name: str,
        log: Path,
        revoked: threading.Event,
    ) -> None:
        self.name = name
        self.revoked = revoked  # set (at once, no polling) when this member revokes
        self.log = log
        with open(log, "wb") as stderr:  # librdkafka's complaints, for a failure's report
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.faults.group_committer", bootstrap, group, TOPIC,
                 strategy, str(COMMIT_EVERY)],
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=ROOT,
                text=True,
            )  # fmt: skip
        self.lock = threading.Lock()
        self.values: set[str] = set()
        self.commits: list[tuple[float, int, int]] = []  # (received at, partition, offset)
        self.assigned: set[int] = set()
        self.lines: list[str] = []
        self.events: list[tuple[float, str]] = []  # (received at, first word) but records
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            parts = line.split()
            now = time.monotonic()
            with self.lock:
                if parts[:1] == ["rec"]:
                    self.values.add(parts[3])
                    continue
                self.lines.append(line.strip())
                self.events.append((now, parts[0] if parts else ""))
                if parts[:1] == ["committed"]:
                    self.commits.append((now, int(parts[1]), int(parts[2])))
                elif parts[:1] == ["assigned"]:
                    self.assigned |= {int(p) for p in parts[1:]}  # incremental too
                elif parts[:1] in (["revoked"], ["lost"]):
                    self.assigned -= {int(p) for p in parts[1:]}
                    if parts[0] == "revoked":
                        self.revoked.set()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        self._reader.join(10)
        assert code == 0, (self.name, code, self.lines[-5:])
        assert self.lines[-1:] == ["closed"], (self.name, self.lines[-5:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Group:
    def __init__(
        self, group_id: str, strategy: str, bootstrap: str, logs: Path, members: int
    ) -> None:
        self.id = group_id
        self._args = (bootstrap, group_id, strategy)
        self._logs = logs
        self.revoked = threading.Event()  # some member revoked since the last clear()
        self.members: list[Member] = []
        for _ in range(members):
            self.add()

    def add(self) -> None:
        """Start one more member."""
        i = len(self.members)
        log = self._logs / f"{self.id}-{i}.log"
        self.members.append(Member(*self._args, f"{self.id}/{i}", log, self.revoked))

    def acked_commits(self, before: float = float("inf"), after: float = float("-inf")) -> dict:
        """partition -> the highest offset whose commit was acknowledged in (after, before)."""
        best: dict[int, int] = {}
        for m in self.members:
            with m.lock:
                for at, p, offset in m.commits:
                    if after < at < before:
                        best[p] = max(best.get(p, -1), offset)
        return best

    def values(self) -> set[str]:
        out: set[str] = set()
        for m in self.members:
            with m.lock:
                out |= m.values
        return out

    def owned(self) -> list[int]:
        out: list[int] = []
        for m in self.members:
            with m.lock:
                out += m.assigned
        return sorted(out)

    def balanced(self) -> bool:
        """Every partition owned once, every member holding its share."""
        share = PARTITIONS // len(self.members)
        return self.owned() == list(range(PARTITIONS)) and all(
            len(m.assigned) == share for m in self.members
        )

    def summary(self, since: float) -> str:
        """What the members went through after ``since``: rebalance callbacks and commits."""
        counts: dict[str, int] = {}
        for m in self.members:
            with m.lock:
                for at, word in m.events:
                    if at > since:
                        counts[word] = counts.get(word, 0) + 1
        return f"{self.id} {dict(sorted(counts.items()))}"

    def tail(self) -> str:
        return "; ".join(f"{m.name}: {m.assigned} {m.lines[-4:]}" for m in self.members)


# -- the cluster ---------------------------------------------------------------------
def wait_until(condition: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    """Poll ``condition`` (it makes requests or reads shared state) until it returns
    something truthy, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        got = condition()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)  # between polls of the condition


def find_coordinator(cluster: Cluster, group: str) -> int | None:
    """The node FindCoordinator names for ``group`` (asked of the running brokers)."""
    info = admin_call(cluster, lambda a: a._run(a._a._cluster.find_coordinator(group)))
    return info.node_id if info is not None else None


def end_offsets(cluster: Cluster) -> dict[int, int] | None:
    def ends(admin: Admin) -> dict[int, int]:
        desc = admin.describe_topics([TOPIC])[TOPIC]
        return {p.partition: p.log_end_offset for p in desc.partitions}

    return admin_call(cluster, ends)


class OffsetReads:
    """Reads of a group's committed offsets, each checked against the commits that were
    acknowledged before it began: an acknowledged commit must never be rolled back."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.count = 0

    def read(self, group: Group) -> dict[int, int] | None:
        began = time.monotonic()
        got = admin_call(self.cluster, lambda a: a.group_offsets(group.id))
        if got is None:
            return None
        offsets = {p: c.offset for (t, p), c in got.items() if t == TOPIC and c is not None}
        floor = group.acked_commits(before=began)
        behind = {p: (offsets.get(p), o) for p, o in floor.items() if offsets.get(p, -1) < o}
        assert not behind, f"{group.id}: acknowledged commits rolled back (read, acked): {behind}"
        self.count += 1
        return offsets


# -- the test ------------------------------------------------------------------------
def wait_for_progress(g: Group, reads: OffsetReads, since: float, what: str) -> None:
    """Every partition gets a commit acknowledged after ``since`` beyond the highest one
    acknowledged before it; the group's offsets are read (and checked) meanwhile."""
    before = g.acked_commits(before=since)

    def progressed() -> bool:
        reads.read(g)  # reads go on throughout: none may go backwards
        after = g.acked_commits(after=since)
        return all(after.get(p, -1) > before.get(p, -1) for p in range(PARTITIONS))

    wait_until(progressed, f"{g.id}: commits in every partition {what}; {g.tail()}")


def same_coordinator_groups(partitions: int) -> dict[str, str]:
    """A group id per kind, all hashing to the same ``__consumer_offsets`` partition."""
    target = coordinator_partition("classic-0", partitions)
    ids = {"classic": "classic-0"}
    i = 0
    while coordinator_partition(f"kip848-{i}", partitions) != target:
        i += 1
    ids["kip848"] = f"kip848-{i}"
    return ids


@pytest.mark.parametrize("when", ["steady", "rebalancing"])
def test_group_coordinator_kill9_under_confluent_groups(tmp_path: Path, when: str) -> None:
    if os.environ.get("LOGMQ_FAULTS_CLUSTER") == "0":
        pytest.skip("LOGMQ_FAULTS_CLUSTER=0")
    cluster = Cluster(
        3,
        tmp_path,
        proxied=False,
        extra_args=[
            *GROUP_OPTIONS,
            "--offsets-topic-partitions", str(OFFSETS_PARTITIONS),
            # __consumer_offsets takes the broker-wide default: RF 3 needs 2 in sync
            "--topic-config", "min.insync.replicas=2",
        ],
    )  # fmt: skip
    groups: list[Group] = []
    producer: ProducerThread | None = None
    cluster.start()
    try:
        kafka = ",".join(cluster.node(n).kafka_bootstrap for n in cluster.ids)
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})
        ids = same_coordinator_groups(OFFSETS_PARTITIONS)
        # the first FindCoordinator creates __consumer_offsets, with every broker up: RF 3
        victim = wait_until(lambda: find_coordinator(cluster, ids["classic"]), "a coordinator")
        wait_until(lambda: all_in_sync(cluster, [TOPIC, OFFSETS_TOPIC]), "3 replicas in sync")
        assert find_coordinator(cluster, ids["kip848"]) == victim
        configs = admin_call(cluster, lambda a: a.describe_configs([OFFSETS_TOPIC]))
        assert configs[OFFSETS_TOPIC]["min.insync.replicas"].value == "2"

        producer = ProducerThread(kafka).start()
        first = CONSUMERS if when == "steady" else CONSUMERS - 1
        groups = [
            Group(ids[kind], STRATEGIES[kind], kafka, tmp_path, first)
            for kind in ("classic", "kip848")
        ]
        reads = OffsetReads(cluster)

        for g in groups:
            wait_until(
                lambda g=g: g.balanced() and len(g.acked_commits()) == PARTITIONS,
                f"{g.id}: every partition owned and committed; {g.tail()}",
            )
            reads.read(g)

        # -- the coordinator of both groups dies ---------------------------------------
        cluster_info = wait_until(
            lambda: admin_call(cluster, lambda a: a._run(a._a.describe_cluster())), "the cluster"
        )
        if when == "rebalancing":  # one more member each; kill once the rebalance is on
            groups[0].revoked.clear()
            for g in groups:
                g.add()
            assert groups[0].revoked.wait(WAIT_S), f"no eager revocation; {groups[0].tail()}"
        killed_at = time.monotonic()
        cluster.kill(victim)
        new = wait_until(
            lambda: (c := find_coordinator(cluster, ids["classic"])) not in (None, victim) and c,
            "a new coordinator",
        )
        assert find_coordinator(cluster, ids["kip848"]) == new
        for g in groups:
            # the first read from the new coordinator has every acknowledged commit
            assert wait_until(lambda g=g: reads.read(g), f"{g.id}'s offsets after the kill")
        for g in groups:
            wait_until(g.balanced, f"{g.id}: a balanced group after the kill; {g.tail()}")
            wait_for_progress(g, reads, since=killed_at, what="after the kill")
        recovered_s = time.monotonic() - killed_at

        # -- the killed broker comes back, and leads again (a clean handover) ----------
        cluster.restart(victim)
        wait_until(lambda: all_in_sync(cluster, [TOPIC, OFFSETS_TOPIC]), f"{victim} in sync")
        handed_at = time.monotonic()
        wait_until(  # preferred replicas lead again
            lambda: admin_call(cluster, lambda a: a.elect_leaders()) is not None, "an election"
        )
        wait_until(lambda: find_coordinator(cluster, ids["classic"]) == victim, "the handback")
        for g in groups:
            wait_for_progress(g, reads, since=handed_at, what="after the handback")

        # -- the producer stops; everything is read and committed ----------------------
        producer.stop()
        assert producer.left == 0 and not producer.failed, (producer.left, producer.failed[:5])
        sent = producer.values()
        ends = wait_until(lambda: end_offsets(cluster), "the end offsets")
        assert ends == {p: len(producer.acked[p]) for p in range(PARTITIONS)}, ends
        for g in groups:
            wait_until(lambda g=g: sent <= g.values(), f"{g.id}: every record consumed")
            wait_until(lambda g=g: reads.read(g) == ends, f"{g.id}: commits at the end offsets")
        summary = [g.summary(killed_at) for g in groups]
    finally:
        if producer is not None and producer._thread.is_alive():
            producer.stop()
        try:
            for g in groups:
                for m in g.members:
                    m.stop()
        finally:
            for g in groups:
                for m in g.members:
                    m.kill()
            cluster.close()
    print(
        f"{when}: coordinator {victim} (controller {cluster_info['controller_id']}) -> {new} -> "
        f"{victim}; both groups committing in every partition {recovered_s:.1f}s after the "
        f"kill; {len(sent)} records; {reads.count} offset reads; after the kill: "
        + "; ".join(summary)
    )
