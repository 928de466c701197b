"""Fetches below the local log start answered from remote objects: the same bytes as
the local segment gave, verified chunks only, bounded store calls and caches."""

from __future__ import annotations

import asyncio
import random
import threading
from collections import OrderedDict
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.storage import batch as b
from logmq.storage.producer_state import ProducerStateManager
from logmq.storage.remote.chunk_cache import ByteLRU, ChunkCache, IndexCache
from logmq.storage.remote.reader import RemoteReader
from logmq.storage.remote.segment_files import RemoteCorruptionError, object_key
from logmq.storage.remote.store import RemoteObjectNotFound, RemoteStorageError

from .helpers import (
    TOPIC,
    MemoryStore,
    build_segments,
    build_txn_segments,
    copy,
    open_log,
    roll,
)


def new_reader(store, *, chunk_bytes=1 << 22, index_bytes=1 << 22, **kw) -> RemoteReader:
    return RemoteReader(
        store, chunk_cache=ChunkCache(chunk_bytes), index_cache=IndexCache(index_bytes), **kw
    )


def local(log, offset, max_bytes, max_offset=None) -> bytes:
    sl = log.read(offset, max_bytes, max_offset=max_offset)
    return b"" if sl is None else sl.read()


async def wait_until(cond, timeout=5.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0)


@pytest.fixture
def segments(tmp_path):
    log, closed = build_segments(tmp_path, segments=3, batches=25)
    yield log, closed
    log.close()


@pytest.mark.parametrize("chunk_size", [64, 333, 1 << 20])
async def test_every_offset_reads_as_the_local_segment_does(segments, chunk_size):
    log, closed = segments
    store = MemoryStore()
    reader = new_reader(store)
    for c in closed:
        meta, _ = await copy(store, c, chunk_size=chunk_size)
        for offset in range(meta.base_offset, meta.end_offset + 1):
            for max_bytes in (0, 1, 150, 700, 5000, 1 << 20):
                got = await reader.read(TOPIC, meta, offset, max_bytes)
                assert got == local(log, offset, max_bytes), (offset, max_bytes)
        assert await reader.read(TOPIC, meta, meta.end_offset + 1, 1 << 20) == b""
    await reader.drain()
    assert reader.stats.corrupt == 0 and not reader.stats.errors
    assert reader.stats.cache_hits > reader.stats.cache_misses


async def test_max_offset_bounds_the_read(segments):
    log, closed = segments
    store = MemoryStore()
    reader = new_reader(store)
    for c in closed[:2]:
        meta, _ = await copy(store, c, chunk_size=200)
        for offset in range(meta.base_offset, meta.end_offset + 1, 3):
            for max_offset in (offset, offset + 1, offset + 4, offset + 30, meta.end_offset + 1):
                for max_bytes in (1, 400, 1 << 20):
                    got = await reader.read(TOPIC, meta, offset, max_bytes, max_offset=max_offset)
                    assert got == local(log, offset, max_bytes, max_offset), (offset, max_offset)
    await reader.close()


async def test_aborted_transactions_match_the_local_log(tmp_path):
    log, closed = build_txn_segments(tmp_path)
    store = MemoryStore()
    reader = new_reader(store)
    metas = [(await copy(store, c, chunk_size=128))[0] for c in closed]
    last_remote = metas[-1].end_offset
    end = log.log_end_offset
    assert any(log.aborted_transactions(0, end))
    rng = random.Random(3)
    for _ in range(300):
        f = rng.randint(0, last_remote)
        u = rng.randint(f, end)
        pairs, passed = await reader.collect_aborted(TOPIC, metas, f, u)
        if not passed:  # the rest is in the local (active) segment
            found, _ = log.active_segment.aborted_transactions(f, u)
            pairs += [(e.producer_id, e.first_offset) for e in found]
        assert pairs == log.aborted_transactions(f, u), (f, u)
    for meta, c in zip(metas, closed, strict=True):
        found, _ = c.seg.aborted_transactions(0, end)
        want = [(e.producer_id, e.first_offset) for e in found]
        assert await reader.aborted_transactions(TOPIC, meta, 0, end) == want
    log.close()


