"""Controller rules, one scenario each: registration, fencing, placement, elections, ISR."""

from __future__ import annotations

from collections import Counter

from logmq.cluster.controller import Controller
from logmq.cluster.controller_api import AlterPartitionRequest, ControllerConfig, NewTopic
from logmq.cluster.metadata_image import EMPTY_IMAGE
from logmq.cluster.metadata_records import NO_LEADER, ClusterIdRecord
from logmq.cluster.replica_placement import place_replicas
from logmq.errors import ErrorCode
from tests.cluster.helpers import CONFIG, Recorder


def alter(r: Recorder, broker: int, topic: str, isr, *, leader_epoch=None, partition_epoch=None):
    part = r.image.partition(topic, 0)
    return r.run(
        r.controller.alter_partition(
            AlterPartitionRequest(
                broker,
                r.epochs[broker],
                topic,
                0,
                part.leader_epoch if leader_epoch is None else leader_epoch,
                part.partition_epoch if partition_epoch is None else partition_epoch,
                tuple(isr),
            )
        )
    )


def test_cluster_id_is_chosen_once():
    c = Controller(EMPTY_IMAGE, 0, CONFIG, new_id=lambda: "generated")
    first = c.bootstrap()
    assert first.response == "generated" and first.records == [ClusterIdRecord("generated")]
    again = c.bootstrap("other")
    assert again.response == "generated" and again.records == []
    # A new controller over the committed image keeps it too.
    assert Controller(c.image, 0, CONFIG).bootstrap("x").response == "generated"


def test_registration_fencing_and_unfencing():
    r = Recorder(brokers=0)
    resp = r.run(r.controller.register_broker(1, "a", "h", 1, now_ms=0))
    assert resp.error is ErrorCode.NONE and resp.broker_epoch == 1
    assert r.image.brokers[1].fenced  # until it has caught up
    assert r.run(r.controller.heartbeat(1, 1, 10)).fenced
    assert not r.run(r.controller.heartbeat(1, 1, 20, caught_up=True)).fenced
    assert r.image.is_active(1)
    # Retried registration of the same incarnation: same epoch, nothing logged.
    before = len(r.log)
    assert r.run(r.controller.register_broker(1, "a", "h", 1, now_ms=30)).broker_epoch == 1
    assert len(r.log) == before
    assert r.image.is_active(1)
    stale = r.run(r.controller.heartbeat(1, 0, 40))
    assert stale.error is ErrorCode.STALE_BROKER_EPOCH
    unknown = r.run(r.controller.heartbeat(9, 1, 40))
    assert unknown.error is ErrorCode.BROKER_ID_NOT_REGISTERED
    wrong = r.run(r.controller.register_broker(2, "b", "h", 2, now_ms=0, cluster_id="nope"))
    assert wrong.error is ErrorCode.INCONSISTENT_CLUSTER_ID and "cluster-1" in wrong.message


def test_placement_spreads_leaders_and_followers():
    assignment = place_replicas([1, 2, 3, 4], 8, 3, start=0)
    assert [a[0] for a in assignment] == [1, 2, 3, 4, 1, 2, 3, 4]
    assert all(len(set(a)) == 3 for a in assignment)
    # Followers shift when partitions wrap, so pairs differ between rounds.
    assert assignment[0] != assignment[4]
    load = Counter(b for a in assignment for b in a)
    assert max(load.values()) - min(load.values()) <= 1
    assert place_replicas([7], 3, 1, start=0) == [(7,), (7,), (7,)]


def test_create_topic_assigns_leaders_round_robin_with_full_isr():
    r = Recorder(brokers=3)
    result = r.create("orders", partitions=6, rf=3)
    assert result.error is ErrorCode.NONE and result.topic_id
    parts = [r.image.partition("orders", p) for p in range(6)]
    assert Counter(p.leader for p in parts) == {1: 2, 2: 2, 3: 2}
    for p in parts:
        assert p.isr == p.replicas and p.leader == p.replicas[0]
        assert (p.leader_epoch, p.partition_epoch) == (0, 0)
    # The next topic starts where the previous one stopped.
    r.create("more", partitions=1, rf=1)
    assert r.image.partition("more", 0).leader == parts[0].leader
    assert r.replayed().topics == r.image.topics


