"""Crash recovery: cut and corrupt segment files, reopen, check what is served."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logmq.storage import batch as b
from logmq.storage.config import LogConfig
from logmq.storage.partition_log import PartitionLog

from .helpers import make_batch, read_all

CFG = LogConfig.from_dict(
    {"segment.bytes": "3000", "index.interval.bytes": "200", "segment.index.bytes": "2048"}
)
LEADER_EPOCH = range(b.LEADER_EPOCH_POS, b.MAGIC_POS)


def build(path, n_batches: int, seed: int) -> tuple[PartitionLog, list[tuple[int, bytes]]]:
    rng = random.Random(seed)
    log = PartitionLog(path, CFG)
    for i in range(n_batches):
        log.append(make_batch(rng.randint(1, 4), tag=i, size=rng.randint(5, 200)))
    expected = read_all(log)
    log.close_handles()  # crash: no clean marker, no snapshot
    return log, expected


def batch_at(log: PartitionLog, seg_index: int, position: int) -> tuple[int, int]:
    """(base offset, start position) of the batch covering ``position`` in a segment."""
    seg = log.segments[seg_index]
    data = seg.log_path.read_bytes()
    for pos, h in b.iter_headers(data):
        if pos <= position < pos + h.size:
            return h.base_offset, pos
    raise AssertionError("position outside every batch")


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32), data=st.data())
def test_cut_at_any_byte(tmp_path_factory, no_fsync, seed, data):
    path = tmp_path_factory.mktemp("cut") / "t-0"
    log, expected = build(path, 40, seed)
    i = data.draw(st.integers(0, len(log.segments) - 1), label="segment")
    seg = log.segments[i]
    cut = data.draw(st.integers(0, seg.size), label="cut")
    # The offset of the first byte lost: everything before it must survive.
    lost = batch_at(log, i, cut)[0] if cut < seg.size else seg.next_offset
    with open(seg.log_path, "r+b") as f:
        f.truncate(cut)
    reopened = PartitionLog(path, CFG, clean_shutdown=False, recovery_point=0)
    got = read_all(reopened)
    if cut == seg.size:
        assert got == expected  # nothing was lost
    else:
        assert got == [r for r in expected if r[0] < lost]  # nothing after the damage
    reopened.append(make_batch(2, tag=999))  # and it stays appendable
    assert read_all(reopened)[-1][1].startswith(b"999:1:")


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32), data=st.data())
def test_flip_any_byte(tmp_path_factory, no_fsync, seed, data):
    path = tmp_path_factory.mktemp("flip") / "t-0"
    log, expected = build(path, 40, seed)
    i = data.draw(st.integers(0, len(log.segments) - 1), label="segment")
    seg = log.segments[i]
    position = data.draw(st.integers(0, seg.size - 1), label="position")
    base, start = batch_at(log, i, position)
    if position - start in LEADER_EPOCH:
        position = start + b.MAGIC_POS  # epochs are not checksummed; see docs/format.md
    bit = data.draw(st.integers(0, 7), label="bit")
    raw = bytearray(seg.log_path.read_bytes())
    raw[position] ^= 1 << bit
    seg.log_path.write_bytes(raw)
    reopened = PartitionLog(path, CFG, clean_shutdown=False, recovery_point=0)
    got = read_all(reopened)
    assert got == [r for r in expected if r[0] < base]
    assert reopened.log_end_offset == base and reopened.cut_bytes > 0


def test_recovery_only_scans_after_recovery_point(tmp_path):
    log, expected = build(tmp_path / "t-0", 60, 1)
    first = log.segments[0]
    raw = bytearray(first.log_path.read_bytes())
    raw[100] ^= 0xFF  # damage before the recovery point: not re-validated at open
    first.log_path.write_bytes(raw)
    rp = log.segments[-2].base_offset
    reopened = PartitionLog(tmp_path / "t-0", CFG, clean_shutdown=False, recovery_point=rp)
    assert reopened.log_end_offset == expected[-1][0] + 1 and reopened.cut_bytes == 0
    # ...but the first read of that old range checksums it and refuses the bad batch.
    assert reopened.segments[0].verified.starts == []
    with pytest.raises(Exception, match="corrupt batch"):
        read_all(reopened)


def test_clean_open_does_not_scan(tmp_path, monkeypatch):
    log = PartitionLog(tmp_path / "t-0", CFG)
    for i in range(200):
        log.append(make_batch(2, tag=i))
    log.close()
    calls = []
    monkeypatch.setattr(b, "validate", lambda *a, **k: calls.append(a))
    reopened = PartitionLog(tmp_path / "t-0", CFG)
    assert reopened.log_end_offset == 400 and calls == []
    assert sum(s.is_open() for s in reopened.segments) <= 2  # segments open lazily
