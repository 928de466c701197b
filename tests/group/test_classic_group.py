"""The classic group protocol's core, rule by rule, through the coordinator (sans-IO).

Tickets stand for parked JoinGroup/SyncGroup requests: a request that waits returns
PARKED and its answer arrives among ``take_completions()``, as the shard delivers it.
"""

from __future__ import annotations

import itertools

import pytest

from logmq.errors import ErrorCode as E
from logmq.group import PARKED, ClassicState, GroupConfig, GroupCoordinator, JoinAnswer, LeaveAnswer
from logmq.group.consumer_protocol import (
    decode_assignment,
    decode_subscription,
    encode_assignment,
)

SESSION = 10_000
REBALANCE = 30_000
PROTOCOLS = (("range", b"range-meta"), ("roundrobin", b"rr-meta"))


def coordinator(delay: int = 0) -> GroupCoordinator:
    ids = itertools.count()
    return GroupCoordinator(
        config=GroupConfig(initial_rebalance_delay_ms=delay),
        topic_partitions={"t": 4},
        member_id_factory=lambda: f"id{next(ids)}",
    )


class Client:
    """One simulated consumer: joins (KIP-394 two-step), syncs, heartbeats."""

    tickets = itertools.count(1)

    def __init__(self, core: GroupCoordinator, group: str = "g", protocols=PROTOCOLS) -> None:
        self.core, self.group, self.protocols = core, group, protocols
        self.member_id = ""
        self.generation = -1

    def join(self, now: int = 0, instance_id: str | None = None):
        ticket = next(self.tickets)
        answer = self.core.join_group(
            ticket, self.group, self.member_id, instance_id, "consumer", self.protocols,
            SESSION, REBALANCE, "client", "host", True, now,
        )  # fmt: skip
        if isinstance(answer, JoinAnswer) and answer.error is E.MEMBER_ID_REQUIRED:
            self.member_id = answer.member_id
            return self.join(now, instance_id)
        return ticket, answer

    def sync(self, assignments=None, now: int = 0):
        ticket = next(self.tickets)
        answer = self.core.sync_group(
            ticket, self.group, self.member_id, None, self.generation, "consumer", None,
            assignments or {}, now,
        )  # fmt: skip
        return ticket, answer

    def beat(self, now: int = 0) -> E:
        return self.core.classic_heartbeat(self.group, self.member_id, None, self.generation, now)


def completed(core: GroupCoordinator) -> dict[int, object]:
    return dict(core.take_completions())


def test_first_join_needs_a_member_id_then_two_members_share_a_generation():
    core = coordinator()
    a, b = Client(core), Client(core)
    first = core.join_group(1, "g", "", None, "consumer", PROTOCOLS, SESSION, REBALANCE)
    assert first.error is E.MEMBER_ID_REQUIRED and first.member_id
    assert core.group("g").member_count == 0  # pending until it joins with the id
    a.member_id = first.member_id
    ta, answer = a.join()
    # the only member: the group completes the join at once (no initial delay)
    assert answer is PARKED
    done = completed(core)
    assert done[ta].error is E.NONE and done[ta].generation == 1 and done[ta].leader == a.member_id
    assert [m[0] for m in done[ta].members] == [a.member_id]
    a.generation = 1
    # a second member: a rebalance; a's heartbeat says so, a rejoins, both get gen 2
    tb, answer = b.join()
    assert answer is PARKED and not completed(core)
    assert a.beat() is E.REBALANCE_IN_PROGRESS
    ta, answer = a.join()
    done = completed(core)
    assert {done[ta].generation, done[tb].generation} == {2}
    assert done[ta].protocol_name == "range"  # both prefer it
    leader = done[ta] if done[ta].leader == a.member_id else done[tb]
    assert {m[0] for m in leader.members} == {a.member_id, b.member_id}
    assert {m[2] for m in leader.members} == {b"range-meta"}
    follower_answer = done[tb] if leader is done[ta] else done[ta]
    assert follower_answer.members == ()
    a.generation = b.generation = 2
    # the follower's sync waits for the leader's; the leader's writes the group record
    tb_sync, answer = b.sync()
    assert answer is PARKED
    assignments = {a.member_id: b"A", b.member_id: b"B"}
    ta_sync, answer = a.sync(assignments)
    done = completed(core)
    assert (done[ta_sync].assignment, done[tb_sync].assignment) == (b"A", b"B")
    assert core.group("g").state is ClassicState.STABLE
    assert [r.key[:1] for r in core.take_records()] == [b"\x92"]  # one [6, "g"] record
    assert a.beat() is E.NONE and b.beat() is E.NONE


