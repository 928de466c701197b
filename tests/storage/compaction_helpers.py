"""Helpers shared by the compaction tests: keyed batches, reading records, crashes."""

from __future__ import annotations

import os

from logmq.storage import batch as b
from logmq.storage.partition_log import PartitionLog

COMPACT = {
    "cleanup.policy": "compact",
    "segment.bytes": "1024",
    "index.interval.bytes": "128",
    "file.delete.delay.ms": "0",
    "delete.retention.ms": "1000",
}
T0 = 1_000_000
ALL = 1 << 62  # a high watermark at the log end offset, whatever it is


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def kbatch(records, *, ts: int = T0, **kw) -> bytes:
    """One batch of ``(key, value)`` records, all stamped ``ts``."""
    return b.encode_batch([(ts, k, v, None) for k, v in records], **kw)


def read_records(plog: PartitionLog, start: int | None = None) -> list[tuple]:
    """Every ``(offset, timestamp, key, value)`` from ``start``, checksums verified."""
    out: list[tuple] = []
    offset = plog.log_start_offset if start is None else start
    while offset < plog.log_end_offset:
        sl = plog.read(offset, 1 << 16)
        if sl is None:
            break
        data = sl.read()
        for pos, h in b.iter_headers(data):
            b.validate(data, pos, contiguous=False)
            for off, ts, k, v, _ in b.decode_records(data, pos):
                if off >= offset:
                    out.append((off, ts, k, v))
            offset = h.next_offset
    return out


def newest(history: list[tuple]) -> dict:
    """Key -> its newest (offset, timestamp, key, value) record."""
    out = {}
    for rec in history:
        out[rec[2]] = rec
    return out


class SimulatedCrash(BaseException):
    """The process dies here: nothing after it touches the disk."""


class CrashAfter:
    """Patch the file operations a cleaning makes; the ``n``-th one crashes, and so do all
    later ones (no cleanup code runs in a dead process)."""

    OPS = ("replace", "rename", "unlink", "writev")  # writes to .cleaned files and renames

    def __init__(self, monkeypatch, n: int) -> None:
        self.n, self.count, self.crashed = n, 0, False
        for name in self.OPS:
            monkeypatch.setattr(os, name, self._wrap(getattr(os, name)))

    def _wrap(self, fn):
        def op(*args, **kwargs):
            if self.crashed or self.count == self.n:
                self.crashed = True
                raise SimulatedCrash(fn.__name__)
            self.count += 1
            return fn(*args, **kwargs)

        return op
