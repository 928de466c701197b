"""logmq: a Kafka-style partitioned log broker, and its Python clients."""

from logmq import errors
from logmq.client import (
    Admin,
    AsyncAdmin,
    AsyncConsumer,
    AsyncProducer,
    BufferFullError,
    ConfigEntry,
    Consumer,
    FetchedBatch,
    GroupDescription,
    GroupListing,
    NewTopic,
    OffsetAndMetadata,
    PartitionDescription,
    Producer,
    TopicDescription,
)
from logmq.errors import ErrorCode, LogMQError
from logmq.records import Record, RecordMetadata

__all__ = [
    "Admin",
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncProducer",
    "BufferFullError",
    "ConfigEntry",
    "Consumer",
    "ErrorCode",
    "FetchedBatch",
    "GroupDescription",
    "GroupListing",
    "LogMQError",
    "NewTopic",
    "OffsetAndMetadata",
    "PartitionDescription",
    "Producer",
    "Record",
    "RecordMetadata",
    "TopicDescription",
    "errors",
]