def test_heartbeat_and_sync_errors():
    core = coordinator()
    a = Client(core)
    a.join()
    completed(core)
    a.generation = 1
    assert core.classic_heartbeat("g", "nobody", None, 1, 0) is E.UNKNOWN_MEMBER_ID
    assert core.classic_heartbeat("g", a.member_id, None, 7, 0) is E.ILLEGAL_GENERATION
    assert core.classic_heartbeat("nope", a.member_id, None, 1, 0) is E.UNKNOWN_MEMBER_ID
    a.generation = 9
    assert a.sync()[1].error is E.ILLEGAL_GENERATION
    a.generation = 1
    wrong = core.sync_group(99, "g", a.member_id, None, 1, "connect", None, {}, 0)
    assert wrong.error is E.INCONSISTENT_GROUP_PROTOCOL


def test_a_member_with_no_common_protocol_is_refused():
    core = coordinator()
    a = Client(core)
    a.join()
    stranger = Client(core, protocols=(("sticky", b""),))
    assert stranger.join()[1].error is E.INCONSISTENT_GROUP_PROTOCOL
    other_type = core.join_group(5, "g", "", None, "connect", PROTOCOLS, SESSION, REBALANCE)
    assert other_type.error is E.INCONSISTENT_GROUP_PROTOCOL
    bad = core.join_group(6, "g", "", None, "consumer", PROTOCOLS, 10, REBALANCE)
    assert bad.error is E.INVALID_SESSION_TIMEOUT


def test_a_silent_member_expires_and_the_others_rebalance():
    core = coordinator()
    a, b = Client(core), Client(core)
    a.join()
    completed(core)
    b.join()
    a.join()
    completed(core)
    a.generation = b.generation = 2
    a.sync({a.member_id: b"A", b.member_id: b"B"})
    completed(core)
    assert b.beat(now=5_000) is E.NONE
    assert core.tick(SESSION + 1) == {"g": [a.member_id]}  # a never heartbeat
    assert core.group("g").state is ClassicState.PREPARING_REBALANCE
    assert b.beat(now=SESSION + 2) is E.REBALANCE_IN_PROGRESS
    tb, _ = b.join(now=SESSION + 3)
    done = completed(core)
    assert done[tb].generation == 3 and done[tb].leader == b.member_id


def test_a_member_that_does_not_rejoin_is_dropped_when_the_join_phase_ends():
    core = coordinator()
    a, b = Client(core), Client(core)
    a.join()
    completed(core)
    a.generation = 1
    tb, _ = b.join(now=100)  # a is asked to rejoin; it heartbeats but never does
    for now in range(5_000, REBALANCE, 5_000):
        assert a.beat(now) is E.REBALANCE_IN_PROGRESS
        core.tick(now)
    assert not completed(core)
    core.tick(100 + REBALANCE)
    done = completed(core)
    assert done[tb].generation == 2 and done[tb].leader == b.member_id
    assert core.group("g").member_count == 1


def test_the_initial_rebalance_waits_its_delay_for_more_members():
    core = coordinator(delay=3_000)
    a, b = Client(core), Client(core)
    ta, _ = a.join(now=0)
    tb, _ = b.join(now=1_000)  # extends the wait to 4 000
    core.tick(3_500)
    assert not completed(core)
    core.tick(4_000)
    done = completed(core)
    assert done[ta].generation == done[tb].generation == 1


def test_leaving_members_and_admin_removal_by_instance_id():
    core = coordinator()
    a, b = Client(core), Client(core)
    ta, _ = a.join(instance_id="static-a")
    a.member_id = completed(core)[ta].member_id  # static members get theirs at once
    b.join()
    a.join(instance_id="static-a")
    completed(core)
    left = core.leave_group("g", [(b.member_id, None), ("ghost", None)])
    assert left == LeaveAnswer(E.NONE, (E.NONE, E.UNKNOWN_MEMBER_ID))
    assert core.leave_group("g", [("", "static-a")]).members == (E.NONE,)
    assert core.group("g") is None  # no members, no offsets: nothing left to keep


def test_a_static_member_restarting_takes_its_place_without_a_rebalance():
    core = coordinator()
    a = Client(core)
    ta, _ = a.join(instance_id="s1")
    a.member_id = completed(core)[ta].member_id
    a.generation = 1
    a.sync({a.member_id: b"A"})
    completed(core)
    old_id = a.member_id
    core.take_records()
    restarted = Client(core)
    _, answer = restarted.join(instance_id="s1")
    assert answer.error is E.NONE and answer.generation == 1 and answer.member_id != old_id
    assert core.group("g").state is ClassicState.STABLE
    assert core.take_records()  # the new member id is persisted
    assert core.classic_heartbeat("g", old_id, "s1", 1, 0) is E.FENCED_INSTANCE_ID


