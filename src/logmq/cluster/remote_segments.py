"""The controller's rules for remote-segment changes (KIP-405's metadata, in the quorum).

A partition leader copies closed segments to the remote tier and deletes expired ones;
every step (COPY_STARTED with the segment's metadata, then COPY_FINISHED, DELETE_STARTED,
DELETE_FINISHED) goes through the controller, which fences it by leader epoch so a
deposed leader can neither publish a copy nor finish one. Rules, per change:

* The requester's registration must be current (STALE_BROKER_EPOCH for all changes).
* The topic id must exist (UNKNOWN_TOPIC_ID), except for a deletion (DELETE_STARTED,
  DELETE_FINISHED) of a segment of a topic that is gone: any registered broker may do
  that, without an epoch (nobody leads a deleted topic; the active controller's broker
  is the natural one to clean up, and no harm comes from another doing it).
* Otherwise the requester must name the partition's *current* leader epoch
  (FENCED_LEADER_EPOCH if older or newer) and be its leader (NOT_LEADER_OR_FOLLOWER).
  The check is against the partition's epoch, not the copier's: a new leader deletes
  the orphans and the expired segments its predecessors copied. Only COPY_FINISHED is
  the copier's own (same broker, same epoch): a new leader never saw that upload.
* A new segment's id must be new in its partition; its state COPY_STARTED; its fields
  sane (remote_image.segment_problem) and within the codec's bounds, or every broker
  would reject the batch. A state change must be one of VALID_TRANSITIONS (else
  INVALID_REQUEST, naming it); COPY_FINISHED carries the manifest's checksum. An
  unknown segment id is RESOURCE_NOT_FOUND (a retried DELETE_FINISHED finds it gone).
* A replica that does not lead may copy again the offsets of a segment found corrupt
  (``corrupt``, marked by the leader whose read failed) and finish that copy: the
  leader may no longer hold them locally, a follower still may. The first to start
  wins; it still names the current leader epoch.
* A change the image already holds (a retry after an answer was lost: the same new
  segment, or the state it is already in) succeeds and writes nothing.

Each change is judged on its own, against the image plus the changes accepted before
it in the same request (so one request may start and finish a copy); the accepted ones
are one batch of records, applied atomically.
"""

from __future__ import annotations

from collections.abc import Sequence

from logmq.cluster.controller_api import ApiResult, RemoteSegmentChange
from logmq.cluster.metadata_image import MetadataImage
from logmq.cluster.metadata_records import (
    MAX_ID_CHARS,
    MAX_PAIRS,
    Record,
    RemoteSegmentStateChange,
)
from logmq.cluster.remote_image import segment_problem, to_record
from logmq.errors import ErrorCode
from logmq.storage.remote.segment_metadata import VALID_TRANSITIONS, RemoteSegment, SegmentState

MAX_REMOTE_CHANGES = 1000  # per request
OK = ApiResult()
_DELETIONS = frozenset({SegmentState.DELETE_STARTED, SegmentState.DELETE_FINISHED})
_SegmentKey = tuple[str, int, str]


def alter_remote_segments(
    image: MetadataImage, broker_id: int, broker_epoch: int, changes: Sequence[RemoteSegmentChange]
) -> tuple[list[Record], list[ApiResult]]:
    """The records to commit (one batch) and one result per change, in order."""
    if len(changes) > MAX_REMOTE_CHANGES:
        refusal = ApiResult(
            ErrorCode.INVALID_REQUEST, f"at most {MAX_REMOTE_CHANGES} changes per request"
        )
        return [], [refusal] * len(changes)
    reg = image.brokers.get(broker_id)
    if reg is None or reg.broker_epoch != broker_epoch:
        stale = ApiResult(ErrorCode.STALE_BROKER_EPOCH, f"broker {broker_id} epoch is stale")
        return [], [stale] * len(changes)
    # segments as the changes accepted so far leave them (None: deleted)
    pending: dict[_SegmentKey, RemoteSegment | None] = {}
    records: list[Record] = []
    results: list[ApiResult] = []
    for change in changes:
        key = (change.topic_id, change.partition, change.segment_id)
        current = pending[key] if key in pending else image.remote_segment(*key)
        result, record, after = _judge(image, broker_id, change, current)
        results.append(result)
        if record is not None:
            records.append(record)
            pending[key] = after
    return records, results


