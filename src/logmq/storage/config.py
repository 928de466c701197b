"""Per-topic log configuration with Kafka's key names and defaults.

Operators already know ``segment.bytes`` and ``retention.ms``; keeping the names means
DescribeConfigs output and docs read the same as Kafka's. Values arrive as strings (from
the wire, the CLI or the on-disk override file) and are validated here, once.

Every other Kafka 3.9 topic config (``STORED_CONFIG_KEYS``: compression levels,
timestamp bounds, ...) is accepted, type-checked as Kafka does, kept and described, but
changes nothing here: provisioning tools send them and must not fail.

Tiered storage (KIP-405, KIP-950) has typed fields; its cross-field rules, which need
the broker's ``remote.log.storage.system.enable`` and the topic's previous config, are
in ``validate_remote_storage``, called by the topic-admin paths.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from logmq.errors import InvalidConfigError
from logmq.storage.batch import Compression
from logmq.storage.stored_configs import (  # noqa: F401 - STORED_CONFIG_KEYS, StoredKey: public here
    STORED_BY_NAME,
    STORED_CONFIG_KEYS,
    StoredKey,
    parse_stored,
)

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
    maximum: int | None = None


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
    # tiered storage (KIP-405/KIP-950); -2 = follow retention.ms / retention.bytes
    remote_storage_enable: bool = False
    local_retention_ms: int = -2
    local_retention_bytes: int = -2
    remote_copy_disable: bool = False
    remote_delete_on_disable: bool = False
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

    @property
    def copies_to_remote(self) -> bool:
        """Closed segments go to the remote tier: enabled and copying not stopped."""
        return self.remote_storage_enable and not self.remote_copy_disable

    @property
    def effective_local_retention_ms(self) -> int:
        """How long a copied segment stays on local disk; -1 keeps it for ever.

        -2 follows retention.ms. With copying off (no tier, or remote.log.copy.disable)
        nothing new reaches the tier, so the local log keeps the total retention
        (KIP-950) rather than deleting segments that exist nowhere else.
        """
        if not self.copies_to_remote or self.local_retention_ms == LOCAL_FOLLOWS_TOTAL:
            return self.retention_ms
        return self.local_retention_ms

    @property
    def effective_local_retention_bytes(self) -> int:
        """The local log's size bound for copied segments; -1 = none. As above."""
        if not self.copies_to_remote or self.local_retention_bytes == LOCAL_FOLLOWS_TOTAL:
            return self.retention_bytes
        return self.local_retention_bytes

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
            kept = STORED_BY_NAME.get(key)
            if kept is None:
                raise InvalidConfigError(f"unknown topic config {key!r}")
            stored[key] = parse_stored(kept, raw)
        changes["stored"] = tuple(
            sorted((k, v) for k, v in stored.items() if v != STORED_BY_NAME[k].default)
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
    if spec.maximum is not None and value > spec.maximum:
        raise InvalidConfigError(f"{spec.name} must be <= {spec.maximum}, got {value}")
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
_LONG = (1 << 63) - 1
LOCAL_FOLLOWS_TOTAL = -2  # local.retention.* default: use retention.ms / retention.bytes

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
    ConfigKey(
        "remote.storage.enable",
        "remote_storage_enable",
        "bool",
        "Copy closed segments to the remote tier (needs remote.log.storage.system.enable "
        "on the brokers); fetches below the local log start read them back.",
    ),
    ConfigKey(
        "local.retention.ms",
        "local_retention_ms",
        "int",
        "With remote storage: delete a copied segment locally once this old; -2 follows "
        "retention.ms, -1 keeps it.",
        (),
        -2,
        _LONG,
    ),
    ConfigKey(
        "local.retention.bytes",
        "local_retention_bytes",
        "int",
        "With remote storage: delete copied segments locally while the local log is "
        "larger; -2 follows retention.bytes, -1 means no limit.",
        (),
        -2,
        _LONG,
    ),
    ConfigKey(
        "remote.log.copy.disable",
        "remote_copy_disable",
        "bool",
        "Stop copying to the remote tier; what is there stays readable and expires by "
        "retention.ms/retention.bytes, which the local log then follows too.",
    ),
    ConfigKey(
        "remote.log.delete.on.disable",
        "remote_delete_on_disable",
        "bool",
        "Required to turn remote.storage.enable off: the topic's remote data is deleted.",
    ),
)

