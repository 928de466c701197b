"""Reassignment plans: the file format, and the generate / decommission / rebalance planners.

Properties over random clusters: a plan keeps every replication factor, never names a
broker twice in a set, uses only the brokers it was given, balances replicas and preferred
leaders (max - min <= 1), moves no more replicas than the balance requires, empties a
decommissioned broker, and a balanced cluster gives an empty rebalance.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from logmq.cluster.reassignment_plan import (
    PlanError,
    ReassignmentPlan,
    assignment_plan,
    decommission,
    generate,
    parse_plan,
    plan_from_json,
    rebalance,
)

Assignment = dict[tuple[str, int], tuple[int, ...]]


def applied(current: Assignment, plan: ReassignmentPlan) -> Assignment:
    return {**current, **plan.partitions}


def replica_counts(assignment: Assignment, brokers) -> Counter:
    counts = Counter(dict.fromkeys(brokers, 0))
    for rs in assignment.values():
        counts.update(rs)
    return counts


def leader_counts(assignment: Assignment, brokers) -> Counter:
    counts = Counter(dict.fromkeys(brokers, 0))
    counts.update(rs[0] for rs in assignment.values())
    return counts


def spread(counts: Counter) -> int:
    return max(counts.values()) - min(counts.values())


def moved_replicas(before: Assignment, after: Assignment) -> int:
    return sum(len(set(after[tp]) - set(before[tp])) for tp in before)


@st.composite
def clusters(draw, *, uniform_rf: bool = False, only_allowed: bool = False, max_broker: int = 7):
    """(current assignment, allowed brokers): replicas may sit on brokers not allowed,
    unless ``only_allowed``."""
    universe = list(range(1, max_broker + 1))
    allowed = draw(st.lists(st.sampled_from(universe), min_size=1, max_size=6, unique=True))
    n_topics = draw(st.integers(1, 3))
    fixed_rf = draw(st.integers(1, len(allowed)))
    if only_allowed:
        universe = sorted(allowed)
    current: Assignment = {}
    for t in range(n_topics):
        partitions = draw(st.integers(1, 8))
        rf = fixed_rf if uniform_rf else draw(st.integers(1, len(allowed)))
        for p in range(partitions):
            rs = draw(st.permutations(universe).map(lambda u, rf=rf: tuple(u[:rf])))
            current[(f"t{t}", p)] = rs
    return current, sorted(allowed)


def check_valid(current: Assignment, plan: ReassignmentPlan, allowed) -> Assignment:
    after = applied(current, plan)
    for tp, rs in plan.partitions.items():
        assert tp in current
        assert len(rs) == len(current[tp]), "replication factor changed"
        assert len(set(rs)) == len(rs), f"duplicate broker in {rs}"
        assert set(rs) <= set(allowed), f"{rs} outside {allowed}"
        assert rs != current[tp], "an unchanged partition is in the plan"
    return after


# -- the file ---------------------------------------------------------------------------------


def test_plan_round_trips_through_its_file_format():
    plan = ReassignmentPlan({("b", 1): (4, 2), ("a", 0): (2, 3, 4)})
    text = plan.dumps()
    assert json.loads(text) == {
        "version": 1,
        "partitions": [
            {"topic": "a", "partition": 0, "replicas": [2, 3, 4]},
            {"topic": "b", "partition": 1, "replicas": [4, 2]},
        ],
    }
    assert parse_plan(text) == plan
    assert parse_plan(ReassignmentPlan({}).dumps()) == ReassignmentPlan({})


def test_kafka_log_dirs_any_is_accepted():
    doc = {
        "version": 1,
        "partitions": [{"topic": "t", "partition": 0, "replicas": [1, 2], "log_dirs": ["any"] * 2}],
    }
    assert plan_from_json(doc).partitions == {("t", 0): (1, 2)}


def entry(**overrides):
    return {"topic": "t", "partition": 0, "replicas": [1, 2, 3], **overrides}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"partitions": []}', "unsupported plan version None"),
        ('{"version": 2, "partitions": []}', "unsupported plan version 2"),
        ('{"version": "1", "partitions": []}', "unsupported plan version '1'"),
        ('{"version": 1}', '"partitions" list'),
        ('{"version": 1, "partitions": [7]}', "partitions[0] must be an object"),
        (json.dumps({"version": 1, "partitions": [{"topic": "t", "partition": 0}]}), '"replicas"'),
        (json.dumps({"version": 1, "partitions": [entry(topic=3)]}), "topic must be"),
        (json.dumps({"version": 1, "partitions": [entry(topic="")]}), "topic must be"),
        (json.dumps({"version": 1, "partitions": [entry(partition="0")]}), "partition must be"),
        (json.dumps({"version": 1, "partitions": [entry(partition=-1)]}), "partition must be"),
        (json.dumps({"version": 1, "partitions": [entry(replicas="1,2")]}), "list of broker"),
        (json.dumps({"version": 1, "partitions": [entry(replicas=[1, "2"])]}), "list of broker"),
        (json.dumps({"version": 1, "partitions": [entry(replicas=[1, 2.0])]}), "list of broker"),
        (json.dumps({"version": 1, "partitions": [entry(replicas=[True])]}), "list of broker"),
        (json.dumps({"version": 1, "partitions": [entry(replicas=[])]}), "t-0: the replica set"),
        (json.dumps({"version": 1, "partitions": [entry(replicas=[2, 3, 2])]}), "appears twice"),
        (json.dumps({"version": 1, "partitions": [entry(), entry()]}), "t-0 appears twice"),
        (json.dumps({"version": 1, "partitions": [entry(replica=[1])]}), "unknown field"),
        (json.dumps({"version": 1, "partitions": [entry(log_dirs=["/d"] * 3)]}), "log_dirs"),
    ],
)
def test_bad_plans_are_refused_with_a_reason(text, message):
    with pytest.raises(PlanError, match=None) as err:
        parse_plan(text)
    assert message in str(err.value)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda c: (
            st.lists(c, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    ["version", "partitions", "topic", "partition", "replicas", "log_dirs", "x"]
                ),
                c,
                max_size=4,
            )
        ),
    )
)
def test_any_json_is_a_plan_or_a_plan_error(doc):
    try:
        plan = plan_from_json(doc)
    except PlanError:
        return
    assert all(len(set(rs)) == len(rs) > 0 for rs in plan.partitions.values())


def test_assignment_plan_is_the_rollback():
    current = {("t", 0): (1, 2), ("t", 1): (2, 3)}
    assert assignment_plan(current, [("t", 1), ("x", 0)]).partitions == {("t", 1): (2, 3)}


# -- generate ---------------------------------------------------------------------------------


def test_generate_moves_a_topic_onto_new_brokers_evenly():
    current = {("t", p): (1, 2, 3) for p in range(6)}
    current[("other", 0)] = (1, 2, 3)
    plan = generate(current, ["t"], [2, 3, 4])
    after = check_valid(current, plan, [2, 3, 4])
    assert ("other", 0) not in plan.partitions
    assert replica_counts({k: v for k, v in after.items() if k[0] == "t"}, [2, 3, 4]) == {
        2: 6,
        3: 6,
        4: 6,
    }
    assert spread(leader_counts({k: after[k] for k in current if k[0] == "t"}, [2, 3, 4])) == 0
    assert moved_replicas(current, after) == 6  # exactly the replicas on broker 1


def test_generate_refuses_what_it_cannot_do():
    current = {("t", 0): (1, 2, 3)}
    with pytest.raises(PlanError, match="more than the 2 broker"):
        generate(current, ["t"], [1, 2])
    with pytest.raises(PlanError, match="unknown topic"):
        generate(current, ["t", "nope"], [1, 2, 3])
    with pytest.raises(PlanError, match="listed twice"):
        generate(current, ["t"], [1, 2, 2])
    with pytest.raises(PlanError, match="at least one broker"):
        generate(current, ["t"], [])
    with pytest.raises(PlanError, match="at least one topic"):
        generate(current, [], [1])


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_generate_keeps_rf_and_balances_replicas(case):
    current, allowed = case
    topics = sorted({t for t, _ in current})
    plan = generate(current, topics, allowed)
    after = check_valid(current, plan, allowed)
    assert all(set(rs) <= set(allowed) for rs in after.values())
    assert spread(replica_counts(after, allowed)) <= 1


@settings(max_examples=300, deadline=None)
@given(clusters(uniform_rf=True))
def test_with_one_replication_factor_leaders_are_balanced_too(case):
    current, allowed = case
    after = applied(current, rebalance(current, allowed))
    counts = leader_counts(after, allowed)
    assert spread(counts) <= 1, counts


@settings(max_examples=300, deadline=None)
@given(clusters(only_allowed=True))
def test_replicas_on_allowed_brokers_move_only_as_balance_requires(case):
    current, allowed = case
    after = applied(current, rebalance(current, allowed))
    counts = replica_counts(current, allowed)
    q, extra = divmod(sum(counts.values()), len(allowed))
    heaviest = sorted(allowed, key=lambda b: (-counts[b], b))[:extra]
    excess = sum(max(0, counts[b] - q - (b in heaviest)) for b in allowed)
    assert moved_replicas(current, after) == excess


# -- rebalance --------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_rebalance_is_valid_and_a_balanced_cluster_needs_nothing(case):
    current, allowed = case
    plan = rebalance(current, allowed)
    after = check_valid(current, plan, allowed)
    assert spread(replica_counts(after, allowed)) <= 1
    assert rebalance(after, allowed) == ReassignmentPlan({})


@settings(max_examples=200, deadline=None)
@given(clusters(only_allowed=True))
def test_a_cluster_balanced_by_hand_is_left_alone(case):
    current, allowed = case
    assume(spread(replica_counts(current, allowed)) <= 1)
    assume(spread(leader_counts(current, allowed)) <= 1)
    assert rebalance(current, allowed) == ReassignmentPlan({})


def test_rebalance_reorders_to_even_out_leaders_without_moving_data():
    current = {("t", p): (1, 2, 3) for p in range(3)}
    plan = rebalance(current, [1, 2, 3])
    assert all(set(rs) == {1, 2, 3} for rs in plan.partitions.values())
    assert leader_counts(applied(current, plan), [1, 2, 3]) == {1: 1, 2: 1, 3: 1}
    assert len(plan) == 2  # partition keeping leader 1 is not in the plan


# -- decommission -----------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(clusters(only_allowed=True), st.data())
def test_decommission_empties_the_broker(case, data):
    current, live = case
    broker = data.draw(st.sampled_from(live))
    remaining = [b for b in live if b != broker]
    holding = {tp for tp, rs in current.items() if broker in rs}
    if any(len(current[tp]) > len(remaining) for tp in holding):
        with pytest.raises(PlanError, match="live broker"):
            decommission(current, broker, live)
        return
    plan = decommission(current, broker, live)
    after = check_valid(current, plan, remaining)
    assert set(plan.partitions) == holding
    assert not any(broker in rs for rs in after.values())
    for tp in holding:  # one replica replaced, the others stay
        assert len(set(after[tp]) - set(current[tp])) == 1


def test_decommission_picks_the_least_loaded_brokers():
    current = {("t", 0): (1, 2), ("t", 1): (1, 3), ("u", 0): (4, 2), ("u", 1): (4, 3)}
    plan = decommission(current, 1, [1, 2, 3, 4, 5])
    assert plan.partitions == {("t", 0): (2, 5), ("t", 1): (3, 5)}
    plan = decommission(current, 1, [2, 3, 4])  # 1 already gone from the live set
    assert plan.partitions == {("t", 0): (2, 3), ("t", 1): (3, 2)}
    assert decommission(current, 5, [1, 2, 3, 4, 5]) == ReassignmentPlan({})
