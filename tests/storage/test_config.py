from __future__ import annotations

import pytest

from logmq.errors import InvalidConfigError
from logmq.storage.config import TOPIC_CONFIG_KEYS, LogConfig


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
    assert {k.name for k in TOPIC_CONFIG_KEYS} == set(c.to_dict())


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
