"""Remote-segment metadata in the quorum: the controller's rules, the image, snapshots."""

from __future__ import annotations

import time

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.cluster.controller_api import RemoteSegmentChange
from logmq.cluster.metadata_image import EMPTY_IMAGE, MetadataDelta, MetadataError, MetadataImage
from logmq.cluster.metadata_records import (
    MAX_ID_CHARS,
    MetadataCodecError,
    PartitionChange,
    PartitionRecord,
    RemoteSegmentRecord,
    RemoteSegmentStateChange,
    TopicRecord,
    decode_record,
    decode_records,
    encode_record,
    encode_records,
)
from logmq.cluster.remote_image import to_record
from logmq.errors import ErrorCode
from logmq.storage.remote.segment_metadata import VALID_TRANSITIONS, RemoteSegment, SegmentState
from tests.cluster.helpers import Recorder

S = SegmentState


def seg(
    tid: str, sid: str, base: int, *, part: int = 0, epoch: int = 0, broker: int = 1, topic="t"
):
    return RemoteSegment(
        tid, part, sid, base, base + 9, 1_000 + base, 4096, ((epoch, base),), epoch, broker,
        topic=topic,
    )  # fmt: skip


def setup(partitions: int = 1) -> tuple[Recorder, str]:
    r = Recorder(brokers=3)
    r.create("t", partitions=partitions, rf=3)
    return r, r.image.topics["t"].topic_id


def alter(r: Recorder, broker: int, *changes: RemoteSegmentChange, epoch: int | None = None):
    return r.run(
        r.controller.alter_remote_segments(
            broker, r.epochs[broker] if epoch is None else epoch, list(changes)
        )
    )


def leader(r: Recorder, p: int = 0) -> tuple[int, int]:
    part = r.image.partition("t", p)
    return part.leader, part.leader_epoch


def started(s: RemoteSegment, epoch: int | None = None) -> RemoteSegmentChange:
    return RemoteSegmentChange.copy_started(s, s.copier_epoch if epoch is None else epoch)


def moved(s: RemoteSegment, state: S, epoch: int, checksum: str = "") -> RemoteSegmentChange:
    return RemoteSegmentChange.state_change(
        s.topic_id, s.partition, s.segment_id, state, epoch, checksum=checksum, event_ms=7
    )


def codes(results) -> list[ErrorCode]:
    return [res.error for res in results]


# -- the controller's rules ------------------------------------------------------------------


def test_a_segment_goes_through_its_life_and_leaves_the_image():
    r, tid = setup()
    lead, epoch = leader(r)
    s = seg(tid, "a", 0, epoch=epoch, broker=lead)
    assert codes(alter(r, lead, started(s))) == [ErrorCode.NONE]
    assert r.image.remote_segments(tid, 0) == (s,)
    assert codes(alter(r, lead, moved(s, S.COPY_FINISHED, epoch, "abc"))) == [ErrorCode.NONE]
    (finished,) = r.image.remote_segments(tid, 0)
    assert finished.state is S.COPY_FINISHED and finished.checksum == "abc"
    assert finished.readable and finished.event_ms == 7
    assert codes(alter(r, lead, moved(s, S.DELETE_STARTED, epoch))) == [ErrorCode.NONE]
    assert r.image.remote_segments(tid, 0)[0].checksum == "abc"  # kept
    assert codes(alter(r, lead, moved(s, S.DELETE_FINISHED, epoch))) == [ErrorCode.NONE]
    assert r.image.remote_segments(tid, 0) == ()
    assert r.image.remote.topics == {}  # nothing left behind
    assert r.replayed().remote == r.image.remote  # followers applying the log agree


