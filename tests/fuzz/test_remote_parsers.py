"""Hypothesis-built hostile inputs for tiered storage's parsers (fuzz/remote_inputs.py).

The atheris ``remote`` target mutates bytes; these build structure it rarely reaches in
a bounded run (a valid batch with one field at an integer extreme, a snapshot whose
records replay until one does not, a request body with one field of the wrong type).
Each input goes through the target's own check, so a finding means the same here.
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz import regressions
from fuzz import remote_inputs as ri
from logmq.cluster import metadata_records as mr
from logmq.cluster.controller_api import RemoteSegmentChange
from logmq.cluster.metadata_image import EMPTY_IMAGE, MetadataDelta, MetadataError, MetadataImage
from logmq.native.cluster_api import remote_segment_change_body
from logmq.net.codec import pack_body
from logmq.storage.remote import segment_files as sf
from logmq.storage.remote.segment_metadata import RemoteSegment, SegmentState

# integers a msgpack writer can send, the extremes and their neighbours most often
EDGES = [0, 1, -1, 2**31 - 1, 2**31, -(2**31), 2**63 - 1, -(2**63), 2**64 - 1]
edges = st.sampled_from(EDGES)
ints = edges | st.integers(-(2**63), 2**64 - 1) | st.integers(-3, 40)
junk = st.recursive(
    st.none() | st.booleans() | ints | st.floats() | st.text(max_size=4) | st.binary(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)


def mutated(data: bytes, draw) -> bytes:
    """``data`` as is, cut, with a byte changed, or with bytes appended."""
    how = draw(st.sampled_from(["same", "cut", "byte", "tail"]))
    if how == "cut" and data:
        return data[: draw(st.integers(0, len(data) - 1))]
    if how == "byte" and data:
        at = draw(st.integers(0, len(data) - 1))
        return data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    if how == "tail":
        return data + draw(st.binary(min_size=1, max_size=4))
    return data


# -- metadata records and snapshots --------------------------------------------------------

_KIND = {
    "i": ints,
    "s": st.text(max_size=4),
    "I": st.lists(ints, max_size=3),
    "b": st.binary(max_size=4),
    "f": st.floats(),
    "E": st.lists(st.tuples(st.sampled_from(["user", "client-id", "x"]),
                            st.none() | st.text(max_size=3)).map(list), max_size=3),
    "k": st.text(max_size=4) | st.just("x" * mr.MAX_ID_CHARS),
    "P": st.lists(st.tuples(ints, ints).map(list), max_size=3),
}  # fmt: skip


@st.composite
def raw_records(draw) -> list:
    """A record as a writer sends it: its type, then each field of its kind (or junk),
    maybe cut short or with a field a newer writer added."""
    code = draw(st.sampled_from(sorted(mr._TYPES)) | st.integers(-1, 20))
    kinds = mr._KINDS[mr._TYPES[code]].split() if code in mr._TYPES else ["i", "s"]
    fields = []
    for kind in kinds:
        right = _KIND[kind.rstrip("?")]
        fields.append(draw((st.none() | right) if kind.endswith("?") else right) if draw(
            st.integers(0, 9)) else draw(junk))  # fmt: skip
    fields = fields[: draw(st.integers(0, len(fields)))] if draw(st.booleans()) else fields
    return [code, *fields, *draw(st.lists(junk, max_size=1))]


@settings(max_examples=300, deadline=None)
@given(st.lists(raw_records(), max_size=4), st.sampled_from([1, 1, 1, 2, True, 1.0]), st.data())
def test_record_batches_decode_alike_whole_and_streamed(raw, version, data):
    batch = msgpack.packb([version, raw], use_bin_type=True)
    ri.records(mutated(batch, data.draw))


# a small world, so records often name what earlier ones made
_TOPICS = st.sampled_from(["t", "u"])
_IDS = st.sampled_from(["tid", "uid"])
_SEGMENTS = st.sampled_from(["a", "b"])
_BROKERS = st.sampled_from([1, 2, 3])
_SMALL_WORLD = st.one_of(
    st.builds(mr.TopicRecord, _TOPICS, _IDS),
    st.builds(mr.RemoveTopic, _TOPICS, _IDS),
    st.builds(mr.RegisterBroker, _BROKERS, ints, st.just("i"), st.just("h"), ints),
    st.builds(mr.BrokerUnfenced, _BROKERS, ints),
    st.builds(mr.PartitionRecord, _TOPICS, st.integers(-1, 1), st.just((1, 2)),
              st.sampled_from([(1, 2), (1,), ()]), st.sampled_from([1, -1, 3]), ints, ints),
    st.builds(mr.PartitionChange, st.just("t"), st.integers(0, 1),
              st.sampled_from([None, 1, 2, -1]), st.sampled_from([None, (1,), (2,), (1, 2)])),
    st.builds(mr.ConfigRecord, st.sampled_from(["topic", "broker"]), _TOPICS | st.just(""),
              st.sampled_from(["retention.ms", "reassignment.throttled.rate"]),
              st.none() | st.sampled_from(["5", "x"])),
    st.builds(mr.ProducerIdsBlock, _BROKERS, ints),
    st.builds(mr.ClientQuotaRecord, st.just((("user", None),)),
              st.sampled_from(["producer_byte_rate", "request_percentage", "nope"]),
              st.none() | st.floats()),
    st.builds(mr.RemoteSegmentRecord, _IDS, st.integers(-1, 1), _SEGMENTS, ints, ints, ints,
              ints, st.sampled_from([(), ((0, 0), (1, 5)), ((1, 5), (0, 0))]), ints, _BROKERS,
              st.integers(-1, 4)),
    st.builds(mr.RemoteSegmentStateChange, _IDS, st.integers(0, 1), _SEGMENTS, st.integers(-1, 4),
              st.sampled_from(["", "0123456789abcdef"]), ints),
)  # fmt: skip


def _applicable(records: list) -> list:
    """The records that replay in order, each after the ones kept before it (a batch
    is refused whole, so random ones rarely make an image to snapshot)."""
    delta, kept = MetadataDelta(EMPTY_IMAGE), []
    for r in records:
        try:
            delta.replay(r)
        except MetadataError:
            continue
        kept.append(r)
    return kept


@st.composite
def snapshots(draw) -> list:
    """A valid start (a topic, its partitions, a remote segment; epochs, offsets and
    sizes drawn from the integer extremes), then records of the small world; most
    often only those that apply."""
    start = [
        mr.TopicRecord("t", "tid"),
        mr.PartitionRecord("t", 0, (1, 2), (1, 2), 1, draw(edges), draw(edges)),
        mr.PartitionRecord("t", 1, (2, 1), (2,), 2, draw(edges), draw(edges)),
        mr.RemoteSegmentRecord("tid", 0, "a", draw(ints), draw(ints), draw(ints), draw(ints),
                               ((draw(ints), draw(ints)),), draw(ints), 1),
    ]  # fmt: skip
    kept = draw(st.sampled_from([0, 1, 3, 3, 4, 4]))
    records = start[:kept] + draw(st.lists(_SMALL_WORLD, max_size=8))
    return _applicable(records) if draw(st.integers(0, 3)) else records


@settings(max_examples=300, deadline=None)
@given(snapshots(), st.data())
def test_a_snapshot_is_refused_cleanly_or_snapshots_again(records, data):
    """What MetadataImage.from_bytes accepts it must be able to write back: a follower
    that installed a snapshot takes its own from that image."""
    ri.snapshot(mutated(mr.encode_records(records), data.draw))


@pytest.mark.parametrize("name", sorted(regressions.REMOTE))
def test_the_regressions_are_refused_as_their_parser_documents(name):
    data = regressions.REMOTE[name]
    ri.exercise(data)  # no finding
    assert ri.PARSERS[data[0]] is ri.snapshot
    with pytest.raises(MetadataError, match="not an int32"):
        MetadataImage.from_bytes(data[1:])


# -- the remote store's objects -------------------------------------------------------------

_MANIFEST = {
    "version": 1,
    "segment_id": "5e9",
    "base_offset": 10,
    "end_offset": 19,
    "chunk_size": 16,
    "log_size": 40,
    "chunks": ["0123456789abcdef"] * 3,
    "files": {"index": [8, "0123456789abcdef"], "epochs": [6, "fedcba9876543210"]},
}


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from([*sorted(_MANIFEST), "x"]), junk | ints, max_size=2),
       st.data())  # fmt: skip
def test_a_manifest_with_any_field_changed_parses_or_is_corrupt(changes, data):
    doc = {**_MANIFEST, **changes}
    ri.manifest(mutated(msgpack.packb(doc, use_bin_type=True), data.draw))


@given(st.lists(st.tuples(ints, ints), max_size=4), st.data())
def test_leader_epoch_objects_parse_or_are_corrupt(entries, data):
    raw = sf.encode_leader_epochs(tuple(entries))
    if data.draw(st.booleans()):
        raw = raw.replace(b" ", data.draw(st.sampled_from([b"  ", b"_", b"\t", b"+"])), 1)
    ri.epochs(mutated(raw, data.draw))


@given(st.integers(0, 2), st.binary(min_size=12, max_size=12), st.data())
def test_index_objects_parse_or_are_corrupt(kind, head, data):
    width = (8, 12, 34)[kind]
    body = data.draw(st.binary(max_size=width * 4) | st.binary(min_size=width, max_size=width))
    ri.indexes(bytes([kind]) + head + body)


# -- the native tiered-storage bodies -------------------------------------------------------

_SEGMENT = RemoteSegment("tid", 0, "a", 0, 9, 1000, 4096, ((3, 0),), 3, 1, topic="t")
_CHANGES = [
    remote_segment_change_body(RemoteSegmentChange.copy_started(_SEGMENT, 3)),
    remote_segment_change_body(
        RemoteSegmentChange.state_change("tid", 0, "a", SegmentState.COPY_FINISHED, 3)
    ),
]


@st.composite
def changed(draw, doc: dict) -> dict:
    """``doc`` with a field (maybe one inside a nested map) dropped or replaced by junk."""
    out = dict(doc)
    key = draw(st.sampled_from([*sorted(out), "extra"]))
    if isinstance(out.get(key), dict) and draw(st.booleans()):
        out[key] = draw(changed(out[key]))
    elif draw(st.booleans()):
        out.pop(key, None)
    else:
        out[key] = draw(junk | ints)
    return out


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_alter_remote_segments_requests_parse_or_are_invalid(data):
    changes = [data.draw(st.sampled_from(_CHANGES) | changed(data.draw(st.sampled_from(_CHANGES))))
               for _ in range(data.draw(st.integers(0, 3)))]  # fmt: skip
    body = {"broker_id": 1, "broker_epoch": 3, "changes": changes}
    if data.draw(st.booleans()):
        body = data.draw(changed(body))
    ri.alter_request(pack_body(body))


@given(st.integers(0, 3), junk, st.lists(junk | st.fixed_dictionaries({"error": junk}), max_size=3))
def test_alter_remote_segments_answers_parse_or_are_errors(count, error, answers):
    ri.alter_answer(bytes([count]) + pack_body({"error": error, "changes": answers}))
    ri.alter_answer(bytes([count]) + pack_body({"error": error, "message": error}))


@given(junk, junk | st.lists(st.fixed_dictionaries({"topic": junk | _TOPICS,
                                                     "partition": junk | ints})))  # fmt: skip
def test_describe_remote_tier_requests_parse_or_are_invalid(topics, partitions):
    both = {"topics": topics, "partitions": partitions}
    for body in ({"topics": topics}, {"partitions": partitions}, both):
        ri.describe_request(pack_body(body))
