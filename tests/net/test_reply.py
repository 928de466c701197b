"""Reply tails, sans-IO: which parts are file regions, and how many bytes a tail sends."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import pytest

from logmq.net.reply import FileRegion, Reply, is_region, tail_size
from logmq.storage.segment import FileSlice


@dataclass
class OtherRegion:
    """Any class with FileRegion's members is one: the protocol is structural."""

    file: Any
    position: int
    length: int

    def read(self) -> bytes:
        return b""


def test_storage_file_slice_is_a_file_region():
    region = FileSlice(io.BytesIO(), 3, 10)
    assert isinstance(region, FileRegion)
    assert is_region(region)


@pytest.mark.parametrize("part", [b"x", bytearray(b"x"), memoryview(b"x")])
def test_bytes_are_not_regions(part):
    assert not is_region(part)


def test_structural_regions_and_bytes_subclasses():
    class Bytes2(bytes):
        pass

    assert is_region(OtherRegion(None, 0, 1))
    assert not is_region(Bytes2(b"ab"))
    assert tail_size([Bytes2(b"ab"), OtherRegion(None, 0, 7)]) == (9, True)


def test_anything_else_is_refused():
    with pytest.raises(TypeError):
        is_region("text")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        tail_size([b"ok", 42])  # type: ignore[list-item]


def test_tail_size_counts_interleaved_parts():
    tail = [b"ab", FileSlice(None, 0, 100), bytearray(3), FileSlice(None, 9, 5), memoryview(b"z")]
    assert tail_size(tail) == (2 + 100 + 3 + 5 + 1, True)
    assert tail_size([b"ab", memoryview(b"cd")]) == (4, False)
    assert tail_size(()) == (0, False)
    assert Reply({}).tail == ()
