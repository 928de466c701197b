"""What DescribeConfigs shows, for both front doors: a topic's effective configs and
the broker's settings, each marked default or overridden."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from logmq.storage.config import LogConfig

if TYPE_CHECKING:
    from logmq.broker.config import BrokerConfig


@dataclass(frozen=True, slots=True)
class ConfigView:
    name: str
    value: str | None
    default: bool  # not overridden for this topic (the broker-wide default applies)
    read_only: bool


def topic_configs(
    topic_defaults: Mapping[str, str], overrides: Mapping[str, str]
) -> list[ConfigView]:
    """Every topic config's effective value, by name."""
    base = LogConfig.from_dict(dict(topic_defaults))
    defaults = base.to_dict()
    effective = base.merged(dict(overrides)).to_dict()
    return [
        ConfigView(
            key,
            None if value is None else str(value),
            key not in overrides and defaults.get(key) == value,
            False,
        )
        for key, value in sorted(effective.items())
    ]


def broker_configs(cfg: BrokerConfig) -> list[ConfigView]:
    """The broker's settings, read-only (they change with a restart)."""
    out = []
    for name in cfg.field_names():
        if name == "topic_defaults":
            continue
        value = getattr(cfg, name)
        out.append(
            ConfigView(name.replace("_", "."), None if value is None else str(value), False, True)
        )
    return out
