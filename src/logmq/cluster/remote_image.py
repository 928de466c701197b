"""The remote-segment part of the metadata image: per partition, its remote segments.

Keyed by topic id (then partition), not by name: a deleted topic's segments stay until
their objects are deleted, and a topic recreated under the same name never sees them.

Cost: images are immutable and rebuilt per metadata batch, so a batch touching no
remote segment shares this part as is, and one touching a partition copies that
partition's list and index once (C-speed copies, however many changes of it the batch
holds), the partition map of its topic, and the map of topics: never every partition's
segments. Each change within a partition is a bisection in its sorted list.
"""

from __future__ import annotations

import sys
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from types import MappingProxyType

from logmq.cluster.metadata_records import RemoteSegmentRecord, RemoteSegmentStateChange
from logmq.errors import ErrorCode, LogMQError
from logmq.storage.remote.segment_metadata import VALID_TRANSITIONS, RemoteSegment, SegmentState

_EMPTY: Mapping = MappingProxyType({})
RemotePartition = tuple[str, int]  # (topic id, partition)


class RemoteSegmentError(LogMQError, ValueError):
    """A remote-segment record that cannot apply (metadata_image turns it into a
    MetadataError: the batch is rejected)."""

    code = ErrorCode.UNKNOWN_SERVER_ERROR


def _order(s: RemoteSegment) -> tuple[int, str]:
    return (s.base_offset, s.segment_id)


@dataclass(frozen=True, slots=True)
class PartitionSegments:
    """One partition's segments in (base_offset, segment_id) order, and by id."""

    segments: tuple[RemoteSegment, ...] = ()
    by_id: Mapping[str, RemoteSegment] = field(default_factory=lambda: _EMPTY)


_NO_SEGMENTS = PartitionSegments()


@dataclass(frozen=True, slots=True)
class RemoteSegmentsImage:
    topics: Mapping[str, Mapping[int, PartitionSegments]] = field(default_factory=lambda: _EMPTY)

    def segments(self, topic_id: str, partition: int) -> tuple[RemoteSegment, ...]:
        return self.topics.get(topic_id, _EMPTY).get(partition, _NO_SEGMENTS).segments

    def segment(self, topic_id: str, partition: int, segment_id: str) -> RemoteSegment | None:
        return self.topics.get(topic_id, _EMPTY).get(partition, _NO_SEGMENTS).by_id.get(segment_id)

    def partitions(self) -> Iterator[RemotePartition]:
        """Every (topic id, partition) that has remote segments, sorted."""
        for tid in sorted(self.topics):
            for p in sorted(self.topics[tid]):
                yield (tid, p)

    def to_records(self) -> list[RemoteSegmentRecord]:
        return [to_record(s) for tid, p in self.partitions() for s in self.segments(tid, p)]


EMPTY_REMOTE = RemoteSegmentsImage()


def to_record(s: RemoteSegment) -> RemoteSegmentRecord:
    return RemoteSegmentRecord(
        s.topic_id,
        s.partition,
        s.segment_id,
        s.base_offset,
        s.end_offset,
        s.max_timestamp,
        s.size_bytes,
        s.leader_epochs,
        s.copier_epoch,
        s.broker_id,
        int(s.state),
        s.checksum,
        s.event_ms,
        s.topic,
        int(s.corrupt),
    )


def from_record(r: RemoteSegmentRecord) -> RemoteSegment:
    # one string per topic, not one per segment: 10,000 segments' copies of the same id
    # and name were a sixth of the image's memory (benchmarks/bench_tiered.py)
    return RemoteSegment(
        sys.intern(r.topic_id),
        r.partition,
        r.segment_id,
        r.base_offset,
        r.end_offset,
        r.max_timestamp,
        r.size_bytes,
        r.leader_epochs,
        r.copier_epoch,
        r.broker_id,
        _state(r.state),
        r.checksum,
        r.event_ms,
        sys.intern(r.topic),
        bool(r.corrupt),
    )


_STATES = tuple(SegmentState)  # by value: 0, 1, 2, 3


def _state(value: int) -> SegmentState:
    # a tuple index, not the enum's call: a start replays one per remote segment
    if 0 <= value < len(_STATES):
        return _STATES[value]
    raise RemoteSegmentError(f"unknown remote segment state {value}")


def segment_problem(s: RemoteSegment) -> str | None:
    """What is structurally wrong with a segment, whoever describes it (None: nothing)."""
    if s.partition < 0 or not s.segment_id or not s.topic_id:
        return f"remote segment {s.segment_id!r} of {s.topic_id}-{s.partition}: bad key"
    if s.base_offset < 0 or s.end_offset < s.base_offset:
        return f"remote segment {s.segment_id}: offsets {s.base_offset}..{s.end_offset}"
    if s.size_bytes < 0:
        return f"remote segment {s.segment_id}: size {s.size_bytes}"
    epochs = s.leader_epochs
    if len(epochs) > 1 and any(a[0] >= b[0] or a[1] > b[1] for a, b in pairwise(epochs)):
        return f"remote segment {s.segment_id}: leader epochs {list(epochs)} not ascending"
    return None


