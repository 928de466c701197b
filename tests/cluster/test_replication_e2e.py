"""Three real brokers, RF=3, min.insync.replicas=2, acks=all: kill -9 the leader.

The producers (idempotent, every value unique) record each send and its outcome; the
nemesis SIGKILLs the leader of a partition while they send and restarts it later; a
final full read then goes through tests/faults/history.py's checker: no acknowledged
record lost, none duplicated, order kept, no offset holding two records.

tests/replication/test_replica_manager.py covers the same data path in-process, with
more failure shapes; this one proves it in real processes with the real controller.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.faults.nemesis import schedule
from tests.faults.processes import Cluster
from tests.faults.workload import Workload, WorkloadConfig

SEED = int(os.environ.get("LOGMQ_FAULT_SEED", "5"))


async def test_kill9_of_the_leader_loses_no_acknowledged_record(tmp_path: Path) -> None:
    cluster = Cluster(3, tmp_path, proxied=False)
    await asyncio.to_thread(cluster.start)
    try:
        config = WorkloadConfig(
            topic="replicated",
            partitions=2,
            replication_factor=3,
            topic_configs={"min.insync.replicas": "2"},
            producers=2,
            duration_s=8.0,
            rate=100,
            acks="all",
            seed=SEED,
        )
        steps = schedule(SEED, config.duration_s, ["kill_leader"], fault_s=(1.0, 2.5))
        assert steps, "the schedule kills nothing"
        workload = Workload(cluster, config, steps)
        await workload.run()
    finally:
        await asyncio.to_thread(cluster.close)
    result = workload.history.check()
    assert result.ok, result.report()
    assert result.stats["acked"] > 0
