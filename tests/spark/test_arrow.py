"""Fetched batches to Arrow: the same records the client's Record path gives, and the exact
Arrow schema Spark expects."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from logmq.client.fetcher import FetchedBatch, build_records
from logmq_spark.arrow import ARROW_SCHEMA, SCHEMA, to_record_batch


def test_arrow_schema_is_what_spark_derives() -> None:
    assert to_arrow_schema(SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)


def batch(base: int, ts: int, rows: list[tuple]) -> FetchedBatch:
    last = base + rows[-1][0] + 1
    return FetchedBatch("clicks", 3, base, ts, tuple(rows), last)


def test_rows_match_the_record_path() -> None:
    batches = [
        batch(0, 1_700_000_000_000, [(0, 0, b"k0", b"v0", None), (1, 0, None, b"v1", None)]),
        # a compacted batch (a gap in offsets) with timestamp deltas and headers
        batch(
            10,
            1_700_000_000_500,
            [(0, 0, b"k", None, (("h", b"x"), ("n", None))), (3, 7, b"k3", b"v3", None)],
        ),
    ]
    rb = to_record_batch("clicks", 3, batches)
    assert rb.schema.equals(ARROW_SCHEMA)
    got = rb.to_pylist()
    want = [
        r
        for b in batches
        for r in build_records(b.topic, b.partition, b.base_offset, b.first_timestamp, b.rows)
    ]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert (g["topic"], g["partition"], g["offset"]) == (w.topic, w.partition, w.offset)
        assert (g["key"], g["value"]) == (w.key, w.value)
        assert int(g["timestamp"].timestamp() * 1000) == w.timestamp
        want_headers = [{"key": k, "value": v} for k, v in w.headers] or None
        assert g["headers"] == want_headers


def test_empty() -> None:
    assert to_record_batch("t", 0, []).num_rows == 0
    assert isinstance(to_record_batch("t", 0, []), pa.RecordBatch)
