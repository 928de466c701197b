"""Real brokers whose data dir is a small tmpfs: a full disk is a clear error, never a hang.

Filling the disk makes produce fail at once with DiskFullError (not a timeout), the broker
logs it once, acknowledged records stay readable (and nothing unacknowledged is), and
deleting a topic lets produce resume without a restart. Once with the free-space guard,
once without it (``--min-free-bytes 0``: appends hit the real ENOSPC). In a cluster, a
leader whose disk fills hands its leadership to a replica with room.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from logmq import AsyncAdmin, AsyncConsumer, AsyncProducer
from logmq.errors import DiskFullError
from tests.faults.processes import Cluster
from tests.harness import BrokerProcess

TMPFS_BYTES = 8 << 20
CLI = [sys.executable, "-m", "logmq_cli.main"]
VALUE = b"v" * 1000


@contextlib.contextmanager
def small_tmpfs(mnt: Path):
    """Mount an 8 MiB tmpfs at ``mnt`` (the data dir itself, so the broker's own log file
    beside it is not on it); skips where mounting is not permitted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.fixture
def tmpfs(tmp_path):
    with small_tmpfs(tmp_path / "data") as mnt:
        yield mnt


async def until(condition, timeout: float, what: str):
    """Re-check an async ``condition`` until it is truthy, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = await condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


async def fill(producer: AsyncProducer, topic: str, partition: int) -> tuple[int, DiskFullError]:
    """Produce until the broker refuses: (records acknowledged, the first refusal)."""
    acked = 0
    for _ in range(4 * TMPFS_BYTES // (200 * len(VALUE))):
        handles = [producer.send(topic, VALUE, partition=partition) for _ in range(200)]
        results = await asyncio.gather(*handles, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        acked += len(results) - len(errors)
        if errors:
            assert all(isinstance(e, DiskFullError) for e in errors), errors[0]
            return acked, errors[0]
    raise AssertionError("the disk never filled up")


async def read_values(bootstrap: str, topic: str, count: int) -> list[bytes]:
    async with AsyncConsumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic, 0)])
        out: list[bytes] = []
        async with asyncio.timeout(60):
            while len(out) < count:
                out.extend(r.value for r in await consumer.poll(timeout=1.0))
        # Nothing beyond the acknowledged records: a short poll at the end finds nothing.
        out.extend(r.value for r in await consumer.poll(timeout=0.3))
    return out


async def storage_full(admin: AsyncAdmin) -> bool:
    return (await admin.describe_cluster())["brokers"][0]["storage_full"]


@pytest.mark.parametrize("min_free", ["1048576", "0"], ids=["guard", "enospc"])
async def test_full_disk_fails_fast_keeps_data_and_recovers_without_restart(tmpfs, min_free):
    broker = BrokerProcess(tmpfs, extra_args=["--min-free-bytes", min_free])
    broker.start()
    try:
        async with AsyncAdmin(broker.bootstrap) as admin:
            await admin.create_topic("keep", partitions=1)
            await admin.create_topic("filler", partitions=1)
            # Small batches fill the disk to its last few KiB, as in the field: deleting a
            # topic then has no room to flush its index either.
            small = {"linger_ms": 1, "batch_size": 4 << 10}
            async with AsyncProducer(broker.bootstrap, acks=1, **small) as producer:
                kept = [b"keep-%d" % i for i in range(50)]
                await producer.send_batch("keep", kept, partition=0)
                acked, error = await fill(producer, "filler", 0)
                message = str(error)
                assert message.startswith("disk full:") and str(broker.data_dir) in message
                assert "bytes free" in message
                assert await until(lambda: storage_full(admin), 10, "describe shows the disk full")
                with pytest.raises(DiskFullError):  # every client produce, at once
                    await producer.send("keep", b"more", partition=0)

                # Acknowledged data stays readable, and nothing that was refused is.
                assert await read_values(broker.bootstrap, "keep", 50) == kept
                filler = await read_values(broker.bootstrap, "filler", acked)
                assert len(filler) == acked and set(filler) == {VALUE}

                log = broker.log_path.read_text()
                assert log.count("refusing produce until space is freed") == 1, log[-3000:]

                # Space returns (a topic deleted): produce resumes without a restart.
                await admin.delete_topic("filler")

                async def produce_ok() -> bool:
                    try:
                        await producer.send("keep", b"after", partition=0)
                    except DiskFullError:
                        return False
                    return True

                async def has_room() -> bool:
                    return not await storage_full(admin)

                await until(produce_ok, 20, "produce to succeed after the delete")
                await until(has_room, 10, "describe shows room again")
            values = await read_values(broker.bootstrap, "keep", 51)
            assert values[:50] == kept and values[50] == b"after"
        log = broker.log_path.read_text()
        assert log.count("disk space available again") == 1
        assert "Traceback" not in log, log[-3000:]
    finally:
        broker.stop()


async def test_a_full_leader_hands_leadership_to_a_replica_with_room(tmp_path):
    """Broker 2's data dir is a small tmpfs, broker 1's is not: once broker 2 is full, the
    partition it led moves to broker 1, which takes produce; nothing acknowledged is lost."""
    with small_tmpfs(tmp_path / "node-2" / "data"):
        cluster = Cluster(2, tmp_path, proxied=False, extra_args=["--min-free-bytes", "1048576"])
        cluster.start()
        try:
            bootstrap = cluster.bootstrap
            async with AsyncAdmin(bootstrap) as admin:
                await admin.create_topic("t", partitions=2, replication_factor=2)

                async def partition_led_by(broker: int) -> list[int]:
                    parts = (await admin.describe_topics(["t"]))["t"].partitions
                    return [x.partition for x in parts if x.leader == broker]

                [p] = await until(lambda: partition_led_by(2), 20, "a partition led by broker 2")
                async with AsyncProducer(bootstrap, acks="all", linger_ms=1) as producer:
                    acked, refused = await fill(producer, "t", p)
                    assert "disk full" in str(refused)

                    async def moved() -> bool:
                        brokers = (await admin.describe_cluster())["brokers"]
                        full = {b["node_id"]: b["storage_full"] for b in brokers}
                        parts = (await admin.describe_topics(["t"]))["t"].partitions
                        part = next(x for x in parts if x.partition == p)
                        return (
                            full == {1: False, 2: True} and part.leader == 1 and 2 not in part.isr
                        )

                    await until(moved, 20, "leadership to move to broker 1")
                    table = subprocess.run(
                        [*CLI, "-b", bootstrap, "cluster", "describe"],
                        capture_output=True,
                        text=True,
                        timeout=60,
                    ).stdout
                    cells = [r.split("│")[1:] for r in table.splitlines() if "127.0.0.1" in r]
                    disk = {c[0].strip(): c[4].strip() for c in cells}  # broker -> disk
                    assert disk == {"1": "ok", "2": "FULL"}, table

                    async def produce_ok() -> bool:
                        try:
                            await producer.send("t", b"after", partition=p)
                        except DiskFullError:
                            return False
                        return True

                    await until(produce_ok, 20, "produce to the new leader")
            async with AsyncConsumer(bootstrap, auto_offset_reset="earliest") as consumer:
                consumer.assign([("t", p)])
                values: list[bytes] = []
                async with asyncio.timeout(60):
                    while not values or values[-1] != b"after":
                        values.extend(r.value for r in await consumer.poll(timeout=1.0))
            assert values.count(VALUE) >= acked and values[-1] == b"after"
        finally:
            cluster.stop()
