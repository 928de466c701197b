"""The options of the ``logmq`` Spark format, parsed and checked once, on the driver.

Spark hands a data source its options as a case-insensitive map of strings. Everything
is validated here, before any task runs, so a typo in an offset JSON or a missing
``bootstrap`` fails the query at once with a message naming the option, instead of
failing each task later. The parsed objects are small frozen dataclasses: they are
pickled into every Spark task.

Names follow Spark's Kafka source where one exists (``startingOffsets``,
``failOnDataLoss``, ``minPartitions``...); ``maxOffsetsPerTrigger`` is accepted as an
alias of ``maxRecordsPerTrigger`` for the same reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from logmq.client.partitioner import partitioner as partitioner_named
from logmq.storage.batch import Compression

EARLIEST = -2  # the ListOffsets conventions, also used inside offset JSON
LATEST = -1

DEFAULT_POLL_TIMEOUT_MS = 120_000
DEFAULT_PARTITION_FETCH_BYTES = 4 << 20
DEFAULT_TXN_PREFIX = "logmq-spark"
# A task's transaction stays open until the driver commits the whole write, so it must
# outlive the slowest task: the broker's default cap (transaction.max.timeout.ms).
DEFAULT_TXN_TIMEOUT_MS = 900_000
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")


class OptionError(ValueError):
    """An option of the logmq format is missing or has a bad value."""


@dataclass(frozen=True, slots=True)
class Subscription:
    """Which topics a source reads: a fixed list or a regular expression (full match)."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None

    def matches(self, topic: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        return topic in self.topics

    def describe(self) -> str:
        return f"pattern {self.pattern!r}" if self.pattern is not None else ",".join(self.topics)


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """``earliest``, ``latest``, or per-partition offsets (-2 earliest, -1 latest)."""

    kind: str  # "earliest" | "latest" | "specific" | "timestamp"
    offsets: tuple[tuple[str, int, int], ...] = ()  # (topic, partition, offset) for "specific"
    timestamp_ms: int | None = None  # for "timestamp"

    def specific(self) -> dict[tuple[str, int], int]:
        return {(t, p): o for t, p, o in self.offsets}


@dataclass(frozen=True, slots=True)
class SourceOptions:
    bootstrap: str
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    timestamp_strategy: str = "error"  # startingOffsetsByTimestampStrategy: error | latest
    max_records_per_trigger: int | None = None
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    fail_on_data_loss: bool = True
    group_id: str | None = None
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    max_partition_fetch_bytes: int = DEFAULT_PARTITION_FETCH_BYTES
    isolation_level: str = "read_committed"

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == "read_committed"


@dataclass(frozen=True, slots=True)
class SinkOptions:
    bootstrap: str
    topic: str | None = None
    acks: str = "all"
    compression: str = "none"
    producer: dict[str, int | str] = field(default_factory=dict)
    exactly_once: bool = False
    transactional_id_prefix: str = DEFAULT_TXN_PREFIX
    transaction_timeout_ms: int = DEFAULT_TXN_TIMEOUT_MS


def _get(options: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        if name in options and options[name] is not None:
            return str(options[name])
    return None


def _bootstrap(options: Mapping[str, str]) -> str:
    value = _get(options, "bootstrap", "bootstrap.servers")
    if not value or not value.strip():
        raise OptionError("option 'bootstrap' is required: the broker address, e.g. 127.0.0.1:9192")
    return value.strip()


def _positive_int(options: Mapping[str, str], *names: str) -> int | None:
    raw = _get(options, *names)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {names[0]!r} must be a positive integer, not {raw!r}")
    if value <= 0:
        raise OptionError(f"option {names[0]!r} must be a positive integer, not {raw!r}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered not in ("true", "false"):
        raise OptionError(f"option {name!r} must be 'true' or 'false', not {raw!r}")
    return lowered == "true"


def _subscription(options: Mapping[str, str]) -> Subscription:
    given = {n: _get(options, n) for n in ("topic", "topics", "pattern")}
    set_ = [n for n, v in given.items() if v is not None]
    if len(set_) != 1:
        raise OptionError(
            "give exactly one of the options 'topic', 'topics' (a comma list) or 'pattern'"
            + (f"; got {', '.join(set_)}" if set_ else "")
        )
    name = set_[0]
    value = given[name] or ""
    if name == "pattern":
        try:
            re.compile(value)
        except re.error as e:
            raise OptionError(f"option 'pattern' is not a valid regular expression: {e}")
        return Subscription(pattern=value)
    topics = tuple(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
    if not topics:
        raise OptionError(f"option {name!r} names no topic")
    if name == "topic" and len(topics) > 1:
        raise OptionError("option 'topic' takes one topic; use 'topics' for a comma list")
    return Subscription(topics=topics)


def parse_offsets_json(text: str, option: str, *, allow_earliest: bool = True) -> OffsetSpec:
    """Parse ``{"topic": {"partition": offset}}`` (offset -2 = earliest, -1 = latest)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise OptionError(f"option {option!r} is neither earliest, latest nor JSON: {e}")
    if not isinstance(data, dict) or not data:
        raise OptionError(f'option {option!r} must be a JSON object {{"topic": {{"0": offset}}}}')
    out: list[tuple[str, int, int]] = []
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise OptionError(f"option {option!r}: topic {topic!r} must map partitions to offsets")
        for p, off in parts.items():
            try:
                partition = int(p)
            except (TypeError, ValueError):
                raise OptionError(
                    f"option {option!r}: {p!r} of {topic!r} is not a partition number"
                )
            if isinstance(off, bool) or not isinstance(off, int) or off < EARLIEST:
                raise OptionError(
                    f"option {option!r}: offset of {topic}-{partition} must be an integer >= -2"
                )
            if off == EARLIEST and not allow_earliest:
                raise OptionError(f"option {option!r}: -2 (earliest) is not allowed here")
            if partition < 0:
                raise OptionError(f"option {option!r}: negative partition {partition}")
            out.append((str(topic), partition, off))
    return OffsetSpec("specific", tuple(sorted(out)))


def _offset_spec(
    options: Mapping[str, str], name: str, default: str, *, allow_earliest: bool = True
) -> OffsetSpec:
    raw = _get(options, name)
    if raw is None:
        return OffsetSpec(default)
    lowered = raw.strip().lower()
    if lowered == "latest":
        return OffsetSpec("latest")
    if lowered == "earliest":
        if not allow_earliest:
            raise OptionError(f"option {name!r} cannot be 'earliest'")
        return OffsetSpec("earliest")
    return parse_offsets_json(raw, name, allow_earliest=allow_earliest)


def source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Parse the options of ``spark.read`` (batch) or ``spark.readStream`` (streaming)."""
    bootstrap = _bootstrap(options)
    subscription = _subscription(options)
    starting = _offset_spec(options, "startingOffsets", "latest" if streaming else "earliest")
    ts_raw = _get(options, "startingTimestamp")
    if ts_raw is not None:
        try:
            ts = int(ts_raw)
        except ValueError:
            raise OptionError(f"option 'startingTimestamp' must be milliseconds, not {ts_raw!r}")
        if ts < 0:
            raise OptionError("option 'startingTimestamp' must be >= 0")
        starting = OffsetSpec("timestamp", timestamp_ms=ts)  # wins over startingOffsets
    if starting.kind == "specific" and subscription.pattern is None:
        extra = {t for t, _, _ in starting.offsets} - set(subscription.topics)
        if extra:
            raise OptionError(
                f"option 'startingOffsets' names topics not subscribed: {', '.join(sorted(extra))}"
            )
    if streaming:
        if _get(options, "endingOffsets") is not None:
            raise OptionError("option 'endingOffsets' is for batch reads only")
        ending = OffsetSpec("latest")
    else:
        if starting.kind == "latest":
            raise OptionError(
                "startingOffsets='latest' is for streaming only (a batch read "
                "from latest would read nothing)"
            )
        ending = _offset_spec(options, "endingOffsets", "latest", allow_earliest=False)
    strategy = (_get(options, "startingOffsetsByTimestampStrategy") or "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError("option 'startingOffsetsByTimestampStrategy' must be error or latest")
    group = _get(options, "groupId")
    if group is not None and not group.strip():
        raise OptionError("option 'groupId' must not be empty")
    isolation = (
        (_get(options, "isolationLevel", "kafka.isolation.level") or ISOLATION_LEVELS[0])
        .strip()
        .lower()
    )
    if isolation not in ISOLATION_LEVELS:
        raise OptionError("option 'isolationLevel' must be read_committed or read_uncommitted")
    return SourceOptions(
        bootstrap=bootstrap,
        subscription=subscription,
        starting=starting,
        ending=ending,
        timestamp_strategy=strategy,
        max_records_per_trigger=_positive_int(
            options, "maxRecordsPerTrigger", "maxOffsetsPerTrigger"
        ),
        min_partitions=_positive_int(options, "minPartitions"),
        max_records_per_partition=_positive_int(options, "maxRecordsPerPartition"),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        group_id=group.strip() if group is not None else None,
        poll_timeout_ms=_positive_int(options, "pollTimeoutMs") or DEFAULT_POLL_TIMEOUT_MS,
        max_partition_fetch_bytes=(
            _positive_int(options, "maxPartitionFetchBytes") or DEFAULT_PARTITION_FETCH_BYTES
        ),
        isolation_level=isolation,
    )


def sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Parse the options of ``df.write`` / ``df.writeStream`` in the logmq format."""
    bootstrap = _bootstrap(options)
    topic = _get(options, "topic")
    if topic is not None:
        topic = topic.strip()
        if not topic or "," in topic:
            raise OptionError("option 'topic' of the logmq sink takes exactly one topic name")
    acks = (_get(options, "acks") or "all").strip().lower()
    if acks not in ("all", "-1", "1"):
        raise OptionError("option 'acks' must be 'all' or '1' (acks=0 could lose records)")
    compression = (_get(options, "compression") or "none").strip().lower()
    try:
        Compression.parse(compression)
    except (ValueError, KeyError) as e:
        raise OptionError(f"option 'compression': {e}")
    producer: dict[str, int | str] = {}
    for name, key in (("lingerMs", "linger_ms"), ("batchSize", "batch_size")):
        value = _positive_int(options, name)
        if value is not None:
            producer[key] = value
    partitioner = _get(options, "partitioner")
    if partitioner is not None:  # murmur2 (Kafka's, the default) or the old xxh3
        partitioner = partitioner.strip().lower()
        try:
            partitioner_named(partitioner)
        except ValueError as e:
            raise OptionError(f"option 'partitioner': {e}") from None
        producer["partitioner"] = partitioner
    exactly_once = _bool(options, "exactlyOnce", False)
    prefix = (_get(options, "transactionalIdPrefix") or DEFAULT_TXN_PREFIX).strip()
    if not prefix:
        raise OptionError("option 'transactionalIdPrefix' must not be empty")
    if exactly_once and acks != "all" and acks != "-1":
        raise OptionError("option 'exactlyOnce' needs acks=all (transactions require it)")
    return SinkOptions(
        bootstrap=bootstrap,
        topic=topic,
        acks="all" if acks in ("all", "-1") else "1",
        compression=compression,
        producer=producer,
        exactly_once=exactly_once,
        transactional_id_prefix=prefix,
        transaction_timeout_ms=(
            _positive_int(options, "transactionTimeoutMs") or DEFAULT_TXN_TIMEOUT_MS
        ),
    )
