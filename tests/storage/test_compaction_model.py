"""A compacted partition log against an in-memory model (hypothesis stateful test).

Appends (keyed records, tombstones, the odd keyless record of a topic switched to
compact), clock ticks, rolls, cleanings, cleanings cut short by a crash at a random
file operation, and clean and unclean restarts. After every step the log must read
back exactly the model: below the point where the last cleaning's map ended, only the
newest record of every key, tombstones only until delete.retention.ms after the
cleaning that first kept them; above it, everything appended.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from logmq.storage import checkpoint
from logmq.storage.config import LogConfig
from logmq.storage.open_files import OpenFileCache
from logmq.storage.partition_log import PartitionLog

from .compaction_helpers import (
    ALL,
    COMPACT,
    Clock,
    CrashAfter,
    SimulatedCrash,
    kbatch,
    read_records,
)
from .helpers import commit

RETENTION = 1000
CFG = LogConfig.from_dict(
    {**COMPACT, "delete.retention.ms": str(RETENTION), "segment.index.bytes": "1024"}
)
KEYS = [b"a", b"b", b"c", b"d", b"e", None]  # None: keyless
records = st.lists(
    st.tuples(
        st.sampled_from(KEYS).filter(lambda k: k is not None) | st.sampled_from(KEYS),
        st.one_of(st.none(), st.binary(min_size=1, max_size=40)),
    ),
    min_size=1,
    max_size=4,
)


class CompactedLogModel(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self._saved = (checkpoint.fsync, checkpoint.fdatasync)
        checkpoint.fsync = checkpoint.fdatasync = lambda fd: None  # crashes are simulated
        self.tmp = Path(tempfile.mkdtemp())
        self.path = self.tmp / "compacted-0"
        self.clock = Clock()
        self.cache = OpenFileCache(3)
        self.log = self._open()
        self.history: dict[int, tuple] = {}  # offset -> (offset, ts, key, value)
        self.present: set[int] = set()
        self.first_kept: dict[int, int] = {}  # tombstone offset -> first cleaning's time

    def _open(self, *, clean: bool = True, recovery_point: int | None = None) -> PartitionLog:
        return PartitionLog(
            self.path,
            CFG,
            cache=self.cache,
            clock=self.clock,
            clean_shutdown=clean,
            recovery_point=recovery_point,
            high_watermark=ALL,
        )

    def teardown(self) -> None:
        if hasattr(self, "log"):
            self.log.close_handles()
            shutil.rmtree(self.tmp, ignore_errors=True)
            checkpoint.fsync, checkpoint.fdatasync = self._saved

    # -- the model's cleaning rule ----------------------------------------------------

    def apply_cleaning(self, end: int) -> None:
        """What a cleaning whose map ended at ``end`` leaves below ``end``."""
        now = self.clock()
        below = sorted(o for o in self.present if o < end)
        newest = {}
        for o in below:
            newest[self.history[o][2]] = o
        for o in below:
            _, _, key, value = self.history[o]
            if key is None or newest[key] != o:
                self.present.discard(o)
            elif value is None:
                first = self.first_kept.setdefault(o, now)
                if now >= first + RETENTION:
                    self.present.discard(o)

    def cleanable_end(self) -> int:
        plan = self.log.cleaning_plan(force=True)
        return plan.segments[-1].end_offset if plan else 0

    # -- rules --------------------------------------------------------------------------

    @rule(batches=st.lists(records, min_size=1, max_size=3))
    def append(self, batches) -> None:
        data = b""
        offset = self.log.log_end_offset
        for recs in batches:
            data += kbatch(recs, ts=self.clock())
            for key, value in recs:
                self.history[offset] = (offset, self.clock(), key, value)
                self.present.add(offset)
                offset += 1
        info = self.log.append(data)
        assert info.last_offset == offset - 1
        commit(self.log)  # a single broker: what is appended is committed

    @rule(ms=st.integers(0, 1500))
    def tick(self, ms) -> None:
        self.clock.now += ms

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule()
    def clean(self) -> None:
        stats = self.log.clean()
        if stats is not None:
            self.apply_cleaning(stats.first_dirty_offset)

    @rule(at=st.integers(0, 120), recovery=st.booleans())
    def crash_while_cleaning(self, at, recovery) -> None:
        end = self.cleanable_end()
        before = {r[0] for r in read_records(self.log)}
        with pytest.MonkeyPatch.context() as mp:
            crash = CrashAfter(mp, at)
            try:
                self.log.clean()
            except SimulatedCrash:
                pass
            crashed = crash.crashed
        if not crashed:
            self.apply_cleaning(end)
            return
        self.log.close_handles()
        self.log = self._open(clean=False, recovery_point=0 if recovery else None)
        got = {r[0] for r in read_records(self.log)}
        old = set(self.present)
        self.apply_cleaning(end)
        assert self.present <= got <= before == old  # the old or the new, nothing lost
        stats = self.log.clean()  # the same cleaning again, at the same time
        assert stats is not None and stats.first_dirty_offset == end

    @rule(clean=st.booleans())
    def restart(self, clean) -> None:
        if clean:
            self.log.close()
        else:
            self.log.close_handles()
        self.log = self._open(clean=clean, recovery_point=None if clean else 0)
        assert self.log.cut_bytes == 0

    # -- invariant --------------------------------------------------------------------

    @invariant()
    def reads_back_the_model(self) -> None:
        assert self.log.log_end_offset == len(self.history)
        expect = [self.history[o] for o in sorted(self.present)]
        assert read_records(self.log) == expect


CompactedLogModel.TestCase.settings = settings(
    max_examples=50, stateful_step_count=40, deadline=None
)
test_compacted_log_model = CompactedLogModel.TestCase