async def test_offset_for_timestamp_matches_the_local_segment(segments):
    _, closed = segments
    store = MemoryStore()
    reader = new_reader(store)
    for c in closed:
        meta, _ = await copy(store, c, chunk_size=100)
        first = c.seg.header_at(0).max_timestamp
        for ts in range(first - 50, meta.max_timestamp + 3):
            assert await reader.offset_for_timestamp(TOPIC, meta, ts) == c.seg.find_timestamp(ts)


async def test_offset_for_timestamp_finds_the_record_not_its_batch(tmp_path):
    """Records of one batch have their own CreateTimes (not always rising): the answer
    is the first record at or after the time, as ListOffsets over the local log gives."""
    from logmq.storage.offset_search import first_record_at_or_after

    rng = random.Random(5)
    log = open_log(tmp_path, segment_bytes=1 << 20)
    ts = 10_000
    for _ in range(40):
        rows = []
        for _ in range(rng.randint(1, 8)):
            ts += rng.randint(-3, 9)
            rows.append((ts, None, b"v" * rng.randint(1, 50), None))
        log.append(b.encode_batch(rows))
    c = roll(log)
    log.high_watermark = log.log_end_offset
    store = MemoryStore()
    reader = new_reader(store)
    meta, _ = await copy(store, c, chunk_size=97)
    try:
        for target in range(9_990, meta.max_timestamp + 3):
            want = first_record_at_or_after(log, target)
            got = await reader.offset_for_timestamp(TOPIC, meta, target)
            assert (got or (-1, -1)) == want, target
    finally:
        log.close()


async def test_producer_snapshot_and_leader_epochs_come_back(segments):
    _, closed = segments
    store = MemoryStore()
    reader = new_reader(store)
    for c in closed:
        meta, _ = await copy(store, c, chunk_size=4096)
        snap = await reader.producer_snapshot(TOPIC, meta)
        assert snap == c.snapshot
        if snap is not None:
            assert ProducerStateManager().load_bytes(snap) == c.seg.next_offset
        assert await reader.leader_epochs(TOPIC, meta) == c.epochs
    assert any(len(c.epochs) > 1 for c in closed)


# -- corruption -------------------------------------------------------------------------


def _flip(store, key, pos):
    data = bytearray(store.objects[key])
    data[pos] ^= 0x55
    store.objects[key] = bytes(data)


async def test_a_corrupted_chunk_is_refused_and_never_served(segments):
    log, closed = segments
    store = MemoryStore()
    reader = new_reader(store)
    meta, manifest = await copy(store, closed[0], chunk_size=256)
    key = object_key(TOPIC, meta, "log")
    good = store.objects[key]
    _flip(store, key, 300)  # in chunk 1
    with pytest.raises(RemoteCorruptionError) as e:
        await reader.read(TOPIC, meta, meta.base_offset, 1 << 20)
    assert not e.value.retriable
    assert reader.stats.corrupt == 1
    # a read that needs only chunk 0 is still served (chunks are checked one by one)
    first = await reader.read(TOPIC, meta, meta.base_offset, 1)
    assert first == local(log, meta.base_offset, 1) and len(first) <= 256
    # the bad bytes were not cached: once the object is repaired the read succeeds
    with pytest.raises(RemoteCorruptionError):
        await reader.read(TOPIC, meta, meta.base_offset, 1 << 20)
    store.objects[key] = good
    assert await reader.read(TOPIC, meta, meta.base_offset, 1 << 20) == local(
        log, meta.base_offset, 1 << 20
    )
    assert manifest.chunk_count > 2


