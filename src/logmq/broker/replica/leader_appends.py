"""Appends as a partition's leader: produce batches and transaction markers.

A single broker's partition is its own ISR: it stamps leader epoch 0 and its HW is its
log end offset. A replicated one checks min.insync.replicas first, stamps the replica's
leader epoch, lets the HW move (after an fsync the topic's policy asks for) and, for
acks=all, waits until the HW passes the batch (``ReplicaManager.wait_replicated``).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from logmq.broker.replica.replica_manager import LEADER_EPOCH

if TYPE_CHECKING:
    from logmq.broker.replica.replica_manager import ReplicaManager
    from logmq.storage.partition_log import PartitionLog
    from logmq.storage.stamping import AppendInfo

TopicPartition = tuple[str, int]


class LeaderAppends:
    """The write of each append, and what its answer waits for."""

    def __init__(self, replicas: ReplicaManager) -> None:
        self.replicas = replicas
        self.logs = replicas.logs
        self.waiters = replicas.waiters

    async def append(
        self,
        key: TopicPartition,
        plog: PartitionLog,
        data: Any,
        acks: int,
        timeout_ms: int,
        *,
        control: bool = False,
    ) -> AppendInfo:
        """Append produce data as the partition's leader; acks=all waits for the HW
        (``append_now``, then what it leaves to wait for). ``control``: transaction
        markers (broker/coordinator/txn_markers.py), which clients may not write."""
        info, rest = self.append_now(key, plog, data, acks, timeout_ms, control=control)
        if rest is not None:
            await rest
        return info

    def append_now(
        self,
        key: TopicPartition,
        plog: PartitionLog,
        data: Any,
        acks: int,
        timeout_ms: int,
        *,
        control: bool = False,
    ) -> tuple[AppendInfo, Coroutine[Any, Any, None] | None]:
        """The write of an append, at once, and what its answer still waits for (an
        fsync the topic's policy asks for, then acks=all replication), or None.

        A single broker's partition is its own ISR: it stamps leader epoch 0 and its HW
        is its log end offset. A replicated one checks min.insync.replicas first and
        stamps the replica's leader epoch. The HW moves (and followers hear of the
        append) only after a required fsync, as before the split.
        """
        logs = self.logs
        if not self.replicas.replicated:  # the hot path of a single broker, inlined
            info = logs.write(plog, data, leader_epoch=LEADER_EPOCH, control=control)
            if logs.must_sync(plog, info):
                return info, self._synced_single(key, plog, info)
            if not info.duplicate:
                plog.high_watermark = plog.log_end_offset
                self.waiters.notify(key)
            return info, None
        epoch = self.replicas.check_append(key, acks, plog.config.min_insync_replicas)
        info = logs.write(plog, data, leader_epoch=epoch, control=control)
        sync = logs.must_sync(plog, info)
        if not sync:
            if not info.duplicate:
                self.replicas.on_append(key, plog)
            if acks != -1:
                return info, None
        return info, self._replicated_rest(key, plog, info, acks, timeout_ms, sync)

    async def _synced_single(
        self, key: TopicPartition, plog: PartitionLog, info: AppendInfo
    ) -> None:
        await self.logs.sync(plog)
        if not info.duplicate:
            plog.high_watermark = plog.log_end_offset
            self.waiters.notify(key)

    async def _replicated_rest(
        self,
        key: TopicPartition,
        plog: PartitionLog,
        info: AppendInfo,
        acks: int,
        timeout_ms: int,
        sync: bool,
    ) -> None:
        if sync:
            await self.logs.sync(plog)
            if not info.duplicate:
                self.replicas.on_append(key, plog)
        if acks == -1:
            # A retried duplicate waits too: its first attempt may not be replicated yet.
            await self.replicas.wait_replicated(key, info.last_offset + 1, timeout_ms)
