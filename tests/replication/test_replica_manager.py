"""Replication through real brokers, replica managers and fetchers on loopback.

A static controller (replica_cluster.py) stands in for the metadata quorum, so these
tests exercise the data path alone: follower fetch, HW, acks=all, ISR shrink/expand,
min.insync.replicas, and truncation by leader epoch across failovers.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from logmq.errors import ErrorCode
from logmq.net.codec import ApiKey
from tests.harness import wait_until
from tests.replication.replica_cluster import ReplicaCluster, produce, values_of

KEY = ("t", 0)


@pytest.fixture
async def make_cluster(tmp_path):
    made: list[ReplicaCluster] = []

    async def make(**kwargs) -> ReplicaCluster:
        cluster = ReplicaCluster(tmp_path, **kwargs)
        made.append(cluster)
        await cluster.start()
        return cluster

    yield make
    for cluster in made:
        await cluster.stop()


def in_sync(cluster: ReplicaCluster, ids) -> bool:
    """Every live node in ``ids`` holds the same bytes and the same HW as the leader."""
    leader = cluster.nodes[cluster.partition.leader]
    start = max(cluster.nodes[i].log(KEY).log_start_offset for i in ids)
    if any(cluster.nodes[i].log(KEY).log_end_offset < start for i in ids):
        return False
    want = leader.log_bytes(start=start)
    hw = leader.log(KEY).high_watermark
    return all(
        cluster.nodes[i].log_bytes(start=start) == want
        and cluster.nodes[i].log(KEY).high_watermark == hw
        for i in ids
    )


async def test_acks_all_replicates_and_advances_the_high_watermark(make_cluster):
    cluster = await make_cluster()
    conn = await cluster.connect(1)
    sent = []
    for i in range(20):
        vals = [f"v{i}-{j}".encode() for j in range(5)]
        error, base = await produce(conn, vals)
        assert error is ErrorCode.NONE
        assert base == i * 5
        # acknowledged means below the leader's HW
        assert cluster.nodes[1].log(KEY).high_watermark >= base + 5
        sent += vals
    conn.close()
    await wait_until(lambda: in_sync(cluster, (1, 2, 3)), what="followers in sync")
    assert values_of(cluster.nodes[3].log_bytes()) == sent
    assert cluster.nodes[2].log(KEY).leader_epochs.entries() == [(0, 0)]
    assert cluster.controller.alter_requests == 0  # nobody fell behind


async def test_follower_fetch_is_fenced_by_epoch_and_consumers_by_leadership(make_cluster):
    cluster = await make_cluster()
    conn = await cluster.connect(2)
    error, _ = await produce(conn, [b"x"], acks=1)
    assert error is ErrorCode.NOT_LEADER_OR_FOLLOWER
    conn.close()
    rm = cluster.nodes[1].rm
    assert rm.follower_fetch(KEY, 2, 0, leader_epoch=-1).error is ErrorCode.FENCED_LEADER_EPOCH
    assert rm.follower_fetch(KEY, 2, 0, leader_epoch=5).error is ErrorCode.UNKNOWN_LEADER_EPOCH
    assert rm.follower_fetch(KEY, 2, 99, leader_epoch=0).error is ErrorCode.OFFSET_OUT_OF_RANGE


async def test_stopped_follower_leaves_the_isr_and_rejoins_when_caught_up(make_cluster):
    cluster = await make_cluster(lag_ms=300)
    await cluster.nodes[3].stop()
    conn = await cluster.connect(1)
    # min.insync.replicas=2: acks=all completes once the ISR drops the stopped follower
    error, _ = await produce(conn, [b"a", b"b"])
    assert error is ErrorCode.NONE
    assert cluster.partition.isr == (1, 2)
    for i in range(10):
        assert (await produce(conn, [f"m{i}".encode()]))[0] is ErrorCode.NONE
    await cluster.nodes[3].start()
    await wait_until(lambda: cluster.partition.isr == (1, 2, 3), what="node 3 back in the ISR")
    await wait_until(lambda: in_sync(cluster, (1, 2, 3)), what="node 3 caught up")
    conn.close()


async def test_min_insync_replicas_before_and_after_append(make_cluster):
    cluster = await make_cluster(lag_ms=300)
    await cluster.nodes[2].stop()
    await cluster.nodes[3].stop()
    conn = await cluster.connect(1)
    # The ISR still names both followers: the append happens, then the ISR shrinks.
    error, _ = await produce(conn, [b"lonely"])
    assert error is ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    assert cluster.partition.isr == (1,)
    error, _ = await produce(conn, [b"refused"])
    assert error is ErrorCode.NOT_ENOUGH_REPLICAS
    assert cluster.nodes[1].log(KEY).log_end_offset == 1  # refused before appending
    error, _ = await produce(conn, [b"acks1"], acks=1)
    assert error is ErrorCode.NONE
    conn.close()


async def test_acks_all_times_out_at_the_request_timeout(make_cluster):
    cluster = await make_cluster()  # lag time 30 s: the ISR keeps the stopped follower
    await cluster.nodes[3].stop()
    conn = await cluster.connect(1)
    error, _ = await produce(conn, [b"slow"], timeout_ms=200)
    assert error is ErrorCode.REQUEST_TIMED_OUT
    conn.close()


async def test_new_leader_truncates_the_old_leaders_divergent_tail(make_cluster):
    cluster = await make_cluster()
    conn = await cluster.connect(1)
    acked = [f"a{i}".encode() for i in range(10)]
    assert (await produce(conn, acked))[0] is ErrorCode.NONE
    await wait_until(lambda: in_sync(cluster, (1, 2, 3)), what="replicated")
    # Followers stop; the leader takes acks=1 writes nobody else has.
    await cluster.nodes[2].stop()
    await cluster.nodes[3].stop()
    for i in range(3):
        assert (await produce(conn, [f"lost{i}".encode()] * 3, acks=1))[0] is ErrorCode.NONE
    conn.close()
    await cluster.nodes[1].stop()
    await cluster.nodes[2].start()
    await cluster.nodes[3].start()
    await cluster.controller.elect(KEY, 2, isr=(2, 3))
    conn = await cluster.connect(2)
    newer = [f"n{i}".encode() for i in range(4)]
    assert (await produce(conn, newer))[0] is ErrorCode.NONE
    await cluster.nodes[1].start()  # follows node 2 and truncates by epoch
    await wait_until(lambda: in_sync(cluster, (1, 2, 3)), what="old leader truncated")
    assert values_of(cluster.nodes[1].log_bytes()) == acked + newer
    assert [e for e, _ in cluster.nodes[1].log(KEY).leader_epochs.entries()] == [0, 1]
    conn.close()


async def test_quick_double_failover_keeps_acknowledged_records(make_cluster):
    """Leaders fail twice in a row before followers learn the HW: nothing acked is lost.

    Truncating to the local HW (the pre-KIP-101 rule) would drop the last acked batch
    on the replica that becomes leader; truncating by leader epoch keeps it.
    """
    cluster = await make_cluster(configs={"min.insync.replicas": "2"})
    conn = await cluster.connect(1)
    acked = []
    for i in range(5):
        vals = [f"r{i}-{j}".encode() for j in range(3)]
        assert (await produce(conn, vals))[0] is ErrorCode.NONE
        acked += vals
    conn.close()
    await cluster.nodes[1].stop()
    await cluster.controller.elect(KEY, 2, isr=(2, 3))
    await cluster.nodes[2].stop()  # at once, before node 3 learns anything new
    await cluster.controller.elect(KEY, 3, isr=(3,))
    await cluster.nodes[1].start()
    await cluster.nodes[2].start()
    conn = await cluster.connect(3)
    assert (await produce(conn, [b"after"], acks=1))[0] is ErrorCode.NONE
    await wait_until(lambda: in_sync(cluster, (1, 2, 3)), what="all replicas agree")
    assert values_of(cluster.nodes[3].log_bytes()) == [*acked, b"after"]
    conn.close()


async def test_offsets_for_leader_epoch_over_the_wire(make_cluster):
    cluster = await make_cluster()
    conn = await cluster.connect(1)
    assert (await produce(conn, [b"x"] * 4))[0] is ErrorCode.NONE
    body = {
        "replica_id": 2,
        "topics": [
            {"topic": "t", "partitions": [
                {"partition": 0, "current_leader_epoch": 0, "leader_epoch": 0},
                {"partition": 7, "current_leader_epoch": 0, "leader_epoch": 0},
            ]}
        ],
    }  # fmt: skip
    resp = await conn.request(ApiKey.OFFSET_FOR_LEADER_EPOCH, body)
    ok, missing = resp.body["topics"][0]["partitions"]
    assert (ok["error"], ok["leader_epoch"], ok["end_offset"]) == (0, 0, 4)
    assert missing["error"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    conn.close()


async def test_follower_behind_the_leaders_log_start_restarts_there(make_cluster):
    cluster = await make_cluster(lag_ms=300)
    await cluster.nodes[3].stop()
    conn = await cluster.connect(1)
    for i in range(5):
        assert (await produce(conn, [f"m{i}".encode()] * 2))[0] is ErrorCode.NONE
    conn.close()
    leader_log = cluster.nodes[1].log(KEY)
    leader_log.advance_log_start_offset(6)  # retention removed what node 3 lacks
    await cluster.nodes[3].start()
    await wait_until(lambda: in_sync(cluster, (1, 2, 3)), what="node 3 restarted at 6")
    assert cluster.nodes[3].log(KEY).log_start_offset == 6
    await wait_until(lambda: cluster.partition.isr == (1, 2, 3), what="node 3 in the ISR")


async def test_follower_appends_only_complete_new_batches(make_cluster):
    cluster = await make_cluster()
    conn = await cluster.connect(1)
    assert (await produce(conn, [b"a", b"b"]))[0] is ErrorCode.NONE
    assert (await produce(conn, [b"c"]))[0] is ErrorCode.NONE
    conn.close()
    await wait_until(lambda: in_sync(cluster, (1, 2, 3)), what="replicated")
    node = cluster.nodes[2]
    data = cluster.nodes[1].log_bytes()
    leo = await node.rm.on_fetched(KEY, memoryview(data + data[:10]), 3)
    assert leo == 3  # batches it had are skipped, a cut one is left for later
    assert node.log_bytes() == data


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_random_failovers_keep_every_acknowledged_record(make_cluster, seed):
    """Produce while brokers die and come back, leaders moving only within the ISR.

    With min.insync.replicas=2 and acks=all, every acknowledged record must be in the
    final log, once, in order, and all replicas must end byte-identical.
    """
    rng = random.Random(seed)
    cluster = await make_cluster(lag_ms=300)
    ctl = cluster.controller
    acked: list[bytes] = []
    attempted: list[bytes] = []
    for step in range(25):
        dead = [i for i, n in cluster.nodes.items() if not n.alive]
        alive = [i for i, n in cluster.nodes.items() if n.alive]
        op = rng.random()
        if op < 0.15 and len(dead) < 2:
            victim = rng.choice(alive)
            await cluster.nodes[victim].stop()
            await ctl.fence(victim)
        elif op < 0.3 and dead:
            back = rng.choice(dead)
            await cluster.nodes[back].start()
            await ctl.unfence(back)
        elif cluster.partition.leader != -1:
            value = f"s{seed}-{step}".encode()
            attempted.append(value)
            conn = await cluster.connect(cluster.partition.leader)
            try:
                error, _ = await produce(conn, [value], timeout_ms=2000)
            finally:
                conn.close()
            if error is ErrorCode.NONE:
                acked.append(value)
    for i, node in cluster.nodes.items():
        if not node.alive:
            await node.start()
            await ctl.unfence(i)
    await wait_until(lambda: in_sync(cluster, (1, 2, 3)), what="replicas converge")
    final = values_of(cluster.nodes[cluster.partition.leader].log_bytes())
    assert len(final) == len(set(final)), "a record is duplicated"
    assert [v for v in final if v in set(acked)] == acked, "acknowledged records lost"
    assert set(final) <= set(attempted)
    assert acked, "the schedule acknowledged nothing: it tests nothing"


def test_metadata_publisher_changes_adapt_to_partition_changes():
    from logmq.broker.replica.replica_manager import changes_from_local
    from logmq.cluster.metadata_image import LocalReplicaChanges, PartitionRegistration

    reg = PartitionRegistration("t", 1, (1, 2), (1, 2), 2, 4, 9)
    mine = PartitionRegistration("u", 0, (1,), (1,), 1, 0, 0)
    changes = changes_from_local(LocalReplicaChanges({mine.key: mine}, {reg.key: reg}, {KEY}))
    assert [(c.key, c.role) for c in changes] == [
        (KEY, "removed"),
        (("u", 0), "leader"),
        (("t", 1), "follower"),
    ]
    follower = changes[2]
    assert (follower.leader, follower.leader_epoch, follower.partition_epoch) == (2, 4, 9)
    assert (follower.replicas, follower.isr) == ((1, 2), (1, 2))


async def test_acks_all_with_an_fsync_per_message(make_cluster):
    """flush.messages=1 on every replica: the ack waits for the leader's fsync and the HW."""
    cluster = await make_cluster(configs={"min.insync.replicas": "2", "flush.messages": "1"})
    conn = await cluster.connect(1)
    results = await asyncio.gather(*(produce(conn, [f"f{i}".encode()]) for i in range(20)))
    assert all(error is ErrorCode.NONE for error, _ in results)
    assert sorted(base for _, base in results) == list(range(20))
    conn.close()
    await wait_until(lambda: in_sync(cluster, (1, 2, 3)), what="replicated")
    for node in cluster.nodes.values():
        assert node.log(KEY).recovery_point == 20  # everything on disk everywhere


