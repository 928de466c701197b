"""Proof that fetched record bytes go file -> socket without entering Python.

In-process broker; every way the broker could read a segment into a Python object
(FileSlice.read, os.preadv, and os.pread/os.read of more than a 61-byte batch header,
which the storage reads to find batch boundaries) is patched to fail for the duration
of the fetches, and os.sendfile is wrapped to count bytes. The client (in
this same process) must still receive exactly the produced batches, and the counted
sendfile bytes must equal the record bytes of the responses. The batches are large, so
every response takes the sendfile path (small ones are read and written instead).
"""

from __future__ import annotations

import os

import pytest

from logmq.net.server import SENDFILE_MIN_BYTES
from logmq.storage import batch as b
from logmq.storage import segment
from tests.harness import inprocess_broker
from tests.net.raw_client import RawClient


def forbid(name):
    def fail(*args, **kwargs):
        raise AssertionError(f"{name} called on the zero-copy fetch path")

    return fail


def headers_only(name, real):
    """Let the storage read batch headers (to find batch boundaries), nothing larger."""

    def read(fd, n, *rest):
        if n > b.HEADER_SIZE:
            raise AssertionError(f"{name} of {n} bytes on the zero-copy fetch path")
        return real(fd, n, *rest)

    return read


@pytest.mark.parametrize("zero_copy", [True, False])
async def test_fetch_bytes_never_pass_through_python(
    tmp_path, monkeypatch, sendfile_calls, zero_copy
):
    marker = os.urandom(16).hex().encode()
    batches = [
        b.encode_values([marker + b"-%d-%d" % (i, j) + b"x" * 200 for j in range(500)], timestamp=i)
        for i in range(8)
    ]
    assert min(map(len, batches)) >= SENDFILE_MIN_BYTES  # every response is a large one
    expected = b"".join(batches)
    async with inprocess_broker(tmp_path / "d", zero_copy=zero_copy) as br:  # noqa: SIM117
        async with await RawClient.connect(br.port) as c:
            await c.create_topic("zc", 1)
            for data in batches:
                assert (await c.produce("zc", 0, data))["error"] == 0

            sent = sendfile_calls  # the produce above sent nothing by sendfile
            if zero_copy:
                monkeypatch.setattr(segment.FileSlice, "read", forbid("FileSlice.read"))
                monkeypatch.setattr(os, "pread", headers_only("os.pread", os.pread))
                monkeypatch.setattr(os, "read", headers_only("os.read", os.read))
                monkeypatch.setattr(os, "preadv", forbid("os.preadv"))
            got = b""
            offset = 0
            while offset < 8 * 500:
                meta, data = await c.fetch("zc", 0, offset, partition_max_bytes=1 << 20)
                assert meta["error"] == 0
                got += data
                offset = list(b.iter_headers(data))[-1][1].next_offset
            monkeypatch.undo()
    # stamped offsets differ from what the client sent; compare from the epoch on
    stored = bytearray(expected)
    off = 0
    for pos, h in b.iter_headers(expected):
        b.stamp(stored, pos, off, 0)
        off += h.record_count
    assert got == bytes(stored)
    if zero_copy:
        assert sum(sent) == len(got)
    else:
        assert sent == []


async def test_small_fetch_responses_skip_sendfile(tmp_path, monkeypatch):
    """Under SENDFILE_MIN_BYTES a response is read and written in one go: same bytes."""
    small = b.encode_values([b"v%d" % i for i in range(10)], timestamp=1)
    assert len(small) < SENDFILE_MIN_BYTES
    async with inprocess_broker(tmp_path / "d", zero_copy=True) as br:  # noqa: SIM117
        async with await RawClient.connect(br.port) as c:
            await c.create_topic("small", 1)
            assert (await c.produce("small", 0, small))["error"] == 0
            sent: list[int] = []
            real_sendfile = os.sendfile

            def counting_sendfile(out_fd, in_fd, offset, count):
                sent.append(count)
                return real_sendfile(out_fd, in_fd, offset, count)

            monkeypatch.setattr(os, "sendfile", counting_sendfile)
            meta, data = await c.fetch("small", 0, 0, partition_max_bytes=1 << 20)
            monkeypatch.undo()
    assert meta["error"] == 0 and sent == []
    stored = bytearray(small)
    b.stamp(stored, 0, 0, 0)
    assert data == bytes(stored)
