"""Hypothesis drives the controller through random histories; the rules hold at every step.

Operations: time passing (session expiry, periodic rebalance), heartbeats, crashes and
restarts (new incarnations), controlled shutdowns, topic creation/deletion, unclean
election toggles and explicit unclean elections, preferred elections, and AlterPartition
requests from the real leader or from stale ones, reassignments (with a throttle) and
their cancellation. After every operation:

* never a leader outside the ISR; a newly elected leader outside the previous ISR only if
  the topic allowed unclean election (or an operator asked for one);
* the leader epoch strictly increases whenever the leader changes, the partition epoch on
  any change, and neither ever decreases;
* the ISR is never empty and within the replicas, and only active brokers join it;
* leaders are always active brokers;
* a move ends only by completing (every target replica was in the ISR; the partition now
  has exactly the target replicas) or by a cancel (exactly the original replicas, in
  their order); the reassignment throttle is set only while something moves;
* a follower replaying the records through the codec builds the identical image, and the
  snapshot rebuilds it too.

LOGMQ_SOAK=1 raises the number of histories.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logmq.cluster.controller_api import AlterPartitionRequest, ControllerConfig
from logmq.cluster.metadata_image import MetadataImage
from logmq.cluster.metadata_records import NO_LEADER
from tests.cluster.helpers import Recorder

SOAK = os.environ.get("LOGMQ_SOAK") == "1"
BROKERS = [1, 2, 3, 4]
TOPICS = ["a", "b", "c"]

OP = st.one_of(
    st.tuples(st.just("advance"), st.integers(1, 1500), st.just(0)),
    st.tuples(st.just("heartbeat"), st.sampled_from(BROKERS), st.booleans()),
    st.tuples(st.just("heartbeat_all"), st.just(0), st.just(0)),
    st.tuples(st.just("crash"), st.sampled_from(BROKERS), st.just(0)),
    st.tuples(st.just("restart"), st.sampled_from(BROKERS), st.just(0)),
    st.tuples(st.just("shutdown"), st.sampled_from(BROKERS), st.just(0)),
    st.tuples(
        st.just("create"),
        st.sampled_from(TOPICS),
        st.tuples(st.integers(1, 3), st.integers(1, 4), st.booleans()),
    ),
    st.tuples(st.just("delete"), st.sampled_from(TOPICS), st.just(0)),
    st.tuples(st.just("unclean"), st.sampled_from(TOPICS), st.booleans()),
    st.tuples(st.just("unclean_elect"), st.just(0), st.just(0)),
    st.tuples(st.just("preferred"), st.just(0), st.just(0)),
    st.tuples(
        st.just("reassign"),
        st.tuples(st.sampled_from(TOPICS), st.integers(0, 2)),
        st.tuples(st.permutations(BROKERS), st.integers(1, 4), st.integers(0, 3)),
    ),
    st.tuples(st.just("cancel"), st.tuples(st.sampled_from(TOPICS), st.integers(0, 2)), st.just(0)),
    st.tuples(
        st.just("alter_isr"),
        st.tuples(st.sampled_from(TOPICS), st.integers(0, 2)),
        st.tuples(st.integers(0, 15), st.sampled_from(["real", "stale", "other"])),
    ),
)


class History:
    def __init__(self) -> None:
        config = ControllerConfig(session_timeout_ms=1_000, leader_rebalance_interval_ms=3_000)
        self.r = Recorder(brokers=0, config=config)
        self.now = 0
        self.alive = set(BROKERS)
        for b in BROKERS:
            self.r.start_broker(b, 0)

    def apply(self, op) -> str:
        r, kind, a, b = self.r, op[0], op[1], op[2]
        c = r.controller
        if kind == "advance":
            self.now += a
            r.run(c.tick(self.now))
        elif kind == "heartbeat" and a in self.alive:
            r.heartbeat(a, self.now, caught_up=b)
        elif kind == "heartbeat_all":
            for broker in sorted(self.alive):
                r.heartbeat(broker, self.now, caught_up=True)
        elif kind == "crash":
            self.alive.discard(a)
        elif kind == "restart":
            self.alive.add(a)
            r.start_broker(a, self.now, incarnation=f"inc-{a}-{self.now}-{len(r.log)}")
        elif kind == "shutdown" and a in self.alive:
            r.heartbeat(a, self.now, want_shutdown=True)
            self.alive.discard(a)
        elif kind == "create":
            partitions, rf, unclean = b
            r.create(a, partitions, rf, unclean_leader_election_enable=str(unclean).lower())
        elif kind == "delete":
            r.run(c.delete_topics([a]))
        elif kind == "unclean" and a in r.image.topics:
            r.run(c.alter_configs(a, {"unclean.leader.election.enable": str(b).lower()}))
        elif kind == "unclean_elect":
            r.run(c.elect_leaders([p.key for p in r.image.partitions()], unclean=True))
        elif kind == "preferred":
            r.run(c.elect_leaders(None))
        elif kind == "alter_isr":
            self._alter_isr(*a, *b)
        elif kind == "reassign":
            order, size, throttle = b
            r.run(c.alter_reassignments({a: order[:size]}, throttle=throttle * 1000 or None))
        elif kind == "cancel":
            r.run(c.alter_reassignments({a: None}))
        return kind

    def _alter_isr(self, topic: str, partition: int, mask: int, who: str) -> None:
        r = self.r
        part = r.image.partition(topic, partition)
        if part is None:
            return
        subset = tuple(x for i, x in enumerate(part.replicas) if mask >> i & 1)
        if who == "real" and part.leader != NO_LEADER:
            broker, leader_epoch, partition_epoch = (
                part.leader,
                part.leader_epoch,
                part.partition_epoch,
            )
            isr = (part.leader, *[x for x in subset if x != part.leader])
        elif who == "stale":
            broker, leader_epoch, partition_epoch = (
                part.replicas[mask % len(part.replicas)],
                max(0, part.leader_epoch - mask % 2),
                max(0, part.partition_epoch - 1 - mask % 2),
            )
            isr = subset or part.isr
        else:
            broker = part.replicas[mask % len(part.replicas)]
            leader_epoch, partition_epoch, isr = part.leader_epoch, part.partition_epoch, subset
        if broker not in r.epochs:
            return
        r.run(
            r.controller.alter_partition(
                AlterPartitionRequest(
                    broker, r.epochs[broker], topic, partition, leader_epoch, partition_epoch, isr
                )
            )
        )


def check_step(before: MetadataImage, after: MetadataImage, kind: str) -> None:
    moving = False
    for part in after.partitions():
        moving = moving or part.reassigning
        old_part = before.partition(part.topic, part.partition)
        if old_part is not None and old_part.reassigning and not part.reassigning:
            where = f"{part.topic}-{part.partition} after {kind}"
            if kind == "cancel" and part.replicas == old_part.original_replicas:
                pass
            else:
                assert part.replicas == old_part.target_replicas, f"{where}: not the target"
                assert set(part.replicas) <= set(old_part.isr) | set(part.isr), where
    assert after.reassignment_throttle is None or moving, "throttle outlived the moves"
    for part in after.partitions():
        where = f"{part.topic}-{part.partition} after {kind}"
        assert part.isr and set(part.isr) <= set(part.replicas), where
        if part.leader != NO_LEADER:
            assert part.leader in part.isr, f"{where}: leader outside the ISR"
            assert after.is_active(part.leader), f"{where}: leader {part.leader} is not active"
        old_topic = before.topics.get(part.topic)
        new_topic = after.topics[part.topic]
        if old_topic is None or old_topic.topic_id != new_topic.topic_id:
            continue  # created by this step
        old = old_topic.partitions[part.partition]
        assert part.leader_epoch >= old.leader_epoch and part.partition_epoch >= old.partition_epoch
        if part != old:
            assert part.partition_epoch > old.partition_epoch, f"{where}: epoch not bumped"
        if part.leader != old.leader:
            assert part.leader_epoch > old.leader_epoch, f"{where}: leader epoch not bumped"
        unclean = kind == "unclean_elect" or any(
            img.topic_config(part.topic).get("unclean.leader.election.enable") == "true"
            for img in (before, after)
        )
        if part.leader not in (NO_LEADER, old.leader) and part.leader not in old.isr:
            assert unclean, f"{where}: unclean election"
        joined = set(part.isr) - set(old.isr)
        if joined:
            # Only AlterPartition adds members; an unclean election restarts the ISR.
            assert kind == "alter_isr" or unclean, f"{where}: ISR grew by {joined}"
            if kind == "alter_isr":
                assert all(after.is_active(b) for b in joined), f"{where}: {joined}"


@settings(
    max_examples=1500 if SOAK else 150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.lists(OP, max_size=60))
def test_controller_histories_keep_the_rules(ops):
    history = History()
    for op in ops:
        before = history.r.image
        kind = history.apply(op)
        check_step(before, history.r.image, kind)
    assert history.r.replayed() == history.r.image
    image = history.r.image
    assert MetadataImage.from_bytes(image.to_bytes(), image.offset) == image
