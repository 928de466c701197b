"""One ``__transaction_state`` partition's transaction coordinator at run time (a shard).

The deterministic :class:`~logmq.txn.TransactionCoordinator` decides; the generic shard
(:mod:`logmq.broker.coordinator_shard`) orders its operations, appends their records,
answers each only once its round is fsynced and replicated, and reloads the core from
the log when an append fails.

The core's own protocol is two-phase: a state change comes back as a :class:`Pending`
that takes effect only on ``written``. Under the shard that protocol collapses into one
step: :class:`TxnShardCore` reports ``written`` at once, inside the operation, and
queues the record for the round. Memory is then ahead of the log exactly as a group
core's is, and for the same reason nobody can observe it: every answer waits for the
round to be durable, and a failed append drops the whole core (so ``write_failed`` is
never needed; the reload reads back the state that is actually on disk).

Markers are the side effect: the :class:`MarkerJob` s ``written`` returns go out through
``take_effects``, so they are sent only once the Prepare* record is replicated.
``deliver_markers`` (the service's: send, retry, until every partition has its marker)
runs as a task of the core that asked for it; once it is done the shard reports
``markers_written`` with the job's id, which appends the Complete* record. A reload
cancels those tasks: the new core's ``load_complete`` hands out fresh jobs for every
transaction the log shows in Prepare*, which is also how a new coordinator finishes
what a failed one decided.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Unpack

from logmq.broker.coordinator_shard import CoordinatorError, CoordinatorShard, ShardOptions
from logmq.errors import ErrorCode
from logmq.storage.log_manager import LogManager
from logmq.storage.partition_log import PartitionLog
from logmq.txn import (
    TXN_STATE_TOPIC,
    InitProducerIdResult,
    ListTransactionsResult,
    MarkerJob,
    Pending,
    TopicPartition,
    TransactionCoordinator,
    TransactionDescription,
    TxnConfig,
    TxnRecord,
    TxnRecordError,
    TxnState,
    is_epoch_exhausted,
)
from logmq.txn.codec import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, decode_key

log = logging.getLogger("logmq.txn")

# a core's first job id is random below 2**JOB_ID_BITS: cores never reach each other's
JOB_ID_BITS = 62

# What an append or replication error of __transaction_state tells a transactional
# client (Kafka's mapping): waiting helps for an unavailable partition, a lost
# leadership means "find the new coordinator".
TXN_APPEND_ERRORS = {
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_FULL: ErrorCode.NOT_COORDINATOR,
}


class NeedProducerId:
    """The answer of an InitProducerId that needs a fresh producer id and was given none:
    nothing changed; allocate one and submit again with it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_PRODUCER_ID"


NEED_PRODUCER_ID = NeedProducerId()


class _NoProducerId(Exception):
    pass


class TxnShardCore:
    """The transaction core as the shard drives it (see the module docstring)."""

    def __init__(self, coordinator: TransactionCoordinator, now_ms: int) -> None:
        self.coordinator = coordinator
        self._interval_ms = coordinator.config.abort_check_interval_ms
        self._next_expire_ms = now_ms + self._interval_ms
        self._records: list[TxnRecord] = []
        self._effects: list[MarkerJob] = []

    # -- what the shard asks ------------------------------------------------------------
    def take_records(self) -> list[TxnRecord]:
        out, self._records = self._records, []
        return out

    def take_completions(self) -> list[tuple[int, Any]]:
        return []  # no request waits inside this core

    def take_effects(self) -> list[MarkerJob]:
        out, self._effects = self._effects, []
        return out

    def next_deadline_ms(self) -> int | None:
        return self._next_expire_ms

    def tick(self, now_ms: int) -> list[Pending]:
        """Abort timed-out transactions, remove expired ids; again in one interval."""
        expired = self.coordinator.expire(now_ms)
        for pending in expired:
            self.apply(pending)
        self._next_expire_ms = now_ms + self._interval_ms
        return expired

    def loaded(self, jobs: Iterable[MarkerJob]) -> None:
        """Marker jobs ``load_complete`` found owed: delivered after the first round."""
        self._effects += jobs

    def apply(self, result: Any) -> Any:
        """A Pending takes effect now (its round makes it durable before anyone hears);
        anything else is already the answer."""
        if isinstance(result, Pending):
            self._records += result.records
            self._effects += self.coordinator.written(result)
            return result.answer
        return result

    # -- operations ---------------------------------------------------------------------
    def needs_producer_id(self, transactional_id: str) -> bool:
        """May InitProducerId of this id need a fresh producer id (new id, epochs spent)?"""
        meta = self.coordinator.metadata(transactional_id)
        return meta is None or is_epoch_exhausted(meta.producer_epoch)

    def init_producer_id(
        self,
        transactional_id: str,
        timeout_ms: int,
        expected_producer_id: int,
        expected_epoch: int,
        now_ms: int,
        producer_id: int | None,
    ) -> InitProducerIdResult | NeedProducerId:
        given = [] if producer_id is None else [producer_id]

        def allocate() -> int:
            if not given:
                raise _NoProducerId
            return given.pop()

        try:
            result = self.coordinator.init_producer_id(
                transactional_id,
                timeout_ms,
                expected_producer_id,
                expected_epoch,
                now_ms=now_ms,
                allocate_producer_id=allocate,
            )
        except _NoProducerId:  # the core allocates before it changes anything
            return NEED_PRODUCER_ID
        return self.apply(result)

    def markers_written(self, job: MarkerJob, now_ms: int) -> bool:
        """Every partition of ``job`` has its marker: write Complete*. False: stale job."""
        pending = self.coordinator.markers_written(
            job.transactional_id, job.producer_id, job.producer_epoch, now_ms, job_id=job.job_id
        )
        if pending is None:
            return False
        self.apply(pending)
        return True


