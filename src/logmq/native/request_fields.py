"""Typed access to request bodies: a malformed body becomes INVALID_REQUEST, never a crash.

Bodies are whatever msgpack a client sent; handlers read fields through these helpers so
a missing key or a wrong type turns into a clear error answer naming the field.
"""

from __future__ import annotations

from typing import Any

from logmq.errors import ErrorCode, LogMQError


class InvalidRequestError(LogMQError):
    code = ErrorCode.INVALID_REQUEST


_MISSING: Any = object()


def req_field(body: Any, key: str, typ: type | tuple[type, ...], default: Any = _MISSING) -> Any:
    """``body[key]`` checked against ``typ`` (bool is not accepted as int)."""
    if not isinstance(body, dict):
        raise InvalidRequestError(f"expected a map around {key!r}, got {type(body).__name__}")
    if key not in body or (body[key] is None and default is not _MISSING):
        if default is _MISSING:
            raise InvalidRequestError(f"missing field {key!r}")
        return default
    value = body[key]
    types = typ if isinstance(typ, tuple) else (typ,)
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
        names = "/".join(t.__name__ for t in types)
        raise InvalidRequestError(f"field {key!r} must be {names}, got {type(value).__name__}")
    return value


def req_int(body: Any, key: str, default: Any = _MISSING) -> int:
    return req_field(body, key, int, default)


def req_list(body: Any, key: str, default: Any = _MISSING) -> list:
    return req_field(body, key, list, default)


def req_str(body: Any, key: str, default: Any = _MISSING) -> str:
    return req_field(body, key, str, default)


def req_str_map(body: Any, key: str) -> dict[str, str]:
    raw = req_field(body, key, dict, {})
    for k, v in raw.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidRequestError(f"{key!r} must map strings to strings")
    return raw
