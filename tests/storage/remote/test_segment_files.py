"""A closed segment's objects in the remote store: keys, the manifest, copy and delete."""

from __future__ import annotations

import asyncio
import threading

import msgpack
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.errors import ErrorCode
from logmq.storage.index import OffsetIndex
from logmq.storage.remote import segment_files as sf
from logmq.storage.remote.rate_limit import ByteRateLimiter, TokenBucket
from logmq.storage.remote.segment_files import (
    SUFFIXES,
    FileEntry,
    Manifest,
    RemoteCorruptionError,
    copy_segment,
    decode_leader_epochs,
    delete_segment,
    encode_leader_epochs,
    manifest_checksum,
    object_key,
)
from logmq.storage.remote.store import RemoteStorageError

from .helpers import TOPIC, TOPIC_ID, MemoryStore, build_segments, build_txn_segments, copy

H = "0123456789abcdef"


def test_keys_follow_the_aiven_layout(tmp_path):
    _, closed = build_segments(tmp_path, segments=1, batches=3)
    meta = closed[0].meta("abc123")
    assert object_key(TOPIC, meta, "log") == f"{TOPIC}-{TOPIC_ID}/0/{0:020d}-abc123.log"
    assert object_key(TOPIC, meta, "timeindex").endswith("00000000000000000000-abc123.timeindex")
    with pytest.raises(ValueError):
        object_key(TOPIC, meta, "exe")


async def test_copy_uploads_every_file_and_the_manifest_last(tmp_path):
    log, closed = build_segments(tmp_path, segments=2, batches=30)
    store = MemoryStore()
    c = closed[1]
    meta, manifest = await copy(store, c, chunk_size=500)
    assert store.puts[-1] == object_key(TOPIC, meta, "manifest")
    assert set(store.objects) == {
        object_key(TOPIC, meta, s) for s in ("log", "index", "timeindex", "snapshot", "epochs")
    } | {object_key(TOPIC, meta, "manifest")}
    raw = store.objects[object_key(TOPIC, meta, "manifest")]
    assert manifest_checksum(raw) == meta.checksum == xxhash.xxh3_64_hexdigest(raw)
    assert Manifest.from_bytes(raw) == manifest
    local = c.seg.log_path.read_bytes()
    assert store.objects[object_key(TOPIC, meta, "log")] == local
    assert manifest.log_size == len(local) == meta.size_bytes
    assert manifest.chunks == tuple(
        xxhash.xxh3_64_hexdigest(local[i : i + 500]) for i in range(0, len(local), 500)
    )
    index = c.seg.index_path.read_bytes()
    assert index and store.objects[object_key(TOPIC, meta, "index")] == index
    assert manifest.files["index"] == FileEntry(len(index), xxhash.xxh3_64_hexdigest(index))
    assert store.objects[object_key(TOPIC, meta, "snapshot")] == c.snapshot
    assert decode_leader_epochs(store.objects[object_key(TOPIC, meta, "epochs")]) == c.epochs
    assert (manifest.base_offset, manifest.end_offset) == (c.seg.base_offset, meta.end_offset)
    log.close()


def test_a_preallocated_index_uploads_only_its_entries(tmp_path):
    path = tmp_path / "x.index"
    entries = OffsetIndex.ENTRY.pack(3, 100) + OffsetIndex.ENTRY.pack(9, 250)
    path.write_bytes(entries + bytes(8 * 50))  # an earlier version's preallocated tail
    assert sf.index_bytes(path, OffsetIndex, 0) == entries
    assert sf.index_bytes(tmp_path / "missing.index", OffsetIndex, 0) == b""
    assert not (tmp_path / "missing.index").exists()


async def test_checksums_are_computed_off_the_event_loop(tmp_path, monkeypatch):
    _, closed = build_segments(tmp_path, segments=1, batches=10)
    loop_thread = threading.get_ident()
    seen = []
    real = sf.hash_chunks

    def spy(path, chunk_size):
        seen.append(threading.get_ident())
        return real(path, chunk_size)

    monkeypatch.setattr(sf, "hash_chunks", spy)
    await copy(MemoryStore(), closed[0], chunk_size=64)
    assert seen and loop_thread not in seen


