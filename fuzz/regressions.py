"""Inputs that once found a bug, replayed first by every sanitized run and by the tests
(tests/fuzz/test_codec_sanitizers.py and, for REMOTE, tests/fuzz/test_remote_parsers.py
name what each must now give)."""

from __future__ import annotations

import struct

from logmq.cluster import metadata_records as mr
from logmq.kafka.fetch_response import uvarint
from logmq.storage import batch as b
from logmq.storage import records_codec

INT64_MAX = 2**63 - 1


def raw_batch(
    rows: list[tuple], *, base_offset: int, last_offset_delta: int, first_timestamp: int = 0
) -> bytes:
    """A batch with a valid CRC around ``rows``, whatever offsets its header claims."""
    return b.assemble(
        records_codec.encode_rows(rows),
        count=len(rows),
        last_offset_delta=last_offset_delta,
        first_timestamp=first_timestamp,
        max_timestamp=first_timestamp,
        attributes=0,
        base_offset=base_offset,
    )


def _lying_delta() -> bytes:
    """A batch whose header claims a huge base offset and delta (CRC left as is: the
    header walk of batches_end trusts it without a check)."""
    out = bytearray(raw_batch([(0, 0, b"k", b"v", None)], base_offset=0, last_offset_delta=0))
    struct.pack_into(">q", out, 0, INT64_MAX - 1)
    struct.pack_into(">i", out, 23, 3)
    return bytes(out)


CODEC: dict[str, bytes] = {
    # batches_end: base offset + last offset delta + 1 overflowed int64 (UBSan: signed
    # integer overflow), and a consumer took the wrapped, negative sum as its next offset
    "next-offset-overflow": _lying_delta(),
    # scan_batches and take_records: a checked batch whose offsets run past int64
    "batch-offsets-overflow": raw_batch(
        [(0, 0, b"k", b"v", None), (1, 0, None, b"w", None)],
        base_offset=INT64_MAX - 1,
        last_offset_delta=1,
    ),
    # take_records: a record's offset delta runs past int64 although the batch fits
    "record-offset-overflow": raw_batch(
        [(5, 0, b"k", b"v", None)], base_offset=INT64_MAX - 2, last_offset_delta=0
    ),
    # take_records: a record's timestamp delta runs past int64
    "record-timestamp-overflow": raw_batch(
        [(0, 2, b"k", b"v", None)],
        base_offset=1,
        last_offset_delta=0,
        first_timestamp=INT64_MAX - 1,
    ),
    # take_records: a batch whose next offset is below int64 (negative base offset and a
    # lying delta) is before any position, so it is skipped, not summed
    "next-offset-underflow": bytes(
        raw_batch([(0, 0, b"k", b"v", None)], base_offset=-(2**63), last_offset_delta=0)[:23]
    )
    + struct.pack(">i", -5)
    + raw_batch([(0, 0, b"k", b"v", None)], base_offset=-(2**63), last_offset_delta=0)[27:],
}

KAFKA: dict[str, bytes] = {
    # ListGroups v5 whose states_filter array claims 31,461,408,760 elements (a compact
    # array's count is a varint): kio's native reader allocated for it before reading and
    # the allocation failure aborted the process. Found by the kafka target in about 35 s
    # (4.2 million runs) on the decoder before it checked counts.
    "huge-array-count": bytes.fromhex("00100005000000010000" + "00f9fffb9975" + "7a7a"),
    # Not found by fuzzing: Kafka 4.4's limit of 1,000,000 elements an array
    # (logmq/net/limits.py). ListGroups v4 claiming 1,000,001 states in a few bytes ...
    "array-count-over-the-limit": bytes.fromhex("00100004000000010000" + "00c2843d") + b"\x01" * 8,
    # ... and holding them all, one empty string a byte: well formed, and refused
    "array-over-the-limit": bytes.fromhex("00100004000000010000" + "00c2843d")
    + b"\x01" * 1_000_001
    + b"\x00",
    # ApiVersions v3 whose header holds 10,001 unknown tagged fields (Kafka 4.4: 10,000)
    "tagged-fields-over-the-limit": bytes.fromhex("00120003000000010000" + "914e")
    + b"".join(uvarint(tag) + b"\x00" for tag in range(10_001))
    + b"\x02a\x021\x00",
}


def _native_request(body: bytes) -> bytes:
    """A native Metadata request frame (without its size prefix) around msgpack ``body``."""
    return struct.pack(">HHIH", 3, 0, 1, 0) + struct.pack(">I", len(body)) + body


NATIVE: dict[str, bytes] = {
    # Not found by fuzzing: the same 1,000,000 limit on msgpack bodies. A map whose
    # array claims 1,000,001 elements in a few bytes, and one holding them all (nils)
    "array-count-over-the-limit": _native_request(
        b"\x81\xa6topics\xdd" + struct.pack(">I", 1_000_001) + b"\xc0" * 8
    ),
    "array-over-the-limit": _native_request(
        b"\x81\xa6topics\xdd" + struct.pack(">I", 1_000_001) + b"\xc0" * 1_000_001
    ),
    "map-count-over-the-limit": _native_request(
        b"\x81\xa6topics\xdf" + struct.pack(">I", 1_000_001) + b"\xc0" * 8
    ),
}


def _snapshot(partition_epoch: int, leader_epoch: int, **change) -> bytes:
    """A remote-target input: a snapshot of a topic whose one partition then changes
    (first byte 1: remote_inputs.SELECTOR["snapshot"], as a test checks)."""
    records = [
        mr.TopicRecord("t", "tid"),
        mr.PartitionRecord("t", 0, (1, 2), (1, 2), 1, leader_epoch, partition_epoch),
        mr.PartitionChange("t", 0, **change),
    ]
    return b"\x01" + mr.encode_records(records)


REMOTE: dict[str, bytes] = {
    # MetadataImage.from_bytes accepted a partition at epoch 2^64 - 1 (msgpack's largest
    # integer) and a change bumping it, and the image's own snapshot then raised
    # OverflowError (so did every later snapshot of the quorum). Found by the hypothesis
    # property tests/fuzz/test_remote_parsers.py (a snapshot must snapshot again); epochs
    # are now Kafka's int32s, anything else a MetadataError.
    "partition-epoch-overflow": _snapshot(2**64 - 1, 0, isr=(1,)),
    "leader-epoch-overflow": _snapshot(0, 2**64 - 1, leader=2),
    # ... and the first epoch past int32 (2^31 - 1 bumped)
    "leader-epoch-past-int32": _snapshot(0, 2**31 - 1, leader=2),
}
