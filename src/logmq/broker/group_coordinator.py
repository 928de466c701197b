"""The broker's consumer group coordinator: ``__consumer_offsets`` and its shards.

Groups live in the internal compacted topic ``__consumer_offsets``; a group's
coordinator is the leader of partition ``xxh32(group_id) % N``. This service creates the
topic on first use, runs one :class:`~logmq.broker.group_shard.GroupShard` per partition
this broker leads (``on_became_leader`` / ``on_resigned``: on a single node it leads
them all; replication calls the same two methods on leadership changes), routes a
group id to its shard and tells every shard when topics come, go or grow.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from logmq.broker.group_shard import CoordinatorError, GroupShard
from logmq.errors import ErrorCode, LogMQError
from logmq.group import OFFSETS_TOPIC, GroupConfig, coordinator_partition

if TYPE_CHECKING:
    from logmq.broker.broker import Broker

log = logging.getLogger("logmq.group")

# Compacted, never deleted by age or size: the newest value of a key is the state.
# Batches of the coordinator's own records may be large (a whole group's rebalance).
OFFSETS_TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "segment.bytes": str(100 << 20),
    "max.message.bytes": str(16 << 20),
}
# Configs an operator may not change on the offsets topic: any other value would let
# retention delete a key's newest value, i.e. forget groups and committed offsets.
PROTECTED_OFFSETS_CONFIGS = ("cleanup.policy", "retention.ms", "retention.bytes")


class GroupCoordinatorService:
    def __init__(self, broker: Broker) -> None:
        self._b = broker
        cfg = broker.config
        self.config = GroupConfig(
            session_timeout_ms=cfg.group_session_timeout_ms,
            heartbeat_interval_ms=cfg.group_heartbeat_interval_ms,
            rebalance_timeout_ms=cfg.group_rebalance_timeout_ms,
            max_metadata_bytes=cfg.offset_metadata_max_bytes,
            min_session_timeout_ms=cfg.group_min_session_timeout_ms,
            max_session_timeout_ms=cfg.group_max_session_timeout_ms,
            max_commit_bytes=cfg.offset_commit_max_bytes,
        )
        self.partition_count = 0  # of __consumer_offsets; 0 until it exists
        self._shards: dict[int, GroupShard] = {}
        self._topic_counts: dict[str, int] = {}
        self._started = False

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Take over the partitions of an existing offsets topic (loading runs async)."""
        self._started = True
        self._refresh_topic_counts()
        assert self._b.topics is not None
        info = self._b.topics.get(OFFSETS_TOPIC)
        if info is not None:
            self._lead_all(info.partitions)

    async def stop(self) -> None:
        self._started = False
        for partition in list(self._shards):
            await self.on_resigned(partition)

    def _lead_all(self, partitions: int) -> None:
        """A single node leads every partition of the offsets topic."""
        self.partition_count = partitions
        for partition in range(partitions):
            self.on_became_leader(partition)

    # -- leadership ---------------------------------------------------------------------
    def on_became_leader(self, partition: int, leader_epoch: int = 0) -> None:
        """Coordinate the groups of ``partition``: load them from its records."""
        if partition in self._shards or not self._started:
            return
        b = self._b
        assert b.logs is not None
        key = (OFFSETS_TOPIC, partition)
        shard = GroupShard(
            partition,
            self.partition_count,
            b.logs,
            lambda: b.get_log(OFFSETS_TOPIC, partition),
            self.config,
            lambda: self._topic_counts,
            leader_epoch=leader_epoch,
            on_append=lambda: b.waiters.notify(key),
        )
        self._shards[partition] = shard
        shard.load()

    async def on_resigned(self, partition: int) -> None:
        """Stop coordinating ``partition``'s groups; their requests go elsewhere."""
        shard = self._shards.pop(partition, None)
        if shard is not None:
            await shard.unload()

    # -- routing ------------------------------------------------------------------------
    def ensure_offsets_topic(self) -> int:
        """Create ``__consumer_offsets`` on first use; returns its partition count."""
        if self.partition_count:
            return self.partition_count
        if not self._started:
            raise CoordinatorError("the broker is stopping", ErrorCode.COORDINATOR_NOT_AVAILABLE)
        partitions = self._b.config.offsets_topic_partitions
        try:
            info = self._b.create_internal_topic(OFFSETS_TOPIC, partitions, OFFSETS_TOPIC_CONFIGS)
        except (LogMQError, OSError) as exc:
            log.error("cannot create %s: %s", OFFSETS_TOPIC, exc)
            raise CoordinatorError(
                f"cannot create {OFFSETS_TOPIC}: {exc}", ErrorCode.COORDINATOR_NOT_AVAILABLE
            ) from exc
        log.info("created %s with %d partitions", OFFSETS_TOPIC, info.partitions)
        self._lead_all(info.partitions)
        return self.partition_count

    def partition_for(self, group_id: str) -> int:
        return coordinator_partition(group_id, self.ensure_offsets_topic())

    def shard_for(self, group_id: str) -> GroupShard:
        """The shard coordinating ``group_id``; NOT_COORDINATOR if another broker's."""
        partition = self.partition_for(group_id)
        shard = self._shards.get(partition)
        if shard is None:
            raise CoordinatorError(
                f"this broker does not coordinate {OFFSETS_TOPIC}-{partition}",
                ErrorCode.NOT_COORDINATOR,
            )
        return shard

    def shards(self) -> list[GroupShard]:
        """Every shard of this broker (creating the offsets topic on first use)."""
        self.ensure_offsets_topic()
        return [self._shards[p] for p in sorted(self._shards)]

    # -- topic metadata -----------------------------------------------------------------
    def topics_changed(self, deleted: tuple[str, ...] = ()) -> None:
        """Topics were created, deleted or grown: every shard re-checks its groups."""
        self._refresh_topic_counts()
        for shard in self._shards.values():
            shard.metadata_changed(deleted)

    def _refresh_topic_counts(self) -> None:
        assert self._b.topics is not None
        # a new dict each time: shards and groups may hold on to the previous one
        self._topic_counts = {info.name: info.partitions for info in self._b.topics.all()}

    # -- metrics ------------------------------------------------------------------------
    def stats(self) -> tuple[int, int]:
        """(groups, members) over the loaded shards."""
        groups = members = 0
        for shard in list(self._shards.values()):
            g, m = shard.stats()
            groups += g
            members += m
        return groups, members
