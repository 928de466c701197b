"""The replica manager: this broker's partition replicas, their roles and their shell.

It is the one writer of every partition's high watermark. The metadata layer tells it
which local partitions now lead, follow or are gone (``apply_changes``,
``on_partitions_changed``); each partition's decisions come from its sans-IO
``PartitionReplica``, and this module performs the returned actions (set the HW, wake
fetches, truncate, queue an ISR change for the controller, complete acks=all waiters)
and owns the tick task and the follower fetchers, which hand it the leader's batches
(``on_fetched``). It never decodes records.

The data paths over it are classes of their own, each one concept, built by the
composition root with this manager as their collaborator, beside it in broker/replica/:
``LeaderAppends`` (leader_appends.py: produce and marker appends, acks=all),
``ConsumerReads`` (consumer_reads.py), ``FollowerReads`` (follower_reads.py: a
follower's fetch records its LEO here through ``follower_fetch``), ``RecordDeletion``
(record_deletion.py, told of partition changes through ``watch``); ISR changes go out
batched through ``IsrChangeQueue`` (isr_changes.py).

Wiring into a broker: create it after the LogManager with ``alter_partition`` (sends an
``AlterPartitionRequest`` to the controller and returns its ``AlterPartitionResponse``),
``broker_address`` (node id -> (host, port) from the image's registrations),
``leader_logs`` (LocalLogs), ``metadata`` (the current image), ``broker_epoch`` and
``replicated`` (a cluster: every local partition has a replica); ``await start()``;
register ``on_partitions_changed`` with the MetadataPublisher after the listener that
creates logs; ``await stop()`` before the server drains, so parked acks=all requests
answer at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from logmq.broker.replica.fetcher import FetcherConfig, ReplicaFetcher
from logmq.broker.replica.isr_changes import AlterPartitions, IsrChangeQueue
from logmq.errors import OK, DiskFullError, ErrorCode, LogMQError, Outcome
from logmq.replication.partition_replica import (
    AlterIsr,
    AskLeaderEpoch,
    EpochEndOffset,
    HighWatermarkChanged,
    PartitionReplica,
    ProduceCompleted,
    ReplicaConfig,
    ResetTo,
    StartFetching,
    TruncateTo,
)
from logmq.replication.throttle import ReassignmentQuota
from logmq.storage import batch as b

if TYPE_CHECKING:
    from logmq.broker.replica.fetch_waiter import FetchWaiters
    from logmq.cluster.metadata_image import LocalReplicaChanges, MetadataImage
    from logmq.storage.log_manager import LogManager
    from logmq.storage.partition_log import PartitionLog

NO_ERROR = ErrorCode.NONE

log = logging.getLogger("logmq.replication")

TopicPartition = tuple[str, int]
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


class PartitionWatcher(Protocol):
    def partition_changed(self, key: TopicPartition | None) -> None:
        """A partition's followers, ISR or role changed (None: the broker is stopping)."""


