"""The reassignment throttle's token bucket and quota (replication/throttle.py), sans IO.

Time is a number the tests move, so the rate properties are exact, not timing-based.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.cluster.metadata_image import BROKER, CLUSTER_WIDE, MetadataImage
from logmq.cluster.metadata_image import REASSIGNMENT_THROTTLE as THROTTLE
from logmq.cluster.metadata_records import ConfigRecord
from logmq.replication.throttle import (
    BURST_SECONDS,
    MIN_BURST,
    ReassignmentQuota,
    TokenBucket,
    configured_rate,
    default_burst,
)

rates = st.integers(min_value=1_000, max_value=200_000_000)
EPS = 1e-6  # relative slack for float accumulation


def _window_excess(grants: list[tuple[float, int]], rate: float) -> float:
    """The largest ``granted - rate * T`` over every window [t_i, t_j] of the grants."""
    worst = 0.0
    for i, (ti, _) in enumerate(grants):
        total = 0
        for tj, n in grants[i:]:
            total += n
            worst = max(worst, total - rate * (tj - ti))
    return worst


@settings(max_examples=200, deadline=None)
@given(
    rate=rates,
    steps=st.lists(
        st.tuples(st.floats(0, 2.0), st.floats(0, 5.0)),  # (seconds later, wanted in bursts)
        min_size=1,
        max_size=60,
    ),
)
def test_bytes_granted_in_any_window_stay_within_rate_times_t_plus_burst(rate, steps):
    now = 100.0
    bucket = TokenBucket(rate, now)
    grants = []
    for dt, want in steps:
        now += dt
        granted = bucket.take(int(want * bucket.burst), now)
        assert 0 <= granted <= int(want * bucket.burst)
        grants.append((now, granted))
    assert _window_excess(grants, rate) <= bucket.burst * (1 + EPS) + 1


@settings(max_examples=200, deadline=None)
@given(
    rate=rates,
    steps=st.lists(
        st.tuples(st.floats(0, 1.0), st.floats(0, 3.0)),  # (seconds later, batch in bursts)
        min_size=1,
        max_size=60,
    ),
)
def test_overdrafts_only_add_the_largest_charge(rate, steps):
    """Whole batches overdraw the bucket; debt is paid back before the next grant."""
    now = 0.0
    bucket = TokenBucket(rate, now)
    grants = []
    largest = 0
    for dt, size in steps:
        now += dt
        if bucket.available(now) > 0:
            n = int(size * bucket.burst)
            bucket.charge(n, now)
            grants.append((now, n))
            largest = max(largest, n)
    assert _window_excess(grants, rate) <= (bucket.burst + largest) * (1 + EPS) + 1


@settings(max_examples=200, deadline=None)
@given(rate=rates, steps=st.lists(st.floats(0.01, 0.99), min_size=10, max_size=200))
def test_a_steady_consumer_gets_the_full_rate(rate, steps):
    """Taking everything at least once per burst's worth of time loses no tokens."""
    now = 0.0
    bucket = TokenBucket(rate, now)
    granted = bucket.take(1 << 62, now)
    for fraction in steps:
        now += fraction * bucket.burst / rate
        granted += bucket.take(1 << 62, now)
    assert granted >= rate * now * (1 - EPS) - 1