def _judge(
    image: MetadataImage,
    broker_id: int,
    c: RemoteSegmentChange,
    current: RemoteSegment | None,
) -> tuple[ApiResult, Record | None, RemoteSegment | None]:
    """(result, the record to write or None, the segment after it)."""
    problem = _malformed(broker_id, c)
    if problem:
        return ApiResult(ErrorCode.INVALID_REQUEST, problem), None, None
    name = image.topic_names_by_id.get(c.topic_id)
    if name is None:
        if not (c.segment is None and c.state in _DELETIONS and current is not None):
            unknown = ApiResult(ErrorCode.UNKNOWN_TOPIC_ID, f"no topic with id {c.topic_id}")
            return unknown, None, None
    else:
        part = image.partition(name, c.partition)
        where = f"{name}-{c.partition}"
        if part is None:
            return ApiResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, where), None, None
        if c.leader_epoch != part.leader_epoch:
            message = f"{where}: leader epoch {c.leader_epoch}, current {part.leader_epoch}"
            return ApiResult(ErrorCode.FENCED_LEADER_EPOCH, message), None, None
        if part.leader != broker_id and not _replaces_corrupt(image, broker_id, c, current):
            message = f"{where}: broker {broker_id} does not lead (leader {part.leader})"
            if broker_id in part.replicas and c.segment is not None:
                message += " and no corrupt segment is left for it to copy again"
            return ApiResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, message), None, None
    if c.segment is not None:
        if name is not None and c.segment.topic != name:
            # the objects' keys hold the name: a copy must say the topic's own
            message = f"the segment names topic {c.segment.topic!r}, not {name!r}"
            return ApiResult(ErrorCode.INVALID_REQUEST, message), None, None
        if current is None:
            return OK, to_record(c.segment), c.segment
        if current == c.segment:
            return OK, None, None  # a retry of a change already made
        message = f"remote segment id {c.segment_id} is already used in {c.topic_id}-{c.partition}"
        return ApiResult(ErrorCode.INVALID_REQUEST, message), None, None
    if current is None:
        message = f"no remote segment {c.segment_id} in {c.topic_id}-{c.partition}"
        return ApiResult(ErrorCode.RESOURCE_NOT_FOUND, message), None, None
    if c.corrupt:
        if current.state is not SegmentState.COPY_FINISHED:
            message = f"remote segment {c.segment_id} is {current.state.name}: not servable anyway"
            return ApiResult(ErrorCode.INVALID_REQUEST, message), None, None
        if current.corrupt:
            return OK, None, None  # found by another read, or a retry
        record = RemoteSegmentStateChange(
            c.topic_id, c.partition, c.segment_id, int(c.state), "", c.event_ms, 1
        )
        return OK, record, current.with_state(c.state, event_ms=c.event_ms, corrupt=True)
    if c.state is current.state and c.checksum in ("", current.checksum):
        return OK, None, None  # a retry of a change already made
    if c.state not in VALID_TRANSITIONS[current.state]:
        message = f"remote segment {c.segment_id}: {current.state.name} -> {c.state.name}"
        return ApiResult(ErrorCode.INVALID_REQUEST, f"invalid transition {message}"), None, None
    if c.state is SegmentState.COPY_FINISHED:
        if current.broker_id != broker_id or current.copier_epoch != c.leader_epoch:
            message = (
                f"remote segment {c.segment_id} was copied by broker {current.broker_id} in "
                f"epoch {current.copier_epoch}: only that copy may finish it"
            )
            return ApiResult(ErrorCode.FENCED_LEADER_EPOCH, message), None, None
        if not c.checksum:
            message = f"remote segment {c.segment_id}: COPY_FINISHED needs the manifest checksum"
            return ApiResult(ErrorCode.INVALID_REQUEST, message), None, None
    record = RemoteSegmentStateChange(
        c.topic_id, c.partition, c.segment_id, int(c.state), c.checksum, c.event_ms
    )
    after = None
    if c.state is not SegmentState.DELETE_FINISHED:
        after = current.with_state(c.state, checksum=c.checksum or None, event_ms=c.event_ms)
    return OK, record, after


def _replaces_corrupt(
    image: MetadataImage, broker_id: int, c: RemoteSegmentChange, current: RemoteSegment | None
) -> bool:
    """Whether a replica that does not lead may make this change: copy again the offsets
    of a segment found corrupt (the leader no longer holds them locally, this replica
    does), or finish such a copy of its own. The first replica to start one wins: one
    from another broker already copying or copied over the same offsets refuses it."""
    name = image.topic_names_by_id.get(c.topic_id)
    part = None if name is None else image.partition(name, c.partition)
    if part is None or broker_id not in part.replicas or c.corrupt:
        return False
    if c.segment is None:
        return (
            c.state is SegmentState.COPY_FINISHED
            and current is not None
            and current.broker_id == broker_id
        )
    new = c.segment
    segments = image.remote_segments(c.topic_id, c.partition)
    for bad in segments:
        if not (bad.corrupt and bad.finished):
            continue
        if new.end_offset < bad.base_offset or new.base_offset > bad.end_offset:
            continue
        taken = any(
            s.broker_id != broker_id
            and (
                (
                    s.state is SegmentState.COPY_STARTED
                    and s.base_offset <= bad.end_offset
                    and s.end_offset >= bad.base_offset
                )
                or (
                    s.readable
                    and s.base_offset <= bad.base_offset
                    and s.end_offset >= bad.end_offset
                )
            )
            for s in segments
        )
        if not taken:
            return True
    return False


def _malformed(broker_id: int, c: RemoteSegmentChange) -> str | None:
    """What makes the change unacceptable whatever the image holds (None: nothing)."""
    for what, text in (("topic id", c.topic_id), ("segment id", c.segment_id)):
        if not text or len(text) > MAX_ID_CHARS:
            return f"the {what} must have 1 to {MAX_ID_CHARS} characters"
    if len(c.checksum) > MAX_ID_CHARS:
        return f"the checksum must have at most {MAX_ID_CHARS} characters"
    if c.partition < 0:
        return f"partition {c.partition}"
    s = c.segment
    if c.corrupt and (s is not None or c.state is not SegmentState.COPY_FINISHED):
        return "only a finished copy (COPY_FINISHED, no new segment) is marked corrupt"
    if s is None:
        if c.state is SegmentState.COPY_STARTED:
            return "a new remote segment comes with its metadata"
        return None
    if c.state is not SegmentState.COPY_STARTED or s.state is not SegmentState.COPY_STARTED:
        return f"a new remote segment starts in COPY_STARTED, not {s.state.name}"
    if (s.topic_id, s.partition, s.segment_id) != (c.topic_id, c.partition, c.segment_id):
        return "the segment's topic id, partition and id must be the change's"
    if s.broker_id != broker_id or s.copier_epoch != c.leader_epoch:
        return "a segment's broker id and copier epoch are the requester's and its leader epoch"
    if len(s.leader_epochs) > MAX_PAIRS:
        return f"at most {MAX_PAIRS} leader epochs per segment"
    if len(s.checksum) > MAX_ID_CHARS:
        return f"the checksum must have at most {MAX_ID_CHARS} characters"
    return segment_problem(s)