class TierState(Protocol):
    def __call__(self, plog: PartitionLog, offset: int) -> Awaitable[Any]:
        """The remote tier's state at ``offset`` (RemoteLogManager.state_at)."""


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
        tier_state: TierState | None = None,
        tier_log_start: Callable[[PartitionLog, int], None] | None = None,
        tier_log_start_of: Callable[[PartitionLog], int] | None = None,
    ) -> None:
        self.broker_id = broker_id
        # KIP-405: what a follower reset into the remote tier starts from (the leader
        # epochs and producer state at the leader's local log start); None: no tier
        self.tier_state = tier_state
        # a tiered log's follower takes the leader's log start over both tiers as the
        # offset below which all is gone (DeleteRecords, remote expiry), never as its
        # local log start: its local retention is the remote tier's (remote_log.py)
        self.tier_log_start = tier_log_start
        # and reports its own over both tiers in its fetches (the leader's DeleteRecords
        # waits for the ISR's), not its local one
        self._tier_log_start_of = tier_log_start_of
        self._reset_state: dict[TopicPartition, Any] = {}
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
        self.isr_changes = IsrChangeQueue(
            broker_id, broker_epoch, alter_partitions, self._isr_change_answered
        )
        self._acks: dict[int, asyncio.Future[ErrorCode]] = {}
        # told when a partition's followers, ISR or role change (broker/replica/record_deletion.py)
        self._watchers: list[PartitionWatcher] = []
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

    def loop(self) -> asyncio.AbstractEventLoop:
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
        await self.isr_changes.stop()
        for fetcher in list(self.fetchers.values()):
            await fetcher.stop()
        self.fetchers.clear()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for key, replica in list(self.replicas.items()):
            self._run(key, replica.stop())
        self._changed(None)

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
        """The MetadataPublisher listener (broker/metadata/publisher.py); after the logs'."""
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
            self._changed(key)
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
        self._changed(key)  # an ISR change or a lost leadership

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
                self.isr_changes.queue(key, action)
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
                    state = self._reset_state.pop(key, None)
                    if state is not None and state.offset == action.offset:
                        state.install(plog)
                    self.logs.write_checkpoints()
                    self.waiters.notify(key)
            elif isinstance(action, StartFetching):
                self._fetcher(action.leader).fetch_from(key, action.leader_epoch, action.offset)
                self._following[key] = action.leader

    def _isr_change_answered(self, key: TopicPartition, error: ErrorCode, partition) -> None:
        replica = self.replicas.get(key)
        if replica is not None:
            self._run(key, replica.on_alter_isr_response(error, partition))

    def watch(self, watcher: PartitionWatcher) -> None:
        """Tell ``watcher`` of each change to a partition's followers, ISR or role."""
        self._watchers.append(watcher)

    def _changed(self, key: TopicPartition | None) -> None:
        for watcher in self._watchers:
            watcher.partition_changed(key)

    def _spawn(self, coro: Awaitable) -> None:
        if self._stopped:
            coro.close()  # type: ignore[attr-defined]
            return
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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

    def reported_log_start(self, plog: PartitionLog) -> int:
        """The log start this broker reports as a follower (Kafka's logStartOffset)."""
        if plog.remote_managed and self._tier_log_start_of is not None:
            return self._tier_log_start_of(plog)
        return plog.log_start_offset

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
        if plog.closed:
            pass
        elif plog.remote_managed and self.tier_log_start is not None:
            self.tier_log_start(plog, leader_log_start)
        elif leader_log_start > plog.log_start_offset:
            plog.advance_log_start_offset(leader_log_start)  # capped at our HW
        return plog.log_end_offset

    async def on_moved_to_tier(
        self, key: TopicPartition, fetch_offset: int, leader_local_start: int
    ) -> bool:
        """OFFSET_MOVED_TO_TIERED_STORAGE: the leader's local log starts at
        ``leader_local_start`` and the rest is in the remote tier. Build the state there
        (leader epochs, producer snapshot) from the remote tier, then start over at it,
        copying only the leader's local tail; True if we reset."""
        plog = self.logs.get_log(*key)
        if self.tier_state is not None and plog is not None:
            try:
                self._reset_state[key] = await self.tier_state(plog, leader_local_start)
            except LogMQError as e:  # the store down: start without it (as before)
                log.warning("remote state of %s-%d not read: %s", key[0], key[1], e)
        return self.on_out_of_range(key, fetch_offset, leader_local_start)

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

    def check_append(self, key: TopicPartition, acks: int, min_insync_replicas: int) -> int:
        """The leader epoch to stamp on a produce about to append; LogMQError when this
        replica may not take it (not the leader, too few in sync for acks=all).

        ``min_insync_replicas`` is the topic's current setting (configs change at runtime).
        """
        replica = self.replicas.get(key)
        if replica is None:
            if self.replicated:
                raise _cannot_append(key, ErrorCode.NOT_LEADER_OR_FOLLOWER)
            return LEADER_EPOCH
        if replica.config.min_insync_replicas != min_insync_replicas:
            replica.config = dataclasses.replace(
                replica.config, min_insync_replicas=min_insync_replicas
            )
        error = replica.check_append(acks)
        if error is not ErrorCode.NONE:
            raise _cannot_append(key, error)
        return replica.leader_epoch

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
    ) -> None:
        """acks=all: wait until the HW reaches ``required_offset``; LogMQError when it
        will not (leadership lost, the ISR below min.insync.replicas, the timeout)."""
        replica = self.replicas.get(key)
        if replica is None:
            if self.replicated:
                raise _not_replicated(key, required_offset, ErrorCode.NOT_LEADER_OR_FOLLOWER)
            return
        ack_key = next(self._ack_keys)
        deadline = self.clock() + max(timeout_ms, 0)
        error = replica.await_replication(ack_key, required_offset, deadline)
        if error is None:
            fut: asyncio.Future[ErrorCode] = self.loop().create_future()
            self._acks[ack_key] = fut
            try:
                error = await fut
            finally:
                self._acks.pop(ack_key, None)
        if error is not ErrorCode.NONE:
            raise _not_replicated(key, required_offset, error)

    # -- leader side: DeleteRecords ------------------------------------------------------

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

    async def new_logs_made(self, keys: Iterable[TopicPartition]) -> None:
        """Before a produce request's appends: new logs' files exist (LogManager)."""
        await self.logs.new_logs_made(keys)

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

    def follower_fetch(
        self,
        key: TopicPartition,
        replica_id: int,
        fetch_offset: int,
        leader_epoch: int,
        log_start_offset: int = -1,
    ) -> Outcome:
        """A follower fetches from ``fetch_offset``: that is its LEO now (and
        ``log_start_offset`` its log start, which DeleteRecords waits on). OK, or why
        the fetch is refused (the partition's entry of the answer)."""
        replica = self.replicas.get(key)
        if replica is None:
            return _NOT_LEADER
        plog = self.logs.get_log(*key)
        if plog is not None and replica.is_leader and plog.log_end_offset > replica.leo:
            # An append still waiting for its fsync has not reported yet, but followers
            # can read it already: count it now.
            self._run(key, replica.on_append(plog.log_end_offset, self.clock()))
        fetched = replica.on_follower_fetch(
            replica_id, fetch_offset, leader_epoch, self.clock(), log_start_offset
        )
        self._run(key, fetched.actions)
        self._changed(key)
        return OK if fetched.error is ErrorCode.NONE else Outcome(fetched.error)

    def epoch_end_offset(
        self, topic: str, partition: int, current_leader_epoch: int, epoch: int
    ) -> EpochEndOffset:
        """Where ``epoch`` ends in this leader's log (KIP-101), or why it cannot say.

        A replicated partition asks its replica; a single broker's partition answers
        from its own epoch history, fenced by the leader epoch of the metadata image
        (the one its Metadata and fetches use).
        """
        key = (topic, partition)
        if key in self.replicas:
            return self.end_offset_for_epoch(key, current_leader_epoch, epoch)
        plog = self.local_log(topic, partition)
        if plog is None:
            return EpochEndOffset(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        try:
            self._check_leader(topic, partition, current_leader_epoch)
        except LogMQError as e:
            return EpochEndOffset(e.code)
        found, end = plog.leader_epochs.end_offset_for_epoch(epoch, plog.log_end_offset)
        return EpochEndOffset(ErrorCode.NONE, found, end)

    def end_offset_for_epoch(
        self, key: TopicPartition, current_leader_epoch: int, epoch: int
    ) -> EpochEndOffset:
        replica = self.replicas.get(key)
        if replica is None:
            return EpochEndOffset(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        plog = self.logs.get_log(*key)
        if plog is not None:
            replica.leo = max(replica.leo, plog.log_end_offset)
        return replica.end_offset_for_epoch(current_leader_epoch, epoch)


_NOT_LEADER = Outcome(ErrorCode.NOT_LEADER_OR_FOLLOWER)


def _cannot_append(key: TopicPartition, error: ErrorCode) -> LogMQError:
    return LogMQError(f"cannot append to {key[0]}-{key[1]}: {error.name}", error)


def _not_replicated(key: TopicPartition, required_offset: int, error: ErrorCode) -> LogMQError:
    return LogMQError(
        f"{key[0]}-{key[1]} not replicated up to offset {required_offset}: {error.name}", error
    )
