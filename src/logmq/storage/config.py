"""Per-topic log configuration with Kafka's key names and defaults.

Operators already know ``segment.bytes`` and ``retention.ms``; keeping the names means
DescribeConfigs output and docs read the same as Kafka's. Values arrive as strings (from
the wire, the CLI or the on-disk override file) and are validated here, once.

Every other Kafka 3.9 topic config (``STORED_CONFIG_KEYS``: tiered storage, compression
levels, timestamp bounds, ...) is accepted, type-checked as Kafka does, kept and
described, but changes nothing here: provisioning tools send them and must not fail.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Any

from logmq.errors import InvalidConfigError
from logmq.storage.batch import Compression

GiB = 1 << 30
MiB = 1 << 20
DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class ConfigKey:
    """One documented topic config key: its dotted name, field, default and meaning."""

    name: str
    field: str
    kind: str  # "int", "opt_int", "bool", "str", "ratio" (float in [0, 1]), "policy"
    doc: str
    choices: tuple[str, ...] = ()
    minimum: int | None = None


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = GiB
    segment_ms: int = 7 * DAY_MS
    retention_ms: int = 7 * DAY_MS
    retention_bytes: int = -1
    index_interval_bytes: int = 4096
    segment_index_bytes: int = 10 * MiB
    max_message_bytes: int = MiB + 12
    flush_messages: int | None = None
    flush_ms: int | None = None
    group_commit: bool = False
    cleanup_policy: str = "delete"
    message_timestamp_type: str = "CreateTime"
    file_delete_delay_ms: int = 60_000
    min_insync_replicas: int = 1
    unclean_leader_election_enable: bool = False
    delete_retention_ms: int = DAY_MS
    compression_type: str = "producer"
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int | None = None
    # Kafka configs kept with no effect: (name, normalised value), sorted, defaults left out
    stored: tuple[tuple[str, str], ...] = ()

    @property
    def compact(self) -> bool:
        """cleanup.policy includes compact: the log cleaner keeps the newest record per key."""
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        """cleanup.policy includes delete: retention.ms/retention.bytes remove old segments."""
        return "delete" in self.cleanup_policy

    @property
    def broker_codec(self) -> int | None:
        """The codec compression.type stores batches in; None keeps the producer's."""
        return BROKER_CODECS[self.compression_type]

    @classmethod
    def from_dict(cls, d: dict[str, str], base: LogConfig | None = None) -> LogConfig:
        """Build from dotted Kafka keys; unknown keys and bad values raise InvalidConfigError."""
        base = base or cls()
        changes: dict[str, Any] = {}
        stored = dict(base.stored)
        for key, raw in d.items():
            spec = _BY_NAME.get(key)
            if spec is not None:
                changes[spec.field] = _parse(spec, raw)
                continue
            kept = _STORED_BY_NAME.get(key)
            if kept is None:
                raise InvalidConfigError(f"unknown topic config {key!r}")
            stored[key] = _parse_stored(kept, raw)
        changes["stored"] = tuple(
            sorted((k, v) for k, v in stored.items() if v != _STORED_BY_NAME[k].default)
        )
        cfg = replace(base, **changes)
        cfg._check()
        return cfg

    def to_dict(self) -> dict[str, str]:
        """Every topic config by name: the ones acted on, then the stored ones."""
        out = {k.name: _format(getattr(self, k.field)) for k in TOPIC_CONFIG_KEYS}
        out.update((k.name, k.default) for k in STORED_CONFIG_KEYS)
        out.update(self.stored)
        return out

    def merged(self, overrides: dict[str, str]) -> LogConfig:
        return LogConfig.from_dict(overrides, base=self)

    def _check(self) -> None:
        if self.segment_index_bytes < 64:
            raise InvalidConfigError("segment.index.bytes must be at least 64")
        if self.segment_bytes > _INT31:
            # Index entries store 32-bit file positions.
            raise InvalidConfigError(f"segment.bytes must be <= {_INT31}")
        lag = self.max_compaction_lag_ms
        if lag is not None and lag < self.min_compaction_lag_ms:
            raise InvalidConfigError(
                "max.compaction.lag.ms must be >= min.compaction.lag.ms "
                f"({lag} < {self.min_compaction_lag_ms})"
            )


