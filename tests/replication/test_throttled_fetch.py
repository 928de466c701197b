"""The reassignment throttle on the replication path: real fetchers, leaders and sockets.

The static-controller cluster of replica_cluster.py runs the data path; each node's
replica manager is handed a metadata image (as the publisher would) that names node 3
as being added to a partition and sets ``reassignment.throttled.rate``. The checks
rest on the quotas' own accounting (bytes charged, partitions held back) and on the
lower bound the rate sets on a catch-up, never on how fast the machine is. The last
test runs a real move between ``logmq-server`` processes and reads the quotas through
the brokers' metrics; its ±25% accuracy under load is tests/cluster/test_reassignment_e2e.py's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from logmq import AsyncAdmin, AsyncProducer
from logmq.broker.metrics import BrokerMetrics
from logmq.broker.replica.replica_manager import PartitionChange
from logmq.cluster.metadata_image import (
    BROKER,
    CLUSTER_WIDE,
    REASSIGNMENT_THROTTLE,
    MetadataImage,
)
from logmq.cluster.metadata_records import ConfigRecord, PartitionRecord, TopicRecord
from logmq.errors import ErrorCode
from logmq.net.codec import ApiKey
from logmq.replication.throttle import default_burst
from logmq.storage import batch as b
from tests.harness import BrokerCluster, free_port, wait_until
from tests.replication.replica_cluster import TOPIC, ReplicaCluster

BATCH = 16 * 1024  # bytes of values per produced batch


@pytest.fixture
async def make_cluster(tmp_path):
    made: list[ReplicaCluster] = []

    async def make(partitions: int = 1) -> ReplicaCluster:
        cluster = ReplicaCluster(tmp_path)
        first = cluster.controller.state[(TOPIC, 0)]
        for p in range(1, partitions):
            cluster.controller.state[(TOPIC, p)] = dataclasses.replace(first, partition=p)
        made.append(cluster)
        await cluster.start()
        return cluster

    yield make
    for cluster in made:
        await cluster.stop()


def image(rate: int | None, moving: dict[int, tuple[int, ...]], partitions: int = 1):
    """Partitions of TOPIC on (1, 2, 3), led by 1; ``moving`` maps some to their target."""
    records: list = [TopicRecord(TOPIC, "id")]
    for p in range(partitions):
        target = moving.get(p, ())
        if target:  # moving from (1, 2)
            original = (1, 2)
            adding = tuple(r for r in target if r not in original)
            removing = tuple(r for r in original if r not in target)
            records.append(
                PartitionRecord(TOPIC, p, original + adding, (1, 2), 1, 0, 0, adding,
                                removing, target)
            )  # fmt: skip
        else:
            records.append(PartitionRecord(TOPIC, p, (1, 2, 3), (1, 2, 3), 1, 0, 0))
    if rate is not None:
        records.append(ConfigRecord(BROKER, CLUSTER_WIDE, REASSIGNMENT_THROTTLE, str(rate)))
    return MetadataImage().apply(records)


def publish(cluster: ReplicaCluster, img: MetadataImage) -> None:
    for node in cluster.nodes.values():
        node.rm.image = img


async def produce_bytes(cluster: ReplicaCluster, partition: int, total: int) -> None:
    conn = await cluster.connect(1)
    try:
        for _ in range(total // BATCH):
            batch = b.encode_batch([(1, None, os.urandom(1024), None) for _ in range(16)])
            body = {
                "acks": -1,
                "timeout_ms": 10_000,
                "topics": [
                    {"topic": TOPIC, "partitions": [{"partition": partition, "size": len(batch)}]}
                ],
            }
            resp = await conn.request(ApiKey.PRODUCE, body, [batch], timeout=20)
            assert resp.body["topics"][0]["partitions"][0]["error"] == 0
    finally:
        conn.close()


async def detach(cluster: ReplicaCluster, node_id: int, partitions: int = 1) -> None:
    """The node stops replicating (its log stays): what it lacks it will fetch later."""
    for p in range(partitions):
        await cluster.controller.fence(node_id, (TOPIC, p))
    await cluster.nodes[node_id].rm.apply_changes(
        PartitionChange(TOPIC, p, "removed") for p in range(partitions)
    )


async def attach(cluster: ReplicaCluster, node_id: int, partitions: int = 1) -> None:
    state = cluster.controller.state
    await cluster.nodes[node_id].rm.apply_changes(
        cluster.controller.change_for(node_id, state[(TOPIC, p)]) for p in range(partitions)
    )


def leo(cluster: ReplicaCluster, node_id: int, partition: int = 0) -> int:
    return cluster.nodes[node_id].log((TOPIC, partition)).log_end_offset


def log_size(cluster: ReplicaCluster, node_id: int, partition: int = 0) -> int:
    return cluster.nodes[node_id].log((TOPIC, partition)).size_bytes()


async def test_adding_replica_catches_up_at_the_throttled_rate(make_cluster):
    rate = 1_000_000
    cluster = await make_cluster()
    await detach(cluster, 3)
    await produce_bytes(cluster, 0, 1_200_000)
    size = log_size(cluster, 1)
    assert size >= 1_200_000
    publish(cluster, image(rate, {0: (1, 3)}))

    started = time.monotonic()
    await attach(cluster, 3)
    await wait_until(lambda: leo(cluster, 3) == leo(cluster, 1), timeout=60, what="catch-up")
    elapsed = time.monotonic() - started
    print(f"caught up {size} bytes in {elapsed:.3f} s: {size / elapsed:.0f} B/s")

    inbound = cluster.nodes[3].rm.inbound_throttle
    outbound = cluster.nodes[1].rm.outbound_throttle
    # Every byte of the catch-up went through both quotas, and nothing else did.
    assert inbound.bytes == size == log_size(cluster, 3)
    assert outbound.bytes >= size
    assert inbound.delays + outbound.delays > 0  # the rate, not the network, set the pace
    # The bucket grants at most rate * T + burst, plus one whole batch over its allowance.
    slack = default_burst(rate) + 2 * (BATCH + 1024)
    assert elapsed >= (size - slack) / rate
    assert cluster.nodes[2].rm.inbound_throttle.bytes == 0  # node 2 is not being added

    metrics = BrokerMetrics()
    metrics.register_reassignment_throttle(inbound, cluster.nodes[3].rm.outbound_throttle)
    samples = {
        (s.name, s.labels.get("direction")): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }
    assert samples["logmq_reassignment_throttled_bytes_total", "inbound"] == size
    assert samples["logmq_reassignment_throttle_rate_bytes", "inbound"] == rate
    assert samples["logmq_reassignment_throttle_delays_total", "inbound"] == inbound.delays


async def test_other_partitions_fetch_at_full_speed_and_the_rate_changes_at_run_time(
    make_cluster,
):
    rate = 50_000
    cluster = await make_cluster(partitions=2)
    await detach(cluster, 3, partitions=2)
    await produce_bytes(cluster, 0, 600_000)
    await produce_bytes(cluster, 1, 600_000)
    publish(cluster, image(rate, {0: (1, 3)}, partitions=2))

    started = time.monotonic()
    await attach(cluster, 3, partitions=2)
    await wait_until(lambda: leo(cluster, 3, 1) == leo(cluster, 1, 1), what="partition 1")
    elapsed = time.monotonic() - started
    inbound = cluster.nodes[3].rm.inbound_throttle
    moved = log_size(cluster, 3, 0)
    # Only partition 0 is charged, and it moved no faster than the rate allows.
    assert inbound.bytes == moved
    assert moved <= rate * elapsed + default_burst(rate) + 2 * (BATCH + 1024)

    # The throttle goes (the controller removes it when the move ends): full speed.
    publish(cluster, image(None, {0: (1, 3)}, partitions=2))
    await wait_until(lambda: leo(cluster, 3, 0) == leo(cluster, 1, 0), timeout=30, what="p0")
    assert not inbound.limited
    assert log_size(cluster, 3, 0) == log_size(cluster, 1, 0)
    assert inbound.bytes < log_size(cluster, 3, 0)  # the rest came unthrottled


async def fetch_as(cluster: ReplicaCluster, replica_id: int, max_wait_ms: int = 0) -> dict:
    conn = await cluster.connect(1)
    try:
        body = {
            "replica_id": replica_id,
            "max_wait_ms": max_wait_ms,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "topics": [
                {
                    "topic": TOPIC,
                    "partitions": [
                        {
                            "partition": 0,
                            "fetch_offset": 0,
                            "partition_max_bytes": 1 << 20,
                            "current_leader_epoch": 0,
                        }
                    ],
                }
            ],
        }
        resp = await conn.request(ApiKey.FETCH, body, timeout=10)
        return resp.body["topics"][0]["partitions"][0]
    finally:
        conn.close()


async def test_leader_sends_nothing_to_an_adding_replica_while_in_debt(make_cluster):
    cluster = await make_cluster()
    await produce_bytes(cluster, 0, 4 * BATCH)
    hw = cluster.nodes[1].log((TOPIC, 0)).high_watermark
    publish(cluster, image(1000, {0: (1, 2, 3)}))  # node 3 is being added again
    quota = cluster.nodes[1].rm.outbound_throttle
    quota.set_rate(1000, asyncio.get_running_loop().time())
    quota.charge(10**6, asyncio.get_running_loop().time())  # debt for a long while

    held = await fetch_as(cluster, 3)
    assert held["error"] == ErrorCode.NONE and held["size"] == 0
    assert held["high_watermark"] == hw  # everything but the records still goes back
    assert quota.delays >= 1
    before = quota.bytes

    served = await fetch_as(cluster, 2)  # not being added: never throttled
    assert served["error"] == ErrorCode.NONE and served["size"] > 0
    assert quota.bytes == before

    # Out of debt, the adding replica is served and charged, whole batches only.
    quota.set_rate(None, 0.0)
    quota.set_rate(10**9, asyncio.get_running_loop().time())
    served = await fetch_as(cluster, 3)
    assert served["size"] > 0
    assert quota.bytes == before + served["size"]


# -- real brokers: the image reaches the quotas, and the metrics show them -------------------


async def scrape(port: int) -> dict[tuple[str, str | None], float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    text = raw.split(b"\r\n\r\n", 1)[1].decode()
    return {
        (s.name, s.labels.get("direction")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def until(probe, done, what: str, timeout: float = 60.0):
    """Re-run ``probe`` until ``done`` holds for its answer (a deadline, no fixed sleeps)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        last = await probe()
        if done(last):
            return last
        assert loop.time() < deadline, f"timed out waiting for {what}; last: {last!r}"
        await asyncio.sleep(0.02)


