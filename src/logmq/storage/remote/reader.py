"""Answering a fetch below the local log start from a segment's remote objects.

``RemoteReader.read`` returns what ``PartitionLog.read`` would have returned for the
same segment: whole batches from the one holding the offset, at least that one, up to
``max_bytes``, never one starting at or past ``max_offset``. It finds the start with the
segment's downloaded offset index and walks batch headers (never records) through
chunks of the ``.log``, fetching only the chunks it needs and checking each against the
manifest, and the manifest against the checksum in the segment's metadata, before any
byte is used: a mismatch is a RemoteCorruptionError and nothing of it is returned.

Store calls are bounded (``max_pending``, Kafka's remote.log.reader.max.pending.tasks):
a read that would start one more answers a retriable error, so a slow store turns into
consumer retries, not an unbounded queue. Readers of one chunk share one store call, and
after a read the next chunk is fetched in the background (consumers read on), unless
the bound is reached. At most ``threads`` (remote.log.reader.threads) store calls run at
once; the others admitted wait their turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from logmq.errors import CorruptRecordError, LogMQError
from logmq.storage import batch as b
from logmq.storage.compression import InflateLimitError, inflate_budget
from logmq.storage.index import IndexCorruptError, OffsetIndex, TimeIndex
from logmq.storage.remote.chunk_cache import ChunkCache, IndexCache
from logmq.storage.remote.rate_limit import ByteRateLimiter
from logmq.storage.remote.segment_files import (
    INDEX,
    LEADER_EPOCHS,
    LOG,
    MANIFEST,
    PRODUCER_SNAPSHOT,
    TIME_INDEX,
    TXN_INDEX,
    Manifest,
    RemoteCorruptionError,
    checksum,
    decode_leader_epochs,
    manifest_checksum,
    object_key,
)
from logmq.storage.remote.segment_metadata import RemoteSegment
from logmq.storage.remote.store import RemoteObjectNotFound, RemoteStorageError, RemoteStore
from logmq.storage.txn_index import AbortedTxn, TxnIndexCorruptError, collect_from, decode_entries

log = logging.getLogger(__name__)

_HASH_IN_THREAD = 1 << 20  # chunks this big are checksummed off the event loop
_MIN_BATCH = b.HEADER_SIZE - b.LOG_OVERHEAD


@dataclass(slots=True)
class ReaderStats:
    """Counters for the remote-fetch metrics (Kafka's RemoteFetch* and our cache's)."""

    reads: int = 0  # read() calls
    bytes_served: int = 0
    fetch_requests: int = 0  # store calls made
    fetch_bytes: int = 0  # bytes those calls returned
    cache_hits: int = 0  # chunks found in the chunk cache
    cache_misses: int = 0
    shared: int = 0  # reads that joined a store call already in flight
    read_ahead: int = 0  # background chunk fetches started
    corrupt: int = 0  # objects refused for not matching their checksums
    errors: Counter[str] = field(default_factory=Counter)  # failed store calls by kind


class _RemoteOffsetIndex(OffsetIndex):
    """A downloaded offset index: OffsetIndex's lookups over bytes instead of a file."""

    def __init__(self, data: bytes, base_offset: int) -> None:
        super().__init__("<remote>", base_offset, max(len(data), 64), writable=False, fresh=True)
        self._buf = data
        self.entries = len(data) // self.width
        self._load_last()


class _RemoteTimeIndex(TimeIndex):
    def __init__(self, data: bytes, base_offset: int) -> None:
        super().__init__("<remote>", base_offset, max(len(data), 64), writable=False, fresh=True)
        self._buf = data
        self.entries = len(data) // self.width
        self._load_last()


