"""What a remote back end offers: a handful of async object calls.

The S3 store (s3_store.py) and the directory store (directory_store.py) implement it;
everything above them (copying, reading, expiry) is written against this interface only,
so a test can swap either in, or a store that fails on purpose.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from pathlib import Path

from logmq.errors import ErrorCode, LogMQError


class RemoteStorageError(LogMQError):
    """The store failed; ``retriable`` says whether trying again later can help.

    Retriable: the store is unreachable, timed out, answered 5xx or SlowDown. Not
    retriable: credentials refused, bucket missing, a key that does not exist.
    """

    code = ErrorCode.STORAGE_ERROR  # Kafka: KAFKA_STORAGE_ERROR (56), retriable

    def __init__(self, message: str, *, retriable: bool = True) -> None:
        super().__init__(message)
        self._retriable = retriable

    @property
    def retriable(self) -> bool:
        return self._retriable


class RemoteObjectNotFound(RemoteStorageError):
    """The key does not exist (deleted, never written, or a wrong prefix)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False)


class RemoteStore(abc.ABC):
    """An object store: keys are ``/``-separated strings below the store's own prefix."""

    @abc.abstractmethod
    async def put_file(self, key: str, path: Path) -> int:
        """Upload a whole local file (multipart when large); returns its size in bytes."""

    @abc.abstractmethod
    async def put_bytes(self, key: str, data: bytes) -> None:
        """Upload a small object (a manifest, an index) in one request."""

    @abc.abstractmethod
    async def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object (fewer if it ends sooner)."""

    @abc.abstractmethod
    async def get(self, key: str) -> bytes:
        """The whole object (small ones: manifests, indexes)."""

    @abc.abstractmethod
    async def delete(self, keys: list[str]) -> None:
        """Delete these keys; a key already gone is not an error (deletes are retried)."""

    @abc.abstractmethod
    def list(self, prefix: str) -> AsyncIterator[str]:
        """Every key that starts with ``prefix``, in key order."""

    @abc.abstractmethod
    async def check(self) -> None:
        """Raise RemoteStorageError naming the setting at fault (credentials, bucket,
        endpoint) when the store cannot be used; the broker calls it at start."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections and threads."""