async def test_a_real_move_is_throttled_on_both_brokers_and_counted(tmp_path):
    rate = 1_000_000
    cluster = BrokerCluster(3, base_dir=tmp_path, log_level="warning")
    metrics_ports = {}
    for node_id, node in cluster.nodes.items():
        metrics_ports[node_id] = free_port()
        node.extra_args += ["--metrics-port", str(metrics_ports[node_id])]
    await asyncio.to_thread(cluster.start)
    try:
        async with AsyncAdmin(cluster.bootstrap) as admin:
            await admin.create_topic("moving", 1, replication_factor=1)
            [part] = (await admin.describe_topics(["moving"]))["moving"].partitions
            source = part.leader
            target = next(n for n in cluster.nodes if n != source)
            async with AsyncProducer(cluster.bootstrap) as producer:
                await producer.send_batch(
                    "moving", [os.urandom(1000) for _ in range(2000)], partition=0
                )
            tp = ("moving", 0)
            size = (await admin.describe_log_dirs(source, [tp]))[tp].size
            assert size >= 2_000_000

            loop = asyncio.get_running_loop()
            started = loop.time()
            await admin.alter_partition_reassignments(
                {tp: [source, target]}, throttle_bytes_per_sec=rate
            )
            await until(
                admin.list_partition_reassignments,
                lambda listing: not listing.partitions,
                "the move to complete",
            )
            elapsed = loop.time() - started
            print(f"moved {size} bytes in {elapsed:.3f} s: {size / elapsed:.0f} B/s")
            assert (await admin.describe_log_dirs(target, [tp]))[tp].size == size

        # Every byte went through the new replica's inbound quota and the leader's outbound
        # one; the others counted nothing, and no copy beat the rate.
        inbound = await scrape(metrics_ports[target])
        outbound = await scrape(metrics_ports[source])
        assert inbound["logmq_reassignment_throttled_bytes_total", "inbound"] == size
        assert outbound["logmq_reassignment_throttled_bytes_total", "outbound"] >= size
        assert outbound["logmq_reassignment_throttled_bytes_total", "inbound"] == 0
        assert inbound["logmq_reassignment_throttled_bytes_total", "outbound"] == 0
        assert elapsed >= (size - default_burst(rate) - (256 << 10)) / rate
        # the controller removed the throttle with the move; the quotas follow
        for node_id in (source, target):
            await until(
                lambda n=node_id: scrape(metrics_ports[n]),
                lambda m: (
                    m["logmq_reassignment_throttle_rate_bytes", "inbound"] == 0
                    and m["logmq_reassignment_throttle_rate_bytes", "outbound"] == 0
                ),
                f"broker {node_id}'s quotas to lift",
            )
    finally:
        await asyncio.to_thread(cluster.close)