def test_create_topic_errors():
    r = Recorder(brokers=2)
    c = r.controller
    too_many = r.create("a", partitions=1, rf=3)
    assert too_many.error is ErrorCode.INVALID_REPLICATION_FACTOR
    assert "3" in too_many.message and "2 available" in too_many.message
    assert r.create("b", partitions=0, rf=1).error is ErrorCode.INVALID_PARTITIONS
    assert r.create("bad name!", partitions=1, rf=1).error is ErrorCode.INVALID_TOPIC_EXCEPTION
    bad = r.create("c", partitions=1, rf=1, retention_ms="soon")
    assert bad.error is ErrorCode.INVALID_CONFIG
    assert r.create("d", partitions=1, rf=1).error is ErrorCode.NONE
    assert r.create("d", partitions=1, rf=1).error is ErrorCode.TOPIC_ALREADY_EXISTS
    dup = r.run(c.create_topics([NewTopic("e", 1, 1), NewTopic("e", 1, 1)]))
    assert dup["e"].error is ErrorCode.INVALID_REQUEST
    dry = c.create_topics([NewTopic("f", 2, 2)], validate_only=True)
    assert dry.records == [] and dry.response["f"].error is ErrorCode.NONE
    assert "f" not in r.image.topics
    # A fenced broker does not count as available.
    r.run(c.heartbeat(2, r.epochs[2], 0, want_fence=True))
    assert r.create("g", partitions=1, rf=2).error is ErrorCode.INVALID_REPLICATION_FACTOR


def test_manual_assignments_are_checked():
    r = Recorder(brokers=3)
    c = r.controller
    ok = r.run(c.create_topics([NewTopic("m", assignments={0: [3, 1], 1: [2, 3]})]))["m"]
    assert ok.error is ErrorCode.NONE
    assert r.image.partition("m", 0).replicas == (3, 1) and r.image.partition("m", 0).leader == 3
    cases = {
        "gap": {0: [1], 2: [2]},
        "dup": {0: [1, 1]},
        "unknown": {0: [1, 9]},
        "uneven": {0: [1, 2], 1: [3]},
    }
    for name, assignment in cases.items():
        res = r.run(c.create_topics([NewTopic(name, assignments=assignment)]))[name]
        assert res.error is ErrorCode.INVALID_REPLICA_ASSIGNMENT, name


def test_manual_assignments_follow_kafkas_rules_on_counts_and_fenced_brokers():
    r = Recorder(brokers=3)
    c = r.controller
    for counts in ((2, -1), (-1, 1)):
        spec = NewTopic("n", *counts, assignments={0: [1]})
        assert r.run(c.create_topics([spec]))["n"].error is ErrorCode.INVALID_REQUEST
    r.run(c.heartbeat(2, r.epochs[2], 0, want_fence=True))
    fenced = r.run(c.create_topics([NewTopic("f", assignments={0: [2]})]))["f"]
    assert fenced.error is ErrorCode.INVALID_REPLICA_ASSIGNMENT and "fenced" in fenced.message
    # a fenced replica is kept but starts outside the ISR; the first active one leads
    ok = r.run(c.create_topics([NewTopic("m", assignments={0: [2, 3], 1: [1, 2]})]))["m"]
    assert ok.error is ErrorCode.NONE
    p0, p1 = r.image.partition("m", 0), r.image.partition("m", 1)
    assert (p0.replicas, p0.isr, p0.leader) == ((2, 3), (3,), 3)
    assert (p1.replicas, p1.isr, p1.leader) == ((1, 2), (1,), 1)
    dry = c.create_topics([NewTopic("d", assignments={0: [1]})], validate_only=True)
    assert dry.records == [] and dry.response["d"].error is ErrorCode.NONE


def test_create_partitions_places_new_partitions_on_the_lists_given():
    r = Recorder(brokers=3)
    c = r.controller
    r.create("t", partitions=1, rf=2)
    r.run(c.heartbeat(3, r.epochs[3], 0, want_fence=True))
    ok = r.run(c.create_partitions("t", 3, assignments=[[2, 1], [3, 2]]))
    assert ok.error is ErrorCode.NONE
    p1, p2 = r.image.partition("t", 1), r.image.partition("t", 2)
    assert (p1.replicas, p1.isr, p1.leader) == ((2, 1), (2, 1), 2)
    # as for a new topic: a fenced replica is kept but starts outside the ISR
    assert (p2.replicas, p2.isr, p2.leader) == ((3, 2), (2,), 2)


