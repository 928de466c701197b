"""The broker's consumer group coordinator: ``__consumer_offsets`` and its shards.

Groups live in the internal compacted topic ``__consumer_offsets``; a group's
coordinator is the leader of partition ``xxh32(group_id) % N``. Leadership following,
creating the topic on first use and routing are the shared
:class:`~logmq.broker.coordinator.sharded_service.ShardedCoordinatorService`'s; this service
runs one :class:`~logmq.broker.coordinator.group_shard.GroupShard` per partition this broker leads
and tells every shard when topics come, go or grow.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from logmq.broker.coordinator.group_shard import GroupShard
from logmq.broker.coordinator.sharded_service import ShardedCoordinatorService
from logmq.errors import ErrorCode, LogMQError, Outcome
from logmq.group import (
    OFFSETS_TOPIC,
    GroupConfig,
    OffsetEntry,
    coordinator_partition,
    group_id_error,
)
from logmq.net.codec import ApiKey

if TYPE_CHECKING:
    from logmq.broker.config import BrokerConfig
    from logmq.broker.metadata.quorum_service import MetadataQuorum
    from logmq.broker.metadata.topic_creation import TopicCreator
    from logmq.broker.replica.local_logs import LocalLogs
    from logmq.broker.replica.replica_manager import ReplicaManager
    from logmq.cluster.metadata_image import MetadataImage
    from logmq.group import GroupCoordinator, TopicPartition
    from logmq.storage.log_manager import LogManager

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


@dataclass(slots=True)
class GroupAnswer(Outcome):
    """One group's entry of a many-group request (``submit_each``): the core's
    ``answer``, or the error that kept the request from the group's shard (this broker
    does not coordinate it, its shard is loading, an invalid id) and no answer."""

    answer: Any = None


class GroupCoordinatorService(ShardedCoordinatorService[GroupShard]):
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
        super().__init__(
            cfg,
            quorum,
            logs,
            local_logs,
            replicas,
            topic_creator,
            topic=OFFSETS_TOPIC,
            topic_partitions=cfg.offsets_topic_partitions,
            topic_configs=OFFSETS_TOPIC_CONFIGS,
            partition_of=coordinator_partition,
            new_shard=partial(
                GroupShard, config=self.config, topic_partitions=lambda: self._topic_counts
            ),
            logger=log,
        )
        self.run_on_controller = run_on_controller
        self._topic_counts: dict[str, int] = {}
        self._previous_counts: dict[str, int] = {}

    # The names this service had before the shared base: same values.
    @property
    def offsets_topic_partitions(self) -> int:
        return self.topic_partitions

    @property
    def commit_timeout_ms(self) -> int:
        return self.write_timeout_ms

    # -- following the metadata image ---------------------------------------------------
    def start(self) -> None:
        self._refresh_topic_counts()
        super().start()

    def _image_changed(self, image: MetadataImage) -> None:
        """Topic partition counts may have changed: groups re-check their assignments."""
        self._refresh_topic_counts()
        if self._topic_counts != self._previous_counts:
            deleted = tuple(sorted(set(self._previous_counts) - set(self._topic_counts)))
            for shard in self._shards.values():
                shard.metadata_changed(deleted)

    # -- the offsets topic --------------------------------------------------------------
    def ensure_offsets_topic(self) -> int:
        """The partition count of ``__consumer_offsets``, asking for it on first use."""
        return self.ensure_topic()

    async def offsets_topic_guard(self, request: object) -> None:
        """The pipeline step before every group request of either door (the registries'
        ``offsets_topic``): the first one creates ``__consumer_offsets``."""
        if not self.partition_count:
            await self.create_offsets_topic()

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
            "partitions": self.topic_partitions,
            "replication_factor": rf,
            "configs": OFFSETS_TOPIC_CONFIGS,
            "internal": True,
        }
        try:
            await self.run_on_controller(ApiKey.CREATE_TOPICS, {"topics": [body]})
        except LogMQError as exc:
            log.warning("cannot create %s: %s", OFFSETS_TOPIC, exc)

    # -- routing ------------------------------------------------------------------------
    def submit(self, group_id: str, fn: Any) -> asyncio.Future[Any]:
        """Queue ``fn(core, now_ms)`` on the group's shard (both front doors' way in).

        The future fails with the LogMQError when the id is invalid or this broker does
        not coordinate the group (yet): callers gather many without a try each.
        """
        return self._on_shard(group_id, lambda shard: shard.submit(fn))

    async def submit_each(
        self, group_ids: Sequence[str], make: Callable[[str], Any]
    ) -> list[GroupAnswer]:
        """``make(group_id)`` queued on every group's shard at once (DescribeGroups,
        DeleteGroups...): one answer per group, in order. A LogMQError refusing a group
        is that group's entry; any other exception is the broker's fault and raised."""
        results = await asyncio.gather(
            *(self.submit(g, make(g)) for g in group_ids), return_exceptions=True
        )
        out = []
        for result in results:
            if isinstance(result, LogMQError):
                out.append(GroupAnswer.failed(result))
            elif isinstance(result, BaseException):
                raise result
            else:
                out.append(GroupAnswer(answer=result))
        return out

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

    # -- transactions (KIP-98) ---------------------------------------------------------
    async def txn_offset_commit(
        self,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        offsets: Mapping[TopicPartition, OffsetEntry],
        member_id: str = "",
        generation: int = -1,
        instance_id: str | None = None,
    ) -> dict[TopicPartition, ErrorCode]:
        """TxnOffsetCommit: the offsets wait in the group's shard for the producer's
        marker on the group's offsets partition. Raises LogMQError with the group-wide
        error (invalid id, not the coordinator, loading, ...)."""
        problem = group_id_error(group_id)
        if problem:
            raise LogMQError(problem, ErrorCode.INVALID_GROUP_ID)
        shard = self.shard_for(group_id)
        offsets = dict(offsets)

        def commit(core: GroupCoordinator, now_ms: int) -> dict[TopicPartition, ErrorCode]:
            return core.txn_offset_commit(
                group_id,
                producer_id,
                producer_epoch,
                offsets,
                member_id,
                generation,
                instance_id,
                now_ms,
                known_epoch=shard.producer_epoch(producer_id),
            )

        return await shard.submit(commit)

    async def complete_transaction(self, partition: int, producer_id: int, commit: bool) -> None:
        """MarkerWriter's ``on_offsets_marker``: the producer's marker is durable on
        ``__consumer_offsets-<partition>``; its pending offsets there become committed
        (or go). Quiet when this broker does not coordinate that partition: whoever
        loads it next reads the marker from the log."""
        shard = self._shards.get(partition)
        if shard is None:
            return
        future = shard.complete_txn(producer_id, commit)
        if future is None:
            return
        try:
            await future
        except LogMQError as exc:
            # the shard reloads from the log, which holds the marker: nothing is lost
            log.debug("settling producer %d on %s: %s", producer_id, shard.name, exc)

    def shards(self) -> list[GroupShard]:
        """Every shard of this broker (creating the offsets topic on first use)."""
        self.ensure_topic()
        return super().shards()

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

    def committed_offsets(self) -> Iterable[tuple[str, str, int, int]]:
        """(group, topic, partition, committed offset) of every group coordinated here."""
        for shard in list(self._shards.values()):
            yield from shard.committed_offsets()