def _parse(spec: ConfigKey, raw: Any) -> Any:
    text = str(raw).strip()
    if spec.kind == "bool":
        low = text.lower()
        if low not in ("true", "false"):
            raise InvalidConfigError(f"{spec.name} must be true or false, got {raw!r}")
        return low == "true"
    if spec.kind == "policy":
        return _parse_policy(spec, text)
    if spec.kind == "ratio":
        try:
            ratio = float(text)
        except ValueError:
            raise InvalidConfigError(f"{spec.name} must be a number, got {raw!r}") from None
        if not 0.0 <= ratio <= 1.0:
            raise InvalidConfigError(f"{spec.name} must be between 0 and 1, got {raw!r}")
        return ratio
    if spec.kind == "str":
        if spec.choices and text not in spec.choices:
            raise InvalidConfigError(
                f"{spec.name} must be one of {', '.join(spec.choices)}, got {raw!r}"
            )
        return text
    if spec.kind == "opt_int" and text.lower() in ("", "none", "null"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise InvalidConfigError(f"{spec.name} must be an integer, got {raw!r}") from None
    if spec.minimum is not None and value < spec.minimum:
        raise InvalidConfigError(f"{spec.name} must be >= {spec.minimum}, got {value}")
    return value


def _parse_policy(spec: ConfigKey, text: str) -> str:
    """Kafka's list syntax: ``compact,delete`` and ``delete,compact`` mean the same."""
    parts = {p.strip() for p in text.split(",")}
    if not parts or not parts <= set(spec.choices):
        raise InvalidConfigError(
            f"{spec.name} must be delete, compact or compact,delete, got {text!r}"
        )
    return ",".join(sorted(parts))


def _format(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_INT31 = (1 << 31) - 1

# compression.type values: Kafka's names, plus "none" (what our producers call it).
BROKER_CODECS: dict[str, int | None] = {
    "producer": None,
    "uncompressed": Compression.NONE,
    "none": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}

TOPIC_CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "segment.bytes", "segment_bytes", "int", "Roll a new segment at this size.", (), 1024
    ),
    ConfigKey("segment.ms", "segment_ms", "int", "Roll a segment this old even if small.", (), 1),
    ConfigKey(
        "retention.ms",
        "retention_ms",
        "int",
        "Delete segments older than this; -1 keeps all.",
        (),
        -1,
    ),
    ConfigKey(
        "retention.bytes",
        "retention_bytes",
        "int",
        "Delete oldest segments while the log is larger; -1 means no limit.",
        (),
        -1,
    ),
    ConfigKey(
        "index.interval.bytes",
        "index_interval_bytes",
        "int",
        "Bytes of log between two sparse index entries.",
        (),
        0,
    ),
    ConfigKey(
        "segment.index.bytes",
        "segment_index_bytes",
        "int",
        "Preallocated size of each offset/time index file.",
        (),
        64,
    ),
    ConfigKey(
        "max.message.bytes",
        "max_message_bytes",
        "int",
        "Largest record batch accepted, header included.",
        (),
        65,
    ),
    ConfigKey(
        "flush.messages",
        "flush_messages",
        "opt_int",
        "fsync before acknowledging once this many records are unflushed; empty = never.",
        (),
        1,
    ),
    ConfigKey(
        "flush.ms",
        "flush_ms",
        "opt_int",
        "A background flush syncs the log this often; empty = never.",
        (),
        0,
    ),
    ConfigKey(
        "group.commit",
        "group_commit",
        "bool",
        "Acknowledge only after an fdatasync shared by all appends waiting at that moment.",
    ),
    ConfigKey(
        "cleanup.policy",
        "cleanup_policy",
        "policy",
        "delete (retention removes old segments), compact (keep the newest record per key) "
        "or compact,delete (both).",
        ("delete", "compact"),
    ),
    ConfigKey(
        "message.timestamp.type",
        "message_timestamp_type",
        "str",
        "CreateTime keeps producer timestamps; LogAppendTime stamps the broker's clock.",
        ("CreateTime", "LogAppendTime"),
    ),
    ConfigKey(
        "file.delete.delay.ms",
        "file_delete_delay_ms",
        "int",
        "Wait this long between renaming a segment to .deleted and removing it.",
        (),
        0,
    ),
    ConfigKey(
        "min.insync.replicas",
        "min_insync_replicas",
        "int",
        "acks=all produce needs this many in-sync replicas.",
        (),
        1,
    ),
    ConfigKey(
        "unclean.leader.election.enable",
        "unclean_leader_election_enable",
        "bool",
        "Allow an out-of-sync replica to become leader (may lose data).",
    ),
    ConfigKey(
        "delete.retention.ms",
        "delete_retention_ms",
        "int",
        "How long a tombstone (null value) survives after the cleaner first cleaned it.",
        (),
        0,
    ),
    ConfigKey(
        "compression.type",
        "compression_type",
        "str",
        "Codec the leader stores batches in, recompressing those that differ; "
        "'producer' keeps what the producer sent, 'uncompressed' (or 'none') stores none.",
        tuple(BROKER_CODECS),
    ),
    ConfigKey(
        "min.cleanable.dirty.ratio",
        "min_cleanable_dirty_ratio",
        "ratio",
        "Compact a log once uncleaned bytes are at least this share of it (0 to 1).",
    ),
    ConfigKey(
        "min.compaction.lag.ms",
        "min_compaction_lag_ms",
        "int",
        "Records stay uncompacted at least this long after they are written.",
        (),
        0,
    ),
    ConfigKey(
        "max.compaction.lag.ms",
        "max_compaction_lag_ms",
        "opt_int",
        "Compact a record at most this long after it is written, whatever the dirty "
        "ratio; empty = no limit.",
        (),
        1,
    ),
)