class RemoteSegmentsDelta:
    """Remote-segment records replayed on top of a RemoteSegmentsImage."""

    def __init__(self, image: RemoteSegmentsImage) -> None:
        self.image = image
        # the partitions this delta changed: their sorted list and index, copied once
        self._changed: dict[RemotePartition, tuple[list[RemoteSegment], dict[str, RemoteSegment]]]
        self._changed = {}
        self._touched: set[RemotePartition] = set()

    @property
    def changed_partitions(self) -> set[RemotePartition]:
        """The partitions whose remote segments this delta changed."""
        return set(self._touched)

    def segment(self, topic_id: str, partition: int, segment_id: str) -> RemoteSegment | None:
        work = self._changed.get((topic_id, partition))
        if work is not None:
            return work[1].get(segment_id)
        return self.image.segment(topic_id, partition, segment_id)

    def _work(self, key: RemotePartition) -> tuple[list[RemoteSegment], dict[str, RemoteSegment]]:
        work = self._changed.get(key)
        if work is None:
            old = self.image.topics.get(key[0], _EMPTY).get(key[1], _NO_SEGMENTS)
            work = self._changed[key] = (list(old.segments), dict(old.by_id))
            self._touched.add(key)
        return work

    def replay(self, record: RemoteSegmentRecord | RemoteSegmentStateChange) -> None:
        if isinstance(record, RemoteSegmentRecord):
            segment = from_record(record)
            problem = segment_problem(segment)
            if problem:
                raise RemoteSegmentError(problem)
            if segment.state is SegmentState.DELETE_FINISHED:
                raise RemoteSegmentError(f"remote segment {segment.segment_id} is already deleted")
            ordered, by_id = self._work((segment.topic_id, segment.partition))
            if segment.segment_id in by_id:
                raise RemoteSegmentError(f"remote segment {segment.segment_id} already exists")
            by_id[segment.segment_id] = segment
            key = _order(segment)
            if not ordered or _order(ordered[-1]) < key:
                ordered.append(segment)  # the usual case: copies come in offset order
            else:
                ordered.insert(bisect_left(ordered, key, key=_order), segment)
            return
        key = (record.topic_id, record.partition)
        old = self.segment(*key, record.segment_id)
        if old is None:
            raise RemoteSegmentError(f"no remote segment {record.segment_id} in {key[0]}-{key[1]}")
        state = _state(record.state)
        if record.corrupt:
            if not (state is old.state is SegmentState.COPY_FINISHED):
                raise RemoteSegmentError(
                    f"remote segment {record.segment_id}: only a finished copy is marked corrupt"
                )
        elif state not in VALID_TRANSITIONS[old.state]:
            raise RemoteSegmentError(
                f"remote segment {record.segment_id}: {old.state.name} -> {state.name}"
            )
        ordered, by_id = self._work(key)
        if ordered and ordered[-1] is old:
            at = len(ordered) - 1  # the usual case: the newest copy finishing
        else:
            at = bisect_left(ordered, _order(old), key=_order)
        if at == len(ordered) or ordered[at] is not old:  # ids are unique, so keys are
            raise RemoteSegmentError(f"remote segment {record.segment_id} out of order")
        if state is SegmentState.DELETE_FINISHED:
            del by_id[old.segment_id]
            del ordered[at]
            return
        new = old.with_state(
            state,
            checksum=record.checksum or None,
            event_ms=record.event_ms,
            corrupt=True if record.corrupt else None,
        )
        by_id[old.segment_id] = ordered[at] = new

    def apply(self) -> RemoteSegmentsImage:
        """The next image; the delta goes on from it (its lists now belong to the image)."""
        if not self._changed:
            return self.image
        topics = dict(self.image.topics)
        by_topic: dict[str, dict[int, PartitionSegments | None]] = {}
        for (tid, p), (ordered, by_id) in self._changed.items():
            parts = by_topic.setdefault(tid, {})
            parts[p] = PartitionSegments(tuple(ordered), MappingProxyType(by_id)) if by_id else None
        for tid, changed in by_topic.items():
            parts = dict(topics.get(tid, _EMPTY))
            for p, segs in changed.items():
                if segs is None:
                    parts.pop(p, None)
                else:
                    parts[p] = segs
            if parts:
                topics[tid] = MappingProxyType(parts)
            else:
                topics.pop(tid, None)
        self.image = RemoteSegmentsImage(MappingProxyType(topics))
        self._changed = {}
        return self.image