@settings(max_examples=100, deadline=None)
@given(
    rate=rates,
    seconds=st.floats(3.0, 10.0),
    batches=st.lists(st.floats(0.01, 1.0), min_size=1, max_size=20),  # in bursts
)
def test_a_quota_driven_fetcher_moves_the_rate_within_a_few_percent(rate, seconds, batches):
    """The fetcher's loop: ask the allowance, move whole batches (overdraw), else wait."""
    now = 0.0
    quota = ReassignmentQuota()
    quota.set_rate(rate, now)
    burst = quota.bucket.burst
    i = 0
    while now < seconds:
        allowance = quota.allowance(now)
        if allowance:
            # the leader sends whole batches: up to the allowance, or one if bigger
            batch = max(1, int(batches[i % len(batches)] * burst))
            i += 1
            quota.charge(max(batch, allowance // batch * batch), now)
        else:
            quota.held_back()
            wait = quota.wait_time(now)
            assert wait > 0
            now += wait
    assert quota.bytes <= rate * now + 2 * burst + 1
    assert quota.bytes >= rate * now - burst
    # a burst is a tenth of a second: over >= 3 s that is within a few percent
    assert abs(quota.bytes / now - rate) <= 0.07 * rate + MIN_BURST / now


def test_burst_is_a_tenth_of_a_second_with_a_floor():
    assert default_burst(10_000_000) == int(10_000_000 * BURST_SECONDS)
    assert default_burst(100) == MIN_BURST
    assert TokenBucket(1000, 0.0, burst=10).burst == 10


def test_wait_time_says_when_bytes_will_be_there():
    bucket = TokenBucket(1_000_000, 0.0)  # burst 100 kB
    assert bucket.available(0.0) == 100_000
    assert bucket.wait_time(0.0) == 0.0
    bucket.charge(150_000, 0.0)  # a batch bigger than what was left: 50 kB of debt
    assert bucket.in_debt(0.0)
    assert bucket.available(0.0) == 0
    assert bucket.wait_time(0.0) == pytest.approx(0.050001)
    assert bucket.wait_time(0.0, want=25_000) == pytest.approx(0.075)
    assert bucket.wait_time(0.0, want=10**9) == pytest.approx(0.15)  # capped at one burst
    assert bucket.available(0.075) == 25_000
    assert bucket.available(10.0) == 100_000  # never more than the burst


def test_time_going_back_adds_nothing():
    bucket = TokenBucket(1000, 10.0, burst=1000)
    bucket.take(1000, 10.0)
    assert bucket.available(5.0) == 0
    assert bucket.available(10.5) == 500


def test_rate_changes_keep_the_debt_and_shrink_the_burst():
    bucket = TokenBucket(1_000_000, 0.0)
    bucket.charge(300_000, 0.0)  # 200 kB in debt
    bucket.set_rate(2_000_000, 0.1)  # paid 100 kB back at the old rate
    assert bucket.tokens(0.1) == pytest.approx(-100_000)
    assert bucket.burst == 200_000
    assert bucket.wait_time(0.1) == pytest.approx(0.05, rel=1e-3)
    bucket.set_rate(20_000, 10.0)  # full at 200 kB, clamped to the new 2 kB burst
    assert bucket.available(10.0) == 2_000


@pytest.mark.parametrize("rate", [0, -5, float("inf"), float("nan")])
def test_rates_must_be_positive_and_finite(rate):
    with pytest.raises(ValueError):
        TokenBucket(rate, 0.0)
    bucket = TokenBucket(1000, 0.0)
    with pytest.raises(ValueError):
        bucket.set_rate(rate, 0.0)


def test_charges_must_not_be_negative():
    with pytest.raises(ValueError):
        TokenBucket(1000, 0.0).charge(-1, 0.0)


def test_quota_follows_the_configured_rate():
    quota = ReassignmentQuota()
    assert not quota.limited and quota.allowance(0.0) is None and quota.wait_time(0.0) == 0
    quota.charge(500, 0.0)  # counted even when not limited
    assert quota.bytes == 500
    quota.set_rate(1_000_000, 0.0)
    assert quota.limited and quota.rate == 1_000_000
    assert quota.allowance(0.0) == 100_000
    quota.charge(90_000, 0.0)  # 10 kB left: below a quarter burst, so wait for more
    assert quota.allowance(0.0) == 0
    assert quota.wait_time(0.0) == pytest.approx(0.015)
    assert quota.allowance(0.015) == 25_000
    quota.set_rate(1_000_000, 0.015)  # unchanged: same bucket
    assert quota.allowance(0.015) == 25_000
    quota.set_rate(0, 1.0)  # 0 and None lift the limit
    assert not quota.limited and quota.rate is None
    quota.set_rate(2_000_000, 1.0)  # a new limit starts with a full burst
    assert quota.allowance(1.0) == 200_000
    quota.set_rate(None, 2.0)
    assert quota.allowance(2.0) is None
    quota.held_back(3)
    assert quota.delays == 3 and quota.bytes == 90_500


def test_the_rate_comes_from_the_image_and_a_bad_value_lifts_it():
    def image(value):
        records = [] if value is None else [ConfigRecord(BROKER, CLUSTER_WIDE, THROTTLE, value)]
        return MetadataImage().apply(records)

    assert configured_rate(None) is None
    assert configured_rate(image(None)) is None
    assert configured_rate(image("4096")) == 4096
    assert configured_rate(image("4 MB/s")) is None  # never stops replication
