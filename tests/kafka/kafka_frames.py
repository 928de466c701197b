"""Kafka request frames for fuzzing: built from kio's schemas, then mutated as an
attacker would (bit flips, extreme int32s, truncation, lying lengths, 0x00/0xff runs).

Shared by the in-process decoder fuzz (test_frame_check.py), its subprocess driver
(fuzz_frames.py) and the live-broker fuzz (test_kafka_fuzz.py).
"""

from __future__ import annotations

import datetime
import io
import random
import struct
from functools import cache

from hypothesis import strategies as st
from kio.serial import entity_writer
from kio.static.primitive import Records

from logmq.kafka.codec import _request_class as request_class
from logmq.kafka.fetch_response import uvarint
from logmq.kafka.registry import SERVED


def _register_kio_types() -> None:
    """kio registers its types' strategies only when hypothesis is imported first, and
    logmq.kafka imports kio with hypothesis hidden (a broker's start-up cost)."""
    import kio.schema.types  # noqa: F401  (defines the nominal string and id types)
    from kio.static._phantom import Phantom

    todo = list(Phantom.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        try:
            cls.__hypothesis_hook__()
        except Exception:  # an abstract base with no bounds of its own
            continue
    st.register_type_strategy(Records, st.binary(max_size=64).map(Records))


_register_kio_types()

EXTREMES = (0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0x7FFF0000, 0x00FFFFFF)


@cache
def served() -> tuple[tuple[int, int, type], ...]:
    """Every (api key, version, request class) the Kafka door decodes."""
    out = []
    for api_key, (lo, hi) in sorted(SERVED.items()):
        for version in range(lo, hi + 1):
            try:
                out.append((api_key, version, request_class(api_key, version)))
            except Exception:  # kio has no schema for it: the codec refuses it too
                continue
    return tuple(out)


def encode_frame(api_key: int, version: int, body, corr: int = 7, client: str = "fuzz") -> bytes:
    """A request frame without its size prefix."""
    cls = request_class(api_key, version)
    header = cls.__header_schema__(
        request_api_key=api_key, request_api_version=version, correlation_id=corr, client_id=client
    )
    out = io.BytesIO()
    entity_writer(type(header))(out, header)
    entity_writer(cls)(out, body)
    return out.getvalue()


def produce_v9(topic: str, records: bytes, acks: int = -1, timeout_s: float = 10.0):
    """A Produce v9 request of ``records`` to partition 0 of ``topic``."""
    cls = request_class(0, 9)
    m = __import__(cls.__module__, fromlist=["x"])
    part = m.PartitionProduceData(index=0, records=records)
    return cls(
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=timeout_s),
        topic_data=(m.TopicProduceData(name=topic, partition_data=(part,)),),
    )


def list_groups_with_empty_states(n: int, corr: int = 7) -> bytes:
    """ListGroups v4 (flexible) whose states_filter holds ``n`` empty strings: one byte
    an element, so a million fit in a megabyte (without the size prefix)."""
    head = struct.pack(">hhih", 16, 4, corr, 1) + b"c" + b"\x00"  # header v2, no tags
    return head + uvarint(n + 1) + b"\x01" * n + b"\x00"


def describe_groups_with_empty_ids(n: int, corr: int = 7) -> bytes:
    """DescribeGroups v0 (int32 counts) whose groups are ``n`` empty strings, two bytes
    an element (without the size prefix)."""
    return struct.pack(">hhih", 15, 0, corr, 1) + b"c" + struct.pack(">i", n) + b"\x00\x00" * n


def api_versions_with_header_tags(n: int, corr: int = 7) -> bytes:
    """ApiVersions v3 whose request header carries ``n`` unknown, empty tagged fields."""
    tags = b"".join(uvarint(tag) + b"\x00" for tag in range(n))
    head = struct.pack(">hhih", 18, 3, corr, 1) + b"c" + uvarint(n) + tags
    return head + b"\x02a\x021\x00"  # client software name "a", version "1", no tags


def mutate(frame: bytes, rnd: random.Random, keep_header: int = 8) -> bytes:
    """One attacker's edit of ``frame``; the first ``keep_header`` bytes (api key,
    version, correlation id) are kept so the mutation reaches the body's decoder."""
    data = bytearray(frame)
    body = max(len(data) - keep_header, 0)
    kind = rnd.randrange(6)
    if body == 0 or kind == 0:  # append a run that claims to be a count or length
        data += bytes([rnd.choice((0x00, 0xFF, 0x7F))]) * rnd.randrange(1, 9)
    elif kind == 1:  # bit flips
        for _ in range(rnd.randrange(1, 4)):
            i = keep_header + rnd.randrange(body)
            data[i] ^= 1 << rnd.randrange(8)
    elif kind == 2:  # an int32 field set to an extreme
        i = keep_header + rnd.randrange(body)
        data[i : i + 4] = struct.pack(">I", rnd.choice(EXTREMES))
    elif kind == 3:  # truncation
        del data[keep_header + rnd.randrange(body) :]
    elif kind == 4:  # a run of 0x00 or 0xff over the body
        i = keep_header + rnd.randrange(body)
        n = rnd.randrange(1, 9)
        data[i : i + n] = bytes([rnd.choice((0x00, 0xFF))]) * n
    else:  # a varint that lies: a huge compact length or count
        i = keep_header + rnd.randrange(body)
        data[i:i] = b"\xff\xff\xff\xff\x0f"
    return bytes(data)


def example_frames(rnd: random.Random, per_request: int) -> list[bytes]:
    """``per_request`` hypothesis-built frames of every served request type."""
    frames = []
    for api_key, version, cls in served():
        strategy = st.from_type(cls)
        for _ in range(per_request):
            body = strategy.example()
            frames.append(encode_frame(api_key, version, body, corr=rnd.randrange(1 << 31)))
    return frames
