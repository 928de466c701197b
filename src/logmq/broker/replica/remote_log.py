"""The remote tier's shell on a broker (Kafka's RemoteLogManager).

For every partition of a tiered topic (``remote.storage.enable=true`` on a broker with
``remote.log.storage.system.enable=true``) this broker replicates, one task per
``remote.log.manager.task.interval.ms`` asks the sans-IO planner (storage/remote/
planner.py) what to do, given the local segments, the partition's remote segments in
the metadata image, the high watermark, the LSO and the retention settings, and carries
it out: the leader copies closed segments (COPY_STARTED through the controller, the
objects, then COPY_FINISHED), expires remote segments by total retention, deletes
orphans of a copier that died or lost the leadership, and every replica deletes local
segments that local retention lets go once a finished copy covers them. Every state
change goes through the controller, fenced by the leader epoch, so a deposed leader's
copy never becomes live. Reads below the local log start are remote_reads.py's, what
operators see remote_status.py's.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from logmq.cluster.controller_api import RemoteSegmentChange
from logmq.errors import ErrorCode, LogMQError
from logmq.storage import retention
from logmq.storage.checkpoint import atomic_write
from logmq.storage.producer_state import snapshot_path
from logmq.storage.remote import planner as tier
from logmq.storage.remote.segment_files import SegmentFiles, copy_segment, delete_segment
from logmq.storage.remote.segment_metadata import RemoteSegment, SegmentState
from logmq.storage.remote.store import RemoteStorageError

if TYPE_CHECKING:
    from logmq.cluster.metadata_image import MetadataImage
    from logmq.storage.partition_log import PartitionLog
    from logmq.storage.remote.reader import RemoteReader
    from logmq.storage.remote.store import RemoteStore

log = logging.getLogger("logmq.remote")

DELETE_FINISHED = SegmentState.DELETE_FINISHED
# a pass over one partition plans again after each copy, this many times at most (then
# the next pass goes on), so one partition's backlog does not hold its task for ever
MAX_ROUNDS_PER_PASS = 64
# in a tiered partition's directory: the offset DeleteRecords deleted below, over both
# tiers (the local log start alone cannot say it once local retention has moved it)
DELETED_BELOW_FILE = "remote-log-start-offset"

TopicPartition = tuple[str, int]


@dataclass(slots=True)
class TierStats:
    """Counters for the metrics endpoint and ``logmq storage remote status``."""

    segments_copied: int = 0
    bytes_copied: int = 0
    segments_deleted: int = 0
    local_segments_deleted: int = 0
    copy_errors: int = 0
    delete_errors: int = 0
    fetch_requests: int = 0
    fetch_bytes: int = 0
    fetch_errors: int = 0
    corrupt_segments: int = 0  # found corrupt by this broker's reads, and marked so
    segments_recopied: int = 0  # corrupt segments' offsets this follower copied again
    errors_by_kind: dict[str, int] = field(default_factory=dict)

    def error(self, kind: str) -> None:
        self.errors_by_kind[kind] = self.errors_by_kind.get(kind, 0) + 1


def _now_ms() -> int:
    return int(time.time() * 1000)


segment_epochs = tier.epochs_in_force  # what a copy records of its segment


def local_segments(plog: PartitionLog) -> list[tier.LocalSegment]:
    """The planner's view of a log's segments (per segment, never per record)."""
    segs = plog.segments
    out = []
    for i, seg in enumerate(segs):
        closed = i + 1 < len(segs)
        end = segs[i + 1].base_offset - 1 if closed else seg.next_offset - 1
        out.append(tier.LocalSegment(seg.base_offset, end, seg.size, seg.max_timestamp, closed))
    return out


@dataclass(frozen=True, slots=True)
class TierResetState:
    """What a follower reset to the leader's local log start ``offset`` takes from the
    remote tier (KIP-405): the leader epochs up to it, from the remote segments'
    metadata, and the producer snapshot copied with the segment that ends there."""

    offset: int
    epochs: tuple[tuple[int, int], ...]
    snapshot: bytes | None

    def install(self, plog: PartitionLog) -> None:
        for epoch, start in self.epochs:
            plog.leader_epochs.assign(epoch, start)
        if self.snapshot is None:
            return
        try:
            plog.producer_state.load_bytes(self.snapshot)
        except Exception as e:  # checksummed, yet not ours to trust blindly
            plog.producer_state.clear()
            log.warning("remote producer snapshot of %s not loaded: %s", plog, e)


class RemoteLogManager:
    """Copies, expires and reads the remote tier of this broker's tiered partitions.

    Collaborators: ``settings`` (storage/remote/config.py), ``store`` and ``reader``,
    ``logs`` (the LogManager: ``logs()``, ``get_log``), ``image`` (the current metadata
    image), ``updates`` (remote-segment changes through the controller), ``is_controller``
    (the active controller's broker deletes the remote data of deleted topics).
    """

    def __init__(
        self,
        *,
        node_id: int,
        settings: Any,
        store: RemoteStore,
        reader: RemoteReader,
        logs: Any,
        image: Callable[[], MetadataImage],
        updates: Any,
        is_controller: Callable[[], bool] = lambda: False,
        copy_limiter: Any = None,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        self.node_id = node_id
        self.settings = settings
        self.store = store
        self.reader = reader
        self.logs = logs
        self._image = image
        self.updates = updates
        self._is_controller = is_controller
        self._copy_limiter = copy_limiter
        self.clock = clock
        self.stats = TierStats()
        self._in_flight: set[str] = set()  # segment ids being copied or deleted here
        self._marking: set[str] = set()  # segment ids being marked corrupt
        self._busy: set[TopicPartition] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._copy_slots = asyncio.Semaphore(max(1, settings.copier_thread_pool_size))
        self._delete_slots = asyncio.Semaphore(max(1, settings.expiration_thread_pool_size))
        self._stopped = False
        # DeleteRecords' offset per log (weak: a deleted and re-created topic's new
        # log starts afresh)
        self._floors: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        # per log: (its remote segments' tuple, (remote log start, highest copied))
        self._coverages: weakref.WeakKeyDictionary[Any, tuple[Any, tuple[int, int]]] = (
            weakref.WeakKeyDictionary()
        )
        self.last_error: dict[TopicPartition, str] = {}
        # a partition whose store work failed: (failures in a row, monotonic time of the
        # next try), Kafka's remote.log.manager.task.retry.* backoff
        self._retry: dict[TopicPartition, tuple[int, float]] = {}

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        await self.store.check()  # a wrong endpoint, bucket or key stops the start, named
        self._loop_task = asyncio.get_running_loop().create_task(self._run(), name="remote-log")

    async def stop(self) -> None:
        self._stopped = True
        tasks = [t for t in (self._loop_task, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.reader.close()
        await self.store.close()

    def wake(self) -> None:
        """Run a pass soon (a segment rolled, a config changed, a test asks)."""
        self._wake.set()

    async def _run(self) -> None:
        interval = self.settings.task_interval_ms / 1000
        while not self._stopped:
            try:
                self._pass()
            except Exception:  # a bug in one pass must not end tiering for good
                log.exception("remote tier pass failed")
            try:
                await asyncio.wait_for(self._wake.wait(), interval)
            except TimeoutError:
                pass
            self._wake.clear()

    def _back_off(self, key: TopicPartition) -> float:
        """Schedule the partition's next try after a store failure: the backoff doubles
        from remote.log.manager.task.retry.backoff.ms up to .backoff.max.ms, give or take
        .jitter, so a store that is down is not hammered and one that is back is soon
        used again. Returns the delay in seconds."""
        s = self.settings
        failures = self._retry.get(key, (0, 0.0))[0] + 1
        ms = min(s.task_retry_backoff_max_ms, s.task_retry_backoff_ms * 2 ** min(failures - 1, 40))
        ms *= 1 + random.uniform(-s.task_retry_jitter, s.task_retry_jitter)
        self._retry[key] = (failures, time.monotonic() + ms / 1000)
        if not self._stopped:
            asyncio.get_running_loop().call_later(ms / 1000, self.wake)
        return ms / 1000

    def _spawn(self, coro: Any, key: TopicPartition) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._busy.add(key)
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            self._busy.discard(key)
            if not t.cancelled() and t.exception() is not None:
                exc = t.exception()
                log.error("remote tier work for %s-%d failed: %s", *key, exc, exc_info=exc)

        task.add_done_callback(done)

    def _pass(self) -> None:
        image = self._image()
        for plog in self.logs.logs():
            key = (plog.topic, plog.partition)
            if plog.closed or key in self._busy:
                continue
            retry = self._retry.get(key)
            if retry is not None and time.monotonic() < retry[1]:
                continue
            tiered = self.is_tiered(plog)
            plog.remote_managed = tiered
            if tiered:
                self._spawn(self._step(plog, image), key)
        if self._is_controller():
            for topic_id, partition in image.orphaned_remote_partitions():
                key = (f"<deleted {topic_id}>", partition)
                if key not in self._busy:
                    self._spawn(self._delete_removed(image, topic_id, partition), key)

    # -- what is tiered ----------------------------------------------------------------
    def is_tiered(self, plog: PartitionLog) -> bool:
        """Whether this log's topic keeps its history in the remote tier (or still has
        remote data to expire: turned off with remote.log.delete.on.disable)."""
        cfg = plog.config
        return bool(cfg.remote_storage_enable) or bool(
            self.remote_segments(plog.topic, plog.partition)
        )

    def _topic_id(self, topic: str, image: MetadataImage | None = None) -> str | None:
        t = (image or self._image()).topics.get(topic)
        return None if t is None else t.topic_id

    def remote_segments(
        self, topic: str, partition: int, image: MetadataImage | None = None
    ) -> tuple[RemoteSegment, ...]:
        image = image or self._image()
        tid = self._topic_id(topic, image)
        return () if tid is None else image.remote_segments(tid, partition)

    def _coverage(self, plog: PartitionLog) -> tuple[int, int]:
        """(remote log start, highest copied offset), -1 each without a copy: worked out
        once per change of the partition's remote segments (the image replaces their
        tuple on each), not per fetch: every fetch of a tiered partition asks."""
        segments = self.remote_segments(plog.topic, plog.partition)
        cached = self._coverages.get(plog)
        if cached is not None and cached[0] is segments:
            return cached[1]
        runs = (tier.remote_log_start(segments), tier.highest_copied_offset(segments))
        self._coverages[plog] = (segments, runs)
        return runs

    def log_start_offset(self, plog: PartitionLog) -> int:
        """The partition's log start over both tiers (what clients are told): the remote
        tier's start, or the local one, and never below what DeleteRecords deleted."""
        local = plog.log_start_offset
        if not plog.remote_managed:
            return local
        start = self._coverage(plog)[0]
        start = local if start < 0 else min(start, local)
        return max(start, self._deleted_below(plog))

    def _deleted_below(self, plog: PartitionLog) -> int:
        floor = self._floors.get(plog)
        if floor is None:
            try:
                floor = int((plog.dir / DELETED_BELOW_FILE).read_text().strip() or 0)
            except (OSError, ValueError):
                floor = 0
            self._floors[plog] = floor
        return floor

    def delete_records_below(self, plog: PartitionLog, offset: int) -> None:
        """DeleteRecords on a tiered partition: offsets below ``offset`` are gone from
        both tiers at once (written to the partition's directory before the answer, so
        a crash keeps it); the remote segments wholly below it are deleted by the next
        pass, and local ones as for any log."""
        if offset <= self._deleted_below(plog):
            return
        atomic_write(plog.dir / DELETED_BELOW_FILE, b"%d\n" % offset)
        self._floors[plog] = offset
        self.wake()

    def follow_log_start(self, plog: PartitionLog, leader_log_start: int) -> None:
        """A follower's fetch answer carried the leader's log start over both tiers:
        what lies below it is gone (DeleteRecords, remote expiry). Kept as this
        replica's floor, in its directory as on the leader, so a follower that takes
        over answers the same log start; its local segments below go in its next pass."""
        if leader_log_start > self._deleted_below(plog):
            self.delete_records_below(plog, leader_log_start)

    def highest_copied_offset(self, plog: PartitionLog) -> int:
        return self._coverage(plog)[1]

    # -- a follower starting over at the leader's local log start ---------------------
    async def state_at(self, plog: PartitionLog, offset: int) -> TierResetState:
        """The remote tier's state at ``offset`` (ReplicaManager.on_moved_to_tier)."""
        remote = [s for s in self.remote_segments(plog.topic, plog.partition) if s.readable]
        epochs: dict[int, int] = {}
        for seg in remote:
            for epoch, start in seg.leader_epochs:
                if start < offset and start < epochs.get(epoch, start + 1):
                    epochs[epoch] = start
        snapshot = None
        before = tier.segment_for_offset(remote, offset - 1) if offset > 0 else None
        if before is not None and before.end_offset + 1 == offset:
            snapshot = await self.reader.producer_snapshot(plog.topic, before)
        return TierResetState(offset, tuple(sorted(epochs.items())), snapshot)

    # -- one partition's pass ----------------------------------------------------------
    def _view(self, plog: PartitionLog, image: MetadataImage) -> tier.TierView | None:
        part = image.partition(plog.topic, plog.partition)
        if part is None:
            return None
        cfg = plog.config
        settings = tier.TierSettings(
            copy_enabled=bool(cfg.remote_storage_enable) and not cfg.remote_copy_disable,
            remote_enabled=bool(cfg.remote_storage_enable),
            retention_ms=cfg.retention_ms,
            retention_bytes=cfg.retention_bytes,
            local_retention_ms=cfg.effective_local_retention_ms,
            local_retention_bytes=cfg.effective_local_retention_bytes,
            delete_on_disable=bool(cfg.remote_delete_on_disable),
        )
        return tier.TierView(
            broker_id=self.node_id,
            leader_epoch=part.leader_epoch,
            is_leader=part.leader == self.node_id,
            local=local_segments(plog),
            remote=self.remote_segments(plog.topic, plog.partition, image),
            log_start_offset=self.log_start_offset(plog),
            local_log_start_offset=plog.log_start_offset,
            high_watermark=plog.high_watermark,
            last_stable_offset=plog.last_stable_offset,
            log_end_offset=plog.log_end_offset,
            in_flight=frozenset(self._in_flight),
            now_ms=self.clock(),
            settings=settings,
            leader_epochs=tuple(plog.leader_epochs.entries()),
        )

    async def _step(self, plog: PartitionLog, image: MetadataImage) -> None:
        """One partition's pass: plan, act, and plan again while a copy went through
        (each copy's COPY_FINISHED is in the image when it returns), so a leader copies
        every eligible segment in one pass, as Kafka's copy task does, not one per
        remote.log.manager.task.interval.ms."""
        key = (plog.topic, plog.partition)
        for _ in range(MAX_ROUNDS_PER_PASS):
            view = self._view(plog, image)
            if view is None or plog.closed or self._stopped:
                return
            try:
                if view.is_leader:
                    again = await self._act(plog, view, image)
                else:
                    again = await self._follow(plog, view, image)
                self.last_error.pop(key, None)
                self._retry.pop(key, None)
            except RemoteStorageError as e:
                self.last_error[key] = str(e)
                self.stats.error("store_retriable" if e.retriable else "store")
                delay = self._back_off(key)
                log.warning("remote tier of %s-%d: %s (retried in %.1f s)", *key, e, delay)
                return
            except LogMQError as e:
                self.last_error[key] = str(e)
                self.stats.error(e.code.name.lower())
                log.info("remote tier of %s-%d: %s", *key, e)
                return
            if not again:
                return
            image = self._image()

    async def _follow(self, plog: PartitionLog, view: tier.TierView, image: MetadataImage) -> bool:
        """A follower's pass: it lets go of what a finished copy covers, by the same local
        retention as its leader, and copies nothing but the offsets of a segment found
        corrupt that the leader no longer holds and it does. False: a follower plans
        once per pass (what it copied is in the image for the next)."""
        up_to = tier.follower_delete_local_up_to(view)
        if up_to is not None:
            self.stats.local_segments_deleted += retention.delete_local_below(plog, up_to)
        grace = max(3 * self.settings.task_interval_ms, 1000)
        recopy = tier.follower_recopy(view, grace)
        if not recopy:
            return False
        tid = self._topic_id(plog.topic, image)
        assert tid is not None
        for local in recopy:
            log.warning(
                "copying %s-%d [%d, %d] to the remote tier again from this replica: the "
                "copy of these offsets is corrupt and the leader no longer has them",
                plog.topic, plog.partition, local.base_offset, local.end_offset,
            )  # fmt: skip
            await self._copy(plog, tid, local, view.leader_epoch)
            self.stats.segments_recopied += 1
        return False

    def report_corrupt(self, plog: PartitionLog, seg: RemoteSegment) -> None:
        """A read found ``seg``'s objects not matching their checksums: mark it so in the
        quorum (fenced by the leader epoch, as every change), so no broker serves it,
        every replica keeps the offsets it still holds locally, and whichever has them
        copies them again (the leader at once, a follower after a grace)."""
        if seg.corrupt or seg.segment_id in self._marking or self._stopped:
            return
        part = self._image().partition(plog.topic, plog.partition)
        if part is None or part.leader != self.node_id:
            return
        self._marking.add(seg.segment_id)
        self.stats.corrupt_segments += 1
        change = RemoteSegmentChange.found_corrupt(seg, part.leader_epoch, self.clock())

        async def mark() -> None:
            try:
                await self._submit(change)
                log.warning(
                    "marked remote segment %s of %s-%d [%d, %d] corrupt: a replica that "
                    "holds these offsets locally copies them again",
                    seg.segment_id, plog.topic, plog.partition, seg.base_offset, seg.end_offset,
                )  # fmt: skip
            except LogMQError as e:
                log.warning("marking remote segment %s corrupt: %s", seg.segment_id, e)
            finally:
                self._marking.discard(seg.segment_id)
            self.wake()

        task = asyncio.get_running_loop().create_task(mark())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _act(self, plog: PartitionLog, view: tier.TierView, image: MetadataImage) -> bool:
        """Carry out one plan; True if it copied (there may be more to copy)."""
        tid = self._topic_id(plog.topic, image)
        assert tid is not None
        plan = tier.plan_tier(view, max_copies=1)
        for why, segs in (
            ("a copy that did not finish", plan.orphans),
            ("a delete interrupted", plan.resume_deletes),
            ("retention", plan.expire),
            ("found corrupt, and copied again", plan.replaced),
            ("not of this log's leader-epoch lineage: an unclean election", plan.diverged),
        ):
            for seg in segs:
                await self._delete(plog.topic, seg, view.leader_epoch)
                log.info(
                    "deleted remote segment %s of %s-%d [%d, %d] (%s)",
                    seg.segment_id, plog.topic, plog.partition, seg.base_offset,
                    seg.end_offset, why,
                )  # fmt: skip
        for local in plan.copy:
            await self._copy(plog, tid, local, view.leader_epoch)
        if plan.delete_local_up_to is not None and not plog.closed:
            n = retention.delete_local_below(plog, plan.delete_local_up_to)
            self.stats.local_segments_deleted += n
        return bool(plan.copy)

    async def _submit(self, change: RemoteSegmentChange) -> None:
        (outcome,) = await self.updates.submit([change])
        if outcome.error is ErrorCode.RESOURCE_NOT_FOUND and change.state is DELETE_FINISHED:
            return  # a retried DELETE_FINISHED whose first try went through
        if outcome.error is not ErrorCode.NONE:
            raise LogMQError(outcome.message or outcome.error.name, outcome.error)

    async def _set_state(
        self, seg: RemoteSegment, state: SegmentState, leader_epoch: int, checksum: str = ""
    ) -> None:
        await self._submit(
            RemoteSegmentChange.state_change(
                seg.topic_id,
                seg.partition,
                seg.segment_id,
                state,
                leader_epoch,
                checksum=checksum,
                event_ms=self.clock(),
            )
        )

    async def _copy(
        self, plog: PartitionLog, topic_id: str, local: tier.LocalSegment, leader_epoch: int
    ) -> None:
        seg = next((s for s in plog.segments if s.base_offset == local.base_offset), None)
        if seg is None or seg.active:
            return  # gone (DeleteRecords) or not closed yet
        meta = RemoteSegment(
            topic_id=topic_id,
            partition=plog.partition,
            segment_id=uuid.uuid4().hex,
            base_offset=local.base_offset,
            end_offset=local.end_offset,
            max_timestamp=local.max_timestamp,
            size_bytes=local.size_bytes,
            leader_epochs=segment_epochs(
                plog.leader_epochs.entries(), local.base_offset, local.end_offset
            ),
            copier_epoch=leader_epoch,
            broker_id=self.node_id,
            state=SegmentState.COPY_STARTED,
            event_ms=self.clock(),
            topic=plog.topic,
        )
        snap = snapshot_path(plog.dir, local.end_offset + 1)
        files = SegmentFiles(
            log_path=seg.log_path,
            offset_index_path=seg.index_path,
            time_index_path=seg.time_index_path,
            txn_index_path=seg.txn_index_path if seg.txn_index_path.exists() else None,
            producer_snapshot=snap.read_bytes() if snap.exists() else None,
            leader_epochs=meta.leader_epochs,
        )
        async with self._copy_slots:
            self._in_flight.add(meta.segment_id)
            try:
                await self._submit(RemoteSegmentChange.copy_started(meta, leader_epoch))
                _manifest, checksum = await copy_segment(
                    self.store,
                    plog.topic,
                    meta,
                    files,
                    chunk_size=self.settings.chunk_size,
                    rate_limiter=self._copy_limiter,
                )
                await self._set_state(meta, SegmentState.COPY_FINISHED, leader_epoch, checksum)
            except (RemoteStorageError, OSError) as e:
                self.stats.copy_errors += 1
                if isinstance(e, OSError):
                    raise RemoteStorageError(f"copying {seg.log_path}: {e}") from e
                raise
            finally:
                self._in_flight.discard(meta.segment_id)
        self.stats.segments_copied += 1
        self.stats.bytes_copied += local.size_bytes
        log.info(
            "copied %s-%d [%d, %d] (%d bytes) to the remote tier as %s",
            plog.topic,
            plog.partition,
            local.base_offset,
            local.end_offset,
            local.size_bytes,
            meta.segment_id,
        )

    async def _delete(self, topic: str, seg: RemoteSegment, leader_epoch: int) -> None:
        async with self._delete_slots:
            self._in_flight.add(seg.segment_id)
            try:
                if seg.state is not SegmentState.DELETE_STARTED:
                    await self._set_state(seg, SegmentState.DELETE_STARTED, leader_epoch)
                await delete_segment(self.store, topic, seg)
                await self._set_state(seg, DELETE_FINISHED, leader_epoch)
            except RemoteStorageError:
                self.stats.delete_errors += 1
                raise
            finally:
                self._in_flight.discard(seg.segment_id)
        self.stats.segments_deleted += 1

    async def _delete_removed(self, image: MetadataImage, topic_id: str, partition: int) -> None:
        """The remote data of a deleted topic's partition: deleted by the active
        controller's broker, resumable (each segment's state is in the quorum)."""
        segments = image.remote_segments(topic_id, partition)
        log.info(
            "deleting the remote data of a deleted topic (id %s) partition %d: %d segments",
            topic_id,
            partition,
            len(segments),
        )
        for seg in segments:
            if seg.segment_id in self._in_flight:
                continue
            try:
                await self._delete(seg.topic, seg, -1)
            except (RemoteStorageError, LogMQError) as e:
                log.warning("deleting remote data of deleted %s: %s", seg.topic, e)
                return


