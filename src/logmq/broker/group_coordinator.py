"""The broker's consumer group coordinator: ``__consumer_offsets`` and its shards.

Groups live in the internal compacted topic ``__consumer_offsets``; a group's
coordinator is the leader of partition ``xxh32(group_id) % N``. This service creates the
topic on first use, runs one :class:`~logmq.broker.group_shard.GroupShard` per partition
this broker leads (``on_became_leader`` / ``on_resigned``, driven by the metadata image
through ``on_partitions_changed``: a shard loads when this broker becomes the leader of
its partition and unloads when it stops), routes a group id to its shard and tells every
shard when topics come, go or grow.

A shard belongs to one leader epoch. Leadership that comes back at a newer epoch (this
broker lost it and regained it, possibly within one metadata change) means another
leader may have written in between, so the old shard is dropped and a new one loads
from the log. Shards are taken out of the routing table at once when leadership goes;
only their shutdown runs in the background. A shard's writes go through the replica
manager exactly as an acks=all produce does (``OffsetsReplication``): answered once the
partition's high watermark passes them (at once on a single broker).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from logmq.broker.group_shard import CoordinatorError, GroupShard
from logmq.errors import ErrorCode, LogMQError
from logmq.group import OFFSETS_TOPIC, GroupConfig, coordinator_partition, group_id_error
from logmq.net.codec import ApiKey

if TYPE_CHECKING:
    from logmq.broker.config import BrokerConfig
    from logmq.broker.controller_service import MetadataQuorum
    from logmq.broker.local_logs import LocalLogs
    from logmq.broker.metadata_publisher import PartitionChanges
    from logmq.broker.replica_manager import ReplicaManager
    from logmq.broker.topic_creation import TopicCreator
    from logmq.cluster.metadata_image import MetadataImage
    from logmq.storage.log_manager import LogManager
    from logmq.storage.partition_log import PartitionLog

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


class OffsetsReplication:
    """An offsets partition's writes follow the acks=all produce path of the replica manager."""

    def __init__(
        self,
        replicas: ReplicaManager,
        partition: int,
        get_log: Callable[[], PartitionLog | None],
    ) -> None:
        self._replicas = replicas
        self._key = (OFFSETS_TOPIC, partition)
        self._get_log = get_log

    def check(self) -> tuple[ErrorCode, int]:
        plog = self._get_log()
        if plog is None:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, -1
        return self._replicas.check_append(self._key, -1, plog.config.min_insync_replicas)

    def appended(self, plog: PartitionLog) -> None:
        self._replicas.on_append(self._key, plog)

    async def replicated(self, offset: int, timeout_ms: int) -> ErrorCode:
        return await self._replicas.wait_replicated(self._key, offset, timeout_ms)


