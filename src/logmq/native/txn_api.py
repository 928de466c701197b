"""The native door's transaction APIs: a producer's, between brokers, and for the tools.

A transactional producer's (logmq's own clients; ACLs in native/authorization.py, as
Kafka's: WRITE on the transactional id, WRITE on each topic added, READ on the group
whose offsets are added):

* AddPartitionsToTxn (24) without ``verify_only``: ``{"transactional_id",
  "producer_id", "producer_epoch", "topics": [{"topic", "partitions": [int]}]}`` ->
  ``{"error", "message"?, "topics": [{"topic", "partitions": [{"partition",
  "error"}]}]}``. A partition of no known topic gets UNKNOWN_TOPIC_OR_PARTITION and
  the others OPERATION_NOT_ATTEMPTED (nothing is added); else every partition gets the
  coordinator's one code. ``error`` is the first code that is not
  OPERATION_NOT_ATTEMPTED (0 when all were added).
* AddOffsetsToTxn (25): ``{"transactional_id", "producer_id", "producer_epoch",
  "group_id"}`` -> ``{"error", "message"?}``.
* EndTxn (26): ``{"transactional_id", "producer_id", "producer_epoch", "committed":
  bool}`` -> ``{"error", "message"?}``. A retry of a transaction already completed
  the same way answers 0; the other outcome, or nothing to end, INVALID_TXN_STATE; a
  retry while its markers are still being written, CONCURRENT_TRANSACTIONS.

Each answers NOT_COORDINATOR (or COORDINATOR_LOAD_IN_PROGRESS) when this broker does
not coordinate the id now: the client finds the coordinator again.

Between brokers (both need CLUSTER_ACTION):

* WriteTxnMarkers (27): a coordinator's markers for partitions this broker leads
  (broker/coordinator/txn_markers.py). Request ``{"markers": [{"producer_id", "producer_epoch",
  "coordinator_epoch", "commit", "job_id"?, "topics": [{"topic", "partitions":
  [int]}]}]}`` (``job_id``: the coordinator's job, so a copy is not written twice);
  answer ``{"markers": [{"producer_id", "topics": [{"topic", "partitions":
  [{"partition", "error"}]}]}]}``.
* AddPartitionsToTxn (24) with ``verify_only`` (KIP-890 part 1): a partition leader asks
  this broker, the transaction's coordinator, whether partitions are in an ongoing
  transaction. Request ``{"transactional_id", "producer_id", "producer_epoch",
  "verify_only": true, "topics": [{"topic", "partitions": [int]}]}``; answer
  ``{"error", "topics": [{"topic", "partitions": [{"partition", "error"}]}]}``.

For ``logmq txn`` (Kafka's kafka-transactions.sh), the client reaching every broker:

* DescribeTransactions (65): ``{"transactional_ids": [str]}`` -> ``{"transactions":
  [{"transactional_id", "error", "state", "producer_id", "producer_epoch",
  "timeout_ms", "start_ms", "partitions": [{"topic", "partition"}]}]}``; NOT_COORDINATOR
  for ids another broker coordinates, TRANSACTIONAL_ID_AUTHORIZATION_FAILED for ids
  the principal may not DESCRIBE.
* ListTransactions (66): ``{"states"?, "producer_ids"?, "duration_ms"?}`` ->
  ``{"error", "unknown_state_filters", "transactions": [{"transactional_id",
  "producer_id", "state"}]}`` over the ids this broker coordinates that the principal
  may DESCRIBE.
* DescribeProducers (61): ``{"topics": [{"topic", "partitions": [int]}]}`` ->
  ``{"topics": [{"topic", "partitions": [{"partition", "error", "producers":
  [{"producer_id", "producer_epoch", "last_sequence", "last_timestamp",
  "current_txn_start_offset", "coordinator_epoch"}]}]}]}``, from the leader's producer
  state (READ on the topic, checked by the door's guard).
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from typing import TYPE_CHECKING, Any

from logmq.errors import ErrorCode, LogMQError
from logmq.native.request_fields import (
    InvalidRequestError,
    req_field,
    req_int,
    req_list,
    req_str,
)
from logmq.net.codec import Request
from logmq.net.reply import Reply
from logmq.security.acl import AclOperation as Op
from logmq.security.acl import ResourceType as RT

if TYPE_CHECKING:
    from logmq.broker.coordinator.txn_markers import MarkerWriter
    from logmq.broker.coordinator.txn_service import TransactionCoordinatorService
    from logmq.broker.replica.replica_manager import ReplicaManager
    from logmq.security.authorization import Authorization
    from logmq.storage.partition_log import PartitionLog

TopicPartition = tuple[str, int]


def _partitions(body: Any) -> list[TopicPartition]:
    out = []
    for t in req_list(body, "topics"):
        topic = req_str(t, "topic")
        for p in req_list(t, "partitions"):
            if not isinstance(p, int) or isinstance(p, bool):
                raise InvalidRequestError(f"partitions of {topic!r} must be integers")
            out.append((topic, p))
    return out


def _by_topic(codes: dict[TopicPartition, ErrorCode]) -> list[dict[str, Any]]:
    topics: dict[str, list[dict[str, int]]] = {}
    for (topic, partition), code in codes.items():
        topics.setdefault(topic, []).append({"partition": partition, "error": int(code)})
    return [{"topic": t, "partitions": ps} for t, ps in topics.items()]


def _str_list(body: Any, key: str) -> list[str]:
    values = req_list(body, key, [])
    if not all(isinstance(v, str) for v in values):
        raise InvalidRequestError(f"{key!r} must be strings")
    return values


def _int_list(body: Any, key: str) -> list[int]:
    values = req_list(body, key, [])
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise InvalidRequestError(f"{key!r} must be integers")
    return values


def producers_of(plog: PartitionLog) -> list[dict[str, Any]]:
    """The partition's producers as DescribeProducers lists them (by producer id)."""
    state = plog.producer_state
    ongoing = state.txn.ongoing
    out = []
    for pid, entry in sorted(state.producers.items()):
        out.append(
            {
                "producer_id": pid,
                "producer_epoch": entry.epoch,
                "last_sequence": entry.batches[-1].last_seq if entry.batches else -1,
                "last_timestamp": entry.last_timestamp,
                "current_txn_start_offset": ongoing.get(pid, -1),
                "coordinator_epoch": entry.coordinator_epoch,
            }
        )
    return out


