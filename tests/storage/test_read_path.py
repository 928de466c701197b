"""The per-fetch read path: sequential readers reuse where the last read stopped."""

from __future__ import annotations

import os

from logmq.storage import batch as b
from logmq.storage.config import LogConfig
from logmq.storage.partition_log import PartitionLog

from .helpers import make_batch, read_all

CFG = LogConfig.from_dict({"index.interval.bytes": "256"})


def count_header_preads(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = os.pread

    def pread(fd, n, pos):
        if n == b.HEADER_SIZE:
            calls.append(pos)
        return real(fd, n, pos)

    monkeypatch.setattr(os, "pread", pread)
    return calls


def test_sequential_reads_need_no_header_lookups(tmp_path, monkeypatch):
    log = PartitionLog(tmp_path / "t-0", CFG)
    for i in range(20):
        log.append(make_batch(5, tag=i, size=100))
    batch_size = len(make_batch(5, size=100))
    calls = count_header_preads(monkeypatch)
    first = log.read(0, 3 * batch_size)  # 3 whole batches; the 4th header says "stop"
    assert first is not None and first.end_offset == 15
    calls.clear()
    second = log.read(first.end_offset, 3 * batch_size)
    assert second is not None and second.position == first.position + first.length
    assert calls == [second.position + second.length]  # only where this read stops
    monkeypatch.undo()
    assert [o for o, _ in read_all(log)] == list(range(100))
    log.close()


def test_caught_up_reader_continues_at_the_segment_end(tmp_path, monkeypatch):
    log = PartitionLog(tmp_path / "t-0", CFG)
    log.append(make_batch(3, tag=1))
    tail = log.read(0, 1 << 20)
    assert tail is not None and tail.end_offset == 3 == log.log_end_offset
    log.append(make_batch(4, tag=2))  # the consumer was woken by this append
    calls = count_header_preads(monkeypatch)
    nxt = log.read(3, 1 << 20)
    assert nxt is not None and nxt.position == tail.length and nxt.end_offset == 7
    assert calls == [tail.length]  # one header read at the remembered position
    monkeypatch.undo()
    assert read_all(log, 3) == read_all(log)[3:]
    log.close()


def test_remembered_positions_do_not_survive_truncation(tmp_path):
    log = PartitionLog(tmp_path / "t-0", CFG)
    for i in range(4):
        log.append(make_batch(2, tag=i))
    assert log.read(0, 1 << 20).end_offset == 8
    log.truncate_to(4)
    log.append(make_batch(6, tag=9))  # different batch boundaries from offset 4 on
    got = read_all(log, 4)
    assert [o for o, _ in got] == list(range(4, 10))
    assert all(v.startswith(b"9:") for _, v in got)
    log.close()
