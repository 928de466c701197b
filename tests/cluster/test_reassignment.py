"""Reassignment in the controller: the steps, the refusals, failover, and random histories."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logmq.cluster.controller import Controller
from logmq.cluster.controller_api import AlterPartitionRequest, ControllerConfig
from logmq.cluster.metadata_image import MetadataImage
from logmq.cluster.metadata_records import NO_LEADER, PartitionChange
from logmq.errors import ErrorCode
from tests.cluster.helpers import CONFIG, Recorder

T0 = ("t", 0)


def catch_up(r: Recorder, broker: int, key=T0) -> ErrorCode:
    """The partition's leader adds ``broker`` to the ISR (it has caught up)."""
    part = r.image.partition(*key)
    request = AlterPartitionRequest(
        part.leader,
        r.epochs[part.leader],
        key[0],
        key[1],
        part.leader_epoch,
        part.partition_epoch,
        (*part.isr, broker),
    )
    return r.run(r.controller.alter_partition(request)).error


def cluster(brokers: int = 4, **configs: str) -> Recorder:
    r = Recorder(brokers=brokers)
    r.create("t", partitions=1, rf=3, **configs)
    assert r.image.partition(*T0).replicas == (1, 2, 3)
    return r


def test_a_move_adds_catches_up_moves_the_leader_and_removes():
    r = cluster()
    result = r.run(r.controller.alter_reassignments({T0: [2, 3, 4]}, throttle=4_000_000))
    assert result.ok, result.message
    part = r.image.partition(*T0)
    assert part.replicas == (1, 2, 3, 4) and part.isr == (1, 2, 3) and part.leader == 1
    assert part.adding_replicas == (4,) and part.removing_replicas == (1,)
    assert part.target_replicas == (2, 3, 4) and part.original_replicas == (1, 2, 3)
    assert r.image.reassignment_throttle == 4_000_000
    # Nothing completes before the new replica is in sync.
    r.run(r.controller.tick(10))
    assert r.image.partition(*T0).reassigning
    assert catch_up(r, 4) is ErrorCode.NONE
    done = r.image.partition(*T0)
    assert done.replicas == (2, 3, 4) and done.isr == (2, 3, 4)
    assert done.leader == 2 and done.leader_epoch == part.leader_epoch + 1
    assert not done.reassigning and done.adding_replicas == () == done.removing_replicas
    assert r.image.reassignment_throttle is None  # the last move ended
    assert r.replayed() == r.image
    assert MetadataImage.from_bytes(r.image.to_bytes(), r.image.offset) == r.image


def test_cancel_returns_to_the_original_replicas_in_order():
    r = cluster()
    assert r.run(r.controller.alter_reassignments({T0: [4, 3, 2]}, throttle=1000)).ok
    assert r.image.partition(*T0).replicas == (1, 2, 3, 4)
    assert r.run(r.controller.alter_reassignments({T0: None})).ok
    part = r.image.partition(*T0)
    assert part.replicas == (1, 2, 3) and part.isr == (1, 2, 3) and part.leader == 1
    assert not part.reassigning and r.image.reassignment_throttle is None
    again = r.run(r.controller.alter_reassignments({T0: None}))
    assert again.error is ErrorCode.NO_REASSIGNMENT_IN_PROGRESS


def test_cancel_after_the_new_replica_joined_and_led_drops_it_and_elects_an_original():
    r = cluster(brokers=5)
    # [1,2,3] -> [4,5,1,2]: 4 joins the ISR, but 5 has not yet, so it is still moving.
    assert r.run(r.controller.alter_reassignments({T0: [4, 5, 1, 2]})).ok
    assert catch_up(r, 4) is ErrorCode.NONE
    r.run(r.controller.elect_leaders([T0]))  # preferred is still the original first, 1
    r.heartbeat(1, 10, want_shutdown=True)  # 1 leaves: 2 leads
    assert r.image.partition(*T0).leader == 2
    assert r.run(r.controller.alter_reassignments({T0: None})).ok
    part = r.image.partition(*T0)
    assert part.replicas == (1, 2, 3) and 4 not in part.isr and part.leader in (2, 3)