async def test_consumers_read_below_the_high_watermark_only(make_cluster):
    cluster = await make_cluster()  # lag time 30 s: the stopped followers stay in the ISR
    await cluster.nodes[2].stop()
    await cluster.nodes[3].stop()
    conn = await cluster.connect(1)
    assert (await produce(conn, [b"a", b"b"], acks=1))[0] is ErrorCode.NONE
    plog = cluster.nodes[1].log(KEY)
    assert (plog.log_end_offset, plog.high_watermark) == (2, 0)

    async def fetch(offset: int) -> dict:
        body = {
            "replica_id": -1,
            "max_wait_ms": 0,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "topics": [{"topic": "t", "partitions": [{"partition": 0, "fetch_offset": offset}]}],
        }
        resp = await conn.request(ApiKey.FETCH, body)
        return resp.body["topics"][0]["partitions"][0]

    for offset in (0, 2):  # below the log end: nothing yet, and no error to reset on
        r = await fetch(offset)
        assert (r["error"], r["size"], r["high_watermark"]) == (0, 0, 0)
    assert (await fetch(3))["error"] == ErrorCode.OFFSET_OUT_OF_RANGE
    conn.close()


# -- fetch sessions: idle partitions (issue 16) -----------------------------------------
async def test_an_idle_partition_keeps_its_isr_and_is_not_ticked(make_cluster):
    """In a fetch session an idle, caught-up partition hears nothing from its followers;
    it stays in sync (Kafka's rule: at the LEO is in sync) and the leader stops ticking
    it, yet the followers keep fetching (the session is alive)."""
    cluster = await make_cluster(lag_ms=300)
    conn = await cluster.connect(1)
    assert (await produce(conn, [b"a"]))[0] is ErrorCode.NONE
    await wait_until(lambda: in_sync(cluster, (1, 2, 3)), what="all in sync")
    rm = cluster.nodes[1].rm
    assert rm is not None
    await wait_until(lambda: not rm._ticking, what="the idle partition leaves the tick set")
    since = rm.clock()
    # Many lag periods later, both followers still fetch and the ISR is whole.
    await wait_until(
        lambda: all(rm.follower_seen.get(r, 0) > since + 4 * 300 for r in (2, 3)),
        what="followers fetching for four lag periods",
    )
    assert cluster.partition.isr == (1, 2, 3)
    assert (await produce(conn, [b"b"]))[0] is ErrorCode.NONE
    await wait_until(lambda: in_sync(cluster, (1, 2, 3)), what="the append replicated")
    conn.close()


async def test_a_silent_follower_leaves_the_isr_of_an_idle_partition(make_cluster):
    """Nothing is produced: the stopped follower is caught up, but its broker fetches
    nothing any more, so it leaves the ISR after the lag time, and rejoins later."""
    cluster = await make_cluster(lag_ms=300)
    conn = await cluster.connect(1)
    assert (await produce(conn, [b"a"]))[0] is ErrorCode.NONE
    await wait_until(lambda: in_sync(cluster, (1, 2, 3)), what="all in sync")
    await cluster.nodes[3].stop()
    await wait_until(lambda: cluster.partition.isr == (1, 2), what="node 3 out of the ISR")
    await cluster.nodes[3].start()
    await wait_until(lambda: cluster.partition.isr == (1, 2, 3), what="node 3 back")
    conn.close()
