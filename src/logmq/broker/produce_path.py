"""The produce path both front doors share, from a partition's batches to the log.

A client's records for one partition: refused on internal topics (only the broker
writes ``__consumer_offsets``), held while their topic is being auto-created (in arrival
order, so pipelined produces keep their order: topic_creation.PendingTopics), then
appended by the replica manager as the partition's leader (validation and stamping by
the storage, min.insync.replicas, the HW, acks=all). The native handler (data_api.py)
and the Kafka one (kafka/apis.py) only translate requests and answers around it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from logmq.broker.metadata_store import is_internal
from logmq.broker.topic_creation import PendingTopics
from logmq.errors import ErrorCode, LogMQError

if TYPE_CHECKING:
    from logmq.broker.metadata_store import TopicInfo
    from logmq.broker.replica_manager import ReplicaManager
    from logmq.cluster.metadata_image import MetadataImage
    from logmq.storage.partition_log import PartitionLog
    from logmq.storage.stamping import AppendInfo


class AutoCreator(Protocol):
    def maybe_auto_create(self, topic: str) -> TopicInfo | None: ...

    async def auto_create(self, topic: str) -> TopicInfo | None: ...


class ProducePath:
    def __init__(
        self,
        replicas: ReplicaManager,
        image: Callable[[], MetadataImage],
        topic_creator: AutoCreator,
    ) -> None:
        self.replicas = replicas
        self.image = image
        # Produces to topics being auto-created wait here, in arrival order.
        self.pending_topics = PendingTopics(topic_creator.auto_create)

    def stop(self) -> None:
        """Cancel auto-creations still running (the broker is shutting down)."""
        self.pending_topics.stop()

    async def before_appends(self, keys: Iterable[tuple[str, int]]) -> None:
        """Once per produce request, before its appends start (in arrival order):
        waits while the logs of newly created partitions are still being made."""
        await self.replicas.new_logs_made(keys)

    async def append(
        self, topic: str, partition: int, data: Any, acks: int, timeout_ms: int
    ) -> tuple[AppendInfo, PartitionLog]:
        """Append one partition's batches; LogMQError with the code the client gets."""
        if is_internal(topic):
            raise LogMQError(
                f"{topic!r} is an internal topic: clients cannot produce to it",
                ErrorCode.INVALID_TOPIC_EXCEPTION,
            )
        pending = self.pending_topics
        if topic not in self.image().topics or pending.waiting(topic):
            await pending.wait(topic)  # auto-create runs on the controller; in order
        plog = self.replicas.leader_log(topic, partition)
        if not data:
            raise LogMQError("empty record set", ErrorCode.CORRUPT_MESSAGE)
        info = await self.replicas.append((topic, partition), plog, data, acks, timeout_ms)
        return info, plog
