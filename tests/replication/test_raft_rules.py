"""Unit tests: one Raft rule each, on a single RaftNode fed hand-written messages."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from logmq.replication import (
    AppendRequest,
    AppendResponse,
    Entry,
    EntryKind,
    HardState,
    HeartbeatRequest,
    HeartbeatResponse,
    Message,
    PersistentState,
    RaftNode,
    Ready,
    Role,
    Snapshot,
    SnapshotRequest,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)

ELECTION = 10


def make(
    node_id: int = 1, voters=(1, 2, 3), state: PersistentState | None = None, **kw
) -> RaftNode:
    kw.setdefault("election_ticks", ELECTION)
    return RaftNode(node_id, voters, state, rng=random.Random(node_id), **kw)


def drain(node: RaftNode) -> list[Ready]:
    readies = []
    while (rd := node.ready()) is not None:
        readies.append(rd)
        node.advance(rd)
    return readies


def sent(node: RaftNode) -> list[Message]:
    return [m for rd in drain(node) for m in rd.messages]


def elect(node: RaftNode) -> None:
    """Win pre-vote and vote with grants from every peer."""
    node.campaign()
    for peer in sorted(node.voters - {node.node_id}):
        if node.role is Role.PRE_CANDIDATE:
            node.step(VoteResponse(peer, node.node_id, node.term + 1, True, pre_vote=True))
    for peer in sorted(node.voters - {node.node_id}):
        if node.role is Role.CANDIDATE:
            node.step(VoteResponse(peer, node.node_id, node.term, True))
    assert node.role is Role.LEADER


def entries(*terms: int, start: int = 1) -> list[Entry]:
    return [Entry(index=start + i, term=t, data=b"e%d" % (start + i)) for i, t in enumerate(terms)]


def state(term: int, log_terms: tuple[int, ...] = (), voted_for=None, commit=0) -> PersistentState:
    return PersistentState(HardState(term, voted_for, commit), entries=entries(*log_terms))


# -- elections ---------------------------------------------------------------------------------


def test_election_timeout_is_randomized_within_one_to_two_timeouts_and_seeded() -> None:
    def ticks_until_campaign(seed: int) -> int:
        node = RaftNode(1, (1, 2, 3), rng=random.Random(seed), election_ticks=ELECTION)
        for tick in range(1, 3 * ELECTION):
            node.tick()
            if node.role is not Role.FOLLOWER:
                return tick
        raise AssertionError("never campaigned")

    observed = {ticks_until_campaign(seed) for seed in range(30)}
    assert all(ELECTION <= t < 2 * ELECTION for t in observed)
    assert len(observed) > 1
    assert ticks_until_campaign(7) == ticks_until_campaign(7)


def test_pre_vote_changes_neither_term_nor_vote() -> None:
    node = make(state=state(term=4, voted_for=2))
    node.campaign()
    assert node.role is Role.PRE_CANDIDATE
    assert (node.term, node.voted_for) == (4, 2)
    readies = drain(node)
    assert all(rd.hard_state is None for rd in readies)
    requests = [m for rd in readies for m in rd.messages]
    assert {(m.dst, m.term, m.pre_vote) for m in requests} == {(2, 5, True), (3, 5, True)}


def test_pre_vote_win_starts_a_real_election_and_a_real_win_appends_a_noop() -> None:
    node = make()
    node.campaign()
    drain(node)
    node.step(VoteResponse(2, 1, 1, True, pre_vote=True))
    assert node.role is Role.CANDIDATE and node.term == 1 and node.voted_for == 1
    readies = drain(node)
    assert readies[0].hard_state == HardState(1, 1, 0)
    assert {m.dst for m in readies[0].messages if isinstance(m, VoteRequest)} == {2, 3}
    node.step(VoteResponse(3, 1, 1, True))
    assert node.role is Role.LEADER and node.leader_id == 1
    (rd,) = drain(node)
    assert rd.entries == (Entry(1, 1, b"", EntryKind.NOOP),)
    assert {m.dst for m in rd.messages if isinstance(m, AppendRequest)} == {2, 3}


def test_lost_election_returns_to_follower() -> None:
    node = make()
    node.campaign()
    node.step(VoteResponse(2, 1, 0, False, pre_vote=True))
    assert node.role is Role.PRE_CANDIDATE
    node.step(VoteResponse(3, 1, 0, False, pre_vote=True))
    assert node.role is Role.FOLLOWER and node.term == 0


def test_vote_granted_to_one_candidate_per_term_and_persisted_before_the_reply() -> None:
    node = make()
    node.step(VoteRequest(2, 1, term=1, last_log_index=0, last_log_term=0))
    (rd,) = drain(node)
    # The grant and the vote that justifies it travel in the same Ready: persisted first.
    assert rd.hard_state == HardState(1, 2, 0) and rd.must_sync
    assert rd.messages == (VoteResponse(1, 2, 1, True),)
    node.step(VoteRequest(3, 1, term=1, last_log_index=5, last_log_term=1))
    assert sent(node) == [VoteResponse(1, 3, 1, False)]
    node.step(VoteRequest(2, 1, term=1, last_log_index=0, last_log_term=0))  # duplicate
    assert sent(node) == [VoteResponse(1, 2, 1, True)]


def test_vote_requests_from_non_voters_are_ignored() -> None:
    node = make()
    node.step(VoteRequest(7, 1, term=5, last_log_index=9, last_log_term=9))
    assert sent(node) == [] and node.term == 0 and node.voted_for is None


def test_leader_messages_from_non_voters_are_ignored() -> None:
    """Whoever reaches the quorum port as a non-voter cannot lead: no term bump, no
    entries, no snapshot, no forced election."""
    node = make(observers=(7,))
    entries = (Entry(1, 5, b"forged"),)
    for msg in (
        AppendRequest(7, 1, 5, prev_index=0, prev_term=0, entries=entries, commit=1),
        HeartbeatRequest(7, 1, 5, commit=0),
        SnapshotRequest(7, 1, 5, Snapshot(9, 5, b"forged")),
        TimeoutNow(7, 1, 5),
    ):
        node.step(msg)
        assert sent(node) == [] and node.term == 0 and node.leader_id is None
    assert node.last_index == 0
    for msg in (  # nor can its answers move the term (a term near 2**63 once killed the quorum)
        VoteResponse(7, 1, 2**62, False),
        AppendResponse(7, 1, 2**62, False),
        HeartbeatResponse(7, 1, 2**62),
    ):
        node.step(msg)
        assert sent(node) == [] and node.term == 0


def test_vote_refused_to_a_candidate_with_a_less_complete_log() -> None:
    node = make(state=state(term=2, log_terms=(1, 2)))
    node.step(VoteRequest(2, 1, term=3, last_log_index=5, last_log_term=1))  # older last term
    assert sent(node) == [VoteResponse(1, 2, 3, False)]
    node.step(VoteRequest(3, 1, term=3, last_log_index=1, last_log_term=2))  # shorter log
    assert sent(node) == [VoteResponse(1, 3, 3, False)]
    assert node.voted_for is None


def test_votes_ignored_while_a_leader_is_live_check_quorum_lease() -> None:
    node = make(state=state(term=1))
    node.step(HeartbeatRequest(2, 1, term=1, commit=0))
    drain(node)
    for pre in (True, False):
        node.step(VoteRequest(3, 1, term=2, last_log_index=9, last_log_term=9, pre_vote=pre))
        assert sent(node) == [] and node.term == 1
    for _ in range(ELECTION):
        node.tick()
    drain(node)
    node.step(VoteRequest(3, 1, term=2, last_log_index=9, last_log_term=9, pre_vote=True))
    assert sent(node) == [VoteResponse(1, 3, 2, True, pre_vote=True)]
    assert node.term == 1  # a granted pre-vote changes nothing


def test_timeout_now_starts_a_real_election_that_voters_answer_despite_the_lease() -> None:
    node = make(node_id=2, state=state(term=1))
    node.step(TimeoutNow(1, 2, 1))
    assert node.role is Role.CANDIDATE and node.term == 2
    requests = [m for m in sent(node) if isinstance(m, VoteRequest)]
    assert {(m.dst, m.pre_vote, m.transfer) for m in requests} == {
        (1, False, True),
        (3, False, True),
    }

    voter = make(node_id=3, state=state(term=1))
    voter.step(HeartbeatRequest(1, 3, term=1, commit=0))  # in the lease of leader 1
    drain(voter)
    voter.step(requests[-1])
    assert sent(voter) == [VoteResponse(3, 2, 2, True)]


def test_transfer_leadership_needs_a_voting_target_and_pauses_proposals() -> None:
    node = make(observers=(4,))
    assert not node.transfer_leadership(2)  # not leader
    elect(node)
    assert not node.transfer_leadership(1) and not node.transfer_leadership(4)
    drain(node)
    node.step(AppendResponse(2, 1, node.term, True, match_index=1))
    drain(node)
    assert node.transfer_leadership(2)
    assert sent(node) == [TimeoutNow(1, 2, node.term)]  # already caught up
    assert node.propose(b"x") is None


def test_single_voter_elects_itself_and_commits_alone() -> None:
    node = make(voters=(1,))
    for _ in range(2 * ELECTION):
        node.tick()
    assert node.role is Role.LEADER and node.term == 1
    index = node.propose(b"x")
    (rd,) = drain(node)
    assert [e.index for e in rd.committed_entries] == [1, 2] and index == 2
    assert rd.entries[-1].data == b"x"


def test_follower_refuses_proposals() -> None:
    node = make()
    assert node.propose(b"x") is None
    assert node.propose_many([b"x"]) is None


def test_propose_many_sends_one_append_per_peer() -> None:
    node = make()
    elect(node)
    drain(node)
    for peer in (2, 3):
        node.step(AppendResponse(peer, 1, node.term, True, match_index=1))
    drain(node)
    assert node.propose_many([b"a", b"b", b"c"]) == range(2, 5)
    appends = [m for m in sent(node) if isinstance(m, AppendRequest)]
    assert sorted(m.dst for m in appends) == [2, 3]
    assert all([e.data for e in m.entries] == [b"a", b"b", b"c"] for m in appends)


def test_appends_stay_within_their_byte_budget_and_carry_a_big_entry_alone() -> None:
    """256 entries of a few MB each would pass the transport's frame limit: a follower
    would drop the connection and be sent the same message again, for ever."""
    node = make(max_bytes_per_message=100)
    elect(node)
    drain(node)
    for peer in (2, 3):
        node.step(AppendResponse(peer, 1, node.term, True, match_index=1))
    drain(node)
    node.propose_many([b"a" * 40, b"b" * 40, b"c" * 40, b"d" * 300, b"e"])
    first = [m for m in sent(node) if isinstance(m, AppendRequest) and m.dst == 2]
    assert [[e.data[:1] for e in m.entries] for m in first] == [[b"a", b"b"]]
    node.step(AppendResponse(2, 1, node.term, True, match_index=first[0].entries[-1].index))
    nxt = [m for m in sent(node) if isinstance(m, AppendRequest) and m.dst == 2]
    assert [[e.data[:1] for e in m.entries] for m in nxt] == [[b"c"]]
    node.step(AppendResponse(2, 1, node.term, True, match_index=nxt[0].entries[-1].index))
    big = [m for m in sent(node) if isinstance(m, AppendRequest) and m.dst == 2]
    assert [[e.data[:1] for e in m.entries] for m in big] == [[b"d"]]  # alone, whole


# -- log replication ---------------------------------------------------------------------------


def test_append_with_mismatching_prev_is_rejected_with_a_hint() -> None:
    node = make(state=state(term=3, log_terms=(1, 2, 2, 2)))
    node.step(AppendRequest(2, 1, 3, prev_index=9, prev_term=3, entries=(), commit=0))
    assert sent(node) == [AppendResponse(1, 2, 3, False, reject_index=9, hint_index=5)]
    node.step(AppendRequest(2, 1, 3, prev_index=4, prev_term=3, entries=(), commit=0))
    # Index 4 holds term 2 from index 2 on: the leader can skip that whole term.
    assert sent(node) == [AppendResponse(1, 2, 3, False, reject_index=4, hint_index=2)]


def test_append_truncates_a_conflicting_persisted_suffix() -> None:
    node = make(state=state(term=3, log_terms=(1, 2, 2)))
    new = tuple(entries(3, 3, start=2))
    node.step(AppendRequest(2, 1, 3, prev_index=1, prev_term=1, entries=new, commit=2))
    (rd,) = drain(node)
    assert rd.truncate_from == 2 and rd.entries == new
    assert rd.messages == (AppendResponse(1, 2, 3, True, match_index=3),)
    assert [e.index for e in rd.committed_entries] == [1, 2]


def test_duplicated_or_stale_append_never_truncates() -> None:
    node = make(state=state(term=1, log_terms=(1, 1, 1)))
    node.step(
        AppendRequest(2, 1, 1, prev_index=0, prev_term=0, entries=tuple(entries(1)), commit=0)
    )
    (rd,) = drain(node)
    assert rd.truncate_from is None and rd.entries == ()
    assert node.last_index == 3
    assert rd.messages == (AppendResponse(1, 2, 1, True, match_index=1),)


def test_commit_from_leader_only_covers_entries_it_vouched_for() -> None:
    # Our entries 2..3 (term 1) are unverified leftovers: commit 3 must not reach them.
    node = make(state=state(term=2, log_terms=(1, 1, 1)))
    node.step(AppendRequest(2, 1, 2, prev_index=1, prev_term=1, entries=(), commit=3))
    assert node.commit_index == 1
    assert sent(node)[-1] == AppendResponse(1, 2, 2, True, match_index=1)


def test_append_below_commit_is_acknowledged_at_commit() -> None:
    node = make(state=state(term=1, log_terms=(1, 1, 1), commit=3))
    node.step(AppendRequest(2, 1, 1, prev_index=1, prev_term=1, entries=(), commit=3))
    assert sent(node)[-1] == AppendResponse(1, 2, 1, True, match_index=3)


def test_leader_counts_replicas_only_for_entries_of_its_own_term() -> None:
    # Raft paper, figure 8: an entry from an old term is not committed by being on a majority.
    node = make(state=state(term=2, log_terms=(1, 2)))
    elect(node)
    assert node.term == 3 and node.last_index == 3  # index 3 is the new leader's no-op
    drain(node)
    node.step(AppendResponse(2, 1, 3, True, match_index=2))
    assert node.commit_index == 0
    node.step(AppendResponse(2, 1, 3, True, match_index=3))
    assert node.commit_index == 3  # the no-op commits, and with it the old entries


def test_commit_needs_a_majority_of_voters_not_observers() -> None:
    node = make(voters=(1, 2, 3), observers=(4, 5))
    elect(node)
    drain(node)
    node.step(AppendResponse(4, 1, node.term, True, match_index=1))
    node.step(AppendResponse(5, 1, node.term, True, match_index=1))
    assert node.commit_index == 0
    node.step(AppendResponse(2, 1, node.term, True, match_index=1))
    assert node.commit_index == 1


def test_rejection_moves_next_back_and_resends() -> None:
    node = make(state=state(term=2, log_terms=(1, 1, 2)))
    elect(node)
    drain(node)
    node.step(AppendResponse(2, 1, node.term, False, reject_index=3, hint_index=2))
    (probe,) = [m for m in sent(node) if m.dst == 2]
    assert isinstance(probe, AppendRequest) and probe.prev_index == 1
    assert [e.index for e in probe.entries] == [2, 3, 4]


def test_leader_shrugs_off_impossible_responses() -> None:
    node = make()
    elect(node)
    drain(node)
    node.step(AppendResponse(2, 1, node.term, True, match_index=99))
    node.step(AppendResponse(3, 1, node.term, False, reject_index=0, hint_index=99))
    assert node.commit_index == 0 and node.progress(2).match == 0
    assert node.progress(3).next <= node.last_index + 1
    node.step(AppendResponse(2, 1, node.term, True, match_index=1))
    assert node.commit_index == 1


def test_heartbeat_commit_is_capped_by_what_the_follower_matched() -> None:
    node = make()
    elect(node)
    node.propose(b"x")
    drain(node)
    node.step(AppendResponse(2, 1, node.term, True, match_index=2))
    assert node.commit_index == 2
    drain(node)
    node.tick()
    beats = {m.dst: m.commit for m in sent(node) if isinstance(m, HeartbeatRequest)}
    assert beats == {2: 2, 3: 0}


def test_follower_learns_commit_from_heartbeat() -> None:
    node = make(state=state(term=1, log_terms=(1, 1)))
    node.step(HeartbeatRequest(2, 1, 1, commit=5))
    (rd,) = drain(node)
    assert node.commit_index == 2 and [e.index for e in rd.committed_entries] == [1, 2]
    assert rd.hard_state == HardState(1, None, 2) and not rd.must_sync  # commit alone: lazy
    assert rd.messages == (HeartbeatResponse(1, 2, 1),)


# -- terms, check-quorum, stale leaders --------------------------------------------------------


def test_leader_without_a_live_majority_steps_down() -> None:
    node = make(voters=(1, 2, 3, 4, 5))
    elect(node)
    for _ in range(ELECTION):
        node.tick()
        node.step(HeartbeatResponse(2, 1, node.term))  # only one peer answers: 2 of 5
    assert node.role is Role.FOLLOWER and node.leader_id is None


def test_leader_with_a_live_majority_keeps_leading() -> None:
    node = make(voters=(1, 2, 3))
    elect(node)
    for _ in range(5 * ELECTION):
        node.tick()
        node.step(HeartbeatResponse(2, 1, node.term))
    assert node.role is Role.LEADER


def test_stale_leader_is_told_the_new_term_and_steps_down() -> None:
    follower = make(node_id=2, state=state(term=5))
    follower.step(AppendRequest(1, 2, 3, prev_index=0, prev_term=0, entries=(), commit=0))
    (reply,) = sent(follower)
    assert reply == AppendResponse(2, 1, 5, False)
    leader = make()
    elect(leader)
    leader.step(reply)
    assert leader.role is Role.FOLLOWER and leader.term == 5


def test_leader_message_with_higher_term_makes_us_follow_it() -> None:
    node = make()
    elect(node)
    node.step(HeartbeatRequest(3, 1, node.term + 1, commit=0))
    assert node.role is Role.FOLLOWER and node.leader_id == 3 and node.term == 2


# -- snapshots ---------------------------------------------------------------------------------


def test_snapshot_is_requested_after_threshold_and_compaction_drops_entries() -> None:
    node = make(voters=(1,), snapshot_threshold=3)
    elect(node)
    for i in range(3):
        node.propose(b"%d" % i)
    readies = drain(node)
    (at,) = [rd.take_snapshot_at for rd in readies if rd.take_snapshot_at]
    assert at == 4
    with pytest.raises(ValueError):
        node.compact(at + 1, b"image")  # not applied yet
    node.compact(at, b"image")
    assert node.log.snapshot == Snapshot(4, 1, b"image") and node.log.first_index == 5


def test_snapshot_is_requested_once_applied_bytes_pass_the_limit_or_the_last_snapshot() -> None:
    """Few but large entries (a topic of 10,000 partitions is one) still get snapshotted,
    and never more often than the snapshot's own size of new entries."""
    node = make(voters=(1,), snapshot_threshold=None, snapshot_bytes=100)
    elect(node)
    node.propose(b"x" * 60)
    assert not [rd for rd in drain(node) if rd.take_snapshot_at]
    node.propose(b"x" * 60)  # 120 bytes applied since: past the limit
    (at,) = [rd.take_snapshot_at for rd in drain(node) if rd.take_snapshot_at]
    node.compact(at, b"i" * 300)  # a snapshot bigger than the limit raises the bar
    node.propose(b"x" * 200)
    assert not [rd for rd in drain(node) if rd.take_snapshot_at]
    node.propose(b"x" * 200)
    assert [rd.take_snapshot_at for rd in drain(node) if rd.take_snapshot_at] == [at + 2]


