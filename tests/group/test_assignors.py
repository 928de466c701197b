"""Properties of the partition assignors."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.group.assignors import (
    RangeAssignor,
    RoundRobinAssignor,
    StickyAssignor,
    assignor_by_name,
)

ALL = [RangeAssignor(), RoundRobinAssignor(), StickyAssignor()]
TOPICS = ["a", "b", "c"]
FAST = settings(max_examples=60, deadline=None)

topic_counts = st.dictionaries(st.sampled_from(TOPICS), st.integers(0, 12), min_size=1)
member_ids = st.lists(st.text("mnopq", min_size=1, max_size=3), min_size=1, max_size=7, unique=True)


@st.composite
def groups(draw, identical: bool = False):
    partitions = draw(topic_counts)
    ids = draw(member_ids)
    topics = st.frozensets(st.sampled_from([*TOPICS, "unknown"]), max_size=4)
    if identical:
        subscription = draw(topics)
        members = {m: subscription for m in ids}
    else:
        members = {m: draw(topics) for m in ids}
    return members, partitions


@st.composite
def previous_assignments(draw, members, partitions):
    """Any claims, valid or not, as a stale previous assignment might hold."""
    all_tps = [(t, p) for t in [*TOPICS, "gone"] for p in range(14)]
    return {m: draw(st.sets(st.sampled_from(all_tps), max_size=8)) for m in members}


def subscribed_partitions(members, partitions):
    topics = set().union(*members.values())
    return {(t, p) for t in topics for p in range(partitions.get(t, 0))}


def check_valid(members, partitions, result):
    assert set(result) == set(members)
    owners: dict = {}
    for member, tps in result.items():
        for tp in tps:
            assert tp not in owners, f"{tp} owned by {owners[tp]} and {member}"
            owners[tp] = member
            assert tp[0] in members[member], "assigned a topic the member does not want"
    assert set(owners) == subscribed_partitions(members, partitions)


def loads(result):
    return [len(tps) for tps in result.values()]


def moved(before, after):
    """Partitions whose owner changed (ignoring partitions newly assigned)."""
    owner_before = {tp: m for m, tps in before.items() for tp in tps}
    return {tp for m, tps in after.items() for tp in tps if owner_before.get(tp, m) != m}


@pytest.mark.parametrize("assignor", ALL, ids=lambda a: a.name)
@FAST
@given(data=st.data())
def test_every_subscribed_partition_owned_exactly_once(assignor, data):
    members, partitions = data.draw(groups())
    current = data.draw(previous_assignments(members, partitions))
    check_valid(members, partitions, assignor.assign(members, partitions, current))


@pytest.mark.parametrize("assignor", ALL, ids=lambda a: a.name)
@FAST
@given(data=st.data())
def test_deterministic_whatever_the_input_order(assignor, data):
    members, partitions = data.draw(groups())
    current = data.draw(previous_assignments(members, partitions))
    first = assignor.assign(members, partitions, current)
    shuffled = dict(reversed(list(members.items())))
    again = assignor.assign(shuffled, dict(reversed(list(partitions.items()))), current)
    assert first == again


@pytest.mark.parametrize("assignor", [RoundRobinAssignor(), StickyAssignor()], ids=lambda a: a.name)
@FAST
@given(data=st.data())
def test_identical_subscriptions_balanced_within_one(assignor, data):
    members, partitions = data.draw(groups(identical=True))
    current = data.draw(previous_assignments(members, partitions))
    result = assignor.assign(members, partitions, current)
    assert max(loads(result)) - min(loads(result)) <= 1


@FAST
@given(data=st.data())
def test_range_balanced_within_one_per_topic(data):
    members, partitions = data.draw(groups(identical=True))
    result = RangeAssignor().assign(members, partitions, {})
    for topic in partitions:
        per_member = [sum(1 for t, _ in tps if t == topic) for tps in result.values()]
        if any(topic in subs for subs in members.values()):
            assert max(per_member) - min(per_member) <= 1


@FAST
@given(data=st.data())
def test_sticky_balances_members_with_same_subscription_in_mixed_groups(data):
    members, partitions = data.draw(groups())
    current = data.draw(previous_assignments(members, partitions))
    result = StickyAssignor().assign(members, partitions, current)
    for a in members:
        for b in members:
            if members[a] == members[b]:
                assert abs(len(result[a]) - len(result[b])) <= 1


@FAST
@given(data=st.data())
def test_sticky_is_stable_when_nothing_changes(data):
    members, partitions = data.draw(groups())
    sticky = StickyAssignor()
    first = sticky.assign(members, partitions, {})
    assert sticky.assign(members, partitions, first) == first


@FAST
@given(data=st.data(), newcomer=st.text("xyz", min_size=1, max_size=3))
def test_sticky_adding_a_member_moves_only_what_it_receives(data, newcomer):
    members, partitions = data.draw(groups(identical=True))
    sticky = StickyAssignor()
    before = sticky.assign(members, partitions, {})
    grown = {**members, newcomer: next(iter(members.values()))}
    after = sticky.assign(grown, partitions, before)
    check_valid(grown, partitions, after)
    total = len(subscribed_partitions(members, partitions))
    assert moved(before, after) == after[newcomer]
    assert len(after[newcomer]) <= math.ceil(total / len(grown))


@FAST
@given(data=st.data())
def test_sticky_removing_a_member_moves_only_its_partitions(data):
    members, partitions = data.draw(groups(identical=True))
    sticky = StickyAssignor()
    before = sticky.assign(members, partitions, {})
    leaver = data.draw(st.sampled_from(sorted(members)))
    shrunk = {m: s for m, s in members.items() if m != leaver}
    after = sticky.assign(shrunk, partitions, before)
    if shrunk:
        check_valid(shrunk, partitions, after)
    for member in shrunk:
        assert before[member] <= after[member], "a staying member lost a partition"
    assert moved(before, after) <= before[leaver]


def test_range_gives_contiguous_ranges_first_members_get_the_extra():
    result = RangeAssignor().assign({"m1": {"a"}, "m2": {"a"}}, {"a": 5}, {})
    assert result == {"m1": {("a", 0), ("a", 1), ("a", 2)}, "m2": {("a", 3), ("a", 4)}}


def test_round_robin_skips_members_not_subscribed():
    members = {"m1": {"a"}, "m2": {"a", "b"}}
    result = RoundRobinAssignor().assign(members, {"a": 2, "b": 2}, {})
    assert result == {"m1": {("a", 0)}, "m2": {("a", 1), ("b", 0), ("b", 1)}}


def test_sticky_keeps_valid_previous_and_drops_stale_claims():
    members = {"m1": {"a"}, "m2": {"a"}}
    current = {"m1": {("a", 0), ("a", 1), ("gone", 0)}, "m2": {("a", 1), ("a", 9)}}
    result = StickyAssignor().assign(members, {"a": 4}, current)
    assert result["m1"] == {("a", 0), ("a", 1)}
    assert result["m2"] == {("a", 2), ("a", 3)}


def test_assignor_by_name():
    assert assignor_by_name("range").name == "range"
    assert assignor_by_name("roundrobin").name == "roundrobin"
    assert assignor_by_name("sticky").name == "sticky"
    with pytest.raises(ValueError, match="unknown assignor"):
        assignor_by_name("nope")
