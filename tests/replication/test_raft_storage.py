"""RaftStorage: round trips, segment rolling, truncation, snapshots, and crashes anywhere.

The crash tests replay realistic Ready sequences (what RaftNode emits: appends in rising
terms, truncations of an uncommitted suffix, votes, commit-only updates, snapshot installs,
local compactions) and then either cut the files at any byte or kill the store between any
two system calls, with the interrupted write torn. The reloaded state must be one the core
may start from and must keep everything earlier saves made durable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logmq.errors import DiskFullError, StorageError
from logmq.replication import Entry, HardState, PersistentState, RaftNode, Ready, Snapshot
from logmq.replication.raft_messages import EMPTY_SNAPSHOT
from logmq.replication.raft_storage import (
    STATE_FILE,
    FileOps,
    RaftStorage,
    open_storage,
)

SOAK = os.environ.get("LOGMQ_SOAK") == "1"
EXAMPLES = 1500 if SOAK else 60
HYPO = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def ready(
    *,
    hard_state: HardState | None = None,
    snapshot: Snapshot | None = None,
    truncate_from: int | None = None,
    entries: tuple[Entry, ...] = (),
    must_sync: bool = True,
) -> Ready:
    return Ready(hard_state, snapshot, truncate_from, entries, (), (), None, must_sync)


def entries(first: int, count: int, term: int, tag: bytes = b"") -> tuple[Entry, ...]:
    return tuple(Entry(i, term, b"%s%d" % (tag, i)) for i in range(first, first + count))


# -- a model of the durable state and a generator of realistic Readys -----------------------


@dataclass
class Model:
    hard: HardState = field(default_factory=HardState)
    snapshot: Snapshot = EMPTY_SNAPSHOT
    entries: list[Entry] = field(default_factory=list)

    @property
    def last_index(self) -> int:
        return self.entries[-1].index if self.entries else self.snapshot.index

    @property
    def last_term(self) -> int:
        return self.entries[-1].term if self.entries else self.snapshot.term

    def term_at(self, index: int) -> int:
        if index == self.snapshot.index:
            return self.snapshot.term
        return self.entries[index - self.snapshot.index - 1].term

    def copy(self) -> Model:
        return Model(self.hard, self.snapshot, list(self.entries))


def step(model: Model, op: tuple) -> tuple[Model, Ready | Snapshot | None]:
    """Apply one operation to a copy of ``model``; returns it and what to save."""
    m = model.copy()
    kind, a, b = op
    hard = m.hard
    if kind == "append":
        term = max(hard.term, m.last_term) + (1 if b else 0)
        new = entries(m.last_index + 1, a, term, b"a")
        m.entries.extend(new)
        m.hard = HardState(term, hard.voted_for if term == hard.term else None, hard.commit)
        return m, ready(hard_state=m.hard if m.hard != hard else None, entries=new)
    if kind == "commit":
        commit = min(m.last_index, hard.commit + a)
        if commit == hard.commit:
            return m, None
        m.hard = replace(hard, commit=commit)
        return m, ready(hard_state=m.hard, must_sync=False)
    if kind == "vote":
        m.hard = HardState(hard.term + 1, a, hard.commit)
        return m, ready(hard_state=m.hard)
    if kind == "truncate":
        start = max(hard.commit, m.snapshot.index) + 1
        at = max(start, m.last_index - a + 1)
        if at > m.last_index:
            return m, None
        term = max(hard.term, m.last_term) + 1
        del m.entries[at - m.snapshot.index - 1 :]
        new = entries(at, b, term, b"t")
        m.entries.extend(new)
        m.hard = HardState(term, None, hard.commit)
        return m, ready(hard_state=m.hard, truncate_from=at, entries=new)
    if kind == "install":
        term = max(hard.term, m.last_term) + 1
        snap = Snapshot(m.last_index + a, term, b"image-%d" % (m.last_index + a))
        m.snapshot, m.entries = snap, []
        m.hard = HardState(term, None, snap.index)
        return m, ready(hard_state=m.hard, snapshot=snap)
    if kind == "compact":
        if hard.commit <= m.snapshot.index:
            return m, None
        index = m.snapshot.index + max(1, min(a, hard.commit - m.snapshot.index))
        snap = Snapshot(index, m.term_at(index), b"local-%d" % index)
        m.entries = [e for e in m.entries if e.index > index]
        m.snapshot = snap
        return m, snap
    raise AssertionError(kind)


OPS = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 6), st.booleans()),
    st.tuples(st.just("commit"), st.integers(1, 8), st.just(0)),
    st.tuples(st.just("vote"), st.integers(1, 5), st.just(0)),
    st.tuples(st.just("truncate"), st.integers(1, 5), st.integers(1, 4)),
    st.tuples(st.just("install"), st.integers(1, 5), st.just(0)),
    st.tuples(st.just("compact"), st.integers(1, 6), st.just(0)),
)


def apply(storage: RaftStorage, work: Ready | Snapshot) -> None:
    if isinstance(work, Snapshot):
        storage.save_snapshot(work)
    else:
        storage.save(work)


def run(directory: Path, ops: list[tuple], **options) -> tuple[Model, RaftStorage]:
    storage, _ = open_storage(directory, **options)
    model = Model()
    for op in ops:
        model, work = step(model, op)
        if work is not None:
            apply(storage, work)
    return model, storage


def state_of(model: Model) -> PersistentState:
    return PersistentState(model.hard, model.snapshot, model.entries)


def assert_same(loaded: PersistentState, model: Model) -> None:
    assert loaded.hard_state == model.hard
    assert loaded.snapshot == model.snapshot
    assert list(loaded.entries) == model.entries


# -- plain behaviour --------------------------------------------------------------------------


def test_empty_directory_is_a_fresh_node(tmp_path):
    storage, state = open_storage(tmp_path / "q")
    assert state.hard_state == HardState() and state.snapshot == EMPTY_SNAPSHOT
    assert list(state.entries) == []
    storage.close()
    _, again = open_storage(tmp_path / "q")
    assert list(again.entries) == [] and again.hard_state == HardState()


def test_round_trip_with_votes_truncation_and_commit(tmp_path):
    storage, _ = open_storage(tmp_path)
    storage.save(ready(hard_state=HardState(1, 1, 0), entries=entries(1, 5, 1)))
    storage.save(ready(hard_state=HardState(1, 1, 3), must_sync=False))
    storage.save(
        ready(hard_state=HardState(2, None, 3), truncate_from=4, entries=entries(4, 3, 2, b"x"))
    )
    storage.close()
    _, state = open_storage(tmp_path)
    assert state.hard_state == HardState(2, None, 3)
    assert list(state.entries) == list(entries(1, 3, 1) + entries(4, 3, 2, b"x"))


def test_segments_roll_and_truncation_deletes_later_segments(tmp_path):
    storage, _ = open_storage(tmp_path, segment_bytes=200)
    for first in range(1, 60, 5):
        storage.save(ready(hard_state=HardState(1, None, 0), entries=entries(first, 5, 1)))
    assert len(storage.segment_files()) > 3
    storage.save(ready(hard_state=HardState(2), truncate_from=12, entries=entries(12, 2, 2, b"n")))
    files = storage.segment_files()
    assert files[-1].name <= "00000000000000000012.log"
    storage.save(ready(entries=entries(14, 30, 2)))
    storage.close()
    _, state = open_storage(tmp_path, segment_bytes=200)
    want = list(entries(1, 11, 1) + entries(12, 2, 2, b"n") + entries(14, 30, 2))
    assert list(state.entries) == want


def test_truncate_to_a_segment_start(tmp_path):
    storage, _ = open_storage(tmp_path, segment_bytes=100)
    for i in range(1, 20):
        storage.save(ready(hard_state=HardState(1), entries=entries(i, 1, 1)))
    first_of_last = int(storage.segment_files()[-1].name[:20])
    storage.save(
        ready(
            hard_state=HardState(3),
            truncate_from=first_of_last,
            entries=entries(first_of_last, 1, 3, b"z"),
        )
    )
    storage.close()
    _, state = open_storage(tmp_path, segment_bytes=100)
    assert state.entries[-1] == Entry(first_of_last, 3, b"z%d" % first_of_last)
    assert len(state.entries) == first_of_last


def test_install_snapshot_replaces_the_log(tmp_path):
    storage, _ = open_storage(tmp_path)
    storage.save(ready(hard_state=HardState(1), entries=entries(1, 10, 1)))
    snap = Snapshot(40, 3, b"image")
    storage.save(ready(hard_state=HardState(3, None, 40), snapshot=snap))
    storage.save(ready(entries=entries(41, 2, 3)))
    storage.close()
    _, state = open_storage(tmp_path)
    assert state.snapshot == snap and list(state.entries) == list(entries(41, 2, 3))
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".snapshot") == [
        "00000000000000000040.snapshot"
    ]


def test_compaction_deletes_covered_segments_and_bounds_the_log(tmp_path):
    storage, _ = open_storage(tmp_path, segment_bytes=10_000)
    index = 0
    for round_ in range(6):
        storage.save(ready(hard_state=HardState(1, None, index), entries=entries(index + 1, 50, 1)))
        index += 50
        storage.save(ready(hard_state=HardState(1, None, index), must_sync=False))
        storage.save_snapshot(Snapshot(index - 10, 1, b"s%d" % round_))
        # Covered segments go at once or at the next compaction: never more than two.
        assert len(storage.segment_files()) <= 2
    storage.close()
    _, state = open_storage(tmp_path)
    assert state.snapshot == Snapshot(index - 10, 1, b"s5")
    assert [e.index for e in state.entries] == list(range(index - 9, index + 1))


def test_stale_local_snapshot_is_ignored(tmp_path):
    storage, _ = open_storage(tmp_path)
    storage.save(ready(hard_state=HardState(1), entries=entries(1, 5, 1)))
    storage.save(ready(hard_state=HardState(2, None, 20), snapshot=Snapshot(20, 2, b"leader")))
    storage.save_snapshot(Snapshot(4, 1, b"mine"))  # taken before the install: too old
    assert storage.snapshot == Snapshot(20, 2, b"leader")


def test_torn_hard_state_slot_falls_back_to_the_durable_one(tmp_path):
    storage, _ = open_storage(tmp_path)
    storage.save(ready(hard_state=HardState(5, 2, 0)))
    storage.save(ready(hard_state=HardState(6, 3, 0)))
    storage.close()
    path = tmp_path / STATE_FILE
    data = bytearray(path.read_bytes())
    newest = 1  # the second write went to the other slot than the first
    data[newest * 64 + 10] ^= 0xFF
    path.write_bytes(bytes(data))
    _, state = open_storage(tmp_path)
    assert state.hard_state == HardState(5, 2, 0)


def test_unsynced_commit_never_overwrites_the_durable_slot(tmp_path):
    ops = RecordingOps()
    storage, _ = open_storage(tmp_path, file_ops=ops)
    storage.save(ready(hard_state=HardState(1, 1, 0), entries=entries(1, 3, 1)))
    durable = [c for c in ops.calls if c[0] == "write" and c[1] == "quorum-state"][-1][2]
    for commit in (1, 2, 3):
        storage.save(ready(hard_state=HardState(1, 1, commit), must_sync=False))
    lazy = {c[2] for c in ops.calls if c[0] == "write" and c[1] == "quorum-state"}
    assert lazy == {0, 64} and durable == 0
    last_writes = [c for c in ops.calls if c[0] == "write" and c[1] == "quorum-state"][-3:]
    assert all(c[2] == 64 for c in last_writes)


def test_entries_and_votes_are_fsynced_before_save_returns(tmp_path):
    ops = RecordingOps()
    storage, _ = open_storage(tmp_path, file_ops=ops)
    ops.calls.clear()
    storage.save(ready(hard_state=HardState(1, 1, 0), entries=entries(1, 2, 1)))
    names = [(c[0], c[1]) for c in ops.calls]
    assert names.index(("write", "quorum-state")) < names.index(("sync", "quorum-state"))
    log = "00000000000000000001.log"
    assert names.index(("write", log)) < names.index(("sync", log))
    assert names[-1] == ("sync", log)
    ops.calls.clear()
    storage.save(ready(hard_state=HardState(1, 1, 2), must_sync=False))
    assert [c[0] for c in ops.calls] == ["write"]  # commit only: written lazily


def test_damage_before_the_tail_is_an_error_not_a_silent_loss(tmp_path):
    storage, _ = open_storage(tmp_path, segment_bytes=100)
    for i in range(1, 30):
        storage.save(ready(hard_state=HardState(1), entries=entries(i, 1, 1)))
    storage.close()
    first = sorted(tmp_path.glob("*.log"))[0]
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0x55
    first.write_bytes(bytes(data))
    with pytest.raises(StorageError, match="damaged Raft log segment"):
        open_storage(tmp_path, segment_bytes=100)


def test_damaged_snapshot_is_an_error(tmp_path):
    storage, _ = open_storage(tmp_path)
    storage.save(ready(hard_state=HardState(2, None, 9), snapshot=Snapshot(9, 2, b"img")))
    storage.close()
    snap = next(tmp_path.glob("*.snapshot"))
    snap.write_bytes(snap.read_bytes()[:-1] + b"?")
    with pytest.raises(StorageError, match="damaged Raft snapshot"):
        open_storage(tmp_path)


def test_missing_entries_before_the_log_start_are_detected(tmp_path):
    storage, _ = open_storage(tmp_path, segment_bytes=100)
    for i in range(1, 30):
        storage.save(ready(hard_state=HardState(1), entries=entries(i, 1, 1)))
    storage.close()
    sorted(tmp_path.glob("*.log"))[0].unlink()
    with pytest.raises(StorageError, match="entries are missing"):
        open_storage(tmp_path, segment_bytes=100)


def test_a_failed_write_poisons_the_store(tmp_path):
    class Full(FileOps):
        def write(self, fd, data, offset):
            raise OSError(28, "No space left on device")

    storage, _ = open_storage(tmp_path, file_ops=Full())
    with pytest.raises(StorageError):
        storage.save(ready(hard_state=HardState(1), entries=entries(1, 1, 1)))
    with pytest.raises(StorageError, match="failed earlier"):
        storage.save(ready(hard_state=HardState(1)))


def test_an_append_torn_by_a_full_disk_is_cut_back(tmp_path):
    """ENOSPC halfway through an append: the segment keeps whole entries only, at once."""

    class HalfThenFull(FileOps):
        full = False

        def write(self, fd, data, offset):
            if self.full:
                os.pwrite(fd, data[: len(data) // 2], offset)
                raise OSError(28, "No space left on device")
            super().write(fd, data, offset)

    ops = HalfThenFull()
    storage, _ = open_storage(tmp_path, file_ops=ops)
    storage.save(ready(hard_state=HardState(1), entries=entries(1, 3, 1)))
    sizes = {p.name: p.stat().st_size for p in tmp_path.glob("*.log")}
    ops.full = True
    with pytest.raises(DiskFullError):
        storage.save(ready(entries=entries(4, 5, 1, b"lost")))
    assert {p.name: p.stat().st_size for p in tmp_path.glob("*.log")} == sizes
    assert storage.last_index == 3
    storage.close()
    _, state = open_storage(tmp_path)
    assert list(state.entries) == list(entries(1, 3, 1))


def test_a_snapshot_write_on_a_full_disk_keeps_the_old_snapshot(tmp_path):
    class SnapshotsFail(FileOps):
        full = False

        def write(self, fd, data, offset):
            if self.full:
                os.pwrite(fd, data[:10], offset)
                raise OSError(28, "No space left on device")
            super().write(fd, data, offset)

    ops = SnapshotsFail()
    storage, _ = open_storage(tmp_path, file_ops=ops)
    storage.save(ready(hard_state=HardState(1), entries=entries(1, 6, 1)))
    storage.save_snapshot(Snapshot(3, 1, b"three"))
    ops.full = True
    with pytest.raises(DiskFullError):
        storage.save_snapshot(Snapshot(5, 1, b"five"))
    assert sorted(p.name for p in tmp_path.iterdir() if "snapshot" in p.name) == [
        "00000000000000000003.snapshot"
    ]
    storage.close()
    _, state = open_storage(tmp_path)
    assert state.snapshot == Snapshot(3, 1, b"three")
    assert list(state.entries) == list(entries(4, 3, 1))


def test_disk_state_drives_a_real_raft_node(tmp_path):
    """A single-voter node persisting through RaftStorage restarts where it was."""
    storage, state = open_storage(tmp_path)
    node = RaftNode(1, [1], state, snapshot_threshold=None)
    node.campaign()
    for value in (b"a", b"b", b"c"):
        node.propose(value)
    applied = []
    while (rd := node.ready()) is not None:
        storage.save(rd)
        applied += [e.data for e in rd.committed_entries if e.data]
        node.advance(rd)
    assert applied == [b"a", b"b", b"c"]
    storage.close()
    _, state = open_storage(tmp_path)
    again = RaftNode(1, [1], state, snapshot_threshold=None)
    assert again.term == node.term and again.last_index == node.last_index
    rd = again.ready()
    assert rd is not None and [e.data for e in rd.committed_entries if e.data] == applied


# -- properties -------------------------------------------------------------------------------


@HYPO
@given(ops=st.lists(OPS, max_size=30), segment_bytes=st.sampled_from([120, 400, 1 << 20]))
def test_model_round_trip(tmp_path_factory, ops, segment_bytes):
    directory = tmp_path_factory.mktemp("rt")
    model, storage = run(directory, ops, segment_bytes=segment_bytes)
    storage.close()
    storage2, loaded = open_storage(directory, segment_bytes=segment_bytes)
    assert_same(loaded, model)
    RaftNode(1, [1, 2, 3], loaded)  # the core accepts it
    # and the reopened store keeps working
    more, work = step(model, ("append", 2, False))
    apply(storage2, work)
    storage2.close()
    _, loaded = open_storage(directory, segment_bytes=segment_bytes)
    assert_same(loaded, more)


@HYPO
@given(
    ops=st.lists(OPS, min_size=1, max_size=25),
    cut=st.integers(0, 1 << 16),
    segment_bytes=st.sampled_from([120, 1 << 20]),
)
def test_cut_the_last_segment_at_any_byte(tmp_path_factory, ops, cut, segment_bytes):
    """Power loss after the last write reached only part of the disk: keep a prefix."""
    directory = tmp_path_factory.mktemp("cut")
    model, storage = run(directory, ops, segment_bytes=segment_bytes)
    storage.close()
    last = sorted(directory.glob("*.log"))[-1]
    data = last.read_bytes()
    last.write_bytes(data[: cut % (len(data) + 1)])
    storage2, loaded = open_storage(directory, segment_bytes=segment_bytes)
    kept = list(loaded.entries)
    assert kept == model.entries[: len(kept)]
    lost = model.entries[len(kept) :]
    assert all(e.index >= int(last.name[:20]) for e in lost)
    # the store continues cleanly after the cut
    nxt = Entry(loaded.snapshot.index + len(kept) + 1, max(model.hard.term, 1), b"after")
    hs = HardState(max(model.hard.term, 1), model.hard.voted_for, 0)
    storage2.save(ready(hard_state=hs, entries=(nxt,)))
    storage2.close()
    _, again = open_storage(directory, segment_bytes=segment_bytes)
    assert list(again.entries) == [*kept, nxt]


class Crash(Exception):
    pass


class RecordingOps(FileOps):
    """Remembers (call, file name, offset) so tests can check the order of writes and syncs."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.names: dict[int, str] = {}

    def open(self, path):
        fd = super().open(path)
        self.names[fd] = path.name
        return fd

    def write(self, fd, data, offset):
        self.calls.append(("write", self.names[fd], offset))
        super().write(fd, data, offset)

    def sync(self, fd):
        self.calls.append(("sync", self.names[fd]))
        super().sync(fd)


