"""DeleteRecords, for both front doors: the leader moves its log start offset, then the
answer waits until every in-sync replica's start has followed (Kafka's low watermark).

A follower takes the start every fetch answer carries and reports its own in its next
fetch; the replica manager tells this class when a partition's followers, ISR or role
change (``partition_changed``), and each waiting answer is settled then.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from logmq.errors import ErrorCode, LogMQError, Outcome

if TYPE_CHECKING:
    from logmq.broker.replica.remote_log import RemoteLogManager
    from logmq.broker.replica.replica_manager import ReplicaManager

TopicPartition = tuple[str, int]


@dataclass(slots=True)
class DeletedRecords(Outcome):
    """One partition's DeleteRecords answer: its low watermark (-1 on an error)."""

    low_watermark: int = -1


class RecordDeletion:
    """DeleteRecords answers, each waiting on its partition's low watermark."""

    def __init__(self, replicas: ReplicaManager, remote: RemoteLogManager | None = None) -> None:
        self.replicas = replicas
        self.remote = remote  # a tiered partition's deletions reach its remote tier too
        self.logs = replicas.logs
        self.waiters = replicas.waiters
        # the answers waiting for the ISR's log start offsets: (offset, future)
        self._trims: dict[TopicPartition, list[tuple[int, asyncio.Future[int]]]] = {}
        replicas.watch(self)

    def partition_changed(self, key: TopicPartition | None) -> None:
        """A partition's followers, ISR or role changed (None: the broker is stopping)."""
        if key is None:
            for k in list(self._trims):
                self._check_trims(k)
        elif key in self._trims:
            self._check_trims(key)

    async def delete_records(
        self, offsets: dict[TopicPartition, int], timeout_ms: int
    ) -> dict[TopicPartition, DeletedRecords]:
        """DeleteRecords for both front doors: one answer per partition, all partitions at
        once."""

        async def one(key: TopicPartition, offset: int) -> DeletedRecords:
            try:
                low = await self._delete_records(*key, offset, timeout_ms)
            except LogMQError as e:
                return DeletedRecords.failed(e)
            return DeletedRecords(low_watermark=low)

        results = await asyncio.gather(*(one(k, o) for k, o in offsets.items()))
        return dict(zip(offsets, results, strict=True))

    async def _delete_records(
        self, topic: str, partition: int, offset: int, timeout_ms: int
    ) -> int:
        """Move the log start offset to ``offset`` (-1: the HW); returns the low watermark.

        The leader moves its own start and writes the log-start checkpoint first, so the
        deletion survives a crash. Followers take the start every fetch answer carries
        and report theirs in their next fetch; the answer waits until every ISR member's
        start has reached ``offset`` (Kafka's low watermark), else REQUEST_TIMED_OUT.
        """
        key = (topic, partition)
        plog = self.replicas.leader_log(topic, partition)
        if not plog.config.delete:
            raise LogMQError(
                f"records of {topic}-{partition} cannot be deleted: cleanup.policy is "
                f"{plog.config.cleanup_policy}",
                ErrorCode.POLICY_VIOLATION,
            )
        hw = plog.high_watermark
        target = hw if offset == -1 else offset
        if not 0 <= target <= hw:
            raise LogMQError(
                f"cannot delete {topic}-{partition} records below {offset}: the offset must "
                f"be in [0, {hw}] (the high watermark) or -1",
                ErrorCode.OFFSET_OUT_OF_RANGE,
            )
        if self.remote is not None and plog.remote_managed:
            self.remote.delete_records_below(plog, target)
            self.waiters.notify(key)  # the followers learn the new log start now
        if target > plog.log_start_offset:
            plog.advance_log_start_offset(target)
            await self.logs.checkpoint()
            self.waiters.notify(key)  # followers in a fetch session hear of it now
        low = self._low_watermark(key)
        if low >= target:
            return low
        fut: asyncio.Future[int] = self.replicas.loop().create_future()
        entry = (target, fut)
        self._trims.setdefault(key, []).append(entry)
        try:
            return await asyncio.wait_for(fut, max(timeout_ms, 0) / 1000)
        except TimeoutError:
            raise LogMQError(
                f"{topic}-{partition}: the in-sync replicas did not delete below {target} "
                f"within {timeout_ms} ms (the leader did)",
                ErrorCode.REQUEST_TIMED_OUT,
            ) from None
        finally:
            waiting = self._trims.get(key)
            if waiting is not None and entry in waiting:
                waiting.remove(entry)
                if not waiting:
                    del self._trims[key]

    def _low_watermark(self, key: TopicPartition) -> int:
        """The lowest log start offset over the ISR (-1 unknown); raises if not leader."""
        plog = self.replicas.leader_log(*key)
        replica = self.replicas.replica(key)
        start = plog.log_start_offset
        if self.remote is not None and plog.remote_managed:
            # over both tiers, as the followers of a tiered log report theirs
            start = self.remote.log_start_offset(plog)
        if replica is None:
            return start  # a single broker: its own log is the ISR
        return replica.low_watermark(start)

    def _check_trims(self, key: TopicPartition) -> None:
        """Answer the DeleteRecords waiting on ``key`` that the low watermark now passes."""
        waiting = self._trims.get(key, [])
        try:
            low = -1 if self.replicas.stopped else self._low_watermark(key)
            error = None
        except LogMQError as e:
            low, error = -1, e
        if self.replicas.stopped:
            error = LogMQError("the broker is stopping", ErrorCode.NOT_LEADER_OR_FOLLOWER)
        for target, fut in waiting:
            if fut.done():
                continue
            if error is not None:
                fut.set_exception(error)
            elif low >= target:
                fut.set_result(low)
