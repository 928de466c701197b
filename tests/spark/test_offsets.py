"""The pure offset planning: JSON round trips, rate limiting and splitting."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from logmq_spark.offsets import (
    OffsetRange,
    cap,
    from_json,
    plan_ranges,
    rate_limit,
    split_ranges,
    to_json,
)

tps = st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 5))
offset_maps = st.dictionaries(tps, st.integers(0, 10_000), max_size=12)


@given(offset_maps)
def test_json_round_trip_is_stable(offsets) -> None:
    data = to_json(offsets)
    assert from_json(json.loads(json.dumps(data))) == offsets
    # the same offsets in any insertion order give the same JSON text
    assert json.dumps(to_json(dict(reversed(list(offsets.items()))))) == json.dumps(data)


@given(offset_maps, st.data(), st.integers(1, 5000))
def test_rate_limit_takes_exactly_the_limit(start, data, limit) -> None:
    latest = {tp: s + data.draw(st.integers(0, 3000)) for tp, s in start.items()}
    latest.update(data.draw(st.dictionaries(tps, st.integers(0, 3000), max_size=3)))
    end = rate_limit(start, latest, limit)
    assert set(end) == set(latest)
    avail = sum(max(0, e - start.get(tp, 0)) for tp, e in latest.items())
    took = sum(end[tp] - start.get(tp, 0) for tp in end if latest[tp] >= start.get(tp, 0))
    assert took == min(limit, avail)
    for tp, e in end.items():
        s = start.get(tp, 0)
        if latest[tp] >= s:
            assert s <= e <= latest[tp]


def test_rate_limit_moves_a_small_backlog() -> None:
    start = {("t", p): 0 for p in range(4)}
    latest = {("t", p): 1 for p in range(4)}
    end = rate_limit(start, latest, 2)
    assert sum(end.values()) == 2


def test_plan_reports_losses_and_new_partitions_start_at_zero() -> None:
    plan = plan_ranges(
        {("t", 0): 5, ("t", 1): 9, ("gone", 0): 3}, {("t", 0): 8, ("t", 1): 4, ("t", 2): 2}
    )
    assert plan.ranges == [OffsetRange("t", 0, 5, 8), OffsetRange("t", 2, 0, 2)]
    assert len(plan.losses) == 2
    assert any("gone-0" in m for m in plan.losses) and any("t-1" in m for m in plan.losses)


def test_cap_drops_partitions_born_after_the_target() -> None:
    assert cap({("t", 0): 10, ("t", 1): 4}, {("t", 0): 7}) == {("t", 0): 7}


ranges = st.lists(
    st.builds(
        lambda p, s, n: OffsetRange("t", p, s, s + n),
        st.integers(0, 20),
        st.integers(0, 1000),
        st.integers(0, 5000),
    ),
    max_size=8,
    unique_by=lambda r: r.partition,
)


@given(ranges, st.one_of(st.none(), st.integers(1, 40)), st.one_of(st.none(), st.integers(1, 3000)))
def test_split_covers_each_range_exactly(rs, min_partitions, max_per_partition) -> None:
    pieces = split_ranges(rs, min_partitions, max_per_partition)
    for r in rs:
        mine = sorted((p for p in pieces if p.partition == r.partition), key=lambda p: p.start)
        covered = [o for p in mine for o in range(p.start, p.end)]
        assert covered == list(range(r.start, r.end))
        assert all(p.size > 0 for p in mine)
    if max_per_partition:
        assert all(p.size <= max_per_partition for p in pieces)
    total = sum(r.size for r in rs)
    if min_partitions and total >= min_partitions:
        # proportional rounding may fall short by a little, never by much
        assert len(pieces) >= min(min_partitions, total) // 2
