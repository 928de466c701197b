"""Small helpers for building kio response objects, shared by the Kafka handlers."""

from __future__ import annotations

import datetime
import sys
from typing import Any

from kio.schema.errors import ErrorCode as KioErrorCode
from kio.static.primitive import i32Timedelta

from logmq.errors import ErrorCode

NO_THROTTLE = i32Timedelta.parse(datetime.timedelta(0))  # throttle_time: never throttled
UNKNOWN_OPERATIONS = -2147483648  # authorized operations: not computed (no ACLs)


def build(cls: type, **fields: Any) -> Any:
    """``cls`` from the fields this version of it has (the others are dropped)."""
    known = cls.__dataclass_fields__  # type: ignore[attr-defined]
    return cls(**{k: v for k, v in fields.items() if k in known})


def millis(value: Any, default: int = 0) -> int:
    """Milliseconds of a kio duration field (a timedelta); ``default`` when absent."""
    if value is None:
        return default
    return int(value.total_seconds() * 1000)


def throttle_time(ms: int) -> Any:
    """A throttle time in milliseconds as kio's i32 duration."""
    return i32Timedelta.parse(datetime.timedelta(milliseconds=ms))


def kio_code(code: ErrorCode | int) -> KioErrorCode:
    """Kafka's error code for ours; a logmq-only code reads as UNKNOWN_SERVER_ERROR."""
    try:
        return KioErrorCode(int(code))
    except ValueError:
        return KioErrorCode.unknown_server_error


def response_module(entity: Any) -> Any:
    """The kio module of the response that answers request ``entity`` (same version)."""
    cls = entity if isinstance(entity, type) else type(entity)
    legacy = getattr(cls, "__response_module__", None)  # a version kio lacks (legacy.py)
    if legacy is not None:
        return legacy
    return sys.modules[cls.__module__.replace(".request", ".response")]
