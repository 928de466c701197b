"""logmq: a Kafka-style partitioned log broker, and its Python clients.

The public names below are imported on first use (PEP 562): ``import logmq.testing`` (a
pytest plugin every session loads) and the broker process import this package too, and
neither needs the whole client, which is most of a second's start-up cost of a test
broker. ``from logmq import Producer`` works as before.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# public name -> the module it lives in
_LAZY = {
    **dict.fromkeys(
        (
            "Admin",
            "AsyncAdmin",
            "AsyncConsumer",
            "AsyncProducer",
            "BufferFullError",
            "ConfigEntry",
            "Consumer",
            "FetchedBatch",
            "GroupDescription",
            "GroupListing",
            "NewTopic",
            "OffsetAndMetadata",
            "PartitionDescription",
            "Producer",
            "TopicDescription",
        ),
        "logmq.client",
    ),
    "ErrorCode": "logmq.errors",
    "LogMQError": "logmq.errors",
    "Record": "logmq.records",
    "RecordMetadata": "logmq.records",
}

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


def __getattr__(name: str) -> Any:
    if name == "errors":
        return importlib.import_module("logmq.errors")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'logmq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