def test_lagging_follower_gets_the_snapshot_and_installs_it() -> None:
    leader = make(voters=(1, 2), snapshot_threshold=None)
    leader.campaign()
    leader.step(VoteResponse(2, 1, 1, True, pre_vote=True))
    leader.step(VoteResponse(2, 1, 1, True))
    leader.propose(b"a")
    drain(leader)
    leader.step(AppendResponse(2, 1, 1, True, match_index=0))  # nothing matched yet
    drain(leader)
    leader.step(AppendResponse(2, 1, 1, False, reject_index=0, hint_index=1))
    drain(leader)
    leader.log.commit_to(2)  # pretend it committed; then the state machine snapshots
    drain(leader)
    leader.compact(2, b"image")
    leader.step(AppendResponse(2, 1, 1, False, reject_index=0, hint_index=1))
    (request,) = [m for m in sent(leader) if isinstance(m, SnapshotRequest)]
    assert request.snapshot == Snapshot(2, 1, b"image")

    follower = make(node_id=2, voters=(1, 2))
    follower.step(request)
    (rd,) = drain(follower)
    assert rd.snapshot == request.snapshot and rd.committed_entries == ()
    assert rd.messages == (AppendResponse(2, 1, 1, True, match_index=2),)
    assert follower.commit_index == 2 and follower.last_index == 2

    leader.step(rd.messages[0])
    assert leader.progress(2).match == 2


