from __future__ import annotations

import pytest

from logmq.errors import InvalidConfigError
from logmq.storage.config import (
    STORED_CONFIG_KEYS,
    TOPIC_CONFIG_KEYS,
    LogConfig,
    is_list_config,
    is_stored_only,
    validate_remote_storage,
)


def test_defaults_match_kafka():
    c = LogConfig()
    assert c.segment_bytes == 1 << 30
    assert c.retention_ms == 7 * 24 * 3600 * 1000
    assert c.retention_bytes == -1 and c.flush_messages is None and not c.group_commit


def test_round_trip_and_merge():
    c = LogConfig.from_dict(
        {"segment.bytes": "4096", "flush.messages": "10", "group.commit": "true"}
    )
    assert (c.segment_bytes, c.flush_messages, c.group_commit) == (4096, 10, True)
    assert LogConfig.from_dict(c.to_dict()) == c
    m = c.merged({"retention.ms": "-1"})
    assert m.retention_ms == -1 and m.segment_bytes == 4096
    every = {k.name for k in TOPIC_CONFIG_KEYS} | {k.name for k in STORED_CONFIG_KEYS}
    assert every == set(c.to_dict())


@pytest.mark.parametrize(
    "bad",
    [
        {"no.such.key": "1"},
        {"segment.bytes": "abc"},
        {"segment.bytes": "10"},
        {"group.commit": "maybe"},
        {"cleanup.policy": "shred"},
        {"retention.ms": "-5"},
    ],
)
def test_bad_values_raise_clear_errors(bad):
    with pytest.raises(InvalidConfigError) as e:
        LogConfig.from_dict(bad)
    assert next(iter(bad)) in str(e.value)


def test_kafka_configs_logmq_does_not_act_on_are_kept_and_described():
    c = LogConfig.from_dict(
        {
            "message.format.version": "2.8",
            "preallocate": " TRUE ",
            "leader.replication.throttled.replicas": "0:1, 1:2",
            "compression.gzip.level": "-1",  # Kafka's default: not kept as an override
        }
    )
    d = c.to_dict()
    assert (d["message.format.version"], d["preallocate"]) == ("2.8", "true")
    assert d["leader.replication.throttled.replicas"] == "0:1,1:2"
    assert d["compression.gzip.level"] == "-1" and d["segment.jitter.ms"] == "0"
    assert LogConfig.from_dict(d) == c
    # a later override of a base's stored value wins, and the acted-on fields are untouched
    m = c.merged({"preallocate": "false", "retention.ms": "1000"})
    assert m.to_dict()["preallocate"] == "false" and m.retention_ms == 1000
    assert m.segment_bytes == LogConfig().segment_bytes
    assert is_list_config("cleanup.policy") and is_list_config(
        "follower.replication.throttled.replicas"
    )
    assert not is_list_config("retention.ms") and not is_list_config("no.such.key")


@pytest.mark.parametrize(
    "bad",
    [
        {"preallocate": "yes"},
        {"segment.jitter.ms": "1.5"},
        {"local.retention.ms": "-3"},
        {"compression.gzip.level": "0"},
        {"compression.zstd.level": "23"},
        {"compression.lz4.level": "9999999999"},  # past Kafka's 32-bit INT
        {"message.format.version": "4.0"},
        {"message.timestamp.after.max.ms": "-1"},
        {"leader.replication.throttled.replicas": "*,0:1"},
        {"log.retention.ms": "1"},  # a broker config, not a topic config
    ],
)
def test_stored_kafka_configs_are_type_checked_like_kafka(bad):
    with pytest.raises(InvalidConfigError) as e:
        LogConfig.from_dict(bad)
    assert next(iter(bad)) in str(e.value)


def test_tiered_storage_configs_are_typed_fields():
    c = LogConfig()
    assert not c.remote_storage_enable and not c.remote_copy_disable
    assert (c.local_retention_ms, c.local_retention_bytes) == (-2, -2)
    assert not c.remote_delete_on_disable
    t = LogConfig.from_dict(
        {
            "remote.storage.enable": "true",
            "local.retention.ms": "3600000",
            "local.retention.bytes": "-1",
            "remote.log.copy.disable": "false",
            "remote.log.delete.on.disable": "TRUE",
        }
    )
    assert t.remote_storage_enable and t.remote_delete_on_disable and t.copies_to_remote
    assert (t.local_retention_ms, t.local_retention_bytes) == (3_600_000, -1)
    d = t.to_dict()
    assert (d["remote.storage.enable"], d["local.retention.ms"]) == ("true", "3600000")
    assert LogConfig.from_dict(d) == t
    for key in ("remote.storage.enable", "local.retention.ms", "remote.log.copy.disable"):
        assert not is_stored_only(key)


@pytest.mark.parametrize(
    "bad",
    [
        {"remote.storage.enable": "yes"},
        {"local.retention.ms": "-3"},
        {"local.retention.bytes": str(1 << 63)},
        {"remote.log.copy.disable": "1"},
        {"remote.log.delete.on.disable": ""},
    ],
)
def test_tiered_storage_values_are_type_checked(bad):
    with pytest.raises(InvalidConfigError) as e:
        LogConfig.from_dict(bad)
    assert next(iter(bad)) in str(e.value)