class GroupCoordinatorService:
    def __init__(
        self,
        cfg: BrokerConfig,
        quorum: MetadataQuorum,
        logs: LogManager,
        local_logs: LocalLogs,
        replicas: ReplicaManager,
        topic_creator: TopicCreator,
        run_on_controller: Callable[[int, dict[str, Any]], Awaitable[dict[str, Any]]],
    ) -> None:
        self.node_id = cfg.node_id
        self.offsets_topic_partitions = cfg.offsets_topic_partitions
        self.commit_timeout_ms = cfg.offsets_commit_timeout_ms
        self.quorum = quorum
        self.logs = logs
        self.local_logs = local_logs
        self.replicas = replicas
        self.topic_creator = topic_creator
        self.run_on_controller = run_on_controller
        self.config = GroupConfig(
            session_timeout_ms=cfg.group_session_timeout_ms,
            heartbeat_interval_ms=cfg.group_heartbeat_interval_ms,
            rebalance_timeout_ms=cfg.group_rebalance_timeout_ms,
            max_metadata_bytes=cfg.offset_metadata_max_bytes,
            min_session_timeout_ms=cfg.group_min_session_timeout_ms,
            max_session_timeout_ms=cfg.group_max_session_timeout_ms,
            max_commit_bytes=cfg.offset_commit_max_bytes,
            initial_rebalance_delay_ms=cfg.group_initial_rebalance_delay_ms,
        )
        self.partition_count = 0  # of __consumer_offsets; 0 until it exists
        self._shards: dict[int, GroupShard] = {}
        self._topic_counts: dict[str, int] = {}
        self._previous_counts: dict[str, int] = {}
        self._started = False
        self._unloading: set[asyncio.Task[Any]] = set()

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Coordinate from now on: the offsets partitions this broker leads load now.

        The broker calls this once its metadata has caught up, so the leaderships that
        a restart replays (and that registration then moves) never load a shard.
        """
        self._started = True
        self._refresh_topic_counts()
        image = self.quorum.image
        offsets = image.topics.get(OFFSETS_TOPIC)
        self.partition_count = len(offsets.partitions) if offsets is not None else 0
        for part in image.partitions():
            if part.topic == OFFSETS_TOPIC and part.leader == self.node_id:
                self.on_became_leader(part.partition, part.leader_epoch)

    async def stop(self) -> None:
        self._started = False
        for partition in list(self._shards):
            await self.on_resigned(partition)
        for task in list(self._unloading):
            await task

    # -- following the metadata image ----------------------------------------------------
    def on_partitions_changed(self, image: MetadataImage, changes: PartitionChanges) -> None:
        """Load shards of offsets partitions we now lead, unload those we no longer do."""
        offsets = image.topics.get(OFFSETS_TOPIC)
        self.partition_count = len(offsets.partitions) if offsets is not None else 0
        self._refresh_topic_counts()
        if self._topic_counts != self._previous_counts:
            deleted = tuple(sorted(set(self._previous_counts) - set(self._topic_counts)))
            for shard in self._shards.values():
                shard.metadata_changed(deleted)
        if not self._started:
            return
        for (topic, partition), part in changes.leaders.items():
            if topic == OFFSETS_TOPIC:
                self.on_became_leader(partition, part.leader_epoch)
        gone = [k for k in (*changes.followers, *changes.deleted) if k[0] == OFFSETS_TOPIC]
        for _, partition in gone:
            self._retire(partition)

    def _retire(self, partition: int) -> None:
        """Stop routing to ``partition``'s shard now; unload it in the background."""
        shard = self._shards.pop(partition, None)
        if shard is None:
            return
        task = asyncio.get_running_loop().create_task(shard.unload())
        self._unloading.add(task)
        task.add_done_callback(self._unloading.discard)

    async def find_coordinator(self, group_id: str) -> tuple[int, str, int]:
        """``coordinator_for``, first creating ``__consumer_offsets`` if need be."""
        await self.create_offsets_topic()
        return self.coordinator_for(group_id)

    async def create_offsets_topic(self) -> None:
        """Create ``__consumer_offsets`` through the controller on first use (a no-op after).

        The broker awaits this before the first group request, so that request finds
        the topic in the image (and its shards loading) instead of a retriable error.
        """
        if self.partition_count or not self._started:
            return
        rf = max(1, min(3, len(self.quorum.image.active_brokers())))
        body = {
            "topic": OFFSETS_TOPIC,
            "partitions": self.offsets_topic_partitions,
            "replication_factor": rf,
            "configs": OFFSETS_TOPIC_CONFIGS,
            "internal": True,
        }
        try:
            await self.run_on_controller(ApiKey.CREATE_TOPICS, {"topics": [body]})
        except LogMQError as exc:
            log.warning("cannot create %s: %s", OFFSETS_TOPIC, exc)

    def coordinator_for(self, group_id: str) -> tuple[int, str, int]:
        """(node id, host, port) of the broker leading ``group_id``'s offsets partition."""
        partition = self.partition_for(group_id)
        image = self.quorum.image
        part = image.partition(OFFSETS_TOPIC, partition)
        reg = image.brokers.get(part.leader) if part is not None else None
        if reg is None or reg.fenced:
            raise CoordinatorError(
                f"{OFFSETS_TOPIC}-{partition} has no available leader",
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
            )
        return reg.broker_id, reg.host, reg.port

    # -- leadership ---------------------------------------------------------------------
    def on_became_leader(self, partition: int, leader_epoch: int = 0) -> None:
        """Coordinate the groups of ``partition`` at ``leader_epoch``: load its records."""
        if not self._started:
            return
        current = self._shards.get(partition)
        if current is not None:
            if current.leader_epoch >= leader_epoch:
                return  # the same leadership (an ISR change, say)
            self._retire(partition)  # led again at a newer epoch: memory may be stale
        local_logs = self.local_logs

        def get_log() -> PartitionLog | None:
            return local_logs.local_log(OFFSETS_TOPIC, partition)

        shard = GroupShard(
            partition,
            self.partition_count,
            self.logs,
            get_log,
            self.config,
            lambda: self._topic_counts,
            replication=OffsetsReplication(self.replicas, partition, get_log),
            leader_epoch=leader_epoch,
            replication_timeout_ms=self.commit_timeout_ms,
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
        """The partition count of ``__consumer_offsets``, asking for it on first use.

        Creating it goes through the controller, so the first callers get the retriable
        COORDINATOR_NOT_AVAILABLE until the topic is in the metadata image (as in Kafka).
        """
        if self.partition_count:
            return self.partition_count
        if not self._started:
            raise CoordinatorError("the broker is stopping", ErrorCode.COORDINATOR_NOT_AVAILABLE)
        partitions = self.offsets_topic_partitions
        try:
            self.topic_creator.create_internal_topic_soon(
                OFFSETS_TOPIC, partitions, OFFSETS_TOPIC_CONFIGS
            )
        except (LogMQError, OSError) as exc:
            log.error("cannot create %s: %s", OFFSETS_TOPIC, exc)
            raise CoordinatorError(
                f"cannot create {OFFSETS_TOPIC}: {exc}", ErrorCode.COORDINATOR_NOT_AVAILABLE
            ) from exc
        raise CoordinatorError(
            f"{OFFSETS_TOPIC} is being created", ErrorCode.COORDINATOR_NOT_AVAILABLE
        )

    def partition_for(self, group_id: str) -> int:
        return coordinator_partition(group_id, self.ensure_offsets_topic())

    def submit(self, group_id: str, fn: Any) -> asyncio.Future[Any]:
        """Queue ``fn(core, now_ms)`` on the group's shard (both front doors' way in).

        The future fails with the LogMQError when the id is invalid or this broker does
        not coordinate the group (yet): callers gather many without a try each.
        """
        return self._on_shard(group_id, lambda shard: shard.submit(fn))

    def submit_parked(self, group_id: str, fn: Any) -> asyncio.Future[Any]:
        """Queue ``fn(core, now_ms, ticket)`` for a request that may wait (JoinGroup,
        SyncGroup): the future has its answer, given now or completed later, once durable."""
        return self._on_shard(group_id, lambda shard: shard.submit_parked(fn))

    def _on_shard(
        self, group_id: str, queue: Callable[[GroupShard], asyncio.Future[Any]]
    ) -> asyncio.Future[Any]:
        try:
            problem = group_id_error(group_id)
            if problem:
                raise LogMQError(problem, ErrorCode.INVALID_GROUP_ID)
            return queue(self.shard_for(group_id))
        except LogMQError as exc:
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            future.set_exception(exc)
            return future

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
        image = self.quorum.image
        # a new dict each time: shards and groups may hold on to the previous one
        self._previous_counts = self._topic_counts
        self._topic_counts = {name: len(t.partitions) for name, t in image.topics.items()}

    # -- metrics ------------------------------------------------------------------------
    def stats(self) -> tuple[int, int]:
        """(groups, members) over the loaded shards."""
        groups = members = 0
        for shard in list(self._shards.values()):
            g, m = shard.stats()
            groups += g
            members += m
        return groups, members
