"""Client quotas: Kafka's resolution order, its rate and throttle arithmetic, convergence of
a client that honours throttle times, and bounded memory."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.cluster.metadata_records import ClientQuotaRecord
from logmq.cluster.security_image import (
    EMPTY_SECURITY,
    QUOTA_CLIENT_ID,
    QUOTA_KEYS,
    QUOTA_USER,
    quota_entity,
)
from logmq.security.quotas import (
    CLIENT_ID,
    CONTROLLER_MUTATION,
    FETCH,
    PRODUCE,
    QUOTA_KINDS,
    REQUEST,
    USER,
    ClientQuotas,
    TokenBucket,
    WindowedRate,
    quota_user,
    resolve_quota,
    throttle_time_ms,
)

D = None  # the default entity of a type


def entity(user: object = "-", client: object = "-"):
    """An entity with a user and/or client-id component ("-": no such component)."""
    parts = {}
    if user != "-":
        parts[USER] = user
    if client != "-":
        parts[CLIENT_ID] = client
    return quota_entity(parts)


# Kafka's eight levels for user alice, client id app, each with the quota key it meters by
LEVELS = [
    (entity("alice", "app"), ("alice", "app")),
    (entity("alice", D), ("alice", "app")),
    (entity("alice"), ("alice", None)),
    (entity(D, "app"), ("alice", "app")),
    (entity(D, D), ("alice", "app")),
    (entity(D), ("alice", None)),
    (entity(client="app"), (None, "app")),
    (entity(client=D), (None, "app")),
]


def test_names_match_the_metadata_image():
    assert {USER, CLIENT_ID} == {QUOTA_USER, QUOTA_CLIENT_ID}
    assert set(QUOTA_KEYS) == QUOTA_KINDS


def test_quota_user():
    assert quota_user("User:alice") == "alice"
    assert quota_user("User:CN=a:b") == "CN=a:b"
    assert quota_user("User:ANONYMOUS") == "ANONYMOUS"
    assert quota_user(None) == quota_user("") == "ANONYMOUS"
    assert quota_user("bob") == "bob"


@pytest.mark.parametrize("level", range(8))
def test_each_level_beats_every_later_one(level):
    quotas = {e: {PRODUCE: 100.0 + i} for i, (e, _) in enumerate(LEVELS) if i >= level}
    found = resolve_quota(quotas, PRODUCE, "alice", "app")
    assert found is not None
    assert found.entity == LEVELS[level][0]
    assert found.value == 100.0 + level
    assert found.key == LEVELS[level][1]


def test_other_names_and_other_kinds_do_not_match():
    quotas = {
        entity("bob", "app"): {PRODUCE: 1.0},
        entity("alice", "other"): {PRODUCE: 2.0},
        entity("alice"): {FETCH: 3.0},  # another kind: does not count for produce
        entity(client="other"): {PRODUCE: 4.0},
        entity(client=D): {PRODUCE: 5.0},
    }
    found = resolve_quota(quotas, PRODUCE, "alice", "app")
    assert found is not None and found.value == 5.0 and found.key == (None, "app")
    assert resolve_quota(quotas, FETCH, "alice", "app").key == ("alice", None)
    assert resolve_quota(quotas, REQUEST, "alice", "app") is None


def test_no_quota_means_unlimited_and_no_sensor():
    q = ClientQuotas()
    assert q.quota_for(PRODUCE, "alice", "app") is None
    assert q.produce("alice", "app", 10**12, 0.0) == 0
    assert q.sensor_count == 0


def kafka_two_step(quotas, kind, user, client):
    """Kafka's DefaultQuotaCallback literally: metric tags from which entities exist, then
    quotaLimit(tags) (with "" for a tag that is not part of the key)."""

    def has(e):
        return kind in quotas.get(e, {})

    u, c = user, client
    if has(entity(u, c)) or has(entity(u, D)):
        tags = (u, c)
    elif has(entity(u)):
        tags = (u, "")
    elif has(entity(D, c)) or has(entity(D, D)):
        tags = (u, c)
    elif has(entity(D)):
        tags = (u, "")
    else:
        tags = ("", c)
    tu, tc = tags
    if tu and tc:
        order = [entity(tu, tc), entity(tu, D), entity(D, tc), entity(D, D)]
    elif tu:
        order = [entity(tu), entity(D)]
    else:
        order = [entity(client=tc), entity(client=D)]
    for e in order:
        if has(e):
            return quotas[e][kind], tags
    return None, tags


names = st.sampled_from(["alice", "bob", "app", "x"])
entities = st.builds(
    lambda u, c: entity(u, c),
    st.sampled_from(["-", D, "alice", "bob"]),
    st.sampled_from(["-", D, "app", "other"]),
).filter(bool)
quota_tables = st.dictionaries(
    entities,
    st.dictionaries(st.sampled_from(sorted(QUOTA_KINDS)), st.integers(1, 10**6), min_size=1),
)


@given(quota_tables, st.sampled_from(sorted(QUOTA_KINDS)), names, names)
def test_resolution_is_kafkas_two_step_lookup(quotas, kind, user, client):
    found = resolve_quota(quotas, kind, user, client)
    value, tags = kafka_two_step(quotas, kind, user, client)
    if value is None:
        assert found is None
    else:
        assert found is not None and found.value == value
        assert tuple(t or None for t in tags) == found.key
        assert ClientQuotas(quotas=quotas).quota_for(kind, user, client) == value


def test_update_takes_the_images_quotas():
    records = [
        ClientQuotaRecord(quota_entity({USER: "alice", CLIENT_ID: None}), PRODUCE, 1000.0),
        ClientQuotaRecord(quota_entity({CLIENT_ID: None}), FETCH, 2000.0),
        ClientQuotaRecord(quota_entity({USER: None}), REQUEST, 25.0),
    ]
    image = EMPTY_SECURITY.apply(records)
    q = ClientQuotas()
    q.update(image.quotas)
    assert q.quota_for(PRODUCE, "alice", "any") == 1000.0
    assert q.resolve(PRODUCE, "alice", "any").key == ("alice", "any")
    assert q.quota_for(PRODUCE, "bob", "any") is None
    assert q.quota_for(FETCH, "bob", "c") == 2000.0
    assert q.quota_for(REQUEST, "ANONYMOUS", "c") == 25.0
    # unsorted entities and values Kafka would never store are tolerated
    q.update({(("user", "a"), ("client-id", "c")): {PRODUCE: 5}, (("ip", None),): {PRODUCE: 1}})
    assert q.quota_for(PRODUCE, "a", "c") == 5.0
    assert q.max_value_in_window(PRODUCE, "a", "c") == 50.0  # 5/s * 10 whole windows


# -- arithmetic ------------------------------------------------------------------------------


def test_throttle_formula():
    assert throttle_time_ms(1000.0, 1000.0, 10_000) == 0
    assert throttle_time_ms(2000.0, 1000.0, 10_000) == 10_000
    assert throttle_time_ms(1500.0, 1000.0, 10_000) == 5_000
    assert throttle_time_ms(1000.25, 1000.0, 2_000) == 1  # 0.5 ms rounds half up
    assert throttle_time_ms(1e30, 1.0, 10_000) == 2**31 - 1


def test_window_rolls_and_purges():
    r = WindowedRate(3, 1000)
    for t in (0, 999, 1000, 2000, 3000):  # samples start at 0, 1000, 2000, 3000
        r.record(10, t)
    # window_num + 1 samples are kept: the oldest may overlap the span
    assert r.measure(3000) == (50.0, 3000)
    # at 3999 the first sample's last value is 3 windows old: it no longer counts
    assert r.measure(3998) == (50.0, 3998)
    assert r.measure(3999) == (30.0, 2999)
    assert r.rate(3999) == pytest.approx(30 / 2.999)
    assert r.measure(100_000) == (0.0, 2000)  # all gone: padded to window_num - 1 windows


def test_hand_computed_throttles():
    q = ClientQuotas(quotas={entity(client=D): {PRODUCE: 1000.0}})
    # a fresh sensor is judged over 10 whole windows: 5000 B at t=0 is 500 B/s
    assert q.produce("u", "a", 5000, 0.0) == 0
    # at 4.5 s: 12000 B over 4.5 s padded to 10.5 s: (12000/10.5 - 1000) / 1000 * 10500
    assert q.produce("u", "a", 7000, 4.5) == 1500
    assert q.rate(PRODUCE, "u", "a", 4.5) == pytest.approx(12000 / 10.5)
    # another client id has a sensor of its own: 20000 B at once is 2000 B/s over 10 s
    assert q.produce("u", "b", 20_000, 4.5) == 10_000


def test_request_quota_is_percent_of_one_thread_and_capped_at_one_window():
    q = ClientQuotas(quotas={entity(D): {REQUEST: 50.0}})
    assert q.request_time("u", "a", 4.0, 0.0) == 0  # 400 %s over 10 s: 40 %
    # 4 s more: 80 %: (80 - 50) / 50 * 10000 = 6000 ms, capped at the 1000 ms window
    assert q.request_time("u", "a", 4.0, 0.0) == 1000
    assert q.rate(REQUEST, "u", "a", 0.0) == pytest.approx(80.0)
    q2 = ClientQuotas(quotas={entity(D): {REQUEST: 50.0}})
    assert q2.request_time("u", "a", 5.2, 0.0) == 400  # (52 - 50) / 50 * 10000: under the cap


def test_quota_change_keeps_the_samples():
    q = ClientQuotas(quotas={entity("alice"): {PRODUCE: 1000.0}})
    assert q.produce("alice", "a", 15_000, 0.0) == 5000
    q.update({entity("alice"): {PRODUCE: 3000.0}})
    assert q.produce("alice", "a", 0, 0.0) == 0  # 1500 B/s measured: within the new quota
    q.update({entity("alice"): {PRODUCE: 1000.0}})
    assert q.produce("alice", "a", 0, 0.0) == 5000
    # a more specific quota moves the pair to a key of its own: a fresh sensor
    q.update({entity("alice"): {PRODUCE: 1000.0}, entity("alice", "a"): {PRODUCE: 1000.0}})
    assert q.produce("alice", "a", 0, 0.0) == 0
    assert q.produce("alice", "b", 0, 0.0) == 5000  # still on the user's shared sensor


def test_throttled_fetch_is_taken_back():
    q = ClientQuotas(quotas={entity(client=D): {FETCH: 1000.0}})
    assert q.fetch("u", "c", 20_000, 0.0) == 10_000
    q.unrecord_fetch("u", "c", 20_000, 0.0)
    assert q.rate(FETCH, "u", "c", 0.0) == 0.0
    assert q.fetch("u", "c", 5_000, 0.1) == 0


# -- convergence -----------------------------------------------------------------------------


def simulate(q, clients, seconds=30.0, tick=0.1):
    """Each client (user, client id, bytes/s it wants) sends one batch every ``tick``, and
    after a throttled answer sends nothing until the throttle time has passed (KIP-219).
    Returns what each got through, when, and the throttle times each saw."""
    sent: list[list[tuple[float, int]]] = [[] for _ in clients]  # (time, bytes) accepted
    throttles: list[list[int]] = [[] for _ in clients]
    ready = [0.0] * len(clients)
    steps = round(seconds / tick)
    for step in range(steps):
        now = step * tick
        for i, (user, client, want) in enumerate(clients):
            if now + 1e-9 < ready[i]:
                continue
            batch = round(want * tick)
            sent[i].append((now, batch))
            ms = q.produce(user, client, batch, now)
            throttles[i].append(ms)
            ready[i] = now + ms / 1000.0
    return sent, throttles


def average(sent_at, start, end):
    return sum(b for t, b in sent_at if start <= t < end) / (end - start)


def test_producer_at_twice_its_quota_converges_and_others_are_unaffected():
    quota = 100_000.0
    q = ClientQuotas(quotas={entity(client=D): {PRODUCE: quota}})
    clients = [("alice", "greedy", 2 * quota), ("bob", "polite", quota / 2)]
    sent, throttles = simulate(q, clients, seconds=60.0)
    greedy = sent[0]
    assert any(throttles[0])
    # Kafka's 11 one-second windows make the throughput a sawtooth of about one span
    # (a few seconds at full speed, then throttled): a whole minute is within 10% ...
    assert abs(average(greedy, 0, 60) - quota) <= 0.1 * quota
    # ... a 30 s cut is off by up to a sixth, depending on where in the sawtooth it ends;
    # from a cold start it ends mid-burst, a little above
    assert quota <= average(greedy, 0, 30) <= 1.15 * quota
    # whatever the phase, the excess is bounded: no more than one span's worth above
    for end in range(1, 61):
        assert average(greedy, 0, end) * end <= quota * (end + 6)
    assert average(sent[1], 0, 60) == quota / 2 and not any(throttles[1])


def test_user_quota_is_shared_by_its_client_ids():
    quota = 50_000.0
    q = ClientQuotas(quotas={entity(D): {PRODUCE: quota}})
    clients = [("alice", "a1", quota), ("alice", "a2", quota), ("bob", "b", quota / 2)]
    sent, throttles = simulate(q, clients, seconds=60.0)
    assert abs(average(sent[0] + sent[1], 0, 60) - quota) <= 0.1 * quota
    assert not any(throttles[2])


@settings(max_examples=20, deadline=None)
@given(
    st.floats(1.2, 5.0),
    st.sampled_from([1_000.0, 64_000.0, 1e6]),
    st.sampled_from([0.01, 0.05, 0.1]),
)
def test_any_overshoot_converges(factor, quota, tick):
    q = ClientQuotas(quotas={entity(client=D): {PRODUCE: quota}})
    sent, _ = simulate(q, [("u", "c", factor * quota)], seconds=120.0, tick=tick)
    assert abs(average(sent[0], 0, 120) - quota) <= 0.1 * quota


# -- memory ----------------------------------------------------------------------------------


def test_idle_sensors_expire():
    q = ClientQuotas(quotas={entity(client=D): {PRODUCE: 1000.0}}, idle_seconds=3600)
    q.produce("u", "a", 1, 0.0)
    q.produce("u", "b", 1, 100.0)
    q.produce("u", "a", 1, 200.0)  # a is the most recently used again
    assert q.expire(3699.9) == 0
    assert q.expire(3700.0) == 1  # b, idle an hour
    assert q.sensor_count == 1
    assert q.expire(3799.9) == 0
    assert q.expire(3800.0) == 1
    assert q.sensor_count == 0


def test_sensor_cap_sends_new_keys_to_a_shared_catch_all():
    quota = 1000.0
    q = ClientQuotas(quotas={entity(client=D): {PRODUCE: quota}}, max_sensors=3)
    for c in ("a", "b", "c"):
        assert q.produce("u", c, 100, 0.0) == 0
    assert not q.overflowed(PRODUCE)
    # a client cycling client ids: every new id lands in one catch-all sensor, so together
    # they are held to the quota, and memory stays bounded
    throttled = [q.produce("u", f"rnd-{i}", 2000, i * 0.1) for i in range(100)]
    assert q.overflowed(PRODUCE)
    assert q.sensor_count == 4
    assert any(throttled)
    assert q.rate(PRODUCE, "u", "rnd-999", 9.9) == q.rate(PRODUCE, "u", "rnd-0", 9.9)
    # the well-behaved clients keep their own sensors and history
    assert q.produce("u", "a", 100, 9.9) == 0
    assert q.rate(PRODUCE, "u", "a", 9.9) == pytest.approx(200 / 10.9)  # 9.9 s: 10.9 padded


def test_keys_idle_a_whole_span_make_room_at_the_cap():
    q = ClientQuotas(quotas={entity(client=D): {PRODUCE: 1000.0}}, max_sensors=2)
    q.produce("u", "a", 100, 0.0)
    q.produce("u", "b", 100, 5.0)
    q.produce("u", "c", 100, 10.0)  # nothing idle 11 s yet: catch-all
    assert q.overflowed(PRODUCE)
    assert q.produce("u", "d", 100, 11.0) == 0  # a is 11 s idle: its samples are all stale
    assert q.resolve(PRODUCE, "u", "d").key == (None, "d")
    assert q.rate(PRODUCE, "u", "d", 11.0) == pytest.approx(10.0)
    assert q.sensor_count == 3  # b, d and the catch-all
    # the table is full again: a would now record into the catch-all, with c
    assert q.rate(PRODUCE, "u", "a", 11.0) == q.rate(PRODUCE, "u", "c", 11.0) == 10.0


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(names, st.text(max_size=4), st.integers(0, 10**6)), max_size=200))
def test_memory_is_bounded(requests):
    q = ClientQuotas(quotas={entity(D, D): {PRODUCE: 1e5}, entity(D): {FETCH: 1e5}}, max_sensors=8)
    for i, (user, client, nbytes) in enumerate(requests):
        assert q.produce(user, client, nbytes, i * 0.01) >= 0
        assert q.fetch(user, client, nbytes, i * 0.01) >= 0
        assert q.sensor_count <= 8 + 2


def test_bad_settings():
    with pytest.raises(ValueError):
        ClientQuotas(window_num=0)
    with pytest.raises(ValueError):
        ClientQuotas(window_seconds=0.0)
    with pytest.raises(ValueError):
        ClientQuotas(max_sensors=0)


# -- controller_mutation_rate: Kafka's token bucket (KIP-599) ---------------------------


def test_token_bucket_starts_full_refills_at_the_quota_and_caps_at_the_burst():
    bucket = TokenBucket(window_num=11, window_ms=1000)
    assert bucket.tokens(5.0, 0) == 55.0  # 5/s for 11 windows of 1 s
    bucket.record(60.0, 0, 5.0)  # Kafka's own example: a burst beyond the credit
    assert bucket.tokens(5.0, 0) == -5.0
    assert bucket.tokens(5.0, 1000) == 0.0  # one second at 5/s earns it back
    assert bucket.tokens(5.0, 100_000) == 55.0  # and never more than the burst


def mutation_quotas(rate: float) -> ClientQuotas:
    return ClientQuotas(quotas={entity(client="app"): {CONTROLLER_MUTATION: rate}})


def test_a_mutation_is_taken_whole_then_the_next_waits_for_the_bucket():
    q = mutation_quotas(1.0)
    assert q.mutation_throttle("u", "app", 0.0) == 0
    assert q.mutations("u", "app", 8, 0.0) == 0  # 11 credits: 3 left
    assert q.mutations("u", "app", 5, 0.0) == 2000  # -2: two seconds at 1/s
    assert q.mutation_throttle("u", "app", 0.0) == 2000
    assert q.mutation_throttle("u", "app", 1.5) == 500
    assert q.mutation_throttle("u", "app", 2.0) == 0
    assert q.mutation_throttle("u", "other", 0.0) == 0  # another client: unmetered
    assert q.mutations("u", "app", -5, 2.0) == 0  # giving back refused ones: 5 credits


@settings(max_examples=200, deadline=None)
@given(
    rate=st.sampled_from([0.5, 1.0, 10.0]),
    asks=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 3000)), max_size=60),
)
def test_strict_mutations_never_exceed_the_burst_plus_the_rate(rate, asks):
    """Whatever clients ask and when, what the strict check admits is bounded by the burst
    plus the rate over the elapsed time, plus the one mutation taken whole."""
    q = mutation_quotas(rate)
    t = 0.0
    admitted = 0
    biggest = 0
    for partitions, gap_ms in asks:
        t += gap_ms / 1000
        if q.mutation_throttle("u", "app", t) == 0:
            q.mutations("u", "app", partitions, t)
            admitted += partitions
            biggest = max(biggest, partitions)
    assert admitted <= rate * 11 + rate * t + biggest + 1e-6