_BY_NAME: dict[str, ConfigKey] = {k.name: k for k in TOPIC_CONFIG_KEYS}
assert {k.field for k in TOPIC_CONFIG_KEYS} | {"stored"} == {f.name for f in fields(LogConfig)}


@dataclass(frozen=True, slots=True)
class StoredKey:
    """A Kafka topic config logmq keeps and describes but does not act on.

    ``kind`` is Kafka's type ("bool", "int" (32-bit), "long", "replicas" (a throttled
    replica list), "version" (a Kafka release)); ``minimum``/``maximum`` its range and
    ``also`` a value allowed outside it (gzip's -1).
    """

    name: str
    kind: str
    default: str
    doc: str
    minimum: int | None = None
    maximum: int | None = None
    also: int | None = None


_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_LONG_MAX = str(_INT64[1])

STORED_CONFIG_KEYS: tuple[StoredKey, ...] = (
    StoredKey("compression.gzip.level", "int", "-1", "Level of broker-side gzip.", 1, 9, also=-1),
    StoredKey("compression.lz4.level", "int", "9", "Level of broker-side lz4.", 1, 17),
    StoredKey("compression.zstd.level", "int", "3", "Level of broker-side zstd.", -131072, 22),
    StoredKey(
        "follower.replication.throttled.replicas",
        "replicas",
        "",
        "Replicas ('partition:broker' or '*') throttled on the follower side.",
    ),
    StoredKey(
        "leader.replication.throttled.replicas",
        "replicas",
        "",
        "Replicas ('partition:broker' or '*') throttled on the leader side.",
    ),
    StoredKey("local.retention.bytes", "long", "-2", "Local retention with tiered storage.", -2),
    StoredKey("local.retention.ms", "long", "-2", "Local retention with tiered storage.", -2),
    StoredKey(
        "message.downconversion.enable",
        "bool",
        "true",
        "Down-convert to old formats for old consumers.",
    ),
    StoredKey(
        "message.format.version",
        "version",
        "3.0-IV1",
        "Deprecated in Kafka 3.x and ignored there too: batches are always v2.",
    ),
    StoredKey(
        "message.timestamp.after.max.ms",
        "long",
        _LONG_MAX,
        "Refuse records this far ahead of the broker's clock.",
        0,
    ),
    StoredKey(
        "message.timestamp.before.max.ms",
        "long",
        _LONG_MAX,
        "Refuse records this far behind the broker's clock.",
        0,
    ),
    StoredKey(
        "message.timestamp.difference.max.ms",
        "long",
        _LONG_MAX,
        "Deprecated form of the two bounds above.",
        0,
    ),
    StoredKey("preallocate", "bool", "false", "Preallocate segment files."),
    StoredKey(
        "remote.log.copy.disable", "bool", "false", "Stop copying segments to tiered storage."
    ),
    StoredKey(
        "remote.log.delete.on.disable",
        "bool",
        "false",
        "Delete tiered data when tiered storage is turned off.",
    ),
    StoredKey(
        "remote.storage.enable",
        "bool",
        "false",
        "Tiered storage; logmq has none, so only false is accepted (as a Kafka broker "
        "without remote storage refuses true).",
    ),
    StoredKey("segment.jitter.ms", "long", "0", "Random jitter on segment.ms rolls.", 0),
)
_STORED_BY_NAME: dict[str, StoredKey] = {k.name: k for k in STORED_CONFIG_KEYS}
assert not set(_STORED_BY_NAME) & set(_BY_NAME)

