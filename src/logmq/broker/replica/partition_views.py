"""Read-only views of partitions both front doors answer from: this broker's local copies
(DescribeLogDirs) and the moves in progress (ListPartitionReassignments); and the ones
the metrics read at scrape time (sizes, the health of partitions led here, HWs).

Typed results, so each door encodes them its own way (native dicts, Kafka's messages)
and neither translates the other's answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from logmq.cluster.metadata_image import MetadataImage, PartitionRegistration
    from logmq.storage.log_manager import LogManager

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class LocalCopy:
    """One partition's log on this broker, as DescribeLogDirs reports it."""

    topic: str
    partition: int
    size: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int


@dataclass(frozen=True, slots=True)
class LogDirReport:
    broker_id: int
    log_dir: str
    total_bytes: int
    usable_bytes: int
    copies: list[LocalCopy]


@dataclass(frozen=True, slots=True)
class Reassignments:
    throttle_bytes_per_sec: int | None
    moving: list[PartitionRegistration]


class PartitionViews:
    """What this broker holds and what its metadata image says is moving."""

    def __init__(self, node_id: int, image: Callable[[], MetadataImage], logs: LogManager) -> None:
        self.node_id = node_id
        self.image = image
        self.logs = logs

    def partition_stats(self) -> list[tuple[str, int, int, int]]:
        """(topic, partition, log end offset, bytes) of every local log (metrics)."""
        return [
            (plog.topic, plog.partition, plog.log_end_offset, plog.size_bytes())
            for plog in list(self.logs.logs())
        ]

    def led_partitions(self) -> Iterator[tuple[int, int, int]]:
        """(replication factor, ISR size, min.insync.replicas) of each partition led here,
        from the metadata image (the ISR the controller committed). The replication
        factor leaves out replicas a reassignment is adding, as Kafka's does."""
        for p in self.image().partitions():
            if p.leader != self.node_id:
                continue
            plog = self.logs.get_log(p.topic, p.partition)
            min_isr = plog.config.min_insync_replicas if plog is not None else 1
            yield len(p.original_replicas), len(p.isr), min_isr

    def high_watermark(self, topic: str, partition: int) -> int | None:
        plog = self.logs.get_log(topic, partition)
        return plog.high_watermark if plog is not None else None

    def log_dirs(self, keys: Iterable[TopicPartition] | None) -> LogDirReport:
        """This broker's copies of ``keys`` (every local log when None) that the metadata
        still knows, in (topic, partition) order when all are asked for."""
        logs, image = self.logs, self.image()
        if keys is None:
            found = sorted(logs.logs(), key=lambda plog: (plog.topic, plog.partition))
        else:
            found = [
                plog
                for plog in (logs.get_log(*key) for key in dict.fromkeys(keys))
                if plog is not None and image.partition(plog.topic, plog.partition) is not None
            ]
        disk = logs.disk
        return LogDirReport(
            self.node_id,
            str(logs.data_dir.resolve()),
            disk.total_bytes,
            disk.free_bytes,
            [
                LocalCopy(
                    plog.topic,
                    plog.partition,
                    plog.size_bytes(),
                    plog.log_start_offset,
                    plog.log_end_offset,
                    plog.high_watermark,
                )
                for plog in found
            ],
        )

    def reassignments(self, keys: Iterable[TopicPartition] | None) -> Reassignments:
        """The partitions of ``keys`` (every one when None) being moved, and the throttle."""
        image = self.image()
        if keys is None:
            moving = sorted(image.reassignments(), key=lambda p: p.key)
        else:
            parts = (image.partition(*key) for key in dict.fromkeys(keys))
            moving = [p for p in parts if p is not None and p.reassigning]
        return Reassignments(image.reassignment_throttle, moving)
