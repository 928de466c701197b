"""KIP-890 part 1: a partition leader checks that a transactional produce belongs to an
ongoing transaction before appending it.

Without the check, a producer's late batch (retried after its transaction was aborted,
or sent after a timeout aborted it) would open a transaction on the partition that no
coordinator will ever end: a hanging transaction, which holds the partition's LSO, and
every read_committed consumer, back for good. So the first transactional batch of a
producer on a partition is verified with the transaction's coordinator (AddPartitionsToTxn
with verify_only); later batches of the same transaction are not, since the partition's
own state shows the transaction open (Kafka's verification guard does the same).

Between the answer and the append the request may wait (other partitions' checks, the
produce path's ordering), and the transaction may end meanwhile: its marker written
here, the batch would then open a transaction no coordinator knows of. So each check
takes a guard (``ProducerStateManager.start_verification``) before it asks, a marker of
the producer drops it, and the append, in the same step as its write, goes ahead only
if the transaction is open here or the guard it took is still the producer's
(``append_guard``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from logmq.broker.replica.produce_path import ProduceResult
from logmq.errors import OK, ErrorCode, LogMQError, Outcome
from logmq.net.codec import ApiKey
from logmq.security.acl import AclOperation as Op
from logmq.security.acl import ResourceType as RT
from logmq.storage import batch as b

if TYPE_CHECKING:
    from logmq.broker.coordinator.peers import BrokerClients
    from logmq.broker.coordinator.txn_service import TransactionCoordinatorService
    from logmq.net.pipeline import ConnectionContext
    from logmq.security.authorization import Authorization
    from logmq.storage.partition_log import PartitionLog

TopicPartition = tuple[str, int]
# partition -> (its log, producer id, epoch, the guard its verification took)
Guards = dict[TopicPartition, tuple["PartitionLog", int, int, object]]


def append_guard(guards: Guards) -> Callable[[str, int], None]:
    """The check a produce path runs right before each append (no await in between):
    LogMQError(INVALID_TXN_STATE) when the producer's transaction ended on the partition
    after its verification began."""

    def check(topic: str, partition: int) -> None:
        g = guards.get((topic, partition))
        if g is None:
            return
        plog, producer_id, epoch, token = g
        if not plog.producer_state.verified(producer_id, epoch, token):
            raise LogMQError(
                f"the transaction of producer {producer_id} (epoch {epoch}) on "
                f"{topic}-{partition} ended after this produce was verified",
                ErrorCode.INVALID_TXN_STATE,
            )

    return check


class TxnVerifier:
    def __init__(
        self,
        node_id: int,
        txns: TransactionCoordinatorService,
        clients: BrokerClients,
        local_log: Callable[[str, int], PartitionLog | None],
    ) -> None:
        self.node_id = node_id
        self.txns = txns
        self.clients = clients
        self.local_log = local_log

    def open_here(self, tp: TopicPartition, producer_id: int, epoch: int) -> bool:
        """Does the partition already hold this producer's open transaction (this epoch)?"""
        plog = self.local_log(*tp)
        if plog is None:
            return False
        txn = plog.producer_state.txn
        return producer_id in txn.ongoing and txn.epochs.get(producer_id) == epoch

    async def verify(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        tps: list[TopicPartition],
        guards: Guards | None = None,
    ) -> dict[TopicPartition, Outcome]:
        """Per partition: OK if the transaction holds it (or it holds the transaction
        already), else why not: INVALID_TXN_STATE when the coordinator does not list it,
        a coordinator error (retriable) when it could not be asked. ``guards`` gets the
        guard taken on each partition led here, for ``append_guard``."""
        if guards is not None:
            for tp in tps:
                plog = self.local_log(*tp)
                if plog is not None:
                    token = plog.producer_state.start_verification(producer_id)
                    guards[tp] = (plog, producer_id, epoch, token)
        out = {tp: OK for tp in tps if self.open_here(tp, producer_id, epoch)}
        ask = [tp for tp in tps if tp not in out]
        if not ask:
            return out
        try:
            node, _, _ = self.txns.coordinator_for(transactional_id)
            if node == self.node_id:
                found = await self.txns.verify_partitions(transactional_id, producer_id, epoch, ask)
            else:
                found = await self._remote(node, transactional_id, producer_id, epoch, ask)
        except LogMQError as e:
            code = e.code
            if code in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS):
                code = ErrorCode.NOT_ENOUGH_REPLICAS  # retriable to a producer, as Kafka maps it
            failed = Outcome(code, f"the transaction coordinator could not verify: {e}")
            out.update(dict.fromkeys(ask, failed))
            return out
        for tp in ask:
            code = found.get(tp, ErrorCode.INVALID_TXN_STATE)
            out[tp] = OK if code is ErrorCode.NONE else Outcome(code)
        return out

    async def _remote(
        self, node: int, txn_id: str, producer_id: int, epoch: int, tps: list[TopicPartition]
    ) -> dict[TopicPartition, ErrorCode]:
        body = verify_body(txn_id, producer_id, epoch, tps)
        answer = await self.clients.call(node, ApiKey.ADD_PARTITIONS_TO_TXN, body)
        return parse_verify_answer(answer, tps)


