"""The remote tier's planner: unit cases for each rule, properties, a stateful model."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from logmq.errors import LogMQError
from logmq.storage.remote.planner import (
    EMPTY_PLAN,
    REPLACEMENT_COPY_TIMEOUT_MS,
    InvalidTierViewError,
    LocalSegment,
    TierSettings,
    TierView,
    follower_delete_local_up_to,
    follower_recopy,
    highest_copied_offset,
    plan_tier,
    remote_log_start,
    segment_for_offset,
    segment_for_timestamp,
)
from logmq.storage.remote.segment_metadata import RemoteSegment, SegmentState

FIN = SegmentState.COPY_FINISHED
STARTED = SegmentState.COPY_STARTED
DELETING = SegmentState.DELETE_STARTED

_ids = iter(range(10**9))


def rseg(base, end, state=FIN, *, ts=0, size=100, epoch=0, broker=0, sid=None) -> RemoteSegment:
    return RemoteSegment(
        topic_id="t",
        partition=0,
        segment_id=sid or f"s{next(_ids)}",
        base_offset=base,
        end_offset=end,
        max_timestamp=ts,
        size_bytes=size,
        leader_epochs=((epoch, base),),
        copier_epoch=epoch,
        broker_id=broker,
        state=state,
    )


def lseg(base, end, *, ts=0, size=100, closed=True) -> LocalSegment:
    return LocalSegment(base, end, size, ts, closed)


def local_log(*bounds, active_end=None, ts=0, size=100) -> tuple[LocalSegment, ...]:
    """Closed segments at ``bounds`` [(base, end)], then an active one after the last."""
    segs = [lseg(b, e, ts=ts, size=size) for b, e in bounds]
    base = bounds[-1][1] + 1 if bounds else 0
    segs.append(lseg(base, base - 1 if active_end is None else active_end, size=0, closed=False))
    return tuple(segs)


def make_view(local, remote=(), **kw) -> TierView:
    leo = local[-1].end_offset + 1
    fields = dict(
        broker_id=0,
        leader_epoch=0,
        is_leader=True,
        local=local,
        remote=tuple(remote),
        log_start_offset=0,
        local_log_start_offset=local[0].base_offset,
        high_watermark=leo,
        last_stable_offset=leo,
        log_end_offset=leo,
        in_flight=frozenset(),
        now_ms=1_000,
        settings=TierSettings(),
    )
    fields.update(kw)
    return TierView(**fields)


# -- copying ---------------------------------------------------------------------------


def test_a_follower_plans_nothing():
    view = make_view(local_log((0, 99), (100, 199)), is_leader=False)
    assert plan_tier(view, 5) is EMPTY_PLAN
    assert plan_tier(view, 5).empty


def test_copies_closed_segments_below_the_lso_in_order():
    local = local_log((0, 99), (100, 199), (200, 299), active_end=320)
    view = make_view(local, high_watermark=321, last_stable_offset=250)
    plan = plan_tier(view, 10)
    assert plan.copy == local[:2]  # 200..299 holds offsets at and above the LSO
    # The high watermark bounds it too (the LSO never passes it, but take the min).
    view = replace(view, high_watermark=150, last_stable_offset=300)
    assert plan_tier(view, 10).copy == local[:1]


def test_copy_is_bounded_and_validated():
    local = local_log((0, 99), (100, 199), (200, 299), active_end=320)
    view = make_view(local)
    assert plan_tier(view, 2).copy == local[:2]
    assert plan_tier(view, 0).copy == ()
    with pytest.raises(InvalidTierViewError) as e:
        plan_tier(view, -1)
    assert isinstance(e.value, LogMQError)


def test_copy_skips_what_finished_or_in_flight_copies_hold():
    local = local_log((0, 99), (100, 199), (200, 299), active_end=320)
    done = rseg(0, 99)
    ours = rseg(100, 199, STARTED, sid="ours")
    view = make_view(local, [done, ours], in_flight=frozenset({"ours"}))
    plan = plan_tier(view, 10)
    assert plan.copy == (local[2],)
    assert plan.orphans == ()
    # The same copy, no longer in flight, is an orphan and its segment is copied again.
    plan = plan_tier(replace(view, in_flight=frozenset()), 10)
    assert plan.orphans == (ours,)
    assert plan.copy == local[1:3]


def test_a_new_leader_copies_an_overlapping_segment():
    # The old leader copied 0..199; the new one's segments rolled at 150 and 300.
    local = local_log((0, 149), (150, 299), active_end=310)
    view = make_view(local, [rseg(0, 199, epoch=3)], leader_epoch=4)
    assert plan_tier(view, 10).copy == (local[1],)


def test_a_hole_between_parallel_copies_is_filled_first():
    local = local_log((0, 99), (100, 199), (200, 299), active_end=320)
    remote = [rseg(0, 99), rseg(200, 299)]  # the copy of 100..199 failed
    assert highest_copied_offset(remote) == 99
    assert plan_tier(make_view(local, remote), 10).copy == (local[1],)


def test_copy_starts_at_the_log_start():
    local = local_log((0, 99), (100, 199), (200, 299), active_end=320)
    plan = plan_tier(make_view(local, log_start_offset=150), 10)
    assert plan.copy == local[1:3]


def test_a_gap_is_reported_and_copied_past():
    local = local_log((300, 399), active_end=420)
    view = make_view(local, [rseg(0, 199)], local_log_start_offset=300)
    plan = plan_tier(view, 10)
    assert plan.copy_gap == (200, 299)
    assert plan.copy == (local[0],)
    assert plan_tier(make_view(local_log((0, 99)), [rseg(0, 49)]), 1).copy_gap is None


def test_no_copy_when_copy_or_remote_is_disabled():
    local = local_log((0, 99), active_end=120)
    for s in (TierSettings(copy_enabled=False), TierSettings(remote_enabled=False)):
        assert plan_tier(make_view(local, settings=s), 10).copy == ()


def test_empty_closed_segments_are_not_copied():
    local = (lseg(0, 99), lseg(100, 99, size=0), lseg(100, 199), lseg(200, 199, closed=False))
    assert plan_tier(make_view(local), 10).copy == (local[0], local[2])


# -- local retention -------------------------------------------------------------------


def test_local_retention_never_deletes_an_uncopied_segment():
    local = local_log((0, 99), (100, 199), active_end=220, ts=0)
    s = TierSettings(local_retention_ms=10, local_retention_bytes=0)
    plan = plan_tier(make_view(local, settings=s, now_ms=10**6), 10)
    assert plan.delete_local_up_to is None
    # Once 0..99 is copied it goes; 100..199 stays until its copy finishes too.
    plan = plan_tier(make_view(local, [rseg(0, 99)], settings=s, now_ms=10**6), 10)
    assert plan.delete_local_up_to == 100
    # All copied: everything but the active segment goes.
    remote = [rseg(0, 99), rseg(100, 199)]
    plan = plan_tier(make_view(local, remote, settings=s, now_ms=10**6), 10)
    assert plan.delete_local_up_to == 200


def test_local_retention_ms_is_strictly_older():
    local = local_log((0, 99), (100, 199), active_end=220, ts=500)
    remote = [rseg(0, 99), rseg(100, 199)]
    s = TierSettings(local_retention_ms=500)
    assert (
        plan_tier(make_view(local, remote, settings=s, now_ms=1000), 1).delete_local_up_to is None
    )
    assert plan_tier(make_view(local, remote, settings=s, now_ms=1001), 1).delete_local_up_to == 200


def test_local_retention_bytes():
    local = local_log((0, 99), (100, 199), (200, 299), active_end=320, size=100)
    remote = [rseg(0, 99), rseg(100, 199), rseg(200, 299)]
    # 300 closed bytes + an empty active: keep at least 150 -> drop one, 200 left.
    s = TierSettings(local_retention_bytes=150)
    assert plan_tier(make_view(local, remote, settings=s), 1).delete_local_up_to == 100
    s = TierSettings(local_retention_bytes=100)
    assert plan_tier(make_view(local, remote, settings=s), 1).delete_local_up_to == 200


def test_each_local_rule_deletes_a_prefix():
    # 0..99 old, 100..199 new, 200..299 old again: time retention stops at 100..199.
    local = (
        lseg(0, 99, ts=0),
        lseg(100, 199, ts=900),
        lseg(200, 299, ts=0),
        lseg(300, 299, closed=False),
    )
    remote = [rseg(0, 99), rseg(100, 199), rseg(200, 299)]
    s = TierSettings(local_retention_ms=500)
    assert plan_tier(make_view(local, remote, settings=s), 1).delete_local_up_to == 100


def test_local_segments_below_the_log_start_go_copied_or_not():
    local = local_log((0, 99), (100, 199), active_end=220)
    plan = plan_tier(make_view(local, log_start_offset=150), 0)
    assert plan.delete_local_up_to == 100


def test_follower_local_retention():
    local = local_log((0, 99), (100, 199), active_end=220)
    s = TierSettings(local_retention_ms=0, copy_enabled=False)
    view = make_view(local, [rseg(0, 99)], is_leader=False, settings=s, now_ms=10**6)
    assert follower_delete_local_up_to(view) == 100  # never past the copies, copy off or not
    view = replace(view, settings=replace(s, remote_enabled=False))
    assert follower_delete_local_up_to(view) is None


# -- remote retention ------------------------------------------------------------------


def test_retention_ms_expires_a_prefix_and_moves_the_log_start():
    remote = [rseg(0, 99, ts=100), rseg(100, 199, ts=600), rseg(200, 299, ts=100)]
    local = local_log((200, 299), active_end=320)
    s = TierSettings(retention_ms=500)
    plan = plan_tier(make_view(local, remote, settings=s, now_ms=1000), 0)
    assert plan.expire == (remote[0],)  # 100..199 is young: the walk stops there
    assert plan.new_log_start_offset == 100
    # max_timestamp <= now - retention.ms is enough (Kafka's cleanupUntilMs).
    plan = plan_tier(make_view(local, remote, settings=s, now_ms=600), 0)
    assert plan.expire == (remote[0],)
    plan = plan_tier(make_view(local, remote, settings=s, now_ms=599), 0)
    assert plan.expire == ()


def test_retention_bytes_counts_both_tiers():
    remote = [rseg(0, 99), rseg(100, 199), rseg(200, 299)]
    # 200..299 is copied (not counted twice); 300..399 and the active 50 are local only.
    local = (lseg(200, 299), lseg(300, 399), lseg(400, 449, size=50, closed=False))
    s = TierSettings(retention_bytes=250)  # 450 in all: 200 over
    plan = plan_tier(make_view(local, remote, settings=s, local_log_start_offset=200), 0)
    assert plan.expire == tuple(remote[:2])
    assert plan.new_log_start_offset == 200
    # Deleting 200..299 would take the total below retention.bytes: it stays.
    plan = plan_tier(
        make_view(
            local, remote, settings=replace(s, retention_bytes=251), local_log_start_offset=200
        ),
        0,
    )
    assert plan.expire == (remote[0],)


def test_uncopied_local_segments_stay_however_old():
    local = local_log((0, 99), active_end=120, ts=0)
    s = TierSettings(
        retention_ms=1, retention_bytes=0, local_retention_ms=1, local_retention_bytes=0
    )
    plan = plan_tier(make_view(local, settings=s, now_ms=10**6), 0)
    assert plan.delete_local_up_to is None and plan.new_log_start_offset is None


def test_expiry_and_local_deletion_in_one_plan():
    local = local_log((0, 99), (100, 199), active_end=220, ts=0)
    remote = [rseg(0, 99, ts=0)]
    s = TierSettings(retention_ms=100)  # local retention resolves to the same
    s = replace(s, local_retention_ms=100)
    plan = plan_tier(make_view(local, remote, settings=s, now_ms=1000), 0)
    assert plan.expire == (remote[0],)
    assert plan.new_log_start_offset == 100
    assert plan.delete_local_up_to == 100


def test_delete_records_expires_what_lies_below_the_log_start():
    remote = [rseg(0, 99), rseg(100, 199), rseg(50, 120)]
    local = local_log((200, 299), active_end=320)
    plan = plan_tier(make_view(local, remote, log_start_offset=150, local_log_start_offset=200), 0)
    assert [s.base_offset for s in plan.expire] == [0, 50]
    assert plan.new_log_start_offset is None  # DeleteRecords moved it already


def test_a_copy_nested_below_the_new_start_expires_with_it():
    remote = [rseg(0, 199, ts=0), rseg(100, 150, ts=900)]
    local = local_log((200, 299), active_end=320)
    s = TierSettings(retention_ms=500)
    plan = plan_tier(make_view(local, remote, settings=s, local_log_start_offset=200), 0)
    assert set(plan.expire) == set(remote)
    assert plan.new_log_start_offset == 200


def test_an_in_flight_segment_stops_the_expiry_walk():
    remote = [rseg(0, 99, sid="a"), rseg(100, 199, sid="b"), rseg(200, 299, sid="c")]
    local = local_log((300, 399), active_end=420)
    s = TierSettings(retention_ms=0)
    view = make_view(local, remote, settings=s, local_log_start_offset=300)
    assert plan_tier(view, 0).expire == tuple(remote)
    plan = plan_tier(replace(view, in_flight=frozenset({"b"})), 0)
    assert plan.expire == (remote[0],)
    assert plan.new_log_start_offset == 100


def test_orphans_and_interrupted_deletes():
    remote = [
        rseg(0, 99, DELETING, sid="d1"),
        rseg(100, 199, DELETING, sid="d2"),
        rseg(200, 299, sid="f"),
        rseg(300, 399, STARTED, sid="dead", broker=1, epoch=3),
        rseg(300, 399, STARTED, sid="mine", epoch=4),
    ]
    local = local_log((300, 399), active_end=420)
    view = make_view(local, remote, leader_epoch=4, in_flight=frozenset({"d2", "mine"}))
    plan = plan_tier(view, 0)
    assert [s.segment_id for s in plan.orphans] == ["dead"]
    assert [s.segment_id for s in plan.resume_deletes] == ["d1"]


# -- KIP-950 ---------------------------------------------------------------------------


def test_remote_disabled_with_delete_drops_the_remote_tier():
    remote = [rseg(0, 99), rseg(100, 199), rseg(200, 299, STARTED, sid="orphan")]
    local = local_log((100, 199), (200, 299), active_end=320)
    s = TierSettings(remote_enabled=False, delete_on_disable=True, local_retention_ms=0)
    plan = plan_tier(make_view(local, remote, settings=s, local_log_start_offset=100), 10)
    assert plan.expire == tuple(remote[:2])
    assert [o.segment_id for o in plan.orphans] == ["orphan"]
    assert plan.new_log_start_offset == 100
    assert plan.copy == () and plan.delete_local_up_to is None
    # Without delete.on.disable the remote data stays where it is.
    plan = plan_tier(make_view(local, remote, settings=replace(s, delete_on_disable=False)), 10)
    assert plan.expire == () and plan.new_log_start_offset is None
    assert [o.segment_id for o in plan.orphans] == ["orphan"]


def test_copy_disabled_applies_the_total_retention_locally_and_moves_the_start():
    remote = [rseg(0, 99, ts=900)]
    local = (lseg(0, 99, ts=0), lseg(100, 199, ts=900), lseg(200, 199, size=0, closed=False))
    # The config helper resolves local retention to the total's with copying off.
    s = TierSettings(copy_enabled=False, retention_ms=500, local_retention_ms=500)
    plan = plan_tier(make_view(local, remote, settings=s), 10)
    assert plan.copy == ()
    # 0..99 is old locally and copied: it goes, the log start stays.
    assert plan.delete_local_up_to == 100
    assert plan.new_log_start_offset is None and plan.expire == ()

    local = local_log((0, 99), (100, 199), (200, 299), active_end=320)  # 300 bytes
    s = TierSettings(copy_enabled=False, retention_bytes=100, local_retention_bytes=100)
    plan = plan_tier(make_view(local, remote, settings=s), 10)
    # Locally 0..199 goes; 100..199 was never copied, so the log now starts at 200
    # and the remote segment below it goes too.
    assert plan.delete_local_up_to == 200
    assert plan.new_log_start_offset == 200
    assert plan.expire == (remote[0],)


# -- helpers ---------------------------------------------------------------------------


def test_highest_copied_offset_and_remote_log_start():
    assert highest_copied_offset([]) == -1 and remote_log_start([]) == -1
    remote = [rseg(0, 99), rseg(100, 199), rseg(150, 249), rseg(300, 399), rseg(250, 260, STARTED)]
    assert highest_copied_offset(remote) == 249
    assert remote_log_start(remote) == 0
    assert highest_copied_offset(remote, 120) == 249
    assert remote_log_start(remote, 120) == 120
    assert highest_copied_offset(remote, 260) == 399  # the dead prefix does not count


def test_segment_for_offset_prefers_the_newest_copier():
    old = rseg(0, 199, epoch=3)
    new = rseg(150, 299, epoch=4)
    also_new = rseg(100, 180, epoch=4)
    remote = [old, also_new, new, rseg(300, 399, STARTED, epoch=5)]
    assert segment_for_offset(remote, 50) is old
    assert segment_for_offset(remote, 120) is also_new
    assert segment_for_offset(remote, 170) is new  # epoch 4, higher base
    assert segment_for_offset(remote, 350) is None  # not readable yet
    assert segment_for_offset(list(reversed(remote)), 170) is new


def test_segment_for_timestamp():
    remote = [rseg(0, 99, ts=10), rseg(100, 199, ts=30), rseg(200, 299, ts=20)]
    assert segment_for_timestamp(remote, 5) is remote[0]
    assert segment_for_timestamp(remote, 25) is remote[1]
    assert segment_for_timestamp(remote, 25, start_offset=200) is None
    assert segment_for_timestamp(remote, 15, start_offset=150) is remote[1]
    assert segment_for_timestamp(remote, 31) is None


# -- segments found corrupt -------------------------------------------------------------


def bad(base, end, *, at=0, **kw) -> RemoteSegment:
    return replace(rseg(base, end, **kw), corrupt=True, event_ms=at)


def test_a_corrupt_segment_is_a_hole_that_still_holds_the_log_start():
    remote = [bad(0, 99), rseg(100, 199)]
    assert remote_log_start(remote) == 0  # never skipped as out of range
    assert highest_copied_offset(remote) == 199
    assert segment_for_offset(remote, 50) is None  # not served
    assert segment_for_offset(remote, 150) is remote[1]
    assert segment_for_timestamp(remote, 0) is remote[1]


def test_the_leader_copies_a_corrupt_segment_again_when_it_still_has_it():
    local = local_log((0, 99), (100, 199), active_end=220)
    remote = [bad(0, 99), rseg(100, 199)]
    s = TierSettings(local_retention_bytes=0)
    plan = plan_tier(make_view(local, remote, settings=s), 10)
    assert plan.copy == (local[0],)
    assert plan.delete_local_up_to is None  # the hole's local segment stays, and what follows
    assert plan.replaced == ()
    # once the new copy finished, the corrupt one is deleted and the local segments go
    remote.append(rseg(0, 99, sid="new"))
    plan = plan_tier(make_view(local, remote, settings=s), 10)
    assert plan.copy == () and plan.replaced == (remote[0],)
    assert plan.delete_local_up_to == 200


def test_a_leader_without_the_offsets_keeps_them_marked_and_lets_a_follower_copy():
    local = local_log((100, 199), active_end=220)
    remote = [bad(0, 99, at=1_000), rseg(100, 199)]
    view = make_view(local, remote, log_start_offset=0, local_log_start_offset=100)
    plan = plan_tier(view, 10)
    assert plan.copy == () and plan.replaced == () and plan.expire == ()
    # a follower's copy of the offsets, in the leader's epoch, is not an orphan while young
    theirs = rseg(0, 99, STARTED, broker=2, sid="theirs")
    theirs = replace(theirs, event_ms=view.now_ms)
    assert plan_tier(replace(view, remote=(*remote, theirs)), 10).orphans == ()
    old = replace(view, remote=(*remote, theirs), now_ms=view.now_ms + REPLACEMENT_COPY_TIMEOUT_MS)
    assert plan_tier(old, 10).orphans == (theirs,)
    stale = replace(theirs, copier_epoch=-1)
    assert plan_tier(replace(view, remote=(*remote, stale)), 10).orphans == (stale,)


def test_a_follower_copies_again_only_what_it_holds_committed_after_a_grace():
    local = local_log((0, 49), (50, 99), (100, 199), active_end=220)
    remote = [bad(0, 99, at=1_000), rseg(100, 199)]
    view = make_view(local, remote, is_leader=False, now_ms=1_500)
    assert follower_recopy(view, 1_000) == ()  # the leader may still do it
    later = replace(view, now_ms=2_000)
    assert follower_recopy(later, 1_000) == local[:2]
    # it keeps those local segments meanwhile
    s = TierSettings(local_retention_bytes=0)
    assert follower_delete_local_up_to(replace(later, settings=s)) is None
    # not while anyone copies them, not above its high watermark, not partly held
    busy = rseg(0, 99, STARTED, broker=0, sid="x")
    assert follower_recopy(replace(later, remote=(*remote, busy)), 1_000) == ()
    assert follower_recopy(replace(later, high_watermark=80), 1_000) == ()
    part = local_log((50, 99), (100, 199), active_end=220)
    assert follower_recopy(replace(later, local=part), 1_000) == ()
    # nor once a finished copy holds them, nor on the leader
    done = rseg(0, 99, sid="done")
    assert follower_recopy(replace(later, remote=(*remote, done)), 1_000) == ()
    assert follower_recopy(replace(later, is_leader=True), 1_000) == ()


# -- the leader-epoch lineage (unclean elections) --------------------------------------


def eseg(base, end, epochs, **kw) -> RemoteSegment:
    return replace(rseg(base, end, **kw), leader_epochs=tuple(epochs))


def test_a_copy_of_another_lineage_is_deleted_and_its_offsets_copied_again():
    # the old leader copied 100..199 in epoch 3 after offset 150; this leader (elected
    # uncleanly) never had epoch 3: its log went on at 150 in epoch 4
    local = local_log((100, 199), (200, 299), active_end=320)
    ours = ((2, 100), (4, 150))
    theirs = eseg(100, 199, [(2, 0), (3, 150)], epoch=3, sid="theirs")
    view = make_view(local, [rseg(0, 99, epoch=2), theirs], leader_epochs=ours, leader_epoch=4)
    plan = plan_tier(view, 10)
    assert plan.diverged == (theirs,)
    assert plan.copy == local[:2]  # its offsets as well as the next ones
    s = TierSettings(local_retention_bytes=0)
    assert plan_tier(replace(view, settings=s), 10).delete_local_up_to is None
    # a follower of the new lineage does not let its local copy go for it either
    follower = replace(view, is_leader=False, settings=s)
    assert follower_delete_local_up_to(follower) is None
    # the same copy with the log's own epochs is kept, and lets the local one go
    good = eseg(100, 199, [(2, 0), (4, 150)], epoch=4, sid="good")
    plan = plan_tier(replace(view, remote=(rseg(0, 99, epoch=2), good), settings=s), 10)
    assert plan.diverged == () and plan.delete_local_up_to == 200


def test_a_copy_past_the_log_end_or_below_the_cache_is_judged_as_it_must_be():
    local = local_log((100, 149), active_end=160)
    ours = ((5, 100),)
    past = eseg(150, 299, [(5, 150)], epoch=5, sid="past")  # the log is only behind it
    below = eseg(0, 99, [(1, 0)], epoch=1, sid="below")  # not judged: before the cache
    view = make_view(local, [below, past], leader_epochs=ours, local_log_start_offset=100)
    assert plan_tier(view, 10).diverged == ()
    # a new epoch at the log end (an unclean election) contradicts nothing yet; once
    # this leader has written its own records there, the copy holds the lost ones
    lost = replace(view, leader_epochs=((5, 100), (7, 161)))
    assert plan_tier(lost, 10).diverged == ()
    wrote = replace(lost, local=local_log((100, 149), active_end=200))
    wrote = replace(wrote, log_end_offset=201, high_watermark=201, last_stable_offset=201)
    assert plan_tier(wrote, 10).diverged == (past,)
    assert plan_tier(replace(wrote, leader_epochs=()), 10).diverged == ()  # no cache


def test_contradictory_views_are_refused():
    with pytest.raises(InvalidTierViewError):
        plan_tier(make_view((lseg(0, 99), lseg(50, 149), lseg(150, 149, closed=False))))
    with pytest.raises(InvalidTierViewError):
        plan_tier(make_view((lseg(0, 99, closed=False), lseg(100, 149, closed=False))))
    with pytest.raises(InvalidTierViewError):
        plan_tier(make_view((lseg(5, 2, closed=False),)))  # ends before it begins


# -- properties ------------------------------------------------------------------------

_states = st.sampled_from([STARTED, FIN, FIN, FIN, DELETING])


@st.composite
def views(draw):
    """Arbitrary consistent views: contiguous local segments, any remote list."""
    n = draw(st.integers(1, 6))
    start = draw(st.integers(0, 50))
    local = []
    base = start
    for i in range(n):
        length = draw(st.integers(0 if i == n - 1 else 1, 30))
        local.append(
            lseg(
                base,
                base + length - 1,
                ts=draw(st.integers(0, 1000)),
                size=length * 10,
                closed=i < n - 1,
            )
        )
        base += length
    leo = base
    remote = []
    for j in range(draw(st.integers(0, 6))):
        b = draw(st.integers(0, max(0, leo - 1)))
        e = draw(st.integers(b, max(b, leo - 1)))
        remote.append(
            rseg(
                b,
                e,
                draw(_states),
                ts=draw(st.integers(0, 1000)),
                size=(e - b + 1) * 10,
                epoch=draw(st.integers(0, 3)),
                sid=f"r{j}",
            )
        )
    hw = draw(st.integers(start, leo))
    ids = [r.segment_id for r in remote]
    s = TierSettings(
        copy_enabled=draw(st.booleans()),
        remote_enabled=draw(st.booleans()),
        retention_ms=draw(st.sampled_from([-1, 0, 300])),
        retention_bytes=draw(st.sampled_from([-1, 0, 200, 1000])),
        local_retention_ms=draw(st.sampled_from([-1, 0, 300])),
        local_retention_bytes=draw(st.sampled_from([-1, 0, 200])),
        delete_on_disable=draw(st.booleans()),
    )
    return make_view(
        tuple(local),
        remote,
        log_start_offset=draw(st.integers(0, start)),
        high_watermark=hw,
        last_stable_offset=draw(st.integers(start, hw)),
        in_flight=frozenset(draw(st.lists(st.sampled_from(ids), unique=True)) if ids else []),
        now_ms=draw(st.integers(0, 2000)),
        settings=s,
    )


@given(views(), st.integers(0, 4), st.randoms(use_true_random=False))
@settings(max_examples=300, deadline=None)
def test_plans_are_deterministic_and_ignore_the_list_order(view, max_copies, rnd):
    plan = plan_tier(view, max_copies)
    assert plan_tier(view, max_copies) == plan
    shuffled = list(view.remote)
    rnd.shuffle(shuffled)
    assert plan_tier(replace(view, remote=tuple(shuffled)), max_copies) == plan


@given(views(), st.integers(0, 4))
@settings(max_examples=300, deadline=None)
def test_plan_rules_hold_on_any_view(view, max_copies):
    plan = plan_tier(view, max_copies)
    limit = min(view.high_watermark, view.last_stable_offset)
    held = _offsets(
        s
        for s in view.remote
        if s.readable or (s.state is STARTED and s.segment_id in view.in_flight)
    )
    assert len(plan.copy) <= max_copies
    assert list(plan.copy) == sorted(plan.copy, key=lambda s: s.base_offset)
    for seg in plan.copy:
        assert seg.closed and seg.end_offset < limit
        assert (
            not set(range(max(seg.base_offset, view.log_start_offset), seg.end_offset + 1)) <= held
        )
    for seg in plan.expire:
        assert seg.state is FIN and seg.segment_id not in view.in_flight
    for seg in plan.orphans:
        assert seg.state is STARTED and seg.segment_id not in view.in_flight
    for seg in plan.resume_deletes:
        assert seg.state is DELETING and seg.segment_id not in view.in_flight
    assert {s.segment_id for s in plan.orphans} == {
        s.segment_id
        for s in view.remote
        if s.state is STARTED and s.segment_id not in view.in_flight
    }
    new_start = plan.new_log_start_offset or view.log_start_offset
    if plan.delete_local_up_to is not None:
        assert plan.delete_local_up_to <= view.local[-1].base_offset  # never the active one
        gone = {s.segment_id for s in plan.expire}
        kept = _offsets(s for s in view.remote if s.readable and s.segment_id not in gone)
        for seg in view.local:
            if seg.end_offset < plan.delete_local_up_to and view.settings.copy_enabled:
                lost = set(range(max(seg.base_offset, new_start), seg.end_offset + 1))
                assert lost <= kept, (seg, plan)


def _offsets(segs) -> set[int]:
    out: set[int] = set()
    for s in segs:
        out.update(range(s.base_offset, s.end_offset + 1))
    return out


# -- the stateful model ----------------------------------------------------------------


class TierModel(RuleBasedStateMachine):
    """Two replicas of one partition, appends, rolls, HW and LSO moves, leader changes,
    copier crashes, zombie copiers, clock ticks; the leader's plans applied as a shell
    would. The invariant: every offset in [log start, log end) is readable."""

    @initialize(
        retention_ms=st.sampled_from([-1, 60, 200]),
        retention_bytes=st.sampled_from([-1, 150, 400]),
        local_ms=st.sampled_from([-1, 0, 40]),
        local_bytes=st.sampled_from([-1, 0, 80]),
        mode=st.sampled_from(["tiered", "tiered", "copy_off", "remote_off_delete"]),
    )
    def setup(self, retention_ms, retention_bytes, local_ms, local_bytes, mode):
        self.tiered = TierSettings(
            retention_ms=retention_ms,
            retention_bytes=retention_bytes,
            local_retention_ms=local_ms,
            local_retention_bytes=local_bytes,
        )
        self.set_mode(mode)
        # Per replica: [base, end, size, max_ts] segments, the last one active.
        self.replicas = {0: [[0, -1, 0, -1]], 1: [[0, -1, 0, -1]]}
        self.leader = 0
        self.epoch = 0
        self.leo = self.hw = self.lso = self.log_start = 0
        self.now = 1000
        self.remote: dict[str, RemoteSegment] = {}
        self.in_flight: set[str] = set()
        self.next_id = 0
        self.copied: dict[tuple[int, int, int], str] = {}
        # A replica's own log start floor: when the tier is dropped (KIP-950), each
        # follower's log starts at its local log start, and so does it as a leader.
        self.floor = {0: 0, 1: 0}

    # -- the log --

    @rule(
        n=st.integers(1, 20),
        jitter=st.integers(0, 30),
        replicated=st.booleans(),
        rolls=st.sampled_from([(), (0,), (1,), (0, 1)]),
    )
    def append(self, n, jitter, replicated, rolls):
        for segs in self.replicas.values():
            active = segs[-1]
            active[1] += n
            active[2] += 10 * n
            active[3] = max(active[3], self.now - jitter)
        self.leo += n
        if replicated:  # the followers caught up: the HW (and, no transaction open, the LSO)
            self.hw = self.leo
            self.lso = max(self.lso, self.leo - jitter // 3)
        for broker in rolls:  # each replica rolls at its own offsets
            self.roll(broker)

    @rule(broker=st.sampled_from([0, 1]))
    def roll(self, broker):
        segs = self.replicas[broker]
        if segs[-1][1] >= segs[-1][0]:
            segs.append([self.leo, self.leo - 1, 0, -1])

    @rule(hw_step=st.integers(0, 30), lso_step=st.integers(0, 30))
    def advance(self, hw_step, lso_step):
        self.hw = min(self.leo, self.hw + hw_step)
        self.lso = min(self.hw, self.lso + lso_step)

    @rule(ms=st.integers(1, 150))
    def tick(self, ms):
        self.now += ms

    @rule(mode=st.sampled_from(["tiered", "copy_off", "remote_off", "remote_off_delete"]))
    def set_mode(self, mode):
        t = self.tiered
        self.settings = {
            "tiered": t,
            # The config helper resolves local retention to the total's with copy off.
            "copy_off": replace(
                t,
                copy_enabled=False,
                local_retention_ms=t.retention_ms,
                local_retention_bytes=t.retention_bytes,
            ),
            "remote_off": replace(t, remote_enabled=False),
            "remote_off_delete": replace(t, remote_enabled=False, delete_on_disable=True),
        }[mode]

    # -- leadership and the copier --

    @rule(other=st.booleans())
    def leader_change(self, other):
        if other:
            self.leader = 1 - self.leader
        self.epoch += 1
        self.in_flight.clear()  # the old leader's copies and deletes are abandoned
        self.log_start = max(self.log_start, self.floor[self.leader])

    @rule()
    def crash_copier(self):
        self.in_flight.clear()

    def _pick(self, data, pred):
        ids = sorted(i for i, s in self.remote.items() if pred(i, s))
        return data.draw(st.sampled_from(ids)) if ids else None

    @rule(data=st.data())
    def copy_finishes(self, data):
        sid = self._pick(data, lambda i, s: s.state is STARTED and i in self.in_flight)
        if sid:  # published; the shell drops it from in_flight on a later step
            self.remote[sid] = self.remote[sid].with_state(FIN, checksum="x")

    @rule()
    def shell_settles(self):
        self.in_flight -= {i for i, s in self.remote.items() if s.state is FIN}

    @rule(data=st.data())
    def zombie_finishes(self, data):
        sid = self._pick(data, lambda i, s: s.state is STARTED and i not in self.in_flight)
        if sid:  # a deposed copier completes before anyone marked its segment
            self.remote[sid] = self.remote[sid].with_state(FIN, checksum="x")

    @rule(data=st.data())
    def delete_finishes(self, data):
        sid = self._pick(data, lambda i, s: s.state is DELETING and i in self.in_flight)
        if sid:
            del self.remote[sid]
            self.in_flight.discard(sid)

    # -- views and plans --

    def view(self, broker) -> TierView:
        segs = self.replicas[broker]
        local = tuple(
            LocalSegment(b, e, size, ts, i < len(segs) - 1)
            for i, (b, e, size, ts) in enumerate(segs)
        )
        remote = sorted(self.remote.values(), key=lambda s: (s.base_offset, s.segment_id))
        return TierView(
            broker_id=broker,
            leader_epoch=self.epoch,
            is_leader=broker == self.leader,
            local=local,
            remote=tuple(remote),
            log_start_offset=self.log_start,
            local_log_start_offset=segs[0][0],
            high_watermark=self.hw,
            last_stable_offset=self.lso,
            log_end_offset=self.leo,
            in_flight=frozenset(self.in_flight) if broker == self.leader else frozenset(),
            now_ms=self.now,
            settings=self.settings,
        )

    @rule(max_copies=st.integers(0, 3), settle=st.booleans())
    def run_plan(self, max_copies, settle):
        """Plan and apply; with ``settle`` the shell also finishes all it has in flight."""
        view = self.view(self.leader)
        plan = plan_tier(view, max_copies)
        assert plan_tier(view, max_copies) == plan
        assert plan_tier(replace(view, remote=view.remote[::-1]), max_copies) == plan
        assert plan_tier(self.view(1 - self.leader), max_copies) is EMPTY_PLAN
        self._check(view, plan, max_copies)
        self._apply(plan)
        if settle:
            for sid in sorted(self.in_flight):
                seg = self.remote[sid]
                if seg.state is STARTED:
                    self.remote[sid] = seg.with_state(FIN, checksum="x")
                elif seg.state is DELETING:
                    del self.remote[sid]
            self.in_flight.clear()

    def _check(self, view, plan, max_copies):
        limit = min(self.hw, self.lso)
        finished_or_ours = _offsets(
            s
            for i, s in self.remote.items()
            if s.state is FIN or (s.state is STARTED and i in self.in_flight)
        )
        assert len(plan.copy) <= max_copies
        for seg in plan.copy:
            assert seg.closed and seg.end_offset < limit  # nothing at or above min(HW, LSO)
            assert not set(range(max(seg.base_offset, self.log_start), seg.end_offset + 1)) <= (
                finished_or_ours
            )
            prior = self.copied.get((self.epoch, seg.base_offset, seg.end_offset))
            if prior in self.remote:  # never twice by one epoch while in flight or finished
                s = self.remote[prior]
                assert not (s.state is FIN or (s.state is STARTED and prior in self.in_flight))
        # Every orphan of a dead copier is found.
        assert {s.segment_id for s in plan.orphans} == {
            i for i, s in self.remote.items() if s.state is STARTED and i not in self.in_flight
        }
        assert {s.segment_id for s in plan.resume_deletes} == {
            i for i, s in self.remote.items() if s.state is DELETING and i not in self.in_flight
        }
        if plan.delete_local_up_to is not None and self.settings.copy_enabled:
            new_start = plan.new_log_start_offset or self.log_start
            gone = {s.segment_id for s in plan.expire}
            covered = _offsets(
                s for s in self.remote.values() if s.readable and s.segment_id not in gone
            )
            for seg in view.local:
                if seg.end_offset < plan.delete_local_up_to:
                    # Deleted locally only once a finished copy holds it (or it is dead).
                    lost = set(range(max(seg.base_offset, new_start), seg.end_offset + 1))
                    assert lost <= covered
        assert plan.copy_gap is None
        new_start = plan.new_log_start_offset or self.log_start
        if self.settings.remote_enabled:
            # Retention moves the log start: nothing expired stays offered to readers.
            assert all(s.end_offset < new_start for s in plan.expire)

    def _apply(self, plan):
        if not self.settings.remote_enabled and self.settings.delete_on_disable:
            for broker, segs in self.replicas.items():
                self.floor[broker] = max(self.floor[broker], segs[0][0])
        if plan.new_log_start_offset is not None:
            assert plan.new_log_start_offset <= self.hw
            self.log_start = plan.new_log_start_offset
        for seg in (*plan.expire, *plan.orphans):
            self.remote[seg.segment_id] = seg.with_state(DELETING)
            self.in_flight.add(seg.segment_id)
        for seg in plan.resume_deletes:
            self.in_flight.add(seg.segment_id)
        if plan.delete_local_up_to is not None:
            segs = self.replicas[self.leader]
            while len(segs) > 1 and segs[0][1] < plan.delete_local_up_to:
                segs.pop(0)
        for seg in plan.copy:
            sid = f"c{self.next_id}"
            self.next_id += 1
            self.remote[sid] = RemoteSegment(
                topic_id="t",
                partition=0,
                segment_id=sid,
                base_offset=seg.base_offset,
                end_offset=seg.end_offset,
                max_timestamp=seg.max_timestamp,
                size_bytes=seg.size_bytes,
                leader_epochs=((self.epoch, seg.base_offset),),
                copier_epoch=self.epoch,
                broker_id=self.leader,
            )
            self.in_flight.add(sid)
            self.copied[(self.epoch, seg.base_offset, seg.end_offset)] = sid

    @rule()
    def follower_retention(self):
        follower = 1 - self.leader
        up_to = follower_delete_local_up_to(self.view(follower))
        if up_to is not None:
            segs = self.replicas[follower]
            while len(segs) > 1 and segs[0][1] < up_to:
                segs.pop(0)

    # -- invariants --

    @invariant()
    def every_offset_is_readable(self):
        if not hasattr(self, "replicas"):
            return
        assert 0 <= self.log_start <= self.hw <= self.leo
        local_start = self.replicas[self.leader][0][0]
        readable = _offsets(s for s in self.remote.values() if s.readable)
        missing = [
            o for o in range(self.log_start, min(local_start, self.leo)) if o not in readable
        ]
        assert not missing, (self.log_start, local_start, missing[:5])

    @invariant()
    def lookups_agree_with_coverage(self):
        if not hasattr(self, "replicas"):
            return
        remote = list(self.remote.values())
        for o in range(self.log_start, self.leo, 7):
            seg = segment_for_offset(remote, o)
            assert seg is None or (seg.readable and seg.base_offset <= o <= seg.end_offset)
            rnd = random.Random(o)
            rnd.shuffle(remote)
            assert segment_for_offset(remote, o) == seg


TierModel.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
test_tier_model = TierModel.TestCase