def test_only_the_current_leader_at_its_current_epoch_may_change_segments():
    r, tid = setup()
    lead, epoch = leader(r)
    other = next(b for b in (1, 2, 3) if b != lead)
    s = seg(tid, "a", 0, epoch=epoch, broker=lead)
    assert codes(alter(r, lead, started(s, epoch - 1))) == [ErrorCode.INVALID_REQUEST]
    old = seg(tid, "a", 0, epoch=epoch - 1, broker=lead)
    assert codes(alter(r, lead, started(old))) == [ErrorCode.FENCED_LEADER_EPOCH]  # lower
    new = seg(tid, "a", 0, epoch=epoch + 1, broker=lead)
    assert codes(alter(r, lead, started(new))) == [ErrorCode.FENCED_LEADER_EPOCH]  # higher
    theirs = seg(tid, "a", 0, epoch=epoch, broker=other)
    assert codes(alter(r, other, started(theirs))) == [ErrorCode.NOT_LEADER_OR_FOLLOWER]
    assert codes(alter(r, lead, started(s), epoch=99)) == [ErrorCode.STALE_BROKER_EPOCH]
    unknown = seg("no-such-id", "a", 0, epoch=epoch, broker=lead)
    assert codes(alter(r, lead, started(unknown))) == [ErrorCode.UNKNOWN_TOPIC_ID]
    beyond = seg(tid, "a", 0, part=5, epoch=epoch, broker=lead)
    assert codes(alter(r, lead, started(beyond))) == [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
    assert r.image.remote_segments(tid, 0) == ()
    assert not any(isinstance(x, RemoteSegmentRecord) for batch in r.log for x in batch)


def test_after_a_leader_change_the_new_leader_deletes_but_never_finishes_old_copies():
    r, tid = setup()
    lead, epoch = leader(r)
    done = seg(tid, "done", 0, epoch=epoch, broker=lead)
    orphan = seg(tid, "orphan", 10, epoch=epoch, broker=lead)
    expiring = seg(tid, "expiring", 20, epoch=epoch, broker=lead)
    alter(r, lead, started(done), started(orphan), started(expiring))
    alter(r, lead, moved(done, S.COPY_FINISHED, epoch, "c1"))
    alter(r, lead, moved(expiring, S.COPY_FINISHED, epoch, "c2"))
    alter(r, lead, moved(expiring, S.DELETE_STARTED, epoch))
    r.run(r.controller.heartbeat(lead, r.epochs[lead], 10, want_fence=True))
    new, new_epoch = leader(r)
    assert new != lead and new_epoch > epoch
    # the deposed leader is fenced out of everything
    assert codes(alter(r, lead, moved(orphan, S.COPY_FINISHED, epoch, "c3"))) == [
        ErrorCode.FENCED_LEADER_EPOCH
    ]
    # the new leader may not finish its predecessor's copy ...
    assert codes(alter(r, new, moved(orphan, S.COPY_FINISHED, new_epoch, "c3"))) == [
        ErrorCode.FENCED_LEADER_EPOCH
    ]
    # ... but deletes it, finishes the deletion its predecessor started, expires the rest
    results = alter(
        r,
        new,
        moved(orphan, S.DELETE_STARTED, new_epoch),
        moved(expiring, S.DELETE_FINISHED, new_epoch),
        moved(done, S.DELETE_STARTED, new_epoch),
    )
    assert codes(results) == [ErrorCode.NONE] * 3
    states = {s.segment_id: s.state for s in r.image.remote_segments(tid, 0)}
    assert states == {"done": S.DELETE_STARTED, "orphan": S.DELETE_STARTED}


@pytest.mark.parametrize(
    ("frm", "to"),
    [
        (a, b)
        for a in S
        for b in S
        # a finished deletion has left (RESOURCE_NOT_FOUND); the same state is a retry
        if b not in VALID_TRANSITIONS[a] and a is not b and a is not S.DELETE_FINISHED
    ],
)
def test_an_invalid_transition_is_invalid_request_with_a_message(frm, to):
    r, tid = setup()
    lead, epoch = leader(r)
    s = seg(tid, "a", 0, epoch=epoch, broker=lead)
    alter(r, lead, started(s))
    path = {S.COPY_STARTED: [], S.COPY_FINISHED: [S.COPY_FINISHED]}
    path[S.DELETE_STARTED] = [S.COPY_FINISHED, S.DELETE_STARTED]
    for state in path[frm]:
        assert alter(r, lead, moved(s, state, epoch, "sum"))[0].ok
    (result,) = alter(r, lead, moved(s, to, epoch, "sum"))
    assert result.error is ErrorCode.INVALID_REQUEST
    if to is S.COPY_STARTED:
        assert "comes with its metadata" in result.message
    else:
        assert f"{frm.name} -> {to.name}" in result.message


def test_ids_are_new_retries_are_harmless_and_unknown_segments_are_not_found():
    r, tid = setup()
    lead, epoch = leader(r)
    s = seg(tid, "a", 0, epoch=epoch, broker=lead)
    alter(r, lead, started(s))
    batches = len(r.log)
    assert codes(alter(r, lead, started(s))) == [ErrorCode.NONE]  # the same: a retry
    clash = seg(tid, "a", 50, epoch=epoch, broker=lead)
    assert codes(alter(r, lead, started(clash))) == [ErrorCode.INVALID_REQUEST]
    alter(r, lead, moved(s, S.COPY_FINISHED, epoch, "sum"))
    batches += 1
    assert codes(alter(r, lead, moved(s, S.COPY_FINISHED, epoch, "sum"))) == [ErrorCode.NONE]
    assert codes(alter(r, lead, moved(s, S.COPY_FINISHED, epoch, "other"))) == [
        ErrorCode.INVALID_REQUEST
    ]
    assert len(r.log) == batches  # retries wrote nothing
    ghost = seg(tid, "ghost", 0, epoch=epoch, broker=lead)
    assert codes(alter(r, lead, moved(ghost, S.DELETE_FINISHED, epoch))) == [
        ErrorCode.RESOURCE_NOT_FOUND
    ]
    fresh = seg(tid, "b", 10, epoch=epoch, broker=lead)
    assert codes(alter(r, lead, moved(fresh, S.COPY_STARTED, epoch))) == [
        ErrorCode.INVALID_REQUEST  # a new segment comes with its metadata
    ]
    assert codes(alter(r, lead, started(fresh), moved(fresh, S.COPY_FINISHED, epoch))) == [
        ErrorCode.NONE,
        ErrorCode.INVALID_REQUEST,  # COPY_FINISHED needs the checksum
    ]


@pytest.mark.parametrize(
    "bad",
    [
        dict(end_offset=-1),
        dict(base_offset=-5),
        dict(size_bytes=-1),
        dict(leader_epochs=((2, 0), (1, 5))),
        dict(segment_id=""),
        dict(segment_id="x" * (MAX_ID_CHARS + 1)),
        dict(checksum="x" * (MAX_ID_CHARS + 1)),
        dict(state=S.COPY_FINISHED),
        dict(broker_id=3),
    ],
)
def test_malformed_segments_are_refused_before_they_reach_the_log(bad):
    from dataclasses import replace

    r, tid = setup()
    lead, epoch = leader(r)
    s = replace(seg(tid, "a", 0, epoch=epoch, broker=lead), **bad)
    if bad.get("broker_id") == lead:
        s = replace(s, broker_id=lead + 1)
    change = RemoteSegmentChange(tid, 0, epoch, s.segment_id, S.COPY_STARTED, s)
    assert codes(alter(r, lead, change)) == [ErrorCode.INVALID_REQUEST]


def test_each_change_is_judged_alone_and_the_accepted_ones_are_one_batch():
    r, tid = setup(partitions=2)
    lead, epoch = leader(r)
    lead1, epoch1 = leader(r, 1)
    a = seg(tid, "a", 0, epoch=epoch, broker=lead)
    b = seg(tid, "b", 0, part=1, epoch=epoch1, broker=lead1)
    c = seg(tid, "c", 10, epoch=epoch, broker=lead)
    batches = len(r.log)
    results = alter(
        r,
        lead,
        started(a),
        moved(a, S.COPY_FINISHED, epoch, "sum"),  # sees the copy started just before
        started(b) if lead1 != lead else started(seg("nope", "b", 0, epoch=epoch, broker=lead)),
        started(c),
    )
    assert codes(results) == [ErrorCode.NONE, ErrorCode.NONE, results[2].error, ErrorCode.NONE]
    assert not results[2].ok
    assert len(r.log) == batches + 1 and len(r.log[-1]) == 3
    assert [s.segment_id for s in r.image.remote_segments(tid, 0)] == ["a", "c"]


def test_a_deleted_topics_segments_stay_as_orphans_that_any_broker_deletes():
    r, tid = setup(partitions=2)
    lead, epoch = leader(r)
    a, b = seg(tid, "a", 0, epoch=epoch, broker=lead), seg(tid, "b", 10, epoch=epoch, broker=lead)
    alter(r, lead, started(a), started(b))
    alter(r, lead, moved(a, S.COPY_FINISHED, epoch, "sum"))
    r.run(r.controller.delete_topics(["t"]))
    r.create("t", partitions=1, rf=3)  # the same name, a new id
    assert r.image.topics["t"].topic_id != tid
    assert r.image.orphaned_remote_partitions() == [(tid, 0)]
    assert r.image.remote_segments(tid, 0) == (r.image.remote_segment(tid, 0, "a"), b)
    other = next(x for x in (1, 2, 3) if x != lead)
    # a copy cannot go on, nor start, for a topic that is gone
    assert codes(alter(r, lead, moved(b, S.COPY_FINISHED, epoch, "x"))) == [
        ErrorCode.UNKNOWN_TOPIC_ID
    ]
    new = seg(tid, "n", 20, epoch=epoch, broker=lead)
    assert codes(alter(r, lead, started(new))) == [ErrorCode.UNKNOWN_TOPIC_ID]
    # deletions by any registered broker, whatever epoch it names
    results = alter(
        r,
        other,
        moved(a, S.DELETE_STARTED, -1),
        moved(b, S.DELETE_STARTED, -1),
        moved(a, S.DELETE_FINISHED, -1),
    )
    assert codes(results) == [ErrorCode.NONE] * 3
    assert codes(alter(r, other, moved(a, S.DELETE_FINISHED, -1))) == [ErrorCode.UNKNOWN_TOPIC_ID]
    assert codes(alter(r, other, moved(b, S.DELETE_FINISHED, -1))) == [ErrorCode.NONE]
    assert r.image.orphaned_remote_partitions() == []
    assert r.replayed().remote == r.image.remote


# -- the image and its records ---------------------------------------------------------------


def _image_with(*segments: RemoteSegment) -> MetadataImage:
    return EMPTY_IMAGE.apply([TopicRecord("t", "tid"), *(to_record(s) for s in segments)])


def test_segments_are_in_base_offset_then_id_order_and_snapshots_keep_them():
    segs = [seg("tid", sid, base) for sid, base in [("z", 0), ("b", 20), ("a", 20), ("m", 10)]]
    image = _image_with(*segs)
    image = image.apply([RemoteSegmentStateChange("tid", 0, "m", int(S.COPY_FINISHED), "c", 5)])
    ordered = image.remote_segments("tid", 0)
    keys = [(s.base_offset, s.segment_id) for s in ordered]
    assert keys == [(0, "z"), (10, "m"), (20, "a"), (20, "b")]
    assert ordered[1].state is S.COPY_FINISHED and ordered[1].checksum == "c"
    orphan = seg("gone-id", "o", 0, part=3)
    image = image.apply([to_record(orphan)])
    assert image.orphaned_remote_partitions() == [("gone-id", 3)]
    restored = MetadataImage.from_bytes(image.to_bytes(), 7)
    assert restored.remote == image.remote
    assert restored.remote_segments("tid", 0) == ordered
    assert restored.orphaned_remote_partitions() == [("gone-id", 3)]
    assert restored.to_records() == image.to_records()


@pytest.mark.parametrize(
    "record",
    [
        RemoteSegmentStateChange("tid", 0, "none", int(S.COPY_FINISHED)),  # unknown segment
        RemoteSegmentStateChange("tid", 0, "a", int(S.DELETE_FINISHED)),  # skips a state
        RemoteSegmentStateChange("tid", 0, "a", 9),  # not a state
        to_record(seg("tid", "a", 40)),  # the id again
        RemoteSegmentRecord("tid", 0, "x", 5, 4, 0, 0, (), 0, 1),  # ends before it starts
        RemoteSegmentRecord("tid", 0, "x", 5, 6, 0, 0, (), 0, 1, int(S.DELETE_FINISHED)),
    ],
)
def test_impossible_remote_records_reject_the_batch(record):
    image = _image_with(seg("tid", "a", 0))
    with pytest.raises(MetadataError):
        image.apply([record])
    assert image.remote_segments("tid", 0) == (seg("tid", "a", 0),)


def test_the_records_round_trip_and_the_decoder_bounds_them():
    s = seg("tid", "a", 0)
    for record in (to_record(s), RemoteSegmentStateChange("tid", 0, "a", 1, "sum", 3)):
        assert decode_records(encode_records([record])) == [record]
    raw = msgpack.unpackb(msgpack.packb(encode_record(to_record(s))))  # as a follower reads it
    old = to_record(seg("tid", "a", 0, topic=""))  # written before checksum/event_ms/topic
    assert decode_record(raw[:11]) == old
    for bad in (
        [*raw[:3], "x" * (MAX_ID_CHARS + 1), *raw[4:]],  # an id too long
        [*raw[:8], [[1, 2, 3]], *raw[9:]],  # not a pair
        [*raw[:8], [[0, 0]] * 5000, *raw[9:]],  # too many epochs
        [*raw[:8], [[0, "0"]], *raw[9:]],
    ):
        with pytest.raises(MetadataCodecError):
            decode_record(bad)
    with pytest.raises(MetadataCodecError):
        decode_records(msgpack.packb([1, [[18, "tid", 0, "a", "one"]]]))


def test_leader_changes_and_topic_removal_keep_the_segments():
    image = _image_with(seg("tid", "a", 0))
    image = image.apply([PartitionRecord("t", 0, (1, 2), (1, 2), 1, 0, 0)])
    image = image.apply([PartitionChange("t", 0, leader=2)])
    assert len(image.remote_segments("tid", 0)) == 1
    from logmq.cluster.metadata_records import RemoveTopic

    image = image.apply([RemoveTopic("t", "tid")])
    assert image.remote_segments("tid", 0) == (seg("tid", "a", 0),)
    assert image.orphaned_remote_partitions() == [("tid", 0)]


def test_applies_cost_what_they_change_not_what_the_image_holds():
    """10,000 remote segments in one partition: a batch elsewhere shares the whole remote
    part, and a change of the big partition copies it once, not once per change."""
    big = [seg("tid", f"s{i:05}", i * 10) for i in range(10_000)]
    image = EMPTY_IMAGE.apply([TopicRecord("t", "tid"), *(to_record(s) for s in big)])
    assert image.remote_segments("tid", 0) == tuple(big)
    elsewhere = image.apply([TopicRecord("u", "uid")])
    assert elsewhere.remote is image.remote
    other = image.apply([to_record(seg("tid", "x", 0, part=1))])
    assert other.remote.topics["tid"][0] is image.remote.topics["tid"][0]  # shared
    started_at = time.perf_counter()
    for i in range(200):
        delta = MetadataDelta(image)
        delta.replay(RemoteSegmentStateChange("tid", 0, f"s{i:05}", int(S.COPY_FINISHED), "c"))
        image = delta.apply()
        assert delta.changed_remote_partitions == {("tid", 0)}
    per_apply = (time.perf_counter() - started_at) / 200
    assert per_apply < 0.01, per_apply  # a copy of 10,000 pointers, not a rebuild
    assert sum(s.readable for s in image.remote_segments("tid", 0)) == 200


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(list(S))), max_size=40))
def test_the_image_agrees_with_a_model_and_survives_a_snapshot(steps):
    """Random record sequences: whatever applies matches a dict model, in order."""
    image = _image_with()
    model: dict[str, RemoteSegment] = {}
    for n, state in steps:
        sid = f"s{n}"
        if sid not in model:
            record = to_record(seg("tid", sid, n * 3 % 7))
            want = seg("tid", sid, n * 3 % 7)
        else:
            record = RemoteSegmentStateChange("tid", 0, sid, int(state), "", n)
            want = model[sid].with_state(state, event_ms=n)
        try:
            image = image.apply([record])
        except MetadataError:
            assert sid in model and state not in VALID_TRANSITIONS[model[sid].state]
            continue
        if state is S.DELETE_FINISHED and sid in model:
            del model[sid]
        else:
            model[sid] = want
    expect = tuple(sorted(model.values(), key=lambda s: (s.base_offset, s.segment_id)))
    assert image.remote_segments("tid", 0) == expect
    assert MetadataImage.from_bytes(image.to_bytes()).remote == image.remote


