"""Transactions for logmq's own producer (KIP-98 over the native door).

A transactional producer talks to its transactional id's coordinator (FindCoordinator
with key type 1): InitProducerId fences older producers of the id and gives this one
its producer id and epoch; AddPartitionsToTxn names each partition before its first
batch of a transaction (the broker refuses a transactional batch for a partition its
transaction does not hold); AddOffsetsToTxn and TxnOffsetCommit (to the group's
coordinator) put consumer offsets in the transaction; EndTxn commits or aborts it.

:class:`TransactionManager` keeps the producer's side of that: the state (no
transaction, one open, committing, prepared, failed), the partitions added, and the
requests with their retries. Coordinator errors that mean "ask again"
(NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE,
CONCURRENT_TRANSACTIONS, a lost connection) are retried with a fresh coordinator
lookup until the request timeout; PRODUCER_FENCED, INVALID_PRODUCER_EPOCH and
TRANSACTIONAL_ID_AUTHORIZATION_FAILED are fatal: the producer can never end a
transaction again. A batch that fails inside a transaction makes the transaction
abortable only (commit raises, abort works), as in Kafka's clients.

:func:`complete_transaction` ends a transaction from any client that knows its
identity ``(transactional_id, producer_id, producer_epoch)``: the two-phase shape of a
sink whose tasks write and flush (``AsyncProducer.prepare_transaction``) while a driver
decides later whether the whole batch commits.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterable, Mapping
from typing import Any

from logmq.client.cluster import ClusterClient, TopicPartition
from logmq.client.group_offsets import (
    OffsetAndMetadata,
    OffsetsArg,
    normalize_offsets,
    partition_entry,
)
from logmq.errors import (
    ConnectionError_,
    ErrorCode,
    LogMQError,
    ProducerFencedError,
    RequestTimedOutError,
    TransactionalIdAuthorizationError,
    TransactionStateError,
    error_for,
)
from logmq.net.codec import ApiKey

# answers that mean "the same request again, maybe to another coordinator"
RETRIABLE = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.CONCURRENT_TRANSACTIONS,
    }
)
_MOVED = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})
FENCED = frozenset({ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH})
FATAL = FENCED | {
    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    ErrorCode.INVALID_PRODUCER_ID_MAPPING,
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
}
MAX_BACKOFF_S = 1.0

TransactionIdentity = tuple[str, int, int]  # (transactional_id, producer_id, producer_epoch)


def _code(value: Any) -> ErrorCode:
    try:
        return ErrorCode(value or 0)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR


def txn_error(code: ErrorCode, message: str) -> LogMQError:
    """The exception for a transaction API's error code: the fatal ones get their own
    classes (ProducerFencedError keeps the broker's code in ``.code``)."""
    if code in FENCED:
        return ProducerFencedError(message or code.name, code)
    if code is ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        return TransactionalIdAuthorizationError(message or code.name)
    if code is ErrorCode.INVALID_TXN_STATE:
        return TransactionStateError(message or code.name)
    return error_for(code, message or code.name)


class TxnCoordinator:
    """Requests to one transactional id's coordinator, found (and found again when it
    moves) with FindCoordinator key type 1."""

    def __init__(self, cluster: ClusterClient, transactional_id: str) -> None:
        self.cluster = cluster
        self.transactional_id = transactional_id
        self.node: int | None = None

    async def find(self) -> int:
        if self.node is not None:
            return self.node
        txn_id = self.transactional_id
        resp = await self.cluster.request_any(
            ApiKey.FIND_COORDINATOR, {"key_type": 1, "keys": [txn_id]}
        )
        top = _code(resp.body.get("error", 0))
        if top is not ErrorCode.NONE:  # the whole request refused (ACLs, say)
            raise txn_error(top, resp.body.get("message") or f"FindCoordinator {txn_id!r}")
        for entry in resp.body.get("coordinators") or ():
            if entry.get("key") != txn_id:
                continue
            code = _code(entry.get("error", 0))
            if code is not ErrorCode.NONE:
                raise txn_error(code, entry.get("message") or f"FindCoordinator {txn_id!r}")
            node = int(entry["node_id"])
            if node not in self.cluster.metadata.brokers:
                await self.cluster.refresh_metadata()
            self.node = node
            return node
        raise error_for(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"no coordinator for {txn_id!r}")

    async def request(
        self, api_key: int, body: dict[str, Any], *, timeout: float | None = None
    ) -> dict[str, Any]:
        """``body`` to the coordinator, retried on RETRIABLE answers and lost
        connections (looking the coordinator up again) until ``timeout``; any other
        answer's body is returned as it is (its ``error`` may be set: an answer that
        is only ``{"error", "message"}`` comes back as such, not raised)."""
        cluster = self.cluster
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (cluster.request_timeout if timeout is None else timeout)
        attempt = 0
        while True:
            try:
                node = await self.find()
                left = max(0.001, deadline - loop.time())
                try:
                    answer = (await cluster.request_node(node, api_key, body, timeout=left)).body
                except (ConnectionError_, RequestTimedOutError):
                    raise
                except LogMQError as e:  # the broker's answer was only an error
                    answer = {"error": int(e.code), "message": str(e)}
                code = _code(answer.get("error", 0))
                if code not in RETRIABLE:
                    return answer
                err: LogMQError = error_for(code, answer.get("message") or code.name)
            except (ConnectionError_, RequestTimedOutError) as e:
                err = e
                self.node = None
            except LogMQError as e:
                if e.code not in RETRIABLE:
                    raise
                err = e
            if err.code in _MOVED:
                self.node = None
            attempt += 1
            delay = min(MAX_BACKOFF_S, cluster._backoff() * (1 << min(attempt - 1, 4)))
            if loop.time() + delay >= deadline:
                raise RequestTimedOutError(
                    f"{ApiKey(api_key).name} for transactional id "
                    f"{self.transactional_id!r} failed: {err}"
                ) from None
            await asyncio.sleep(delay)


async def init_producer_id(
    coordinator: TxnCoordinator,
    timeout_ms: int,
    producer_id: int = -1,
    producer_epoch: int = -1,
) -> tuple[int, int]:
    """InitProducerId of a transactional id: ``(producer_id, producer_epoch)``. With
    the current id and epoch (KIP-360) the coordinator bumps the epoch of this producer
    instead of fencing it (after an aborted transaction with a sequence gap)."""
    answer = await coordinator.request(
        ApiKey.INIT_PRODUCER_ID,
        {
            "transactional_id": coordinator.transactional_id,
            "transaction_timeout_ms": timeout_ms,
            "producer_id": producer_id,
            "producer_epoch": producer_epoch,
        },
    )
    code = _code(answer.get("error", 0))
    if code is not ErrorCode.NONE:
        raise txn_error(code, answer.get("message") or "InitProducerId failed")
    return int(answer["producer_id"]), int(answer["producer_epoch"])


async def end_txn(
    coordinator: TxnCoordinator, producer_id: int, producer_epoch: int, commit: bool
) -> ErrorCode:
    """EndTxn, retried while retriable: the coordinator's final code."""
    answer = await coordinator.request(
        ApiKey.END_TXN,
        {
            "transactional_id": coordinator.transactional_id,
            "producer_id": producer_id,
            "producer_epoch": producer_epoch,
            "committed": commit,
        },
    )
    return _code(answer.get("error", 0))


async def complete_transaction(
    cluster: ClusterClient,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
) -> None:
    """Commit (or abort) the transaction ``(transactional_id, producer_id,
    producer_epoch)`` from any client: the second phase after
    ``AsyncProducer.prepare_transaction``.

    Idempotent: the coordinator answers an EndTxn for a transaction already completed
    the same way with NONE (and CONCURRENT_TRANSACTIONS, retried here, while its
    markers are still being written), so a driver may call this again after a failure.
    It answers INVALID_TXN_STATE when the transaction ended the other way, which raises
    TransactionStateError, except when the id is still Empty with this producer id and
    epoch (the producer wrote nothing and added no offsets): nothing to end, success.
    A newer epoch (another producer initialized the id, or the coordinator aborted the
    transaction on its timeout) raises ProducerFencedError.
    """
    coordinator = TxnCoordinator(cluster, transactional_id)
    code = await end_txn(coordinator, producer_id, producer_epoch, commit)
    if code is ErrorCode.NONE:
        return
    if code is ErrorCode.INVALID_TXN_STATE and await _never_began(
        cluster, transactional_id, producer_id, producer_epoch
    ):
        return
    what = "commit" if commit else "abort"
    raise txn_error(
        code,
        f"cannot {what} the transaction of {transactional_id!r} (producer {producer_id}, "
        f"epoch {producer_epoch}): {code.name}",
    )


async def _never_began(
    cluster: ClusterClient, transactional_id: str, producer_id: int, producer_epoch: int
) -> bool:
    from logmq.client.txn_admin import describe_transactions

    try:
        (d,) = await describe_transactions(cluster, [transactional_id])
    except LogMQError:
        return False
    return d.state == "Empty" and (d.producer_id, d.producer_epoch) == (
        producer_id,
        producer_epoch,
    )


class TxnState(enum.Enum):
    UNINITIALIZED = "uninitialized"  # init_transactions() not called yet
    READY = "ready"  # no transaction open
    IN_TRANSACTION = "in_transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    PREPARED = "prepared"  # flushed by prepare_transaction(); someone else may end it
    ABORTABLE = "abortable"  # a batch or request failed: only abort_transaction() works
    FATAL = "fatal"  # fenced or not authorized: nothing works any more


class TransactionManager:
    """A transactional producer's transaction state and coordinator requests.

    The sender asks :meth:`needs_adding` per partition before it sends a batch and
    :meth:`add_partitions` for those that do (one request at a time, batched); the
    producer's public methods drive the rest.
    """

    def __init__(
        self, cluster: ClusterClient, transactional_id: str, transaction_timeout_ms: int
    ) -> None:
        if not transactional_id:
            raise ValueError("transactional_id must be a non-empty string")
        self.transactional_id = transactional_id
        self.timeout_ms = transaction_timeout_ms
        self.cluster = cluster
        self.coordinator = TxnCoordinator(cluster, transactional_id)
        self.state = TxnState.UNINITIALIZED
        self.producer_id = -1
        self.producer_epoch = -1
        self.added: set[TopicPartition] = set()  # in the current transaction
        self.groups_added: set[str] = set()  # AddOffsetsToTxn done in this transaction
        self.error: LogMQError | None = None  # why the state is ABORTABLE or FATAL

    # -- state ----------------------------------------------------------------------
    @property
    def sending_allowed(self) -> bool:
        return self.state is TxnState.IN_TRANSACTION

    def check_send(self) -> None:
        """Raise unless records may be sent now (inside begin ... commit/abort)."""
        if self.state is TxnState.IN_TRANSACTION:
            return
        if self.state is TxnState.FATAL and self.error is not None:
            raise self.error
        if self.state is TxnState.ABORTABLE:
            raise TransactionStateError(
                f"the transaction failed ({self.error}): abort_transaction() first"
            )
        raise TransactionStateError(
            f"send outside a transaction (state {self.state.value}): call begin_transaction() first"
        )

    def _require(self, *states: TxnState, what: str) -> None:
        if self.state is TxnState.FATAL and self.error is not None:
            raise self.error
        if self.state not in states:
            raise TransactionStateError(
                f"{what} in state {self.state.value} (needs {'/'.join(s.value for s in states)})"
            )

    def fail(self, err: BaseException) -> None:
        """A batch or request of the transaction failed: fatal errors end the producer,
        others only the transaction."""
        code = getattr(err, "code", None)
        if code in FATAL:
            if self.state is not TxnState.FATAL:
                self.error = txn_error(code, str(err))
                self.state = TxnState.FATAL
            return
        if self.state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING, TxnState.PREPARED):
            self.error = err if isinstance(err, LogMQError) else LogMQError(str(err))
            self.state = TxnState.ABORTABLE

    def _fatal(self, err: LogMQError) -> LogMQError:
        if err.code in FATAL:
            self.fail(err)
            assert self.error is not None
            return self.error
        return err

    @property
    def identity(self) -> TransactionIdentity:
        return (self.transactional_id, self.producer_id, self.producer_epoch)

    # -- lifecycle ------------------------------------------------------------------
    async def init(self) -> tuple[int, int]:
        """InitProducerId: fences older producers of the id (aborting what they left
        open). Returns the new ``(producer_id, producer_epoch)``."""
        self._require(TxnState.UNINITIALIZED, TxnState.READY, what="init_transactions()")
        try:
            pid, epoch = await init_producer_id(self.coordinator, self.timeout_ms)
        except LogMQError as e:
            raise self._fatal(e) from None
        self.producer_id, self.producer_epoch = pid, epoch
        self.state = TxnState.READY
        return pid, epoch

    async def bump_epoch(self) -> tuple[int, int]:
        """KIP-360: after an abort that left a sequence gap, a new epoch for this same
        producer (the coordinator checks the current id and epoch, fencing nobody)."""
        try:
            pid, epoch = await init_producer_id(
                self.coordinator, self.timeout_ms, self.producer_id, self.producer_epoch
            )
        except LogMQError as e:
            raise self._fatal(e) from None
        self.producer_id, self.producer_epoch = pid, epoch
        return pid, epoch

    def begin(self) -> None:
        """A prepared transaction counts as ended: whoever holds its identity must end
        it with complete_transaction() before records of the next one are sent."""
        self._require(TxnState.READY, TxnState.PREPARED, what="begin_transaction()")
        self.added.clear()
        self.groups_added.clear()
        self.error = None
        self.state = TxnState.IN_TRANSACTION

    @property
    def has_work(self) -> bool:
        """Whether the coordinator knows of this transaction (EndTxn is owed)."""
        return bool(self.added or self.groups_added)

    # -- partitions -----------------------------------------------------------------
    def needs_adding(self, tp: TopicPartition) -> bool:
        return tp not in self.added

    async def add_partitions(
        self, tps: Iterable[TopicPartition]
    ) -> dict[TopicPartition, LogMQError]:
        """AddPartitionsToTxn for ``tps``: the partitions that could not be added, with
        why (every one of them when the transaction is failed or not open)."""
        todo = sorted(set(tps) - self.added)
        if not todo:
            return {}
        if self.state not in (TxnState.IN_TRANSACTION, TxnState.COMMITTING, TxnState.PREPARED):
            err = self.error or TransactionStateError(
                f"no open transaction to add partitions to (state {self.state.value})"
            )
            return dict.fromkeys(todo, err)
        by_topic: dict[str, list[int]] = {}
        for topic, partition in todo:
            by_topic.setdefault(topic, []).append(partition)
        body = {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
        }
        try:
            answer = await self.coordinator.request(ApiKey.ADD_PARTITIONS_TO_TXN, body)
        except LogMQError as e:
            err = self._fatal(e)
            self.fail(err)
            return dict.fromkeys(todo, err)
        top = _code(answer.get("error", 0))
        failed: dict[TopicPartition, LogMQError] = {}
        for t in answer.get("topics") or ():
            for p in t.get("partitions") or ():
                code = _code(p.get("error", 0))
                tp = (t.get("topic"), p.get("partition"))
                if code is ErrorCode.NONE:
                    self.added.add(tp)
                elif tp in todo:
                    message = answer.get("message") or code.name
                    failed[tp] = txn_error(code, f"AddPartitionsToTxn {tp[0]}-{tp[1]}: {message}")
        for tp in todo:
            if tp not in self.added and tp not in failed:
                failed[tp] = txn_error(
                    top if top is not ErrorCode.NONE else ErrorCode.UNKNOWN_SERVER_ERROR,
                    answer.get("message") or f"AddPartitionsToTxn {tp[0]}-{tp[1]}",
                )
        if failed:
            first = next(iter(failed.values()))
            self.fail(self._fatal(first))
        return failed

    # -- offsets --------------------------------------------------------------------
    async def send_offsets(self, offsets: OffsetsArg, group_id: str) -> None:
        """AddOffsetsToTxn (once per group and transaction), then TxnOffsetCommit to the
        group's coordinator: the offsets commit or vanish with the transaction. Each
        value is an offset, ``(offset, metadata)`` or an OffsetAndMetadata (whose
        leader epoch is committed with it)."""
        self._require(TxnState.IN_TRANSACTION, what="send_offsets_to_transaction()")
        entries = normalize_offsets(offsets)
        try:
            if group_id not in self.groups_added:
                answer = await self.coordinator.request(
                    ApiKey.ADD_OFFSETS_TO_TXN,
                    {
                        "transactional_id": self.transactional_id,
                        "producer_id": self.producer_id,
                        "producer_epoch": self.producer_epoch,
                        "group_id": group_id,
                    },
                )
                code = _code(answer.get("error", 0))
                if code is not ErrorCode.NONE:
                    raise txn_error(code, answer.get("message") or "AddOffsetsToTxn failed")
                self.groups_added.add(group_id)
            await self._txn_offset_commit(entries, group_id)
        except LogMQError as e:
            err = self._fatal(e)
            self.fail(err)
            raise err from None

    async def _txn_offset_commit(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata], group_id: str
    ) -> None:
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), entry in offsets.items():
            by_topic.setdefault(topic, []).append(partition_entry(partition, entry))
        body = {
            "transactional_id": self.transactional_id,
            "group_id": group_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "generation_id": -1,
            "member_id": "",
            "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
        }
        cluster = self.cluster
        loop = asyncio.get_running_loop()
        deadline = loop.time() + cluster.request_timeout
        while True:
            resp = await cluster.group_request(group_id, ApiKey.TXN_OFFSET_COMMIT, body)
            codes = {
                (t.get("topic"), p.get("partition")): _code(p.get("error", 0))
                for t in resp.body.get("topics") or ()
                for p in t.get("partitions") or ()
            }
            bad = {tp: c for tp, c in codes.items() if c is not ErrorCode.NONE}
            top = _code(resp.body.get("error", 0))
            if top is ErrorCode.NONE and not bad:
                return
            code = top if top is not ErrorCode.NONE else next(iter(bad.values()))
            message = resp.body.get("message") or f"TxnOffsetCommit {sorted(bad)}: {code.name}"
            if not code.retriable or loop.time() + cluster.retry_backoff >= deadline:
                raise txn_error(code, message)
            await asyncio.sleep(cluster._backoff())

    # -- ending -----------------------------------------------------------------------
    async def end(self, commit: bool) -> None:
        """EndTxn for the current transaction (skipped when nothing joined it)."""
        if self.has_work:
            try:
                code = await end_txn(
                    self.coordinator, self.producer_id, self.producer_epoch, commit
                )
            except LogMQError as e:
                raise self._fatal(e) from None
            if code is not ErrorCode.NONE:
                err = txn_error(code, f"EndTxn({'commit' if commit else 'abort'}): {code.name}")
                raise self._fatal(err)
        self.added.clear()
        self.groups_added.clear()
        self.error = None
        self.state = TxnState.READY
