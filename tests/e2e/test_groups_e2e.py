"""Consumer groups end to end: a real broker and consumer processes (group_worker.py).

Members join, leave and are killed with SIGKILL while records are produced; every
produced record is processed at least once, lag ends at 0 after the final commits, and
a second group receives everything too. A member stopped past its session timeout
(SIGSTOP) finds its commit refused once it runs again. A static member's restart moves
no partition and leaves the group epoch alone.
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

import pytest

from logmq import Admin, Producer
from logmq.errors import ErrorCode, LogMQError
from tests.harness import BrokerProcess

ROOT = Path(__file__).resolve().parents[2]
BROKER_ARGS = [
    "--offsets-topic-partitions",
    "4",
    "--group-min-session-timeout-ms",
    "500",
    "--group-heartbeat-interval-ms",
    "200",
]


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> object:
    """Re-check ``condition`` until it holds (returning its value) or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class Worker:
    """One ``group_worker`` process and the file it reports to."""

    def __init__(self, broker, group, topic, out: Path, *args: str) -> None:
        self.out = out
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.e2e.group_worker",
                broker.bootstrap,
                group,
                topic,
                str(out),
                *args,
            ],
            stdin=subprocess.PIPE,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )

    def lines(self) -> list[str]:
        try:
            text = self.out.read_text()
        except FileNotFoundError:
            return []
        return text.split("\n")[:-1]  # a torn last line is not done yet

    def values(self) -> set[int]:
        return {int(line.split()[3]) for line in self.lines() if line.startswith("R ")}

    def has(self, prefix: str) -> bool:
        return any(line.startswith(prefix) for line in self.lines())

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()

    def close(self, timeout: float = 30) -> None:
        """Graceful: commit, leave, exit 0."""
        self.send("close")
        assert self.proc.wait(timeout) == 0
        assert self.has("CLOSED")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdin is not None:
            self.proc.stdin.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("groups-e2e") / "data", extra_args=BROKER_ARGS)
    b.start()
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def admin(broker):
    with Admin(broker.bootstrap) as a:
        yield a


@pytest.fixture
def workers(broker, tmp_path):
    started: list[Worker] = []
    names = iter(range(1000))

    def start(group: str, topic: str, *args: str) -> Worker:
        w = Worker(broker, group, topic, tmp_path / f"worker-{next(names)}.log", *args)
        started.append(w)
        return w

    yield start
    for w in started:
        w.cleanup()


def describe(admin, group: str):
    """The group's description, or None before its first member joined."""
    try:
        return admin.describe_group(group)
    except LogMQError as e:
        if e.code is ErrorCode.GROUP_ID_NOT_FOUND:
            return None
        raise


def members(admin, group: str) -> dict[str, list[tuple[str, int]]]:
    """member id -> owned partitions."""
    d = describe(admin, group)
    return {} if d is None else {m.member_id: m.assignment for m in d.members}


def stable(admin, group: str, sizes: list[int]):
    """The description when the group is stable with members owning ``sizes`` partitions."""
    d = describe(admin, group)
    if d is None:
        return None
    owned = sorted(len(m.assignment) for m in d.members if not m.left_temporarily)
    if d.state == "stable" and owned == sorted(sizes):
        return d
    return None


class Production:
    """Produces the integers 0.. to a topic from a thread until stopped."""

    def __init__(self, broker, topic: str) -> None:
        self.count = 0
        self._stop = threading.Event()
        self._producer = Producer(broker.bootstrap, linger_ms=2)
        self._topic = topic
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for _ in range(50):
                self._producer.send(self._topic, str(self.count).encode(), key=str(self.count))
                self.count += 1
            self._producer.flush()
            self._stop.wait(0.01)  # pacing, so membership changes happen mid-stream

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self._producer.flush()
        self._producer.close()
        return self.count


