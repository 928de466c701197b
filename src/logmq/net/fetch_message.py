"""The native protocol's Fetch message, both ends (sans-IO).

Consumers (client/fetcher.py) and followers (broker/replica/fetcher.py) send the same
request and read the same answer: a msgpack body listing each partition with its
``size``, and a tail holding those partitions' batches back to back, in body order
(docs/protocol.md). Building the body and slicing the tail live here once, with the
bounds checks a hostile or broken peer needs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from logmq.errors import CorruptRecordError, ErrorCode


def fetch_request(
    topics: Mapping[str, Sequence[dict[str, int]]],
    *,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    replica_id: int = -1,
    session_id: int = 0,
    session_epoch: int = -1,
    forgotten: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, Any]:
    """A Fetch body for ``{topic: [partition entries]}``; ``replica_id`` -1 is a consumer.

    ``session_id``/``session_epoch`` as in broker/replica/fetch_sessions.py (the defaults fetch
    without a session); ``forgotten`` lists partitions an incremental fetch drops.
    """
    body = {
        "replica_id": replica_id,
        "max_wait_ms": max_wait_ms,
        "min_bytes": min_bytes,
        "max_bytes": max_bytes,
        "isolation_level": 0,
        "session_id": session_id,
        "session_epoch": session_epoch,
        "topics": [{"topic": t, "partitions": list(ps)} for t, ps in topics.items()],
    }
    if forgotten:
        body["forgotten"] = [{"topic": t, "partitions": list(ps)} for t, ps in forgotten.items()]
    return body


class FetchedPartition(NamedTuple):
    """One partition of a Fetch answer; ``records`` is a view into the response tail.

    A tuple, not a frozen dataclass: an answer can carry 10,000 of these, and a frozen
    dataclass's ``__init__`` costs a call per field.
    """

    topic: str
    partition: int
    error: ErrorCode
    high_watermark: int
    log_start_offset: int
    records: memoryview


def fetched_partitions(body: dict[str, Any], tail: memoryview) -> Iterator[FetchedPartition]:
    """The answer's partitions in body order, each with its slice of the tail.

    Sizes that run past the tail raise CorruptRecordError; an error code this version
    does not know reads as UNKNOWN_SERVER_ERROR.
    """
    pos = 0
    end = len(tail)
    codes = _CODES
    unknown = ErrorCode.UNKNOWN_SERVER_ERROR
    for t in body.get("topics") or ():
        topic = t.get("topic")
        for p in t.get("partitions") or ():
            get = p.get
            size = get("size", 0) or 0
            if type(size) is not int or size < 0 or pos + size > end:
                raise CorruptRecordError(
                    f"fetch response tail too short for {topic}: {size} bytes at {pos} of {end}"
                )
            err = get("error", 0)
            code = codes.get(err, unknown) if type(err) is int else unknown
            yield FetchedPartition(
                topic,
                get("partition"),
                code,
                get("high_watermark", -1),
                get("log_start_offset", -1),
                tail[pos : pos + size],
            )
            pos += size


# Error codes by number: ErrorCode(n) costs an enum call per partition of an answer.
_CODES: dict[int, ErrorCode] = {int(c): c for c in ErrorCode}
