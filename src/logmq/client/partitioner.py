"""Which partition a keyed record goes to.

The default is Kafka's Java client's (``murmur2``): ``toPositive(murmur2(key)) % n``, with
Kafka's murmur2 (seed 0x9747b28c). kafka-python and aiokafka hash the same way, and
librdkafka does with ``partitioner=murmur2_random``, so a key lands on the same partition
whichever of these clients produced it: what a consumer relying on per-key order across
producers, or a join of two topics partitioned by one key, needs.

``xxh3`` (xxh3-64 of the key modulo the count) was this client's rule before; it is kept
for producers that must go on placing keys where they used to.
docs/kafka-compatibility.md lists each client's default.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import xxhash

Partitioner = Callable[[bytes, int], int]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_U32 = 0xFFFFFFFF
_WORDS = struct.Struct("<I").iter_unpack


def _murmur2_u32(data: bytes) -> int:
    """Kafka's murmur2 as an unsigned 32-bit int (the reference for _murmur2.c)."""
    n = len(data)
    h = _SEED ^ n
    end = n & ~3
    for (k,) in _WORDS(memoryview(data)[:end]):  # little-endian 32-bit words
        k = (k * _M) & _U32
        k ^= k >> 24
        h = ((h * _M) & _U32) ^ ((k * _M) & _U32)
    rest = n & 3
    if rest:
        if rest == 3:
            h ^= data[end + 2] << 16
        if rest >= 2:
            h ^= data[end + 1] << 8
        h = ((h ^ data[end]) * _M) & _U32
    h ^= h >> 13
    h = (h * _M) & _U32
    return h ^ (h >> 15)


def py_murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` of ``data``, as the signed 32-bit int Java returns."""
    h = _murmur2_u32(data)
    return h - (1 << 32) if h & 0x80000000 else h


def py_murmur2_partition(key: bytes, num_partitions: int) -> int:
    """Kafka's default for a keyed record: ``toPositive(murmur2(key)) % num_partitions``."""
    return (_murmur2_u32(key) & 0x7FFFFFFF) % num_partitions


try:  # compiled (setup.py): about 4 us a key less than the Python above
    from logmq.client._murmur2 import murmur2, murmur2_partition
except ImportError:  # no compiler at install time: same results, slower
    murmur2, murmur2_partition = py_murmur2, py_murmur2_partition


def xxh3_partition(key: bytes, num_partitions: int) -> int:
    """logmq's rule before murmur2 became the default: xxh3-64 of the key, modulo."""
    return xxhash.xxh3_64_intdigest(key) % num_partitions


PARTITIONERS: dict[str, Partitioner] = {"murmur2": murmur2_partition, "xxh3": xxh3_partition}


def partitioner(name: str) -> Partitioner:
    """The partitioner called ``name``; a clear ValueError for an unknown one."""
    try:
        return PARTITIONERS[name]
    except KeyError:
        known = ", ".join(repr(n) for n in PARTITIONERS)
        raise ValueError(f"partitioner must be one of {known}, not {name!r}") from None