# Kafka releases message.format.version names: 0.8.0-0.11.0 (three parts), 1.0-3.9,
# each optionally with a patch number or an "-IVn" inter-broker-protocol suffix.
_KAFKA_VERSION = re.compile(
    r"(0\.8\.[0-2]|0\.9\.0|0\.10\.[0-2]|0\.11\.0|1\.[01]|2\.[0-8]|3\.[0-9])"
    r"(-IV\d+|\.\d+)?"
)
_THROTTLED_REPLICA = re.compile(r"[0-9]+:[0-9]+")


def _parse_stored(spec: StoredKey, raw: Any) -> str:
    """Check a stored config as Kafka's ConfigDef would; return its normalised text."""
    text = str(raw).strip()
    if spec.kind == "bool":
        low = text.lower()
        if low not in ("true", "false"):
            raise InvalidConfigError(f"{spec.name} must be true or false, got {raw!r}")
        if spec.name == "remote.storage.enable" and low == "true":
            raise InvalidConfigError(
                "remote.storage.enable=true: logmq has no tiered storage (a Kafka broker "
                "without remote log storage refuses it too)"
            )
        return low
    if spec.kind == "replicas":
        items = [x.strip() for x in text.split(",")] if text else []
        if items != ["*"] and not all(_THROTTLED_REPLICA.fullmatch(x) for x in items):
            raise InvalidConfigError(
                f"{spec.name} must be '*' or a list of partition:broker pairs, got {raw!r}"
            )
        return ",".join(items)
    if spec.kind == "version":
        if not _KAFKA_VERSION.fullmatch(text):
            raise InvalidConfigError(
                f"{spec.name} must be a Kafka version such as 3.0, got {raw!r}"
            )
        return text
    low, high = _INT32 if spec.kind == "int" else _INT64
    try:
        value = int(text)
    except ValueError:
        raise InvalidConfigError(f"{spec.name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise InvalidConfigError(f"{spec.name} is out of range: {raw!r}")
    if value != spec.also and (
        (spec.minimum is not None and value < spec.minimum)
        or (spec.maximum is not None and value > spec.maximum)
    ):
        bounds = (
            f">= {spec.minimum}"
            if spec.maximum is None
            else (f"between {spec.minimum} and {spec.maximum}")
        )
        extra = "" if spec.also is None else f" (or {spec.also})"
        raise InvalidConfigError(f"{spec.name} must be {bounds}{extra}, got {value}")
    return str(value)


def is_stored_only(key: str) -> bool:
    """A Kafka topic config logmq accepts and describes but does not act on."""
    return key in _STORED_BY_NAME


def is_list_config(key: str) -> bool:
    """Kafka's LIST-typed topic configs: the only ones APPEND and SUBTRACT apply to."""
    spec = _BY_NAME.get(key)
    if spec is not None:
        return spec.kind == "policy"
    kept = _STORED_BY_NAME.get(key)
    return kept is not None and kept.kind == "replicas"


def config_doc(key: str) -> str:
    """Documentation of one key (for DescribeConfigs and docs)."""
    spec = _BY_NAME.get(key)
    return spec.doc if spec is not None else _STORED_BY_NAME[key].doc


def default_value(key: str) -> str:
    spec = _BY_NAME.get(key)
    if spec is None:
        return _STORED_BY_NAME[key].default
    return _format(getattr(LogConfig(), spec.field))
