"""The remote tier's retry backoff (Kafka's remote.log.manager.task.retry.*): a
partition whose store work failed is tried again after a doubling, bounded, jittered
delay, whatever the task interval, and not before."""

from __future__ import annotations

import time
from types import SimpleNamespace

from logmq.broker.replica.remote_log import RemoteLogManager


class _Image:
    topics: dict = {}

    def partition(self, topic, partition):
        return None

    def orphaned_remote_partitions(self):
        return []


def manager(plogs=(), **settings) -> RemoteLogManager:
    s = SimpleNamespace(
        copier_thread_pool_size=1,
        expiration_thread_pool_size=1,
        task_interval_ms=30_000,
        task_retry_backoff_ms=100,
        task_retry_backoff_max_ms=450,
        task_retry_jitter=0.0,
    )
    s.__dict__.update(settings)
    logs = SimpleNamespace(logs=lambda: list(plogs))
    return RemoteLogManager(
        node_id=1, settings=s, store=None, reader=None, logs=logs, image=_Image, updates=None
    )


async def test_the_backoff_doubles_up_to_its_bound():
    m = manager()
    key = ("t", 0)
    assert [round(m._back_off(key), 3) for _ in range(5)] == [0.1, 0.2, 0.4, 0.45, 0.45]


async def test_jitter_stays_within_its_fraction():
    m = manager(task_retry_jitter=0.2, task_retry_backoff_max_ms=10**9)
    delays = [m._back_off(("t", p)) for p in range(200)]  # each a first failure
    assert all(0.08 <= d <= 0.12 for d in delays)
    assert len(set(delays)) > 1


async def test_a_partition_in_its_backoff_is_skipped_until_it_is_due():
    plog = SimpleNamespace(
        topic="t", partition=0, closed=False, config=SimpleNamespace(remote_storage_enable=True)
    )
    m = manager([plog])
    m._retry[("t", 0)] = (3, time.monotonic() + 60)
    m._pass()
    assert not m._busy  # not started: its next try is a minute away
    m._retry[("t", 0)] = (3, time.monotonic() - 1)
    m._pass()
    assert ("t", 0) in m._busy
    for task in list(m._tasks):
        await task
