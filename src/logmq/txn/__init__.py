"""Transactions: the deterministic core of the transaction coordinator (KIP-98).

:class:`TransactionCoordinator` runs the transactional ids of one ``__transaction_state``
partition; its state persists as the records of :mod:`logmq.txn.codec` and is rebuilt by
replaying them. The asyncio shell appends its records, sends its markers and reports back.
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
    InitProducerIdResult,
    ListTransactionsResult,
    MarkerJob,
    Pending,
    TransactionDescription,
    TransactionListing,
    TransactionMetadata,
    TxnConfig,
    is_epoch_exhausted,
)

__all__ = [
    "OFFSETS_TOPIC",
    "TXN_STATE_TOPIC",
    "InitProducerIdResult",
    "ListTransactionsResult",
    "MarkerJob",
    "Pending",
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
