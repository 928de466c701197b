"""Offset and time indexes against brute force, across reopen and truncation."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logmq.storage.index import OffsetIndex, TimeIndex

entries = st.lists(st.tuples(st.integers(1, 50), st.integers(1, 500)), min_size=0, max_size=60)


def build(path, steps, writable=True):
    idx = OffsetIndex(path, 1000, 4096, writable=writable)
    off, pos, out = 1000, 0, []
    for d_off, d_pos in steps:
        off += d_off
        pos += d_pos
        idx.append(off, pos)
        out.append((off, pos))
    return idx, out


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=entries, probe=st.integers(900, 5000), trim=st.booleans())
def test_offset_lookup_matches_brute_force(tmp_path_factory, steps, probe, trim):
    path = tmp_path_factory.mktemp("idx") / "0.index"
    idx, out = build(path, steps)
    if trim:
        idx.close()
    else:  # flushed, then a crash; earlier versions left the file preallocated (zeros)
        idx.flush()
        assert path.stat().st_size == 8 * len(out)
        with open(path, "r+b") as f:
            f.truncate(4096)
        del idx
    # Reopened (trimmed or with a zero tail): the entry count is recovered.
    idx = OffsetIndex(path, 1000, 4096, writable=not trim)
    assert idx.entries == len(out)
    below = [e for e in out if e[0] <= probe]
    assert idx.lookup(probe) == (below[-1] if below else (1000, 0))
    by_pos = [e for e in out if e[1] <= probe]
    assert idx.lookup_position(probe) == (by_pos[-1] if by_pos else (1000, 0))
    idx.truncate_to_offset(probe)
    assert idx.entries == len([e for e in out if e[0] < probe])
    idx.close()


def test_time_index_lookup(tmp_path):
    t = TimeIndex(tmp_path / "0.timeindex", 0, 1200, writable=True)
    for ts, off in [(10, 5), (10, 7), (30, 9), (20, 12), (50, 15)]:
        t.append(ts, off)  # only growing timestamps are kept
    assert [t.entry(i) for i in range(t.entries)] == [(10, 5), (30, 9), (50, 15)]
    assert t.lookup(5) == 0  # nothing known to be older: start of segment
    assert t.lookup(11) == 5 and t.lookup(30) == 5 and t.lookup(31) == 9 and t.lookup(99) == 15
    assert t.max_entries == 100
    t.close()
    assert TimeIndex(tmp_path / "0.timeindex", 0, 1200, writable=False).entries == 3


def test_active_index_reaches_its_file_on_flush_and_trim(tmp_path):
    path = tmp_path / "0.index"
    idx = OffsetIndex(path, 1000, 4096, writable=True)
    for i in range(1, 6):
        idx.append(1000 + 10 * i, 100 * i)
    assert path.stat().st_size == 0  # appends stay in memory: no write faults
    assert idx.lookup(1031) == (1030, 300)
    idx.flush()
    assert path.stat().st_size == 40
    idx.truncate_to_offset(1030)  # cut at once: the file never lists removed batches
    assert path.stat().st_size == 16 and idx.last() == (1020, 200)
    idx.append(1025, 250)
    idx.trim()
    assert path.stat().st_size == 24 and not idx.writable
    assert [idx.entry(i) for i in range(idx.entries)] == [(10, 100), (20, 200), (25, 250)]
    idx.close()
    reopened = OffsetIndex(path, 1000, 4096, writable=True)
    assert reopened.entries == 3 and reopened.lookup(1026) == (1025, 250)
    reopened.append(1030, 300)
    reopened.close()
    assert OffsetIndex(path, 1000, 4096, writable=False).last() == (1030, 300)