class TransactionalProduceCheck:
    """What a produce with a transactional id must pass before its append, on either
    door: WRITE on the id (ACLs), transactional batches only, and each partition in the
    producer's ongoing transaction (KIP-890 part 1), as Kafka's ReplicaManager checks."""

    def __init__(self, verifier: TxnVerifier, authz: Authorization | None = None) -> None:
        self.verifier = verifier
        self.authz = authz

    async def check(
        self,
        context: ConnectionContext | None,
        txn_id: str,
        entries: list[tuple[str, int, Any]],
        guards: Guards | None = None,
    ) -> dict[TopicPartition, ProduceResult]:
        """The partitions of the produce that may not be appended, and their answers. ``guards``
        gets the verifications' guards: pass ``append_guard(guards)`` to the produce
        path, so a transaction that ends before the append is not reopened."""
        if not entries:
            return {}
        authz = self.authz
        if (
            authz is not None
            and authz.enabled
            and not authz.allowed(context, Op.WRITE, RT.TRANSACTIONAL_ID, txn_id)
        ):
            error = ProduceResult(
                ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                f"not authorized to WRITE transactional id {txn_id!r}",
            )
            return {(t, p): error for t, p, _ in entries}
        refused: dict[TopicPartition, ProduceResult] = {}
        producers: dict[tuple[int, int], list[TopicPartition]] = {}
        for topic, partition, records in entries:
            if len(records) < b.HEADER_SIZE:
                continue  # the append refuses it, with the reason
            h = b.read_header(records, 0)
            if not h.attributes & b.ATTR_TRANSACTIONAL or h.producer_id < 0:
                refused[(topic, partition)] = ProduceResult(
                    ErrorCode.INVALID_RECORD,
                    "a transactional producer's batches must be transactional",
                )
                continue
            producers.setdefault((h.producer_id, h.producer_epoch), []).append((topic, partition))
        for (producer_id, epoch), tps in producers.items():
            verified = await self.verifier.verify(txn_id, producer_id, epoch, tps, guards)
            for tp, outcome in verified.items():
                if not outcome.ok:
                    refused[tp] = ProduceResult(
                        outcome.error,
                        f"{tp[0]}-{tp[1]} is not in an ongoing transaction of "
                        f"{txn_id!r} (producer {producer_id}, epoch {epoch})",
                    )
        return refused


def verify_body(
    txn_id: str, producer_id: int, epoch: int, tps: list[TopicPartition]
) -> dict[str, Any]:
    topics: dict[str, list[int]] = {}
    for t, p in tps:
        topics.setdefault(t, []).append(p)
    return {
        "transactional_id": txn_id,
        "producer_id": producer_id,
        "producer_epoch": epoch,
        "verify_only": True,
        "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
    }


def parse_verify_answer(
    answer: dict[str, Any], tps: list[TopicPartition]
) -> dict[TopicPartition, ErrorCode]:
    code = answer.get("error", 0)
    if code:
        try:
            raise LogMQError(answer.get("message") or "verification failed", ErrorCode(code))
        except ValueError:
            raise LogMQError("verification failed", ErrorCode.UNKNOWN_SERVER_ERROR) from None
    out: dict[TopicPartition, ErrorCode] = {}
    for t in answer.get("topics") or ():
        for p in t.get("partitions") or ():
            try:
                out[(t.get("topic"), p.get("partition"))] = ErrorCode(p.get("error", -1))
            except ValueError:
                out[(t.get("topic"), p.get("partition"))] = ErrorCode.UNKNOWN_SERVER_ERROR
    return {tp: out.get(tp, ErrorCode.INVALID_TXN_STATE) for tp in tps}
