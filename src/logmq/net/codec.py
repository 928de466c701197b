"""Sans-IO protocol codec: messages to frames and frames to messages; no sockets, no clocks.

Every frame is ``u32 size`` followed by ``size`` bytes; splitting a byte stream into
frames is frame_reader.py's job (one reader, one size check). A request frame carries a
fixed header, a msgpack body and a raw tail; a response frame carries the correlation id,
a msgpack body and a raw tail. Record batches travel in the tail as raw bytes: the body
says how long each slice is (``"size"`` fields, in body order), so the broker never
re-encodes records and can ``sendfile`` a fetch tail. docs/protocol.md is the spec.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import msgpack

from logmq.errors import InvalidFrameError
from logmq.gcpause import gc_paused
from logmq.net.limits import MAX_ARRAY_ELEMENTS, MAX_BODY_ITEMS

SIZE = struct.Struct(">I")
# api_key u16, api_version u16, correlation_id u32, client_id_len u16
REQUEST_HEADER = struct.Struct(">HHIH")
BODY_LEN = struct.Struct(">I")
# correlation_id u32, body_len u32
RESPONSE_HEADER = struct.Struct(">II")

DEFAULT_MAX_FRAME_SIZE = 100 * 1024 * 1024


class ApiKey(IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    ADD_PARTITIONS_TO_TXN = 24  # a producer's, or verify_only from a partition leader: txn_api
    ADD_OFFSETS_TO_TXN = 25  # a transactional producer's (native/txn_api.py)
    END_TXN = 26  # a transactional producer's (native/txn_api.py)
    WRITE_TXN_MARKERS = 27  # coordinator -> partition leader (broker/coordinator/txn_markers.py)
    TXN_OFFSET_COMMIT = 28  # to the group coordinator (native/group_api.py)
    OFFSET_FOR_LEADER_EPOCH = 23
    SASL_HANDSHAKE = 17  # native/sasl_api.py: the Kafka exchange in msgpack bodies
    DESCRIBE_ACLS = 29  # native/security_api.py, from the local image
    CREATE_ACLS = 30  # controller API (native/security_api.py)
    DELETE_ACLS = 31  # controller API (native/security_api.py)
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35  # a broker about its own logs (native/reassignment_api.py)
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43  # controller API (native/reassignment_api.py)
    INCREMENTAL_ALTER_CONFIGS = 44  # the Kafka door's (kafka/configs.py)
    ALTER_PARTITION_REASSIGNMENTS = 45  # controller API (native/reassignment_api.py)
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48  # native/security_api.py, from the local image
    ALTER_CLIENT_QUOTAS = 49  # controller API (native/security_api.py)
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50  # native/security_api.py, from the local image
    ALTER_USER_SCRAM_CREDENTIALS = 51  # controller API (native/security_api.py)
    DESCRIBE_QUORUM = 55
    ALTER_PARTITION = 56  # partition leader -> controller: ISR changes (cluster_api)
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61  # a partition leader's producers (native/txn_api.py)
    BROKER_REGISTRATION = 62  # broker -> controller (cluster_api)
    BROKER_HEARTBEAT = 63  # broker -> controller (cluster_api)
    DESCRIBE_TRANSACTIONS = 65  # the coordinator's view of ids (native/txn_api.py)
    LIST_TRANSACTIONS = 66  # this broker's coordinated ids (native/txn_api.py)
    ALLOCATE_PRODUCER_IDS = 67  # broker -> controller (cluster_api)
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    # logmq's own, above Kafka's keys (the Kafka door never serves them)
    ALTER_REMOTE_SEGMENTS = 1000  # partition leader -> controller: remote tier (cluster_api)
    DESCRIBE_REMOTE_TIER = 1001  # a broker's remote tier status (native/remote_tier_api.py)


@dataclass(slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str
    body: dict[str, Any]
    tail: memoryview  # raw bytes after the body (record batches), possibly empty
    client_host: str = ""  # the peer's address, filled in by the server (not on the wire)
    context: Any = None  # the connection's ConnectionContext (net/pipeline.py), likewise


@dataclass(slots=True)
class Response:
    correlation_id: int
    body: dict[str, Any]
    tail: memoryview


# A body at least this big is decoded with the cyclic GC paused.
BULK_BODY = 64 * 1024


class _ItemBudget:
    """Counts a body's arrays, maps and their elements as msgpack builds them, and stops
    the decode past MAX_BODY_ITEMS (msgpack hands each container over as it completes,
    so no more than one array past the budget is ever built)."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_BODY_ITEMS

    def _spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise _TooManyItems(f"over {MAX_BODY_ITEMS:,} arrays, maps and elements in one body")

    def list(self, items: list) -> list:
        self._spend(len(items) + 1)
        return items

    def map(self, entries: dict) -> dict:
        self._spend(len(entries) + 1)
        return entries


class _TooManyItems(InvalidFrameError):
    """Raised from inside msgpack's hooks (so it stops the decode there)."""


_LIMITS = {
    "raw": False,
    "strict_map_key": False,
    "max_array_len": MAX_ARRAY_ELEMENTS,
    "max_map_len": MAX_ARRAY_ELEMENTS,
}


