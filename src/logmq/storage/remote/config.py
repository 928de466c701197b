"""The broker's tiered-storage settings, read once from Kafka's property names.

Operators moving from Kafka bring a ``server.properties`` with Kafka's
``remote.log.*`` settings and, for the storage plugin, Aiven's ``rsm.config.*`` names
(tiered-storage-for-apache-kafka, the plugin most S3 deployments use); logmq reads
both as they are, from ``BrokerConfig.properties``. Built at start so a bad value stops
the broker with a message naming the property, before any segment is copied.
docs/tiered-storage.md lists every property.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from logmq.errors import InvalidConfigError

MiB = 1 << 20
GiB = 1 << 30
LONG_MAX = (1 << 63) - 1
INT_MAX = (1 << 31) - 1

SYSTEM_ENABLE = "remote.log.storage.system.enable"
MANAGER_CLASS = "remote.log.storage.manager.class.name"
RSM_PREFIX = "remote.log.storage.manager.impl.prefix"
DEFAULT_RSM_PREFIX = "rsm.config."  # Kafka 3.9's default
METADATA_MANAGER_CLASS = "remote.log.metadata.manager.class.name"

# remote.log.storage.manager.class.name: logmq has one remote storage manager, the
# back end is chosen by storage.backend.class. Kafka's test LocalTieredStorage (a
# directory) is taken as the directory back end, so its configs work unchanged.
LOGMQ_RSM = "logmq.storage.remote.RemoteStorageManager"
AIVEN_RSM = "io.aiven.kafka.tieredstorage.RemoteStorageManager"
KAFKA_LOCAL_RSM = "org.apache.kafka.server.log.remote.storage.LocalTieredStorage"
MANAGER_CLASSES = (LOGMQ_RSM, AIVEN_RSM, KAFKA_LOCAL_RSM)

# rsm.config.storage.backend.class: Aiven's class names and logmq's short ones
S3 = "s3"
FILESYSTEM = "filesystem"
BACKENDS: dict[str, str] = {
    "io.aiven.kafka.tieredstorage.storage.s3.S3Storage": S3,
    "io.aiven.kafka.tieredstorage.storage.filesystem.FileSystemStorage": FILESYSTEM,
    S3: S3,
    FILESYSTEM: FILESYSTEM,
}

# remote.log.metadata.manager.class.name: the segment metadata lives in logmq's
# metadata quorum (segment_metadata.py). Kafka's default name is accepted because
# every Kafka config carries it; no other manager can be plugged in.
KAFKA_TOPIC_RLMM = (
    "org.apache.kafka.server.log.remote.metadata.storage.TopicBasedRemoteLogMetadataManager"
)
LOGMQ_RLMM = "logmq.storage.remote.QuorumRemoteLogMetadataManager"
METADATA_MANAGER_CLASSES = (KAFKA_TOPIC_RLMM, LOGMQ_RLMM)

# Aiven's chunk cache classes: logmq's cache is in memory, bounded by fetch.chunk.cache.size
CHUNK_CACHE_CLASSES = (
    "io.aiven.kafka.tieredstorage.fetch.cache.MemoryChunkCache",
    "logmq.storage.remote.ChunkCache",
)

# Aiven plugin features that change what is stored: refused when turned on, since
# silently storing segments unencrypted (or differently) would mislead the operator.
_REFUSED_IF_TRUE = ("encryption.enabled", "compression.enabled")

# RSM keys (below the prefix) logmq reads; any other one is reported in ``unrecognised``
_RSM_KEYS = frozenset(
    {
        "storage.backend.class",
        "storage.root",
        "dir",  # LocalTieredStorage's directory
        "storage.s3.bucket.name",
        "storage.s3.region",
        "storage.s3.endpoint.url",
        "storage.s3.path.style.access.enabled",
        "storage.aws.access.key.id",
        "storage.aws.secret.access.key",
        "storage.s3.multipart.upload.part.size",
        "storage.s3.api.call.timeout",
        "chunk.size",
        "key.prefix",
        "fetch.chunk.cache.size",
        "fetch.chunk.cache.class",
        *_REFUSED_IF_TRUE,
    }
)
SENSITIVE_RSM_KEYS = frozenset({"storage.aws.access.key.id", "storage.aws.secret.access.key"})

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
DEFAULT_CHUNK_CACHE_BYTES = 128 * MiB


class RemoteStorageConfigError(InvalidConfigError, ValueError):
    """A tiered-storage setting is wrong; the message names the property.

    A ValueError as BrokerConfig's own checks are, and an InvalidConfigError so the
    server's start-up path reports it like a bad security setting.
    """


@dataclass(frozen=True, slots=True)
class RemoteStorageSettings:
    """The tiered-storage settings of one broker, validated; defaults are Kafka 3.9's."""

    enabled: bool = False  # remote.log.storage.system.enable
    manager_class: str = LOGMQ_RSM
    metadata_manager_class: str = KAFKA_TOPIC_RLMM
    rsm_prefix: str = DEFAULT_RSM_PREFIX
    backend: str | None = None  # S3 or FILESYSTEM; None only when not enabled
    root: Path | None = None  # FILESYSTEM: the directory objects are kept in
    s3_bucket: str | None = None
    s3_region: str | None = None
    s3_endpoint_url: str | None = None  # an S3-compatible store (MinIO, ...); None = AWS
    s3_path_style_access: bool | None = None  # None: the client decides
    # static credentials; None = the environment's (AWS_* variables, profile, role)
    aws_access_key_id: str | None = field(default=None, repr=False)
    aws_secret_access_key: str | None = field(default=None, repr=False)
    s3_multipart_part_size: int = 25 * MiB  # Aiven's default; 5 MiB to 2 GiB - 1
    s3_api_call_timeout_ms: int | None = None  # one call, retries included; None = client's
    chunk_size: int = 4 * MiB  # a segment is stored and range-read in chunks this size
    key_prefix: str = ""  # prepended to every object key
    chunk_cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES  # 0 = no chunk cache
    task_interval_ms: int = 30_000  # remote.log.manager.task.interval.ms
    task_retry_backoff_ms: int = 500
    task_retry_backoff_max_ms: int = 30_000
    task_retry_jitter: float = 0.2
    thread_pool_size: int = 10  # remote.log.manager.thread.pool.size
    copier_thread_pool_size: int = 10  # -1 in the property = thread_pool_size
    expiration_thread_pool_size: int = 10  # likewise
    copy_max_bytes_per_second: int = LONG_MAX  # Long.MAX_VALUE = no limit
    fetch_max_bytes_per_second: int = LONG_MAX
    reader_threads: int = 10  # remote.log.reader.threads
    reader_max_pending_tasks: int = 100  # a fetch past this many queued reads fails
    remote_fetch_max_wait_ms: int = 500  # remote.fetch.max.wait.ms
    index_cache_bytes: int = GiB  # remote.log.index.file.cache.total.size.bytes
    # rsm.config.* keys given that logmq does not read (the server logs them)
    unrecognised: tuple[str, ...] = ()

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> RemoteStorageSettings:
        """Read and check every tiered-storage property; unknown RSM keys are listed."""
        p = _Reader(props)
        prefix = p.text(RSM_PREFIX) or DEFAULT_RSM_PREFIX
        enabled = p.flag(SYSTEM_ENABLE, False)
        manager = p.choice(MANAGER_CLASS, MANAGER_CLASSES, LOGMQ_RSM)
        rlmm = p.choice(METADATA_MANAGER_CLASS, METADATA_MANAGER_CLASSES, KAFKA_TOPIC_RLMM)

        def rsm(key: str) -> str:
            return prefix + key

        backend_key = rsm("storage.backend.class")
        raw_backend = p.text(backend_key)
        if raw_backend is not None and raw_backend not in BACKENDS:
            raise RemoteStorageConfigError(
                f"{backend_key}: {raw_backend!r} is not available; use one of "
                + ", ".join(BACKENDS)
            )
        backend = BACKENDS[raw_backend] if raw_backend is not None else None
        if manager == KAFKA_LOCAL_RSM:
            if backend not in (None, FILESYSTEM):
                raise RemoteStorageConfigError(
                    f"{MANAGER_CLASS}={KAFKA_LOCAL_RSM} keeps segments in a directory; "
                    f"{backend_key} cannot name {raw_backend!r}"
                )
            backend = FILESYSTEM
        root_key = rsm("storage.root")
        root_text = p.text(root_key)
        if root_text is None and manager == KAFKA_LOCAL_RSM:
            root_key = rsm("dir")
            root_text = p.text(root_key)
        for key in _REFUSED_IF_TRUE:
            if p.flag(rsm(key), False):
                raise RemoteStorageConfigError(
                    f"{rsm(key)}=true: logmq's remote storage does not support it"
                )
        cache_class = p.text(rsm("fetch.chunk.cache.class"))
        if cache_class is not None and cache_class not in CHUNK_CACHE_CLASSES:
            raise RemoteStorageConfigError(
                f"{rsm('fetch.chunk.cache.class')}: {cache_class!r} is not available; use "
                + " or ".join(CHUNK_CACHE_CLASSES)
                + f" (an in-memory cache bounded by {rsm('fetch.chunk.cache.size')})"
            )
        pool = p.integer("remote.log.manager.thread.pool.size", 10, 1, INT_MAX)
        backoff = p.integer("remote.log.manager.task.retry.backoff.ms", 500, 1, LONG_MAX)
        out = cls(
            enabled=enabled,
            manager_class=manager,
            metadata_manager_class=rlmm,
            rsm_prefix=prefix,
            backend=backend,
            root=Path(root_text) if root_text is not None else None,
            s3_bucket=p.text(rsm("storage.s3.bucket.name")),
            s3_region=p.text(rsm("storage.s3.region")),
            s3_endpoint_url=p.url(rsm("storage.s3.endpoint.url")),
            s3_path_style_access=p.opt_flag(rsm("storage.s3.path.style.access.enabled")),
            aws_access_key_id=p.text(rsm("storage.aws.access.key.id")),
            aws_secret_access_key=p.text(rsm("storage.aws.secret.access.key")),
            s3_multipart_part_size=p.integer(
                rsm("storage.s3.multipart.upload.part.size"), 25 * MiB, 5 * MiB, INT_MAX
            ),
            s3_api_call_timeout_ms=p.opt_integer(rsm("storage.s3.api.call.timeout"), 1, LONG_MAX),
            chunk_size=p.integer(rsm("chunk.size"), 4 * MiB, 1, GiB - 1),
            key_prefix=p.text(rsm("key.prefix")) or "",
            chunk_cache_bytes=p.integer(
                rsm("fetch.chunk.cache.size"), DEFAULT_CHUNK_CACHE_BYTES, 0, LONG_MAX
            ),
            task_interval_ms=p.integer("remote.log.manager.task.interval.ms", 30_000, 1, LONG_MAX),
            task_retry_backoff_ms=backoff,
            task_retry_backoff_max_ms=p.integer(
                "remote.log.manager.task.retry.backoff.max.ms", 30_000, 1, LONG_MAX
            ),
            task_retry_jitter=p.number("remote.log.manager.task.retry.jitter", 0.2, 0.0, 0.5),
            thread_pool_size=pool,
            copier_thread_pool_size=p.pool("remote.log.manager.copier.thread.pool.size", pool),
            expiration_thread_pool_size=p.pool(
                "remote.log.manager.expiration.thread.pool.size", pool
            ),
            copy_max_bytes_per_second=p.integer(
                "remote.log.manager.copy.max.bytes.per.second", LONG_MAX, 1, LONG_MAX
            ),
            fetch_max_bytes_per_second=p.integer(
                "remote.log.manager.fetch.max.bytes.per.second", LONG_MAX, 1, LONG_MAX
            ),
            reader_threads=p.integer("remote.log.reader.threads", 10, 1, INT_MAX),
            reader_max_pending_tasks=p.integer(
                "remote.log.reader.max.pending.tasks", 100, 1, INT_MAX
            ),
            remote_fetch_max_wait_ms=p.integer("remote.fetch.max.wait.ms", 500, 1, INT_MAX),
            index_cache_bytes=p.integer(
                "remote.log.index.file.cache.total.size.bytes", GiB, 1, LONG_MAX
            ),
            unrecognised=tuple(
                sorted(
                    k for k in props if k.startswith(prefix) and k[len(prefix) :] not in _RSM_KEYS
                )
            ),
        )
        out._check(root_key)
        return out

    def _check(self, root_key: str) -> None:
        """Cross-property rules; the missing ones matter only once tiering is on."""
        rsm = self.rsm_prefix
        if self.s3_bucket is not None and not _BUCKET.fullmatch(self.s3_bucket):
            raise RemoteStorageConfigError(
                f"{rsm}storage.s3.bucket.name: {self.s3_bucket!r} is not a bucket name "
                "(3 to 63 lowercase letters, digits, dots and hyphens)"
            )
        if (self.aws_access_key_id is None) != (self.aws_secret_access_key is None):
            raise RemoteStorageConfigError(
                f"{rsm}storage.aws.access.key.id and {rsm}storage.aws.secret.access.key "
                "go together: set both, or neither to use the environment's credentials"
            )
        if self.key_prefix.startswith("/"):
            raise RemoteStorageConfigError(
                f"{rsm}key.prefix: {self.key_prefix!r} must not start with '/'"
            )
        if {".", ".."} & set(self.key_prefix.split("/")) or "//" in self.key_prefix:
            raise RemoteStorageConfigError(
                f"{rsm}key.prefix: {self.key_prefix!r} must not hold '.', '..' or '//' parts"
            )
        if self.task_retry_backoff_max_ms < self.task_retry_backoff_ms:
            raise RemoteStorageConfigError(
                "remote.log.manager.task.retry.backoff.max.ms must be >= "
                f"remote.log.manager.task.retry.backoff.ms ({self.task_retry_backoff_ms})"
            )
        if not self.enabled:
            return
        if self.backend is None:
            raise RemoteStorageConfigError(
                f"{SYSTEM_ENABLE}=true needs {rsm}storage.backend.class, one of "
                + ", ".join(BACKENDS)
            )
        if self.backend == S3 and not self.s3_bucket:
            raise RemoteStorageConfigError(
                f"the S3 back end needs {rsm}storage.s3.bucket.name (the bucket segments go to)"
            )
        if self.backend == FILESYSTEM and self.root is None:
            raise RemoteStorageConfigError(
                f"the filesystem back end needs {root_key} (the directory segments go to)"
            )

    @property
    def is_s3(self) -> bool:
        return self.backend == S3

    @property
    def unlimited_copy(self) -> bool:
        return self.copy_max_bytes_per_second == LONG_MAX

    @property
    def unlimited_fetch(self) -> bool:
        return self.fetch_max_bytes_per_second == LONG_MAX

    def describe(self) -> list[tuple[str, str | None]]:
        """(property, value) pairs for DescribeConfigs, by Kafka's and Aiven's names.

        A sensitive value (``is_sensitive``) is None, as Kafka answers for a password;
        an unset optional one is None as well.
        """
        rsm = self.rsm_prefix

        def text(value: object) -> str | None:
            if value is None:
                return None
            if isinstance(value, bool):
                return "true" if value else "false"
            return str(value)

        backend_class = next(
            (name for name, short in BACKENDS.items() if short == self.backend and "." in name),
            None,
        )
        pairs: list[tuple[str, object]] = [
            (SYSTEM_ENABLE, self.enabled),
            (MANAGER_CLASS, self.manager_class),
            (RSM_PREFIX, rsm),
            (METADATA_MANAGER_CLASS, self.metadata_manager_class),
            ("remote.log.manager.task.interval.ms", self.task_interval_ms),
            ("remote.log.manager.task.retry.backoff.ms", self.task_retry_backoff_ms),
            ("remote.log.manager.task.retry.backoff.max.ms", self.task_retry_backoff_max_ms),
            ("remote.log.manager.task.retry.jitter", self.task_retry_jitter),
            ("remote.log.manager.thread.pool.size", self.thread_pool_size),
            ("remote.log.manager.copier.thread.pool.size", self.copier_thread_pool_size),
            ("remote.log.manager.expiration.thread.pool.size", self.expiration_thread_pool_size),
            ("remote.log.manager.copy.max.bytes.per.second", self.copy_max_bytes_per_second),
            ("remote.log.manager.fetch.max.bytes.per.second", self.fetch_max_bytes_per_second),
            ("remote.log.reader.threads", self.reader_threads),
            ("remote.log.reader.max.pending.tasks", self.reader_max_pending_tasks),
            ("remote.fetch.max.wait.ms", self.remote_fetch_max_wait_ms),
            ("remote.log.index.file.cache.total.size.bytes", self.index_cache_bytes),
            (rsm + "storage.backend.class", backend_class),
            (rsm + "storage.root", self.root),
            (rsm + "storage.s3.bucket.name", self.s3_bucket),
            (rsm + "storage.s3.region", self.s3_region),
            (rsm + "storage.s3.endpoint.url", self.s3_endpoint_url),
            (rsm + "storage.s3.path.style.access.enabled", self.s3_path_style_access),
            (rsm + "storage.aws.access.key.id", None),
            (rsm + "storage.aws.secret.access.key", None),
            (rsm + "storage.s3.multipart.upload.part.size", self.s3_multipart_part_size),
            (rsm + "storage.s3.api.call.timeout", self.s3_api_call_timeout_ms),
            (rsm + "chunk.size", self.chunk_size),
            (rsm + "key.prefix", self.key_prefix),
            (rsm + "fetch.chunk.cache.size", self.chunk_cache_bytes),
        ]
        return [(name, text(value)) for name, value in pairs]

    def is_sensitive(self, name: str) -> bool:
        """A property DescribeConfigs must not show (its value is None in ``describe``)."""
        return name.startswith(self.rsm_prefix) and (
            name[len(self.rsm_prefix) :] in SENSITIVE_RSM_KEYS
        )


