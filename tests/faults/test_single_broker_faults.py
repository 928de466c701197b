"""The fault harness end to end against ONE real broker, as a proof that it works.

With acks=1 and the topic's flush.messages=1 every ack is durable on the only node, so
kill -9 + restart (and SIGSTOP/SIGCONT) must leave no violation. Negative controls show
the checker is not blind: tampering with a real run's final read, and a deliberately
lossy nemesis (segment tails chopped after kill -9), are both reported.

``LOGMQ_FAULT_SEED`` replays a seed; the soak variant runs with ``--soak``.
"""

from __future__ import annotations

import asyncio
import copy
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.history import HEAL, INJECT, History, Kind, Status
from tests.faults.nemesis import schedule
from tests.faults.processes import Cluster, standalone_args
from tests.faults.workload import Workload, WorkloadConfig

SEED = int(os.environ.get("LOGMQ_FAULT_SEED", "20240605"))
DURABLE = {"flush.messages": "1"}


async def run_single(
    base_dir: Path,
    config: WorkloadConfig,
    faults: list[str],
    *,
    fault_s: tuple[float, float],
    quiet_s: tuple[float, float],
) -> Workload:
    cluster = Cluster(1, base_dir, args_builder=standalone_args, proxied=False)
    await asyncio.to_thread(cluster.start)
    try:
        steps = schedule(config.seed, config.duration_s, faults, fault_s=fault_s, quiet_s=quiet_s)
        assert steps, "the schedule has no fault"
        workload = Workload(cluster, config, steps)
        await workload.run()
    finally:
        await asyncio.to_thread(cluster.close)
    return workload


def assert_faults_hit_a_live_workload(workload: Workload) -> None:
    """The nemesis acted, and records were acknowledged after its last heal."""
    h = workload.history
    injected = [e for e in h.nemesis_events if e.name == INJECT and "skipped" not in e.detail]
    healed = [e for e in h.nemesis_events if e.name == HEAL]
    assert injected and len(healed) == len(injected), workload.describe()
    acked_after = [
        a
        for a in h.attempts
        if a.status is Status.ACKED and a.done_ms is not None and a.done_ms > healed[0].at_ms
    ]
    assert acked_after, f"nothing acknowledged after a restart\n{workload.describe()}"
    assert h.reads, "the consumer read nothing"


@pytest.fixture(scope="module")
def kill9_run(tmp_path_factory) -> Iterator[Workload]:
    """One kill -9 run shared by the positive test and the tampering controls."""
    config = WorkloadConfig(
        topic="kill9",
        partitions=3,
        producers=3,
        duration_s=9.0,
        rate=150,
        acks=1,
        topic_configs=DURABLE,
        seed=SEED,
    )
    yield asyncio.run(
        run_single(
            tmp_path_factory.mktemp("kill9"),
            config,
            ["kill"],
            fault_s=(0.2, 1.0),
            quiet_s=(1.0, 2.0),
        )
    )


def test_kill9_and_restart_lose_no_acknowledged_record(kill9_run: Workload) -> None:
    result = kill9_run.history.check()
    assert result.ok, f"{result.report()}\n{kill9_run.describe()}"
    assert result.stats["faults"] >= 2, kill9_run.describe()
    assert result.stats["acked"] >= 300
    assert_faults_hit_a_live_workload(kill9_run)


def _acked(h: History) -> list:
    return [a for a in h.attempts if a.status is Status.ACKED and a.offset is not None]


def drop_acked(h: History) -> None:
    a = _acked(h)[len(_acked(h)) // 2]
    del h.final[a.tp].records[a.offset]


def duplicate_acked(h: History) -> None:
    a = _acked(h)[0]
    log = h.final[a.tp]
    log.records[log.end_offset] = a.value
    log.end_offset += 1


def reorder_acked(h: History) -> None:
    acked = _acked(h)
    a = acked[-1]
    b = next(x for x in reversed(acked) if x.client == a.client and x.tp == a.tp and x is not a)
    log = h.final[a.tp]
    log.records[a.offset], log.records[b.offset] = b.value, a.value


def rewrite_read(h: History) -> None:
    r = h.reads[len(h.reads) // 2]
    h.final[(r.topic, r.partition)].records[r.offset] = b"rewritten by a rogue leader"


@pytest.mark.parametrize(
    ("tamper", "kind"),
    [
        (drop_acked, Kind.LOST),
        (duplicate_acked, Kind.DUPLICATE),
        (reorder_acked, Kind.ORDER),
        (rewrite_read, Kind.DIVERGENT_READ),
    ],
    ids=lambda x: getattr(x, "__name__", None) or x.value,
)
def test_checker_reports_tampering_with_a_real_run(kill9_run: Workload, tamper, kind) -> None:
    h = copy.deepcopy(kill9_run.history)
    tamper(h)
    result = h.check()
    assert kind in result.kinds(), result.report()
    assert kind.value in result.report()


async def test_sigstop_and_kill9_with_acks_all(tmp_path: Path) -> None:
    config = WorkloadConfig(
        topic="pause-kill",
        partitions=2,
        producers=2,
        duration_s=7.0,
        rate=150,
        acks="all",  # on one broker the same promise as acks=1
        topic_configs=DURABLE,
        seed=SEED + 1,
    )
    workload = await run_single(
        tmp_path, config, ["pause", "kill"], fault_s=(0.3, 1.0), quiet_s=(0.8, 1.5)
    )
    result = workload.history.check()
    assert result.ok, f"{result.report()}\n{workload.describe()}"
    assert_faults_hit_a_live_workload(workload)


async def test_a_disk_that_loses_acknowledged_writes_is_caught(tmp_path: Path) -> None:
    """Negative control on a real broker: chopping segment tails after kill -9 loses
    acknowledged records, and the checker must say which."""
    config = WorkloadConfig(
        topic="lossy", partitions=2, producers=2, duration_s=4.0, rate=200, acks=1, seed=SEED
    )
    workload = await run_single(
        tmp_path, config, ["lose_tail"], fault_s=(0.2, 0.4), quiet_s=(1.5, 2.0)
    )
    result = workload.history.check()
    assert result.stats["acked"] > 0, f"nothing acknowledged\n{workload.describe()}"
    assert Kind.LOST in result.kinds(), f"{result.report()}\n{workload.describe()}"
    lost = result.of_kind(Kind.LOST)
    assert all(workload.history.attempt_of(v.value).status is Status.ACKED for v in lost)
    assert "missing from the final log" in result.report()


@pytest.mark.soak
async def test_soak_single_broker(tmp_path: Path) -> None:
    """Minutes of kill -9 and SIGSTOP against one broker (``pytest --soak``)."""
    config = WorkloadConfig(
        topic="soak",
        partitions=4,
        producers=4,
        consumers=2,
        duration_s=float(os.environ.get("LOGMQ_SOAK_SECONDS", "300")),
        rate=300,
        acks=1,
        topic_configs=DURABLE,
        seed=SEED,
    )
    workload = await run_single(
        tmp_path, config, ["kill", "pause"], fault_s=(0.2, 3.0), quiet_s=(0.5, 5.0)
    )
    result = workload.history.check()
    assert result.ok, f"{result.report()}\n{workload.describe()}"
    assert_faults_hit_a_live_workload(workload)
