"""All partition logs of one broker under one data directory, plus their chores.

The manager owns the background tasks (retention, flush.ms flusher, checkpoints, the
log cleaner of compacted topics), the durability policy of appends (group commit,
flush.messages) and the shared LRU of open segment files. ``start`` loads every log,
recovering those that did not shut down cleanly; ``stop`` flushes, checkpoints and
leaves the clean-shutdown marker.

Per-topic config overrides are not the storage's to persist: the caller's metadata
(the broker's topic store, later the Raft metadata image) is their one source of
truth. The caller hands them over before ``start`` (``topic_overrides``) and on every
change (``create_log``/``set_topic_config``); the manager keeps them in memory only.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from logmq.errors import CorruptRecordError, DiskFullError, InvalidConfigError, StorageError
from logmq.storage import checkpoint as ckpt
from logmq.storage.compaction import CleanStats, check_record_keys
from logmq.storage.config import LogConfig
from logmq.storage.disk_space import DiskSpace
from logmq.storage.format_upgrade import upgrade_data_dir
from logmq.storage.log_cleaner import DEFAULT_BUFFER_BYTES, DEFAULT_INTERVAL_MS, LogCleaner
from logmq.storage.open_files import OpenFileCache
from logmq.storage.partition_log import AppendInfo, PartitionLog, parse_dir_name, run_flush_jobs
from logmq.storage.recompress import to_codec
from logmq.storage.segment import make_log_dirs

log = logging.getLogger(__name__)

CLEAN_SHUTDOWN = ".clean-shutdown"
RECOVERY_POINT_CHECKPOINT = "recovery-point-checkpoint"
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
DELETE_SUFFIX = ".delete"


@dataclass(slots=True)
class _Committer:
    """Group commit state of one log: appends waiting for the next fsync."""

    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


_CLOSE_THREADS = 16  # fsyncs in flight at once when closing many logs
_TICK_SYNCS = 4  # background syncs in flight at once (the default thread pool is shared)


def _make_dirs(plogs: list[PartitionLog], data_dir: Path, lock: threading.Lock) -> None:
    """The directories and first segment files of new logs, then one fsync of the data
    directory for them all (produce requests to these logs wait for this:
    LogManager.new_logs_made). ``lock`` is held while they are made, so a log deleted
    meanwhile (closed under the same lock) is either skipped or made and then deleted,
    never made again after its deletion."""
    with lock:
        dirs, files = [], []
        for plog in plogs:
            if not plog.closed:  # deleted meanwhile: leave nothing behind
                dirs.append(str(plog.dir))
                files.append(str(plog.active_segment.log_path))
        make_log_dirs(dirs, files)
    ckpt.fsync_dir(data_dir)


class _NewLogsGate:
    """Where produce requests to new logs wait while a worker makes their directories.

    They leave in the order they came, one at a time, each starting its appends before
    the next resumes, and a later request waits behind any still queued: records of
    one partition keep their produce order (and producer sequences)."""

    def __init__(self, plogs: list[PartitionLog], gates: dict[PartitionLog, _NewLogsGate]):
        self._plogs, self._gates = plogs, gates
        self._made = False
        self._queue: collections.deque[asyncio.Future[None]] = collections.deque()

    def open(self) -> None:
        self._made = True
        self._next()

    async def passed(self) -> None:
        if self._made and not self._queue:
            return
        fut = asyncio.get_running_loop().create_future()
        self._queue.append(fut)
        try:
            await fut
        finally:
            self._queue.remove(fut)
            self._next()  # the next one resumes after this request has started its appends

    def _next(self) -> None:
        if not self._made:
            return
        if self._queue:
            if not self._queue[0].done():
                self._queue[0].set_result(None)
            return
        for plog in self._plogs:  # drained: appends to these logs go straight on
            if self._gates.get(plog) is self:
                del self._gates[plog]


def _try_run_jobs(jobs: list[Any]) -> OSError | None:
    try:
        run_flush_jobs(jobs)
    except OSError as e:
        return e
    return None


def _try_flush_epochs(plog: PartitionLog) -> Exception | None:
    try:
        plog.leader_epochs.flush()
    except OSError as e:
        return StorageError(f"writing the leader epochs of {plog.dir}: {e}")
    return None


def _try_snapshot(plog: PartitionLog) -> Exception | None:
    try:
        plog.write_producer_snapshot()
    except (OSError, StorageError) as e:
        return e
    return None


TopicOverrides = Mapping[str, Mapping[str, str]]
# An offset checkpoint's content: offsets, and the recovery point's positions
_CheckpointValue = tuple[dict[tuple[str, int], int], dict[tuple[str, int], tuple[int, int]] | None]


def _check_topic_name(topic: str) -> None:
    if not topic or "/" in topic or topic in (".", ".."):
        raise InvalidConfigError(f"invalid topic name {topic!r}")


class LogManager:
    def __init__(
        self,
        data_dir: str | Path,
        default_config: LogConfig | None = None,
        *,
        max_open_segments: int = 1000,
        retention_check_interval_ms: int = 300_000,
        checkpoint_interval_ms: int = 60_000,
        flush_check_interval_ms: int = 100,
        idle_close_ms: int = 600_000,
        topic_overrides: TopicOverrides | Callable[[], TopicOverrides] | None = None,
        cleaner_enabled: bool = True,
        cleaner_interval_ms: int = DEFAULT_INTERVAL_MS,
        cleaner_buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        min_free_bytes: int | None = None,
        tiered_storage: bool = False,
    ) -> None:
        """``topic_overrides``: per-topic config overrides (or a callable returning them,
        called once by ``start``) that the logs found on disk open with.

        ``cleaner_*``: the background log cleaner of compacted topics: whether it runs,
        how often it looks for dirty logs, and the memory its offset map may use
        (about 128 bytes per distinct key; more keys take several passes).

        ``min_free_bytes``: below this much free space client appends are refused
        (disk_space.py; None: the smaller of 1 GiB and 5% of the disk).

        ``tiered_storage`` (remote.log.storage.system.enable): the logs of topics with
        remote.storage.enable are left to the remote tier's planner, which deletes a
        local segment only once its copy is finished; plain retention skips them."""
        self.data_dir = Path(data_dir)
        self.default_config = default_config or LogConfig()
        self.cache = OpenFileCache(max_open_segments)
        self.retention_check_interval_ms = retention_check_interval_ms
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self.flush_check_interval_ms = flush_check_interval_ms
        self.idle_close_ms = idle_close_ms
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        self._initial_overrides = topic_overrides
        self._topic_overrides: dict[str, dict[str, str]] = {}
        self._committers: dict[tuple[str, int], _Committer] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._checkpoint_lock = threading.Lock()
        self._checkpointed: dict[str, _CheckpointValue] = {}  # as last written
        self._timed_flush: list[PartitionLog] | None = None  # logs with flush.ms; None: stale
        self._changes_at_tick: dict[tuple[str, int], int] = {}  # unflushed logs, last tick
        self._dir_jobs: set[asyncio.Future[None]] = set()  # directories of new logs
        self._dirs_lock = threading.Lock()  # making new logs' directories vs deleting logs
        self._dir_gates: dict[PartitionLog, _NewLogsGate] = {}  # logs being made
        self.cleaner_enabled = cleaner_enabled
        self.cleaner = LogCleaner(
            self.logs, interval_ms=cleaner_interval_ms, buffer_bytes=cleaner_buffer_bytes
        )
        self.started = False
        self.recovered_logs: list[str] = []  # logs that went through crash recovery
        self.offline_logs: dict[tuple[str, int], str] = {}  # logs that failed to open
        self.disk = DiskSpace(self.data_dir, min_free_bytes)
        self.tiered_storage = tiered_storage

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self._load_all)
        self.disk.refresh()
        loop = asyncio.get_running_loop()
        self._tasks = [
            # Notices freed space (and a disk filling up) without produce traffic.
            loop.create_task(self._every(int(self.disk.check_interval_s * 1000), self.disk.poll)),
            loop.create_task(self._every(self.retention_check_interval_ms, self.run_retention)),
            loop.create_task(self._every(self.checkpoint_interval_ms, self._checkpoint_tick)),
            loop.create_task(self._every(self.flush_check_interval_ms, self._flush_tick)),
            loop.create_task(self._every(max(1, self.idle_close_ms // 4), self._close_idle)),
        ]
        if self.cleaner_enabled:
            self._tasks.append(self.cleaner.start())
        self.started = True

    def _load_all(self) -> None:
        initial = self._initial_overrides
        if callable(initial):
            initial = initial()
        for topic, overrides in (initial or {}).items():
            self._topic_overrides[topic] = {str(k): str(v) for k, v in overrides.items()}
        # Batch format 1 data is converted before any log opens (may drop the marker).
        upgrade_data_dir(self.data_dir, compacted=lambda t: self.config_for(t).compact)
        marker = self.data_dir / CLEAN_SHUTDOWN
        clean = marker.exists()
        rps, positions = ckpt.read_offsets_and_positions(self.data_dir / RECOVERY_POINT_CHECKPOINT)
        hws = ckpt.read_offsets(self.data_dir / REPLICATION_OFFSET_CHECKPOINT)
        lsos = ckpt.read_offsets(self.data_dir / LOG_START_OFFSET_CHECKPOINT)
        self._checkpointed = {
            RECOVERY_POINT_CHECKPOINT: (rps, positions),
            REPLICATION_OFFSET_CHECKPOINT: (hws, None),
            LOG_START_OFFSET_CHECKPOINT: (lsos, None),
        }
        for entry in sorted(os.scandir(self.data_dir), key=lambda e: e.name):
            if not entry.is_dir():
                continue
            if entry.name.endswith(DELETE_SUFFIX):
                shutil.rmtree(entry.path, ignore_errors=True)  # finish an interrupted delete
                continue
            try:
                key = parse_dir_name(entry.name)
            except ValueError:
                continue
            try:
                plog = PartitionLog(
                    entry.path,
                    self.config_for(key[0]),
                    cache=self.cache,
                    clean_shutdown=clean,
                    recovery_point=rps.get(key),
                    recovery_position=positions.get(key),
                    log_start_offset=lsos.get(key, 0),
                    high_watermark=hws.get(key, 0),
                    names=os.listdir(entry.path),  # listed once: no isdir, no second listing
                )
                plog.remote_managed = self._tiered(plog)
            except (OSError, StorageError, CorruptRecordError) as e:
                # One unreadable partition must not take the whole broker down.
                log.error("cannot open log %s, leaving it offline: %s", entry.path, e)
                self.offline_logs[key] = str(e)
                continue
            if not clean:
                self.recovered_logs.append(entry.name)
            self._logs[key] = plog
        self._timed_flush = None
        if clean:
            marker.unlink()
            ckpt.fsync_dir(self.data_dir)
        elif self._logs or self.offline_logs:
            log.warning(
                "no clean-shutdown marker in %s: recovered %d logs",
                self.data_dir,
                len(self._logs),
            )
        # A recovered log starts with its recovery point at its end, and the epochs its
        # scan found only in memory: write them now (all logs together), or a quiet log,
        # never flushed again, would checkpoint that recovery point without them and
        # the next crash would skip the scan and lose its epoch history.
        pending = [p for p in self._logs.values() if p.leader_epochs.unflushed]
        for err in self._write_small_files(pending) if pending else []:
            log.error("cannot write recovered leader epochs: %s", err)

    async def stop(self) -> None:
        """Stop chores, wait for pending syncs, close every log, leave the clean marker."""
        if not self.started:
            return
        self.started = False
        await self.cleaner.stop()  # a cleaning in progress gives up; nothing is lost
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self._dirs_made()
        for c in list(self._committers.values()):
            if c.task is not None:
                with contextlib.suppress(Exception):
                    await c.task
        errors = await asyncio.to_thread(self._close_all)  # fsyncs: off the event loop
        if errors:
            log.error("unclean stop of %s: %s", self.data_dir, errors[0])
            return  # without the marker, the next start recovers
        ckpt.atomic_write(self.data_dir / CLEAN_SHUTDOWN, b"")

    def _close_all(self) -> list[Exception]:
        """Close every log; the fsyncs of many logs run side by side.

        With thousands of partitions, closing one after the other waits for thousands
        of fsyncs in turn; issued from a pool, the file system commits them together.
        The flush jobs are taken and the handles released on this thread (they touch
        the shared open-file cache); only the fsyncs and snapshot writes go to the pool.
        """
        errors: list[Exception] = []
        logs = [p for p in self._logs.values() if not p.closed]
        flushing = [(p, *p.flush_jobs(epochs=False)) for p in logs if p.needs_flush]
        with ThreadPoolExecutor(_CLOSE_THREADS, thread_name_prefix="log-close") as pool:
            done = pool.map(_try_run_jobs, [jobs for _, jobs, _ in flushing])
            for (plog, jobs, mark), err in zip(flushing, done, strict=True):
                if err is None:
                    plog.flush_done(jobs, mark)
                else:
                    errors.append(StorageError(f"fsync failed in {plog.dir}: {err}"))
        errors += self._write_small_files(logs)
        for plog in logs:
            if plog.needs_flush:
                continue  # its fsync failed: closing would only fail again
            try:
                plog.close()
            except (OSError, StorageError) as e:
                errors.append(e)
        self.write_checkpoints()
        return errors

    def _write_small_files(self, logs: list[PartitionLog]) -> list[Exception]:
        """Every log's pending leader-epoch checkpoint and producer snapshot, written
        together with two file-system syncs (checkpoint.atomic_write_many) rather than
        with two fsyncs each. A file that could not be written that way is retried on
        its own, the way that also makes a missing log directory."""
        files: list[tuple[Any, bytes]] = []
        owners: list[tuple[PartitionLog, bool]] = []  # (log, is its producer snapshot)
        for plog in logs:
            epochs = plog.leader_epochs
            if epochs.unflushed and epochs.path is not None:
                data = epochs.take_checkpoint(plog.log_end_offset)
                if data is not None:
                    files.append((epochs.path, data))
                    owners.append((plog, False))
            if plog.needs_snapshot and not plog.needs_flush:
                files.append(plog.producer_snapshot_file())
                owners.append((plog, True))
        if not files:
            return []
        try:
            failed = ckpt.atomic_write_many(files, self.data_dir)
        except OSError as e:
            for plog, snapshot in owners:
                if not snapshot:
                    plog.leader_epochs.unflushed = True  # not written: close() tries again
            return [StorageError(f"syncing {self.data_dir} failed: {e}")]
        errors: list[Exception] = []
        for i, (plog, snapshot) in enumerate(owners):
            if i in failed:
                err = _try_snapshot(plog) if snapshot else _try_flush_epochs(plog)
                if err is not None:
                    errors.append(err)
            elif snapshot:
                plog.producer_snapshot_written()
        return errors

    async def _every(self, interval_ms: int, fn: Any) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                result = fn()
                if asyncio.iscoroutine(result):
                    await result
            except (OSError, StorageError) as e:  # a full disk, say: no traceback per tick
                log.error("background storage task %s failed: %s", getattr(fn, "__name__", fn), e)
            except Exception:
                log.exception("background storage task %s failed", getattr(fn, "__name__", fn))

    # -- logs and configs -----------------------------------------------------------------

    def config_for(self, topic: str) -> LogConfig:
        overrides = self._topic_overrides.get(topic)
        return self.default_config.merged(overrides) if overrides else self.default_config

    def create_log(
        self, topic: str, partition: int, overrides: dict[str, str] | None = None
    ) -> PartitionLog:
        key = (topic, partition)
        self.create_logs([key], {topic: overrides} if overrides else None)
        return self._logs[key]

    def create_logs(
        self,
        keys: Iterable[tuple[str, int]],
        overrides: Mapping[str, Mapping[str, str]] | None = None,
    ) -> list[PartitionLog]:
        """Create the logs of ``keys`` that do not exist yet; returns the new ones.

        A new log is usable at once and touches no disk on this thread: a worker
        thread makes the directories (then fsyncs the data directory once), and a
        log's first segment file is made by its first write (a write that comes
        first makes the directory itself; its first sync makes both durable). A
        topic of 10,000 partitions so costs the event loop no file-system calls, and
        ``stop`` waits for the directories.
        ``overrides``: per-topic config overrides to set first (where they changed).
        """
        for topic, wanted in (overrides or {}).items():
            _check_topic_name(topic)
            if wanted and dict(wanted) != self._topic_overrides.get(topic):
                self.set_topic_config(topic, wanted)
        made = []
        try:
            for key in keys:
                if key in self._logs:
                    continue
                topic, partition = key
                _check_topic_name(topic)
                path = self.data_dir / f"{topic}-{partition}"
                plog = PartitionLog(path, self.config_for(topic), cache=self.cache)
                plog.remote_managed = self._tiered(plog)
                self._logs[key] = plog
                made.append(plog)
        finally:
            self._timed_flush = None
            if made:
                self._make_dirs_soon(made)
        return made

    def _make_dirs_soon(self, plogs: list[PartitionLog]) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (tools, tests): here and now
            _make_dirs(plogs, self.data_dir, self._dirs_lock)
            return
        job = loop.run_in_executor(None, _make_dirs, plogs, self.data_dir, self._dirs_lock)
        self._dir_jobs.add(job)
        gate = _NewLogsGate(plogs, self._dir_gates)
        for plog in plogs:
            self._dir_gates[plog] = gate
        job.add_done_callback(lambda job: self._dir_job_done(job, gate))

    def _dir_job_done(self, job: asyncio.Future[None], gate: _NewLogsGate) -> None:
        self._dir_jobs.discard(job)
        gate.open()
        if not job.cancelled() and job.exception() is not None:
            # Not fatal: a log's first write makes its directory if it is still missing.
            log.error("making log directories in %s failed: %s", self.data_dir, job.exception())

    async def new_logs_made(self, keys: Iterable[tuple[str, int]]) -> None:
        """Wait until the directories and first files of these logs exist, if a worker
        is still making them; callers come through in the order they came.

        A produce request calls this once before its appends: thousands of new
        partitions' files are then not created one by one on the event loop (racing
        the worker, stalling the loop for seconds, heartbeats included), and no append
        task waits on its own. An append that did not wait makes what is missing.
        """
        gates = self._dir_gates
        if not gates:
            return
        logs = self._logs
        waiting = {id(g): g for k in keys if (p := logs.get(k)) is not None and (g := gates.get(p))}
        for gate in waiting.values():
            await gate.passed()

    async def _dirs_made(self) -> None:
        """Wait for the directories of the logs created so far."""
        while self._dir_jobs:
            await asyncio.gather(*list(self._dir_jobs), return_exceptions=True)

    def get_log(self, topic: str, partition: int) -> PartitionLog | None:
        return self._logs.get((topic, partition))

    def logs(self) -> list[PartitionLog]:
        return list(self._logs.values())

    def topic_overrides(self, topic: str) -> dict[str, str]:
        return dict(self._topic_overrides.get(topic, {}))

    def delete_log(self, topic: str, partition: int) -> None:
        """Remove a partition: rename its directory to ``*.delete`` (durable), then remove."""
        plog = self._logs.pop((topic, partition), None)
        self._timed_flush = None
        path = self.data_dir / f"{topic}-{partition}"
        if plog is None:
            if self.offline_logs.pop((topic, partition), None) is None or not path.exists():
                return
        else:
            self._committers.pop((topic, partition), None)
            with self._dirs_lock:  # a worker making its directory finishes first
                try:
                    plog.close_handles()
                except OSError as e:  # deleting frees space: a full disk must not stop it
                    log.error("closing %s before deleting it: %s", plog, e)
            path = plog.dir
        if path.exists():  # a log never written has no directory
            doomed = path.with_name(f"{path.name}.{int(time.time() * 1000)}{DELETE_SUFFIX}")
            os.replace(path, doomed)
            ckpt.fsync_dir(self.data_dir)
            shutil.rmtree(doomed, ignore_errors=True)
        if not any(t == topic for t, _ in self._logs):
            self._topic_overrides.pop(topic, None)

    def set_topic_config(self, topic: str, overrides: Mapping[str, str]) -> None:
        """Replace a topic's overrides (validated; in memory) and apply them to its logs.

        Persisting them is the caller's job: it passes them back at the next start.
        """
        cfg = self.default_config.merged(dict(overrides))  # raises InvalidConfigError
        self._topic_overrides[topic] = {str(k): str(v) for k, v in overrides.items()}
        self._timed_flush = None
        for (t, _), plog in self._logs.items():
            if t == topic:
                plog.config = cfg
                # turned on: tiered at once; turned off: the remote tier's pass keeps it
                # tiered while remote data is left to read or delete
                plog.remote_managed = plog.remote_managed or self._tiered(plog)

    def _tiered(self, plog: PartitionLog) -> bool:
        """Whether the remote tier holds this log's older part from the start (so a
        fetch below its local log start is answered from there even before the tier's
        first pass)."""
        return self.tiered_storage and plog.config.remote_storage_enable

    # -- appends and durability -----------------------------------------------------------

    def truncate_to(self, plog: PartitionLog, offset: int) -> None:
        """Truncate a log and checkpoint its lowered recovery point at once.

        Prefer this to ``plog.truncate_to``: a stale, higher recovery point on disk would
        let a later crash skip re-validating the rewritten range.
        """
        plog.truncate_to(offset)
        self.write_checkpoints()

    async def append(self, plog: PartitionLog, data: Any, *, leader_epoch: int = 0) -> AppendInfo:
        """Append, then return only once the data is as durable as the topic's policy says
        (``write``, then ``sync`` when ``must_sync`` says so)."""
        info = self.write(plog, data, leader_epoch=leader_epoch)
        if self.must_sync(plog, info):
            await self.sync(plog)
        return info

    def write(
        self, plog: PartitionLog, data: Any, *, leader_epoch: int = 0, control: bool = False
    ) -> AppendInfo:
        """The append itself, at once: checked, converted and written (not yet synced).

        A compacted topic refuses records without a key (InvalidRecordError), as Kafka's
        does: checking decodes the records, a cost only compacted topics pay. A topic
        with a named compression.type gets its batches in that codec (recompress.py):
        this is the leader's append, followers store the leader's bytes as they are.
        Below the free-space guard, or after a write hit a full disk, the append is
        refused at once with DiskFullError and nothing of it is written.
        """
        disk = self.disk
        disk.check_append(len(data))
        cfg = plog.config
        if not control:  # a transaction marker is written as the coordinator made it
            if cfg.compression_type != "producer":
                data = to_codec(data, cfg.broker_codec, cfg.max_message_bytes)
            if cfg.compact:
                check_record_keys(data, cfg.max_message_bytes)
        try:
            info = plog.append(data, leader_epoch=leader_epoch, control=control)
        except DiskFullError as e:
            disk.write_failed(len(data))
            raise DiskFullError(f"{disk.describe()}: {e}") from e
        disk.appended(len(data))
        return info

    def must_sync(self, plog: PartitionLog, info: AppendInfo) -> bool:
        """Whether the append ``write`` just made waits for an fsync before its answer: a
        group-commit topic (a retried duplicate too, until its first write is synced) or
        one whose flush.messages count is reached."""
        cfg = plog.config
        if info.duplicate:
            return cfg.group_commit and plog.recovery_point <= info.last_offset
        return cfg.group_commit or (
            cfg.flush_messages is not None and plog.unflushed_messages >= cfg.flush_messages
        )

    async def sync(self, plog: PartitionLog) -> None:
        """Wait until everything appended so far is fsynced.

        Appends waiting while an fsync runs share the next one: one fdatasync covers
        all of them (group commit). The fsync runs in a worker thread.
        """
        key = (plog.topic, plog.partition)
        c = self._committers.get(key)
        if c is None:
            c = self._committers[key] = _Committer()
        fut = asyncio.get_running_loop().create_future()
        c.waiters.append(fut)
        if c.task is None or c.task.done():
            c.task = asyncio.get_running_loop().create_task(self._commit_loop(plog, c))
        await fut

    async def _commit_loop(self, plog: PartitionLog, c: _Committer) -> None:
        while c.waiters:
            waiting, c.waiters = c.waiters, []
            try:
                jobs, mark = plog.flush_jobs()
                if jobs:
                    await asyncio.to_thread(run_flush_jobs, jobs)
                plog.flush_done(jobs, mark)
                err: BaseException | None = None
            except (OSError, StorageError) as e:
                err = StorageError(f"fsync failed for {plog.topic}-{plog.partition}: {e}")
            for fut in waiting:
                if fut.done():
                    continue
                if err is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(err)

    async def _flush_tick(self) -> None:
        # Runs every flush_check_interval_ms: it looks only at logs whose topic sets
        # flush.ms, so thousands of other partitions cost it nothing.
        timed = self._timed_flush
        if timed is None:
            timed = [p for p in self._logs.values() if p.config.flush_ms is not None]
            self._timed_flush = timed
        if not timed:
            return
        now = int(time.time() * 1000)
        for plog in list(timed):
            ms = plog.config.flush_ms
            if (
                ms is not None
                and plog.recovery_point < plog.log_end_offset
                and now - plog.last_flush_ms >= ms
                and not plog.closed
            ):
                await self.sync(plog)

    async def _checkpoint_tick(self) -> None:
        # Like Kafka's flush-on-roll: rolled segments become durable in the background,
        # which lets the recovery point (and so crash recovery work) move forward. So
        # does a log written to before the last tick and not since: once a partition
        # goes quiet its recovery point catches up, and a crash then scans only the
        # partitions written to lately, not every partition ever written.
        due = []
        seen = self._changes_at_tick
        self._changes_at_tick = {}
        for key, plog in list(self._logs.items()):
            if plog.closed:
                continue
            changes = plog.changes
            if plog.recovery_point < plog.active_segment.base_offset or (
                plog.needs_flush and seen.get(key) == changes
            ):
                due.append(plog)
            elif plog.needs_flush:
                self._changes_at_tick[key] = changes
            plog.delete_expired_files()  # retired segments whose delete delay passed
        for i in range(0, len(due), _TICK_SYNCS):  # a bounded share of the worker threads
            batch = due[i : i + _TICK_SYNCS]
            results = await asyncio.gather(*(self.sync(p) for p in batch), return_exceptions=True)
            for plog, result in zip(batch, results, strict=True):
                if isinstance(result, Exception):
                    log.error("background flush of %s failed: %s", plog, result)
        await self.checkpoint()

    def _close_idle(self) -> int:
        """Release descriptors and index mappings of segments nobody used for a while."""
        return self.cache.close_idle(self.idle_close_ms / 1000)

    def run_retention(self) -> int:
        """One retention pass over every log (also rolls segments older than segment.ms)."""
        deleted = 0
        for plog in list(self._logs.values()):
            if plog.closed:
                continue
            try:
                plog.roll_if_old()
                if self.tiered_storage and plog.config.remote_storage_enable:
                    # the remote tier's planner deletes local segments once copied
                    plog.delete_expired_files()
                    continue
                deleted += plog.delete_old_segments()
            except (OSError, StorageError) as e:
                log.error("retention failed for %s: %s", plog, e)
        return deleted

    async def clean(self, plog: PartitionLog, *, force: bool = True) -> CleanStats | None:
        """Compact one log now (tests, admin), heavy work in a worker thread.

        ``force`` ignores min.cleanable.dirty.ratio; min.compaction.lag.ms, the high
        watermark and the active segment still bound what is cleaned. None when the
        log is not compacted or nothing is cleanable.
        """
        return await self.cleaner.clean(plog, force=force)

    def _checkpoint_values(self) -> list[tuple[str, _CheckpointValue]]:
        logs = list(self._logs.items())
        # A log whose leader epochs are not on disk yet keeps the recovery point last
        # written (none: a full scan), so that a crash scans the records whose epochs
        # would otherwise be lost with it: the epochs are rebuilt from the batches.
        rps_then, positions_then = self._checkpointed.get(RECOVERY_POINT_CHECKPOINT, ({}, {}))
        rps: dict[tuple[str, int], int] = {}
        positions: dict[tuple[str, int], tuple[int, int]] = {}
        for k, p in logs:
            if not p.leader_epochs.unflushed:
                rps[k] = p.recovery_point
                if p.recovery_position is not None:
                    positions[k] = p.recovery_position
            elif k in rps_then:
                rps[k] = min(rps_then[k], p.recovery_point)
                if positions_then and k in positions_then and rps[k] == rps_then[k]:
                    positions[k] = positions_then[k]
        return [
            (RECOVERY_POINT_CHECKPOINT, (rps, positions)),
            (REPLICATION_OFFSET_CHECKPOINT, ({k: p.high_watermark for k, p in logs}, None)),
            (LOG_START_OFFSET_CHECKPOINT, ({k: p.log_start_offset for k, p in logs}, None)),
        ]

    def _write_offset_files(self, values: list[tuple[str, _CheckpointValue]]) -> None:
        # One writer at a time: the files share fixed temp names, and the periodic
        # checkpoint (a worker thread) may meet one written on demand. A file whose
        # content would not change is not rewritten: idle partitions cost no fsyncs.
        with self._checkpoint_lock:
            for name, value in values:
                if self._checkpointed.get(name) == value:
                    continue
                ckpt.write_offsets(self.data_dir / name, *value)
                self._checkpointed[name] = value

    async def checkpoint(self) -> None:
        """Write the offset checkpoints now, off the event loop (values taken on it)."""
        await asyncio.to_thread(self._write_offset_files, self._checkpoint_values())

    def write_checkpoints(self) -> None:
        """Write the recovery-point, high-watermark and log-start checkpoints now."""
        self._write_offset_files(self._checkpoint_values())