async def test_a_segment_that_changed_since_its_metadata_is_not_copied(tmp_path):
    _, closed = build_segments(tmp_path, segments=1, batches=5)
    meta = closed[0].meta()
    from dataclasses import replace

    store = MemoryStore()
    with pytest.raises(RemoteStorageError, match="metadata says"):
        await copy_segment(
            store, TOPIC, replace(meta, size_bytes=meta.size_bytes + 1), closed[0].files(),
            chunk_size=1024,
        )  # fmt: skip
    assert not store.objects
    with pytest.raises(ValueError):
        await copy_segment(store, TOPIC, meta, closed[0].files(), chunk_size=1)


async def test_delete_removes_every_key_and_is_idempotent(tmp_path):
    _, closed = build_segments(tmp_path, segments=2, batches=10)
    store = MemoryStore()
    a, _ = await copy(store, closed[0], chunk_size=256)
    b, _ = await copy(store, closed[1], chunk_size=256)
    await delete_segment(store, TOPIC, a)
    await delete_segment(store, TOPIC, a)
    assert all(not k.split("/")[-1].startswith(f"{0:020d}-{a.segment_id}") for k in store.objects)
    assert object_key(TOPIC, b, "manifest") in store.objects
    assert len(store.objects) == 6
    keys = [k async for k in store.list(f"{TOPIC}-{TOPIC_ID}/0/")]
    assert len(keys) == 6


async def test_a_transactional_segment_uploads_its_txn_index(tmp_path):
    _, closed = build_txn_segments(tmp_path)
    store = MemoryStore()
    with_aborts = [c for c in closed if c.seg.txn_index_path.exists()]
    assert with_aborts and len(with_aborts) < len(closed)
    for c in closed:
        meta, manifest = await copy(store, c, chunk_size=128)
        if c in with_aborts:
            txn = c.seg.txn_index_path.read_bytes()
            assert txn and store.objects[object_key(TOPIC, meta, "txnindex")] == txn
            assert manifest.files["txnindex"].size == len(txn)
        else:
            assert "txnindex" not in manifest.files


# -- the manifest -----------------------------------------------------------------------


def manifest_doc(**over):
    doc = {
        "version": 1,
        "segment_id": "s1",
        "base_offset": 10,
        "end_offset": 19,
        "chunk_size": 100,
        "log_size": 250,
        "chunks": [H, H, H],
        "files": {"index": [16, H]},
    }
    doc.update(over)
    return msgpack.packb(doc)


def test_a_valid_manifest_parses():
    m = Manifest.from_bytes(manifest_doc())
    assert m.chunk_count == 3 and m.chunk_range(2) == (200, 250)
    assert Manifest.from_bytes(m.to_bytes()) == m


@pytest.mark.parametrize(
    "over",
    [
        {"version": 2},
        {"version": True},
        {"segment_id": ""},
        {"segment_id": 5},
        {"base_offset": -1},
        {"end_offset": 9},  # before the base
        {"chunk_size": 0},
        {"chunk_size": 1 << 40},
        {"log_size": -1},
        {"log_size": 301},  # needs four chunks
        {"chunks": [H, H]},
        {"chunks": [H, H, "xyz"]},
        {"chunks": [H, H, H.upper()]},
        {"chunks": "abc"},
        {"files": {"index": [16]}},
        {"files": {"index": [-1, H]}},
        {"files": {"index": [1.5, H]}},
        {"files": {"passwd": [1, H]}},
        {"files": []},
    ],
)
def test_a_malformed_manifest_is_refused(over):
    with pytest.raises(RemoteCorruptionError):
        Manifest.from_bytes(manifest_doc(**over))


def test_garbage_and_oversized_manifests_are_refused():
    for data in (b"", b"\xc1", msgpack.packb([1, 2]), manifest_doc()[:-3], manifest_doc() + b"x"):
        with pytest.raises(RemoteCorruptionError):
            Manifest.from_bytes(data)
    with pytest.raises(RemoteCorruptionError, match="over the limit"):
        Manifest.from_bytes(bytes(sf.MAX_MANIFEST_BYTES + 1))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 400), st.integers(0, 255))
