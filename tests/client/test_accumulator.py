"""The producer's accumulator, driven with a fake clock (the partitioner:
test_partitioner.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.client.accumulator import RecordAccumulator
from logmq.storage.batch import decode_records, encode_batch


def test_batch_closes_at_size_and_at_record_count():
    acc = RecordAccumulator(batch_size=1000, max_batch_records=3, linger_ms=1000)
    b1, i, wake = acc.append("t", 0, 1, None, b"x", None, now=0)
    assert (i, wake) == (0, True)  # a new batch wakes the sender for its linger deadline
    assert acc.append("t", 0, 1, None, b"x", None, now=0)[1:] == (1, False)
    assert acc.append("t", 0, 1, None, b"x", None, now=0)[1:] == (2, True)  # full: 3 records
    assert acc.ready(("t", 0), now=0)
    assert acc.pop(("t", 0), now=0) is b1
    assert acc.pop(("t", 0), now=0) is None

    acc = RecordAccumulator(batch_size=100, max_batch_records=1000, linger_ms=1000)
    big, _, _ = acc.append("t", 0, 1, None, b"x" * 60, None, now=0)
    other, index, _ = acc.append("t", 0, 1, None, b"y" * 60, None, now=0)
    assert other is not big and index == 0  # the second would overflow: new batch
    assert acc.pop(("t", 0), now=0) is big


def test_linger_and_force():
    acc = RecordAccumulator(batch_size=10_000, linger_ms=5)
    acc.append("t", 1, 1, None, b"x", None, now=100)
    assert acc.next_deadline() == 105
    assert acc.pop(("t", 1), now=104) is None
    assert acc.pop(("t", 1), now=104, force=True) is not None
    acc.append("t", 1, 1, None, b"x", None, now=200)
    assert acc.pop(("t", 1), now=205) is not None
    assert len(acc) == 0 and acc.next_deadline() is None


def test_sticky_partition_moves_only_when_its_batch_closes():
    acc = RecordAccumulator(batch_size=10_000, max_batch_records=5, linger_ms=5)
    seen = []
    for _ in range(5):
        p = acc.sticky_partition("t", 8)
        seen.append(p)
        acc.append("t", p, 1, None, b"x", None, now=0)
    assert len(set(seen)) == 1  # one partition until its batch closed at 5 records
    assert "t" not in acc._sticky  # closed: the next keyless record picks again


def test_bulk_batch_keeps_order_behind_open_batch():
    acc = RecordAccumulator(linger_ms=1000)
    first, _, _ = acc.append("t", 0, 1, None, b"a", None, now=0)
    bulk = acc.append_bulk("t", 0, [b"b", b"c"], None, 5, 20, now=0)
    assert acc.pop(("t", 0), now=0) is first
    assert acc.pop(("t", 0), now=0) is bulk
    payload = bulk.encode(compression=0, producer_id=7, producer_epoch=0, base_sequence=3)
    assert [r[3] for r in decode_records(payload)] == [b"b", b"c"]
    assert bulk.encode(compression=0) is payload  # retries resend the same bytes


def test_batch_completion_and_metadata():
    acc = RecordAccumulator()
    batch, _, _ = acc.append("t", 2, 111, b"k", b"v", None, now=0)
    acc.append("t", 2, 222, None, b"w", [("h", b"1")], now=0)
    calls = []
    batch.add_callback(lambda: calls.append(1))
    assert not batch.wait(0)
    batch.complete(40)
    assert calls == [1] and batch.wait(0)
    md = batch.metadata(1)
    assert (md.topic, md.partition, md.offset, md.timestamp) == ("t", 2, 41, 222)
    batch.add_callback(lambda: calls.append(2))  # already done: runs at once
    assert calls == [1, 2]


ops = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(0, 2), st.binary(max_size=40)),
        st.tuples(st.just("tick"), st.integers(0, 10), st.just(b"")),
        st.tuples(st.just("drain"), st.integers(0, 2), st.booleans()),
    ),
    max_size=120,
)


@settings(max_examples=60, deadline=None)
@given(ops, st.integers(30, 300), st.integers(1, 6))
def test_accumulator_never_loses_or_reorders(script, batch_size, max_records):
    """Whatever the interleaving, each partition's drained batches replay its sends in order."""
    acc = RecordAccumulator(batch_size=batch_size, max_batch_records=max_records, linger_ms=3)
    now = 0
    sent: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    drained: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    handles = []
    for op, a, b in script:
        if op == "send":
            batch, index, _ = acc.append("t", a, now, None, b, None, now=now)
            sent[a].append(b)
            handles.append((batch, index, b))
        elif op == "tick":
            now += a
        else:
            while (batch := acc.pop(("t", a), now=now, force=b)) is not None:
                assert 1 <= len(batch.records) <= max_records
                drained[a].extend(r[3] for r in batch.records)
    acc.close_all()
    for p in range(3):
        while (batch := acc.pop(("t", p), now=now)) is not None:
            drained[p].extend(r[3] for r in batch.records)
    assert drained == sent
    for batch, index, value in handles:  # every handle points at its own record
        assert batch.records[index][3] == value


def test_batch_encodes_what_was_appended():
    """Rows built at append time encode to the same records the generic encoder makes."""
    acc = RecordAccumulator(batch_size=1 << 20, linger_ms=0)
    appended = [
        (1000, None, b"a", None),
        (998, b"k", b"b", [("h", b"1"), ("e", None)]),
        (1005, None, None, []),
    ]
    for ts, key, value, headers in appended:
        acc.append("t", 0, ts, key, value, headers, now=0)
    acc.close_all()
    batch = acc.pop(("t", 0), now=0)
    payload = batch.encode(compression=0)
    assert payload == encode_batch(appended)
    got = decode_records(payload)
    assert [(r[1], r[2], r[3], r[4]) for r in got] == [
        (ts, key, value, [tuple(h) for h in headers or []]) for ts, key, value, headers in appended
    ]
    assert [batch.metadata(i).timestamp for i in range(3)] == [1000, 998, 1005]
