"""A Kafka client through a leader's kill -9: librdkafka's idempotent producer, acks=all.

A 3-broker cluster (the fault harness's ``Cluster``: real ``logmq-server`` processes,
one metadata quorum), a topic with replication factor 3 and min.insync.replicas=2. A
confluent-kafka producer (enable.idempotence, acks=all) sends unique values from a
thread, round-robin over the partitions; every send and every delivery report goes
into the harness's History. Once records are acknowledged the leader of partition 0 is
killed with SIGKILL; the producer must go on (new acknowledgements for that partition,
from the new leader), the killed broker comes back, and then the History checker
judges the final log read by the harness (and a confluent-kafka consumer's read of
it): no acknowledged record lost or moved, none written twice, per-partition order
kept, and every send acknowledged (nothing failed, nothing timed out).

Every wait is a condition with a deadline (a threading.Condition the delivery reports
signal, or a poll of the cluster's metadata); the producer's pacing is its own poll.
``LOGMQ_FAULTS_CLUSTER=0`` skips it, like the other replicated fault tests.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from logmq import Admin
from logmq.errors import LogMQError
from tests.faults.history import HEAL, INJECT, History, Status
from tests.faults.processes import Cluster
from tests.faults.workload import ensure_topic, final_read

ck = pytest.importorskip("confluent_kafka")

TOPIC = "ck-failover"
PARTITIONS = 3
VICTIM_PARTITION = 0  # its leader is killed
CLIENT = "ck-producer"

ACKED_BEFORE_KILL = 300  # acknowledged records (all partitions) before the kill
ACKED_AFTER_KILL = 150  # acknowledged sends made after the kill, in the victim partition
ACKED_AFTER_RESTART = 150  # ... and after the killed broker is back, in every partition
PACE_S = 0.002  # the producer thread's poll between sends: ~500 sends/s
MESSAGE_TIMEOUT_MS = 60_000  # a send may ride out the failover for this long
WAIT_S = 30.0  # deadline of each wait for progress


class KafkaProducerLoad:
    """One confluent-kafka producer in a thread, every send recorded into a History.

    The thread sends unique values (``ck-00000042``) round-robin over the partitions
    and serves delivery reports in its own ``poll``; the History is touched only under
    ``self.cond``, which every report notifies, so the test thread waits on conditions
    over it (``wait``) without sleeping.
    """

    def __init__(self, bootstrap: str, history: History, clock: Callable[[], int]) -> None:
        self.history = history
        self.clock = clock
        self.cond = threading.Condition()
        self.errors: list[Any] = []  # what librdkafka's error_cb reported
        self.left: int | None = None  # messages flush() could not deliver
        self._stop = threading.Event()
        self.producer = ck.Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": CLIENT,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": MESSAGE_TIMEOUT_MS,
                "request.timeout.ms": 5_000,
                "retry.backoff.ms": 50,
                "retry.backoff.max.ms": 500,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 500,
                "error_cb": self._on_error,
            }
        )
        self._thread = threading.Thread(target=self._run, name=CLIENT, daemon=True)

    # -- the producer thread ---------------------------------------------------------
    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            self._send(n)
            n += 1
            self.producer.poll(PACE_S)  # serves delivery reports; paces the sends
        self.left = self.producer.flush(MESSAGE_TIMEOUT_MS / 1000 + 10)
        self.producer.close()  # librdkafka's threads stop before the cluster does

    def _send(self, n: int) -> None:
        value = f"ck-{n:08d}".encode()
        partition = n % PARTITIONS
        with self.cond:
            aid = self.history.attempt(CLIENT, TOPIC, partition, value, self.clock())

        def report(err: Any, msg: Any) -> None:
            with self.cond:
                if err is None:
                    self.history.acked(aid, msg.offset(), self.clock())
                else:
                    self.history.unknown(aid, str(err), self.clock())
                self.cond.notify_all()

        try:
            self.producer.produce(TOPIC, value=value, partition=partition, on_delivery=report)
        except BufferError as e:  # the local queue is full: never handed to librdkafka
            with self.cond:
                self.history.failed(aid, repr(e), self.clock())

    def _on_error(self, err: Any) -> None:
        with self.cond:
            self.errors.append(err)

    # -- the test thread -------------------------------------------------------------
    def start(self) -> KafkaProducerLoad:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sending and wait for the outcome of everything sent (flush)."""
        self._stop.set()
        self._thread.join(MESSAGE_TIMEOUT_MS / 1000 + 30)
        assert not self._thread.is_alive(), "the producer thread did not finish its flush"

    def mark(self) -> int:
        """A point in the send sequence: ``acked_since`` counts from there."""
        with self.cond:
            return len(self.history.attempts)

    def acked_since(self, mark: int, partition: int | None = None) -> int:
        """Acknowledged sends made at or after ``mark`` (in ``partition`` if given);
        call holding ``self.cond`` (``wait``'s conditions do)."""
        return sum(
            1
            for a in self.history.attempts[mark:]
            if a.status is Status.ACKED and (partition is None or a.partition == partition)
        )

    def wait(self, condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
        with self.cond:
            if not self.cond.wait_for(condition, timeout):
                raise AssertionError(f"timed out after {timeout}s waiting for {what}; {self}")

    def __str__(self) -> str:
        stats = {s.value: 0 for s in Status}
        for a in self.history.attempts:
            stats[a.status.value] += 1
        return f"producer sends {stats}, client errors {[str(e) for e in self.errors[-5:]]}"


def describe(cluster: Cluster) -> dict[int, tuple[int, list[int]]] | None:
    """partition -> (leader, isr) as the running brokers see it; None if none answers."""
    live = [cluster.node(n).bootstrap for n in cluster.running()]
    try:
        with Admin(",".join(live), request_timeout_ms=2_000) as admin:
            desc = admin.describe_topics([TOPIC])[TOPIC]
    except (LogMQError, OSError, TimeoutError):
        return None
    return {p.partition: (p.leader, sorted(p.isr)) for p in desc.partitions}


def wait_state(
    cluster: Cluster, condition: Callable[[dict[int, tuple[int, list[int]]]], bool], what: str
) -> dict[int, tuple[int, list[int]]]:
    """Poll the cluster's metadata until ``condition`` holds, or fail at the deadline."""
    deadline = time.monotonic() + WAIT_S
    state = None
    while True:
        state = describe(cluster)
        if state is not None and condition(state):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {WAIT_S}s waiting for {what}; last: {state}")
        time.sleep(0.05)  # between metadata polls


def kafka_read(bootstrap: str, history: History, clock: Callable[[], int]) -> dict:
    """Every partition from its beginning to its high watermark with a confluent-kafka
    consumer (assign, no group); each record also goes into the History as a read."""
    consumer = ck.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        ends = {
            p: consumer.get_watermark_offsets(ck.TopicPartition(TOPIC, p), 10)[1]
            for p in range(PARTITIONS)
        }
        consumer.assign(
            [ck.TopicPartition(TOPIC, p, ck.OFFSET_BEGINNING) for p in range(PARTITIONS)]
        )
        got: dict[int, dict[int, bytes]] = {p: {} for p in range(PARTITIONS)}
        deadline = time.monotonic() + WAIT_S
        while any(len(got[p]) < ends[p] for p in range(PARTITIONS)):
            counts = {p: len(r) for p, r in got.items()}
            assert time.monotonic() < deadline, f"kafka read {counts} of {ends}"
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got[msg.partition()][msg.offset()] = msg.value()
            history.read("ck-consumer", TOPIC, msg.partition(), msg.offset(), msg.value(), clock())
        return got
    finally:
        consumer.close()


def test_idempotent_kafka_producer_rides_out_a_leader_kill(tmp_path: Path) -> None:
    if os.environ.get("LOGMQ_FAULTS_CLUSTER") == "0":
        pytest.skip("LOGMQ_FAULTS_CLUSTER=0")
    cluster = Cluster(3, tmp_path)
    t0 = time.monotonic()

    def clock() -> int:
        return int((time.monotonic() - t0) * 1000)

    history = History()
    cluster.start()
    try:
        kafka_bootstrap = ",".join(cluster.node(n).kafka_bootstrap for n in cluster.ids)
        asyncio.run(
            ensure_topic(cluster.bootstrap, TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})
        )
        wait_state(
            cluster,
            lambda s: all(len(isr) == 3 for _, isr in s.values()),
            "every replica in sync",
        )
        load = KafkaProducerLoad(kafka_bootstrap, history, clock).start()
        try:
            load.wait(lambda: load.acked_since(0) >= ACKED_BEFORE_KILL, "acks before the kill")

            victim = cluster.leader_of(TOPIC, VICTIM_PARTITION)
            assert victim is not None, "partition 0 has no leader"
            history.nemesis(INJECT, f"kill -9 node {victim}", clock())
            cluster.kill(victim)
            killed_at = load.mark()

            # the producer goes on: sends made after the kill are acknowledged by a new
            # leader of the victim's partition (and by the others' leaders)
            load.wait(
                lambda: load.acked_since(killed_at, VICTIM_PARTITION) >= ACKED_AFTER_KILL,
                f"acks from partition {VICTIM_PARTITION}'s new leader after killing {victim}",
            )
            state = wait_state(
                cluster, lambda s: s[VICTIM_PARTITION][0] not in (-1, victim), "a new leader"
            )
            new_leader = state[VICTIM_PARTITION][0]

            cluster.restart(victim)
            history.nemesis(HEAL, f"restart node {victim}", clock())
            wait_state(
                cluster,
                lambda s: all(len(isr) == 3 for _, isr in s.values()),
                f"node {victim} back in every ISR",
            )
            restarted_at = load.mark()
            load.wait(
                lambda: all(
                    load.acked_since(restarted_at, p) >= ACKED_AFTER_RESTART
                    for p in range(PARTITIONS)
                ),
                "acks in every partition after the restart",
            )
        finally:
            load.stop()

        asyncio.run(final_read(cluster.bootstrap, TOPIC, PARTITIONS, history, WAIT_S))
        kafka_log = kafka_read(kafka_bootstrap, history, clock)
    finally:
        cluster.close()

    result = history.check()
    assert result.ok, f"{result.report()}\n{load}"
    assert load.left == 0, f"{load.left} messages undelivered at flush; {load}"
    assert not [e for e in load.errors if e.fatal()], load  # the idempotent producer lives
    # every send acknowledged: none failed or timed out through the failover
    assert result.stats["acked"] == result.stats["attempts"], f"{result.report()}\n{load}"
    assert result.stats["acked"] >= ACKED_BEFORE_KILL + ACKED_AFTER_KILL + ACKED_AFTER_RESTART
    assert new_leader != victim
    # the Kafka consumer saw exactly the log the harness read
    for p in range(PARTITIONS):
        assert kafka_log[p] == history.final[(TOPIC, p)].records, f"partition {p}"