class _Reader:
    """Typed reads of optional properties; each failure names its property."""

    def __init__(self, props: Mapping[str, str]) -> None:
        self.props = props

    def text(self, key: str) -> str | None:
        raw = self.props.get(key)
        if raw is None:
            return None
        value = str(raw).strip()
        return value or None

    def flag(self, key: str, default: bool) -> bool:
        value = self.opt_flag(key)
        return default if value is None else value

    def opt_flag(self, key: str) -> bool | None:
        raw = self.text(key)
        if raw is None:
            return None
        low = raw.lower()
        if low not in ("true", "false"):
            raise RemoteStorageConfigError(f"{key}: expected true or false, got {raw!r}")
        return low == "true"

    def opt_integer(self, key: str, low: int, high: int) -> int | None:
        raw = self.text(key)
        if raw is None:
            return None
        try:
            value = int(raw)
        except ValueError:
            raise RemoteStorageConfigError(f"{key}: expected an integer, got {raw!r}") from None
        if not low <= value <= high:
            bound = f">= {low}" if high in (INT_MAX, LONG_MAX) else f"between {low} and {high}"
            raise RemoteStorageConfigError(f"{key}: must be {bound}, got {value}")
        return value

    def integer(self, key: str, default: int, low: int, high: int) -> int:
        value = self.opt_integer(key, low, high)
        return default if value is None else value

    def pool(self, key: str, fallback: int) -> int:
        """Kafka 3.9's copier/expiration pools: -1 (the default) takes the shared size."""
        raw = self.text(key)
        if raw is not None and raw.strip() == "-1":
            return fallback
        return self.integer(key, fallback, 1, INT_MAX)

    def number(self, key: str, default: float, low: float, high: float) -> float:
        raw = self.text(key)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise RemoteStorageConfigError(f"{key}: expected a number, got {raw!r}") from None
        if not low <= value <= high:
            raise RemoteStorageConfigError(f"{key}: must be between {low} and {high}, got {raw}")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        raw = self.text(key)
        if raw is None:
            return default
        if raw not in choices:
            raise RemoteStorageConfigError(
                f"{key}: {raw!r} is not available; use one of {', '.join(choices)}"
            )
        return raw

    def url(self, key: str) -> str | None:
        raw = self.text(key)
        if raw is None:
            return None
        try:
            parts = urlsplit(raw)
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise RemoteStorageConfigError(
                f"{key}: expected an http:// or https:// URL, got {raw!r}"
            )
        return raw
