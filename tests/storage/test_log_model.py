"""The partition log against an in-memory model, through appends, reads, rolls,
truncation, retention, clean restarts and crashes (hypothesis stateful test)."""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from logmq.storage import batch as b
from logmq.storage import checkpoint
from logmq.storage.config import LogConfig
from logmq.storage.open_files import OpenFileCache
from logmq.storage.partition_log import PartitionLog

from .helpers import commit, make_batch, read_all

CFG = LogConfig.from_dict(
    {"segment.bytes": "2500", "index.interval.bytes": "300", "segment.index.bytes": "1024"}
)


class LogModel(RuleBasedStateMachine):
    """Model: a list of batches (base offset, values) from the log start offset."""

    @initialize()
    def setup(self) -> None:
        self._saved = (checkpoint.fsync, checkpoint.fdatasync)
        checkpoint.fsync = checkpoint.fdatasync = lambda fd: None  # crashes are simulated
        self.tmp = Path(tempfile.mkdtemp())
        self.path = self.tmp / "model-0"
        self.cache = OpenFileCache(2)  # tiny: segments (the active one too) get evicted
        self.log = PartitionLog(self.path, CFG, cache=self.cache)
        self.batches: list[tuple[int, list[bytes]]] = []
        self.start = 0
        self.end = 0
        self.tag = 0

    def teardown(self) -> None:
        if hasattr(self, "log"):
            self.log.close_handles()
            shutil.rmtree(self.tmp, ignore_errors=True)
            checkpoint.fsync, checkpoint.fdatasync = self._saved

    def records(self) -> list[tuple[int, bytes]]:
        return [(base + i, v) for base, vs in self.batches for i, v in enumerate(vs)]

    def cut_model(self, end: int) -> None:
        self.batches = [(o, vs) for o, vs in self.batches if o + len(vs) <= end]
        self.end = end

    @rule(count=st.integers(1, 5), size=st.integers(1, 300), n=st.integers(1, 3))
    def append(self, count, size, n) -> None:
        data = b""
        new = []
        offset = self.end
        for _ in range(n):
            self.tag += 1
            raw = make_batch(count, tag=self.tag, size=size, ts=1000 + self.tag)
            data += raw
            values = [r[3] for r in b.decode_records(raw)]
            new.append((offset, values))
            offset += count
        info = self.log.append(data)
        assert (info.first_offset, info.last_offset) == (self.end, offset - 1)
        commit(self.log)  # a single broker: what is appended is committed (retention needs it)
        self.batches += new
        self.end = offset

    @rule(data=st.data())
    def read(self, data) -> None:
        offset = data.draw(st.integers(self.start, self.end))
        sl = self.log.read(offset, data.draw(st.integers(1, 4000)))
        if offset == self.end:
            assert sl is None
            return
        buf = sl.read()
        got = [
            (o, v) for pos, _ in b.iter_headers(buf) for o, _, _, v, _ in b.decode_records(buf, pos)
        ]
        want = self.records()
        first_base = max(o for o, _ in self.batches if o <= offset)
        i = next(k for k, (o, _) in enumerate(want) if o == first_base)
        assert got == want[i : i + len(got)] and got

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule()
    def flush(self) -> None:
        self.log.flush()

    @precondition(lambda self: self.end > self.start)
    @rule(data=st.data())
    def truncate(self, data) -> None:
        target = data.draw(st.integers(self.start, self.end))
        self.log.truncate_to(target)
        # The log keeps whole batches: it cuts at the start of the batch holding target.
        self.cut_model(next((o for o, vs in self.batches if o + len(vs) > target), self.end))
        assert self.log.log_end_offset == self.end

    @rule(limit=st.integers(0, 8000))
    def retention(self, limit) -> None:
        self.log.config = CFG.merged({"retention.bytes": str(limit)})
        self.log.delete_old_segments()
        self.log.config = CFG
        self.start = self.log.log_start_offset
        self.batches = [(o, vs) for o, vs in self.batches if o >= self.start]

    @rule()
    def clean_restart(self) -> None:
        self.log.close()
        self.log = PartitionLog(self.path, CFG, cache=self.cache, log_start_offset=self.start)

    @rule(seed=st.integers(0, 2**32), anywhere=st.booleans())
    def crash(self, seed, anywhere) -> None:
        """Lose unflushed bytes (or, if ``anywhere``, cut one file at any byte)."""
        rng = random.Random(seed)
        durable = self.log.recovery_point
        segs = list(self.log.segments)
        self.log.close_handles()
        # A fresh log's first segment has no file until it is written to.
        if anywhere:
            seg = rng.choice(segs)
            if seg.log_path.exists():
                with open(seg.log_path, "r+b") as f:
                    f.truncate(rng.randint(0, seg.size))
            durable = min(durable, seg.base_offset)
            recovery_point = 0
        else:
            for seg in segs:
                if not seg.log_path.exists():
                    continue
                with open(seg.log_path, "r+b") as f:
                    f.truncate(rng.randint(seg.flushed_size, seg.size))
            recovery_point = durable
        self.log = PartitionLog(
            self.path,
            CFG,
            cache=self.cache,
            clean_shutdown=False,
            recovery_point=recovery_point,
            log_start_offset=self.start,
        )
        assert self.log.log_end_offset >= min(durable, self.end)
        assert self.log.log_end_offset <= self.end
        if self.log.log_end_offset < self.start:
            self.start = self.log.log_start_offset
            self.batches = []
        self.cut_model(self.log.log_end_offset)

    @invariant()
    def matches_model(self) -> None:
        if not hasattr(self, "log"):
            return
        assert self.log.log_start_offset == self.start
        assert self.log.log_end_offset == self.end
        assert read_all(self.log) == self.records()


LogModel.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
test_log_model = LogModel.TestCase
