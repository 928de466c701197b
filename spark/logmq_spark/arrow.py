"""The source's row schema, and fetched logmq batches turned into Arrow record batches.

Spark's Python data source accepts ``pyarrow.RecordBatch`` objects from ``read()`` and
hands them to the JVM as they are, so a column is built with one C-level call per
logmq batch (``pa.array`` over a ``map`` of the decoded rows, ``numpy`` for offsets
and timestamps) rather than a Python tuple per record: that is what makes the read
path fast. The Arrow schema must equal what Spark derives from ``SCHEMA`` exactly
(``to_arrow_schema(SCHEMA, timezone="UTC")``); a test holds the two together.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from operator import itemgetter

import numpy as np
import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from logmq.client.fetcher import FetchedBatch

HEADER_TYPE = StructType([StructField("key", StringType()), StructField("value", BinaryType())])

SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("headers", ArrayType(HEADER_TYPE)),
    ]
)

ARROW_HEADERS = pa.list_(
    pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())]))
)
ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("headers", ARROW_HEADERS),
    ]
)

_OFFSET_DELTA, _TS_DELTA, _KEY, _VALUE, _HEADERS = (itemgetter(i) for i in range(5))


def _offsets(b: FetchedBatch) -> np.ndarray:
    rows = b.rows
    n = len(rows)
    first = rows[0][0]
    if rows[-1][0] - first == n - 1:  # contiguous: every batch but compacted ones
        return np.arange(b.base_offset + first, b.base_offset + first + n, dtype=np.int64)
    return np.fromiter(map(_OFFSET_DELTA, rows), np.int64, n) + b.base_offset


def _timestamps_us(b: FetchedBatch) -> np.ndarray:
    rows = b.rows
    n = len(rows)
    if rows[0][1] == 0 and rows[-1][1] == 0 and not any(map(_TS_DELTA, rows)):
        return np.full(n, b.first_timestamp * 1000, dtype=np.int64)
    return (np.fromiter(map(_TS_DELTA, rows), np.int64, n) + b.first_timestamp) * 1000


def _headers(batches: Sequence[FetchedBatch], n: int) -> pa.Array:
    if not any(any(map(_HEADERS, b.rows)) for b in batches):
        return pa.nulls(n, ARROW_HEADERS)
    # Per record, but only for batches that carry headers at all.
    return pa.array(
        list(chain.from_iterable(map(_HEADERS, b.rows) for b in batches)), type=ARROW_HEADERS
    )


def to_record_batch(topic: str, partition: int, batches: Sequence[FetchedBatch]) -> pa.RecordBatch:
    """One Arrow record batch holding every row of ``batches`` (all of one partition)."""
    n = sum(len(b.rows) for b in batches)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
    keys = pa.array(list(chain.from_iterable(map(_KEY, b.rows) for b in batches)), pa.binary())
    values = pa.array(list(chain.from_iterable(map(_VALUE, b.rows) for b in batches)), pa.binary())
    nonempty = [b for b in batches if b.rows]
    offsets = np.concatenate([_offsets(b) for b in nonempty])
    stamps = np.concatenate([_timestamps_us(b) for b in nonempty])
    return pa.RecordBatch.from_arrays(
        [
            keys,
            values,
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.array(offsets, pa.int64()),
            pa.array(stamps, pa.timestamp("us", tz="UTC")),
            _headers(batches, n),
        ],
        schema=ARROW_SCHEMA,
    )