def _unpackb(data: Any) -> Any:
    """A body under BULK_BODY bytes builds at most that many containers (a few MB): only
    bigger ones pay for counting them (a hook call per array and map)."""
    if len(data) < BULK_BODY:
        return msgpack.unpackb(data, **_LIMITS)
    budget = _ItemBudget()
    return msgpack.unpackb(data, **_LIMITS, list_hook=budget.list, object_hook=budget.map)


def pack_body(body: Any) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def unpack_body(data: Any) -> dict[str, Any]:
    """A msgpack body; no array or map in it may hold more than MAX_ARRAY_ELEMENTS (msgpack
    checks each count before allocating, however many bytes follow), nor all of them
    together more than MAX_BODY_ITEMS (net/limits.py)."""
    try:
        if len(data) < BULK_BODY:
            body = _unpackb(data)
        else:  # e.g. thousands of partitions' entries (gcpause.py)
            with gc_paused():
                body = _unpackb(data)
    except _TooManyItems as e:
        raise InvalidFrameError(f"msgpack body refused: {e}") from None
    except ValueError as e:
        if "exceeds max_" in str(e):  # msgpack's words: "N exceeds max_array_len(M)"
            raise InvalidFrameError(
                f"msgpack body refused: {e} (at most {MAX_ARRAY_ELEMENTS:,} elements in an "
                "array or entries in a map)"
            ) from None
        raise InvalidFrameError(f"undecodable msgpack body: {e}") from None
    except Exception as e:  # msgpack raises several unrelated types on bad input
        raise InvalidFrameError(f"undecodable msgpack body: {e}") from None
    if not isinstance(body, dict):
        raise InvalidFrameError(f"body must be a map, got {type(body).__name__}")
    return body


def encode_request(
    api_key: int,
    api_version: int,
    correlation_id: int,
    client_id: str,
    body: dict[str, Any],
    tail: Iterable[bytes | memoryview] = (),
) -> list[bytes | memoryview]:
    """Frame a request as a list of buffers for ``transport.writelines``."""
    cid = client_id.encode()
    packed = pack_body(body)
    parts = list(tail)
    tail_len = sum(len(p) for p in parts)
    size = REQUEST_HEADER.size + len(cid) + BODY_LEN.size + len(packed) + tail_len
    head = (
        SIZE.pack(size)
        + REQUEST_HEADER.pack(api_key, api_version, correlation_id & 0xFFFFFFFF, len(cid))
        + cid
        + BODY_LEN.pack(len(packed))
        + packed
    )
    return [head, *parts]


def decode_request(frame: memoryview | bytes) -> Request:
    """Parse one request frame (without its size prefix)."""
    mv = memoryview(frame)
    if len(mv) < REQUEST_HEADER.size + BODY_LEN.size:
        raise InvalidFrameError(f"request frame too short: {len(mv)} bytes")
    api_key, api_version, corr, cid_len = REQUEST_HEADER.unpack_from(mv, 0)
    pos = REQUEST_HEADER.size
    if pos + cid_len + BODY_LEN.size > len(mv):
        raise InvalidFrameError("client id runs past the frame")
    try:
        client_id = bytes(mv[pos : pos + cid_len]).decode()
    except UnicodeDecodeError:
        raise InvalidFrameError("client id is not UTF-8") from None
    pos += cid_len
    (body_len,) = BODY_LEN.unpack_from(mv, pos)
    pos += BODY_LEN.size
    if pos + body_len > len(mv):
        raise InvalidFrameError("body runs past the frame")
    body = unpack_body(mv[pos : pos + body_len])
    return Request(api_key, api_version, corr, client_id, body, mv[pos + body_len :])


def peek_correlation_id(frame: memoryview | bytes) -> int | None:
    """Correlation id of a request frame even when the rest is garbage."""
    if len(frame) >= REQUEST_HEADER.size:
        return REQUEST_HEADER.unpack_from(frame, 0)[2]
    return None


def encode_response_head(correlation_id: int, body: dict[str, Any], tail_len: int = 0) -> bytes:
    """Size prefix, header and body of a response whose ``tail_len`` tail bytes follow.

    The server writes this, then the tail (for fetches, straight from the segment file).
    """
    packed = pack_body(body)
    size = RESPONSE_HEADER.size + len(packed) + tail_len
    return SIZE.pack(size) + RESPONSE_HEADER.pack(correlation_id & 0xFFFFFFFF, len(packed)) + packed


def encode_response(
    correlation_id: int, body: dict[str, Any], tail: Iterable[bytes | memoryview] = ()
) -> list[bytes | memoryview]:
    parts = list(tail)
    return [encode_response_head(correlation_id, body, sum(len(p) for p in parts)), *parts]


def decode_response(frame: memoryview | bytes) -> Response:
    mv = memoryview(frame)
    if len(mv) < RESPONSE_HEADER.size:
        raise InvalidFrameError(f"response frame too short: {len(mv)} bytes")
    corr, body_len = RESPONSE_HEADER.unpack_from(mv, 0)
    pos = RESPONSE_HEADER.size
    if pos + body_len > len(mv):
        raise InvalidFrameError("body runs past the frame")
    body = unpack_body(mv[pos : pos + body_len])
    return Response(corr, body, mv[pos + body_len :])