def test_a_reorder_moves_only_leadership_and_a_shrink_completes_at_once():
    r = cluster()
    assert r.run(r.controller.alter_reassignments({T0: [3, 1, 2]})).ok
    part = r.image.partition(*T0)
    assert part.replicas == (3, 1, 2) and part.leader == 3 and not part.reassigning
    assert r.run(r.controller.alter_reassignments({T0: [1, 2]})).ok
    part = r.image.partition(*T0)
    assert part.replicas == (1, 2) and part.isr == (1, 2) and part.leader == 1
    # The same set again: nothing to do, nothing logged.
    before = len(r.log)
    assert r.run(r.controller.alter_reassignments({T0: [1, 2]})).ok
    assert len(r.log) == before


def test_bad_plans_start_nothing():
    r = cluster(min_insync_replicas="2")
    r.create("u", partitions=1, rf=3)
    ok = {("u", 0): [2, 3, 4]}
    cases = [
        ({("nope", 0): [1, 2]}, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no partition nope-0"),
        ({("t", 7): [1, 2]}, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "t-7"),
        ({T0: [1, 9]}, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "unknown broker(s) [9]"),
        ({T0: [1, 2, 2]}, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "appears twice"),
        ({T0: []}, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "empty"),
        ({T0: [4]}, ErrorCode.INVALID_REPLICATION_FACTOR, "min.insync.replicas (2)"),
        ({T0: None}, ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, "not moving"),
    ]
    for moves, code, text in cases:
        result = r.run(r.controller.alter_reassignments({**ok, **moves}))
        assert result.error is code and text in result.message, (moves, result)
        assert "nothing was started" in result.message
        assert result.partitions[("u", 0)].ok  # valid on its own, but not started
        assert not r.image.partition("u", 0).reassigning
    bad_throttle = r.run(r.controller.alter_reassignments(ok, throttle=-5))
    assert bad_throttle.error is ErrorCode.INVALID_REQUEST
    assert not any(r.image.reassignments())
    # Already moving: a second plan touching it is refused.
    assert r.run(r.controller.alter_reassignments({T0: [2, 3, 4]})).ok
    again = r.run(r.controller.alter_reassignments({T0: [1, 2, 4], **ok}))
    assert again.error is ErrorCode.REASSIGNMENT_IN_PROGRESS
    assert "already moving to [2, 3, 4]" in again.message
    assert not r.image.partition("u", 0).reassigning


def test_the_broker_wide_min_insync_default_counts_too():
    config = ControllerConfig(
        session_timeout_ms=1_000,
        auto_leader_rebalance=False,
        topic_defaults={"min.insync.replicas": "2"},
    )
    r = Recorder(brokers=4, config=config)
    r.create("t", partitions=1, rf=3)
    refused = r.run(r.controller.alter_reassignments({T0: [4]}))
    assert refused.error is ErrorCode.INVALID_REPLICATION_FACTOR
    r.run(r.controller.alter_configs("t", {"min.insync.replicas": "1"}))
    assert r.run(r.controller.alter_reassignments({T0: [4]})).ok  # the topic's own wins


def test_a_new_controller_finishes_a_move_from_the_committed_image():
    # A move whose ISR change committed without its completion (the controller died
    # between the two) is finished by the next controller on its first tick.
    r = cluster()
    assert r.run(r.controller.alter_reassignments({T0: [2, 3, 4]}, throttle=1000)).ok
    image = r.image.apply([PartitionChange("t", 0, isr=(1, 2, 3, 4))])
    assert image.partition(*T0).reassigning and image.partition(*T0).leader == 1
    successor = Controller(image, 100, CONFIG)
    records = successor.tick(100).records
    done = successor.image.partition(*T0)
    assert records and done.replicas == (2, 3, 4) and done.leader == 2
    assert successor.image.reassignment_throttle is None


def test_completion_waits_for_a_target_replica_that_may_lead():
    r = cluster()
    assert r.run(r.controller.alter_reassignments({T0: [4]})).ok
    assert catch_up(r, 4) is ErrorCode.NONE
    assert r.image.partition(*T0).replicas == (4,)  # completed: 4 is active
    r = cluster()
    assert r.run(r.controller.alter_reassignments({T0: [2, 4]})).ok
    assert catch_up(r, 4) is ErrorCode.NONE
    assert r.image.partition(*T0).replicas == (2, 4) and r.image.partition(*T0).leader == 2


# -- random histories --------------------------------------------------------------------------

BROKERS = [1, 2, 3, 4, 5]
KEYS = [("t", 0), ("t", 1)]
OP = st.one_of(
    st.tuples(st.just("move"), st.sampled_from(KEYS), st.permutations(BROKERS), st.integers(1, 4)),
    st.tuples(st.just("cancel"), st.sampled_from(KEYS), st.just(()), st.just(0)),
    st.tuples(st.just("catch_up"), st.sampled_from(KEYS), st.integers(0, 3), st.just(0)),
    st.tuples(st.just("shrink"), st.sampled_from(KEYS), st.sampled_from(BROKERS), st.just(0)),
    st.tuples(st.just("crash"), st.just(T0), st.sampled_from(BROKERS), st.just(0)),
    st.tuples(st.just("restart"), st.just(T0), st.sampled_from(BROKERS), st.just(0)),
    st.tuples(st.just("tick"), st.just(T0), st.integers(1, 2000), st.just(0)),
    st.tuples(st.just("failover"), st.just(T0), st.just(0), st.just(0)),
)


class Histories:
    def __init__(self) -> None:
        self.r = Recorder(brokers=5, config=ControllerConfig(session_timeout_ms=1000))
        self.r.create("t", partitions=2, rf=3)
        self.now = 0
        self.alive = set(BROKERS)
        self.holders = {k: set(self.r.image.partition(*k).replicas) for k in KEYS}

    def apply(self, op) -> None:
        r, (kind, key, a, b) = self.r, op
        part = r.image.partition(*key)
        if kind == "move":
            r.run(r.controller.alter_reassignments({key: a[:b]}, throttle=1000))
        elif kind == "cancel":
            r.run(r.controller.alter_reassignments({key: None}))
        elif kind == "catch_up" and part.leader != NO_LEADER:
            # the a-th live replica outside the ISR has caught up
            behind = [x for x in part.replicas if x not in part.isr and x in self.alive]
            if behind:
                catch_up(r, behind[a % len(behind)], key)
        elif kind == "shrink" and part.leader not in (NO_LEADER, a) and a in part.isr:
            request = AlterPartitionRequest(
                part.leader,
                r.epochs[part.leader],
                *key,
                part.leader_epoch,
                part.partition_epoch,
                tuple(x for x in part.isr if x != a),
            )
            r.run(r.controller.alter_partition(request))
        elif kind == "crash":
            self.alive.discard(a)
        elif kind == "restart" and a not in self.alive:
            self.alive.add(a)
            r.start_broker(a, self.now, incarnation=f"inc-{a}-{len(r.log)}")
        elif kind == "tick":
            self.now += a
            for broker in sorted(self.alive):
                r.heartbeat(broker, self.now, caught_up=True)
            r.run(r.controller.tick(self.now))
        elif kind == "failover":
            r.controller = Controller(r.controller.image, self.now, r.controller.config)
            r.run(r.controller.tick(self.now))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OP, min_size=5, max_size=50))
def test_random_moves_never_lose_the_in_sync_copies(ops):
    h = Histories()
    for op in ops:
        before = h.r.image
        h.apply(op)
        after = h.r.image
        for key in KEYS:
            old, new = before.partition(*key), after.partition(*key)
            # A replica that holds acknowledged data (in the ISR) is dropped only when
            # the new replica set's members are all in sync (completion) or on cancel.
            dropped = set(old.replicas) - set(new.replicas)
            if dropped:
                # a move that needs no copy (a shrink, a reorder) completes at once
                started_now = op[0] == "move" and op[1] == key and not old.reassigning
                target = tuple(op[2][: op[3]]) if started_now else old.target_replicas
                assert old.reassigning or started_now, (op, old, new)
                if new.replicas == target:
                    assert set(new.replicas) <= set(old.isr) | set(new.isr)
                else:
                    assert op[0] == "cancel" and new.replicas == old.original_replicas
            assert new.leader == NO_LEADER or new.leader in new.isr
        moving = any(True for _ in after.reassignments())
        assert after.reassignment_throttle is None or moving
    assert h.r.replayed() == h.r.image
