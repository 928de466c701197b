"""KIP-890 part 1: a partition leader checks that a transactional produce belongs to an
ongoing transaction before appending it.

Without the check, a producer's late batch (retried after its transaction was aborted,
or sent after a timeout aborted it) would open a transaction on the partition that no
coordinator will ever end: a hanging transaction, which holds the partition's LSO, and
every read_committed consumer, back for good. So the first transactional batch of a
producer on a partition is verified with the transaction's coordinator (AddPartitionsToTxn
with verify_only); later batches of the same transaction are not, since the partition's
own state shows the transaction open (Kafka's verification guard does the same).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from logmq.errors import ErrorCode, LogMQError
from logmq.net.codec import ApiKey

if TYPE_CHECKING:
    from logmq.broker.broker_clients import BrokerClients
    from logmq.broker.txn_coordinator import TransactionCoordinatorService
    from logmq.storage.partition_log import PartitionLog

TopicPartition = tuple[str, int]


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
        self, transactional_id: str, producer_id: int, epoch: int, tps: list[TopicPartition]
    ) -> dict[TopicPartition, ErrorCode]:
        """NONE for each partition the transaction holds (or that holds it already), else
        why not: INVALID_TXN_STATE when the coordinator does not list it, a coordinator
        error (retriable) when it could not be asked."""
        out = {tp: ErrorCode.NONE for tp in tps if self.open_here(tp, producer_id, epoch)}
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
            found = dict.fromkeys(ask, code)
        out.update((tp, found.get(tp, ErrorCode.INVALID_TXN_STATE)) for tp in ask)
        return out

    async def _remote(
        self, node: int, txn_id: str, producer_id: int, epoch: int, tps: list[TopicPartition]
    ) -> dict[TopicPartition, ErrorCode]:
        body = verify_body(txn_id, producer_id, epoch, tps)
        answer = await self.clients.call(node, ApiKey.ADD_PARTITIONS_TO_TXN, body)
        return parse_verify_answer(answer, tps)


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
