"""One ``__transaction_state`` partition's transaction coordinator at run time (a shard).

The deterministic :class:`~logmq.txn.TransactionCoordinator` decides; the generic shard
(:mod:`logmq.broker.coordinator.shard_runtime`) orders its operations, appends the records they
leave, answers each only once its round is fsynced and replicated, and reloads the core
from the log when a round fails. The core speaks the shard's contract itself
(:class:`~logmq.broker.coordinator.shard_runtime.ShardCore`), exactly as the group core does:
every request method here is one operation on it.

Markers are the side effect: the :class:`MarkerJob` s the core decides go out through
``take_effects``, so they are sent only once the Prepare* record is replicated.
``deliver_markers`` (the service's: send, retry, until every partition has its marker)
runs as a task of the core that asked for it; once it is done the shard reports
``markers_written`` with the job, which appends the Complete* record. A reload
cancels those tasks: the new core's ``load_complete`` hands out fresh jobs for every
transaction the log shows in Prepare*, which is also how a new coordinator finishes
what a failed one decided.

InitProducerId may need a fresh producer id, which comes from an async allocator that
cannot run inside an operation: the service allocates one first when
``needs_producer_id`` says so, and the core answers NEED_PRODUCER_ID, having changed
nothing, when it needed one and was given none.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Unpack

from logmq.broker.coordinator.shard_runtime import CoordinatorError, CoordinatorShard, ShardOptions
from logmq.errors import ErrorCode
from logmq.storage.log_manager import LogManager
from logmq.storage.partition_log import PartitionLog
from logmq.txn import (
    NEED_PRODUCER_ID,
    TXN_STATE_TOPIC,
    Expired,
    InitProducerIdResult,
    ListTransactionsResult,
    MarkerJob,
    NeedProducerId,
    TopicPartition,
    TransactionCoordinator,
    TransactionDescription,
    TxnConfig,
    TxnRecordError,
)
from logmq.txn.codec import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, decode_key

__all__ = ["NEED_PRODUCER_ID", "TXN_APPEND_ERRORS", "NeedProducerId", "TxnShard"]

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


class TxnShard(CoordinatorShard[TransactionCoordinator]):
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
                now_ms=now,
                producer_id=producer_id,
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
        return self.submit(
            lambda core, now: core.add_partitions(
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
            lambda core, now: core.verify_partitions(
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
        return self.submit(
            lambda core, now: core.add_offsets(
                transactional_id, producer_id, producer_epoch, group_id, offsets_partition, now
            )
        )

    def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> asyncio.Future[ErrorCode]:
        return self.submit(
            lambda core, now: core.end_txn(
                transactional_id, producer_id, producer_epoch, commit, now
            )
        )

    def describe(
        self, transactional_ids: Iterable[str]
    ) -> asyncio.Future[list[TransactionDescription]]:
        ids = tuple(transactional_ids)
        return self.submit(lambda core, now: core.describe(ids))

    def list_transactions(
        self,
        states_filter: Iterable[str] = (),
        producer_ids_filter: Iterable[int] = (),
        duration_filter_ms: int = -1,
    ) -> asyncio.Future[ListTransactionsResult]:
        states, pids = tuple(states_filter), tuple(producer_ids_filter)
        return self.submit(
            lambda core, now: core.list_transactions(states, pids, duration_filter_ms, now)
        )

    def transaction_count(self) -> int:
        """Transactional ids of a loaded shard, for the metrics."""
        run = self._run
        return 0 if run is None else len(run.core.transactional_ids())

    # -- markers --------------------------------------------------------------------------
    def _start_markers(self, jobs: list[Any]) -> None:
        """Effects of a durable round: deliver each marker job, then write Complete*."""
        run = self._run
        if run is None:
            return
        for job in jobs:
            self.spawn_side_task(self._finish(job, run.core), "txn-markers")

    async def _finish(self, job: MarkerJob, core: TransactionCoordinator) -> None:
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

        def complete(current: TransactionCoordinator, now_ms: int) -> bool:
            # job ids are per core: a report for a dropped core's job must not match
            return current is core and current.markers_written(job, now_ms)

        try:
            await self.submit(complete)
        except CoordinatorError as exc:
            # Reloading (the new core resends the markers) or not replicated in time
            # (the record is appended; later rounds wait for it).
            log.debug("Complete* of %r not confirmed: %s", job.transactional_id, exc)

    # -- the shard's hooks --------------------------------------------------------------
    def _build_core(self, newest: dict[bytes, bytes], now_ms: int) -> TransactionCoordinator:
        core = TransactionCoordinator(
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
                core.replay(key, value)
            except TxnRecordError as exc:
                try:
                    what = repr(decode_key(key))
                except TxnRecordError:
                    what = f"key {key[:64]!r}"
                log.error("%s: transactional id %s not loaded: %s", self.name, what, exc)
        # the jobs it owes are effects: delivered once the first round is durable
        core.load_complete(now_ms, coordinator_epoch=self.leader_epoch)
        return core

    def _loaded(self, core: TransactionCoordinator) -> None:
        self._log_loaded(len(core.transactional_ids()), "transactional ids")

    def _ticked(self, result: Expired) -> None:
        for txn_id in result.timed_out:
            log.info("transaction %r timed out: aborting", txn_id)