def test_lost_snapshot_is_resent_after_an_election_timeout() -> None:
    leader = make(snapshot_threshold=None)
    elect(leader)
    leader.propose(b"a")
    leader.step(AppendResponse(2, 1, leader.term, True, match_index=2))
    drain(leader)
    leader.compact(2, b"image")
    leader.step(HeartbeatResponse(3, 1, leader.term))  # node 3 never acknowledged anything
    assert [m.dst for m in sent(leader) if isinstance(m, SnapshotRequest)] == [3]
    resent = []
    for _ in range(ELECTION):
        leader.tick()
        for peer in (2, 3):
            leader.step(HeartbeatResponse(peer, 1, leader.term))
        resent += [m for m in sent(leader) if isinstance(m, SnapshotRequest)]
    assert leader.role is Role.LEADER and [m.dst for m in resent] == [3]


def test_snapshot_covering_entries_we_hold_just_commits_them() -> None:
    node = make(state=state(term=1, log_terms=(1, 1, 1)))
    node.step(SnapshotRequest(2, 1, 1, Snapshot(2, 1, b"img")))
    (rd,) = drain(node)
    assert rd.snapshot is None and [e.index for e in rd.committed_entries] == [1, 2]
    assert node.last_index == 3


# -- restarts, observers, the Ready contract ---------------------------------------------------