def test_commit_rules_of_classic_groups():
    core = coordinator()
    a, b = Client(core), Client(core)
    a.join()
    completed(core)
    a.generation = 1
    assert core.commit_offsets("g", a.member_id, 1, {("t", 0): (5, "")}) == {
        ("t", 0): E.REBALANCE_IN_PROGRESS
    }  # CompletingRebalance: the assignment is not known yet
    a.sync({a.member_id: b""})
    completed(core)
    ok = core.commit_offsets("g", a.member_id, 1, {("t", 0): (5, "")})
    assert ok == {("t", 0): E.NONE}
    assert core.commit_offsets("g", a.member_id, 0, {("t", 0): (6, "")}) == {
        ("t", 0): E.ILLEGAL_GENERATION
    }
    assert core.commit_offsets("g", "", -1, {("t", 0): (6, "")}) == {
        ("t", 0): E.UNKNOWN_MEMBER_ID
    }  # a simple commit while the group has members
    b.join()  # PreparingRebalance: commits at the current generation still count
    assert core.commit_offsets("g", a.member_id, 1, {("t", 1): (1, "")}) == {("t", 1): E.NONE}
    a.join()
    completed(core)  # CompletingRebalance now
    assert core.commit_offsets("g", a.member_id, 2, {("t", 1): (2, "")}) == {
        ("t", 1): E.REBALANCE_IN_PROGRESS
    }


def test_replay_resumes_the_last_synced_generation():
    core = coordinator()
    a, b = Client(core), Client(core)
    a.join()
    completed(core)
    b.join()
    a.join()
    completed(core)
    a.generation = b.generation = 2
    a.sync({a.member_id: encode_assignment([("t", 0), ("t", 1)]), b.member_id: b""})
    core.commit_offsets("g", a.member_id, 2, {("t", 0): (3, "m")})
    records = core.take_records()
    again = coordinator()
    assert again.replay(records, now_ms=50) == {}
    group = again.group("g")
    assert group.state is ClassicState.STABLE and group.generation == 2
    assert again.classic_heartbeat("g", a.member_id, None, 2, 60) is E.NONE
    answer = again.sync_group(1, "g", a.member_id, None, 2, None, None, {}, 60)
    assert decode_assignment(answer.assignment) == [("t", 0), ("t", 1)]
    assert again.fetch_offsets("g", [("t", 0)]).offsets[("t", 0)].offset == 3
    assert again.describe("g").description.classic.leader == a.member_id


def test_one_group_id_never_mixes_protocols_while_it_has_members():
    core = coordinator()
    a = Client(core)
    a.join()
    completed(core)
    # a consumer-protocol member cannot join a live classic group
    result = core.heartbeat("g", "", 0, None, ["t"], None, 0)
    assert result.error is E.GROUP_ID_NOT_FOUND
    # a classic member cannot join a live consumer-protocol group
    joined = core.heartbeat("h", "", 0, None, ["t"], None, 0)
    assert joined.error is E.NONE
    refused = core.join_group(9, "h", "", None, "consumer", PROTOCOLS, SESSION, REBALANCE)
    assert refused.error is E.INCONSISTENT_GROUP_PROTOCOL
    # once empty, a group changes protocol and keeps its offsets
    a.generation = 1
    a.sync({a.member_id: b""})
    assert core.commit_offsets("g", a.member_id, 1, {("t", 2): (7, "")}) == {("t", 2): E.NONE}
    core.leave_group("g", [(a.member_id, None)])
    switched = core.heartbeat("g", "", 0, None, ["t"], None, 0)
    assert switched.error is E.NONE
    assert core.fetch_offsets("g", [("t", 2)]).offsets[("t", 2)].offset == 7


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_consumer_protocol_subscription_decoding(version):
    import struct

    body = struct.pack(">h", version) + struct.pack(">i", 2)
    for topic in ("a", "bb"):
        body += struct.pack(">h", len(topic)) + topic.encode()
    body += struct.pack(">i", -1)  # no user data
    if version >= 1:
        body += struct.pack(">i", 1) + struct.pack(">h", 1) + b"a" + struct.pack(">ii", 1, 3)
    if version >= 2:
        body += struct.pack(">i", 5)
    if version >= 3:
        body += struct.pack(">h", -1)
    topics, owned = decode_subscription(body)
    assert topics == ["a", "bb"]
    assert owned == ([("a", 3)] if version >= 1 else [])
    with pytest.raises(ValueError):
        decode_subscription(b"\x00")