_BY_NAME: dict[str, ConfigKey] = {k.name: k for k in TOPIC_CONFIG_KEYS}
assert {k.field for k in TOPIC_CONFIG_KEYS} | {"stored"} == {f.name for f in fields(LogConfig)}
assert not set(STORED_BY_NAME) & set(_BY_NAME)


def is_stored_only(key: str) -> bool:
    """A Kafka topic config logmq accepts and describes but does not act on."""
    return key in STORED_BY_NAME


def is_list_config(key: str) -> bool:
    """Kafka's LIST-typed topic configs: the only ones APPEND and SUBTRACT apply to."""
    spec = _BY_NAME.get(key)
    if spec is not None:
        return spec.kind == "policy"
    kept = STORED_BY_NAME.get(key)
    return kept is not None and kept.kind == "replicas"


def config_doc(key: str) -> str:
    """Documentation of one key (for DescribeConfigs and docs)."""
    spec = _BY_NAME.get(key)
    return spec.doc if spec is not None else STORED_BY_NAME[key].doc


def default_value(key: str) -> str:
    spec = _BY_NAME.get(key)
    if spec is None:
        return STORED_BY_NAME[key].default
    return _format(getattr(LogConfig(), spec.field))


def validate_remote_storage(new: LogConfig, old: LogConfig | None, system_enabled: bool) -> None:
    """Kafka 3.9's tiered-storage rules for a topic's config, on create and on alter.

    ``new`` and ``old`` are effective configs (broker topic defaults merged with the
    topic's overrides); ``old`` is None on create. ``system_enabled`` is the broker's
    ``remote.log.storage.system.enable``. Raises InvalidConfigError (INVALID_CONFIG on
    the wire) naming the config. Not part of ``from_dict``: a config stored before the
    broker's settings changed must still load; only a create or an alter is refused.
    """
    if not new.remote_storage_enable:
        if old is not None and old.remote_storage_enable and not new.remote_delete_on_disable:
            raise InvalidConfigError(
                "remote.storage.enable=false on a topic that has remote data needs "
                "remote.log.delete.on.disable=true (its remote data is then deleted); to "
                "keep that data readable and copy no more, leave remote.storage.enable=true "
                "and set remote.log.copy.disable=true"
            )
        return
    if not system_enabled:
        raise InvalidConfigError(
            "remote.storage.enable=true: tiered storage is off on this broker "
            "(remote.log.storage.system.enable=false)"
        )
    if new.compact:
        raise InvalidConfigError(
            f"remote.storage.enable=true with cleanup.policy={new.cleanup_policy}: a "
            "compacted topic cannot use remote storage (copied segments are never cleaned)"
        )
    _local_within_total(
        "local.retention.ms", new.local_retention_ms, "retention.ms", new.retention_ms
    )
    _local_within_total(
        "local.retention.bytes", new.local_retention_bytes, "retention.bytes", new.retention_bytes
    )
    if new.remote_copy_disable:
        pairs = (
            ("local.retention.ms", new.local_retention_ms, "retention.ms", new.retention_ms),
            (
                "local.retention.bytes",
                new.local_retention_bytes,
                "retention.bytes",
                new.retention_bytes,
            ),
        )
        for local_name, local, total_name, total in pairs:
            if local not in (LOCAL_FOLLOWS_TOTAL, total):
                raise InvalidConfigError(
                    f"{local_name}={local} with remote.log.copy.disable=true: nothing more "
                    f"is copied, so it must be -2 or equal {total_name} ({total})"
                )


def _local_within_total(local_name: str, local: int, total_name: str, total: int) -> None:
    """The local bound is at most the total one (-2 follows it; a total of -1 has none)."""
    if total == -1 or local == LOCAL_FOLLOWS_TOTAL:
        return
    if local == -1:
        raise InvalidConfigError(
            f"{local_name}=-1 (keep locally for ever) is more than {total_name}={total}"
        )
    if local > total:
        raise InvalidConfigError(f"{local_name}={local} is more than {total_name}={total}")
