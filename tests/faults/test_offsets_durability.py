"""Acknowledged offset commits survive the loss of their coordinator (issue 12).

Real ``logmq-server`` processes, RF=3 ``__consumer_offsets``:

* Both followers of a group's offsets partition are paused (SIGSTOP) while the group
  commits, the coordinator is killed -9, the followers resume and take over: every
  commit that was acknowledged is readable afterwards. (Before the fix, commits were
  acknowledged after a local fsync only and vanished with the coordinator.)
* A running group's coordinator is killed -9: the group goes on with the new one, every
  acknowledged commit is readable afterwards, and a new member resumes from it.

The coordinator is chosen to be a broker other than the controller, so the paused
followers hold the controller and nothing can shrink the ISR while they are stopped.
"""

from __future__ import annotations

import time
from pathlib import Path

from logmq import Admin, Consumer, Producer
from logmq.client.admin import NewTopic
from logmq.errors import LogMQError
from logmq.group import OFFSETS_TOPIC, coordinator_partition
from tests.faults.processes import Cluster, wait_for

TOPIC = "events"
COMMIT_TIMEOUT_MS = 1_000  # --offsets-commit-timeout-ms: unreplicated commits fail fast


def start_cluster(tmp_path: Path) -> Cluster:
    cluster = Cluster(
        3,
        tmp_path,
        proxied=False,
        extra_args=["--offsets-commit-timeout-ms", str(COMMIT_TIMEOUT_MS)],
    )
    return cluster.start()


def group_led_off_the_controller(admin: Admin) -> tuple[str, int, int]:
    """(group id, offsets partition, its leader) with a leader that is not the controller."""
    admin.commit_group_offsets("warm-up", {(TOPIC, 0): 0})  # creates __consumer_offsets
    controller = admin._run(admin._a.describe_cluster())["controller_id"]
    partitions = admin.describe_topics([OFFSETS_TOPIC])[OFFSETS_TOPIC].partitions
    leaders = {p.partition: p.leader for p in partitions}
    for i in range(1000):
        group = f"group-{i}"
        partition = coordinator_partition(group, len(leaders))
        if leaders[partition] not in (controller, -1):
            return group, partition, leaders[partition]
    raise AssertionError(f"every offsets partition is led by the controller {controller}")


def read_offsets(bootstrap: str, group: str, timeout: float = 60.0) -> dict:
    """The group's committed offsets once some coordinator answers (retriable errors retried)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with Admin(bootstrap, request_timeout_ms=5_000) as admin:
                return {tp: c.offset for tp, c in admin.group_offsets(group).items() if c}
        except (LogMQError, OSError, TimeoutError) as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"offsets of {group!r} unreadable: {exc}") from exc
            time.sleep(0.2)  # backoff between retries of a failing request


def test_commits_acknowledged_while_followers_are_paused_survive_the_coordinator(
    tmp_path: Path,
) -> None:
    cluster = start_cluster(tmp_path)
    try:
        with Admin(cluster.bootstrap) as admin:
            admin.create_topics([NewTopic(TOPIC, 1, 3)])
            group, _, leader = group_led_off_the_controller(admin)
            admin.commit_group_offsets(group, {(TOPIC, 0): 10})  # replicated: acknowledged
        followers = [n for n in cluster.ids if n != leader]
        for node in followers:
            cluster.pause(node)
        acked = [10]
        refused = 0
        with Admin(cluster.node(leader).bootstrap, request_timeout_ms=3_000) as admin:
            for offset in range(11, 16):
                try:
                    admin.commit_group_offsets(group, {(TOPIC, 0): offset})
                    acked.append(offset)
                except LogMQError as exc:
                    assert exc.retriable, exc
                    refused += 1
        cluster.kill(leader)
        for node in followers:
            cluster.resume(node)
        live = ",".join(cluster.node(n).bootstrap for n in followers)
        offsets = read_offsets(live, group)
        assert offsets.get((TOPIC, 0), -1) >= max(acked), (offsets, acked)
        # With both followers stopped nothing can be replicated: no commit may be acked.
        assert refused == 5, f"commits acknowledged without their followers: {acked}"
        # The killed coordinator comes back as a follower and agrees.
        cluster.restart(leader)
        assert read_offsets(cluster.bootstrap, group).get((TOPIC, 0), -1) >= max(acked)
    finally:
        cluster.close()


def test_coordinator_kill9_under_a_running_group_keeps_every_acknowledged_commit(
    tmp_path: Path,
) -> None:
    cluster = start_cluster(tmp_path)
    records = 300
    try:
        with Admin(cluster.bootstrap) as admin:
            admin.create_topics([NewTopic(TOPIC, 2, 3, {"min.insync.replicas": "2"})])
            group, _, leader = group_led_off_the_controller(admin)
        with Producer(cluster.bootstrap, acks="all") as producer:
            for i in range(records):
                producer.send(TOPIC, str(i).encode(), partition=i % 2)
            producer.flush()
        acked: dict[tuple[str, int], int] = {}
        consumed: dict[tuple[str, int], int] = {}
        killed = False
        consumer = Consumer(
            cluster.bootstrap,
            group_id=group,
            topics=[TOPIC],
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=6_000,
            request_timeout_ms=5_000,
        )
        try:
            deadline = time.monotonic() + 90
            while sum(acked.values()) < records:
                assert time.monotonic() < deadline, f"stuck: acked {acked}, consumed {consumed}"
                for record in consumer.poll(timeout=0.5, max_records=20):
                    consumed[(record.topic, record.partition)] = record.offset + 1
                if not consumed:
                    continue
                positions = dict(consumed)
                try:
                    consumer.commit(positions)
                except LogMQError as exc:
                    assert exc.retriable or "fenced" in str(exc), exc
                    continue
                acked.update(positions)
                if not killed and sum(acked.values()) >= records // 3:
                    cluster.kill(leader)  # the group's coordinator
                    killed = True
        finally:
            consumer.close()
        assert killed
        live = ",".join(cluster.node(n).bootstrap for n in cluster.ids if n != leader)
        offsets = read_offsets(live, group)
        for tp, offset in acked.items():
            assert offsets.get(tp, -1) >= offset, (tp, offsets, acked)
        # A new member resumes exactly where the group's commits say.
        with Producer(live, acks="all") as producer:
            for i in range(10):
                producer.send(TOPIC, b"after", partition=i % 2)
            producer.flush()
        first: dict[tuple[str, int], int] = {}

        def read_both() -> bool:
            for record in resumed.poll(timeout=0.5):
                first.setdefault((record.topic, record.partition), record.offset)
            return len(first) == 2

        with Consumer(
            live, group_id=group, topics=[TOPIC], auto_offset_reset="earliest"
        ) as resumed:
            wait_for(read_both, "the resumed member to read both partitions", timeout=60)
        assert first == {tp: offsets[tp] for tp in first}, (first, offsets)
    finally:
        cluster.close()