TxnOperation = Callable[[TxnShardCore, int], Any]


class TxnShard(CoordinatorShard[TxnShardCore]):
    """The coordinator of the transactional ids that live in one transaction-state partition.

    Every request method queues an operation and returns its future (answered once the
    round is durable); it raises CoordinatorError at once when the shard is not active.
    """

    def __init__(
        self,
        partition: int,
        partition_count: int,
        logs: LogManager,
        get_log: Callable[[], PartitionLog | None],
        config: TxnConfig,
        *,
        deliver_markers: Callable[[MarkerJob], Awaitable[bool]],
        **options: Unpack[ShardOptions],
    ) -> None:
        super().__init__(
            TXN_STATE_TOPIC,
            partition,
            logs,
            get_log,
            self._build_core,
            on_effects=self._start_markers,
            error_map=TXN_APPEND_ERRORS,
            kind="txn",
            logger=log,
            **options,
        )
        self.partition_count = partition_count
        self._config = config
        self._deliver_markers = deliver_markers

    # -- requests -----------------------------------------------------------------------
    def needs_producer_id(self, transactional_id: str) -> bool:
        """A hint read outside the worker: allocate an id before submitting InitProducerId.

        Racing with queued operations is harmless: an id allocated for nothing is never
        used (ids are plentiful), and one missing makes the operation answer
        NEED_PRODUCER_ID with nothing changed.
        """
        self.check_available()
        assert self._run is not None
        return self._run.core.needs_producer_id(transactional_id)

    def init_producer_id(
        self,
        transactional_id: str,
        timeout_ms: int,
        expected_producer_id: int = NO_PRODUCER_ID,
        expected_epoch: int = NO_PRODUCER_EPOCH,
        *,
        producer_id: int | None = None,
    ) -> asyncio.Future[InitProducerIdResult | NeedProducerId]:
        """InitProducerId; ``producer_id`` is a fresh id the core may use (see
        ``needs_producer_id``). Answers NEED_PRODUCER_ID if it needed one and had none."""
        return self.submit(
            lambda core, now: core.init_producer_id(
                transactional_id,
                timeout_ms,
                expected_producer_id,
                expected_epoch,
                now,
                producer_id,
            )
        )

    def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> asyncio.Future[ErrorCode]:
        wanted = tuple(partitions)
        return self._change(
            lambda txns, now: txns.add_partitions(
                transactional_id, producer_id, producer_epoch, wanted, now
            )
        )

    def verify_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> asyncio.Future[dict[TopicPartition, ErrorCode]]:
        """AddPartitionsToTxn with verify_only: is each partition in the transaction?"""
        wanted = tuple(partitions)
        return self.submit(
            lambda core, now: core.coordinator.verify_partitions(
                transactional_id, producer_id, producer_epoch, wanted
            )
        )

    def add_offsets(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        group_id: str,
        offsets_partition: int,
    ) -> asyncio.Future[ErrorCode]:
        return self._change(
            lambda txns, now: txns.add_offsets(
                transactional_id, producer_id, producer_epoch, group_id, offsets_partition, now
            )
        )

    def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> asyncio.Future[ErrorCode]:
        return self._change(
            lambda txns, now: txns.end_txn(
                transactional_id, producer_id, producer_epoch, commit, now
            )
        )

    def describe(
        self, transactional_ids: Iterable[str]
    ) -> asyncio.Future[list[TransactionDescription]]:
        ids = tuple(transactional_ids)
        return self.submit(lambda core, now: core.coordinator.describe(ids))

    def list_transactions(
        self,
        states_filter: Iterable[str] = (),
        producer_ids_filter: Iterable[int] = (),
        duration_filter_ms: int = -1,
    ) -> asyncio.Future[ListTransactionsResult]:
        states, pids = tuple(states_filter), tuple(producer_ids_filter)
        return self.submit(
            lambda core, now: core.coordinator.list_transactions(
                states, pids, duration_filter_ms, now
            )
        )

    def _change(self, change: Callable[[TransactionCoordinator, int], Any]) -> asyncio.Future[Any]:
        """Queue ``change(coordinator, now_ms)``: the Pending it returns takes effect in
        the operation (see the module docstring) and its answer is the future's."""
        return self.submit(lambda core, now: core.apply(change(core.coordinator, now)))

    def transaction_count(self) -> int:
        """Transactional ids of a loaded shard, for the metrics."""
        run = self._run
        return 0 if run is None else len(run.core.coordinator.transactional_ids())

    # -- markers --------------------------------------------------------------------------
    def _start_markers(self, jobs: list[Any]) -> None:
        """Effects of a durable round: deliver each marker job, then write Complete*."""
        run = self._run
        if run is None:
            return
        for job in jobs:
            self.spawn_side_task(self._finish(job, run.core), "txn-markers")

    async def _finish(self, job: MarkerJob, core: TxnShardCore) -> None:
        try:
            delivered = await self._deliver_markers(job)
        except asyncio.CancelledError:
            raise
        except Exception:
            # The transaction stays in Prepare*: the next load of this partition (a
            # failover, a restart) sends its markers again.
            log.exception("markers of %r (job %d) failed", job.transactional_id, job.job_id)
            return
        if not delivered:
            log.warning(
                "markers of %r (producer %d, epoch %d) abandoned: fenced by a newer "
                "coordinator or producer epoch",
                job.transactional_id,
                job.producer_id,
                job.producer_epoch,
            )
            return

        def complete(current: TxnShardCore, now_ms: int) -> bool:
            # job ids are per core: a report for a dropped core's job must not match
            return current is core and current.markers_written(job, now_ms)

        try:
            await self.submit(complete)
        except CoordinatorError as exc:
            # Reloading (the new core resends the markers) or not replicated in time
            # (the record is appended; later rounds wait for it).
            log.debug("Complete* of %r not confirmed: %s", job.transactional_id, exc)

    # -- the shard's hooks --------------------------------------------------------------
    def _build_core(self, newest: dict[bytes, bytes], now_ms: int) -> TxnShardCore:
        coordinator = TransactionCoordinator(
            self.partition,
            self.partition_count,
            self._config,
            self.leader_epoch,
            # a random start: a reloaded core (or a restarted broker with the same
            # coordinator epoch) never reuses an earlier core's job ids, which partition
            # leaders use to recognise a marker they already wrote (txn_markers.py)
            first_job_id=secrets.randbits(JOB_ID_BITS) + 1,
        )
        for key, value in newest.items():
            try:
                coordinator.replay(key, value)
            except TxnRecordError as exc:
                try:
                    what = repr(decode_key(key))
                except TxnRecordError:
                    what = f"key {key[:64]!r}"
                log.error("%s: transactional id %s not loaded: %s", self.name, what, exc)
        core = TxnShardCore(coordinator, now_ms)
        core.loaded(coordinator.load_complete(now_ms, coordinator_epoch=self.leader_epoch))
        return core

    def _loaded(self, core: TxnShardCore) -> None:
        self._log_loaded(len(core.coordinator.transactional_ids()), "transactional ids")

    def _ticked(self, result: Any) -> None:
        for pending in result:
            target = pending.target
            if target is not None and target.state is TxnState.PREPARE_ABORT:
                log.info("transaction %r timed out: aborting", pending.transactional_id)