def test_create_partitions_assignments_are_checked_as_kafka_does():
    r = Recorder(brokers=3)
    c = r.controller
    r.create("t", partitions=2, rf=2)
    r.run(c.heartbeat(3, r.epochs[3], 0, want_fence=True))
    cases = {
        "count": (5, [[1, 2]], "1 replica list(s) given, but growing topic 't' from 2 to 5"),
        "none": (3, [], "0 replica list(s) given"),
        "factor": (3, [[1, 2, 3]], "3 replica(s) where the topic's replication factor is 2"),
        "twice": (3, [[1, 1]], "new partition 2 has broker 1 more than once"),
        "unknown": (4, [[1, 2], [2, 7]], "new partition 3 has broker 7, which is not registered"),
        "empty": (3, [[]], "new partition 2 has an empty replica list"),
        "fenced": (3, [[3]], "replica(s) where"),  # the factor is checked first
    }
    for name, (count, lists, message) in cases.items():
        for dry in (False, True):  # validate_only checks the same and changes nothing
            res = c.create_partitions("t", count, assignments=lists, validate_only=dry)
            assert res.records == [], name
            assert res.response.error is ErrorCode.INVALID_REPLICA_ASSIGNMENT, name
            assert message in res.response.message, (name, res.response.message)
    r.create("one", partitions=1, rf=1)
    only_fenced = c.create_partitions("one", 2, assignments=[[3]]).response
    assert only_fenced.error is ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert "only fenced brokers [3]" in only_fenced.message
    # the count is checked before the lists, as in Kafka
    same = c.create_partitions("t", 2, assignments=[[1, 2]]).response
    assert same.error is ErrorCode.INVALID_PARTITIONS
    missing = c.create_partitions("nope", 2, assignments=[[1]]).response
    assert missing.error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    dry = c.create_partitions("t", 3, assignments=[[2, 1]], validate_only=True)
    assert dry.records == [] and dry.response.error is ErrorCode.NONE
    assert len(r.image.topics["t"].partitions) == 2


def test_session_timeout_fences_and_moves_leadership_within_the_isr():
    r = Recorder(brokers=3)
    r.create("t", partitions=1, rf=3)
    part = r.image.partition("t", 0)
    leader = part.leader
    for now in (500, 900):
        for b in (1, 2, 3):
            if b != leader:
                r.heartbeat(b, now)
    r.run(r.controller.tick(1_000))
    assert r.image.is_active(leader)  # exactly the timeout: still alive
    r.run(r.controller.tick(1_001))
    assert not r.image.is_active(leader)
    after = r.image.partition("t", 0)
    assert after.leader not in (leader, NO_LEADER) and after.leader in part.isr
    assert leader not in after.isr
    assert after.leader_epoch == part.leader_epoch + 1
    assert after.partition_epoch == part.partition_epoch + 1


def test_a_stalled_controller_extends_sessions_by_its_stall():
    r = Recorder(brokers=2)
    r.create("t", partitions=1, rf=2)
    for b in (1, 2):
        r.heartbeat(b, 500)
    r.controller.paused(3_000)  # nothing ran from 600 to 3,600: no heartbeat was read
    assert not r.controller.tick(3_600).records
    assert not r.controller.tick(4_500).records  # 500 + the session + the stall
    r.heartbeat(1, 4_500)
    r.run(r.controller.tick(4_501))
    assert r.image.is_active(1) and not r.image.is_active(2)  # 2 is silent past it


def test_a_new_controller_dates_the_old_ones_session_from_its_raft_silence():
    r = Recorder(brokers=3)
    r.create("t", partitions=1, rf=3)
    leader = r.image.partition("t", 0).leader
    # a new controller at t=5000 that last heard from ``leader`` over Raft at t=4200
    c = Controller(r.image, 5_000, CONFIG, new_id=lambda: "x")
    c.last_heard(leader, 4_200)
    assert not c.tick(5_200).records  # silent for exactly the session: still alive
    fenced = c.tick(5_201).records
    assert fenced and not c.image.is_active(leader)
    assert all(c.image.is_active(b) for b in (1, 2, 3) if b != leader)  # a full session
    assert c.image.partition("t", 0).leader not in (leader, NO_LEADER)
    c.heartbeat(leader, r.epochs[leader], 5_300, caught_up=True)
    assert c.image.is_active(leader)  # a live broker fenced early is back at once


