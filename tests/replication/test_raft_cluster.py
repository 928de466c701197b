"""Scripted scenarios on the simulated cluster; invariants are checked after every step."""

from __future__ import annotations

import random

import pytest

from logmq.replication import AppendRequest, AppendResponse, Role
from tests.replication.sim import Cluster

E = 10  # election ticks


def run(cluster: Cluster, ticks: int) -> None:
    for _ in range(ticks):
        cluster.tick_all()
        cluster.deliver_all()
        cluster.check_invariants()


def win_election(cluster: Cluster, node_id: int) -> None:
    """Campaign until elected, delivering only election traffic (a rejection may first
    have to teach the candidate the current term)."""
    for _attempt in range(3):
        cluster.campaign(node_id)
        while cluster.deliver_where(lambda m: not isinstance(m, AppendRequest)):
            cluster.check_invariants()
        if cluster.raft(node_id).role is Role.LEADER:
            return
    raise AssertionError(f"node {node_id} could not win an election")


@pytest.mark.parametrize("size", [1, 3, 5])
@pytest.mark.parametrize("seed", range(5))
def test_cold_start_elects_a_leader_and_commits_within_bounded_ticks(size: int, seed: int) -> None:
    cluster = Cluster(size, seed=seed, election_ticks=E)
    assert cluster.settle(max_ticks=10 * E) <= 10 * E
    assert cluster.commit_everywhere(b"x", max_ticks=E) <= E


def test_old_term_entry_on_a_majority_is_not_committed_by_counting() -> None:
    """The Raft paper's figure 8, scripted; the no-op commit rule keeps it safe."""
    cluster = Cluster(5, election_ticks=E, check_quorum=False, max_entries_per_message=1)
    cluster.campaign(1)
    cluster.deliver_all()
    assert cluster.raft(1).role is Role.LEADER
    # (a) leader 1 (term 1) gets entry "a" to node 2 only.
    cluster.isolate({1, 2})
    cluster.propose(b"a")
    cluster.deliver_all()
    cluster.crash(1)
    cluster.restart(1)
    cluster.heal()
    # (b) node 5 wins term 2 with votes from 3 and 4; its no-op reaches nobody; it crashes.
    cluster.isolate({1, 2})
    win_election(cluster, 5)
    assert cluster.raft(5).term == 2
    cluster.drop_where(lambda m: m.src == 5)
    cluster.crash(5)
    cluster.heal()
    # (c) node 1 wins term 3 and copies "a" (term 1) to node 3: it is on a majority now.
    win_election(cluster, 1)
    assert cluster.raft(1).term == 3
    while (progress := cluster.raft(1).progress(3)).match < 2:
        assert cluster.deliver_where(lambda m: {m.src, m.dst} <= {1, 2, 3})
        cluster.check_invariants()
    assert progress.match == 2 and cluster.raft(2).last_index == 3
    assert cluster.raft(1).commit_index == 1  # "a" is on 3 of 5 nodes yet not committed
    # (d) node 1 crashes; node 5 returns and wins with votes from 3 and 4, erasing "a".
    cluster.drop_where(lambda m: m.src == 1)
    cluster.crash(1)
    cluster.restart(5)
    cluster.isolate({2})
    win_election(cluster, 5)
    cluster.deliver_all()
    cluster.check_invariants()
    assert cluster.raft(3).log.term_at(2) == 2  # node 3's copy of "a" was overwritten
    cluster.settle()
    assert cluster.commit_everywhere(b"after") >= 0
    assert b"a" not in cluster.applied_values


