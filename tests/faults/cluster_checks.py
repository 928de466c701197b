"""Admin calls on a fault-harness Cluster that tolerate its faults (shared by the
Kafka-client fault tests)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from logmq import Admin
from logmq.errors import LogMQError
from tests.faults.processes import Cluster


def admin_call(cluster: Cluster, call: Callable[[Admin], Any], timeout_ms: int = 3000) -> Any:
    """``call(admin)`` on the running, unpaused brokers; None on a (retriable) failure."""
    live = [cluster.node(n).bootstrap for n in cluster.running() if not cluster.node(n).paused]
    try:
        with Admin(",".join(live), request_timeout_ms=timeout_ms) as admin:
            return call(admin)
    except (LogMQError, OSError, TimeoutError):
        return None


def all_in_sync(cluster: Cluster, topics: list[str]) -> bool:
    """Every partition of ``topics`` has all three replicas in its ISR."""

    def check(admin: Admin) -> bool:
        desc = admin.describe_topics(topics)
        return all(
            len(p.replicas) == 3 and sorted(p.isr) == cluster.ids
            for t in topics
            for p in desc[t].partitions
        )

    return bool(admin_call(cluster, check))
