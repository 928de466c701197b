"""logmq's own transactional producer when its coordinator dies or freezes (issue 29).

Three real brokers (the fault harness's ``Cluster``), an output topic and
``__transaction_state`` with replication factor 3 and min.insync.replicas=2. The native
``Producer(transactional_id=...)`` runs transactions while the broker coordinating
its id is killed with kill -9 at each step of a transaction (open with records on
the brokers, between transactions, before the first send), and while it is frozen
with SIGSTOP. Its coordinator requests must find the new coordinator and carry on:
what was committed is read once and in order with read_committed, what was aborted
never; nothing is left open.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import pytest

from logmq import Admin, Consumer, Producer
from logmq.errors import RequestTimedOutError
from tests.faults.cluster_checks import admin_call, all_in_sync
from tests.faults.processes import Cluster, wait_for
from tests.faults.txn_history import OPEN_STATES

pytestmark = pytest.mark.skipif(
    os.environ.get("LOGMQ_FAULTS_CLUSTER") == "0", reason="LOGMQ_FAULTS_CLUSTER=0"
)

TOPIC = "ntx-out"
PARTITIONS = 3
WAIT_S = 60.0
BROKER_OPTIONS = [
    "--transaction-state-partitions", "3",
    "--offsets-topic-partitions", "3",
    "--topic-config", "min.insync.replicas=2",
]  # fmt: skip


def coordinator_of(cluster: Cluster, txn_id: str) -> int:
    """The broker coordinating ``txn_id`` now (DescribeTransactions names it)."""

    def ask(admin: Admin) -> int | None:
        [desc] = admin.describe_transactions([txn_id])
        return desc.coordinator_id if desc.coordinator_id in cluster.running() else None

    return wait_for(lambda: admin_call(cluster, ask), f"the coordinator of {txn_id}", WAIT_S)


def no_open_transactions(cluster: Cluster) -> bool:
    listed = admin_call(cluster, lambda a: a.list_transactions())
    return listed is not None and not any(t.state in OPEN_STATES for t in listed)


def read_committed(bootstrap: str) -> dict[int, list[bytes]]:
    """Every partition's records up to its end, at read_committed."""
    got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    with Consumer(bootstrap, auto_offset_reset="earliest", isolation_level="read_committed") as c:
        tps = [(TOPIC, p) for p in range(PARTITIONS)]
        c.assign(tps)
        ends = c.end_offsets(tps)
        deadline = time.monotonic() + WAIT_S
        while any(c.position(TOPIC, p) < ends[(TOPIC, p)] for p in range(PARTITIONS)):
            assert time.monotonic() < deadline, "read_committed did not reach the ends"
            for r in c.poll(0.5):
                got[r.partition].append(r.value)
    return got


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(3, tmp_path, proxied=False, extra_args=BROKER_OPTIONS)
    with c:
        with Admin(c.bootstrap) as admin:
            admin.create_topic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})
        yield c


def one_transaction(p: Producer, tag: str, n: int = 9) -> list[bytes]:
    p.begin_transaction()
    values = [f"{tag}-{i}".encode() for i in range(n)]
    for i, v in enumerate(values):
        p.send(TOPIC, v, partition=i % PARTITIONS)
    return values


@contextlib.contextmanager
def coordinator_killed(cluster: Cluster, txn_id: str) -> Iterator[None]:
    """kill -9 the coordinator of ``txn_id`` for the body; then restart it and wait
    until every replica is back in sync."""
    victim = coordinator_of(cluster, txn_id)
    cluster.kill(victim)
    yield
    cluster.restart(victim)
    wait_for(lambda: all_in_sync(cluster, [TOPIC, "__transaction_state"]), "ISR of 3", WAIT_S)


def try_commit(p: Producer) -> bool:
    """commit_transaction(), False when it timed out (it may be called again)."""
    try:
        p.commit_transaction()
    except RequestTimedOutError:
        return False
    return True


@pytest.mark.timeout(400)
def test_native_transactions_survive_coordinator_kills(cluster):
    tid = "native-failover"
    committed: list[bytes] = []
    aborted: list[bytes] = []
    with Producer(cluster.bootstrap, transactional_id=tid, request_timeout_ms=30_000) as p:
        p.init_transactions()  # creates __transaction_state while all three run: RF 3
        committed += one_transaction(p, "warm")
        p.commit_transaction()
        wait_for(lambda: all_in_sync(cluster, [TOPIC, "__transaction_state"]), "ISR of 3", WAIT_S)

        # 1. open, its records on the brokers: the coordinator dies, commit carries on
        values = one_transaction(p, "open-commit")
        p.flush()
        with coordinator_killed(cluster, tid):
            p.commit_transaction()
        committed += values

        # 2. the same for an abort
        values = one_transaction(p, "open-abort")
        p.flush()
        with coordinator_killed(cluster, tid):
            p.abort_transaction()
        aborted += values

        # 3. between transactions: the next one's AddPartitionsToTxn finds the new one
        with coordinator_killed(cluster, tid):
            committed += one_transaction(p, "after-kill")
            p.commit_transaction()

    # 4. frozen: a producer with a short request timeout times out on commit, stays
    # committable, and a second call commits once the cluster has moved on
    frozen_id = "native-frozen"
    with Producer(cluster.bootstrap, transactional_id=frozen_id, request_timeout_ms=2_000) as p:
        p.init_transactions()
        values = one_transaction(p, "frozen")
        p.flush()
        victim = coordinator_of(cluster, frozen_id)
        cluster.pause(victim)
        try:
            with pytest.raises(RequestTimedOutError):
                p.commit_transaction()
            wait_for(
                lambda: coordinator_of(cluster, frozen_id) != victim, "a new coordinator", WAIT_S
            )
            wait_for(lambda: try_commit(p), "a commit through the new coordinator", WAIT_S)
            committed += values
        finally:
            cluster.resume(victim)

    wait_for(lambda: no_open_transactions(cluster), "every transaction ended", WAIT_S)
    got = read_committed(cluster.bootstrap)
    for part in range(PARTITIONS):
        want = [v for v in committed if int(v.rsplit(b"-", 1)[1]) % PARTITIONS == part]
        assert got[part] == want, f"partition {part}"
    seen = {v for vs in got.values() for v in vs}
    assert not seen & set(aborted)
