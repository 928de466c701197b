"""Raft messages survive the wire; garbage becomes RaftCodecError, never a crash."""

from __future__ import annotations

import random

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.replication import (
    AppendRequest,
    AppendResponse,
    Entry,
    EntryKind,
    HeartbeatRequest,
    HeartbeatResponse,
    RaftNode,
    Snapshot,
    SnapshotRequest,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from logmq.replication.raft_codec import RaftCodecError, decode_message, encode_message

ints = st.integers(0, 2**62)  # ids, terms, indexes: far past reach, yet +1 fits int64
entries = st.builds(Entry, ints, ints, st.binary(max_size=20), st.sampled_from(EntryKind))
snapshots = st.builds(Snapshot, ints, ints, st.binary(max_size=50))
messages = st.one_of(
    st.builds(VoteRequest, ints, ints, ints, ints, ints, st.booleans(), st.booleans()),
    st.builds(VoteResponse, ints, ints, ints, st.booleans(), st.booleans()),
    st.builds(
        AppendRequest, ints, ints, ints, ints, ints, st.lists(entries, max_size=4).map(tuple), ints
    ),
    st.builds(AppendResponse, ints, ints, ints, st.booleans(), ints, ints, ints),
    st.builds(HeartbeatRequest, ints, ints, ints, ints),
    st.builds(HeartbeatResponse, ints, ints, ints),
    st.builds(SnapshotRequest, ints, ints, ints, snapshots),
    st.builds(TimeoutNow, ints, ints, ints),
)


@settings(max_examples=200, deadline=None)
@given(messages)
def test_every_message_round_trips(msg) -> None:
    assert decode_message(encode_message(msg)) == msg


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_are_rejected_cleanly(data: bytes) -> None:
    try:
        decode_message(data)
    except RaftCodecError:
        pass


@settings(max_examples=300, deadline=None)
@given(messages, st.data())
def test_corrupted_messages_decode_or_fail_cleanly(msg, data) -> None:
    raw = bytearray(encode_message(msg))
    position = data.draw(st.integers(0, len(raw) - 1))
    raw[position] = data.draw(st.integers(0, 255))
    try:
        decode_message(bytes(raw))
    except RaftCodecError:
        pass


@pytest.mark.parametrize(
    "raw",
    [
        [],
        [99, 1, 2, 3],
        [6, 1, 2],
        [6, 1, 2, 3, 4],
        [6, 1, "2", 3],
        [6, 1, 2, True],
        [2, 1, 2, 3, 1, 0],
        [1, 1, 2, 3, 0, 0, False],  # VoteRequest without its transfer flag
        [3, 1, 2, 3, 0, 0, [[1, 1, 7, b""]], 0],
        [3, 1, 2, 3, 0, 0, [[1, 1, 0, "text"]], 0],
        [7, 1, 2, 3, [1, 1]],
        {"type": 1},
    ],
)
def test_malformed_structures_name_the_problem(raw) -> None:
    with pytest.raises(RaftCodecError):
        decode_message(msgpack.packb(raw, use_bin_type=True))


small = st.integers(-2, 12)
hostile = st.one_of(
    st.builds(VoteRequest, small, st.just(1), small, small, small, st.booleans(), st.booleans()),
    st.builds(VoteResponse, small, st.just(1), small, st.booleans(), st.booleans()),
    st.builds(
        AppendRequest,
        small,
        st.just(1),
        small,
        small,
        small,
        st.lists(st.builds(Entry, small, small), max_size=3).map(tuple),
        small,
    ),
    st.builds(AppendResponse, small, st.just(1), small, st.booleans(), small, small, small),
    st.builds(HeartbeatRequest, small, st.just(1), small, small),
    st.builds(HeartbeatResponse, small, st.just(1), small),
    st.builds(SnapshotRequest, small, st.just(1), small, st.builds(Snapshot, small, small)),
    st.builds(TimeoutNow, small, st.just(1), small),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(hostile, max_size=30), st.sampled_from([(1,), (1, 2, 3)]))
def test_a_node_survives_any_well_typed_message_sequence(msgs, voters) -> None:
    """Arbitrary (decodable) messages: ValueError at worst, and the log stays coherent."""
    node = RaftNode(1, voters, rng=random.Random(0), election_ticks=3)
    for tick, msg in enumerate(msgs):
        if tick % 3 == 0:
            node.tick()
        try:
            node.step(msg)
        except ValueError:
            pass
        while (rd := node.ready()) is not None:
            node.advance(rd)
        assert node.log.snapshot.index <= node.commit_index <= node.last_index


@pytest.mark.parametrize("bad", [-1, 2**62 + 1, 2**63 - 1, 2**64 - 1])
def test_integers_out_of_range_are_refused(bad):
    """A term at the int64 edge would overflow the hard state at the next election."""
    with pytest.raises(RaftCodecError, match="expected an integer"):
        decode_message(encode_message(HeartbeatRequest(2, 1, bad, 0)))
