"""Kafka topic configs logmq accepts, checks and describes but does not act on.

Provisioning tools (Terraform providers, kafka-configs, GitOps operators) send every
Kafka 3.9 topic config; refusing one would break them, and accepting one unchecked
would store a value Kafka refuses. So each is validated as Kafka's ConfigDef does and
kept by storage/config.py's LogConfig in its ``stored`` overrides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from logmq.errors import InvalidConfigError


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
    StoredKey("segment.jitter.ms", "long", "0", "Random jitter on segment.ms rolls.", 0),
)
STORED_BY_NAME: dict[str, StoredKey] = {k.name: k for k in STORED_CONFIG_KEYS}

# Kafka releases message.format.version names: 0.8.0-0.11.0 (three parts), 1.0-3.9,
# each optionally with a patch number or an "-IVn" inter-broker-protocol suffix.
_KAFKA_VERSION = re.compile(
    r"(0\.8\.[0-2]|0\.9\.0|0\.10\.[0-2]|0\.11\.0|1\.[01]|2\.[0-8]|3\.[0-9])"
    r"(-IV\d+|\.\d+)?"
)
_THROTTLED_REPLICA = re.compile(r"[0-9]+:[0-9]+")


def parse_stored(spec: StoredKey, raw: Any) -> str:
    """Check a stored config as Kafka's ConfigDef would; return its normalised text."""
    text = str(raw).strip()
    if spec.kind == "bool":
        low = text.lower()
        if low not in ("true", "false"):
            raise InvalidConfigError(f"{spec.name} must be true or false, got {raw!r}")
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
