"""Kafka's transaction APIs (KIP-98): InitProducerId with a transactional id,
AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, DescribeTransactions, ListTransactions.

Each maps Kafka's request onto the transaction coordinator service
(broker/coordinator/txn_service.py), which answers NOT_COORDINATOR for ids another broker
coordinates (the client then asks FindCoordinator with key type 1 again). ACLs as
Kafka's: WRITE on the transactional id for the producer's requests (and WRITE on each
topic it adds, READ on the group whose offsets it adds), DESCRIBE on it to describe,
and ListTransactions lists only the ids the principal may describe.

Older versions do not know PRODUCER_FENCED (KIP-588): they get INVALID_PRODUCER_EPOCH,
as from Kafka.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from logmq.errors import ErrorCode, LogMQError
from logmq.kafka.messages import NO_THROTTLE, build, kio_code, response_module, throttle_time
from logmq.net.codec import Request
from logmq.net.reply import Reply
from logmq.security.acl import AclOperation as Op
from logmq.security.acl import ResourceType as RT
from logmq.security.authorization import Authorization

if TYPE_CHECKING:
    from logmq.broker.coordinator.txn_service import TransactionCoordinatorService

INIT_PRODUCER_ID, ADD_PARTITIONS, ADD_OFFSETS, END_TXN, TXN_OFFSET_COMMIT = 22, 24, 25, 26, 28
# the first version of each API whose clients know PRODUCER_FENCED
_FENCED_SINCE = {INIT_PRODUCER_ID: 4, ADD_PARTITIONS: 2, ADD_OFFSETS: 2, END_TXN: 2}
_EPOCH = datetime.datetime.fromtimestamp(0, datetime.UTC)


def client_code(req: Request, code: ErrorCode) -> ErrorCode:
    """``code`` as this request's version may say it."""
    if code is ErrorCode.PRODUCER_FENCED and req.api_version < _FENCED_SINCE.get(req.api_key, 0):
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return code