class CrashingOps(FileOps):
    """Performs ``budget`` mutating calls, then tears the next write in half and dies."""

    def __init__(self, budget: int) -> None:
        self.budget = budget

    def _spend(self) -> None:
        if self.budget == 0:
            raise Crash()
        self.budget -= 1

    def write(self, fd, data, offset):
        if self.budget == 0:
            super().write(fd, data[: len(data) // 2], offset)
            raise Crash()
        self._spend()
        super().write(fd, data, offset)

    def truncate(self, fd, size):
        self._spend()
        super().truncate(fd, size)

    def sync(self, fd):
        self._spend()
        super().sync(fd)

    def sync_dir(self, path):
        self._spend()
        super().sync_dir(path)

    def unlink(self, path):
        self._spend()
        super().unlink(path)

    def replace(self, src, dst):
        self._spend()
        super().replace(src, dst)


def _visible(model: Model, snapshot_index: int) -> list[Entry]:
    return [e for e in model.entries if e.index > snapshot_index]


@HYPO
@given(
    ops=st.lists(OPS, min_size=1, max_size=20),
    budget=st.integers(0, 150),
    segment_bytes=st.sampled_from([120, 1 << 20]),
)
def test_crash_between_any_two_system_calls(tmp_path_factory, ops, budget, segment_bytes):
    directory = tmp_path_factory.mktemp("crash")
    storage = RaftStorage(directory, segment_bytes=segment_bytes, file_ops=CrashingOps(budget))
    old = Model()
    new = old
    try:
        storage.load()
        for op in ops:
            new, work = step(old, op)
            if work is not None:
                apply(storage, work)
            old = new
    except Crash:
        pass
    _, got = open_storage(directory, segment_bytes=segment_bytes)
    # Either side of the interrupted save, never anything else.
    assert got.snapshot in (old.snapshot, new.snapshot)
    assert (got.hard_state.term, got.hard_state.voted_for) in {
        (old.hard.term, old.hard.voted_for),
        (new.hard.term, new.hard.voted_for),
    }
    # The commit index is advisory and written lazily: it may fall back, never run ahead.
    assert got.hard_state.commit <= max(old.hard.commit, new.hard.commit)
    log = list(got.entries)
    before, after = _visible(old, got.snapshot.index), _visible(new, got.snapshot.index)
    assert log in (before[: len(log)], after[: len(log)]), "log is no prefix of either side"
    # Nothing the previous saves made durable and the interrupted one keeps is lost.
    common = 0
    while common < min(len(before), len(after)) and before[common] == after[common]:
        common += 1
    if got.snapshot == old.snapshot != new.snapshot:
        common = len(before)  # a snapshot that did not land must leave the log alone
    assert len(log) >= common, f"lost durable entries: kept {len(log)} of {common}"
    # Never an entry from a term the node has not durably recorded.
    assert all(e.term <= got.hard_state.term for e in log)
    RaftNode(1, [1, 2, 3], got)
