"""The replica manager: the produce and read paths, and the replicas' shell.

It is the one writer of every partition's high watermark and owns the leader's side
of the data path: ``append`` (a single broker's partition has no other replica, so its
HW is its log end offset; a replicated one checks min.insync.replicas, stamps its
leader epoch, lets the HW move and parks acks=all until the HW passes the batch),
consumer reads (``leader_log``, ``fetch_for_consumer``: below the HW, from the leader,
fenced by the client's leader epoch) and ``fetch_for_follower`` (a follower's fetch
records its LEO and long-polls on appends and HW moves, under the reassignment
throttle). The metadata layer tells it which local partitions now lead, follow or are
gone (``apply_changes``); follower fetchers (replica_fetcher.py) hand it the leader's
batches. Each partition's decisions come from
its sans-IO ``PartitionReplica``; this module only performs the returned actions (set
the HW, wake fetches, truncate, ask the controller for an ISR change, complete acks=all
waiters) and owns the tick task and the fetchers. It never decodes records.

Wiring into a broker: create it after the LogManager with ``alter_partition`` (sends an
``AlterPartitionRequest`` to the controller and returns its ``AlterPartitionResponse``),
``broker_address`` (node id -> (host, port) from the image's registrations),
``leader_logs`` (LocalLogs), ``metadata`` (the current image), ``broker_epoch`` and
``replicated`` (a cluster: every local partition has a replica); give it to the data
handlers; ``await start()``; register ``on_partitions_changed`` with the
MetadataPublisher after the listener that creates logs; ``await stop()`` before the
server drains, so parked acks=all requests answer at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from logmq.broker.fetch_results import PartitionRead, TopicRead, failed
from logmq.broker.replica_fetcher import FetcherConfig, ReplicaFetcher
from logmq.cluster.controller_api import AlterPartitionRequest, AlterPartitionResponse
from logmq.errors import DiskFullError, ErrorCode, LogMQError
from logmq.gcpause import gc_paused
from logmq.replication.partition_replica import (
    AlterIsr,
    AskLeaderEpoch,
    HighWatermarkChanged,
    PartitionReplica,
    ProduceCompleted,
    ReplicaConfig,
    ResetTo,
    StartFetching,
    TruncateTo,
)
from logmq.replication.throttle import ReassignmentQuota, configured_rate
from logmq.storage import batch as b

if TYPE_CHECKING:
    from logmq.broker.fetch_sessions import FetchSession, SessionPartition
    from logmq.broker.fetch_waiter import FetchWaiters
    from logmq.cluster.metadata_image import LocalReplicaChanges, MetadataImage
    from logmq.storage.log_manager import LogManager
    from logmq.storage.partition_log import PartitionLog
    from logmq.storage.stamping import AppendInfo

NO_ERROR = ErrorCode.NONE

log = logging.getLogger("logmq.replication")

TopicPartition = tuple[str, int]
AlterPartitions = Callable[[list[AlterPartitionRequest]], Awaitable[list[AlterPartitionResponse]]]
MAX_ISR_BATCH = 2000  # partitions per AlterPartition request
Role = Literal["leader", "follower", "removed"]


@dataclass(frozen=True, slots=True)
class PartitionChange:
    """One local partition's new role, as the metadata image decided it.

    It carries the fields of ``PartitionState`` (partition_replica.py), so it is what
    the replica is told directly.
    """

    topic: str
    partition: int
    role: Role
    leader: int = -1
    leader_epoch: int = -1
    partition_epoch: int = -1
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()

    @property
    def key(self) -> TopicPartition:
        return (self.topic, self.partition)


def changes_from_local(local: LocalReplicaChanges) -> list[PartitionChange]:
    """Adapt ``MetadataDelta.local_changes`` (cluster/metadata_image.py) to changes."""
    out = [PartitionChange(t, p, "removed") for t, p in sorted(local.deleted)]
    for role, regs in (("leader", local.leaders), ("follower", local.followers)):
        for reg in regs.values():
            out.append(
                PartitionChange(
                    reg.topic,
                    reg.partition,
                    role,  # type: ignore[arg-type]
                    reg.leader,
                    reg.leader_epoch,
                    reg.partition_epoch,
                    tuple(reg.replicas),
                    tuple(reg.isr),
                )
            )
    return out


@dataclass(frozen=True, slots=True)
class ReplicationConfig:
    replica_lag_time_max_ms: int = 30_000
    tick_ms: int = 100  # ISR checks and acks=all deadlines run this often
    alter_isr_retry_ms: int = 5_000
    fetcher: FetcherConfig = dataclasses.field(default_factory=FetcherConfig)

    def __post_init__(self) -> None:
        # A follower parked in a long poll is not fetching: a lag time shorter than the
        # poll would drop idle, caught-up followers from the ISR (Kafka has the same rule).
        if self.fetcher.max_wait_ms >= self.replica_lag_time_max_ms:
            raise ValueError(
                f"replica fetch max wait ({self.fetcher.max_wait_ms} ms) must be below "
                f"replica.lag.time.max.ms ({self.replica_lag_time_max_ms} ms)"
            )
        if self.tick_ms < 1:
            raise ValueError(f"tick_ms must be >= 1, got {self.tick_ms}")


LEADER_EPOCH = 0  # a partition with a single replica: the one and only leader epoch


class LeaderLogs(Protocol):
    def leader_log(self, topic: str, partition: int) -> PartitionLog | None:
        """The log of a partition this broker leads (NOT_LEADER_OR_FOLLOWER otherwise)."""

    def local_log(self, topic: str, partition: int) -> PartitionLog | None:
        """This broker's replica of a partition, whatever its role."""


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class ReplicaManager:
    def __init__(
        self,
        broker_id: int,
        logs: LogManager,
        waiters: FetchWaiters,
        *,
        alter_partitions: AlterPartitions,
        broker_address: Callable[[int], tuple[str, int] | None],
        leader_logs: LeaderLogs,
        metadata: Callable[[], MetadataImage],
        broker_epoch: Callable[[], int] = lambda: -1,
        replicated: bool = True,
        config: ReplicationConfig | None = None,
        clock: Callable[[], int] = _now_ms,
        fenced: Callable[[], Iterable[int]] = tuple,
    ) -> None:
        self.broker_id = broker_id
        self.fenced = fenced  # the brokers the controller has fenced, from the image
        # A cluster gives every local partition a replica; a single broker gives none
        # (each partition is its own ISR, its HW its log end offset).
        self.replicated = replicated
        self.leader_logs = leader_logs  # the logs this broker leads, by the metadata
        self.metadata = metadata  # the current image: single replicas' leader epochs
        self.logs = logs
        self.waiters = waiters
        self.alter_partitions = alter_partitions
        self.broker_address = broker_address
        self.broker_epoch = broker_epoch
        self.config = config or ReplicationConfig()
        self.clock = clock
        self.replicas: dict[TopicPartition, PartitionReplica] = {}
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self._following: dict[TopicPartition, int] = {}  # tp -> leader we fetch from
        # When each follower broker last fetched anything: a caught-up idle partition
        # hears nothing from its followers in a fetch session, so silence is per broker.
        self.follower_seen: dict[int, int] = {}
        self._silent: set[int] = set()
        self._ticking: set[TopicPartition] = set()  # replicas with something to time
        # ISR changes waiting to go: one AlterPartition in flight carries them all
        self._isr_queue: dict[TopicPartition, AlterIsr] = {}
        self._isr_sender: asyncio.Task | None = None
        self._acks: dict[int, asyncio.Future[ErrorCode]] = {}
        # DeleteRecords answers waiting for the ISR's log start offsets: (offset, future)
        self._trims: dict[TopicPartition, list[tuple[int, asyncio.Future[int]]]] = {}
        self._ack_keys = itertools.count()
        self._tasks: set[asyncio.Task] = set()
        self._tick_task: asyncio.Task | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._stopped = False
        # Reassignment throttle (replication/throttle.py): the fetchers read the rate
        # and who is being added from the latest image; one quota per direction.
        self.image: MetadataImage | None = None
        self.inbound_throttle = ReassignmentQuota()
        self.outbound_throttle = ReassignmentQuota()

    # -- lifecycle ---------------------------------------------------------------------

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, looked up once: every produce and fetch asks for it, and on
        3.11 each ``get_running_loop()`` is a getpid() syscall."""
        loop = self._event_loop
        if loop is None or loop.is_closed():
            loop = self._event_loop = asyncio.get_running_loop()
        return loop

    @property
    def stopped(self) -> bool:
        return self._stopped

    async def start(self) -> None:
        self._tick_task = asyncio.get_running_loop().create_task(self._tick_loop())

    async def stop(self) -> None:
        """Stop ticking and fetching; fail parked acks=all requests (not leader any more)."""
        self._stopped = True
        if self._tick_task is not None:
            self._tick_task.cancel()
            await asyncio.gather(self._tick_task, return_exceptions=True)
        for fetcher in list(self.fetchers.values()):
            await fetcher.stop()
        self.fetchers.clear()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for key, replica in list(self.replicas.items()):
            self._run(key, replica.stop())
        for key in list(self._trims):
            self._check_trims(key)

    async def _tick_loop(self) -> None:
        """Tick the replicas that have something to time (``_ticking``), not all of them:
        an idle partition costs nothing here. When a follower broker falls silent,
        every partition it follows here is ticked once (that is when it leaves ISRs)."""
        interval = self.config.tick_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self.tick_once()

    def tick_once(self) -> None:
        now = self.clock()
        lag = self.config.replica_lag_time_max_ms
        silent = {r for r, seen in self.follower_seen.items() if now - seen > lag}
        # A broker the controller fenced counts as silent at once (KIP-841): it is never
        # proposed for an ISR (the controller would refuse it, INELIGIBLE_REPLICA, and a
        # refused member holds the HW until the partition epoch moves) and it leaves
        # ISRs now rather than after replica.lag.time.max.ms of acks=all stalls.
        silent.update(self.fenced())
        if silent != self._silent:
            # a broker fell silent (it leaves ISRs) or came back: an idle partition in
            # its fetch session sees no fetch from it, so only a tick asks it back in
            self._ticking.update(k for k, r in self.replicas.items() if r.is_leader)
        self._silent = silent
        ticking = self._ticking
        for key in list(ticking):
            replica = self.replicas.get(key)
            if replica is None:
                ticking.discard(key)
                continue
            try:
                self._run(key, replica.tick(now, silent))
            except Exception:
                log.exception("replica tick of %s-%d failed", *key)
            if replica.idle(silent):
                ticking.discard(key)

    # -- metadata ----------------------------------------------------------------------

    async def apply_changes(self, changes: Iterable[PartitionChange]) -> None:
        """Become leader/follower of, or drop, local partitions (logs must exist)."""
        for change in changes:
            try:
                self._apply(change)
            except Exception:
                log.exception("applying %s to %s-%d failed", change.role, *change.key)

    def on_partitions_changed(self, image: object, changes: LocalReplicaChanges) -> None:
        """The MetadataPublisher listener (broker/metadata_publisher.py); after the logs'."""
        self.image = image  # type: ignore[assignment]
        if not self.replicated:
            for key, part in changes.leaders.items():
                plog = self.logs.get_log(*key)
                if plog is not None:
                    # no other replica: everything written is committed
                    plog.high_watermark = plog.log_end_offset
                    if part.leader_epoch > plog.leader_epochs.latest_epoch:
                        # as for replicated leaders (_apply): on disk with the log's flush
                        plog.leader_epochs.assign(
                            part.leader_epoch, plog.log_end_offset, flush=False
                        )
            return
        for change in changes_from_local(changes):
            try:
                self._apply(change)
            except Exception:
                log.exception("applying %s to %s-%d failed", change.role, *change.key)

    def _apply(self, change: PartitionChange) -> None:
        key = change.key
        if change.role == "removed":
            self._stop_following(key)
            replica = self.replicas.pop(key, None)
            if replica is not None:
                self._run(key, replica.stop())
            if key in self._trims:
                self._check_trims(key)
            return
        plog = self.logs.get_log(*key)
        if plog is None:
            raise LogMQError(
                f"no local log for {key[0]}-{key[1]}", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            )
        replica = self.replicas.get(key)
        if replica is None:
            replica = PartitionReplica(
                self.broker_id,
                plog.leader_epochs,
                log_end_offset=plog.log_end_offset,
                high_watermark=plog.high_watermark,
                config=self._replica_config(plog),
            )
            self.replicas[key] = replica
        else:
            replica.config = self._replica_config(plog)
        if change.role == "leader":
            self._stop_following(key)
            if change.leader_epoch > plog.leader_epochs.latest_epoch:
                # The cache records where this epoch starts before any append, so
                # OffsetsForLeaderEpoch answers right even for an epoch with no records.
                # In memory only: the log's next flush writes it (before the recovery
                # point passes records of the epoch) and crash recovery takes the epochs
                # of unflushed records from the batches; an epoch without records that a
                # crash forgets spans no offsets, and the restarted broker leads under a
                # newer epoch (Kafka's KAFKA-15046 makes the same trade). Thousands of
                # partitions becoming leader at once then cost no file writes at all.
                plog.leader_epochs.assign(change.leader_epoch, plog.log_end_offset, flush=False)
            replica.leo = plog.log_end_offset
            now = self.clock()
            actions = replica.become_leader(change, now)
            for r in replica.followers:  # one that never fetches falls silent in time
                self.follower_seen.setdefault(r, now)
            self.waiters.notify(key)  # parked fetches re-check leadership
        else:
            if change.leader != self._following.get(key) or (
                replica.leader_epoch != change.leader_epoch
            ):
                self._stop_following(key)
            actions = replica.become_follower(change)
        self._run(key, actions)
        if key in self._trims:  # an ISR change or a lost leadership ends or frees them
            self._check_trims(key)

    def _replica_config(self, plog: PartitionLog) -> ReplicaConfig:
        return ReplicaConfig(
            replica_lag_time_max_ms=self.config.replica_lag_time_max_ms,
            min_insync_replicas=plog.config.min_insync_replicas,
            alter_isr_retry_ms=self.config.alter_isr_retry_ms,
        )

    # -- carrying out actions ----------------------------------------------------------

    def _run(self, key: TopicPartition, actions: list) -> None:
        self._ticking.add(key)  # something happened: tick it until it is idle again
        for action in actions:
            if isinstance(action, HighWatermarkChanged):
                plog = self.logs.get_log(*key)
                if plog is not None:
                    plog.high_watermark = action.high_watermark
                self.waiters.notify(key)
            elif isinstance(action, ProduceCompleted):
                fut = self._acks.pop(action.key, None)  # type: ignore[arg-type]
                if fut is not None and not fut.done():
                    fut.set_result(action.error)
            elif isinstance(action, AlterIsr):
                self._queue_alter_isr(key, action)
            elif isinstance(action, AskLeaderEpoch):
                self._fetcher(action.leader).ask_epoch(
                    key, action.current_leader_epoch, action.epoch
                )
                self._following[key] = action.leader
            elif isinstance(action, TruncateTo):
                plog = self.logs.get_log(*key)
                if plog is not None:
                    log.info("truncating %s-%d to %d", key[0], key[1], action.offset)
                    self.logs.truncate_to(plog, action.offset)
                    self.waiters.notify(key)
            elif isinstance(action, ResetTo):
                plog = self.logs.get_log(*key)
                if plog is not None:
                    log.info("resetting %s-%d to start at %d", key[0], key[1], action.offset)
                    plog.truncate_fully_and_start_at(action.offset)
                    self.logs.write_checkpoints()
                    self.waiters.notify(key)
            elif isinstance(action, StartFetching):
                self._fetcher(action.leader).fetch_from(key, action.leader_epoch, action.offset)
                self._following[key] = action.leader

    def _spawn(self, coro: Awaitable) -> None:
        if self._stopped:
            coro.close()  # type: ignore[attr-defined]
            return
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _queue_alter_isr(self, key: TopicPartition, action: AlterIsr) -> None:
        """Send ``action`` with every other ISR change waiting (Kafka's
        AlterPartitionManager): thousands of partitions changing at once (a cluster
        coming up) make a few requests and a few metadata batches, not thousands."""
        self._isr_queue[key] = action
        if self._stopped or (self._isr_sender is not None and not self._isr_sender.done()):
            return
        self._isr_sender = self._loop().create_task(self._send_isr_changes())
        self._tasks.add(self._isr_sender)
        self._isr_sender.add_done_callback(self._tasks.discard)

    async def _send_isr_changes(self) -> None:
        while self._isr_queue and not self._stopped:
            batch = list(itertools.islice(self._isr_queue.items(), MAX_ISR_BATCH))
            for key, _ in batch:
                del self._isr_queue[key]
            requests = [
                AlterPartitionRequest(
                    broker_id=self.broker_id,
                    broker_epoch=self.broker_epoch(),
                    topic=key[0],
                    partition=key[1],
                    leader_epoch=action.leader_epoch,
                    partition_epoch=action.partition_epoch,
                    new_isr=action.isr,
                )
                for key, action in batch
            ]
            try:
                responses = await self.alter_partitions(requests)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("AlterPartition for %d partitions failed: %s", len(batch), e)
                responses = [AlterPartitionResponse(ErrorCode.REQUEST_TIMED_OUT, str(e))] * len(
                    batch
                )
            refused: dict[str, int] = {}
            for (key, action), response in zip(batch, responses, strict=True):
                if response.error is not ErrorCode.NONE:
                    refused[response.error.name] = refused.get(response.error.name, 0) + 1
                    log.debug(
                        "AlterPartition %s-%d isr=%s refused: %s",
                        key[0],
                        key[1],
                        action.isr,
                        response.error.name,
                    )
                replica = self.replicas.get(key)
                if replica is not None:
                    self._run(
                        key, replica.on_alter_isr_response(response.error, response.partition)
                    )
            if refused:
                log.info(
                    "AlterPartition: %d of %d refused %s",
                    sum(refused.values()),
                    len(batch),
                    refused,
                )

    # -- follower side: fetchers -------------------------------------------------------

    def _fetcher(self, leader: int) -> ReplicaFetcher:
        fetcher = self.fetchers.get(leader)
        if fetcher is None:
            fetcher = ReplicaFetcher(self, leader, self.config.fetcher)
            self.fetchers[leader] = fetcher
            fetcher.start()
        return fetcher

    def _stop_following(self, key: TopicPartition) -> None:
        leader = self._following.pop(key, None)
        if leader is not None and leader in self.fetchers:
            self.fetchers[leader].remove(key)

    def on_leader_epoch_answer(
        self, key: TopicPartition, error: ErrorCode, epoch: int, end_offset: int
    ) -> None:
        replica = self.replicas.get(key)
        if replica is not None:
            self._run(key, replica.on_leader_epoch_answer(error, epoch, end_offset))

    async def on_fetched(
        self, key: TopicPartition, data: memoryview, leader_hw: int, leader_log_start: int = -1
    ) -> int | None:
        """Append the leader's batches as they are (offsets and epochs kept), then the HW,
        then the log start offset (a DeleteRecords on the leader reaches us this way)."""
        replica = self.replicas.get(key)
        plog = self.logs.get_log(*key)
        if replica is None or plog is None:
            return None
        leo = plog.log_end_offset
        start = end = 0
        for pos, h in b.iter_headers(data):  # complete batches only: the tail may be cut
            size = h.batch_length + b.LOG_OVERHEAD
            if h.base_offset + h.last_offset_delta < leo:
                start = end = pos + size  # already here (the batch holding our LEO)
            else:
                end = pos + size
        if end > start:
            try:
                plog.append_as_follower(data[start:end])
            except DiskFullError:
                # Tell the guard: the broker reports itself full in its heartbeats, and
                # the controller takes it out of the ISRs it can no longer follow.
                self.logs.disk.write_failed(end - start)
                raise
            cfg = plog.config
            if cfg.group_commit or (
                cfg.flush_messages is not None and plog.unflushed_messages >= cfg.flush_messages
            ):
                await self.logs.sync(plog)
            replica = self.replicas.get(key)
            if replica is None:
                return None
        self._run(key, replica.on_fetched(plog.log_end_offset, leader_hw))
        if leader_log_start > plog.log_start_offset and not plog.closed:
            plog.advance_log_start_offset(leader_log_start)  # capped at our HW
        return plog.log_end_offset

    def on_out_of_range(
        self, key: TopicPartition, fetch_offset: int, leader_log_start: int
    ) -> bool:
        """The leader refused our fetch offset; True if we reset to its log start.

        Below its log start (retention deleted what we lack): start over there, as the
        core decides. Above its end cannot follow an epoch truncation from a correct
        leader: the fetcher just retries after a backoff.
        """
        replica = self.replicas.get(key)
        if replica is None or self.logs.get_log(*key) is None:
            return False
        if fetch_offset >= leader_log_start >= 0:
            return False
        self._run(key, replica.on_out_of_range(leader_log_start))
        return True

    # -- leader side: the data path ----------------------------------------------------

    def replica(self, key: TopicPartition) -> PartitionReplica | None:
        return self.replicas.get(key)

    def check_append(
        self, key: TopicPartition, acks: int, min_insync_replicas: int
    ) -> tuple[ErrorCode, int]:
        """(error, leader epoch to stamp) before a produce appends.

        ``min_insync_replicas`` is the topic's current setting (configs change at runtime).
        """
        replica = self.replicas.get(key)
        if replica is None:
            if self.replicated:
                return ErrorCode.NOT_LEADER_OR_FOLLOWER, -1
            return ErrorCode.NONE, LEADER_EPOCH
        if replica.config.min_insync_replicas != min_insync_replicas:
            replica.config = dataclasses.replace(
                replica.config, min_insync_replicas=min_insync_replicas
            )
        return replica.check_append(acks), replica.leader_epoch

    def on_append(self, key: TopicPartition, plog: PartitionLog) -> None:
        """The leader appended to ``plog``: move its HW (or let its replica) and wake reads."""
        replica = self.replicas.get(key)
        if replica is not None:
            self._run(key, replica.on_append(plog.log_end_offset, self.clock()))
        elif not self.replicated:
            plog.high_watermark = plog.log_end_offset
        self.waiters.notify(key)

    async def wait_replicated(
        self, key: TopicPartition, required_offset: int, timeout_ms: int
    ) -> ErrorCode:
        """acks=all: wait until the HW reaches ``required_offset`` (or an error)."""
        replica = self.replicas.get(key)
        if replica is None:
            return ErrorCode.NONE if not self.replicated else ErrorCode.NOT_LEADER_OR_FOLLOWER
        ack_key = next(self._ack_keys)
        deadline = self.clock() + max(timeout_ms, 0)
        error = replica.await_replication(ack_key, required_offset, deadline)
        if error is not None:
            return error
        fut: asyncio.Future[ErrorCode] = self._loop().create_future()
        self._acks[ack_key] = fut
        try:
            return await fut
        finally:
            self._acks.pop(ack_key, None)

    async def append(
        self,
        key: TopicPartition,
        plog: PartitionLog,
        data: Any,
        acks: int,
        timeout_ms: int,
        *,
        control: bool = False,
    ) -> AppendInfo:
        """Append produce data as the partition's leader; acks=all waits for the HW
        (``append_now``, then what it leaves to wait for). ``control``: transaction
        markers (txn_markers.py), which clients may not write."""
        info, rest = self.append_now(key, plog, data, acks, timeout_ms, control=control)
        if rest is not None:
            await rest
        return info

    def append_now(
        self,
        key: TopicPartition,
        plog: PartitionLog,
        data: Any,
        acks: int,
        timeout_ms: int,
        *,
        control: bool = False,
    ) -> tuple[AppendInfo, Coroutine[Any, Any, None] | None]:
        """The write of an append, at once, and what its answer still waits for (an
        fsync the topic's policy asks for, then acks=all replication), or None.

        A single broker's partition is its own ISR: it stamps leader epoch 0 and its HW
        is its log end offset. A replicated one checks min.insync.replicas first and
        stamps the replica's leader epoch. The HW moves (and followers hear of the
        append) only after a required fsync, as before the split.
        """
        logs = self.logs
        if not self.replicated:  # the hot path of a single broker, inlined
            info = logs.write(plog, data, leader_epoch=LEADER_EPOCH, control=control)
            if logs.must_sync(plog, info):
                return info, self._synced_single(key, plog, info)
            if not info.duplicate:
                plog.high_watermark = plog.log_end_offset
                self.waiters.notify(key)
            return info, None
        error, epoch = self.check_append(key, acks, plog.config.min_insync_replicas)
        if error is not ErrorCode.NONE:
            raise LogMQError(f"cannot append to {key[0]}-{key[1]}: {error.name}", error)
        info = logs.write(plog, data, leader_epoch=epoch, control=control)
        sync = logs.must_sync(plog, info)
        if not sync:
            if not info.duplicate:
                self.on_append(key, plog)
            if acks != -1:
                return info, None
        return info, self._replicated_rest(key, plog, info, acks, timeout_ms, sync)

    async def _synced_single(
        self, key: TopicPartition, plog: PartitionLog, info: AppendInfo
    ) -> None:
        await self.logs.sync(plog)
        if not info.duplicate:
            plog.high_watermark = plog.log_end_offset
            self.waiters.notify(key)

    async def _replicated_rest(
        self,
        key: TopicPartition,
        plog: PartitionLog,
        info: AppendInfo,
        acks: int,
        timeout_ms: int,
        sync: bool,
    ) -> None:
        if sync:
            await self.logs.sync(plog)
            if not info.duplicate:
                self.on_append(key, plog)
        if acks == -1:
            # A retried duplicate waits too: its first attempt may not be replicated yet.
            error = await self.wait_replicated(key, info.last_offset + 1, timeout_ms)
            if error is not ErrorCode.NONE:
                raise LogMQError(
                    f"{key[0]}-{key[1]} offsets {info.first_offset}..{info.last_offset}: "
                    f"{error.name}",
                    error,
                )

    # -- leader side: DeleteRecords ------------------------------------------------------

    async def delete_records(
        self, offsets: dict[TopicPartition, int], timeout_ms: int
    ) -> dict[TopicPartition, tuple[int, ErrorCode, str | None]]:
        """DeleteRecords for both front doors: per partition (low watermark, error, message),
        all partitions at once."""

        async def one(key: TopicPartition, offset: int) -> tuple[int, ErrorCode, str | None]:
            try:
                return await self._delete_records(*key, offset, timeout_ms), ErrorCode.NONE, None
            except LogMQError as e:
                return -1, e.code, str(e)

        results = await asyncio.gather(*(one(k, o) for k, o in offsets.items()))
        return dict(zip(offsets, results, strict=True))

    async def _delete_records(
        self, topic: str, partition: int, offset: int, timeout_ms: int
    ) -> int:
        """Move the log start offset to ``offset`` (-1: the HW); returns the low watermark.

        The leader moves its own start and writes the log-start checkpoint first, so the
        deletion survives a crash. Followers take the start every fetch answer carries
        and report theirs in their next fetch; the answer waits until every ISR member's
        start has reached ``offset`` (Kafka's low watermark), else REQUEST_TIMED_OUT.
        """
        key = (topic, partition)
        plog = self.leader_log(topic, partition)
        if not plog.config.delete:
            raise LogMQError(
                f"records of {topic}-{partition} cannot be deleted: cleanup.policy is "
                f"{plog.config.cleanup_policy}",
                ErrorCode.POLICY_VIOLATION,
            )
        hw = plog.high_watermark
        target = hw if offset == -1 else offset
        if not 0 <= target <= hw:
            raise LogMQError(
                f"cannot delete {topic}-{partition} records below {offset}: the offset must "
                f"be in [0, {hw}] (the high watermark) or -1",
                ErrorCode.OFFSET_OUT_OF_RANGE,
            )
        if target > plog.log_start_offset:
            plog.advance_log_start_offset(target)
            await self.logs.checkpoint()
            self.waiters.notify(key)  # followers in a fetch session hear of it now
        low = self._low_watermark(key)
        if low >= target:
            return low
        fut: asyncio.Future[int] = self._loop().create_future()
        entry = (target, fut)
        self._trims.setdefault(key, []).append(entry)
        try:
            return await asyncio.wait_for(fut, max(timeout_ms, 0) / 1000)
        except TimeoutError:
            raise LogMQError(
                f"{topic}-{partition}: the in-sync replicas did not delete below {target} "
                f"within {timeout_ms} ms (the leader did)",
                ErrorCode.REQUEST_TIMED_OUT,
            ) from None
        finally:
            waiting = self._trims.get(key)
            if waiting is not None and entry in waiting:
                waiting.remove(entry)
                if not waiting:
                    del self._trims[key]

    def _low_watermark(self, key: TopicPartition) -> int:
        """The lowest log start offset over the ISR (-1 unknown); raises if not leader."""
        plog = self.leader_log(*key)
        replica = self.replicas.get(key)
        if replica is None:
            return plog.log_start_offset  # a single broker: its own log is the ISR
        return replica.low_watermark(plog.log_start_offset)

    def _check_trims(self, key: TopicPartition) -> None:
        """Answer the DeleteRecords waiting on ``key`` that the low watermark now passes."""
        waiting = self._trims.get(key, [])
        try:
            low = -1 if self._stopped else self._low_watermark(key)
            error = None
        except LogMQError as e:
            low, error = -1, e
        if self._stopped:
            error = LogMQError("the broker is stopping", ErrorCode.NOT_LEADER_OR_FOLLOWER)
        for target, fut in waiting:
            if fut.done():
                continue
            if error is not None:
                fut.set_exception(error)
            elif low >= target:
                fut.set_result(low)

    # -- leader side: consumer reads ----------------------------------------------------

    def local_log(self, topic: str, partition: int) -> PartitionLog | None:
        """This broker's replica of a partition, whatever its role (None if not here)."""
        return self.leader_logs.local_log(topic, partition)

    def leader_log(
        self, topic: str, partition: int, current_leader_epoch: int = -1
    ) -> PartitionLog:
        """The log a consumer reads or a ListOffsets asks about: this broker must lead the
        partition, at the epoch the client knows if it says one (-1: any)."""
        plog = self.leader_logs.leader_log(topic, partition)
        if plog is None:
            raise LogMQError(
                f"unknown topic or partition {topic}-{partition}",
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            )
        self._check_leader(topic, partition, current_leader_epoch)
        return plog

    async def fetch_for_consumer(
        self,
        wanted,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        *,
        committed: bool = False,
    ) -> list[TopicRead]:
        """A consumer's fetch: read below the HW (``committed``: read_committed, below
        the LSO, with the aborted transactions of what it read), long-polling on
        appends until ``min_bytes`` are there, an error is, or ``max_wait_ms`` has
        passed."""
        loop = self._loop()
        deadline = loop.time() + max_wait_ms / 1000
        tps = [(name, p[0]) for name, parts in wanted for p in parts]
        while True:
            topics, total, any_error = self._read_for_consumer(
                wanted, max_bytes, committed=committed
            )
            remaining = deadline - loop.time()
            if total >= min_bytes or any_error or remaining <= 0 or not tps:
                return topics
            if not await self.waiters.wait(tps, remaining):
                # timed out; one last read so the answer is current
                return self._read_for_consumer(wanted, max_bytes, committed=committed)[0]

    async def fetch_session_for_consumer(
        self,
        session: FetchSession,
        full: bool,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        admit: Callable[[list[TopicRead]], bool] | None = None,
        *,
        committed: bool = False,
    ) -> list[TopicRead] | None:
        """A consumer's fetch in a session (fetch_sessions.py): reads only the session's
        ready partitions, and an incremental answer only those with something new.

        ``admit(read)`` False (a client over its fetch quota) answers None and leaves the
        session as it was, so the next fetch reads the same partitions: Kafka's
        throttled answer is empty and does not update the session either."""
        loop = self._loop()
        deadline = loop.time() + max_wait_ms / 1000
        more = self._below_lso if committed else self._below_hw
        while True:
            topics, total, any_error = self._read_for_consumer(
                session.to_read(), max_bytes, partial=not full, committed=committed
            )
            remaining = deadline - loop.time()
            if full or total >= min_bytes or any_error or remaining <= 0:
                break
            session.settle(topics, more)
            if not await self.waiters.wait_session(session, remaining):
                topics = self._read_for_consumer(
                    session.to_read(), max_bytes, partial=not full, committed=committed
                )[0]
                break
        if admit is not None and not admit(topics):
            return None
        return session.answered(topics, full, more)

    async def new_logs_made(self, keys: Iterable[TopicPartition]) -> None:
        """Before a produce request's appends: new logs' files exist (LogManager)."""
        await self.logs.new_logs_made(keys)

    def _below_hw(self, tp: TopicPartition, sp: SessionPartition) -> bool:
        plog = self.logs.get_log(*tp)
        return plog is not None and sp.fetch_offset < plog.high_watermark

    def _below_lso(self, tp: TopicPartition, sp: SessionPartition) -> bool:
        plog = self.logs.get_log(*tp)
        return plog is not None and sp.fetch_offset < plog.last_stable_offset

    def _below_leo(self, tp: TopicPartition, sp: SessionPartition) -> bool:
        plog = self.logs.get_log(*tp)
        return plog is not None and sp.fetch_offset < plog.log_end_offset

    @gc_paused()  # an entry and a region per partition: logmq/gcpause.py
    def _read_for_consumer(
        self, wanted, max_bytes: int, *, partial: bool = False, committed: bool = False
    ) -> tuple[list[TopicRead], int, bool]:
        """Read ``wanted`` below each HW, within ``max_bytes``. ``partial`` (an
        incremental session answer) stops at the partition that finds the budget
        spent: the rest stay ready in the session for the next fetch, so a consumer
        catching up on 10,000 partitions pays per fetch for what fits, not for all.
        ``committed`` (read_committed): below each LSO instead, with the aborted
        transactions of the records read."""
        topics: list[TopicRead] = []
        total = 0
        any_error = False
        budget = max_bytes
        for name, parts in wanted:
            results = []
            for partition, offset, pmax, epoch in parts:
                if partial and budget == 0 and total:
                    break
                try:
                    plog = self.leader_log(name, partition, epoch)
                    hw = plog.high_watermark
                    start = plog.log_start_offset
                    # Valid up to the log end (as Kafka does): a new leader's HW may lag
                    # what its predecessor exposed, and a consumer there must wait, not
                    # reset. It reads only below the HW.
                    if not start <= offset <= plog.log_end_offset:
                        raise LogMQError(
                            f"offset {offset} is outside [{start}, {plog.log_end_offset}] "
                            f"of {name}-{partition}",
                            ErrorCode.OFFSET_OUT_OF_RANGE,
                        )
                    region = None
                    limit = min(pmax, budget)
                    lso = plog.last_stable_offset
                    upper = lso if committed else hw
                    if offset < upper and (limit > 0 or total == 0):
                        region = plog.read(offset, max(limit, 1), max_offset=upper)
                        if region is not None and total and region.length > limit:
                            # A read's first batch comes whole even when too big, which
                            # only the answer's first records may be (Kafka's rule: a
                            # client sizes its buffer by max_bytes); this one waits for
                            # a fetch where it comes first.
                            if region.length > budget:
                                budget = 0  # spent: the rest go to later fetches
                            region = None
                        if region is not None:
                            if region.length > 0:
                                total += region.length
                                budget = max(0, budget - region.length)
                            else:
                                region = None
                    aborted = None
                    if committed and region is not None:
                        aborted = plog.aborted_transactions(offset, region.end_offset) or None
                    results.append(
                        PartitionRead(partition, NO_ERROR, hw, start, region, None, lso, aborted)
                    )
                except LogMQError as e:
                    any_error = True
                    results.append(failed(partition, e.code, str(e)))
            if results or not partial:
                topics.append((name, results))
            if partial and budget == 0 and total:
                break
        return topics, total, any_error

    def _check_leader(self, topic: str, partition: int, epoch: int) -> None:
        """Consumers read from the leader only, fenced by their view of its epoch."""
        replica = self.replicas.get((topic, partition))
        if replica is None:  # a single replica: the metadata image knows the epoch
            if epoch < 0:
                return  # nothing to fence; LocalLogs checked the image's leader
            part = self.metadata().partition(topic, partition)
            current = part.leader_epoch if part is not None else LEADER_EPOCH
        elif not replica.is_leader:
            raise LogMQError(
                f"broker {self.broker_id} is not the leader of {topic}-{partition}",
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
            )
        else:
            current = replica.leader_epoch
        if epoch > current:
            raise LogMQError(
                f"leader epoch {epoch} is newer than {current}", ErrorCode.UNKNOWN_LEADER_EPOCH
            )
        if 0 <= epoch < current:
            raise LogMQError(
                f"leader epoch {epoch} is older than {current}", ErrorCode.FENCED_LEADER_EPOCH
            )

    # -- leader side: follower fetches ---------------------------------------------------

    async def fetch_for_follower(
        self,
        replica_id: int,
        wanted,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        log_starts: dict[TopicPartition, int] | None = None,
    ) -> list[TopicRead]:
        """A follower's fetch: record its LEO once, then long-poll on appends and HW moves.

        It reads up to the leader's log end offset (not the HW) and learns the HW from the
        answer, so the response also returns early when an HW it would carry changes.
        Partitions the follower is being added to (a reassignment) are throttled: held
        back while the outbound quota is in debt, the long poll then waking when it
        allows more; the bytes sent for them are charged as the response goes out.
        """
        rm = self
        self.follower_seen[replica_id] = self.clock()
        errors: dict[tuple[str, int], ErrorCode] = {}
        moved = False  # this very fetch moved an HW: answer at once so it travels
        for name, parts in wanted:
            for partition, offset, _, epoch in parts:
                key = (name, partition)
                plog = self.logs.get_log(name, partition)
                if plog is not None and offset < plog.log_start_offset:
                    errors[key] = ErrorCode.OFFSET_OUT_OF_RANGE
                else:
                    hw_before = plog.high_watermark if plog is not None else -1
                    start = log_starts.get(key, -1) if log_starts else -1
                    error = rm.follower_fetch(key, replica_id, offset, epoch, start)
                    if error is not ErrorCode.NONE:
                        errors[key] = error
                    elif plog is not None and plog.high_watermark != hw_before:
                        moved = True
        loop = self._loop()
        deadline = loop.time() + max_wait_ms / 1000
        tps = [(name, p[0]) for name, parts in wanted for p in parts]
        throttled = self._reassignment_reads(replica_id, wanted, loop.time())
        first_hws: dict[tuple[str, int], int] | None = None
        while True:
            topics, total, hws, held = self._read_for_follower(wanted, max_bytes, errors, throttled)
            if first_hws is None:
                first_hws = hws
            now = loop.time()
            remaining = deadline - now
            if total >= min_bytes or errors or moved or remaining <= 0 or hws != first_hws:
                return self._follower_reply(topics, throttled, held)
            wait = remaining
            if held:  # the quota allows more before the deadline: read again then
                wait = min(remaining, max(rm.outbound_throttle.wait_time(now), 0.001))
            if not await self.waiters.wait(tps, wait) and (not held or wait >= remaining):
                topics, _, _, held = self._read_for_follower(wanted, max_bytes, errors, throttled)
                return self._follower_reply(topics, throttled, held)

    async def fetch_session_for_follower(
        self,
        replica_id: int,
        session: FetchSession,
        full: bool,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
    ) -> list[TopicRead]:
        """A follower's fetch in a session: its ready partitions only.

        The session position of a ready partition is the follower's LEO now (it named
        it, or it is behind, or something moved); a caught-up idle partition is left
        alone: its follower stays caught up (``PartitionReplica.tick``) while it keeps
        fetching at all (``follower_seen``). Answers at once with news for the follower
        (data, an error, a new HW or log start), else long-polls on the session.
        """
        loop = self._loop()
        self.follower_seen[replica_id] = self.clock()
        errors: dict[tuple[str, int], ErrorCode] = {}
        parts = session.partitions
        for key in list(session.ready):
            sp = parts[key]
            plog = self.logs.get_log(*key)
            if plog is not None and sp.fetch_offset < plog.log_start_offset:
                errors[key] = ErrorCode.OFFSET_OUT_OF_RANGE
                continue
            error = self.follower_fetch(
                key, replica_id, sp.fetch_offset, sp.leader_epoch, sp.log_start_offset
            )
            if error is not ErrorCode.NONE:
                errors[key] = error
        deadline = loop.time() + max_wait_ms / 1000
        more = self._below_leo
        while True:
            wanted = session.to_read()
            throttled = self._reassignment_reads(replica_id, wanted, loop.time())
            topics, total, _, held = self._read_for_follower(wanted, max_bytes, errors, throttled)
            remaining = deadline - loop.time()
            if full or total >= min_bytes or errors or remaining <= 0 or session.has_news(topics):
                topics = self._follower_reply(topics, throttled, held)
                return session.answered(topics, full, more)
            session.settle(topics, more)
            wait = remaining
            if held:  # the quota allows more before the deadline: read again then
                wait = min(remaining, max(self.outbound_throttle.wait_time(loop.time()), 0.001))
            if not await self.waiters.wait_session(session, wait) and wait >= remaining:
                wanted = session.to_read()
                throttled = self._reassignment_reads(replica_id, wanted, loop.time())
                topics, _, _, held = self._read_for_follower(wanted, max_bytes, errors, throttled)
                topics = self._follower_reply(topics, throttled, held)
                return session.answered(topics, full, more)

    def _reassignment_reads(
        self, replica_id: int, wanted, now: float
    ) -> dict[tuple[str, int], int]:
        """The partitions this follower is being added to, while a throttle is set.

        Maps each to 0: ``_read_for_follower`` fills in the bytes it read for them.
        """
        rm = self
        image = rm.image
        if image is None:
            return {}
        quota = rm.outbound_throttle
        quota.set_rate(configured_rate(image), now)
        if not quota.limited or image is None:
            return {}
        throttled = {}
        for name, parts in wanted:
            for partition, *_ in parts:
                part = image.partition(name, partition)
                if part is not None and replica_id in part.adding_replicas:
                    throttled[(name, partition)] = 0
        return throttled

    def _follower_reply(
        self, topics: list[TopicRead], throttled: dict[tuple[str, int], int], held: int
    ) -> list[TopicRead]:
        rm = self
        if throttled:
            quota = rm.outbound_throttle
            quota.charge(sum(throttled.values()), self._loop().time())
            if held:
                quota.held_back(held)
        return topics

    def _read_for_follower(
        self, wanted, max_bytes: int, errors: dict, throttled: dict[tuple[str, int], int]
    ) -> tuple:
        """Read what the follower asked for; returns (topics, total, hws, held).

        Throttled partitions share the outbound quota's allowance (whole batches, so the
        last may overdraw it); ``held`` counts those left out because nothing was left.
        """
        topics: list[TopicRead] = []
        total = 0
        budget = max_bytes
        hws: dict[tuple[str, int], int] = {}
        held = 0
        allowance: int | None = None
        rm = self
        if throttled:
            for key in throttled:  # what this read sends, should it be the answer
                throttled[key] = 0
            allowance = rm.outbound_throttle.allowance(self._loop().time())
        for name, parts in wanted:
            results = []
            for partition, offset, pmax, _ in parts:
                plog = self.logs.get_log(name, partition)
                error = errors.get((name, partition))
                if error is None and plog is None:
                    error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                if error is not None:
                    start = plog.log_start_offset if plog else -1
                    results.append(failed(partition, error, error.name, start))
                    continue
                assert plog is not None
                key = (name, partition)
                hw = hws[key] = plog.high_watermark
                size = 0
                region = None
                limit = min(pmax, budget)
                quota_left = allowance if key in throttled else None
                if quota_left is not None and offset < plog.log_end_offset:
                    if quota_left <= 0:
                        held += 1
                        limit = -1  # nothing this round: the HW etc. still go back
                    else:
                        limit = min(limit, quota_left)
                if offset < plog.log_end_offset and (limit > 0 or (total == 0 and limit == 0)):
                    region = plog.read(offset, max(limit, 1))
                    fits = min(pmax, budget)  # the quota alone may be overdrawn
                    if region is not None and total and region.length > fits:
                        # only the answer's first batch may exceed max_bytes (as above)
                        if region.length > budget:
                            budget = 0
                        region = None
                    if region is not None and region.length > 0:
                        size = region.length
                        total += size
                        budget = max(0, budget - size)
                    else:
                        region = None
                if quota_left is not None:
                    throttled[key] = size
                    allowance = quota_left - size
                results.append(
                    PartitionRead(partition, NO_ERROR, hw, plog.log_start_offset, region)
                )
            topics.append((name, results))
        return topics, total, hws, held

    def follower_fetch(
        self,
        key: TopicPartition,
        replica_id: int,
        fetch_offset: int,
        leader_epoch: int,
        log_start_offset: int = -1,
    ) -> ErrorCode:
        """A follower fetches from ``fetch_offset``: that is its LEO now (and
        ``log_start_offset`` its log start, which DeleteRecords waits on)."""
        replica = self.replicas.get(key)
        if replica is None:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        plog = self.logs.get_log(*key)
        if plog is not None and replica.is_leader and plog.log_end_offset > replica.leo:
            # An append still waiting for its fsync has not reported yet, but followers
            # can read it already: count it now.
            self._run(key, replica.on_append(plog.log_end_offset, self.clock()))
        error, actions = replica.on_follower_fetch(
            replica_id, fetch_offset, leader_epoch, self.clock(), log_start_offset
        )
        self._run(key, actions)
        if key in self._trims:
            self._check_trims(key)
        return error

    def epoch_end_offset(
        self, topic: str, partition: int, current_leader_epoch: int, epoch: int
    ) -> tuple[ErrorCode, int, int]:
        """(error, epoch, end offset): where ``epoch`` ends in this leader's log (KIP-101).

        A replicated partition asks its replica; a single broker's partition answers
        from its own epoch history, fenced by the leader epoch of the metadata image
        (the one its Metadata and fetches use).
        """
        key = (topic, partition)
        if key in self.replicas:
            return self.end_offset_for_epoch(key, current_leader_epoch, epoch)
        plog = self.local_log(topic, partition)
        if plog is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1
        try:
            self._check_leader(topic, partition, current_leader_epoch)
        except LogMQError as e:
            return e.code, -1, -1
        found, end = plog.leader_epochs.end_offset_for_epoch(epoch, plog.log_end_offset)
        return ErrorCode.NONE, found, end

    def end_offset_for_epoch(
        self, key: TopicPartition, current_leader_epoch: int, epoch: int
    ) -> tuple[ErrorCode, int, int]:
        replica = self.replicas.get(key)
        if replica is None:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, -1, -1
        plog = self.logs.get_log(*key)
        if plog is not None:
            replica.leo = max(replica.leo, plog.log_end_offset)
        return replica.end_offset_for_epoch(current_leader_epoch, epoch)