def test_restart_replays_committed_entries_after_the_snapshot() -> None:
    persisted = PersistentState(
        HardState(term=2, voted_for=1, commit=4),
        snapshot=Snapshot(2, 1, b"img"),
        entries=entries(1, 2, 2, start=3),
    )
    node = make(state=persisted)
    (rd,) = drain(node)
    assert [e.index for e in rd.committed_entries] == [3, 4]
    assert rd.hard_state is None and rd.entries == ()
    assert (node.term, node.voted_for, node.role) == (2, 1, Role.FOLLOWER)


def test_persisted_commit_beyond_the_log_is_clamped() -> None:
    node = make(state=state(term=1, log_terms=(1,), commit=9))
    assert node.commit_index == 1


def test_observer_never_campaigns_nor_votes_but_follows() -> None:
    node = make(node_id=4, voters=(1, 2, 3))
    assert node.role is Role.OBSERVER
    for _ in range(5 * ELECTION):
        node.tick()
    assert node.role is Role.OBSERVER and sent(node) == []
    node.step(VoteRequest(1, 4, 1, 0, 0))
    assert sent(node) == []
    node.step(AppendRequest(1, 4, 1, 0, 0, tuple(entries(1)), commit=1))
    (rd,) = drain(node)
    assert rd.messages == (AppendResponse(4, 1, 1, True, match_index=1),)
    assert [e.index for e in rd.committed_entries] == [1]