def test_last_isr_member_stays_and_gets_the_partition_back():
    r = Recorder(brokers=2)
    r.create("t", partitions=1, rf=2)
    part = r.image.partition("t", 0)
    leader, follower = part.leader, next(b for b in part.replicas if b != part.leader)
    alter(r, leader, "t", [leader])  # the follower fell behind
    r.run(r.controller.heartbeat(leader, r.epochs[leader], 10, want_fence=True))
    offline = r.image.partition("t", 0)
    assert offline.leader == NO_LEADER and offline.isr == (leader,)  # KIP-841
    assert r.image.is_active(follower)  # but it may not lead: it is not in the ISR
    r.start_broker(leader, 20)  # a new incarnation that catches up
    back = r.image.partition("t", 0)
    assert back.leader == leader and back.leader_epoch > offline.leader_epoch


def test_unclean_election_only_when_the_topic_allows_it():
    for unclean in ("false", "true"):
        r = Recorder(brokers=2)
        r.create("t", partitions=1, rf=2, unclean_leader_election_enable=unclean)
        part = r.image.partition("t", 0)
        leader = part.leader
        other = next(b for b in part.replicas if b != leader)
        alter(r, leader, "t", [leader])
        r.run(r.controller.heartbeat(leader, r.epochs[leader], 10, want_fence=True))
        now = r.image.partition("t", 0)
        if unclean == "true":
            assert now.leader == other and now.isr == (other,)
        else:
            assert now.leader == NO_LEADER
            # Switching it on later revives the partition at once.
            r.run(r.controller.alter_configs("t", {"unclean.leader.election.enable": "true"}))
            revived = r.image.partition("t", 0)
            assert revived.leader == other and revived.isr == (other,)


def test_alter_partition_checks_epochs_and_eligibility():
    r = Recorder(brokers=3)
    r.create("t", partitions=1, rf=3)
    part = r.image.partition("t", 0)
    leader = part.leader
    f1, f2 = [b for b in part.replicas if b != leader]
    shrunk = alter(r, leader, "t", [leader, f1])
    assert shrunk.error is ErrorCode.NONE
    assert shrunk.partition.isr == (leader, f1)
    assert shrunk.partition.partition_epoch == part.partition_epoch + 1
    assert shrunk.partition.leader_epoch == part.leader_epoch
    stale = alter(r, leader, "t", [leader], partition_epoch=part.partition_epoch)
    assert stale.error is ErrorCode.INVALID_UPDATE_VERSION
    assert alter(r, f1, "t", [f1]).error is ErrorCode.NOT_LEADER_OR_FOLLOWER
    old_epoch = alter(r, leader, "t", [leader], leader_epoch=part.leader_epoch - 1)
    assert old_epoch.error is ErrorCode.FENCED_LEADER_EPOCH
    assert alter(r, leader, "t", [f1]).error is ErrorCode.INVALID_REQUEST  # leader missing
    assert alter(r, leader, "t", [leader, 9]).error is ErrorCode.INVALID_REQUEST
    r.run(r.controller.heartbeat(f2, r.epochs[f2], 10, want_fence=True))
    fenced = alter(r, leader, "t", [leader, f1, f2])
    assert fenced.error is ErrorCode.INELIGIBLE_REPLICA
    # Asking for the ISR it already has still moves the partition epoch (voiding any
    # other request the leader made at the old one).
    before = r.image.partition("t", 0)
    same = alter(r, leader, "t", [leader, f1])
    assert same.error is ErrorCode.NONE and same.partition.isr == before.isr
    assert same.partition.partition_epoch == before.partition_epoch + 1
    wrong_broker_epoch = r.run(
        r.controller.alter_partition(AlterPartitionRequest(leader, 99, "t", 0, 0, 0, (leader,)))
    )
    assert wrong_broker_epoch.error is ErrorCode.STALE_BROKER_EPOCH


