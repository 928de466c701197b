"""The consumer's sans-IO membership state machine, without sockets.

Scenario tests feed it hand-written responses; the simulation at the end drives several
GroupMembership objects against the coordinator's own deterministic core
(logmq.group.ConsumerGroup) over a lossy network and checks that no partition is ever
owned by two consumers and that the group always settles balanced.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.client.group_membership import (
    DropAll,
    Fatal,
    FindCoordinator,
    GroupMembership,
    MembershipState,
    Reconcile,
    parse_tp_list,
    tp_list,
)
from logmq.errors import ErrorCode
from logmq.group import ConsumerGroup, GroupConfig, MemberOptions


def ok(member_id="m1", epoch=1, assignment=(), interval=1000):
    return {
        "error": 0,
        "message": None,
        "member_id": member_id,
        "member_epoch": epoch,
        "heartbeat_interval_ms": interval,
        "assignment": tp_list(assignment),
    }


def err(code: ErrorCode, member_id="m1", epoch=1):
    return {
        "error": int(code),
        "message": code.name,
        "member_id": member_id,
        "member_epoch": epoch,
        "heartbeat_interval_ms": 0,
        "assignment": None,
    }


A = ("t", 0)
B = ("t", 1)
C = ("t", 2)


def joined(assignment=(A, B), **kw) -> GroupMembership:
    """A member that joined and took ``assignment``."""
    m = GroupMembership("g", **kw)
    m.subscribe(["t"])
    assert m.poll(0) is not None
    (action,) = m.on_response(ok(assignment=assignment), 0)
    assert action == Reconcile(frozenset(), frozenset(assignment))
    assert m.reconciled(action.revoke, action.assign, 0) == []
    body = m.poll(0)  # reports the new owned set at once
    assert body is not None
    assert parse_tp_list(body["owned_partitions"]) == frozenset(assignment)
    assert m.on_response(ok(assignment=assignment), 0) == []
    return m


def test_nothing_is_sent_before_subscribing():
    m = GroupMembership("g")
    assert m.state is MembershipState.UNSUBSCRIBED
    assert m.poll(0) is None
    assert m.next_deadline_ms() is None
    assert m.leave() is None


def test_empty_group_id_is_refused():
    with pytest.raises(ValueError):
        GroupMembership("")


def test_join_request_carries_every_setting():
    m = GroupMembership(
        "g",
        instance_id="i-1",
        session_timeout_ms=9000,
        rebalance_timeout_ms=7000,
        server_assignor="range",
    )
    m.subscribe(["b", "a"])
    body = m.poll(0)
    assert body == {
        "group_id": "g",
        "member_id": "",
        "member_epoch": 0,
        "instance_id": "i-1",
        "rebalance_timeout_ms": 7000,
        "session_timeout_ms": 9000,
        "subscribed_topics": ["a", "b"],
        "server_assignor": "range",
        "owned_partitions": [],
    }
    assert m.in_flight
    assert m.poll(10_000) is None  # one request at a time


def test_join_then_regular_heartbeats_at_the_brokers_interval():
    m = joined(heartbeat_interval_ms=50)
    assert m.member_id == "m1" and m.member_epoch == 1
    assert m.heartbeat_interval_ms == 1000  # the broker's answer wins
    assert m.state is MembershipState.STABLE
    assert m.next_deadline_ms() == 1000
    assert m.poll(999) is None
    body = m.poll(1000)
    assert body["member_epoch"] == 1 and body["member_id"] == "m1"
    assert body["subscribed_topics"] is None  # unchanged since acknowledged
    assert body["session_timeout_ms"] is None and body["server_assignor"] is None
    assert parse_tp_list(body["owned_partitions"]) == {A, B}


def test_growing_assignment_is_taken_after_the_shell_reconciles():
    m = joined(assignment=(A,))
    m.poll(1000)
    (action,) = m.on_response(ok(epoch=2, assignment=(A, B)), 1000)
    assert action == Reconcile(frozenset(), frozenset({B}))
    assert m.owned == {A}  # not until the shell has started it
    m.reconciled(set(), {B}, 1001)
    assert m.owned == {A, B}
    assert m.member_epoch == 2


def test_shrinking_assignment_reports_release_only_after_revocation():
    m = joined(assignment=(A, B, C))
    m.poll(1000)
    (action,) = m.on_response(ok(epoch=1, assignment=(A,)), 1000)
    assert action == Reconcile(frozenset({B, C}), frozenset())
    assert m.state is MembershipState.RECONCILING
    # Heartbeats go on while the shell commits; they still claim B and C.
    body = m.poll(2000)
    assert parse_tp_list(body["owned_partitions"]) == {A, B, C}
    assert m.on_response(ok(epoch=1, assignment=(A,)), 2000) == []
    assert m.reconciled({B, C}, set(), 2100) == []
    body = m.poll(2100)  # at once, not at the next interval
    assert parse_tp_list(body["owned_partitions"]) == {A}


def test_new_target_during_reconciliation_becomes_the_next_step():
    m = joined(assignment=(A, B))
    m.poll(1000)
    (first,) = m.on_response(ok(epoch=1, assignment=(A,)), 1000)
    assert first.revoke == {B}
    m.poll(2000)
    assert m.on_response(ok(epoch=2, assignment=(A, C)), 2000) == []  # remembered only
    (second,) = m.reconciled({B}, set(), 2001)
    assert second == Reconcile(frozenset(), frozenset({C}))
    assert m.reconciled(set(), {C}, 2002) == []
    assert m.owned == {A, C}


def test_partitions_being_taken_count_as_owned_in_heartbeats():
    # Reporting them as not owned would tell the coordinator they are free to move.
    m = joined(assignment=(A,))
    m.poll(1000)
    m.on_response(ok(epoch=2, assignment=(A, B)), 1000)
    body = m.poll(2000)
    assert parse_tp_list(body["owned_partitions"]) == {A, B}
    assert m.owned == {A}


def test_session_guard_drops_partitions_before_the_coordinator_expires_us():
    m = joined(session_timeout_ms=1000)  # alive since its last answered send, at 0
    assert m.session_deadline_ms() == 800  # a fifth of the session as margin
    assert m.expire(799) == []
    m.poll(1000)  # due at the interval; its answer never comes
    assert m.next_deadline_ms() == 800  # the guard wakes the shell even while in flight
    assert m.expire(1000) == [DropAll(ErrorCode.REQUEST_TIMED_OUT)]
    assert m.state is MembershipState.FENCED
    assert m.session_deadline_ms() is None
    # The old heartbeat's late answer is ignored: that member was given up.
    assert m.on_response(ok(assignment=(A, B)), 1200) == []
    m.lost_done(1200)
    body = m.poll(1200)
    assert body["member_epoch"] == 0 and body["member_id"] == "m1"


def test_session_guard_is_pushed_back_by_every_answer():
    m = joined(session_timeout_ms=1000)
    m.poll(1000)
    m.on_response(ok(assignment=(A, B)), 1500)  # slow answer: counts from the send
    assert m.session_deadline_ms() == 1800
    assert GroupMembership("g").session_deadline_ms() is None


def test_partially_failed_assignment_is_asked_for_again():
    m = joined(assignment=(A,))
    m.poll(1000)
    assert len(m.on_response(ok(epoch=2, assignment=(A, B, C)), 1000)) == 1
    # The shell could only start B (e.g. OffsetFetch failed for C): C comes again.
    (again,) = m.reconciled(set(), {B}, 1001)
    assert again == Reconcile(frozenset(), frozenset({C}))


@pytest.mark.parametrize("code", [ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID])
def test_fenced_member_drops_everything_then_rejoins(code):
    m = joined()
    m.poll(1000)
    actions = m.on_response(err(code), 1000)
    assert actions == [DropAll(code)]
    assert m.state is MembershipState.FENCED
    assert not m.is_member
    assert m.poll(5000) is None  # nothing until the shell dropped its partitions
    m.lost_done(5000)
    assert m.owned == frozenset()
    body = m.poll(5000)
    assert body["member_epoch"] == 0
    assert body["owned_partitions"] == []
    assert body["subscribed_topics"] == ["t"]
    # A fenced member keeps its id; an unknown one lets the coordinator pick a new one.
    assert body["member_id"] == ("m1" if code is ErrorCode.FENCED_MEMBER_EPOCH else "")


def test_static_member_keeps_its_id_when_unknown():
    m = joined(instance_id="i-1")
    m.poll(1000)
    m.on_response(err(ErrorCode.UNKNOWN_MEMBER_ID), 1000)
    m.lost_done(1000)
    body = m.poll(1000)
    assert body["member_id"] == "m1" and body["instance_id"] == "i-1"


def test_fencing_during_reconciliation_ignores_the_late_report():
    m = joined(assignment=(A, B))
    m.poll(1000)
    assert len(m.on_response(ok(epoch=2, assignment=(A, B, C)), 1000)) == 1
    m.poll(2000)
    assert m.on_response(err(ErrorCode.FENCED_MEMBER_EPOCH), 2000) == [
        DropAll(ErrorCode.FENCED_MEMBER_EPOCH)
    ]
    assert m.reconciled(set(), {C}, 2001) == []
    m.lost_done(2002)
    assert m.owned == frozenset()
    assert m.poll(2002)["member_epoch"] == 0


@pytest.mark.parametrize(
    "code",
    [
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ],
)
def test_coordinator_errors_rediscover_and_back_off(code):
    m = joined(retry_backoff_ms=100, max_retry_backoff_ms=350)
    m.poll(1000)
    assert m.on_response(err(code), 1000) == [FindCoordinator(code)]
    assert m.poll(1099) is None
    body = m.poll(1100)
    assert body["subscribed_topics"] == ["t"]  # repeated: the last may not have arrived
    assert m.on_response(err(code), 1100) == [FindCoordinator(code)]
    assert m.next_deadline_ms() == 1300  # exponential
    m.poll(1300)
    m.on_response(err(code), 1300)
    assert m.next_deadline_ms() == 1650  # capped
    m.poll(1650)
    assert m.on_response(ok(assignment=(A, B)), 1650) == []
    assert m.next_deadline_ms() == 2650  # back to the regular interval


def test_lost_response_repeats_epoch_and_owned_partitions():
    m = joined()
    body = m.poll(1000)
    assert m.on_failure(1000) == [FindCoordinator(ErrorCode.NETWORK_EXCEPTION)]
    assert not m.in_flight
    again = m.poll(2000)
    assert again["member_epoch"] == body["member_epoch"]
    assert again["owned_partitions"] == body["owned_partitions"]
    assert again["subscribed_topics"] == ["t"]


def test_retriable_error_backs_off_without_rediscovery():
    m = joined()
    m.poll(1000)
    assert m.on_response(err(ErrorCode.REQUEST_TIMED_OUT), 1000) == []
    assert m.next_deadline_ms() == 1100


@pytest.mark.parametrize(
    "code",
    [ErrorCode.INVALID_SESSION_TIMEOUT, ErrorCode.INVALID_REQUEST, ErrorCode.INVALID_GROUP_ID],
)
def test_non_retriable_errors_are_fatal(code):
    m = GroupMembership("g")
    m.subscribe(["t"])
    m.poll(0)
    (action,) = m.on_response(err(code, epoch=0), 0)
    assert isinstance(action, Fatal) and action.error is code
    assert m.state is MembershipState.FAILED
    assert m.poll(10**9) is None
    assert m.next_deadline_ms() is None


def test_subscription_change_is_sent_at_once_and_until_acknowledged():
    m = joined()
    m.subscribe(["t", "u"])
    body = m.poll(1)
    assert body["subscribed_topics"] == ["t", "u"]
    m.subscribe(["u"])  # changes again while the first change is in flight
    m.on_response(ok(assignment=(A, B)), 2)
    body = m.poll(3)
    assert body["subscribed_topics"] == ["u"]
    m.on_response(ok(assignment=()), 3)
    assert m.poll(3) is None or m.state is MembershipState.RECONCILING


@pytest.mark.parametrize(("instance", "epoch"), [(None, -1), ("i-1", -2)])
def test_leave(instance, epoch):
    m = joined(instance_id=instance)
    body = m.leave()
    assert body["member_epoch"] == epoch
    assert body["member_id"] == "m1"
    assert body["instance_id"] == instance
    assert m.state is MembershipState.LEAVING
    assert m.poll(10**9) is None
    assert m.on_response({"error": 0, "member_id": "m1", "member_epoch": epoch}, 0) == []
    assert m.state is MembershipState.LEFT
    assert m.owned == frozenset()


def test_leave_while_a_heartbeat_is_in_flight():
    m = joined()
    m.poll(1000)
    body = m.leave()
    assert body["member_epoch"] == -1
    m.on_response(ok(assignment=(A, B)), 1000)  # the old heartbeat's answer comes first
    assert m.state is MembershipState.LEFT
    assert m.on_response({"error": 0}, 1000) == []


def test_tp_list_round_trip():
    tps = {("b", 2), ("a", 1), ("a", 0)}
    assert tp_list(tps) == [{"topic": "a", "partitions": [0, 1]}, {"topic": "b", "partitions": [2]}]
    assert parse_tp_list(tp_list(tps)) == tps
    assert parse_tp_list(None) == frozenset()
    assert parse_tp_list([{"topic": 1, "partitions": ["x"]}, "junk"]) == frozenset()


# -- simulation against the coordinator's core ------------------------------------------


class Sim:
    """Consumers (GroupMembership + an instant shell) and a ConsumerGroup, connected by
    a network that may lose requests or responses. Time is simulated."""

    def __init__(self, rng: random.Random, partitions: int) -> None:
        self.rng = rng
        self.group = ConsumerGroup(
            "g",
            config=GroupConfig(
                session_timeout_ms=3000,
                heartbeat_interval_ms=100,
                rebalance_timeout_ms=60_000,
                min_session_timeout_ms=10,
            ),
            topic_partitions={"t": partitions},
            member_id_factory=lambda: f"m{rng.randrange(10**9)}",  # reproducible
        )
        self.now = 0
        self.members: dict[int, GroupMembership] = {}
        self.pending: dict[int, list] = {}  # shell actions not yet carried out

    def add(self, n: int) -> None:
        m = GroupMembership("g", heartbeat_interval_ms=100, session_timeout_ms=3000)
        m.subscribe(["t"])
        self.members[n] = m
        self.pending[n] = []

    def remove(self, n: int) -> None:
        m = self.members.pop(n)
        self.pending.pop(n)
        body = m.leave()
        if body is not None:
            self.deliver(body)

    def deliver(self, body: dict) -> dict:
        owned = body["owned_partitions"]
        result = self.group.heartbeat(
            body["member_id"],
            body["member_epoch"],
            body["instance_id"],
            body["subscribed_topics"],
            None if owned is None else parse_tp_list(owned),
            self.now,
            MemberOptions(session_timeout_ms=body["session_timeout_ms"]),
        )
        return {
            "error": int(result.error),
            "member_id": result.member_id,
            "member_epoch": result.member_epoch,
            "heartbeat_interval_ms": result.heartbeat_interval_ms,
            "assignment": None
            if result.assigned_partitions is None
            else tp_list(result.assigned_partitions),
        }

    def step(self, loss: float) -> None:
        self.now += self.rng.choice((1, 10, 50, 100))
        self.group.tick(self.now)
        for n, m in list(self.members.items()):
            # The shell finishes some of its work (in order).
            while self.pending[n] and self.rng.random() < 0.7:
                action = self.pending[n].pop(0)
                if isinstance(action, Reconcile):
                    self.pending[n] += m.reconciled(action.revoke, action.assign, self.now)
                elif isinstance(action, DropAll):
                    m.lost_done(self.now)
            self.pending[n] += m.expire(self.now)
            body = m.poll(self.now)
            if body is None:
                continue
            if self.rng.random() < loss:
                self.pending[n] += m.on_failure(self.now)  # request lost
                continue
            resp = self.deliver(body)
            if self.rng.random() < loss:
                self.pending[n] += m.on_failure(self.now)  # response lost
                continue
            for action in m.on_response(resp, self.now):
                if isinstance(action, Reconcile | DropAll):
                    self.pending[n].append(action)
                else:
                    assert isinstance(action, FindCoordinator)
            self.check()

    def check(self) -> None:
        seen: dict[tuple[str, int], int] = {}
        for n, m in self.members.items():
            if m.state is MembershipState.FENCED:
                continue  # the shell stops fetching at once, before dropping the rest
            for tp in m.owned:
                assert tp not in seen, f"{tp} owned by consumers {seen[tp]} and {n}"
                seen[tp] = n

    def settle(self, partitions: int) -> None:
        for _ in range(2000):
            self.step(loss=0.0)
            if self.balanced(partitions):
                return
        raise AssertionError("the group did not settle")

    def balanced(self, partitions: int) -> bool:
        counts = [len(m.owned) for m in self.members.values()]
        if not counts:
            return True
        owned = set().union(*(m.owned for m in self.members.values()))
        return len(owned) == partitions and max(counts) - min(counts) <= 1


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    partitions=st.integers(1, 12),
    script=st.lists(st.sampled_from(["add", "remove", "run"]), min_size=1, max_size=12),
    loss=st.sampled_from([0.0, 0.1, 0.3]),
)
def test_simulated_group_never_double_owns_and_settles(seed, partitions, script, loss):
    rng = random.Random(seed)
    sim = Sim(rng, partitions)
    next_id = 0
    for op in script:
        if op == "add" or not sim.members:
            sim.add(next_id)
            next_id += 1
        elif op == "remove":
            sim.remove(rng.choice(sorted(sim.members)))
        for _ in range(rng.randrange(1, 30)):
            sim.step(loss)
    sim.settle(partitions)
    sim.check()
