"""The native door's transaction APIs between brokers (both need CLUSTER_ACTION).

* WriteTxnMarkers (27): a coordinator's markers for partitions this broker leads
  (broker/txn_markers.py). Request ``{"markers": [{"producer_id", "producer_epoch",
  "coordinator_epoch", "commit", "topics": [{"topic", "partitions": [int]}]}]}``;
  answer ``{"markers": [{"producer_id", "topics": [{"topic", "partitions":
  [{"partition", "error"}]}]}]}``.
* AddPartitionsToTxn (24) with ``verify_only`` (KIP-890 part 1): a partition leader asks
  this broker, the transaction's coordinator, whether partitions are in an ongoing
  transaction. Request ``{"transactional_id", "producer_id", "producer_epoch",
  "verify_only": true, "topics": [{"topic", "partitions": [int]}]}``; answer
  ``{"error", "topics": [{"topic", "partitions": [{"partition", "error"}]}]}``.
"""

from __future__ import annotations

from collections.abc import Iterable
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

if TYPE_CHECKING:
    from logmq.broker.txn_coordinator import TransactionCoordinatorService
    from logmq.broker.txn_markers import MarkerWriter

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


class TxnApi:
    def __init__(self, writer: MarkerWriter, txns: TransactionCoordinatorService) -> None:
        self.writer = writer
        self.txns = txns

    async def write_txn_markers(self, req: Request) -> Reply:
        out = []
        for marker in req_list(req.body, "markers"):
            producer_id = req_int(marker, "producer_id")
            codes = await self.writer.write(
                producer_id,
                req_int(marker, "producer_epoch"),
                req_int(marker, "coordinator_epoch"),
                req_field(marker, "commit", bool),
                _partitions(marker),
            )
            out.append({"producer_id": producer_id, "topics": _by_topic(codes)})
        return Reply({"markers": out})

    async def add_partitions_to_txn(self, req: Request) -> Reply:
        body = req.body
        if not req_field(body, "verify_only", bool, False):
            raise InvalidRequestError(
                "between brokers AddPartitionsToTxn only verifies (verify_only: true)"
            )
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


def _complete(
    codes: dict[TopicPartition, ErrorCode], tps: Iterable[TopicPartition]
) -> dict[TopicPartition, ErrorCode]:
    return {tp: codes.get(tp, ErrorCode.INVALID_TXN_STATE) for tp in tps}
