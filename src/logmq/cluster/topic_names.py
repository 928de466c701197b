"""Topic names and per-topic limits: the rules the controller enforces and both front
doors check before they ask it (so a bad name is answered without a round trip)."""

from __future__ import annotations

import re

MAX_TOPIC_NAME = 249
# Every partition is a directory with open files: a client asking for millions must get
# an error, not a broker busy creating them.
MAX_PARTITIONS_PER_TOPIC = 10_000
INTERNAL_PREFIX = "__"
_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")


def topic_name_error(name: object) -> str | None:
    """Why ``name`` is not a valid topic name, or None."""
    if not isinstance(name, str) or not name:
        return "topic name must be a non-empty string"
    if len(name) > MAX_TOPIC_NAME:
        return f"topic name longer than {MAX_TOPIC_NAME} characters"
    if name in (".", ".."):
        return "topic name cannot be '.' or '..'"
    if not _TOPIC_NAME.match(name):
        return "topic name may only contain ASCII letters, digits, '.', '_' and '-'"
    return None


def is_internal(name: str) -> bool:
    return name.startswith(INTERNAL_PREFIX)