class KafkaTransactionApis:
    def __init__(
        self,
        txns: TransactionCoordinatorService,
        authz: Authorization | None = None,
    ) -> None:
        self.txns = txns
        self.authz = authz

    def _describable(self, req: Request, rtype: RT, names: Iterable[str]) -> list[str]:
        authz = self.authz
        return list(names) if authz is None else authz.describable(req.context, rtype, names)

    def _allowed(self, req: Request, op: Op, rtype: RT, name: str) -> bool:
        authz = self.authz
        return authz is None or not authz.enabled or authz.allowed(req.context, op, rtype, name)

    # -- InitProducerId (called by KafkaApis for a transactional id) ---------------------
    async def init_producer_id(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        txn_id = body.transactional_id
        if not self._allowed(req, Op.WRITE, RT.TRANSACTIONAL_ID, txn_id):
            return _init_answer(m, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        timeout_ms = int(body.transaction_timeout.total_seconds() * 1000)
        try:
            result = await self.txns.init_producer_id(
                txn_id,
                timeout_ms,
                getattr(body, "producer_id", -1),
                getattr(body, "producer_epoch", -1),
            )
        except LogMQError as e:
            return _init_answer(m, client_code(req, e.code))
        if result.error is not ErrorCode.NONE:
            return _init_answer(m, client_code(req, result.error))
        return _init_answer(m, ErrorCode.NONE, result.producer_id, result.producer_epoch)

    # -- AddPartitionsToTxn --------------------------------------------------------------
    async def add_partitions_to_txn(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        if req.api_version <= 3:
            topics = body.v3_and_below_topics
            result = await self._add_partitions(
                req,
                body.v3_and_below_transactional_id,
                body.v3_and_below_producer_id,
                body.v3_and_below_producer_epoch,
                topics,
                verify_only=False,
            )
            return Reply(
                m.AddPartitionsToTxnResponse(
                    throttle_time=NO_THROTTLE,
                    results_by_topic_v3_and_below=_topic_results(m, topics, result),
                )
            )
        # v4+: batched, from brokers (KIP-890 verification): CLUSTER_ACTION
        if not self._allowed(req, Op.CLUSTER_ACTION, RT.CLUSTER, "kafka-cluster"):
            return Reply(
                m.AddPartitionsToTxnResponse(
                    throttle_time=NO_THROTTLE,
                    error_code=kio_code(ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
                    results_by_transaction=(),
                )
            )
        results = []
        for t in body.transactions:
            result = await self._add_partitions(
                req,
                t.transactional_id,
                t.producer_id,
                t.producer_epoch,
                t.topics,
                verify_only=t.verify_only,
            )
            results.append(
                m.AddPartitionsToTxnResult(
                    transactional_id=t.transactional_id,
                    topic_results=_topic_results(m, t.topics, result),
                )
            )
        return Reply(
            m.AddPartitionsToTxnResponse(
                throttle_time=NO_THROTTLE,
                error_code=kio_code(ErrorCode.NONE),
                results_by_transaction=tuple(results),
            )
        )

    async def _add_partitions(
        self,
        req: Request,
        txn_id: str,
        producer_id: int,
        epoch: int,
        topics: Iterable[Any],
        *,
        verify_only: bool,
    ) -> dict[tuple[str, int], ErrorCode]:
        """An error per partition (Kafka's rule: when some are refused by ACLs the rest
        get OPERATION_NOT_ATTEMPTED)."""
        tps = [(t.name, p) for t in topics for p in t.partitions]
        if not self._allowed(req, Op.WRITE, RT.TRANSACTIONAL_ID, txn_id):
            return dict.fromkeys(tps, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        denied = {t.name for t in topics if not self._allowed(req, Op.WRITE, RT.TOPIC, t.name)}
        image = self.txns.quorum.image
        unknown = {(t, p) for t, p in tps if t not in denied and image.partition(t, p) is None}
        if denied or unknown:
            out = dict.fromkeys(tps, ErrorCode.OPERATION_NOT_ATTEMPTED)
            for t, p in tps:
                if t in denied:
                    out[(t, p)] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                elif (t, p) in unknown:
                    out[(t, p)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            return out
        try:
            if verify_only:
                return await self.txns.verify_partitions(txn_id, producer_id, epoch, tps)
            await self.txns.add_partitions_to_txn(txn_id, producer_id, epoch, tps)
            code = ErrorCode.NONE
        except LogMQError as e:
            code = e.code
        return dict.fromkeys(tps, client_code(req, code))

    # -- AddOffsetsToTxn, EndTxn ---------------------------------------------------------
    async def add_offsets_to_txn(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        if not self._allowed(req, Op.WRITE, RT.TRANSACTIONAL_ID, body.transactional_id):
            code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        elif not self._allowed(req, Op.READ, RT.GROUP, body.group_id):
            code = ErrorCode.GROUP_AUTHORIZATION_FAILED
        else:
            try:
                await self.txns.add_offsets_to_txn(
                    body.transactional_id, body.producer_id, body.producer_epoch, body.group_id
                )
                code = ErrorCode.NONE
            except LogMQError as e:
                code = e.code
        return Reply(
            m.AddOffsetsToTxnResponse(
                throttle_time=NO_THROTTLE, error_code=kio_code(client_code(req, code))
            )
        )

    async def end_txn(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        if not self._allowed(req, Op.WRITE, RT.TRANSACTIONAL_ID, body.transactional_id):
            code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        else:
            try:
                await self.txns.end_txn(
                    body.transactional_id, body.producer_id, body.producer_epoch, body.committed
                )
                code = ErrorCode.NONE
            except LogMQError as e:
                code = e.code
        return Reply(
            build(
                m.EndTxnResponse,
                throttle_time=NO_THROTTLE,
                error_code=kio_code(client_code(req, code)),
                producer_id=-1,
                producer_epoch=-1,
            )
        )

    # -- DescribeTransactions, ListTransactions ------------------------------------------
    async def describe_transactions(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        ids = list(body.transactional_ids)
        allowed = [t for t in ids if self._allowed(req, Op.DESCRIBE, RT.TRANSACTIONAL_ID, t)]
        found = {d.transactional_id: d for d in await self.txns.describe_transactions(allowed)}
        states = []
        for txn_id in ids:
            d = found.get(txn_id)
            if d is None:
                code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            else:
                code = d.error
            if d is None or code is not ErrorCode.NONE:
                states.append(_described(m, txn_id, code))
                continue
            by_topic: dict[str, list[int]] = {}
            for topic, partition in d.partitions:
                by_topic.setdefault(topic, []).append(partition)
            # as Kafka: only the partitions of topics the principal may describe
            shown = set(self._describable(req, RT.TOPIC, by_topic))
            by_topic = {t: ps for t, ps in by_topic.items() if t in shown}
            states.append(
                m.TransactionState(
                    error_code=kio_code(ErrorCode.NONE),
                    transactional_id=txn_id,
                    transaction_state=d.state,
                    transaction_timeout=throttle_time(d.timeout_ms),  # an i32 duration
                    transaction_start_time=_time(d.txn_start_ms),
                    producer_id=d.producer_id,
                    producer_epoch=d.producer_epoch,
                    topics=tuple(
                        m.TopicData(topic=t, partitions=tuple(sorted(ps)))
                        for t, ps in sorted(by_topic.items())
                    ),
                )
            )
        return Reply(
            m.DescribeTransactionsResponse(
                throttle_time=NO_THROTTLE, transaction_states=tuple(states)
            )
        )

    async def list_transactions(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        try:
            result = await self.txns.list_transactions(
                body.state_filters,
                body.producer_id_filters,
                getattr(body, "duration_filter", -1),
            )
        except LogMQError as e:
            return Reply(
                build(
                    m.ListTransactionsResponse,
                    throttle_time=NO_THROTTLE,
                    error_code=kio_code(e.code),
                    unknown_state_filters=(),
                    transaction_states=(),
                )
            )
        shown = set(
            self._describable(
                req, RT.TRANSACTIONAL_ID, (t.transactional_id for t in result.transactions)
            )
        )
        listed = tuple(
            m.TransactionState(
                transactional_id=t.transactional_id,
                producer_id=t.producer_id,
                transaction_state=t.state,
            )
            for t in result.transactions
            if t.transactional_id in shown
        )
        return Reply(
            build(
                m.ListTransactionsResponse,
                throttle_time=NO_THROTTLE,
                error_code=kio_code(ErrorCode.NONE),
                unknown_state_filters=tuple(result.unknown_state_filters),
                transaction_states=listed,
            )
        )


def _init_answer(m: Any, code: ErrorCode, producer_id: int = -1, epoch: int = -1) -> Reply:
    return Reply(
        m.InitProducerIdResponse(
            throttle_time=NO_THROTTLE,
            error_code=kio_code(code),
            producer_id=producer_id,
            producer_epoch=epoch,
        )
    )


def _topic_results(
    m: Any, topics: Iterable[Any], result: dict[tuple[str, int], ErrorCode]
) -> tuple[Any, ...]:
    return tuple(
        m.AddPartitionsToTxnTopicResult(
            name=t.name,
            results_by_partition=tuple(
                m.AddPartitionsToTxnPartitionResult(
                    partition_index=p, partition_error_code=kio_code(result[(t.name, p)])
                )
                for p in t.partitions
            ),
        )
        for t in topics
    )


def _described(m: Any, txn_id: str, code: ErrorCode) -> Any:
    return m.TransactionState(
        error_code=kio_code(code),
        transactional_id=txn_id,
        transaction_state="",
        transaction_timeout=NO_THROTTLE,
        transaction_start_time=_EPOCH,
        producer_id=-1,
        producer_epoch=-1,
        topics=(),
    )


def _time(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(max(ms, 0) / 1000, datetime.UTC)
