"""What a fetch read, per partition: the replica manager's answer both doors encode.

A read is a list of ``(topic, [PartitionRead, ...])`` in the order asked. Each
partition carries its numbers and, when it read records, the file region that goes
out with ``sendfile``: the Kafka door writes the region after the partition's fields,
the native door after its msgpack head. Neither door sees the other's shape.
"""

from __future__ import annotations

from collections.abc import Iterable

from logmq.errors import ErrorCode
from logmq.net.reply import FileRegion


class PartitionRead:
    """One partition of a fetch answer (a slotted class: one per partition per fetch)."""

    __slots__ = (
        "aborted",
        "error",
        "high_watermark",
        "last_stable_offset",
        "log_start_offset",
        "message",
        "partition",
        "records",
    )

    def __init__(
        self,
        partition: int,
        error: ErrorCode,
        high_watermark: int,
        log_start_offset: int,
        records: FileRegion | bytes | None = None,
        message: str | None = None,
        last_stable_offset: int | None = None,
        aborted: list[tuple[int, int]] | None = None,
    ) -> None:
        self.partition = partition
        self.error = error
        self.high_watermark = high_watermark
        self.log_start_offset = log_start_offset
        self.records = records
        self.message = message
        lso = last_stable_offset
        self.last_stable_offset = high_watermark if lso is None else lso
        # a read_committed read: (producer id, first offset) of the aborted transactions
        # in its records, which the consumer drops (None: read_uncommitted, or none)
        self.aborted = aborted

    @property
    def size(self) -> int:
        """Bytes of records this partition sends (0 for none)."""
        records = self.records
        if records is None:
            return 0
        return len(records) if isinstance(records, bytes) else records.length

    def __repr__(self) -> str:
        return (
            f"PartitionRead({self.partition}, {self.error.name}, hw={self.high_watermark}, "
            f"start={self.log_start_offset}, size={self.size})"
        )


TopicRead = tuple[str, list[PartitionRead]]


def failed(partition: int, error: ErrorCode, message: str | None = None, start: int = -1):
    """A partition answered with an error: no records, unknown HW."""
    return PartitionRead(partition, error, -1, start, None, message)


def regions(topics: Iterable[TopicRead]) -> list[FileRegion]:
    """The file regions of a read, in answer order (the native door's tail)."""
    return [
        p.records
        for _, parts in topics
        for p in parts
        if p.records is not None and not isinstance(p.records, bytes)
    ]
