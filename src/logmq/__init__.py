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
    NewTopic,
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
    "LogMQError",
    "NewTopic",
    "PartitionDescription",
    "Producer",
    "Record",
    "RecordMetadata",
    "TopicDescription",
    "errors",
]
