"""The transactions of one ``__transaction_state`` partition, as its leader coordinates them.

A broker runs one :class:`TransactionCoordinator` per transaction-state partition it
leads: it is rebuilt from the partition's records (:meth:`~TransactionCoordinator.replay`,
then :meth:`~TransactionCoordinator.load_complete`) and dropped when leadership goes.
It is pure: no clock (every call takes ``now_ms``), no I/O, no tasks.

It is a core of the coordinator shard (:class:`~logmq.broker.coordinator.shard_runtime.ShardCore`,
as the group coordinator is): a request that changes state changes memory at once and
leaves its record in an outbox (:meth:`~TransactionCoordinator.take_records`); commit and
abort markers to send are :class:`MarkerJob` effects
(:meth:`~TransactionCoordinator.take_effects`). The shard appends a round's records,
answers its requests only once they are durable, releases its effects only then, and if
a round cannot be made durable drops this object and rebuilds one from the log, so
memory being ahead of the log is never observed and nothing here rolls back. A job's
completion (:meth:`~TransactionCoordinator.markers_written`) leads to the Complete*
record; timeouts and id expiry run on :meth:`~TransactionCoordinator.tick`.

Kafka's states and error codes, KIP-98 with KIP-360 (epoch bumps, producer id rotation,
retried InitProducerId) and KIP-890 part 1 (brokers verify a partition is in the
transaction before appending transactional data).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ..errors import ErrorCode
from ..group.codec import OFFSETS_TOPIC
from .codec import (
    MAX_EPOCH,
    MAX_ID_BYTES,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    TopicPartition,
    TxnRecord,
    TxnRecordError,
    TxnState,
    TxnStateValue,
    coordinator_partition,
    decode_key,
    decode_value,
    state_record,
)
from .model import (
    NEED_PRODUCER_ID,
    Expired,
    InitProducerIdResult,
    ListTransactionsResult,
    MarkerJob,
    NeedProducerId,
    TransactionDescription,
    TransactionListing,
    TransactionMetadata,
    TxnConfig,
    is_epoch_exhausted,
)

_PREPARED = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
_COMPLETED = (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
_IDLE = (TxnState.EMPTY, *_COMPLETED)  # no transaction open: may start one, may expire
_OPEN = (TxnState.ONGOING, *_PREPARED)


class TransactionCoordinator:
    """Coordinates the transactional ids that hash to ``partition`` of ``__transaction_state``.

    ``coordinator_epoch`` is the leader epoch of that partition; markers carry it so that
    partition leaders can refuse markers of a deposed coordinator.
    """

    def __init__(
        self,
        partition: int = 0,
        partition_count: int = 1,
        config: TxnConfig | None = None,
        coordinator_epoch: int = 0,
        first_job_id: int = 1,
    ) -> None:
        self.partition = partition
        self.partition_count = partition_count
        self.config = config or TxnConfig()
        self.coordinator_epoch = coordinator_epoch
        self._txns: dict[str, TransactionMetadata] = {}
        # the shell starts each core's job ids somewhere no earlier core's reach, so that
        # (coordinator epoch, job id) names one transaction's markers for good
        self._next_job_id = first_job_id
        self._records: list[TxnRecord] = []  # the outbox: state changes to append
        self._effects: list[MarkerJob] = []  # marker jobs to start once durable
        self._next_check_ms: int | None = None  # set by load_complete, then by tick

    # ---- the shard's side (ShardCore) ---------------------------------------------

    def take_records(self) -> list[TxnRecord]:
        """The records of the state changes since the last call, oldest first."""
        out, self._records = self._records, []
        return out

    def take_completions(self) -> list[tuple[int, object]]:
        return []  # no request waits inside this core

    def take_effects(self) -> list[MarkerJob]:
        """Marker jobs decided since the last call: to start once their Prepare* record
        is durable (a job the loader found owed, once everything loaded is)."""
        out, self._effects = self._effects, []
        return out

    def next_deadline_ms(self) -> int | None:
        """When :meth:`tick` should run: every ``config.abort_check_interval_ms``."""
        return self._next_check_ms

    def tick(self, now_ms: int) -> Expired:
        """Abort transactions open past their timeout, fencing the producer with an epoch
        bump, and remove ids idle past ``id_expiration_ms`` with a tombstone."""
        timed_out, removed = [], []
        for txn_id in sorted(self._txns):
            meta = self._txns[txn_id]
            if meta.state is TxnState.ONGOING and meta.txn_start_ms + meta.timeout_ms < now_ms:
                self._change(meta, _fence_target(meta, now_ms))
                timed_out.append(txn_id)
            elif (
                meta.state in _IDLE and meta.last_update_ms + self.config.id_expiration_ms <= now_ms
            ):
                self._change(meta, None)
                removed.append(txn_id)
        self._next_check_ms = now_ms + self.config.abort_check_interval_ms
        return Expired(tuple(timed_out), tuple(removed))

    # ---- reading -------------------------------------------------------------------

    def transactional_ids(self) -> list[str]:
        return sorted(self._txns)

    def metadata(self, transactional_id: str) -> TransactionMetadata | None:
        return self._txns.get(transactional_id)

    def check_id(self, transactional_id: str) -> ErrorCode:
        """INVALID_REQUEST for an empty (or huge) id, NOT_COORDINATOR if it hashes elsewhere."""
        if not transactional_id or len(transactional_id.encode()) > MAX_ID_BYTES:
            return ErrorCode.INVALID_REQUEST
        if coordinator_partition(transactional_id, self.partition_count) != self.partition:
            return ErrorCode.NOT_COORDINATOR
        return ErrorCode.NONE

    def describe(self, transactional_ids: Iterable[str]) -> list[TransactionDescription]:
        """DescribeTransactions: each id's state."""
        out = []
        for txn_id in transactional_ids:
            error = self.check_id(txn_id)
            meta = self.metadata(txn_id)
            if error is ErrorCode.NONE and meta is None:
                error = ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
            if error is not ErrorCode.NONE or meta is None:
                out.append(TransactionDescription(txn_id, error))
                continue
            out.append(
                TransactionDescription(
                    txn_id,
                    ErrorCode.NONE,
                    meta.state.kafka_name,
                    meta.producer_id,
                    meta.producer_epoch,
                    meta.timeout_ms,
                    meta.txn_start_ms,
                    tuple(sorted(meta.partitions)),
                )
            )
        return out

    def list_transactions(
        self,
        states_filter: Iterable[str] = (),
        producer_ids_filter: Iterable[int] = (),
        duration_filter_ms: int = -1,
        now_ms: int = 0,
    ) -> ListTransactionsResult:
        """ListTransactions. Empty filters match everything; a duration filter >= 0 keeps
        transactions open (Ongoing, Prepare*) for longer than that (KIP-994)."""
        wanted_states: set[TxnState] = set()
        unknown: list[str] = []
        for name in states_filter:
            state = TxnState.from_kafka_name(name)
            if state is None:
                unknown.append(name)
            else:
                wanted_states.add(state)
        producer_ids = set(producer_ids_filter)
        listings = []
        for txn_id in self.transactional_ids():
            meta = self._txns[txn_id]
            if wanted_states and meta.state not in wanted_states:
                continue
            if producer_ids and meta.producer_id not in producer_ids:
                continue
            if duration_filter_ms >= 0 and not (
                meta.state in _OPEN and now_ms - meta.txn_start_ms > duration_filter_ms
            ):
                continue
            listings.append(TransactionListing(txn_id, meta.producer_id, meta.state.kafka_name))
        return ListTransactionsResult(listings, unknown)

    # ---- requests ------------------------------------------------------------------

    def init_producer_id(
        self,
        transactional_id: str,
        timeout_ms: int,
        expected_producer_id: int = NO_PRODUCER_ID,
        expected_epoch: int = NO_PRODUCER_EPOCH,
        *,
        now_ms: int,
        producer_id: int | None = None,
    ) -> InitProducerIdResult | NeedProducerId:
        """InitProducerId of a transactional producer.

        A new id starts Empty at epoch 0; a known one gets its epoch bumped (a new producer
        id at epoch 0 once the epochs run out). If a transaction is open it is aborted
        first: the answer is CONCURRENT_TRANSACTIONS and the client's retry, once the
        abort completed, gets the bump. ``expected_*`` (KIP-360) is the id/epoch the
        producer had; a retry of a bump that succeeded returns the same id/epoch again.

        ``producer_id`` is a fresh id to use if one is needed (a new transactional id, or
        its epochs ran out: :meth:`needs_producer_id`); needing one without it answers
        NEED_PRODUCER_ID with nothing changed.
        """
        error = self.check_id(transactional_id)
        if error is not ErrorCode.NONE:
            return InitProducerIdResult(error)
        if not 0 < timeout_ms <= self.config.max_timeout_ms:
            return InitProducerIdResult(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
        expected: tuple[int, int] | None = None
        if expected_producer_id != NO_PRODUCER_ID or expected_epoch != NO_PRODUCER_EPOCH:
            if expected_producer_id < 0 or expected_epoch < 0:
                return InitProducerIdResult(ErrorCode.INVALID_REQUEST)
            expected = (expected_producer_id, expected_epoch)
        meta = self._txns.get(transactional_id)
        if meta is None:
            if producer_id is None:
                return NEED_PRODUCER_ID
            meta = self._txns[transactional_id] = TransactionMetadata(transactional_id)
            target = _empty(producer_id, 0, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, timeout_ms, now_ms)
            self._change(meta, target)
            return InitProducerIdResult(ErrorCode.NONE, producer_id, 0)
        if expected is not None and not _may_reinit(meta, *expected):
            return InitProducerIdResult(ErrorCode.PRODUCER_FENCED)
        if meta.state in _PREPARED:
            return InitProducerIdResult(ErrorCode.CONCURRENT_TRANSACTIONS)
        if meta.state is TxnState.ONGOING:
            self._change(meta, _fence_target(meta, now_ms))
            return InitProducerIdResult(ErrorCode.CONCURRENT_TRANSACTIONS)
        assert meta.state in _IDLE, meta.state
        if is_epoch_exhausted(meta.producer_epoch) and (
            expected is None or expected[1] == meta.producer_epoch
        ):
            # rotate: a new producer id; a KIP-360 client may retry with the old one
            if producer_id is None:
                return NEED_PRODUCER_ID
            epoch = 0
            last_epoch = meta.producer_epoch if expected is not None else NO_PRODUCER_EPOCH
        elif expected is None:
            producer_id, epoch, last_epoch = meta.producer_id, meta.producer_epoch + 1, -1
        elif meta.producer_epoch == NO_PRODUCER_EPOCH or expected[1] == meta.producer_epoch:
            producer_id, epoch = meta.producer_id, meta.producer_epoch + 1
            last_epoch = meta.producer_epoch
        elif expected[1] == meta.last_producer_epoch:
            # the retry of a bump whose answer was lost: the same id and epoch again
            producer_id, epoch, last_epoch = meta.producer_id, meta.producer_epoch, expected[1]
        else:
            return InitProducerIdResult(ErrorCode.PRODUCER_FENCED)
        target = _empty(producer_id, epoch, last_epoch, meta.producer_id, timeout_ms, now_ms)
        self._change(meta, target)
        return InitProducerIdResult(ErrorCode.NONE, producer_id, epoch)

    def needs_producer_id(self, transactional_id: str) -> bool:
        """May InitProducerId of this id need a fresh producer id (new id, epochs spent)?"""
        meta = self._txns.get(transactional_id)
        return meta is None or is_epoch_exhausted(meta.producer_epoch)

    def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
        now_ms: int,
        verify_only: bool = False,
    ) -> ErrorCode | dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn. With ``verify_only`` (KIP-890 part 1, v4+ from a broker),
        a per-partition answer of whether it is already in the transaction, no change."""
        if verify_only:
            return self.verify_partitions(transactional_id, producer_id, producer_epoch, partitions)
        wanted = frozenset(partitions)
        found = self._check_producer(transactional_id, producer_id, producer_epoch)
        if isinstance(found, ErrorCode):
            return found
        meta = found
        if meta.state in _PREPARED:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if wanted <= meta.partitions or not wanted:
            return ErrorCode.NONE  # already in (or nothing asked): no record
        ongoing = meta.state is TxnState.ONGOING
        target = replace(
            meta.value(),
            state=TxnState.ONGOING,
            partitions=tuple(sorted(meta.partitions | wanted)),
            txn_start_ms=meta.txn_start_ms if ongoing else now_ms,
            last_update_ms=now_ms,
        )
        self._change(meta, target)
        return ErrorCode.NONE

    def verify_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        """For each partition: NONE if the producer's ongoing transaction contains it.

        A partition outside the transaction answers INVALID_TXN_STATE (Kafka's older
        versions; newer ones say TRANSACTION_ABORTABLE: the door may map it).
        """
        partitions = list(partitions)
        found = self._check_producer(transactional_id, producer_id, producer_epoch)
        if isinstance(found, ErrorCode):
            return dict.fromkeys(partitions, found)
        if found.state in _PREPARED:
            return dict.fromkeys(partitions, ErrorCode.CONCURRENT_TRANSACTIONS)
        ongoing = found.state is TxnState.ONGOING
        return {
            tp: ErrorCode.NONE
            if ongoing and tp in found.partitions
            else ErrorCode.INVALID_TXN_STATE
            for tp in partitions
        }

    def add_offsets(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        group_id: str,
        offsets_partition: int,
        now_ms: int,
    ) -> ErrorCode:
        """AddOffsetsToTxn: the group's ``__consumer_offsets`` partition joins the transaction
        (``offsets_partition`` is the group coordinator's partition for ``group_id``)."""
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        result = self.add_partitions(
            transactional_id,
            producer_id,
            producer_epoch,
            [(OFFSETS_TOPIC, offsets_partition)],
            now_ms,
        )
        assert not isinstance(result, dict)
        return result

    def end_txn(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        now_ms: int,
    ) -> ErrorCode:
        """EndTxn: Ongoing -> PrepareCommit/PrepareAbort. The client is answered once that is
        durable; the markers follow (their job is an effect of the change).

        A retry after the markers are done answers NONE; one while they are being written
        answers CONCURRENT_TRANSACTIONS (Kafka's rule: the client retries); the other
        outcome, or nothing to end, is INVALID_TXN_STATE.
        """
        found = self._check_producer(transactional_id, producer_id, producer_epoch)
        if isinstance(found, ErrorCode):
            return found
        meta = found
        state = meta.state
        if state is TxnState.ONGOING:
            target = replace(
                meta.value(),
                state=TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT,
                last_update_ms=now_ms,
            )
            self._change(meta, target)
            return ErrorCode.NONE
        same_outcome = commit == (state in (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT))
        if state in _COMPLETED and same_outcome:
            return ErrorCode.NONE
        if state in _PREPARED and same_outcome:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        return ErrorCode.INVALID_TXN_STATE

    # ---- the shard's reports -------------------------------------------------------

    def markers_written(self, job: MarkerJob, now_ms: int) -> bool:
        """Every partition of ``job`` has its marker: write the Complete* record (True).

        Applies only to the transaction the job was for: the id must be in a Prepare*
        state with the job's producer id, epoch and job id. Anything else is a stale
        report (a duplicate, a delayed copy, a job of an earlier transaction): False,
        nothing changes.
        """
        meta = self._txns.get(job.transactional_id)
        if (
            meta is None
            or meta.state not in _PREPARED
            or meta.producer_id != job.producer_id
            or meta.producer_epoch != job.producer_epoch
            or job.job_id != meta.marker_job_id
        ):
            return False
        done = (
            TxnState.COMPLETE_COMMIT
            if meta.state is TxnState.PREPARE_COMMIT
            else TxnState.COMPLETE_ABORT
        )
        self._change(meta, replace(meta.value(), state=done, partitions=(), last_update_ms=now_ms))
        return True

    # ---- loading -------------------------------------------------------------------

    def replay(self, key: bytes, value: bytes | None) -> None:
        """Apply one record of the partition (oldest first) while loading; raises
        TxnRecordError for a record that cannot be read, leaving the state unchanged."""
        txn_id = decode_key(key)
        if value is None:
            self._txns.pop(txn_id, None)
            return
        decoded = decode_value(value)
        if decoded.state is TxnState.DEAD:
            self._txns.pop(txn_id, None)
            return
        if decoded.state is TxnState.PREPARE_EPOCH_FENCE:
            raise TxnRecordError(f"{txn_id!r}: PrepareEpochFence is never written")
        meta = TransactionMetadata(txn_id)
        meta.apply(decoded)
        self._txns[txn_id] = meta

    def load_complete(self, now_ms: int, coordinator_epoch: int | None = None) -> None:
        """Loading is over: finish what the log says was decided. Transactions found in
        Prepare* get new marker jobs (effects); Ongoing ones are left to their timeout,
        which the first tick, one interval from now, looks at."""
        if coordinator_epoch is not None:
            self.coordinator_epoch = coordinator_epoch
        for txn_id in self.transactional_ids():
            meta = self._txns[txn_id]
            if meta.state in _PREPARED:
                self._effects.append(self._new_job(meta))
        self._next_check_ms = now_ms + self.config.abort_check_interval_ms

    # ---- internals -----------------------------------------------------------------

    def _check_producer(
        self, transactional_id: str, producer_id: int, producer_epoch: int
    ) -> TransactionMetadata | ErrorCode:
        """Kafka's order of checks for requests of a producer that already has its id."""
        error = self.check_id(transactional_id)
        if error is not ErrorCode.NONE:
            return error
        meta = self._txns.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if meta.producer_epoch != producer_epoch:
            # the door answers INVALID_PRODUCER_EPOCH to versions that predate PRODUCER_FENCED
            return ErrorCode.PRODUCER_FENCED
        return meta

    def _change(self, meta: TransactionMetadata, target: TxnStateValue | None) -> None:
        """The id takes ``target`` (None: it is removed) and its record joins the outbox;
        entering Prepare* starts a marker job, under a new job id."""
        self._records.append(state_record(meta.transactional_id, target))
        if target is None:
            del self._txns[meta.transactional_id]
            return
        meta.apply(target)
        if meta.state in _PREPARED:
            self._effects.append(self._new_job(meta))
        else:
            meta.marker_job_id = None

    def _new_job(self, meta: TransactionMetadata) -> MarkerJob:
        meta.marker_job_id = self._next_job_id
        self._next_job_id += 1
        return MarkerJob(
            meta.transactional_id,
            meta.producer_id,
            meta.producer_epoch,
            self.coordinator_epoch,
            meta.state is TxnState.PREPARE_COMMIT,
            tuple(sorted(meta.partitions)),
            meta.marker_job_id,
        )

    # the brief's name; bound last so the builtin stays usable in the class body above
    list = list_transactions


def _empty(
    producer_id: int,
    epoch: int,
    last_epoch: int,
    previous_producer_id: int,
    timeout_ms: int,
    now_ms: int,
) -> TxnStateValue:
    return TxnStateValue(
        producer_id=producer_id,
        producer_epoch=epoch,
        timeout_ms=timeout_ms,
        state=TxnState.EMPTY,
        last_update_ms=now_ms,
        previous_producer_id=previous_producer_id,
        last_producer_epoch=last_epoch,
    )


def _may_reinit(meta: TransactionMetadata, producer_id: int, epoch: int) -> bool:
    """KIP-360: may a producer that had ``producer_id``/``epoch`` re-initialise this id?

    Yes if the id was never handed out, if it is the current producer id (its epoch is
    checked later), or if it is the previous one and its epochs had run out: the retry
    of a rotation whose answer was lost.
    """
    return (
        meta.producer_epoch == NO_PRODUCER_EPOCH
        or producer_id == meta.producer_id
        or (producer_id == meta.previous_producer_id and is_epoch_exhausted(epoch))
    )


def _fence_target(meta: TransactionMetadata, now_ms: int) -> TxnStateValue:
    """Abort the open transaction under a bumped epoch: the old producer is fenced."""
    epoch = meta.producer_epoch
    if epoch < MAX_EPOCH:
        epoch += 1
    return replace(
        meta.value(),
        state=TxnState.PREPARE_ABORT,
        producer_epoch=epoch,
        last_producer_epoch=NO_PRODUCER_EPOCH,
        last_update_ms=now_ms,
    )