class TxnApi:
    def __init__(
        self,
        writer: MarkerWriter,
        txns: TransactionCoordinatorService,
        replicas: ReplicaManager | None = None,
        authz: Authorization | None = None,
    ) -> None:
        """``replicas`` answers DescribeProducers (leader logs); ``authz`` the per-id
        DESCRIBE checks of DescribeTransactions and ListTransactions."""
        self.writer = writer
        self.txns = txns
        self.replicas = replicas
        self.authz = authz

    def _may_describe(self, req: Request, txn_id: str) -> bool:
        authz = self.authz
        if authz is None or not authz.enabled:
            return True
        return authz.allowed(req.context, Op.DESCRIBE, RT.TRANSACTIONAL_ID, txn_id)

    def _describable(self, req: Request, rtype: RT, names: Iterable[str]) -> list[str]:
        authz = self.authz
        return list(names) if authz is None else authz.describable(req.context, rtype, names)

    async def write_txn_markers(self, req: Request) -> Reply:
        out = []
        for marker in req_list(req.body, "markers"):
            producer_id = req_int(marker, "producer_id")
            outcomes = await self.writer.write(
                producer_id,
                req_int(marker, "producer_epoch"),
                req_int(marker, "coordinator_epoch"),
                req_field(marker, "commit", bool),
                _partitions(marker),
                req_field(marker, "job_id", int, None),  # logmq's coordinators name the job
            )
            codes = {tp: outcome.error for tp, outcome in outcomes.items()}
            out.append({"producer_id": producer_id, "topics": _by_topic(codes)})
        return Reply({"markers": out})

    async def add_partitions_to_txn(self, req: Request) -> Reply:
        body = req.body
        if not req_field(body, "verify_only", bool, False):
            return await self._add_partitions(body)
        tps = _partitions(body)
        try:
            codes = await self.txns.verify_partitions(
                req_str(body, "transactional_id"),
                req_int(body, "producer_id"),
                req_int(body, "producer_epoch"),
                tps,
            )
        except LogMQError as e:
            return Reply({"error": int(e.code), "message": str(e), "topics": []})
        return Reply({"error": 0, "topics": _by_topic(_complete(codes, tps))})

    # -- a transactional producer's requests ---------------------------------------------
    async def _add_partitions(self, body: Any) -> Reply:
        """A producer's AddPartitionsToTxn: all its partitions join, or none does."""
        txn_id = req_str(body, "transactional_id")
        producer_id = req_int(body, "producer_id")
        epoch = req_int(body, "producer_epoch")
        tps = list(dict.fromkeys(_partitions(body)))
        image = self.txns.quorum.image
        unknown = {tp for tp in tps if image.partition(*tp) is None}
        message = None
        if unknown:
            codes = {
                tp: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                if tp in unknown
                else ErrorCode.OPERATION_NOT_ATTEMPTED
                for tp in tps
            }
            message = f"no such partitions: {sorted(unknown)}"
        else:
            try:
                await self.txns.add_partitions_to_txn(txn_id, producer_id, epoch, tps)
                code = ErrorCode.NONE
            except LogMQError as e:
                code, message = e.code, str(e)
            codes = dict.fromkeys(tps, code)
        top = next(
            (
                c
                for c in codes.values()
                if c not in (ErrorCode.NONE, ErrorCode.OPERATION_NOT_ATTEMPTED)
            ),
            ErrorCode.NONE,
        )
        answer: dict[str, Any] = {"error": int(top), "topics": _by_topic(codes)}
        if top is not ErrorCode.NONE:
            answer["message"] = message or top.name
        return Reply(answer)

    async def add_offsets_to_txn(self, req: Request) -> Reply:
        body = req.body
        return await _code_answer(
            self.txns.add_offsets_to_txn(
                req_str(body, "transactional_id"),
                req_int(body, "producer_id"),
                req_int(body, "producer_epoch"),
                req_str(body, "group_id"),
            )
        )

    async def end_txn(self, req: Request) -> Reply:
        body = req.body
        return await _code_answer(
            self.txns.end_txn(
                req_str(body, "transactional_id"),
                req_int(body, "producer_id"),
                req_int(body, "producer_epoch"),
                req_field(body, "committed", bool),
            )
        )

    # -- the operations tools (logmq txn) -------------------------------------------------
    async def describe_transactions(self, req: Request) -> Reply:
        ids = _str_list(req.body, "transactional_ids")
        allowed = [t for t in dict.fromkeys(ids) if self._may_describe(req, t)]
        found = {d.transactional_id: d for d in await self.txns.describe_transactions(allowed)}
        out = []
        for txn_id in ids:
            d = found.get(txn_id)
            if d is None:
                out.append(
                    {
                        "transactional_id": txn_id,
                        "error": int(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
                    }
                )
                continue
            # as Kafka: only the partitions of topics the principal may describe
            shown = set(self._describable(req, RT.TOPIC, sorted({t for t, _ in d.partitions})))
            out.append(
                {
                    "transactional_id": txn_id,
                    "error": int(d.error),
                    "state": d.state,
                    "producer_id": d.producer_id,
                    "producer_epoch": d.producer_epoch,
                    "timeout_ms": d.timeout_ms,
                    "start_ms": d.txn_start_ms,
                    "partitions": [
                        {"topic": t, "partition": p} for t, p in sorted(d.partitions) if t in shown
                    ],
                }
            )
        return Reply({"transactions": out})

    async def list_transactions(self, req: Request) -> Reply:
        body = req.body
        states = _str_list(body, "states")
        pids = _int_list(body, "producer_ids")
        duration = req_int(body, "duration_ms", -1)
        try:
            result = await self.txns.list_transactions(states, pids, duration)
        except LogMQError as e:
            return Reply(
                {
                    "error": int(e.code),
                    "message": str(e),
                    "unknown_state_filters": [],
                    "transactions": [],
                }
            )
        ids = (t.transactional_id for t in result.transactions)
        shown = set(self._describable(req, RT.TRANSACTIONAL_ID, ids))
        listed = [
            {"transactional_id": t.transactional_id, "producer_id": t.producer_id, "state": t.state}
            for t in result.transactions
            if t.transactional_id in shown
        ]
        return Reply(
            {
                "error": 0,
                "unknown_state_filters": list(result.unknown_state_filters),
                "transactions": listed,
            }
        )

    async def describe_producers(self, req: Request) -> Reply:
        if self.replicas is None:
            raise LogMQError("DescribeProducers is not served here", ErrorCode.UNKNOWN_API)
        topics: dict[str, list[dict[str, Any]]] = {}
        for topic, partition in _partitions(req.body):
            entry: dict[str, Any] = {"partition": partition, "error": 0, "producers": []}
            try:
                entry["producers"] = producers_of(self.replicas.leader_log(topic, partition))
            except LogMQError as e:
                entry.update(error=int(e.code), message=str(e))
            topics.setdefault(topic, []).append(entry)
        return Reply({"topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()]})


async def _code_answer(pending: Awaitable[None]) -> Reply:
    """``{"error", "message"?}`` for a coordinator call that succeeds or raises."""
    try:
        await pending
    except LogMQError as e:
        return Reply({"error": int(e.code), "message": str(e)})
    return Reply({"error": 0})


def _complete(
    codes: dict[TopicPartition, ErrorCode], tps: Iterable[TopicPartition]
) -> dict[TopicPartition, ErrorCode]:
    return {tp: codes.get(tp, ErrorCode.INVALID_TXN_STATE) for tp in tps}