@pytest.mark.parametrize("minority", [{1}, {1, 2}])
def test_partitioned_leader_steps_down_and_never_commits(minority: set[int]) -> None:
    cluster = Cluster(5, seed=3, election_ticks=E)
    cluster.settle()
    old = cluster.leader()
    assert old is not None
    # Make the old leader part of the minority, whoever it is.
    group = {old.node_id} | {n for n in minority if n != 1}
    cluster.isolate(group)
    old.propose(b"lost")
    cluster.flush(old.node_id)
    stepped_down_after = successor_after = None
    for tick in range(4 * E):
        run(cluster, 1)
        if stepped_down_after is None and old.role is not Role.LEADER:
            stepped_down_after = tick + 1
        if successor_after is None and any(r.term > old.term for r in cluster.leaders()):
            successor_after = tick + 1
    assert stepped_down_after is not None and stepped_down_after <= E + 1
    # Never two leaders at once, even of different terms: the old one gave up first.
    assert successor_after is not None and stepped_down_after <= successor_after
    new = cluster.leader()
    assert new is not None and new.node_id not in group and new.term > old.term
    new.propose(b"kept")
    run(cluster, 2)
    assert cluster.applied_values == [b"kept"]  # the majority side commits meanwhile
    cluster.heal()
    cluster.commit_everywhere(b"healed")
    assert cluster.applied_values == [b"kept", b"healed"]  # "lost" was truncated away
    assert all(n.sm.values == cluster.applied_values for n in cluster.nodes.values())


@pytest.mark.parametrize("pre_vote", [True, False])
def test_rejoining_partitioned_follower_disrupts_only_without_pre_vote(pre_vote: bool) -> None:
    cluster = Cluster(3, seed=1, election_ticks=E, pre_vote=pre_vote, check_quorum=pre_vote)
    cluster.settle()
    leader = cluster.leader()
    assert leader is not None
    term, follower = leader.term, next(r for r in cluster.live() if r is not leader)
    cluster.isolate({follower.node_id})
    run(cluster, 10 * E)
    cluster.heal()
    run(cluster, 3 * E)
    if pre_vote:
        assert follower.term == term and leader.role is Role.LEADER and leader.term == term
    else:
        assert leader.term > term  # the rejoining node's inflated term deposed the leader
    cluster.commit_everywhere(b"x")


def test_whole_cluster_restart_keeps_every_committed_entry() -> None:
    cluster = Cluster(3, seed=2, election_ticks=E, snapshot_threshold=4)
    cluster.settle()
    for i in range(10):
        cluster.commit_everywhere(b"v%d" % i)
    before = list(cluster.applied_values)
    for node_id in cluster.nodes:
        cluster.crash(node_id)
    for node_id in cluster.nodes:
        cluster.restart(node_id)
    # Replayed from snapshot + log before any leader exists.
    assert all(node.sm.values == before for node in cluster.nodes.values())
    cluster.settle()
    cluster.commit_everywhere(b"more")
    assert cluster.applied_values == [*before, b"more"]


def test_lagging_follower_catches_up_through_a_snapshot() -> None:
    cluster = Cluster(3, seed=4, election_ticks=E, snapshot_threshold=5)
    cluster.settle()
    leader = cluster.leader()
    assert leader is not None
    laggard = next(n for n in cluster.nodes if n != leader.node_id)
    cluster.crash(laggard)
    for i in range(20):
        cluster.propose(b"v%d" % i)
        cluster.deliver_all()
    assert leader.log.snapshot.index >= 15
    cluster.restart(laggard)
    cluster.commit_everywhere(b"last")
    assert cluster.delivered["SnapshotRequest"] >= 1
    assert cluster.nodes[laggard].sm.values == cluster.applied_values


def test_lossy_duplicating_reordering_network_still_commits() -> None:
    cluster = Cluster(5, seed=5, election_ticks=E, max_inflight=4, max_entries_per_message=4)
    rng = random.Random(5)
    committed_goal = [b"v%d" % i for i in range(30)]
    proposed = 0
    for _ in range(4000):
        if proposed < len(committed_goal) and rng.random() < 0.05 and cluster.leader():
            cluster.propose(committed_goal[proposed])
            proposed += 1
        roll = rng.random()
        if roll < 0.25:
            cluster.tick_all()
        elif roll < 0.35:
            cluster.drop(rng.randrange(1000))
        elif roll < 0.40:
            cluster.deliver(rng.randrange(1000), keep=True)
        else:
            cluster.deliver(rng.randrange(1000))
        cluster.check_invariants()
    cluster.settle()
    cluster.commit_everywhere(b"end")
    assert cluster.applied_values[-1] == b"end"
    assert len(cluster.applied_values) == len(set(cluster.applied_values))


