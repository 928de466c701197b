"""Metadata records, their codec, the image, its deltas and snapshots, the loader."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from logmq.cluster import metadata_records as mr
from logmq.cluster.meta_properties import (
    ClusterIdentityError,
    check_meta_properties,
    read_identity,
)
from logmq.cluster.metadata_image import EMPTY_IMAGE, MetadataDelta, MetadataError, MetadataImage
from logmq.cluster.metadata_loader import MetadataLoader
from logmq.cluster.metadata_records import (
    NO_LEADER,
    BrokerFenced,
    BrokerUnfenced,
    ClusterIdRecord,
    ConfigRecord,
    MetadataCodecError,
    PartitionChange,
    PartitionRecord,
    RegisterBroker,
    RemoveTopic,
    TopicRecord,
    decode_record,
    decode_records,
    encode_record,
    encode_records,
)
from logmq.errors import ErrorCode
from tests.cluster.helpers import Recorder

SAMPLES = [
    ClusterIdRecord("c1"),
    RegisterBroker(1, 3, "inc", "127.0.0.1", 9092, None),
    RegisterBroker(2, 1, "inc2", "h", 1, "rack-a"),
    BrokerFenced(1, 3),
    BrokerUnfenced(1, 3),
    TopicRecord("t", "tid"),
    PartitionRecord("t", 0, (1, 2), (1,), 1, 4, 7),
    PartitionRecord("t", 1, (2, 1), (2, 1), NO_LEADER, 0, 0, (3,), (1,)),
    PartitionChange("t", 0, isr=(1, 2)),
    PartitionChange("t", 0, leader=2, replicas=(1, 2, 3), adding_replicas=(3,)),
    ConfigRecord("topic", "t", "retention.ms", "5"),
    ConfigRecord("topic", "t", "retention.ms", None),
    RemoveTopic("t", "tid"),
]


def test_every_record_round_trips():
    assert decode_records(encode_records(SAMPLES)) == SAMPLES


def test_codec_is_forward_and_backward_compatible():
    raw = encode_record(PartitionChange("t", 0, isr=(1,)))
    # A newer writer appended a field we do not know: ignored.
    assert decode_record([*raw, "future"]) == PartitionChange("t", 0, isr=(1,))
    # An older writer did not have the trailing optional fields: defaults.
    assert decode_record(raw[:3]) == PartitionChange("t", 0)
    with pytest.raises(MetadataCodecError, match="needs"):
        decode_record(raw[:2])


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xc1",
        msgpack.packb([2, []]),
        msgpack.packb([1, [[99, "x"]]]),
        msgpack.packb([1, [[5, 1, "tid"]]]),
        msgpack.packb([1, [[6, "t", 0, "not a list", [1], 1, 0, 0]]]),
        msgpack.packb([1, [[6, "t", 0, [1, "2"], [1], 1, 0, 0]]]),
        msgpack.packb({"a": 1}),
    ],
)
def test_malformed_batches_are_codec_errors(raw):
    with pytest.raises(MetadataCodecError):
        decode_records(raw)


_VALUES = (
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.text(max_size=3)
    | st.lists(st.integers(-2, 2) | st.text(max_size=1), max_size=3)
)


@given(st.sampled_from(sorted(mr._TYPES)), st.data())
def test_the_generated_decoder_agrees_with_the_field_by_field_one(code, data):
    """Valid records (each field drawn from its kind or from anything) decode the same
    either way; what the fast path refuses falls through to the checked one."""
    cls = mr._TYPES[code]
    raw = [code]
    for kind in mr._KINDS[cls].split():
        right = {"i": st.integers(-5, 5), "s": st.text(max_size=3),
                 "I": st.lists(st.integers(-2, 2), max_size=3),
                 "b": st.binary(max_size=3), "f": st.floats(allow_nan=False),
                 "E": st.lists(st.lists(st.text(max_size=2) | st.none(), min_size=2,
                                        max_size=2).filter(lambda p: p[0] is not None),
                               max_size=3),
                 "k": st.text(max_size=3),
                 "P": st.lists(st.lists(st.integers(-2, 2), min_size=2, max_size=2),
                               max_size=3)}[kind.rstrip("?")]  # fmt: skip
        if kind.endswith("?"):
            right = st.none() | right
        raw.append(data.draw(right | _VALUES))
    raw = raw[: data.draw(st.integers(1, len(raw) + 1))] + data.draw(st.lists(_VALUES, max_size=1))
    fast = mr._fast_decoder(cls)(raw)
    try:
        checked = mr._decode_checked(cls, raw)
    except MetadataCodecError:
        checked = None
    assert fast is None or fast == checked
    assert (decode_record(raw) if checked is not None else None) == checked


@given(st.binary(max_size=64))
def test_fuzzed_bytes_never_crash_the_decoder(raw):
    try:
        decode_records(raw)
    except MetadataCodecError:
        pass


def test_change_bumps_epochs():
    image = EMPTY_IMAGE.apply(
        [TopicRecord("t", "x"), PartitionRecord("t", 0, (1, 2, 3), (1, 2, 3), 1, 5, 9)]
    )
    isr_only = image.apply([PartitionChange("t", 0, isr=(1, 2))]).partition("t", 0)
    assert (isr_only.leader_epoch, isr_only.partition_epoch) == (5, 10)
    same_leader = image.apply([PartitionChange("t", 0, leader=1)]).partition("t", 0)
    assert (same_leader.leader_epoch, same_leader.partition_epoch) == (6, 10)


@pytest.mark.parametrize(
    "record",
    [
        PartitionChange("t", 0, leader=3, isr=(1, 2)),  # leader outside the ISR
        PartitionChange("t", 0, isr=()),  # empty ISR
        PartitionChange("t", 0, isr=(1, 4)),  # ISR member not a replica
        PartitionChange("t", 9, isr=(1,)),  # unknown partition
        TopicRecord("t", "again"),
        RemoveTopic("t", "wrong-id"),
        BrokerFenced(7, 1),
        ClusterIdRecord("another"),
    ],
)
def test_impossible_records_are_rejected_and_leave_the_image_alone(record):
    image = EMPTY_IMAGE.apply(
        [
            ClusterIdRecord("c"),
            TopicRecord("t", "x"),
            PartitionRecord("t", 0, (1, 2, 3), (1, 2, 3), 1, 0, 0),
        ]
    )
    loader = MetadataLoader()
    loader.restore(5, image.to_bytes())
    with pytest.raises(MetadataError):
        loader.apply(6, encode_records([PartitionChange("t", 0, isr=(1, 2)), record]))
    assert loader.image.partition("t", 0) == image.partition("t", 0)  # batch is atomic
    assert loader.image.offset == 6


def test_epochs_are_int32s_so_every_image_can_be_snapshotted():
    """A partition at epoch 2^64 - 1 (msgpack's largest integer) and a change bumping it
    made an image whose snapshot raised OverflowError (found by the snapshot property
    of tests/fuzz/test_remote_parsers.py; fuzz/regressions.py REMOTE)."""
    top = 2**31 - 1
    topic = TopicRecord("t", "x")
    image = EMPTY_IMAGE.apply([topic, PartitionRecord("t", 0, (1, 2), (1, 2), 1, top, top)])
    for change in (PartitionChange("t", 0, leader=2), PartitionChange("t", 0, isr=(1,))):
        with pytest.raises(MetadataError, match="not an int32"):
            image.apply([change])
    assert MetadataImage.from_bytes(image.to_bytes()) == image
    for epochs in ((top + 1, 0), (0, 2**64 - 1), (-(2**31) - 1, 0), (0, -(2**63))):
        with pytest.raises(MetadataError, match="not an int32"):
            EMPTY_IMAGE.apply([topic, PartitionRecord("t", 0, (1,), (1,), 1, *epochs)])


def test_snapshot_rebuilds_the_same_image():
    r = Recorder(brokers=3)
    r.create("a", partitions=3, rf=2, retention_ms="100")
    r.create("b", partitions=1, rf=3)
    r.run(r.controller.heartbeat(2, r.epochs[2], 5, want_fence=True))
    image = r.image
    again = MetadataImage.from_bytes(image.to_bytes(), image.offset)
    assert again == image
    assert r.replayed() == image


def test_local_changes_tell_a_broker_what_to_lead_follow_and_drop():
    base = EMPTY_IMAGE.apply(
        [
            TopicRecord("t", "x"),
            PartitionRecord("t", 0, (1, 2), (1, 2), 1, 0, 0),
            PartitionRecord("t", 1, (2, 3), (2, 3), 2, 0, 0),
            TopicRecord("gone", "g"),
            PartitionRecord("gone", 0, (2,), (2,), 2, 0, 0),
        ]
    )
    delta = MetadataDelta(base)
    for rec in (
        PartitionChange("t", 0, leader=2, isr=(2,)),  # 2 now leads, 1 follows
        PartitionChange("t", 1, isr=(2,)),  # 2 stays leader with a new ISR
        RemoveTopic("gone", "g"),
    ):
        delta.replay(rec)
    two = delta.local_changes(2)
    assert set(two.leaders) == {("t", 0), ("t", 1)}
    assert two.leaders[("t", 0)].leader_epoch == 1 and two.deleted == {("gone", 0)}
    one = delta.local_changes(1)
    assert set(one.followers) == {("t", 0)} and not one.leaders
    three = delta.local_changes(3)
    assert not three  # an ISR change of a partition it follows: nothing to do
    moved = MetadataDelta(base)
    moved.replay(PartitionChange("t", 1, replicas=(2,), isr=(2,)))
    assert moved.local_changes(3).deleted == {("t", 1)}


def test_loader_publishes_images_with_deltas():
    loader = MetadataLoader()
    seen = []
    loader.add_listener(lambda image, delta: seen.append((image.offset, delta is not None)))
    loader.restore(0, b"")
    image = loader.apply(1, encode_records([ClusterIdRecord("c"), TopicRecord("t", "x")]))
    assert image.cluster_id == "c" and "t" in image.topics
    assert seen == [(0, False), (1, True)]
    snap = loader.snapshot()
    fresh = MetadataLoader()
    fresh.restore(1, snap)
    assert fresh.image == loader.image


def test_meta_properties_identity_checks(tmp_path):
    d = tmp_path / "data"
    assert check_meta_properties(d, 1, None) is None  # nothing known yet
    meta = check_meta_properties(d, 1, "cluster-a")
    assert meta is not None and read_identity(d) == (1, "cluster-a")
    assert check_meta_properties(d, 1, "cluster-a").cluster_id == "cluster-a"
    assert check_meta_properties(d, 1, None).cluster_id == "cluster-a"
    with pytest.raises(ClusterIdentityError, match=r"node\.id=1 but this broker is node 2"):
        check_meta_properties(d, 2, "cluster-a")
    with pytest.raises(ClusterIdentityError, match="belongs to cluster cluster-a") as info:
        check_meta_properties(d, 1, "cluster-b")
    assert info.value.code is ErrorCode.INCONSISTENT_CLUSTER_ID
    # A file written before the cluster id was known (node id only) adopts it.
    other = tmp_path / "other"
    other.mkdir()
    (other / "meta.properties").write_text("node.id=3\n")
    assert check_meta_properties(other, 3, "cluster-z").cluster_id == "cluster-z"
    assert read_identity(other) == (3, "cluster-z")


def test_broker_registrations_carry_the_kafka_endpoint_and_read_old_ones():
    from logmq.cluster.metadata_records import decode_record, encode_record

    new = RegisterBroker(2, 1, "inc", "10.0.0.2", 9192, None, "kafka.example", 9092)
    assert decode_record(encode_record(new)) == new
    old = encode_record(new)[:7]  # written before the Kafka listener existed
    assert decode_record(old) == RegisterBroker(2, 1, "inc", "10.0.0.2", 9192, None)
