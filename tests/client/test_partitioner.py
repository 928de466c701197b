"""The producer's partitioners: Kafka's murmur2 (the default) and the old xxh3."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.client import partitioner as part
from logmq.client.producer import AsyncProducer

# Kafka's own test vectors (UtilsTest.testMurmur2), plus short keys for every tail length
KAFKA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
    b"1": -1993445489,
    b"12": 126087238,
    b"123": -267702483,
    b"1234": -1614185708,
    b"12345": -1188365604,
}


@pytest.mark.parametrize("murmur2", [part.murmur2, part.py_murmur2], ids=["default", "python"])
def test_murmur2_matches_kafkas_vectors(murmur2):
    for key, want in KAFKA_MURMUR2.items():
        assert murmur2(key) == want, key
        assert murmur2(bytearray(key)) == murmur2(memoryview(key)) == want


def test_the_compiled_murmur2_is_built():
    """setup.py builds it wherever there is a compiler (CI installs one)."""
    assert part.murmur2 is not part.py_murmur2


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80), st.integers(1, 10_000))
def test_compiled_and_python_agree_with_kafka_python(key, n):
    kafka_python = pytest.importorskip("kafka.partitioner.default")
    assert part.murmur2(key) == part.py_murmur2(key)
    want = (kafka_python.murmur2(key) & 0x7FFFFFFF) % n  # an independent implementation
    assert part.murmur2_partition(key, n) == part.py_murmur2_partition(key, n) == want


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="positive"):
        part.murmur2_partition(b"k", 0)
    with pytest.raises(TypeError):
        part.murmur2_partition("not bytes", 3)
    with pytest.raises(ValueError, match="partitioner must be one of"):
        part.partitioner("consistent_random")


def test_the_old_xxh3_partitioner_is_unchanged():
    # pinned: producers that chose partitioner="xxh3" keep placing keys where they did
    assert [part.xxh3_partition(k, 10) for k in (b"a", b"key", b"user-42")] == [9, 7, 1]


def test_the_producer_defaults_to_murmur2():
    assert AsyncProducer("127.0.0.1:1")._partition_for_key is part.murmur2_partition
    old = AsyncProducer("127.0.0.1:1", partitioner="xxh3")
    assert old._partition_for_key is part.xxh3_partition
