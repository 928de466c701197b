"""One broker per data dir: the ``.lock`` a second ``logmq-server`` is refused by."""

from __future__ import annotations

import os
import subprocess

import pytest

from logmq.storage import batch as b
from logmq.storage.dir_lock import DataDirLock, DataDirLockedError
from tests.broker.test_create_partitions import fetched_values
from tests.harness import BrokerProcess
from tests.net.raw_client import RawClient


def test_a_held_lock_refuses_a_second_holder_and_names_its_pid(tmp_path):
    first = DataDirLock(tmp_path)
    first.acquire()
    assert (tmp_path / ".lock").read_text() == f"{os.getpid()}\n"
    # flock belongs to the open file: a second open conflicts even in the same process
    with pytest.raises(DataDirLockedError, match=f"pid {os.getpid()}") as err:
        DataDirLock(tmp_path).acquire()
    assert err.value.holder_pid == os.getpid()
    first.release()
    first.release()  # idempotent
    with DataDirLock(tmp_path) as again:
        assert again.held
    assert (tmp_path / ".lock").exists()  # kept: deleting it would race a new holder


def test_a_lock_file_without_a_pid_still_refuses(tmp_path):
    with DataDirLock(tmp_path) as held:
        os.ftruncate(held._fd, 0)  # type: ignore[arg-type]  # a holder mid-start
        with pytest.raises(DataDirLockedError, match="unknown pid"):
            DataDirLock(tmp_path).acquire()


def second_server(first: BrokerProcess) -> subprocess.CompletedProcess[str]:
    """Another ``logmq-server`` on ``first``'s data dir, on ports of its own."""
    other = BrokerProcess(first.data_dir)
    assert (other.port, other.kafka_port) != (first.port, first.kafka_port)
    return subprocess.run(other.command(), capture_output=True, text=True, timeout=60)


async def produce_and_consume(broker: BrokerProcess, topic: str, value: bytes) -> None:
    async with await RawClient.connect(broker.port) as c:
        if (await c.create_topic(topic, 1))["error"] not in (0, 36):  # 36: already exists
            raise AssertionError(f"cannot create {topic}")
        r = await c.produce(topic, 0, b.encode_values([value], timestamp=1))
        assert r["error"] == 0, r
        meta, tail = await c.fetch(topic, 0, r["base_offset"])
        assert meta["error"] == 0 and fetched_values(tail)[0] == value


async def test_a_second_server_on_a_live_data_dir_is_refused(broker):
    await produce_and_consume(broker, "t", b"before")
    meta = (broker.data_dir / "meta.properties").read_bytes()
    proc = second_server(broker)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        f"logmq-server: refusing to start: data dir {broker.data_dir} is in use by another "
        f"logmq-server (pid {broker.pid}; lock file {broker.data_dir / '.lock'}): stop it "
        "first or give this one another --data-dir"
    ], proc.stderr  # nothing else: no recovery, no quorum, no marker over the live files
    assert not (broker.data_dir / ".clean-shutdown").exists()
    assert (broker.data_dir / "meta.properties").read_bytes() == meta
    assert (broker.data_dir / ".lock").read_text() == f"{broker.pid}\n"
    await produce_and_consume(broker, "t", b"after")  # the first never noticed
    assert broker.stop() == 0
    assert (broker.data_dir / ".clean-shutdown").exists()


async def test_kill_9_releases_the_lock(broker):
    await produce_and_consume(broker, "t", b"before")
    broker.kill()  # no orderly stop: the kernel drops the flock with the process
    assert (broker.data_dir / ".lock").exists()
    broker.start()
    assert (broker.data_dir / ".lock").read_text() == f"{broker.pid}\n"
    await produce_and_consume(broker, "t", b"after")
    assert second_server(broker).returncode != 0  # and the new holder is protected


async def test_a_refused_in_process_start_leaves_the_dir_unlocked(tmp_path):
    """A start that fails after taking the lock (here: another node's dir) releases it."""
    from logmq.cluster.meta_properties import NodeIdMismatchError
    from tests.harness import inprocess_broker

    async with inprocess_broker(tmp_path / "d", node_id=4):
        pass
    with pytest.raises(NodeIdMismatchError):
        async with inprocess_broker(tmp_path / "d", node_id=5):
            pass
    with DataDirLock(tmp_path / "d") as lock:
        assert lock.held
