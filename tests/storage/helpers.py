"""Shared helpers for storage tests: build batches, commit appends, read a log back."""

from __future__ import annotations

from logmq.storage import batch as b
from logmq.storage.partition_log import PartitionLog


def make_batch(n: int = 3, *, ts: int = 1000, tag: int = 0, size: int = 20, **kw) -> bytes:
    """``n`` records whose values encode ``tag`` and their index, so reads can be checked."""
    values = [f"{tag}:{i}:".encode().ljust(size, b"x") for i in range(n)]
    return b.encode_values(values, timestamp=ts, **kw)


def commit(log: PartitionLog) -> None:
    """Commit everything appended, as the replica manager does for a single broker: appends
    alone never move the high watermark, and retention and cleaning only act below it."""
    log.high_watermark = log.log_end_offset


def read_all(log: PartitionLog, start: int | None = None) -> list[tuple[int, bytes]]:
    """Every (offset, value) from ``start`` to the log end, via FileSlices."""
    out: list[tuple[int, bytes]] = []
    offset = log.log_start_offset if start is None else start
    while offset < log.log_end_offset:
        sl = log.read(offset, 1 << 16)
        if sl is None:
            break
        data = sl.read()
        assert len(data) == sl.length
        for pos, h in b.iter_headers(data):
            b.validate(data, pos)
            for off, _ts, _k, v, _hd in b.decode_records(data, pos):
                if off >= offset:
                    out.append((off, v))
            offset = h.next_offset
        assert sl.end_offset == offset  # the slice says where the next read starts
    return out
