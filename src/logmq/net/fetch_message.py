"""The native protocol's Fetch message, both ends (sans-IO).

Consumers (client/fetcher.py) and followers (broker/replica_fetcher.py) send the same
request and read the same answer: a msgpack body listing each partition with its
``size``, and a tail holding those partitions' batches back to back, in body order
(docs/protocol.md). Building the body and slicing the tail live here once, with the
bounds checks a hostile or broken peer needs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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

    ``session_id``/``session_epoch`` as in broker/fetch_sessions.py (the defaults fetch
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


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    """One partition of a Fetch answer; ``records`` is a view into the response tail."""

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
    for t in body.get("topics") or ():
        topic = t.get("topic")
        for p in t.get("partitions") or ():
            size = p.get("size", 0) or 0
            if not isinstance(size, int) or size < 0 or pos + size > end:
                raise CorruptRecordError(
                    f"fetch response tail too short for {topic}: {size} bytes at {pos} of {end}"
                )
            try:
                code = ErrorCode(p.get("error", 0))
            except ValueError:
                code = ErrorCode.UNKNOWN_SERVER_ERROR
            yield FetchedPartition(
                topic,
                p.get("partition"),
                code,
                p.get("high_watermark", -1),
                p.get("log_start_offset", -1),
                tail[pos : pos + size],
            )
            pos += size