def test_preferred_leader_election_and_auto_rebalance():
    config = ControllerConfig(session_timeout_ms=1_000, leader_rebalance_interval_ms=5_000)
    r = Recorder(brokers=3, config=config)
    r.create("t", partitions=3, rf=3)
    preferred = {p: r.image.partition("t", p).replicas[0] for p in range(3)}
    victim = preferred[0]
    r.run(r.controller.heartbeat(victim, r.epochs[victim], 10, want_shutdown=True))
    assert r.image.partition("t", 0).leader != victim
    r.start_broker(victim, 20)  # back, but not in the ISR any more
    result = r.run(r.controller.elect_leaders([("t", 0)]))
    assert result[("t", 0)].error is ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE
    part = r.image.partition("t", 0)
    alter(r, part.leader, "t", (*part.isr, victim))  # it caught up and rejoined
    assert r.run(r.controller.elect_leaders([("t", 1)]))[("t", 1)].error is (
        ErrorCode.ELECTION_NOT_NEEDED
    )
    for b in (1, 2, 3):
        r.heartbeat(b, 4_000)
    r.run(r.controller.tick(5_000))  # the periodic rebalance
    assert {p: r.image.partition("t", p).leader for p in range(3)} == preferred


def test_restarted_broker_loses_its_leaderships():
    r = Recorder(brokers=3)
    r.create("t", partitions=3, rf=3)
    led = [p for p in range(3) if r.image.partition("t", p).leader == 1]
    r.run(r.controller.register_broker(1, "new-incarnation", "h", 1, now_ms=50))
    assert r.image.brokers[1].fenced and r.image.brokers[1].broker_epoch == 2
    for p in led:
        part = r.image.partition("t", p)
        assert part.leader != 1 and 1 not in part.isr


def test_delete_topics_and_alter_configs():
    r = Recorder(brokers=1)
    r.create("a", partitions=2, rf=1)
    res = r.run(r.controller.alter_configs("a", {"retention.ms": "1000"}))
    assert res.error is ErrorCode.NONE and r.image.topic_config("a") == {"retention.ms": "1000"}
    bad = r.run(r.controller.alter_configs("a", {"retention.ms": "x"}))
    assert bad.error is ErrorCode.INVALID_CONFIG
    assert r.run(r.controller.alter_configs("a", {"retention.ms": None})).ok
    assert r.image.topic_config("a") == {}
    missing = r.run(r.controller.alter_configs("zz", {"retention.ms": "1"}))
    assert missing.error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    first_id = r.image.topics["a"].topic_id
    out = r.run(r.controller.delete_topics(["a", "nope", "a"]))
    assert out["a"].ok and out["nope"].error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert "a" not in r.image.topics
    old_id = r.replayed().topics.get("a")
    recreated = r.create("a", partitions=1, rf=1)
    assert recreated.error is ErrorCode.NONE and old_id is None
    assert recreated.topic_id != first_id and r.image.topics["a"].topic_id == recreated.topic_id
    assert r.replayed().topics == r.image.topics


def test_alter_partitions_checks_each_and_commits_the_accepted_as_one_batch():
    r = Recorder(brokers=3)
    r.create("t", partitions=4, rf=3)
    parts = [r.image.partition("t", p) for p in range(4)]
    lead = parts[0].leader
    mine = [p for p in parts if p.leader == lead]

    def req(p, isr, partition_epoch=None):
        return AlterPartitionRequest(
            lead, r.epochs[lead], "t", p.partition, p.leader_epoch,
            p.partition_epoch if partition_epoch is None else partition_epoch, tuple(isr),
        )  # fmt: skip

    shrink = [req(p, [lead, *[b for b in p.replicas if b != lead][:1]]) for p in mine]
    stale = req(mine[0], [lead], partition_epoch=mine[0].partition_epoch + 5)
    batches = len(r.log)
    out = r.run(r.controller.alter_partitions([*shrink, stale, shrink[0]]))
    assert len(r.log) == batches + 1  # one metadata batch for all accepted changes
    assert [o.error for o in out[: len(shrink)]] == [ErrorCode.NONE] * len(shrink)
    assert out[len(shrink)].error is ErrorCode.INVALID_UPDATE_VERSION  # stale epoch
    assert out[-1].error is ErrorCode.INVALID_UPDATE_VERSION  # the same partition twice
    for p, o in zip(mine, out, strict=False):
        assert r.image.partition("t", p.partition).isr == o.partition.isr
        assert len(o.partition.isr) == 2
        assert o.partition.partition_epoch == p.partition_epoch + 1
