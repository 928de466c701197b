"""This broker's partition logs, kept in step with the metadata image.

The image says which partitions this broker replicates; the LogManager holds their files.
``LocalLogs`` creates the logs of partitions assigned here and mirrors topic configs
(the first metadata listener, so logs exist before the replica manager and the group
coordinator use them); ``RemovedLogs`` deletes those of partitions no longer here (the
last listener, once the others have let go of them). The replica manager looks logs up
here, with the leader checks a Kafka client relies on to refresh its metadata; the
handlers ask the replica manager. High watermarks are the replica manager's to set.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container

from logmq.broker.metadata.publisher import PartitionChanges
from logmq.broker.replica.fetch_waiter import FetchWaiters
from logmq.cluster.metadata_image import MetadataImage, TopicPartition
from logmq.errors import ErrorCode, LogMQError
from logmq.storage.log_manager import LogManager
from logmq.storage.partition_log import PartitionLog

log = logging.getLogger("logmq.broker")


class LocalLogs:
    def __init__(
        self,
        node_id: int,
        logs: LogManager,
        image: Callable[[], MetadataImage],
        waiters: FetchWaiters,
    ) -> None:
        self.node_id = node_id
        self.logs = logs
        self._image = image
        self.waiters = waiters

    # -- following the metadata image --------------------------------------------------
    def on_partitions_changed(self, image: MetadataImage, changes: PartitionChanges) -> None:
        """Create logs for partitions assigned here and mirror topic configs.

        Logs of removed partitions go last (``RemovedLogs``), once the replica manager
        and the group coordinator have let go of them.
        """
        logs = self.logs
        missing = [
            part.key
            for part in (*changes.leaders.values(), *changes.followers.values())
            if self._find(part.topic, part.partition) is None
        ]
        if missing:  # in one go: one fsync of the data directory for all of them
            topics = {topic for topic, _ in missing}
            logs.create_logs(missing, {t: dict(image.topic_config(t)) for t in topics})
        for name in image.topics:
            wanted = dict(image.topic_config(name))
            if wanted != dict(logs.topic_overrides(name)):
                logs.set_topic_config(name, wanted)
        if changes:
            for key in changes.leaders.keys() | changes.followers.keys():
                self.waiters.notify(key)

    def drop_removed_logs(self, changes: PartitionChanges) -> None:
        for key in changes.deleted:
            if self._find(*key) is not None:
                self.logs.delete_log(*key)
            self.waiters.notify(key)

    def delete_stray_logs(self, mine: Container[TopicPartition]) -> None:
        """Delete logs on disk of partitions this broker does not replicate (once caught up)."""
        for plog in list(self.logs.logs()):
            if (plog.topic, plog.partition) not in mine:
                log.warning("deleting stray log %s-%d", plog.topic, plog.partition)
                self.logs.delete_log(plog.topic, plog.partition)

    # -- lookups: the replica manager's view of this broker's logs ----------------------
    def _find(self, topic: str, partition: int) -> PartitionLog | None:
        try:
            return self.logs.get_log(topic, partition)
        except (KeyError, LogMQError):
            return None

    def local_log(self, topic: str, partition: int) -> PartitionLog | None:
        """This broker's replica of a partition, whatever its role."""
        if self._image().partition(topic, partition) is None:
            return None
        return self._find(topic, partition)

    def leader_log(self, topic: str, partition: int) -> PartitionLog | None:
        """The log of a partition this broker leads; None if unknown.

        NOT_LEADER_OR_FOLLOWER (retriable: clients refresh metadata) when another broker
        leads it or it has no leader.
        """
        part = self._image().partition(topic, partition)
        if part is None:
            return None
        if part.leader != self.node_id:
            raise LogMQError(
                f"broker {self.node_id} does not lead {topic}-{partition} (leader: {part.leader})",
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
            )
        return self._find(topic, partition)


class RemovedLogs:
    """The last metadata listener: deletes the logs of partitions no longer here."""

    def __init__(self, local_logs: LocalLogs) -> None:
        self._local_logs = local_logs

    def on_partitions_changed(self, image: MetadataImage, changes: PartitionChanges) -> None:
        self._local_logs.drop_removed_logs(changes)