def test_members_come_and_go_and_every_record_is_processed(broker, admin, workers):
    topic = "orders"
    admin.create_topic(topic, 6)
    production = Production(broker, topic)
    try:
        w1 = workers("g1", topic)
        w2 = workers("g1", topic)
        other = workers("g2", topic)  # a second group reads the same records
        wait_for(lambda: stable(admin, "g1", [3, 3]), 30, "two members sharing 6 partitions")
        w3 = workers("g1", topic)
        wait_for(lambda: stable(admin, "g1", [2, 2, 2]), 30, "the third member's share")
        w2.kill()  # no leave, no commit: its session expires
        wait_for(lambda: stable(admin, "g1", [3, 3]), 30, "the crashed member's expiry")
        w1.close()
        wait_for(lambda: stable(admin, "g1", [6]), 30, "the closed member's partitions")
        w4 = workers("g1", topic)
        wait_for(lambda: stable(admin, "g1", [3, 3]), 30, "the fourth member's share")
    finally:
        total = production.stop()
    assert total > 0
    produced = set(range(total))

    group1 = [w1, w2, w3, w4]
    wait_for(
        lambda: set().union(*(w.values() for w in group1)) >= produced,
        60,
        "group g1 to process every record",
    )
    wait_for(lambda: other.values() >= produced, 60, "group g2 to process every record")
    for w in (w3, w4, other):
        w.close()
    # At least once: everything, possibly some twice (the crash, the revocations).
    assert set().union(*(w.values() for w in group1)) == produced
    assert other.values() == produced
    for group in ("g1", "g2"):
        d = admin.describe_group(group)
        assert d.members == []
        assert len(d.partitions) == 6
        for p in d.partitions:
            assert p.committed_offset == p.log_end_offset, p
            assert p.lag == 0
    assert {g.group_id for g in admin.list_groups()} >= {"g1", "g2"}


def test_zombie_commit_is_rejected(broker, admin, workers):
    topic = "zombies"
    admin.create_topic(topic, 2)
    with Producer(broker.bootstrap) as p:
        for i in range(100):
            p.send(topic, str(i).encode(), partition=i % 2)
    zombie = workers("g3", topic, "--manual-commit", "--session-timeout-ms", "1500")
    wait_for(lambda: zombie.has("POLLED"), 30, "the zombie-to-be to consume")
    zombie.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: not members(admin, "g3"), 30, "the stopped member's expiry")
        live = workers("g3", topic)
        wait_for(lambda: stable(admin, "g3", [2]), 30, "the live member to take over")
        wait_for(lambda: live.values() >= set(range(100)), 30, "the live member to consume")
    finally:
        zombie.signal(signal.SIGCONT)
    zombie.send("commit")
    wait_for(lambda: zombie.has("COMMIT"), 30, "the zombie's commit")
    outcome = [line for line in zombie.lines() if line.startswith("COMMIT")]
    assert outcome[0].startswith("COMMIT-FAILED CommitFailedError"), outcome
    assert zombie.has("LOST")  # its partitions were dropped without a commit
    live.close()
    zombie.close()
    committed = admin.group_offsets("g3")
    assert {tp: o.offset for tp, o in committed.items()} == {(topic, 0): 50, (topic, 1): 50}


def test_static_member_restart_moves_nothing(broker, admin, workers):
    topic = "static"
    admin.create_topic(topic, 6)
    session = ["--session-timeout-ms", "10000"]
    by_instance = {name: workers("g4", topic, "--instance-id", name, *session) for name in "abc"}
    before = wait_for(lambda: stable(admin, "g4", [2, 2, 2]), 30, "three static members")
    owned = {m.instance_id: m.assignment for m in before.members}

    def unchanged_except(instance: str):
        d = admin.describe_group("g4")
        assert d.group_epoch == before.group_epoch
        now = {m.instance_id: m for m in d.members}
        for name, parts in owned.items():
            if name != instance:
                assert now[name].assignment == parts, (name, now[name])
        return d

    # A clean restart: the member leaves temporarily (epoch -2), its partitions wait.
    by_instance["b"].close()
    d = unchanged_except("b")
    gone = next(m for m in d.members if m.instance_id == "b")
    assert gone.left_temporarily
    restarted = workers("g4", topic, "--instance-id", "b", *session)
    wait_for(lambda: restarted.has("ASSIGNED"), 30, "the restarted member's partitions")
    first = next(line for line in restarted.lines() if line.startswith("ASSIGNED"))
    assert first == "ASSIGNED " + " ".join(str(p) for _, p in owned["b"])
    d = unchanged_except("b")
    assert next(m for m in d.members if m.instance_id == "b").assignment == owned["b"]

    # A crash and a restart within the session timeout: the same.
    by_instance["c"].kill()
    again = workers("g4", topic, "--instance-id", "c", *session)
    wait_for(lambda: again.has("ASSIGNED"), 30, "the crashed member's partitions")
    d = unchanged_except("c")
    assert next(m for m in d.members if m.instance_id == "c").assignment == owned["c"]
    assert len(d.members) == 3
    for w in (by_instance["a"], restarted, again):
        w.close()