class RemoteReader:
    def __init__(
        self,
        store: RemoteStore,
        *,
        chunk_cache: ChunkCache,
        index_cache: IndexCache,
        fetch_rate_limiter: ByteRateLimiter | None = None,
        max_pending: int = 100,
        threads: int = 10,
    ) -> None:
        if max_pending < 1 or threads < 1:
            raise ValueError(
                f"max_pending and threads must be at least 1: {max_pending}, {threads}"
            )
        self.store = store
        self.chunks = chunk_cache
        self.indexes = index_cache
        self.limiter = fetch_rate_limiter
        self.max_pending = max_pending
        self.stats = ReaderStats()
        self._inflight: dict[Hashable, asyncio.Task[Any]] = {}
        self._slot_waiters: list[asyncio.Future[None]] = []
        # remote.log.reader.threads: store calls running at once; the rest of the
        # max_pending admitted wait their turn (Kafka's reader pool and its queue)
        self._running = asyncio.Semaphore(threads)

    @property
    def pending(self) -> int:
        """Store calls in flight (foreground and read-ahead)."""
        return len(self._inflight)

    # -- reads ----------------------------------------------------------------------------

    async def read(
        self,
        topic: str,
        seg: RemoteSegment,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
    ) -> bytes:
        """Whole batches from the one holding ``offset``; the first one even if too big;
        ``b""`` when the segment holds nothing at or after ``offset`` below ``max_offset``."""
        self.stats.reads += 1
        if offset > seg.end_offset or (max_offset is not None and offset >= max_offset):
            return b""
        adm = _Admission()
        manifest = await self.manifest(topic, seg, adm)
        size = manifest.log_size
        idx: OffsetIndex = await self._index(topic, seg, INDEX, self._parse_offsets, adm)
        view = _LogView(self, topic, seg, manifest, adm)
        _, pos = idx.lookup(max(offset, seg.base_offset))
        while True:
            if pos >= size:
                return b""
            h = await view.header(pos)
            if h.last_offset >= offset:
                break
            pos += h.size
        if max_offset is not None and h.base_offset >= max_offset:
            return b""
        start, end = pos, pos + h.size
        limit = start + max(max_bytes, 1)
        if end < limit and end < size:
            # Skip the headers of batches known to fit: every one before an indexed batch
            # at or before the limit starts below its offset (as LogSegment.read does).
            idx_off, idx_pos = idx.lookup_position(min(limit, size))
            if idx_pos > end and (max_offset is None or idx_off <= max_offset):
                end = idx_pos
            # a batch is at least a header: one that cannot fit needs no fetch to say so
            while end < size and end + b.HEADER_SIZE <= limit:
                h = await view.header(end)
                if end + h.size > limit or (max_offset is not None and h.base_offset >= max_offset):
                    break
                end += h.size
        data = await view.read(start, end)
        self._read_ahead(topic, seg, manifest, (end - 1) // manifest.chunk_size + 1)
        self.stats.bytes_served += len(data)
        return data

    async def offset_for_timestamp(
        self, topic: str, seg: RemoteSegment, ts_ms: int
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the segment's first record with timestamp >= ``ts_ms``,
        as ListOffsets answers over a local log (offset_search.first_record_at_or_after):
        the time index finds the first batch whose max timestamp reaches ``ts_ms`` and
        only that batch is decoded, since CreateTime records need not grow within a
        batch. The caller answers -1 and -2 and raises the offset to the log start."""
        if seg.max_timestamp < ts_ms:
            return None
        adm = _Admission()
        manifest = await self.manifest(topic, seg, adm)
        tidx: TimeIndex = await self._index(topic, seg, TIME_INDEX, self._parse_times, adm)
        idx: OffsetIndex = await self._index(topic, seg, INDEX, self._parse_offsets, adm)
        _, pos = idx.lookup(tidx.lookup(ts_ms))
        view = _LogView(self, topic, seg, manifest, adm)
        while pos < manifest.log_size:
            h = await view.header(pos)
            if h.max_timestamp >= ts_ms:
                return await self._first_record_at_or_after(view, pos, h, ts_ms)
            pos += h.size
        return None

    async def _first_record_at_or_after(
        self, view: _LogView, pos: int, h: b.BatchHeader, ts_ms: int
    ) -> tuple[int, int]:
        if h.attributes & b.ATTR_LOG_APPEND_TIME:  # every record has the append time
            return h.base_offset, h.max_timestamp
        data = await view.read(pos, pos + h.size)
        try:
            records = b.decode_records(data, 0, max_size=inflate_budget(h.size))
        except InflateLimitError:  # a bomb stored as sent: answer for the batch
            return h.base_offset, h.max_timestamp
        except CorruptRecordError as e:  # its chunks matched their checksums: copied so
            raise view._corrupt(f"batch at position {pos}: {e}") from None
        for offset, rec_ts, *_ in records:
            if rec_ts >= ts_ms:
                return offset, rec_ts
        return h.base_offset, h.max_timestamp  # a header promising more than its records

    async def collect(
        self, topic: str, seg: RemoteSegment, fetch_offset: int, upper: int
    ) -> tuple[list[AbortedTxn], bool]:
        """``TxnIndex.collect`` of the segment's remote txn index."""
        adm = _Admission()
        manifest = await self.manifest(topic, seg, adm)
        if TXN_INDEX not in manifest.files:
            return collect_from([], fetch_offset, upper)
        entries: list[AbortedTxn] = await self._index(topic, seg, TXN_INDEX, self._parse_txns, adm)
        return collect_from(entries, fetch_offset, upper)

    async def aborted_transactions(
        self, topic: str, seg: RemoteSegment, fetch_offset: int, upper: int
    ) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions overlapping
        [fetch_offset, upper) whose ABORT marker is in this segment."""
        found, _ = await self.collect(topic, seg, fetch_offset, upper)
        return [(e.producer_id, e.first_offset) for e in found]

    async def collect_aborted(
        self, topic: str, segments: Iterable[RemoteSegment], fetch_offset: int, upper: int
    ) -> tuple[list[tuple[int, int]], bool]:
        """``PartitionLog.aborted_transactions`` over remote segments (in offset order):
        the pairs, and whether the scan passed ``upper``; if not, a marker in a later
        segment (remote or local) may still overlap, so the caller goes on there."""
        out: list[tuple[int, int]] = []
        if upper <= fetch_offset:
            return out, True
        for seg in segments:
            if seg.end_offset < fetch_offset:
                continue  # its markers are all below the range
            found, passed = await self.collect(topic, seg, fetch_offset, upper)
            out.extend((e.producer_id, e.first_offset) for e in found)
            if passed:
                return out, True
        return out, False

    async def producer_snapshot(self, topic: str, seg: RemoteSegment) -> bytes | None:
        """The producer snapshot at the segment's end, for a follower building state."""
        adm = _Admission()
        manifest = await self.manifest(topic, seg, adm)
        if PRODUCER_SNAPSHOT not in manifest.files:
            return None
        return await self._shared(
            ("file", seg.segment_id, PRODUCER_SNAPSHOT),
            lambda: self._fetch_side(topic, seg, manifest, PRODUCER_SNAPSHOT),
            adm,
        )

    async def leader_epochs(self, topic: str, seg: RemoteSegment) -> tuple[tuple[int, int], ...]:
        """The segment's (epoch, start offset) entries, from its remote object."""
        adm = _Admission()
        manifest = await self.manifest(topic, seg, adm)
        if LEADER_EPOCHS not in manifest.files:
            return ()
        data = await self._shared(
            ("file", seg.segment_id, LEADER_EPOCHS),
            lambda: self._fetch_side(topic, seg, manifest, LEADER_EPOCHS),
            adm,
        )
        try:
            return decode_leader_epochs(data)
        except RemoteCorruptionError:
            self._count_corrupt()
            raise

    # -- the manifest and indexes ---------------------------------------------------------

    async def manifest(
        self, topic: str, seg: RemoteSegment, adm: _Admission | None = None
    ) -> Manifest:
        """The segment's manifest, verified against ``seg.checksum`` (cached)."""
        cached = self.indexes.get((seg.segment_id, MANIFEST))
        if cached is not None:
            return cached
        return await self._shared(
            ("file", seg.segment_id, MANIFEST), lambda: self._fetch_manifest(topic, seg), adm
        )

    async def _fetch_manifest(self, topic: str, seg: RemoteSegment) -> Manifest:
        key = object_key(topic, seg, MANIFEST)
        if not seg.checksum:
            raise RemoteStorageError(f"{key}: no manifest checksum (not copied)", retriable=False)
        data = await self.store.get(key)
        self._fetched(len(data))
        if self.limiter is not None:
            await self.limiter.acquire(len(data))
        if manifest_checksum(data) != seg.checksum:
            raise RemoteCorruptionError(f"{key}: checksum does not match the segment's metadata")
        m = Manifest.from_bytes(data)
        if (m.segment_id, m.base_offset, m.end_offset, m.log_size) != (
            seg.segment_id,
            seg.base_offset,
            seg.end_offset,
            seg.size_bytes,
        ):
            raise RemoteCorruptionError(f"{key}: describes another segment than its metadata")
        self.indexes.put((seg.segment_id, MANIFEST), m, len(data))
        return m

    async def _fetch_side(
        self, topic: str, seg: RemoteSegment, manifest: Manifest, suffix: str
    ) -> bytes:
        entry = manifest.files[suffix]
        key = object_key(topic, seg, suffix)
        if self.limiter is not None:
            await self.limiter.acquire(entry.size)
        data = await self.store.get(key)
        self._fetched(len(data))
        if len(data) != entry.size:
            raise RemoteCorruptionError(f"{key}: {len(data)} bytes, the manifest says {entry.size}")
        if await self._checksum(data) != entry.checksum:
            raise RemoteCorruptionError(f"{key}: checksum does not match the manifest")
        return data

    async def _index(
        self,
        topic: str,
        seg: RemoteSegment,
        suffix: str,
        parse: Callable[[bytes, Manifest], Any],
        adm: _Admission,
    ) -> Any:
        """A parsed side file (offset, time or txn index), downloaded once and cached."""
        key = (seg.segment_id, suffix)
        cached = self.indexes.get(key)
        if cached is not None:
            return cached
        manifest = await self.manifest(topic, seg, adm)

        async def load() -> Any:
            data = b""
            if suffix in manifest.files:
                data = await self._fetch_side(topic, seg, manifest, suffix)
            value = parse(data, manifest)
            self.indexes.put(key, value, len(data))
            return value

        return await self._shared(("file", *key), load, adm)

    @staticmethod
    def _parse_offsets(data: bytes, manifest: Manifest) -> OffsetIndex:
        if len(data) % OffsetIndex.ENTRY.size:
            raise RemoteCorruptionError(f"offset index of {len(data)} bytes is not whole entries")
        idx = _RemoteOffsetIndex(data, manifest.base_offset)
        try:
            idx.sanity_check(max(manifest.log_size, 1))
        except IndexCorruptError as e:
            raise RemoteCorruptionError(str(e)) from None
        return idx

    @staticmethod
    def _parse_times(data: bytes, manifest: Manifest) -> TimeIndex:
        if len(data) % TimeIndex.ENTRY.size:
            raise RemoteCorruptionError(f"time index of {len(data)} bytes is not whole entries")
        return _RemoteTimeIndex(data, manifest.base_offset)

    @staticmethod
    def _parse_txns(data: bytes, manifest: Manifest) -> list[AbortedTxn]:
        try:
            return decode_entries(data, base_offset=manifest.base_offset, name="remote txn index")
        except TxnIndexCorruptError as e:
            raise RemoteCorruptionError(str(e)) from None

    # -- chunks ---------------------------------------------------------------------------

    async def chunk(
        self,
        topic: str,
        seg: RemoteSegment,
        manifest: Manifest,
        k: int,
        adm: _Admission | None = None,
    ) -> bytes:
        """Chunk ``k`` of the segment's .log, verified (from the cache when there)."""
        data = self.chunks.get_chunk(seg.segment_id, k)
        if data is not None:
            self.stats.cache_hits += 1
            return data
        self.stats.cache_misses += 1
        return await self._shared(
            ("chunk", seg.segment_id, k), lambda: self._fetch_chunk(topic, seg, manifest, k), adm
        )

    async def _fetch_chunk(
        self, topic: str, seg: RemoteSegment, manifest: Manifest, k: int
    ) -> bytes:
        start, end = manifest.chunk_range(k)
        key = object_key(topic, seg, LOG)
        if self.limiter is not None:
            await self.limiter.acquire(end - start)
        data = await self.store.get_range(key, start, end)
        self._fetched(len(data))
        if len(data) != end - start:
            raise RemoteCorruptionError(
                f"{key}: chunk {k} has {len(data)} of {end - start} bytes (truncated object)"
            )
        if await self._checksum(data) != manifest.chunks[k]:
            raise RemoteCorruptionError(f"{key}: chunk {k} does not match its checksum")
        self.chunks.put_chunk(seg.segment_id, k, data)
        return data

    def _read_ahead(self, topic: str, seg: RemoteSegment, manifest: Manifest, k: int) -> None:
        """Start fetching chunk ``k`` unless it is cached, in flight, or the bound is hit."""
        key = ("chunk", seg.segment_id, k)
        if (
            k >= manifest.chunk_count
            or key in self._inflight
            or (seg.segment_id, k) in self.chunks
            or len(self._inflight) >= self.max_pending
        ):
            return
        self.stats.read_ahead += 1
        self._start(key, lambda: self._fetch_chunk(topic, seg, manifest, k))

    # -- store calls: shared, bounded, counted --------------------------------------------

    def _start(self, key: Hashable, factory: Callable[[], Awaitable[Any]]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(self._run(key, factory))
        self._inflight[key] = task
        task.add_done_callback(_retrieve)
        return task

    async def _shared(
        self, key: Hashable, factory: Callable[[], Awaitable[Any]], adm: _Admission | None
    ) -> Any:
        """Join the store call for ``key`` in flight, or start it if the bound allows.

        When the bound is reached, a request's first store call is refused (retriable),
        and the later calls of a request already admitted wait for a free slot: a read
        that needs more chunks than the bound still finishes, and the bound still holds.
        """
        while True:
            task = self._inflight.get(key)
            if task is not None:
                self.stats.shared += 1
                break
            if len(self._inflight) < self.max_pending:
                task = self._start(key, factory)
                break
            if adm is None or not adm.admitted:
                if adm is None or not adm.refused:  # counted once per request
                    self.stats.errors["busy"] += 1
                if adm is not None:
                    adm.refused = True
                raise RemoteStorageError(
                    f"{len(self._inflight)} remote reads pending "
                    f"(remote.log.reader.max.pending.tasks={self.max_pending})",
                    retriable=True,
                )
            waiter = asyncio.get_running_loop().create_future()
            self._slot_waiters.append(waiter)
            try:
                await waiter
            finally:
                if not waiter.done():
                    waiter.cancel()
        if adm is not None:
            adm.admitted = True
        # shielded: one reader giving up (a fetch timing out) does not cancel the others'
        return await asyncio.shield(task)

    async def _run(self, key: Hashable, factory: Callable[[], Awaitable[Any]]) -> Any:
        try:
            async with self._running:
                return await factory()
        except RemoteCorruptionError as e:
            self._count_corrupt()
            log.error("remote object refused: %s", e)
            raise
        except RemoteObjectNotFound:
            self.stats.errors["not_found"] += 1
            raise
        except RemoteStorageError as e:
            self.stats.errors["retriable" if e.retriable else "fatal"] += 1
            raise
        except LogMQError:
            self.stats.errors["fatal"] += 1
            raise
        except Exception as e:  # a store that raised something else: never the broker's end
            self.stats.errors["retriable"] += 1
            raise RemoteStorageError(f"remote read failed: {e!r}") from e
        finally:
            if self._inflight.get(key) is asyncio.current_task():
                del self._inflight[key]
            waiters, self._slot_waiters = self._slot_waiters, []
            for w in waiters:  # all of them: one woken but cancelled would keep the slot idle
                if not w.done():
                    w.set_result(None)

    def _fetched(self, n: int) -> None:
        self.stats.fetch_requests += 1
        self.stats.fetch_bytes += n

    def _count_corrupt(self) -> None:
        self.stats.corrupt += 1
        self.stats.errors["corrupt"] += 1

    @staticmethod
    async def _checksum(data: bytes) -> str:
        if len(data) >= _HASH_IN_THREAD:
            return await asyncio.to_thread(checksum, data)
        return checksum(data)

    def forget(self, segment_id: str) -> None:
        """Drop a deleted segment's cached chunks and indexes."""
        self.chunks.discard_where(segment_id)
        self.indexes.discard_where(segment_id)

    async def drain(self) -> None:
        """Wait for every store call in flight (read-ahead included) to end."""
        while self._inflight:
            await asyncio.gather(*self._inflight.values(), return_exceptions=True)

    async def close(self) -> None:
        """Cancel what is in flight."""
        tasks = list(self._inflight.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._inflight.clear()


class _Admission:
    """One request's standing with the store-call bound: admitted once one of its store
    calls started or joined one in flight."""

    __slots__ = ("admitted", "refused")

    def __init__(self) -> None:
        self.admitted = False
        self.refused = False


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a store call's error as seen: a read-ahead nobody awaited must not log
    "exception never retrieved" (its error was counted in the stats)."""
    if not task.cancelled():
        task.exception()


class _LogView:
    """One read's access to a segment's .log, chunk by chunk (the last one kept at hand,
    so walking headers costs no cache lookups)."""

    __slots__ = ("_data", "_k", "adm", "manifest", "reader", "seg", "topic")

    def __init__(
        self,
        reader: RemoteReader,
        topic: str,
        seg: RemoteSegment,
        manifest: Manifest,
        adm: _Admission,
    ) -> None:
        self.reader, self.topic, self.seg, self.manifest = reader, topic, seg, manifest
        self.adm = adm
        self._k = -1
        self._data = b""

    async def _chunk(self, k: int) -> bytes:
        if k != self._k:
            self._data = await self.reader.chunk(self.topic, self.seg, self.manifest, k, self.adm)
            self._k = k
        return self._data

    async def read(self, start: int, end: int) -> bytes:
        cs = self.manifest.chunk_size
        k0, k1 = start // cs, (end - 1) // cs
        if k0 == k1:
            data = await self._chunk(k0)
            return data[start - k0 * cs : end - k0 * cs]
        ks = range(k0, k1 + 1)
        parts = await asyncio.gather(
            *(self.reader.chunk(self.topic, self.seg, self.manifest, k, self.adm) for k in ks)
        )
        self._k, self._data = k1, parts[-1]
        joined = b"".join(parts)
        return joined[start - k0 * cs : end - k0 * cs]

    async def header(self, pos: int) -> b.BatchHeader:
        """The header of the batch at ``pos``, checked to fit in the segment."""
        size, cs = self.manifest.log_size, self.manifest.chunk_size
        if pos + b.HEADER_SIZE > size:
            raise self._corrupt(f"truncated batch header at position {pos}")
        k = pos // cs
        if (pos + b.HEADER_SIZE - 1) // cs == k:
            h = b.read_header(await self._chunk(k), pos - k * cs)
        else:
            h = b.read_header(await self.read(pos, pos + b.HEADER_SIZE))
        if h.batch_length < _MIN_BATCH or pos + h.size > size:
            raise self._corrupt(f"invalid batch length {h.batch_length} at position {pos}")
        return h

    def _corrupt(self, why: str) -> RemoteCorruptionError:
        self.reader._count_corrupt()
        key = object_key(self.topic, self.seg, LOG)
        return RemoteCorruptionError(f"{key}: {why}")
