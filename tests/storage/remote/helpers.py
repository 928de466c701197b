"""Remote-tier test helpers: an in-memory RemoteStore and real segments to copy."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from logmq.storage import batch as b
from logmq.storage.config import LogConfig
from logmq.storage.partition_log import PartitionLog
from logmq.storage.producer_state import snapshot_path
from logmq.storage.remote.segment_files import copy_segment, local_segment_files
from logmq.storage.remote.segment_metadata import RemoteSegment, SegmentState
from logmq.storage.remote.store import RemoteObjectNotFound, RemoteStore
from logmq.storage.segment import LogSegment

TOPIC = "orders"
TOPIC_ID = "b3c0ffee00000000000000000000beef"


class MemoryStore(RemoteStore):
    """A dict of key -> bytes. ``gate``, when set, holds every get until it is set, so
    tests can see how many calls are in flight at once (``active``, ``max_active``)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.puts: list[str] = []  # keys in the order their uploads completed
        self.calls: Counter[str] = Counter()
        self.ranges: list[tuple[str, int, int]] = []
        self.gate: asyncio.Event | None = None
        self.active = 0
        self.max_active = 0

    async def _enter(self) -> None:
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if self.gate is not None:
                await self.gate.wait()
        except BaseException:
            self.active -= 1
            raise

    def _object(self, key: str) -> bytes:
        try:
            return self.objects[key]
        except KeyError:
            raise RemoteObjectNotFound(f"no object {key}") from None

    async def put_file(self, key: str, path: Path) -> int:
        self.calls["put_file"] += 1
        data = Path(path).read_bytes()
        await asyncio.sleep(0)  # let the other uploads interleave, as a real store does
        self.objects[key] = data
        self.puts.append(key)
        return len(data)

    async def put_bytes(self, key: str, data: bytes) -> None:
        self.calls["put_bytes"] += 1
        self.objects[key] = bytes(data)
        self.puts.append(key)

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        self.calls["get_range"] += 1
        self.ranges.append((key, start, end))
        await self._enter()
        try:
            return self._object(key)[start:end]
        finally:
            self.active -= 1

    async def get(self, key: str) -> bytes:
        self.calls["get"] += 1
        await self._enter()
        try:
            return self._object(key)
        finally:
            self.active -= 1

    async def delete(self, keys: list[str]) -> None:
        self.calls["delete"] += 1
        for k in keys:
            self.objects.pop(k, None)

    async def list(self, prefix: str) -> AsyncIterator[str]:
        for k in sorted(self.objects):
            if k.startswith(prefix):
                yield k

    async def check(self) -> None:
        return None

    async def close(self) -> None:
        return None


def values_batch(rng: random.Random, ts: int, **kw) -> bytes:
    n = rng.randint(1, 6)
    values = [bytes([rng.randrange(256)]) * rng.randint(1, 120) for _ in range(n)]
    return b.encode_values(values, timestamp=ts, **kw)


@dataclass
class ClosedSegment:
    """A rolled local segment and what its copy needs."""

    seg: LogSegment
    snapshot: bytes | None
    epochs: tuple[tuple[int, int], ...]

    def meta(self, segment_id: str | None = None) -> RemoteSegment:
        s = self.seg
        return RemoteSegment(
            topic_id=TOPIC_ID,
            partition=0,
            segment_id=segment_id or uuid.uuid4().hex,
            base_offset=s.base_offset,
            end_offset=s.next_offset - 1,
            max_timestamp=s.max_timestamp,
            size_bytes=s.size,
            leader_epochs=self.epochs,
            copier_epoch=0,
            broker_id=1,
        )

    def files(self):
        return local_segment_files(
            self.seg.dir,
            self.seg.base_offset,
            producer_snapshot=self.snapshot,
            leader_epochs=self.epochs,
        )


def open_log(tmp_path: Path, **config) -> PartitionLog:
    config.setdefault("index_interval_bytes", 200)
    return PartitionLog(tmp_path / f"{TOPIC}-0", LogConfig(**config))


def roll(log: PartitionLog) -> ClosedSegment:
    """Roll the active segment and return it closed, with its end snapshot and epochs."""
    log.roll()
    seg = log.segments[-2]
    path = snapshot_path(log.dir, seg.next_offset)
    snap = path.read_bytes() if path.exists() else None
    entries = log.leader_epochs.entries()
    before = [(e, s) for e, s in entries if s <= seg.base_offset]  # the epoch in force
    inside = [(e, s) for e, s in entries if seg.base_offset < s < seg.next_offset]
    epochs = tuple(before[-1:] + inside)
    return ClosedSegment(seg, snap, epochs)


def build_segments(
    tmp_path: Path, *, segments: int = 3, batches: int = 25, seed: int = 1
) -> tuple[PartitionLog, list[ClosedSegment]]:
    """A log of random batches (sizes, record counts, timestamps that mostly rise),
    rolled into ``segments`` closed segments, with leader epochs changing now and then."""
    rng = random.Random(seed)
    log = open_log(tmp_path)
    closed = []
    ts, epoch = 1_000_000, 0
    for _ in range(segments):
        for _ in range(batches):
            ts += rng.randint(-5, 40)
            if rng.random() < 0.05:
                epoch += 1
            log.append(values_batch(rng, ts), leader_epoch=epoch)
        closed.append(roll(log))
    log.high_watermark = log.log_end_offset
    return log, closed


async def copy(
    store: MemoryStore, c: ClosedSegment, *, chunk_size: int, **kw
) -> tuple[RemoteSegment, object]:
    meta = c.meta()
    manifest, digest = await copy_segment(
        store, TOPIC, meta, c.files(), chunk_size=chunk_size, **kw
    )
    return meta.with_state(SegmentState.COPY_FINISHED, checksum=digest), manifest


P, Q = 7, 9  # producer ids


def txn_batch(pid: int, seq: int, n: int = 2) -> bytes:
    values = [b"t%d" % i for i in range(n)]
    return b.encode_values(
        values,
        timestamp=1000,
        compression=b.ATTR_TRANSACTIONAL,  # the attributes byte: no codec, transactional
        producer_id=pid,
        producer_epoch=0,
        base_sequence=seq,
    )


def build_txn_segments(
    tmp_path: Path, *, segments: int = 4, seed: int = 7
) -> tuple[PartitionLog, list[ClosedSegment]]:
    """Two producers' transactions, committed and aborted, interleaved with plain
    batches; some span a roll (their ABORT marker in a later segment)."""
    from logmq.storage.txn_state import CONTROL_ABORT, CONTROL_COMMIT, encode_control_batch

    rng = random.Random(seed)
    log = open_log(tmp_path)
    seq = {P: 0, Q: 0}
    open_txn = {P: False, Q: False}

    def end(pid: int, kind: int) -> None:
        marker = encode_control_batch(
            kind, producer_id=pid, producer_epoch=0, coordinator_epoch=0, timestamp=1000
        )
        log.append(marker, control=True)
        open_txn[pid] = False

    closed = []
    for _ in range(segments):
        for _ in range(10):
            pid = rng.choice((P, Q))
            r = rng.random()
            if r < 0.45:
                log.append(txn_batch(pid, seq[pid]))
                seq[pid] += 2
                open_txn[pid] = True
            elif r < 0.75 and open_txn[pid]:
                end(pid, CONTROL_ABORT if rng.random() < 0.6 else CONTROL_COMMIT)
            else:
                log.append(values_batch(rng, 1000))
        closed.append(roll(log))
    for pid in (P, Q):
        if open_txn[pid]:
            end(pid, CONTROL_ABORT)
    log.high_watermark = log.log_end_offset
    return log, closed