def test_leader_replicates_to_an_observer_added_later() -> None:
    node = make()
    elect(node)
    drain(node)
    node.add_observer(7)
    (append,) = sent(node)
    assert isinstance(append, AppendRequest) and append.dst == 7


def test_next_ready_waits_for_advance() -> None:
    node = make(voters=(1,))
    elect(node)
    rd = node.ready()
    assert rd is not None
    node.propose(b"x")
    assert node.ready() is None and not node.has_ready()
    with pytest.raises(ValueError):
        node.advance(replace(rd))  # an equal copy is not the outstanding Ready
    node.advance(rd)
    assert node.ready() is not None


@pytest.mark.parametrize(
    "msg",
    [
        AppendRequest(2, 9, 5, 0, 0, (), 0),  # wrong destination
        AppendRequest(1, 1, 5, 0, 0, (), 0),  # from ourselves
        AppendRequest(2, 1, 5, 0, 0, (Entry(3, 1),), 0),  # gap
        AppendRequest(2, 1, 5, 0, 0, (Entry(1, 2), Entry(2, 1)), 0),  # terms go backwards
        AppendRequest(2, 1, 5, 0, 0, (Entry(1, 6),), 0),  # entry from the future
        SnapshotRequest(2, 1, 5, Snapshot(3, 9)),
    ],
)
def test_malformed_messages_raise_and_change_nothing(msg: Message) -> None:
    node = make()
    with pytest.raises(ValueError):
        node.step(msg)
    assert node.term == 0 and node.leader_id is None and not node.has_ready()


def test_constructor_validates_its_arguments() -> None:
    with pytest.raises(ValueError):
        RaftNode(1, ())
    with pytest.raises(ValueError):
        RaftNode(1, (1,), election_ticks=2, heartbeat_ticks=2)
    with pytest.raises(ValueError):
        RaftNode(1, (1,), PersistentState(entries=[Entry(2, 1)]))
