"""Tells the broker's subsystems what a new metadata image means for this broker.

The MetadataLoader hands every new image and its delta to ``MetadataPublisher``, which
turns them into ``PartitionChanges`` for this broker (partitions it now leads, follows,
or must drop, with leader, leader epoch, partition epoch, replicas and ISR in each
PartitionRegistration) and passes them to every registered listener in order: first the
broker's log bookkeeping (create/delete logs), then the replica manager (data
replication), then the group coordinator (load/unload ``__consumer_offsets`` shards).

After a snapshot is restored there is no delta: the publisher then compares the whole
image with what this broker last saw, so listeners get the same kind of changes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

from logmq.cluster.metadata_image import (
    LocalReplicaChanges,
    MetadataDelta,
    MetadataImage,
    PartitionRegistration,
    TopicPartition,
)

log = logging.getLogger("logmq.broker.metadata")

PartitionChanges = LocalReplicaChanges


class PartitionListener(Protocol):
    def on_partitions_changed(self, image: MetadataImage, changes: PartitionChanges) -> None:
        """Called on the event loop thread, in log order; must not block."""


def full_changes(
    image: MetadataImage, broker_id: int, held: Mapping[TopicPartition, object]
) -> PartitionChanges:
    """Every partition ``broker_id`` replicates in ``image``; ``held`` ones not in it go."""
    leaders: dict[TopicPartition, PartitionRegistration] = {}
    followers: dict[TopicPartition, PartitionRegistration] = {}
    for part in image.partitions():
        if broker_id not in part.replicas:
            continue
        (leaders if part.leader == broker_id else followers)[part.key] = part
    deleted = {key for key in held if key not in leaders and key not in followers}
    return LocalReplicaChanges(leaders, followers, deleted)


class MetadataPublisher:
    def __init__(self, broker_id: int) -> None:
        self.broker_id = broker_id
        self.image: MetadataImage | None = None
        self._listeners: list[PartitionListener] = []
        # partitions this broker replicates, as last published
        self.local: dict[TopicPartition, PartitionRegistration] = {}

    def add_listener(self, listener: PartitionListener) -> None:
        self._listeners.append(listener)

    def publish(self, image: MetadataImage, delta: MetadataDelta | None) -> None:
        """The MetadataLoader listener."""
        if delta is None:
            changes = full_changes(image, self.broker_id, self.local)
        else:
            changes = delta.local_changes(self.broker_id)
        self.image = image
        for key in changes.deleted:
            self.local.pop(key, None)
        self.local.update(changes.leaders)
        self.local.update(changes.followers)
        for listener in self._listeners:
            try:
                listener.on_partitions_changed(image, changes)
            except Exception:
                log.exception("partition listener %r failed", listener)
