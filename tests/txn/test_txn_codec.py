"""The ``__transaction_state`` records: round trips, canonical form, and garbage in."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.txn import (
    TXN_STATE_TOPIC,
    TxnRecordError,
    TxnState,
    TxnStateValue,
    coordinator_partition,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    state_record,
)

partitions = st.lists(
    st.tuples(st.text(min_size=1, max_size=8), st.integers(0, 2**31 - 1)), max_size=6
)
values = st.builds(
    TxnStateValue,
    producer_id=st.integers(-1, 2**63 - 1),
    producer_epoch=st.integers(-1, 32767),
    timeout_ms=st.integers(0, 2**31 - 1),
    state=st.sampled_from(TxnState),
    partitions=partitions.map(lambda ps: tuple(sorted(set(ps)))),
    txn_start_ms=st.integers(-1, 2**50),
    last_update_ms=st.integers(-1, 2**50),
    previous_producer_id=st.integers(-1, 2**63 - 1),
    next_producer_id=st.just(-1),
    last_producer_epoch=st.integers(-1, 32767),
)


def test_topic_and_state_ids_are_kafkas():
    assert TXN_STATE_TOPIC == "__transaction_state"
    assert [int(s) for s in TxnState] == list(range(8))
    assert TxnState.PREPARE_EPOCH_FENCE.kafka_name == "PrepareEpochFence"
    assert TxnState.from_kafka_name("CompleteCommit") is TxnState.COMPLETE_COMMIT
    assert TxnState.from_kafka_name("complete_commit") is None


def test_key_layout():
    assert msgpack.unpackb(encode_key("tx-1")) == [0, "tx-1"]
    assert decode_key(encode_key("tx-1")) == "tx-1"


@given(values)
def test_value_round_trip(value):
    assert decode_value(encode_value(value)) == value


def test_value_layout_is_a_versioned_map_with_sorted_partitions():
    value = TxnStateValue(7, 3, 60_000, TxnState.ONGOING, (("b", 1), ("a", 2), ("a", 0)), 5, 6)
    fields = msgpack.unpackb(encode_value(value))
    assert fields["v"] == 0
    assert fields["state"] == 1
    assert fields["partitions"] == [["a", 0], ["a", 2], ["b", 1]]
    assert decode_value(encode_value(value)).partitions == (("a", 0), ("a", 2), ("b", 1))


def test_unknown_fields_are_ignored_newer_versions_refused():
    fields = msgpack.unpackb(encode_value(TxnStateValue(1, 0, 10, TxnState.EMPTY)))
    assert decode_value(msgpack.packb({**fields, "later": [1, 2]})).producer_id == 1
    with pytest.raises(TxnRecordError):
        decode_value(msgpack.packb({**fields, "v": 1}))


def test_tombstone_record():
    record = state_record("t", None)
    assert record.value is None and decode_key(record.key) == "t"


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xc1",
        msgpack.packb([1, "t"]),
        msgpack.packb([0]),
        msgpack.packb([0, ""]),
        msgpack.packb([0, 5]),
        msgpack.packb([True, "t"]),
        msgpack.packb({"a": 1}),
        msgpack.packb([0, "t"]) + b"\x00",
    ],
)
def test_bad_keys(raw):
    with pytest.raises(TxnRecordError):
        decode_key(raw)


GOOD = msgpack.unpackb(encode_value(TxnStateValue(1, 0, 10, TxnState.ONGOING, (("t", 0),), 1, 1)))


@pytest.mark.parametrize(
    "change",
    [
        {"state": 8},
        {"state": "Ongoing"},
        {"producer_epoch": 32768},
        {"producer_epoch": True},
        {"producer_id": -2},
        {"timeout_ms": None},
        {"partitions": {"t": [0]}},
        {"partitions": [["t", -1]]},
        {"partitions": [["t"]]},
        {"partitions": [[1, 0]]},
        {"v": "0"},
    ],
)
def test_bad_values(change):
    with pytest.raises(TxnRecordError):
        decode_value(msgpack.packb({**GOOD, **change}))
    if "v" not in change:  # a value without a version is version 0; any other field is needed
        with pytest.raises(TxnRecordError):
            decode_value(msgpack.packb({k: v for k, v in GOOD.items() if k not in change}))


def test_coordinator_partition_is_stable_and_in_range():
    assert coordinator_partition("tx", 1) == 0
    spread = {coordinator_partition(f"tx-{i}", 50) for i in range(500)}
    assert spread <= set(range(50)) and len(spread) > 40
    assert coordinator_partition("tx-1", 50) == coordinator_partition("tx-1", 50)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64 - 1)
    | st.text(max_size=5)
    | st.binary(max_size=5)
    | st.floats(allow_nan=False),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=20) | st.integers(), inner, max_size=12)
    ),
    max_leaves=20,
)


def _try_pack(v):
    try:
        return msgpack.packb(v)
    except (OverflowError, ValueError, TypeError):
        return b"\x90"


@settings(max_examples=400)
@given(st.binary(max_size=64) | msgpack_values.map(_try_pack))
def test_garbage_only_ever_raises_txn_record_error(raw):
    for decode in (decode_key, decode_value):
        try:
            decode(raw)
        except TxnRecordError:
            pass


@settings(max_examples=300)
@given(values, st.data())
def test_mutated_values_decode_or_raise_cleanly(value, data):
    fields = msgpack.unpackb(encode_value(value))
    name = data.draw(st.sampled_from(sorted(fields)))
    fields[name] = data.draw(msgpack_values)
    try:
        decode_value(_try_pack(fields))
    except TxnRecordError:
        pass
    raw = bytearray(encode_value(value))
    if raw:
        raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    try:
        decode_value(bytes(raw))
    except TxnRecordError:
        pass