def build_remote_log(
    node_id: int,
    settings: Any,
    logs: Any,
    image: Callable[[], MetadataImage],
    updates: Any,
    is_controller: Callable[[], bool],
) -> RemoteLogManager:
    """The remote tier of a broker: its store, reader, caches and throttles."""
    from logmq.storage.remote.chunk_cache import ChunkCache, IndexCache
    from logmq.storage.remote.rate_limit import ByteRateLimiter
    from logmq.storage.remote.reader import RemoteReader
    from logmq.storage.remote.stores import build_store

    store = build_store(settings)
    fetch_limit = (
        None if settings.unlimited_fetch else ByteRateLimiter(settings.fetch_max_bytes_per_second)
    )
    copy_limit = (
        None if settings.unlimited_copy else ByteRateLimiter(settings.copy_max_bytes_per_second)
    )
    reader = RemoteReader(
        store,
        chunk_cache=ChunkCache(settings.chunk_cache_bytes),
        index_cache=IndexCache(settings.index_cache_bytes),
        fetch_rate_limiter=fetch_limit,
        max_pending=settings.reader_max_pending_tasks,
        threads=settings.reader_threads,
    )
    return RemoteLogManager(
        node_id=node_id,
        settings=settings,
        store=store,
        reader=reader,
        logs=logs,
        image=image,
        updates=updates,
        is_controller=is_controller,
        copy_limiter=copy_limit,
    )