# -- segments found corrupt ---------------------------------------------------------------


def corrupt(s: RemoteSegment, epoch: int) -> RemoteSegmentChange:
    return RemoteSegmentChange.found_corrupt(s, epoch, 9)


def finished_segment(r: Recorder, tid: str, sid: str, base: int) -> RemoteSegment:
    lead, epoch = leader(r)
    s = seg(tid, sid, base, epoch=epoch, broker=lead)
    assert (
        codes(alter(r, lead, started(s), moved(s, S.COPY_FINISHED, epoch, "c")))
        == [ErrorCode.NONE] * 2
    )
    return s


def test_the_leader_marks_a_finished_copy_corrupt_and_it_is_never_readable():
    r, tid = setup()
    lead, epoch = leader(r)
    other = next(b for b in (1, 2, 3) if b != lead)
    s = finished_segment(r, tid, "a", 0)
    assert codes(alter(r, other, corrupt(s, epoch))) == [ErrorCode.NOT_LEADER_OR_FOLLOWER]
    assert codes(alter(r, lead, corrupt(s, epoch - 1))) == [ErrorCode.FENCED_LEADER_EPOCH]
    assert codes(alter(r, lead, corrupt(s, epoch))) == [ErrorCode.NONE]
    (marked,) = r.image.remote_segments(tid, 0)
    assert marked.corrupt and marked.finished and not marked.readable
    assert marked.checksum == "c" and marked.event_ms == 9
    before = len(r.log)
    assert codes(alter(r, lead, corrupt(s, epoch))) == [ErrorCode.NONE]  # again: nothing
    assert len(r.log) == before
    assert r.replayed().remote == r.image.remote  # the log and a snapshot keep the mark
    assert MetadataImage.from_bytes(r.image.to_bytes()).remote == r.image.remote
    # only a finished copy is marked
    t = seg(tid, "b", 10, epoch=epoch, broker=lead)
    assert codes(alter(r, lead, started(t), corrupt(t, epoch))) == [
        ErrorCode.NONE,
        ErrorCode.INVALID_REQUEST,
    ]