def tiered(**overrides: str) -> LogConfig:
    cfg = {"remote.storage.enable": "true"}
    cfg.update({k.replace("_", "."): v for k, v in overrides.items()})
    return LogConfig.from_dict(cfg)


def test_effective_local_retention():
    day = 24 * 3600 * 1000
    # -2 follows the total retention
    t = tiered(retention_ms=str(7 * day), retention_bytes="1000000")
    assert (t.effective_local_retention_ms, t.effective_local_retention_bytes) == (7 * day, 10**6)
    t = tiered(local_retention_ms=str(day), local_retention_bytes="5000")
    assert (t.effective_local_retention_ms, t.effective_local_retention_bytes) == (day, 5000)
    # copying stopped: nothing more reaches the tier, the local log keeps the total
    stopped = t.merged({"remote.log.copy.disable": "true"})
    assert not stopped.copies_to_remote
    assert stopped.effective_local_retention_ms == t.retention_ms
    assert stopped.effective_local_retention_bytes == t.retention_bytes
    # no tier at all: local.retention.* means nothing
    local_only = LogConfig.from_dict({"local.retention.ms": "1000", "retention.ms": "5000"})
    assert local_only.effective_local_retention_ms == 5000


def test_remote_storage_needs_the_brokers_tier():
    with pytest.raises(InvalidConfigError, match=r"remote\.log\.storage\.system\.enable"):
        validate_remote_storage(tiered(), None, system_enabled=False)
    validate_remote_storage(tiered(), None, system_enabled=True)
    # a topic without remote storage is fine either way
    validate_remote_storage(LogConfig(), None, system_enabled=False)
    validate_remote_storage(LogConfig(), LogConfig(), system_enabled=False)


@pytest.mark.parametrize("policy", ["compact", "compact,delete", "delete,compact"])
def test_compacted_topics_cannot_have_remote_storage(policy):
    with pytest.raises(InvalidConfigError, match="compact") as e:
        validate_remote_storage(tiered(cleanup_policy=policy), None, True)
    assert "remote.storage.enable" in str(e.value) and "cleanup.policy" in str(e.value)
    # without remote storage compaction is of course allowed
    validate_remote_storage(LogConfig.from_dict({"cleanup.policy": policy}), None, True)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"retention_ms": "1000", "local_retention_ms": "1001"}, "local.retention.ms"),
        ({"retention_ms": "1000", "local_retention_ms": "-1"}, "local.retention.ms"),
        ({"retention_bytes": "1000", "local_retention_bytes": "1001"}, "local.retention.bytes"),
        ({"retention_bytes": "1000", "local_retention_bytes": "-1"}, "local.retention.bytes"),
        (
            {"remote_log_copy_disable": "true", "local_retention_ms": "1000"},
            "local.retention.ms",
        ),
        (
            {
                "remote_log_copy_disable": "true",
                "retention_bytes": "5000",
                "local_retention_bytes": "4000",
            },
            "local.retention.bytes",
        ),
    ],
)
def test_local_retention_bounded_by_total(overrides, named):
    with pytest.raises(InvalidConfigError, match=named.replace(".", r"\.")):
        validate_remote_storage(tiered(**overrides), None, True)


@pytest.mark.parametrize(
    "overrides",
    [
        {"retention_ms": "1000", "local_retention_ms": "1000"},
        {"retention_ms": "1000", "local_retention_ms": "-2"},
        {"retention_ms": "-1", "local_retention_ms": "-1"},
        {"retention_ms": "-1", "local_retention_ms": "99999999"},
        {"retention_bytes": "-1", "local_retention_bytes": "-1"},
        {"retention_bytes": "1000", "local_retention_bytes": "0"},
        {"remote_log_copy_disable": "true"},
        {"remote_log_copy_disable": "true", "retention_ms": "500", "local_retention_ms": "500"},
    ],
)
def test_local_retention_that_kafka_accepts(overrides):
    validate_remote_storage(tiered(**overrides), None, True)


def test_turning_remote_storage_off_needs_delete_on_disable():
    on = tiered()
    off = on.merged({"remote.storage.enable": "false"})
    with pytest.raises(InvalidConfigError, match=r"remote\.log\.delete\.on\.disable=true") as e:
        validate_remote_storage(off, on, True)
    assert "remote.log.copy.disable=true" in str(e.value)  # the read-only alternative
    # also when the broker's tier has since been turned off
    with pytest.raises(InvalidConfigError, match=r"remote\.log\.delete\.on\.disable"):
        validate_remote_storage(off, on, False)
    validate_remote_storage(off.merged({"remote.log.delete.on.disable": "true"}), on, True)
    validate_remote_storage(off.merged({"remote.log.delete.on.disable": "true"}), on, False)
    # read-only tier instead: still enabled, copying stopped
    validate_remote_storage(on.merged({"remote.log.copy.disable": "true"}), on, True)
    # never enabled: nothing to delete
    validate_remote_storage(LogConfig(), LogConfig(), True)
    validate_remote_storage(LogConfig(), None, True)
