"""Transactions: the deterministic core of the transaction coordinator (KIP-98).

:class:`TransactionCoordinator` runs the transactional ids of one ``__transaction_state``
partition; its state persists as the records of :mod:`logmq.txn.codec` and is rebuilt by
replaying them. It is a coordinator-shard core: the shard (broker/coordinator/txn_shard.py) appends
the records it leaves, sends the marker jobs it hands out once durable, and reports back.
"""

from .codec import (
    TXN_STATE_TOPIC,
    TopicPartition,
    TxnRecord,
    TxnRecordError,
    TxnState,
    TxnStateValue,
    coordinator_partition,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    state_record,
)
from .coordinator import OFFSETS_TOPIC, TransactionCoordinator
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

__all__ = [
    "NEED_PRODUCER_ID",
    "OFFSETS_TOPIC",
    "TXN_STATE_TOPIC",
    "Expired",
    "InitProducerIdResult",
    "ListTransactionsResult",
    "MarkerJob",
    "NeedProducerId",
    "TopicPartition",
    "TransactionCoordinator",
    "TransactionDescription",
    "TransactionListing",
    "TransactionMetadata",
    "TxnConfig",
    "TxnRecord",
    "TxnRecordError",
    "TxnState",
    "TxnStateValue",
    "coordinator_partition",
    "decode_key",
    "decode_value",
    "encode_key",
    "encode_value",
    "is_epoch_exhausted",
    "state_record",
]