async def test_a_truncated_log_object_is_refused(segments):
    _, closed = segments
    store = MemoryStore()
    reader = new_reader(store)
    meta, _ = await copy(store, closed[0], chunk_size=256)
    key = object_key(TOPIC, meta, "log")
    store.objects[key] = store.objects[key][:-10]
    with pytest.raises(RemoteCorruptionError, match="truncated"):
        await reader.read(TOPIC, meta, meta.end_offset, 1 << 20)
    assert reader.stats.errors["corrupt"] == 1


@pytest.mark.parametrize("suffix", ["manifest", "index", "timeindex", "epochs", "snapshot"])
async def test_a_corrupted_or_truncated_side_object_is_refused(segments, suffix):
    _, closed = segments
    for damage in ("flip", "truncate"):
        store = MemoryStore()
        reader = new_reader(store)
        meta, _ = await copy(store, closed[0], chunk_size=256)
        key = object_key(TOPIC, meta, suffix)
        if damage == "flip":
            _flip(store, key, len(store.objects[key]) // 2)
        else:
            store.objects[key] = store.objects[key][:-1]
        with pytest.raises(RemoteCorruptionError):
            await reader.read(TOPIC, meta, meta.base_offset + 5, 1 << 20)
            await reader.offset_for_timestamp(TOPIC, meta, meta.max_timestamp)
            await reader.leader_epochs(TOPIC, meta)
            await reader.producer_snapshot(TOPIC, meta)
        assert reader.stats.corrupt == 1


async def test_a_manifest_not_matching_the_metadata_is_refused(segments):
    _, closed = segments
    store = MemoryStore()
    reader = new_reader(store)
    meta, _ = await copy(store, closed[0], chunk_size=256)
    with pytest.raises(RemoteCorruptionError):
        await reader.read(TOPIC, replace(meta, checksum="0" * 16), meta.base_offset, 100)
    with pytest.raises(RemoteStorageError, match="not copied"):
        await reader.read(TOPIC, replace(meta, checksum=""), meta.base_offset, 100)
    with pytest.raises(RemoteCorruptionError, match="another segment"):
        await reader.read(TOPIC, replace(meta, end_offset=meta.end_offset + 1), 0, 100)
    other, _ = await copy(store, closed[1], chunk_size=256)
    del store.objects[object_key(TOPIC, other, "manifest")]
    with pytest.raises(RemoteObjectNotFound):
        await reader.read(TOPIC, other, other.base_offset, 100)
    assert reader.stats.errors["not_found"] == 1


# -- sharing, read-ahead and the bound ------------------------------------------------------


async def test_concurrent_reads_of_one_chunk_share_one_store_call(segments):
    log, closed = segments
    store = MemoryStore()
    reader = new_reader(store)
    meta, _ = await copy(store, closed[0], chunk_size=1 << 20)  # one chunk
    await reader.manifest(TOPIC, meta)
    store.gate = asyncio.Event()
    tasks = [
        asyncio.ensure_future(reader.read(TOPIC, meta, o, 300))
        for o in range(meta.base_offset, meta.base_offset + 10)
    ]
    await wait_until(lambda: store.active == 1)  # the offset index
    store.gate.set()
    results = await asyncio.gather(*tasks)
    assert results == [local(log, o, 300) for o in range(meta.base_offset, meta.base_offset + 10)]
    assert store.calls["get_range"] == 1
    assert reader.stats.shared >= 9


async def test_read_ahead_fetches_the_next_chunk(segments):
    log, closed = segments
    store = MemoryStore()
    reader = new_reader(store)
    meta, manifest = await copy(store, closed[0], chunk_size=512)
    assert manifest.chunk_count > 3
    offset = meta.base_offset
    while offset <= meta.end_offset:  # a consumer reading on, one batch per fetch
        got = await reader.read(TOPIC, meta, offset, 1)
        assert got == local(log, offset, 1)
        *_, (_, last) = b.iter_headers(got)
        offset = last.next_offset
        await reader.drain()
    starts = [start for _, start, _ in store.ranges]
    assert sorted(starts) == [k * 512 for k in range(manifest.chunk_count)]  # each once
    # most chunks came from read-ahead, before a fetch needed them (a batch that runs
    # into a chunk not yet fetched fetches it itself)
    assert reader.stats.read_ahead >= manifest.chunk_count // 2


async def test_store_calls_never_exceed_max_pending(segments):
    log, closed = segments
    store = MemoryStore()
    reader = new_reader(store, max_pending=3)
    meta, manifest = await copy(store, closed[0], chunk_size=64)
    await reader.read(TOPIC, meta, meta.base_offset, 1)  # the manifest and index, cached
    await reader.drain()
    # offsets whose batches start in distinct chunks none of which is cached yet
    offsets, seen = [], set()
    for offset in range(meta.base_offset, meta.end_offset + 1):
        data = local(log, offset, 1)
        pos = closed[0].seg.log_path.read_bytes().find(data)
        k = pos // 64
        if k > 6 and k not in seen and all(abs(k - j) > 10 for j in seen):
            seen.add(k)
            offsets.append(offset)
    assert len(offsets) >= 5
    store.gate = asyncio.Event()
    store.max_active = 0
    tasks = [asyncio.ensure_future(reader.read(TOPIC, meta, o, 3000)) for o in offsets]
    await wait_until(lambda: store.active == 3)
    assert reader.pending == 3
    store.gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    busy = [r for r in results if isinstance(r, Exception)]
    # the reads that started the three store calls went on (one may have started two,
    # for a header across two chunks); the others were refused at once, retriably
    assert len(offsets) - 3 <= len(busy) < len(offsets)
    assert all(isinstance(r, RemoteStorageError) and r.retriable for r in busy)
    for o, r in zip(offsets, results, strict=True):
        if not isinstance(r, Exception):
            assert r == local(log, o, 3000)
    await reader.drain()
    assert store.max_active <= 3
    assert reader.stats.errors["busy"] == len(busy)
    # admitted reads that need more chunks than the bound still finish (they wait)
    reader2 = new_reader(store, max_pending=1)
    got = await reader2.read(TOPIC, meta, meta.base_offset, 1 << 20)
    assert got == local(log, meta.base_offset, 1 << 20)
    assert manifest.chunk_count > 20


async def test_store_calls_running_at_once_never_exceed_the_reader_threads(segments):
    """remote.log.reader.threads: of the store calls admitted (max_pending), only that
    many run at once; the others wait their turn and every read still finishes."""
    log, closed = segments
    store = MemoryStore()
    reader = new_reader(store, max_pending=50, threads=2)
    meta, _manifest = await copy(store, closed[0], chunk_size=64)
    await reader.read(TOPIC, meta, meta.base_offset, 1)
    await reader.drain()
    offsets = list(range(meta.base_offset, meta.end_offset + 1, 7))[:8]
    store.gate = asyncio.Event()
    store.max_active = 0
    tasks = [asyncio.ensure_future(reader.read(TOPIC, meta, o, 3000)) for o in offsets]
    await wait_until(lambda: store.active == 2)
    assert reader.pending > 2  # admitted, waiting for a thread
    store.gate.set()
    results = await asyncio.gather(*tasks)
    assert results == [local(log, o, 3000) for o in offsets]
    await reader.drain()
    assert store.max_active == 2


async def test_a_cancelled_reader_does_not_cancel_the_shared_fetch(segments):
    log, closed = segments
    store = MemoryStore()
    reader = new_reader(store)
    meta, _ = await copy(store, closed[0], chunk_size=1 << 20)
    store.gate = asyncio.Event()
    a = asyncio.ensure_future(reader.read(TOPIC, meta, meta.base_offset, 100))
    b = asyncio.ensure_future(reader.read(TOPIC, meta, meta.base_offset, 100))
    await wait_until(lambda: store.active == 1)
    a.cancel()
    store.gate.set()
    assert await b == local(log, meta.base_offset, 100)
    with pytest.raises(asyncio.CancelledError):
        await a


async def test_forget_drops_a_segments_cached_bytes(segments):
    _, closed = segments
    store = MemoryStore()
    reader = new_reader(store)
    meta, _ = await copy(store, closed[0], chunk_size=256)
    await reader.read(TOPIC, meta, meta.base_offset, 1 << 20)
    await reader.drain()
    assert reader.chunks.size_bytes and reader.indexes.size_bytes
    reader.forget(meta.segment_id)
    assert reader.chunks.size_bytes == reader.indexes.size_bytes == 0


async def test_big_chunks_are_checksummed_off_the_event_loop(tmp_path, monkeypatch):
    from logmq.storage.remote import reader as reader_module

    log = open_log(tmp_path)
    for i in range(12):
        log.append(b.encode_values([bytes([i]) * 100_000], timestamp=1000 + i))
    c = roll(log)
    store = MemoryStore()
    meta, _ = await copy(store, c, chunk_size=1 << 20)
    loop_thread = threading.get_ident()
    threads = []
    real = reader_module.checksum

    def spy(data):
        threads.append((len(data), threading.get_ident()))
        return real(data)

    monkeypatch.setattr(reader_module, "checksum", spy)
    reader = new_reader(store)
    assert await reader.read(TOPIC, meta, 0, 1 << 21) == local(log, 0, 1 << 21)
    await reader.drain()
    big = [t for n, t in threads if n >= 1 << 20]
    assert big and loop_thread not in big
    log.close()


# -- the caches -----------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 300),
    st.lists(
        st.tuples(st.sampled_from(["put", "get"]), st.integers(0, 12), st.integers(0, 120)),
        max_size=80,
    ),
)
def test_the_lru_holds_to_its_byte_bound_and_evicts_the_least_recent(max_bytes, ops):
    cache = ByteLRU(max_bytes)
    model: OrderedDict[int, int] = OrderedDict()  # key -> size, least recent first
    for op, key, size in ops:
        if op == "put":
            model.pop(key, None)
            if size <= max_bytes:
                while sum(model.values()) + size > max_bytes:
                    model.popitem(last=False)
                model[key] = size
            cache.put(key, b"x" * size, size)
        else:
            got = cache.get(key)
            if key in model:
                model.move_to_end(key)
                assert got == b"x" * model[key]
            else:
                assert got is None
        assert cache.size_bytes == sum(model.values()) <= max_bytes
        assert len(cache) == len(model)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 3000), st.integers(0, 4000), st.randoms(use_true_random=False))
def test_reads_stay_right_and_caches_bounded_whatever_their_sizes(
    tmp_path_factory, chunk_bytes, index_bytes, rnd
):
    log, closed = _shared_segments(tmp_path_factory)

    async def run():
        store = MemoryStore()
        reader = new_reader(store, chunk_bytes=chunk_bytes, index_bytes=index_bytes)
        metas = [(await copy(store, c, chunk_size=200))[0] for c in closed]
        for _ in range(40):
            meta = rnd.choice(metas)
            offset = rnd.randint(meta.base_offset, meta.end_offset)
            max_bytes = rnd.choice((1, 300, 2000))
            assert await reader.read(TOPIC, meta, offset, max_bytes) == local(
                log, offset, max_bytes
            )
            assert reader.chunks.size_bytes <= chunk_bytes
            assert reader.indexes.size_bytes <= index_bytes
        await reader.drain()
        assert reader.chunks.size_bytes <= chunk_bytes

    asyncio.run(run())


_SHARED: dict[str, object] = {}


def _shared_segments(tmp_path_factory):
    if "log" not in _SHARED:
        _SHARED["log"] = build_segments(tmp_path_factory.mktemp("shared"), segments=2, batches=20)
    return _SHARED["log"]
