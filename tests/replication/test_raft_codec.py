"""Raft messages survive the wire; garbage becomes RaftCodecError, never a crash."""

from __future__ import annotations

import random
import tracemalloc

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
from logmq.replication.raft_messages import MAX_ENTRIES_PER_MESSAGE

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


# -- hostile frames: refused before they are built --------------------------------------------


def _uint32_array(n: int) -> bytes:
    return b"\xdd" + n.to_bytes(4, "big")


def _append_prefix() -> bytes:
    """An AppendRequest up to its entries: [3, src, dst, term, prev_index, prev_term, ..."""
    return b"\x98" + bytes([3, 1, 2, 3, 0, 0])


HOSTILE = {
    # a message of a million items (a message has at most 8)
    "long message": _uint32_array(1_000_000) + b"\x00" * 1_000_000,
    # entries that are one-element arrays: a list each, if unpacked before looking
    "tiny entries": _append_prefix() + _uint32_array(500_000) + b"\x91\xc0" * 500_000 + b"\x00",
    # a message of empty maps and arrays, 64 bytes of objects for each byte
    "empty maps": _uint32_array(1_000_000) + b"\x80" * 1_000_000,
    "nested arrays": b"\x98" + (_uint32_array(100_000) + b"\x91\x90" * 100_000) * 8,
    # more entries than any leader sends, with the bytes to make them
    "too many entries": _append_prefix()
    + _uint32_array(MAX_ENTRIES_PER_MESSAGE + 1)
    + b"\x94\x00\x00\x00\xc4\x00" * (MAX_ENTRIES_PER_MESSAGE + 1)
    + b"\x00",
    # a count the bytes left cannot hold
    "count past the end": _append_prefix() + _uint32_array(4_000_000_000) + b"\x00" * 64,
    # a snapshot claiming 4 GB of data
    "huge bin claim": b"\x95" + bytes([7, 1, 2, 3]) + b"\x93\x01\x01\xc6\xff\xff\xff\xff",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_frames_are_refused_without_building_them(name) -> None:
    """Refused, and the decoder's memory stays within a small multiple of the frame (the
    unpacker's copy of it): it never builds what the frame claims, where unpacking first
    and checking after built 30 to 70 bytes of Python objects per byte."""
    data = HOSTILE[name]
    tracemalloc.start()
    try:
        with pytest.raises(RaftCodecError):
            decode_message(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(data) + (1 << 20), (name, peak, len(data))


@pytest.mark.parametrize(
    "raw",
    [
        [5, 1, 2, 3, {"commit": 1}],
        [5, 1, 2, 3, "1"],
        [5, 1, 2, 3, msgpack.ExtType(1, b"x")],
        [5, 1, 2, 3, 1.0],
        [5, 1, 2, 3, None],
        [3, 1, 2, 3, 0, 0, [[1, 1, 0]], 0],
        [3, 1, 2, 3, 0, 0, [[1, 1, 0, b"", b""]], 0],
        [7, 1, 2, 3, [1, 1, b"", b""]],
        [7, 1, 2, 3, {"index": 1}],
    ],
)
def test_values_of_the_wrong_type_are_refused(raw) -> None:
    with pytest.raises(RaftCodecError):
        decode_message(msgpack.packb(raw, use_bin_type=True))


def test_a_message_followed_by_more_bytes_is_refused() -> None:
    with pytest.raises(RaftCodecError, match="after the end"):
        decode_message(encode_message(HeartbeatRequest(2, 1, 3, 0)) + b"\x00")


def test_the_largest_legitimate_messages_round_trip() -> None:
    """More entries than a leader sends by default, and a snapshot of a metadata image of
    100,000 partitions: the limits bound counts, and a snapshot is one byte string."""
    import uuid

    from logmq.cluster.metadata_image import EMPTY_IMAGE, MetadataImage
    from logmq.cluster.metadata_records import PartitionRecord, TopicRecord

    entries = tuple(Entry(101 + i, 5, b"r" * (i % 7)) for i in range(20_000))
    append = AppendRequest(1, 2, 5, 100, 5, entries, 300)
    assert decode_message(encode_message(append)) == append

    records: list = []
    for t in range(2_000):
        name = f"topic-{t:05d}"
        records.append(TopicRecord(name, str(uuid.UUID(int=t))))
        records += [PartitionRecord(name, p, (1, 2, 3), (1, 2, 3), 1, 0, 0) for p in range(50)]
    image = EMPTY_IMAGE.apply(records, 7)
    snapshot = SnapshotRequest(1, 2, 5, Snapshot(7, 5, image.to_bytes()))
    decoded = decode_message(encode_message(snapshot))
    assert decoded == snapshot
    assert len(MetadataImage.from_bytes(decoded.snapshot.data, 7).topics) == 2_000


def test_a_leader_never_sends_more_entries_than_a_member_takes() -> None:
    with pytest.raises(ValueError, match="max_entries_per_message"):
        RaftNode(1, (1, 2, 3), max_entries_per_message=MAX_ENTRIES_PER_MESSAGE + 1)


# any msgpack structure at all, of the shapes a hostile peer could send
structures = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**64 - 1),
        st.floats(allow_nan=False),
        st.binary(max_size=8),
        st.text(max_size=4),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=9),
        st.dictionaries(st.text(max_size=3), children, max_size=3),
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(structures, st.lists(structures, min_size=4, max_size=8)))
def test_any_msgpack_structure_decodes_to_a_message_or_is_refused(raw) -> None:
    try:
        msg = decode_message(msgpack.packb(raw, use_bin_type=True))
    except RaftCodecError:
        return
    assert decode_message(encode_message(msg)) == msg
