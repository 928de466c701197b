"""What the cluster knows about one segment copied to the remote tier.

Kafka's RemoteLogSegmentMetadata, kept in the metadata quorum (docs/design.md says why
the quorum and not an internal topic): every broker's image holds, per partition, the
remote segments in base-offset order, so any broker that becomes leader, any follower
building its state, and any broker answering a fetch below the local log start, reads
the same list. A segment's life is COPY_STARTED -> COPY_FINISHED -> DELETE_STARTED ->
DELETE_FINISHED (then it leaves the image); a COPY_STARTED one whose copier lost the
leadership is an orphan the next leader deletes (COPY_STARTED -> DELETE_STARTED). A
COPY_FINISHED segment a reader found corrupt is marked so (``corrupt``), stays in
COPY_FINISHED, and is deleted once a new copy of its offsets has finished.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class SegmentState(IntEnum):
    COPY_STARTED = 0
    COPY_FINISHED = 1
    DELETE_STARTED = 2
    DELETE_FINISHED = 3


# The moves a segment may make (Kafka's RemoteLogSegmentState.isValidTransition).
VALID_TRANSITIONS: dict[SegmentState, frozenset[SegmentState]] = {
    SegmentState.COPY_STARTED: frozenset({SegmentState.COPY_FINISHED, SegmentState.DELETE_STARTED}),
    SegmentState.COPY_FINISHED: frozenset({SegmentState.DELETE_STARTED}),
    SegmentState.DELETE_STARTED: frozenset({SegmentState.DELETE_FINISHED}),
    SegmentState.DELETE_FINISHED: frozenset(),
}


@dataclass(frozen=True, slots=True)
class RemoteSegment:
    """One copied segment: where it is, what offsets and epochs it holds, its state.

    ``end_offset`` is the segment's last offset (inclusive, as Kafka's endOffset).
    ``leader_epochs`` are the (epoch, start offset) entries of the leader-epoch
    checkpoint that fall within the segment, so a reader or a follower can answer
    OffsetForLeaderEpoch over the remote part. ``checksum`` is the xxh3-64 (hex) of the
    segment's manifest object, which itself holds the checksum of every chunk and
    file, so a corrupted or truncated object is never served.
    """

    topic_id: str
    partition: int
    segment_id: str  # a fresh uuid4 hex per copy attempt: a re-copy never reuses a key
    base_offset: int
    end_offset: int
    max_timestamp: int
    size_bytes: int  # the .log object's size
    leader_epochs: tuple[tuple[int, int], ...]  # (epoch, start offset), ascending
    copier_epoch: int  # the leader epoch of the broker that copied it
    broker_id: int
    state: SegmentState = SegmentState.COPY_STARTED
    checksum: str = ""  # the manifest's xxh3-64 hex; set at COPY_FINISHED
    event_ms: int = 0  # when the last state change was asked for
    # the topic's name when copied: its objects' keys hold it, and a deleted topic's
    # remote data is deleted after the name has left the image
    topic: str = ""
    # a reader found its objects not matching their checksums: never served, and
    # copied again from a replica that still holds the offsets locally, if any
    corrupt: bool = False

    def with_state(
        self,
        state: SegmentState,
        *,
        checksum: str | None = None,
        event_ms: int | None = None,
        corrupt: bool | None = None,
    ) -> RemoteSegment:
        """This segment in ``state`` (built directly: a start replays one per change, and
        dataclasses.replace costs three times as much)."""
        return RemoteSegment(
            self.topic_id,
            self.partition,
            self.segment_id,
            self.base_offset,
            self.end_offset,
            self.max_timestamp,
            self.size_bytes,
            self.leader_epochs,
            self.copier_epoch,
            self.broker_id,
            state,
            self.checksum if checksum is None else checksum,
            self.event_ms if event_ms is None else event_ms,
            self.topic,
            self.corrupt if corrupt is None else corrupt,
        )

    @property
    def finished(self) -> bool:
        """Copied and not being deleted: part of the remote tier's offsets, corrupt or not."""
        return self.state is SegmentState.COPY_FINISHED

    @property
    def readable(self) -> bool:
        """Served to fetches: copied, not being deleted, and not found corrupt."""
        return self.state is SegmentState.COPY_FINISHED and not self.corrupt
