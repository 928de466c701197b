"""The broker's transaction coordinator: ``__transaction_state`` and its shards.

Transactional ids live in the internal compacted topic ``__transaction_state``; an id's
coordinator is the leader of partition ``xxh32(transactional_id) % N``. As for groups,
:class:`~logmq.broker.coordinator.sharded_service.ShardedCoordinatorService` creates the topic
on first use (through the TopicCreator, like ``__consumer_offsets``), runs one
:class:`~logmq.broker.coordinator.txn_shard.TxnShard` per partition this broker leads (one per
leader epoch: leadership regained at a newer epoch loads a new shard from the log) and
routes an id to its shard; this service answers the transaction APIs of both doors.

It also delivers the shards' transaction markers: a ``MarkerSender`` (supplied by the
composition root) writes WriteTxnMarkers to each partition's leader; partitions that
fail are retried with backoff, sooner when the metadata changes (a new leader), and a
partition whose topic was deleted counts as done. Once every partition has its marker
the shard writes the Complete* record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Protocol

from logmq.broker.coordinator.group_service import OFFSETS_TOPIC_CONFIGS
from logmq.broker.coordinator.shard_runtime import CoordinatorError
from logmq.broker.coordinator.sharded_service import ShardedCoordinatorService
from logmq.broker.coordinator.txn_shard import TxnShard
from logmq.errors import ErrorCode, error_for
from logmq.group import OFFSETS_TOPIC
from logmq.group import coordinator_partition as group_partition
from logmq.txn import (
    TXN_STATE_TOPIC,
    InitProducerIdResult,
    ListTransactionsResult,
    MarkerJob,
    NeedProducerId,
    TopicPartition,
    TransactionDescription,
    TxnConfig,
    TxnState,
    coordinator_partition,
)
from logmq.txn.codec import MAX_ID_BYTES, NO_PRODUCER_EPOCH, NO_PRODUCER_ID

if TYPE_CHECKING:
    from logmq.broker.config import BrokerConfig
    from logmq.broker.metadata.quorum_service import MetadataQuorum
    from logmq.broker.metadata.topic_creation import TopicCreator
    from logmq.broker.replica.local_logs import LocalLogs
    from logmq.broker.replica.replica_manager import ReplicaManager
    from logmq.cluster.metadata_image import MetadataImage
    from logmq.storage.log_manager import LogManager

log = logging.getLogger("logmq.txn")

DEFAULT_PARTITIONS = 50  # transaction.state.log.num.partitions
MARKER_RETRY_MIN_S = 0.1
MARKER_RETRY_MAX_S = 5.0
INIT_ATTEMPTS = 3  # InitProducerId rounds: the last one always carries a fresh id

# A partition leader refusing a marker with one of these has seen a newer coordinator
# or producer epoch: the transaction is someone else's to finish, stop sending.
_MARKER_FENCED = frozenset(
    {
        ErrorCode.TRANSACTION_COORDINATOR_FENCED,
        ErrorCode.INVALID_PRODUCER_EPOCH,
        ErrorCode.PRODUCER_FENCED,
    }
)


class MarkerSender(Protocol):
    """Writes a job's markers (WriteTxnMarkers) to each of its partitions' leaders."""

    async def send(self, job: MarkerJob) -> dict[TopicPartition, ErrorCode]:
        """Per partition of ``job``: NONE once its leader appended the marker, else why not
        (a partition left out counts as not written)."""
        ...


def txn_topic_configs(cfg: BrokerConfig) -> dict[str, str]:
    """Compacted and never deleted by age, like the offsets topic: the newest value of a
    key is an id's state. min.insync.replicas from the broker's setting for this log
    when it has one, else the broker default applies."""
    configs = dict(OFFSETS_TOPIC_CONFIGS)
    min_isr = getattr(cfg, "transaction_state_log_min_isr", None)
    if min_isr is not None:
        configs["min.insync.replicas"] = str(min_isr)
    return configs


class TransactionCoordinatorService(ShardedCoordinatorService[TxnShard]):
    def __init__(
        self,
        cfg: BrokerConfig,
        quorum: MetadataQuorum,
        logs: LogManager,
        local_logs: LocalLogs,
        replicas: ReplicaManager,
        topic_creator: TopicCreator,
        allocate_producer_id: Callable[[], Awaitable[int]],
        marker_sender: MarkerSender,
        *,
        partitions: int = DEFAULT_PARTITIONS,
        replication_factor: int | None = None,
        config: TxnConfig | None = None,
        write_timeout_ms: int | None = None,
    ) -> None:
        """``replication_factor`` None: the TopicCreator's rule for internal topics (as
        for ``__consumer_offsets``); ``write_timeout_ms`` None: the broker's
        coordinator write timeout (``offsets_commit_timeout_ms``)."""
        self.config = config or TxnConfig()
        super().__init__(
            cfg,
            quorum,
            logs,
            local_logs,
            replicas,
            topic_creator,
            topic=TXN_STATE_TOPIC,
            topic_partitions=partitions,
            topic_configs=txn_topic_configs(cfg),
            partition_of=coordinator_partition,
            new_shard=partial(TxnShard, config=self.config, deliver_markers=self._deliver_markers),
            replication_factor=replication_factor,
            write_timeout_ms=write_timeout_ms,
            logger=log,
        )
        self.default_offsets_partitions = cfg.offsets_topic_partitions
        self._allocate_producer_id = allocate_producer_id
        self._marker_sender = marker_sender
        self._metadata_changed = asyncio.Event()  # replaced on every change

    def _image_changed(self, image: MetadataImage) -> None:
        """Wake marker retries: a partition may have a new leader."""
        self._metadata_changed.set()
        self._metadata_changed = asyncio.Event()

    # -- routing ------------------------------------------------------------------------
    def ensure_txn_topic(self) -> int:
        """The partition count of ``__transaction_state``, asking for it on first use."""
        return self.ensure_topic()

    async def find_coordinator(self, transactional_id: str) -> tuple[int, str, int]:
        """FindCoordinator with key type 1 (the topic is created on first use)."""
        return self.coordinator_for(transactional_id)

    def offsets_partition_for(self, group_id: str) -> int:
        """The ``__consumer_offsets`` partition of ``group_id`` (AddOffsetsToTxn): by the
        topic's count, or the count it will be created with."""
        offsets = self.quorum.image.topics.get(OFFSETS_TOPIC)
        count = len(offsets.partitions) if offsets is not None else 0
        return group_partition(group_id, count or self.default_offsets_partitions)

    # -- the transaction APIs -----------------------------------------------------------
    # Each raises CoordinatorError (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
    # COORDINATOR_NOT_AVAILABLE, ...) when this broker cannot answer for the id now.

    async def init_producer_id(
        self,
        transactional_id: str,
        timeout_ms: int,
        expected_producer_id: int = NO_PRODUCER_ID,
        expected_epoch: int = NO_PRODUCER_EPOCH,
    ) -> InitProducerIdResult:
        """InitProducerId of a transactional producer.

        A fresh producer id comes from the broker's (async) allocator, which cannot run
        inside an operation: it is allocated before queueing when the shard's state says
        one may be needed; if the state changed meanwhile the operation answers
        NEED_PRODUCER_ID, having changed nothing, and is queued again with an id.
        """
        if _id_invalid(transactional_id):
            return InitProducerIdResult(ErrorCode.INVALID_REQUEST)
        producer_id = None
        if self.shard_for(transactional_id).needs_producer_id(transactional_id):
            producer_id = await self._allocate_producer_id()
        for _ in range(INIT_ATTEMPTS):
            answer = await self.shard_for(transactional_id).init_producer_id(
                transactional_id,
                timeout_ms,
                expected_producer_id,
                expected_epoch,
                producer_id=producer_id,
            )
            if not isinstance(answer, NeedProducerId):
                return answer
            producer_id = await self._allocate_producer_id()
        raise CoordinatorError(  # not reached: an attempt with an id never needs another
            "no producer id could be assigned", ErrorCode.COORDINATOR_NOT_AVAILABLE
        )

    async def add_partitions_to_txn(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> None:
        """AddPartitionsToTxn from a producer: all its partitions join, or the LogMQError
        (the coordinator's code) answers every one of them."""
        if _id_invalid(transactional_id):
            raise error_for(ErrorCode.INVALID_REQUEST)
        shard = self.shard_for(transactional_id)
        _raise_if_refused(
            await shard.add_partitions(transactional_id, producer_id, producer_epoch, partitions)
        )

    async def verify_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn with verify_only (KIP-890, from a partition leader)."""
        partitions = list(partitions)
        if _id_invalid(transactional_id):
            return dict.fromkeys(partitions, ErrorCode.INVALID_REQUEST)
        shard = self.shard_for(transactional_id)
        return await shard.verify_partitions(
            transactional_id, producer_id, producer_epoch, partitions
        )

    async def add_offsets_to_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str
    ) -> None:
        """AddOffsetsToTxn: the group's offsets partition joins the transaction (or the
        LogMQError with the coordinator's code)."""
        if _id_invalid(transactional_id):
            raise error_for(ErrorCode.INVALID_REQUEST)
        if not group_id:
            raise error_for(ErrorCode.INVALID_GROUP_ID)
        shard = self.shard_for(transactional_id)
        code = await shard.add_offsets(
            transactional_id,
            producer_id,
            producer_epoch,
            group_id,
            self.offsets_partition_for(group_id),
        )
        _raise_if_refused(code)

    async def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> None:
        """EndTxn: answered once Prepare* is durable; markers and Complete* follow. The
        LogMQError carries the coordinator's code when it refuses."""
        if _id_invalid(transactional_id):
            raise error_for(ErrorCode.INVALID_REQUEST)
        shard = self.shard_for(transactional_id)
        _raise_if_refused(
            await shard.end_txn(transactional_id, producer_id, producer_epoch, commit)
        )

    async def describe_transactions(
        self, transactional_ids: Iterable[str]
    ) -> list[TransactionDescription]:
        """DescribeTransactions: one description per id, in order; an id this broker
        cannot answer for gets its error code instead of raising."""
        ids = list(transactional_ids)
        by_shard: dict[int, list[str]] = {}
        errors: dict[str, ErrorCode] = {}
        shards: dict[int, TxnShard] = {}
        for txn_id in ids:
            try:
                shard = self.shard_for(txn_id)
                shard.check_available()
            except CoordinatorError as exc:
                errors[txn_id] = exc.code
                continue
            shards[shard.partition] = shard
            by_shard.setdefault(shard.partition, []).append(txn_id)
        found: dict[str, TransactionDescription] = {}

        async def describe(partition: int) -> None:
            try:
                for description in await shards[partition].describe(by_shard[partition]):
                    found[description.transactional_id] = description
            except CoordinatorError as exc:
                for txn_id in by_shard[partition]:
                    errors[txn_id] = exc.code

        await asyncio.gather(*(describe(p) for p in by_shard))
        return [
            found.get(t) or TransactionDescription(t, errors.get(t, ErrorCode.NOT_COORDINATOR))
            for t in ids
        ]

    async def list_transactions(
        self,
        states_filter: Iterable[str] = (),
        producer_ids_filter: Iterable[int] = (),
        duration_filter_ms: int = -1,
    ) -> ListTransactionsResult:
        """ListTransactions over the partitions this broker coordinates (none if the topic
        does not exist yet; it is not created for this). COORDINATOR_LOAD_IN_PROGRESS
        while any of them is loading."""
        states, pids = list(states_filter), list(producer_ids_filter)
        shards = self.shards()
        for shard in shards:
            shard.check_available()
        results = await asyncio.gather(
            *(s.list_transactions(states, pids, duration_filter_ms) for s in shards)
        )
        unknown = [name for name in states if TxnState.from_kafka_name(name) is None]
        listings = [t for r in results for t in r.transactions]
        listings.sort(key=lambda t: t.transactional_id)
        return ListTransactionsResult(listings, unknown)

    # -- markers ------------------------------------------------------------------------
    async def _deliver_markers(self, job: MarkerJob) -> bool:
        """Send ``job``'s markers until every partition has one (True), or a leader says
        a newer coordinator or producer epoch took over (False). Runs as a task of the
        shard's core, so losing the partition cancels it."""
        remaining = set(job.partitions)
        delay = MARKER_RETRY_MIN_S
        while remaining:
            changed = self._metadata_changed
            try:
                results = await self._marker_sender.send(
                    replace(job, partitions=tuple(sorted(remaining)))
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a connection failure, say: every partition again
                log.warning("sending markers of %r failed: %s", job.transactional_id, exc)
                results = {}
            for tp in sorted(remaining):
                outcome = results.get(tp)
                if outcome is None:
                    continue
                if outcome.ok:
                    remaining.discard(tp)
                elif outcome.error in _MARKER_FENCED:
                    log.warning(
                        "marker of %r for %s-%d refused: %s",
                        job.transactional_id,
                        tp[0],
                        tp[1],
                        outcome.error.name,
                    )
                    return False
            # Only once a send failed: this broker's image may lag behind a new topic.
            remaining = {tp for tp in remaining if self._partition_exists(tp)}
            if not remaining:
                break
            log.debug(
                "markers of %r pending for %s: %s",
                job.transactional_id,
                sorted(remaining),
                {tp: getattr(results.get(tp), "error", None) for tp in remaining},
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await changed.wait()
            delay = min(delay * 2, MARKER_RETRY_MAX_S)
        return True

    def _partition_exists(self, tp: TopicPartition) -> bool:
        """False once the partition is gone from the metadata (its topic was deleted):
        its marker is owed to no one."""
        return self.quorum.image.partition(tp[0], tp[1]) is not None

    # -- metrics ------------------------------------------------------------------------
    def stats(self) -> int:
        """Transactional ids over the loaded shards."""
        return sum(shard.transaction_count() for shard in list(self._shards.values()))


def _raise_if_refused(code: ErrorCode) -> None:
    """The core's answer to a whole request, as the service's exception (its message is
    the code's name, as the native door answered it before)."""
    if code is not ErrorCode.NONE:
        raise error_for(code)


def _id_invalid(transactional_id: str) -> bool:
    return not transactional_id or len(transactional_id.encode()) > MAX_ID_BYTES
