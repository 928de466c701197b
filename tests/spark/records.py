"""Producing test records and reading them back, as comparable ``{(partition, offset): ...}``."""

from __future__ import annotations

from typing import Any

from logmq import Consumer, Producer

Expected = dict[tuple[int, int], tuple[bytes | None, bytes | None, tuple | None]]


def headers_for(i: int, every: int) -> list[tuple[str, bytes | None]] | None:
    if every and i % every == 0:
        return [("seq", str(i).encode()), ("empty", None)]
    return None


def produce(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    first: int = 0,
    headers_every: int = 0,
    timestamp: int | None = None,
    value_size: int = 0,
    **producer: Any,
) -> Expected:
    """Send ``count`` keyed records; returns what the broker acknowledged, by position."""
    pending = []
    with Producer(bootstrap, acks="all", **producer) as p:
        for i in range(first, first + count):
            key = f"key-{i}".encode()
            value = f"value-{i}".encode().ljust(value_size, b".")
            headers = headers_for(i, headers_every)
            fut = p.send(topic, value, key=key, headers=headers, timestamp=timestamp)
            pending.append((key, value, headers, fut))
        p.flush()
    out: Expected = {}
    for key, value, headers, fut in pending:
        md = fut.result(30)
        out[(md.partition, md.offset)] = (key, value, tuple(headers) if headers else None)
    return out


def from_rows(rows: list[Any]) -> Expected:
    """Spark rows of the logmq schema, keyed like ``produce``'s result."""
    out: Expected = {}
    for r in rows:
        headers = tuple((h.key, h.value) for h in r.headers) if r.headers is not None else None
        out[(r.partition, r.offset)] = (r.key, r.value, headers)
    return out


def consume_all(bootstrap: str, topic: str, partitions: int) -> list[Any]:
    """Every record of ``topic`` now, read with the plain client."""
    with Consumer(bootstrap, auto_offset_reset="earliest") as c:
        tps = [(topic, p) for p in range(partitions)]
        c.assign(tps)
        ends = c.end_offsets(tps)
        c.seek_to_beginning()
        records: list[Any] = []
        want = sum(ends.values())
        while len(records) < want:
            got = c.poll(timeout=5.0)
            assert got, f"read {len(records)} of {want} records of {topic}"
            records.extend(got)
        return records
