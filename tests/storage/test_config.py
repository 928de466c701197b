from __future__ import annotations

import pytest

from logmq.errors import InvalidConfigError
from logmq.storage.config import (
    STORED_CONFIG_KEYS,
    TOPIC_CONFIG_KEYS,
    LogConfig,
    is_list_config,
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
        {"remote.storage.enable": "true"},  # no tiered storage, as a Kafka broker without it
        {"log.retention.ms": "1"},  # a broker config, not a topic config
    ],
)
def test_stored_kafka_configs_are_type_checked_like_kafka(bad):
    with pytest.raises(InvalidConfigError) as e:
        LogConfig.from_dict(bad)
    assert next(iter(bad)) in str(e.value)
