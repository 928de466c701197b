"""The Python clients: asyncio ones, and blocking wrappers that run them on a loop thread.

Quick reference (every client takes ``bootstrap="host:port[,host:port]"`` and is an
async / plain context manager):

``AsyncProducer.send(topic, value, key=None, partition=None, headers=None,
timestamp=None)`` appends to a per-partition batch and returns a RecordHandle; ``await``
it for ``RecordMetadata``. ``send_batch(topic, values, keys=None, partition=None)`` is
the bulk path and awaits to ``[(partition, base_offset, count), ...]``, one tuple per
batch written. The blocking ``Producer`` returns ``concurrent.futures.Future`` objects
for the same results. Values and keys may be bytes or str (UTF-8). Keyed records go where
Kafka's Java client puts them (murmur2, partitioner.py); keyless ones stick to one
partition until its batch closes.

``AsyncConsumer.poll(timeout, max_records)`` returns ``Record`` objects (immutable
tuples with named fields); ``poll_batches()`` is the batch-wise fast path:
``FetchedBatch`` objects whose ``rows`` are the raw decoded ``(offset_delta,
timestamp_delta, key, value, headers)`` tuples (see ``FetchedBatch``), with
``values()``/``keys()``/``offsets()``/``records()`` helpers.

Module map: connection (one pipelined socket) + response_reader (sans-IO frame
splitting into reused buffers), cluster (metadata, routing,
ListOffsets, group coordinators), accumulator + inflight (sans-IO batching and sequence
bookkeeping), sender (the producer's I/O task), producer, fetcher (sans-IO response
decoding), consumer + fetch_loop (its fetch tasks) + consumer_positions,
group_membership (sans-IO KIP-848 member state machine) +
group_session (its asyncio shell in the consumer), group_offsets (OffsetCommit /
OffsetFetch), transactions (the transactional producer's coordinator requests,
complete_transaction), admin + group_admin, sync (blocking wrappers).
"""

from typing import TYPE_CHECKING

# Names resolve on first use (PEP 562): a broker imports client.connection for its own
# connections to other brokers, and should not pay for the admin, consumer and producer
# modules at every start.
_HOMES = {
    "AsyncAdmin": "admin",
    "ConfigEntry": "admin",
    "NewTopic": "admin",
    "PartitionDescription": "admin",
    "TopicDescription": "admin",
    "AsyncConsumer": "consumer",
    "FetchedBatch": "fetcher",
    "GroupDescription": "group_admin",
    "GroupListing": "group_admin",
    "GroupMember": "group_admin",
    "GroupPartition": "group_admin",
    "OffsetAndMetadata": "group_offsets",
    "AsyncProducer": "producer",
    "BufferFullError": "producer",
    "BulkHandle": "producer",
    "RecordHandle": "producer",
    "Admin": "sync",
    "Consumer": "sync",
    "LoopThread": "sync",
    "Producer": "sync",
    "RecordFuture": "sync",
    "complete_transaction": "transactions",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))


if TYPE_CHECKING:
    from logmq.client.admin import (
        AsyncAdmin,
        ConfigEntry,
        NewTopic,
        PartitionDescription,
        TopicDescription,
    )
    from logmq.client.consumer import AsyncConsumer
    from logmq.client.fetcher import FetchedBatch
    from logmq.client.group_admin import (
        GroupDescription,
        GroupListing,
        GroupMember,
        GroupPartition,
    )
    from logmq.client.group_offsets import OffsetAndMetadata
    from logmq.client.producer import AsyncProducer, BufferFullError, BulkHandle, RecordHandle
    from logmq.client.sync import Admin, Consumer, LoopThread, Producer, RecordFuture
    from logmq.client.transactions import complete_transaction

__all__ = [
    "Admin",
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncProducer",
    "BufferFullError",
    "BulkHandle",
    "ConfigEntry",
    "Consumer",
    "FetchedBatch",
    "GroupDescription",
    "GroupListing",
    "GroupMember",
    "GroupPartition",
    "LoopThread",
    "NewTopic",
    "OffsetAndMetadata",
    "PartitionDescription",
    "Producer",
    "RecordFuture",
    "RecordHandle",
    "TopicDescription",
    "complete_transaction",
]
