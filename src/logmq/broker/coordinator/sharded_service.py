"""What the coordinator services of internal topics share (groups, transactions).

A key (a group id, a transactional id) belongs to one partition of an internal compacted
topic, ``partition_of(key, N)``; its coordinator is that partition's leader. A service
follows the metadata image (``on_partitions_changed``) and runs one shard per partition
this broker leads: it loads when this broker becomes the leader and unloads when it stops.
It creates the topic on first use and routes a key to its shard.

A shard belongs to one leader epoch. Leadership that comes back at a newer epoch (this
broker lost it and regained it, possibly within one metadata change) means another
leader may have written in between, so the old shard is dropped and a new one loads
from the log. Shards are taken out of the routing table at once when leadership goes;
only their shutdown runs in the background. A shard's writes go through the replica
manager exactly as an acks=all produce does (``LeaderReplication``).

What differs per topic comes in as parameters: the topic's name, configs and partition
count, how a key maps to a partition, and a factory building the domain's shard.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, Unpack

from logmq.broker.coordinator.shard_runtime import (
    CoordinatorError,
    CoordinatorShard,
    LeaderReplication,
    ShardOptions,
)
from logmq.errors import ErrorCode, LogMQError
from logmq.storage.config import LogConfig

if TYPE_CHECKING:
    from logmq.broker.config import BrokerConfig
    from logmq.broker.metadata.publisher import PartitionChanges
    from logmq.broker.metadata.quorum_service import MetadataQuorum
    from logmq.broker.metadata.topic_creation import TopicCreator
    from logmq.broker.replica.local_logs import LocalLogs
    from logmq.broker.replica.replica_manager import ReplicaManager
    from logmq.cluster.metadata_image import MetadataImage
    from logmq.storage.log_manager import LogManager
    from logmq.storage.partition_log import PartitionLog

log = logging.getLogger("logmq.coordinator")

S = TypeVar("S", bound=CoordinatorShard[Any])
S_co = TypeVar("S_co", bound=CoordinatorShard[Any], covariant=True)


class ShardFactory(Protocol[S_co]):
    """Builds the (unloaded) shard of one partition from what every domain's shard takes
    (``functools.partial`` of a shard class binds the domain's own arguments)."""

    def __call__(
        self,
        partition: int,
        partition_count: int,
        logs: LogManager,
        get_log: Callable[[], PartitionLog | None],
        /,
        **options: Unpack[ShardOptions],
    ) -> S_co: ...


class ShardedCoordinatorService(Generic[S]):
    """Leadership following, topic creation and routing for one internal topic.

    ``replication_factor`` None: the TopicCreator's rule for internal topics;
    ``write_timeout_ms`` None: the broker's coordinator write timeout
    (``offsets_commit_timeout_ms``).
    """

    def __init__(
        self,
        cfg: BrokerConfig,
        quorum: MetadataQuorum,
        logs: LogManager,
        local_logs: LocalLogs,
        replicas: ReplicaManager,
        topic_creator: TopicCreator,
        *,
        topic: str,
        topic_partitions: int,
        topic_configs: dict[str, str],
        partition_of: Callable[[str, int], int],
        new_shard: ShardFactory[S],
        replication_factor: int | None = None,
        write_timeout_ms: int | None = None,
        logger: logging.Logger = log,
    ) -> None:
        self.node_id = cfg.node_id
        self.topic = topic
        self.topic_partitions = topic_partitions  # to create the topic with
        self.topic_configs = topic_configs
        self.replication_factor = replication_factor
        self.write_timeout_ms = (
            cfg.offsets_commit_timeout_ms if write_timeout_ms is None else write_timeout_ms
        )
        self.quorum = quorum
        self.logs = logs
        self.local_logs = local_logs
        self.replicas = replicas
        self.topic_creator = topic_creator
        self.partition_count = 0  # of the topic; 0 until it exists
        self._partition_of = partition_of
        self._new_shard = new_shard
        self._log = logger
        self._shards: dict[int, S] = {}
        self._started = False
        self._unloading: set[asyncio.Task[Any]] = set()

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Coordinate from now on: the partitions this broker leads load now.

        The broker calls this once its metadata has caught up, so the leaderships that
        a restart replays (and that registration then moves) never load a shard.
        """
        self._started = True
        image = self.quorum.image
        self.partition_count = self._count_in(image)
        for part in image.partitions():
            if part.topic == self.topic and part.leader == self.node_id:
                self.on_became_leader(part.partition, part.leader_epoch)

    async def stop(self) -> None:
        self._started = False
        for partition in list(self._shards):
            await self.on_resigned(partition)
        for task in list(self._unloading):
            await task

    # -- following the metadata image ---------------------------------------------------
    def on_partitions_changed(self, image: MetadataImage, changes: PartitionChanges) -> None:
        """Load shards of partitions we now lead, unload those we no longer do."""
        self.partition_count = self._count_in(image)
        self._image_changed(image)
        if not self._started:
            return
        for (topic, partition), part in changes.leaders.items():
            if topic == self.topic:
                self.on_became_leader(partition, part.leader_epoch)
        gone = [k for k in (*changes.followers, *changes.deleted) if k[0] == self.topic]
        for _, partition in gone:
            self._retire(partition)

    def _image_changed(self, image: MetadataImage) -> None:
        """Any metadata change, started or not, before leadership is followed (a hook)."""

    def _count_in(self, image: MetadataImage) -> int:
        topic = image.topics.get(self.topic)
        return len(topic.partitions) if topic is not None else 0

    def _retire(self, partition: int) -> None:
        """Stop routing to ``partition``'s shard now; unload it in the background."""
        shard = self._shards.pop(partition, None)
        if shard is None:
            return
        task = asyncio.get_running_loop().create_task(shard.unload())
        self._unloading.add(task)
        task.add_done_callback(self._unloading.discard)

    # -- leadership ---------------------------------------------------------------------
    def on_became_leader(self, partition: int, leader_epoch: int = 0) -> None:
        """Coordinate the keys of ``partition`` at ``leader_epoch``: load its records."""
        if not self._started:
            return
        current = self._shards.get(partition)
        if current is not None:
            if current.leader_epoch >= leader_epoch:
                return  # the same leadership (an ISR change, say)
            self._retire(partition)  # led again at a newer epoch: memory may be stale
        local_logs, topic = self.local_logs, self.topic

        def get_log() -> PartitionLog | None:
            return local_logs.local_log(topic, partition)

        shard = self._new_shard(
            partition,
            self.partition_count,
            self.logs,
            get_log,
            replication=LeaderReplication(self.replicas, topic, partition, get_log),
            leader_epoch=leader_epoch,
            replication_timeout_ms=self.write_timeout_ms,
        )
        self._shards[partition] = shard
        shard.load()

    async def on_resigned(self, partition: int) -> None:
        """Stop coordinating ``partition``'s keys; their requests go elsewhere."""
        shard = self._shards.pop(partition, None)
        if shard is not None:
            await shard.unload()

    # -- routing ------------------------------------------------------------------------
    def ensure_topic(self) -> int:
        """The topic's partition count, asking for the topic on first use.

        Creating it goes through the controller, so the first callers get the retriable
        COORDINATOR_NOT_AVAILABLE until the topic is in the metadata image (as in Kafka).
        """
        if self.partition_count:
            return self.partition_count
        if not self._started:
            raise CoordinatorError("the broker is stopping", ErrorCode.COORDINATOR_NOT_AVAILABLE)
        topic = self.topic
        try:
            if self.replication_factor is None:
                self.topic_creator.create_internal_topic_soon(
                    topic, self.topic_partitions, self.topic_configs
                )
            else:
                LogConfig.from_dict(dict(self.topic_configs))
                body = {
                    "topic": topic,
                    "partitions": self.topic_partitions,
                    "replication_factor": self.replication_factor,
                    "configs": dict(self.topic_configs),
                    "internal": True,
                }
                self.topic_creator.create_topic_soon(topic, body)
        except (LogMQError, OSError, ValueError) as exc:
            self._log.error("cannot create %s: %s", topic, exc)
            raise CoordinatorError(
                f"cannot create {topic}: {exc}", ErrorCode.COORDINATOR_NOT_AVAILABLE
            ) from exc
        raise CoordinatorError(f"{topic} is being created", ErrorCode.COORDINATOR_NOT_AVAILABLE)

    def partition_for(self, key: str) -> int:
        return self._partition_of(key, self.ensure_topic())

    def coordinator_for(self, key: str) -> tuple[int, str, int]:
        """(node id, host, port) of the broker leading ``key``'s partition, creating the
        topic on first use."""
        partition = self.partition_for(key)
        image = self.quorum.image
        part = image.partition(self.topic, partition)
        reg = image.brokers.get(part.leader) if part is not None else None
        if reg is None or reg.fenced:
            raise CoordinatorError(
                f"{self.topic}-{partition} has no available leader",
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
            )
        return reg.broker_id, reg.host, reg.port

    def shard_for(self, key: str) -> S:
        """The shard coordinating ``key``; NOT_COORDINATOR if another broker's."""
        partition = self.partition_for(key)
        shard = self._shards.get(partition)
        if shard is None:
            raise CoordinatorError(
                f"this broker does not coordinate {self.topic}-{partition}",
                ErrorCode.NOT_COORDINATOR,
            )
        return shard

    def shards(self) -> list[S]:
        """Every shard of this broker, by partition (the topic is not created for this)."""
        return [self._shards[p] for p in sorted(self._shards)]