def test_observers_follow_but_never_count_or_lead() -> None:
    cluster = Cluster(3, [4, 5], seed=6, election_ticks=E)
    cluster.settle()
    cluster.commit_everywhere(b"a")
    assert cluster.nodes[4].sm.values == [b"a"] == cluster.nodes[5].sm.values
    # Two voters down: observers alone can't make a quorum.
    leader = cluster.leader()
    assert leader is not None
    for node_id in [n for n in (1, 2, 3) if n != leader.node_id]:
        cluster.crash(node_id)
    leader.propose(b"b")
    run(cluster, 5 * E)
    assert b"b" not in cluster.applied_values
    assert all(cluster.raft(o).role is Role.OBSERVER for o in (4, 5))
    # Observers down instead: the voters still commit.
    cluster.crash(4)
    cluster.crash(5)
    for node_id in (1, 2, 3):
        cluster.restart(node_id)
    run(cluster, 5 * E)
    leader = cluster.leader()
    assert leader is not None and leader.node_id in (1, 2, 3)
    leader.propose(b"c")
    cluster.flush(leader.node_id)
    run(cluster, 2)
    assert b"c" in cluster.applied_values


def test_single_node_quorum_survives_restarts() -> None:
    cluster = Cluster(1, election_ticks=E)
    for round_ in range(3):
        cluster.settle()
        cluster.commit_everywhere(b"r%d" % round_)
        cluster.crash(1)
        cluster.restart(1)
        assert cluster.nodes[1].sm.values == [b"r%d" % i for i in range(round_ + 1)]
    assert cluster.raft(1).term >= 3


def test_a_stale_leaders_responses_do_not_confuse_the_new_one() -> None:
    cluster = Cluster(3, seed=8, election_ticks=E)
    cluster.settle()
    # Duplicate every in-flight append response a few times while committing.
    for i in range(5):
        cluster.propose(b"d%d" % i)
        for _ in range(3):
            for pos, msg in enumerate(list(cluster.network)):
                if isinstance(msg, AppendResponse):
                    cluster.deliver(pos, keep=True)
        cluster.deliver_all()
        cluster.check_invariants()
    cluster.commit_everywhere(b"end")
    assert cluster.applied_values == [b"d0", b"d1", b"d2", b"d3", b"d4", b"end"]


def test_leadership_transfer_hands_over_without_losing_anything() -> None:
    cluster = Cluster(3, seed=9, election_ticks=E)
    cluster.settle()
    old = cluster.leader()
    assert old is not None
    target = next(n for n in cluster.nodes if n != old.node_id)
    laggard = next(n for n in cluster.nodes if n not in (old.node_id, target))
    cluster.crash(target)
    for i in range(5):
        cluster.propose(b"v%d" % i)
        cluster.deliver_all()
    cluster.restart(target)  # behind: the leader must catch it up before handing over
    assert old.transfer_leadership(target)
    assert old.propose(b"refused") is None
    cluster.flush(old.node_id)
    term = old.term
    new = cluster.raft(target)
    for _ in range(E):  # a heartbeat round or two to catch up, then one election
        run(cluster, 1)
        if new.role is Role.LEADER:
            break
    assert new.role is Role.LEADER and new.term == term + 1 and old.role is Role.FOLLOWER
    cluster.commit_everywhere(b"after")
    assert cluster.applied_values == [b"v0", b"v1", b"v2", b"v3", b"v4", b"after"]
    assert cluster.raft(laggard).leader_id == target


def test_leadership_transfer_to_a_dead_node_is_given_up() -> None:
    cluster = Cluster(3, seed=10, election_ticks=E)
    cluster.settle()
    leader = cluster.leader()
    assert leader is not None
    target = next(n for n in cluster.nodes if n != leader.node_id)
    cluster.crash(target)
    assert leader.transfer_leadership(target)
    assert leader.propose(b"x") is None
    run(cluster, E)
    assert leader.role is Role.LEADER
    assert leader.propose(b"x") is not None
