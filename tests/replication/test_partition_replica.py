"""PartitionReplica rule by rule: HW, ISR shrink/expand, acks=all purgatory, truncation."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from logmq.errors import ErrorCode
from logmq.replication.partition_replica import (
    AlterIsr,
    AskLeaderEpoch,
    EpochEndOffset,
    HighWatermarkChanged,
    PartitionReplica,
    ProduceCompleted,
    ReplicaConfig,
    StartFetching,
    TruncateTo,
)
from logmq.storage.leader_epoch import LeaderEpochCache

LAG = 1_000


@dataclass(frozen=True)
class State:
    leader: int
    leader_epoch: int
    partition_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


def epochs(*pairs: tuple[int, int]) -> LeaderEpochCache:
    cache = LeaderEpochCache(None)
    for epoch, start in pairs:
        cache.assign(epoch, start)
    return cache


def leader(min_isr: int = 1, isr=(1, 2, 3), leo: int = 0, now: int = 0) -> PartitionReplica:
    r = PartitionReplica(
        1,
        epochs((0, 0)),
        log_end_offset=leo,
        high_watermark=0,
        config=ReplicaConfig(replica_lag_time_max_ms=LAG, min_insync_replicas=min_isr),
    )
    r.become_leader(State(1, 0, 0, (1, 2, 3), tuple(isr)), now)
    return r


def kinds(actions) -> list[type]:
    return [type(a) for a in actions]


def test_hw_is_min_leo_over_the_isr_and_never_moves_back():
    r = leader()
    r.on_append(10)
    assert r.hw == 0  # followers' LEOs are unknown until they fetch
    assert r.on_follower_fetch(2, 10, 0, 1).error is ErrorCode.NONE
    assert r.hw == 0
    actions = r.on_follower_fetch(3, 7, 0, 1).actions
    assert r.hw == 7 and HighWatermarkChanged(7) in actions
    r.on_follower_fetch(3, 10, 0, 2)
    assert r.hw == 10
    r.on_follower_fetch(3, 4, 0, 3)  # a follower that truncated: the HW stays
    assert r.hw == 10


def test_fetches_are_fenced_by_leader_epoch():
    r = leader()
    r.on_append(5)
    assert r.on_follower_fetch(2, 0, -1, 0).error is ErrorCode.FENCED_LEADER_EPOCH
    assert r.on_follower_fetch(2, 0, 1, 0).error is ErrorCode.UNKNOWN_LEADER_EPOCH
    assert r.on_follower_fetch(9, 0, 0, 0).error is ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert r.on_follower_fetch(2, 6, 0, 0).error is ErrorCode.OFFSET_OUT_OF_RANGE
    r.become_follower(State(2, 1, 1, (1, 2, 3), (1, 2, 3)))
    assert r.on_follower_fetch(2, 0, 1, 0).error is ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_lagging_follower_is_shrunk_only_once_the_controller_agrees():
    r = leader()
    r.on_append(10)
    r.on_follower_fetch(2, 10, 0, 100)
    r.on_follower_fetch(3, 2, 0, 100)
    assert r.tick(LAG) == []  # 3 was caught up at become_leader (t=0)
    r.on_follower_fetch(2, 10, 0, LAG)
    actions = r.tick(LAG + 1)
    assert actions == [AlterIsr((1, 2), 0, 0)]
    assert r.tick(LAG + 2) == []  # one request at a time
    # Until the controller confirms, 3 still counts: the HW may not pass it.
    assert r.isr == (1, 2, 3) and r.hw == 2
    r.on_alter_isr_response(ErrorCode.NONE, State(1, 0, 1, (1, 2, 3), (1, 2)))
    assert r.isr == (1, 2) and r.hw == 10 and r.pending_isr is None


def test_refused_alter_isr_is_forgotten_and_retried_after_a_backoff():
    r = leader()
    r.on_append(1)
    r.on_follower_fetch(2, 1, 0, LAG)
    assert r.tick(LAG + 1) == [AlterIsr((1, 2), 0, 0)]
    r.on_alter_isr_response(ErrorCode.INVALID_UPDATE_VERSION)
    assert r.pending_isr is None
    assert r.tick(LAG + 2) == []  # not at once: the backoff (100 ms) first
    assert r.tick(LAG + 1 + 100) == [AlterIsr((1, 2), 0, 0)]


def test_alter_isr_retries_back_off_exponentially_up_to_a_cap_and_reset_on_success():
    cfg = ReplicaConfig(
        replica_lag_time_max_ms=LAG, alter_isr_backoff_ms=100, alter_isr_backoff_max_ms=1_000
    )
    r = PartitionReplica(1, epochs((0, 0)), log_end_offset=0, high_watermark=0, config=cfg)
    r.become_leader(State(1, 0, 0, (1, 2, 3), (1, 2, 3)), 0)
    r.on_append(1)
    r.on_follower_fetch(2, 1, 0, LAG)
    now = LAG + 1
    sent = [now]
    assert r.tick(now) == [AlterIsr((1, 2), 0, 0)]
    for _ in range(6):  # the controller keeps refusing (or is unreachable)
        r.on_alter_isr_response(ErrorCode.REQUEST_TIMED_OUT)
        while not r.tick(now):
            now += 10
        sent.append(now)
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert gaps == [100, 200, 400, 800, 1_000, 1_000]  # doubling, capped
    # A committed change resets it: the next refusal waits the first step again.
    r.on_alter_isr_response(ErrorCode.NONE, State(1, 0, 1, (1, 2, 3), (1, 2)))
    assert r.isr == (1, 2) and r.isr_failures == 0
    r.on_follower_fetch(3, 1, 0, now)  # caught up: asks to rejoin at once
    assert r.pending_isr == AlterIsr((1, 2, 3), 0, 1)
    r.on_alter_isr_response(ErrorCode.INVALID_UPDATE_VERSION)
    assert r.on_follower_fetch(3, 1, 0, now + 50).actions == []
    assert r.on_follower_fetch(3, 1, 0, now + 100).actions == [AlterIsr((1, 2, 3), 0, 1)]


def test_caught_up_follower_rejoins_through_the_controller():
    r = leader(isr=(1, 2))
    r.on_append(10)
    r.on_follower_fetch(2, 10, 0, 1)
    assert r.hw == 10
    actions = r.on_follower_fetch(3, 5, 0, 1).actions
    assert not any(isinstance(a, AlterIsr) for a in actions)  # behind the HW
    actions = r.on_follower_fetch(3, 10, 0, 2).actions
    assert AlterIsr((1, 2, 3), 0, 0) in actions
    # Pending expansion already counts for the HW (maximal ISR).
    r.on_append(12)
    r.on_follower_fetch(2, 12, 0, 3)
    assert r.hw == 10
    r.on_follower_fetch(3, 12, 0, 3)
    assert r.hw == 12
    r.update_metadata(State(1, 0, 1, (1, 2, 3), (1, 2, 3)))
    assert r.isr == (1, 2, 3) and r.pending_isr is None


def test_rejoining_needs_the_start_of_the_current_epoch():
    r = PartitionReplica(1, epochs((0, 0)), log_end_offset=20, high_watermark=5)
    r.become_leader(State(1, 1, 0, (1, 2), (1,)), 0)
    assert r.hw == 20  # alone in the ISR
    actions = r.on_follower_fetch(2, 5, 1, 1).actions
    assert not any(isinstance(a, AlterIsr) for a in actions)


def test_acks_all_purgatory():
    r = leader(min_isr=2)
    assert r.check_append(-1) is ErrorCode.NONE
    r.on_append(3)
    assert r.await_replication("a", 2, deadline_ms=500) is None
    assert r.await_replication("b", 3, deadline_ms=100) is None
    assert r.waiting == 2
    r.on_follower_fetch(2, 3, 0, 1)
    actions = r.on_follower_fetch(3, 2, 0, 1).actions
    assert ProduceCompleted("a", ErrorCode.NONE) in actions and r.waiting == 1
    assert r.tick(100) == [ProduceCompleted("b", ErrorCode.REQUEST_TIMED_OUT)]
    assert r.await_replication("c", 2, deadline_ms=1) is ErrorCode.NONE  # already there


def test_acks_all_fails_when_the_isr_drops_below_min_insync():
    r = leader(min_isr=2, isr=(1, 2))
    r.on_append(5)
    assert r.await_replication("w", 5, deadline_ms=10_000) is None
    actions = r.update_metadata(State(1, 0, 1, (1, 2, 3), (1,)))
    assert ProduceCompleted("w", ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND) in actions
    assert r.check_append(-1) is ErrorCode.NOT_ENOUGH_REPLICAS
    assert r.check_append(1) is ErrorCode.NONE  # acks=1 does not care


def test_losing_leadership_fails_waiters():
    r = leader()
    r.on_append(5)
    r.await_replication("w", 5, deadline_ms=10_000)
    actions = r.become_follower(State(2, 1, 1, (1, 2, 3), (2, 3)))
    assert actions[0] == ProduceCompleted("w", ErrorCode.NOT_LEADER_OR_FOLLOWER)
    assert isinstance(actions[-1], AskLeaderEpoch)


def follower(history, leo, hw=0) -> PartitionReplica:
    r = PartitionReplica(2, epochs(*history), log_end_offset=leo, high_watermark=hw)
    return r


@pytest.mark.parametrize(
    ("mine", "leo", "answers", "asks", "truncate_to"),
    [
        # Same latest epoch, the leader has less: cut to its end.
        ([(0, 0), (2, 10)], 15, [(2, 12)], [2], 12),
        # Same latest epoch, the leader has more: nothing to cut.
        ([(0, 0), (2, 10)], 15, [(2, 30)], [2], 15),
        # The leader never had our epoch 2; it answers epoch 0 ending at 8, which we
        # have (ending at 10): the logs split at 8.
        ([(0, 0), (2, 10)], 15, [(0, 8)], [2], 8),
        # Leader's epoch 1 is one we never had: ask about our epoch 0, then cut.
        ([(0, 0), (3, 10)], 15, [(1, 20), (0, 6)], [3, 0], 6),
        # Every epoch we hold is newer than the leader's answer: cut where ours start.
        ([(4, 10)], 15, [(2, 30)], [4], 10),
    ],
)
def test_truncation_by_leader_epoch(mine, leo, answers, asks, truncate_to):
    r = follower(mine, leo, hw=3)
    actions = r.become_follower(State(1, 7, 0, (1, 2), (1, 2)))
    assert actions == [AskLeaderEpoch(1, 7, asks[0])]
    for (epoch, end), next_ask in zip(answers, [*asks[1:], None], strict=True):
        actions = r.on_leader_epoch_answer(ErrorCode.NONE, epoch, end)
        if next_ask is not None:
            assert actions == [AskLeaderEpoch(1, 7, next_ask)]
    expected = [StartFetching(1, 7, truncate_to)]
    if truncate_to < leo:
        expected.insert(0, TruncateTo(truncate_to))
    assert actions == expected
    assert r.leo == truncate_to and r.fetching and r.hw == min(3, truncate_to)


def test_truncation_falls_back_to_hw_only_without_epoch_information():
    r = follower([(0, 0)], 10, hw=4)
    r.become_follower(State(1, 2, 0, (1, 2), (1, 2)))
    assert r.on_leader_epoch_answer(ErrorCode.NONE, -1, -1) == [
        TruncateTo(4),
        StartFetching(1, 2, 4),
    ]
    empty = follower([], 0)
    assert empty.become_follower(State(1, 2, 0, (1, 2), (1, 2))) == [StartFetching(1, 2, 0)]


def test_errors_keep_the_question_open():
    r = follower([(0, 0)], 10)
    r.become_follower(State(1, 2, 0, (1, 2), (1, 2)))
    assert r.on_leader_epoch_answer(ErrorCode.NOT_LEADER_OR_FOLLOWER, 0, 0) == []
    assert r.asked_epoch == 0 and not r.fetching


def test_leader_answers_offsets_for_leader_epoch():
    r = PartitionReplica(1, epochs((0, 0), (2, 10), (5, 30)), log_end_offset=40, high_watermark=0)
    r.become_leader(State(1, 6, 0, (1, 2), (1, 2)), 0)
    assert r.end_offset_for_epoch(6, 5) == EpochEndOffset(ErrorCode.NONE, 5, 40)
    assert r.end_offset_for_epoch(6, 3) == EpochEndOffset(ErrorCode.NONE, 2, 30)
    assert r.end_offset_for_epoch(5, 3).error is ErrorCode.FENCED_LEADER_EPOCH
    assert r.end_offset_for_epoch(6, 7).error is ErrorCode.UNKNOWN_LEADER_EPOCH


def test_follower_hw_follows_the_leader_within_its_log():
    r = follower([(0, 0)], 0)
    r.become_follower(State(1, 0, 0, (1, 2), (1, 2)))
    r.on_leader_epoch_answer(ErrorCode.NONE, 0, 0)
    assert r.on_fetched(5, 3) == [HighWatermarkChanged(3)]
    assert r.on_fetched(5, 9) == [HighWatermarkChanged(5)]
    assert r.on_fetched(5, 2) == []  # a lagging new leader's HW does not move ours back


def test_a_refused_copy_does_not_hide_an_applied_one():
    """Found by the simulation: two copies of one AlterIsr, the refusal answered first."""
    r = leader(isr=(1, 2))
    r.on_append(4)
    r.on_follower_fetch(2, 4, 0, 1)
    actions = r.on_follower_fetch(3, 4, 0, 1).actions
    assert AlterIsr((1, 2, 3), 0, 0) in actions
    # One copy was applied (ISR 1,2,3 at partition epoch 1); the other copy's refusal
    # arrives first. 3 must keep counting for the HW.
    r.on_alter_isr_response(ErrorCode.INVALID_UPDATE_VERSION)
    assert r.pending_isr is None and r.maximal_isr == (1, 2, 3)
    r.on_append(6)
    r.on_follower_fetch(2, 6, 0, 2)
    assert r.hw == 4  # 3 has not fetched 4..5
    r.on_alter_isr_response(ErrorCode.NONE, State(1, 0, 1, (1, 2, 3), (1, 2, 3)))
    assert r.isr == (1, 2, 3)
    r.on_follower_fetch(3, 6, 0, 3)
    assert r.hw == 6


def test_members_of_refused_requests_stop_counting_once_the_epoch_moves():
    r = leader(isr=(1, 2))
    r.on_append(4)
    r.on_follower_fetch(2, 4, 0, 0)
    r.on_follower_fetch(3, 4, 0, 0)
    r.on_alter_isr_response(ErrorCode.INELIGIBLE_REPLICA)  # 3 got fenced meanwhile
    r.on_append(8)
    r.on_follower_fetch(2, 8, 0, LAG)
    assert r.hw == 4  # 3 still counts: another copy of the request might be applied
    # 3 stays silent: the leader asks to confirm the ISR it has, which moves the
    # partition epoch; from then on only the confirmed ISR counts.
    assert r.tick(LAG + 1) == [AlterIsr((1, 2), 0, 0)]
    r.on_alter_isr_response(ErrorCode.NONE, State(1, 0, 1, (1, 2, 3), (1, 2)))
    assert r.maximal_isr == (1, 2) and r.hw == 8


def test_low_watermark_is_the_lowest_log_start_offset_the_isr_reported():
    r = leader(isr=(1, 2, 3), leo=50)
    assert r.low_watermark(20) == -1  # followers have not reported theirs yet
    r.on_follower_fetch(2, 50, 0, 1, log_start_offset=20)
    assert r.low_watermark(20) == -1  # follower 3 still unknown
    r.on_follower_fetch(3, 50, 0, 1, log_start_offset=10)
    assert r.low_watermark(20) == 10
    r.on_follower_fetch(3, 50, 0, 2, log_start_offset=20)
    assert r.low_watermark(20) == 20
    assert r.low_watermark(5) == 5  # the leader's own start counts too
    # a replica outside the ISR is not waited for
    r.update_metadata(State(1, 0, 1, (1, 2, 3), (1, 2)))
    r.on_follower_fetch(3, 50, 0, 3, log_start_offset=0)
    assert r.low_watermark(20) == 20


# -- idle partitions in fetch sessions (issue 16) -----------------------------------------
def test_a_follower_at_the_leo_stays_in_sync_however_long_it_is_silent_on_the_partition():
    r = leader()
    r.on_append(5, 0)
    r.on_follower_fetch(2, 5, 0, 10)
    r.on_follower_fetch(3, 5, 0, 10)
    # an idle partition in a fetch session: no fetch names it for many lag periods
    assert r.tick(10 * LAG) == []
    assert r.idle()


def test_an_append_starts_the_lag_clock_of_followers_that_had_everything():
    r = leader()
    r.on_append(5, 0)
    r.on_follower_fetch(2, 5, 0, 10)
    r.on_follower_fetch(3, 5, 0, 10)
    r.on_append(6, 5 * LAG)  # caught up until this append, long after their last fetch
    assert not r.idle()  # followers behind the LEO: the leader times them
    assert r.tick(5 * LAG + 1) == []
    r.on_follower_fetch(2, 6, 0, 5 * LAG + 100)
    assert r.tick(6 * LAG + 1) == [AlterIsr((1, 2), 0, 0)]  # 3 never fetched the append


def test_a_silent_follower_broker_leaves_the_isr_even_at_the_leo():
    r = leader()
    r.on_append(5, 0)
    r.on_follower_fetch(2, 5, 0, 10)
    r.on_follower_fetch(3, 5, 0, 10)
    assert not r.idle(silent={3})
    assert r.tick(2 * LAG, silent={3}) == [AlterIsr((1, 2), 0, 0)]


def test_a_caught_up_replica_outside_the_isr_is_asked_back_by_the_tick():
    r = leader(isr=(1, 2))
    r.on_append(5, 0)
    r.on_follower_fetch(2, 5, 0, 10)
    r.on_follower_fetch(3, 5, 0, 10)  # asks to expand at once
    assert r.pending_isr == AlterIsr((1, 2, 3), 0, 0)
    r.on_alter_isr_response(ErrorCode.REQUEST_TIMED_OUT)  # lost: the fetch will not repeat
    assert not r.idle()
    now = 10
    while not (actions := r.tick(now)):
        now += 10
    assert actions == [AlterIsr((1, 2, 3), 0, 0)]
    r.on_alter_isr_response(ErrorCode.REQUEST_TIMED_OUT)
    # Silent, 3 is not asked back; as a member of a refused request it still counts, so
    # the leader confirms the ISR it has (moving the partition epoch past that request).
    assert r.tick(now + 10_000, silent={3}) == [AlterIsr((1, 2), 0, 0)]