def test_a_follower_copies_a_corrupt_segment_again_and_the_first_one_wins():
    r, tid = setup()
    lead, epoch = leader(r)
    f1, f2 = (b for b in (1, 2, 3) if b != lead)
    s = finished_segment(r, tid, "a", 0)
    again = seg(tid, "b", 0, epoch=epoch, broker=f1)
    # nothing is corrupt: a follower may not copy
    assert codes(alter(r, f1, started(again))) == [ErrorCode.NOT_LEADER_OR_FOLLOWER]
    assert codes(alter(r, lead, corrupt(s, epoch))) == [ErrorCode.NONE]
    # another follower's copy of the same offsets, started second, is refused
    rival = seg(tid, "c", 0, epoch=epoch, broker=f2)
    assert codes(alter(r, f1, started(again))) == [ErrorCode.NONE]
    assert codes(alter(r, f2, started(rival))) == [ErrorCode.NOT_LEADER_OR_FOLLOWER]
    # the follower's copy names the current leader epoch, and only it finishes it
    assert codes(alter(r, f2, moved(again, S.COPY_FINISHED, epoch, "d"))) == [
        ErrorCode.NOT_LEADER_OR_FOLLOWER
    ]
    assert codes(alter(r, f1, moved(again, S.COPY_FINISHED, epoch, "d"))) == [ErrorCode.NONE]
    by_id = {x.segment_id: x for x in r.image.remote_segments(tid, 0)}
    assert by_id["b"].readable and by_id["a"].corrupt
    # replaced: a follower may copy these offsets no more; the leader deletes the bad one
    late = seg(tid, "e", 0, epoch=epoch, broker=f2)
    assert codes(alter(r, f2, started(late))) == [ErrorCode.NOT_LEADER_OR_FOLLOWER]
    assert codes(alter(r, f1, moved(s, S.DELETE_STARTED, epoch))) == [
        ErrorCode.NOT_LEADER_OR_FOLLOWER
    ]
    assert (
        codes(alter(r, lead, moved(s, S.DELETE_STARTED, epoch), moved(s, S.DELETE_FINISHED, epoch)))
        == [ErrorCode.NONE] * 2
    )
    assert [x.segment_id for x in r.image.remote_segments(tid, 0)] == ["b"]


def test_old_records_without_the_corrupt_field_still_decode():
    r = RemoteSegmentRecord("t", 0, "a", 0, 9, 1, 2, ((0, 0),), 0, 1, 1, "c", 5, "topic")
    raw = msgpack.unpackb(msgpack.packb(encode_record(r)))
    assert decode_record(raw[:-1]) == r  # a record written before the field existed
    change = RemoteSegmentStateChange("t", 0, "a", 1, "", 3, 1)
    assert decode_record(encode_record(change)) == change
    assert decode_record(encode_record(change)[:-1]).corrupt == 0
