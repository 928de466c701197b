"""Record: a tuple subclass that must still behave like the documented record type."""

from __future__ import annotations

import copy
import pickle

import pytest

from logmq.client.fetcher import build_records
from logmq.records import Record


def test_fields_equality_and_repr():
    r = Record("t", 1, 5, 1000, b"k", b"v", [("h", b"x")])
    assert (r.topic, r.partition, r.offset, r.timestamp, r.key, r.value) == (
        "t", 1, 5, 1000, b"k", b"v",
    )  # fmt: skip
    assert r.headers == [("h", b"x")]
    assert r == Record("t", 1, 5, 1000, b"k", b"v", [("h", b"x")])
    assert r != Record("t", 1, 6, 1000, b"k", b"v", [("h", b"x")])
    assert r != tuple(r) and tuple(r) != r  # equal only to another Record
    assert repr(r) == (
        "Record(topic='t', partition=1, offset=5, timestamp=1000, key=b'k', value=b'v', "
        "headers=[('h', b'x')])"
    )
    assert pickle.loads(pickle.dumps(r)) == r and copy.copy(r) == r


def test_no_headers_reads_as_an_empty_list_and_hashes():
    a = Record("t", 0, 1, 2, None, b"v")
    assert a.headers == [] and a == Record("t", 0, 1, 2, None, b"v", [])
    assert hash(a) == hash(Record("t", 0, 1, 2, None, b"v", []))
    a.headers.append(("x", None))  # a fresh list each time: the record does not change
    assert a.headers == []


def test_read_only():
    r = Record("t", 0, 1, 2, None, b"v")
    with pytest.raises(AttributeError):
        r.value = b"other"  # type: ignore[misc]


def test_built_records_equal_constructed_ones_across_gaps_and_headers():
    rows = ((0, 0, b"k", b"v", None), (2, 7, None, None, (("h", b"x"),)))
    assert build_records("t", 3, 10, 100, rows) == [
        Record("t", 3, 10, 100, b"k", b"v"),
        Record("t", 3, 12, 107, None, None, [("h", b"x")]),
    ]