def test_any_bytes_parse_or_raise_the_corruption_error(noise, at, value):
    for data in (noise, _flip(manifest_doc(), at, value)):
        try:
            Manifest.from_bytes(data)
        except RemoteCorruptionError:
            pass


def _flip(data: bytes, at: int, value: int) -> bytes:
    if not data:
        return data
    buf = bytearray(data)
    buf[at % len(buf)] = value
    return bytes(buf)


def test_the_corruption_error_is_a_fatal_storage_error():
    e = RemoteCorruptionError("x")
    assert isinstance(e, RemoteStorageError)
    assert not e.retriable
    assert e.code is ErrorCode.STORAGE_ERROR


def test_leader_epochs_round_trip_and_malformed_ones_are_refused():
    entries = ((0, 0), (3, 17), (4, 90))
    assert decode_leader_epochs(encode_leader_epochs(entries)) == entries
    assert decode_leader_epochs(encode_leader_epochs(())) == ()
    for bad in (b"", b"1\n0\n", b"0\n2\n1 1\n", b"0\n2\n1 5\n1 9\n", b"0\n1\nx y\n", b"\xff"):
        with pytest.raises(RemoteCorruptionError):
            decode_leader_epochs(bad)


def test_suffixes_are_the_seven_objects():
    assert SUFFIXES == ("log", "index", "timeindex", "txnindex", "snapshot", "epochs", "manifest")


# -- the rate limiter -------------------------------------------------------------------


def test_the_bucket_lets_a_burst_through_then_holds_to_the_rate():
    bucket = TokenBucket(1000, now=0.0)
    assert bucket.reserve(1000, 0.0) == 0.0
    assert bucket.reserve(500, 0.0) == pytest.approx(0.5)
    assert bucket.reserve(500, 0.0) == pytest.approx(1.0)  # queued behind the first debt
    assert bucket.reserve(0, 2.0) == 0.0  # paid off, and the bucket refills to capacity only
    assert bucket.reserve(3000, 10.0) == pytest.approx(2.0)  # bigger than the bucket: goes
    with pytest.raises(ValueError):
        TokenBucket(0)


async def test_copies_wait_on_the_rate_limiter(tmp_path):
    _, closed = build_segments(tmp_path, segments=1, batches=20)
    now = [0.0]
    slept = []

    async def sleep(s):
        slept.append(s)
        await asyncio.sleep(0)

    limiter = ByteRateLimiter(100, clock=lambda: now[0], sleep=sleep)
    _, manifest = await copy(MemoryStore(), closed[0], chunk_size=1024, rate_limiter=limiter)
    total = manifest.log_size + sum(e.size for e in manifest.files.values())
    # every upload reserved its bytes; the last one waits until the whole debt is paid
    assert max(slept) == pytest.approx((total - 100) / 100)
    assert limiter.waited_s == pytest.approx(sum(slept))


class FailingStore(MemoryStore):
    def __init__(self, suffix, error):
        super().__init__()
        self.suffix, self.error = suffix, error

    async def put_bytes(self, key, data):
        if key.endswith("." + self.suffix):
            raise self.error
        await super().put_bytes(key, data)


@pytest.mark.parametrize("retriable", [True, False])
async def test_a_failed_upload_raises_the_stores_error_and_writes_no_manifest(tmp_path, retriable):
    _, closed = build_segments(tmp_path, segments=1, batches=5)
    store = FailingStore("index", RemoteStorageError("slow down", retriable=retriable))
    with pytest.raises(RemoteStorageError, match="slow down") as e:
        await copy(store, closed[0], chunk_size=256)
    assert e.value.retriable is retriable
    assert not any(k.endswith(".manifest") for k in store.objects)
    store = FailingStore("timeindex", OSError("connection reset"))
    with pytest.raises(RemoteStorageError, match="connection reset") as e:
        await copy(store, closed[0], chunk_size=256)
    assert e.value.retriable
