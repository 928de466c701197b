"""A broker whose data directory is full: leadership moves to replicas with room."""

from __future__ import annotations

from logmq.cluster.controller import Controller
from logmq.cluster.controller_api import AlterPartitionRequest
from logmq.errors import ErrorCode
from tests.cluster.helpers import CONFIG, Recorder


def test_a_full_leader_hands_leadership_to_an_isr_member_with_room():
    r = Recorder(brokers=3)
    r.create("t", partitions=3, rf=3)
    led = [p for p in range(3) if r.image.partition("t", p).leader == 1]
    followed = [p for p in range(3) if r.image.partition("t", p).leader != 1]
    assert led and followed
    r.heartbeat(1, 10, storage_full=True)
    assert r.image.brokers[1].storage_full and r.image.is_active(1)  # not fenced
    for p in led:
        part = r.image.partition("t", p)
        assert part.leader != 1 and 1 not in part.isr and part.leader in part.isr
    for p in followed:  # a follower that cannot write leaves the ISR
        part = r.image.partition("t", p)
        assert part.leader != 1 and 1 not in part.isr
    assert r.replayed().brokers == r.image.brokers  # the record replays (and encodes)
    # Unchanged flag: nothing recorded per heartbeat.
    before = len(r.log)
    r.heartbeat(1, 20, storage_full=True)
    r.heartbeat(1, 30)  # older brokers do not report it: unchanged
    assert len(r.log) == before


def test_a_full_broker_may_not_rejoin_an_isr_until_it_has_room():
    r = Recorder(brokers=2)
    r.create("t", partitions=1, rf=2)
    r.heartbeat(2, 10, storage_full=True)
    part = r.image.partition("t", 0)
    assert part.leader == 1 and part.isr == (1,)
    request = AlterPartitionRequest(
        1, r.epochs[1], "t", 0, part.leader_epoch, part.partition_epoch, (1, 2)
    )
    refused = r.run(r.controller.alter_partition(request))
    assert refused.error is ErrorCode.INELIGIBLE_REPLICA and "disk space" in refused.message
    r.heartbeat(2, 20, storage_full=False)
    assert not r.image.brokers[2].storage_full
    ok = r.run(r.controller.alter_partition(request))
    assert ok.error is ErrorCode.NONE and r.image.partition("t", 0).isr == (1, 2)


def test_with_no_replica_with_room_the_full_leader_keeps_serving():
    """A single broker, or every replica full: reads of acknowledged data keep working."""
    r = Recorder(brokers=1)
    r.create("solo", partitions=1, rf=1)
    r.heartbeat(1, 10, storage_full=True)
    part = r.image.partition("solo", 0)
    assert part.leader == 1 and part.isr == (1,)

    r = Recorder(brokers=2)
    r.create("t", partitions=1, rf=2)
    r.heartbeat(2, 10, storage_full=True)  # the follower first: leaves the ISR
    r.heartbeat(1, 20, storage_full=True)  # then the leader: nobody in sync has room
    part = r.image.partition("t", 0)
    assert part.leader == 1 and part.isr == (1,)


def test_elections_prefer_brokers_with_room_and_a_new_controller_remembers():
    r = Recorder(brokers=3)
    r.create("t", partitions=1, rf=3)
    leader = r.image.partition("t", 0).leader
    full = next(b for b in r.image.partition("t", 0).replicas if b != leader)
    r.run(r.controller.heartbeat(full, r.epochs[full], 10, storage_full=True))
    # The leader dies: the election skips the full replica (it left the ISR anyway).
    for now in (500, 900):
        for b in (1, 2, 3):
            if b != leader:
                r.heartbeat(b, now)
    r.run(r.controller.tick(1_001))
    part = r.image.partition("t", 0)
    assert part.leader not in (leader, full)
    # A new controller starts from the committed image: the flag is part of it.
    fresh = Controller(r.replayed(), 1_001, CONFIG)
    assert fresh.image.brokers[full].storage_full
    # Preferred-leader election does not pick a full broker.
    assert not fresh.image.can_lead(full)
