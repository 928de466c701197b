"""Pure-Python records section codec: the fallback for the ``_recordsv2`` C extension.

Same functions, results, exception types and messages as ``_recordsv2.c`` (the tests
check the two against each other); see that file and ``records_codec`` for the format.
"""

from __future__ import annotations

from operator import index
from typing import Any

_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_SSIZE_MAX = (1 << 63) - 1
_SMALL = [bytes([z]) for z in range(128)]


# ---- encoding ----


def _varint(n: int) -> bytes:
    z = n << 1 if n >= 0 else (~n << 1) | 1
    if z < 0x80:
        return _SMALL[z]
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _int(o: Any, bounds: tuple[int, int], what: str) -> int:
    v = index(o)
    if not bounds[0] <= v <= bounds[1]:
        raise OverflowError(f"{what} out of range")
    return v


def _data(o: Any, what: str) -> bytes | None:
    """A key, value or header part as bytes (None stays None), checked like the C code."""
    if o is None:
        return None
    if type(o) is not bytes:
        if isinstance(o, str):
            raise TypeError(f"{what} must be a bytes-like object or None, not {type(o).__name__}")
        try:
            mv = memoryview(o)
        except TypeError:
            raise TypeError(
                f"{what} must be a bytes-like object or None, not {type(o).__name__}"
            ) from None
        if not mv.c_contiguous:
            raise TypeError(f"{what} must be a C-contiguous buffer")
        o = mv.tobytes()
    if len(o) > _INT32[1]:
        raise ValueError(f"{what} is too large ({len(o)} bytes)")
    return o


def _put(out: bytearray, data: bytes | None) -> None:
    if data is None:
        out += b"\x01"  # zigzag(-1)
    else:
        out += _varint(len(data))
        out += data


def _headers(headers: Any) -> tuple:
    if isinstance(headers, str | bytes):
        raise TypeError("headers must be a sequence of (name, value) pairs or None")
    hs = tuple(headers)
    out = []
    for h in hs:
        if not isinstance(h, tuple | list) or len(h) != 2:
            raise TypeError("each header must be a (name, value) tuple or list")
        name, val = h
        if isinstance(name, str):
            name = name.encode()
        elif name is None:
            raise TypeError("header name must be str or bytes, not None")
        else:
            name = _data(name, "header name")
            name.decode()  # UnicodeDecodeError (a ValueError) for a name that is not UTF-8
        out.append((name, _data(val, "header value")))
    return tuple(out)


def _record(out: bytearray, od: int, td: int, key: Any, value: Any, headers: tuple) -> None:
    body = bytearray(b"\x00")  # attributes
    body += _varint(td)
    body += _varint(od)
    _put(body, key)
    _put(body, value)
    body += _varint(len(headers))
    for name, val in headers:
        _put(body, name)
        _put(body, val)
    if len(body) > _INT32[1]:
        raise ValueError(f"record too large ({len(body)} bytes)")
    out += _varint(len(body))
    out += body


def encode_rows(rows: Any) -> bytes:
    """Rows ``(offset_delta, timestamp_delta, key, value, headers)`` -> records section."""
    out = bytearray()
    for row in tuple(rows):
        if not isinstance(row, tuple | list) or len(row) != 5:
            raise TypeError(
                "each row must be a tuple or list "
                "(offset_delta, timestamp_delta, key, value, headers)"
            )
        od, td, key, value, headers = row
        od = _int(od, _INT32, "offset_delta")
        td = _int(td, _INT64, "timestamp_delta")
        key = _data(key, "key")
        value = _data(value, "value")
        _record(out, od, td, key, value, () if headers is None else _headers(headers))
    return bytes(out)


def encode_values(values: Any, keys: Any = None) -> bytes:
    """Record i: offset_delta i, timestamp_delta 0, key ``keys[i]`` (or None), ``values[i]``."""
    values = tuple(values)
    n = len(values)
    if keys is not None:
        keys = tuple(keys)
        if len(keys) != n:
            raise ValueError(f"{len(keys)} keys for {n} values")
    if n - 1 > _INT32[1]:
        raise OverflowError("offset_delta out of range")
    out = bytearray()
    for i, v in enumerate(values):
        key = None if keys is None else _data(keys[i], "key")
        _record(out, i, 0, key, _data(v, "value"), ())
    return bytes(out)


# ---- decoding ----


def _vget(buf: memoryview, pos: int, end: int, maxb: int, i: int, field: str) -> tuple[int, int]:
    u = 0
    for k in range(maxb):
        if pos >= end:
            raise ValueError(f"record {i}: {field}: truncated varint")
        b = buf[pos]
        pos += 1
        u |= (b & 0x7F) << (7 * k)
        if not b & 0x80:
            if (maxb == 5 and u > 0xFFFFFFFF) or (k == 9 and b > 1):
                raise ValueError(f"record {i}: {field}: varint out of range")
            return (u >> 1) ^ -(u & 1), pos
    raise ValueError(f"record {i}: {field}: varint longer than {maxb} bytes")


def _part(
    buf: memoryview, pos: int, end: int, i: int, field: str, nullable: bool
) -> tuple[bytes | None, int]:
    n, pos = _vget(buf, pos, end, 5, i, field)
    if n < -1 or (n == -1 and not nullable):
        raise ValueError(f"record {i}: {field}: invalid length {n}")
    if n > end - pos:
        raise ValueError(f"record {i}: {field}: length {n} runs past the end of the record")
    if n == -1:
        return None, pos
    return buf[pos : pos + n].tobytes(), pos + n


def decode_rows(buf: Any, count: int) -> list[tuple]:
    """The ``count`` records in ``buf`` -> ``(offset_delta, timestamp_delta, key, value,
    headers)`` tuples; headers is None or a tuple of ``(name: str, value)``. Any
    malformation raises ValueError."""
    if isinstance(buf, str):
        raise TypeError(f"decode_rows() argument 1 must be bytes-like, not {type(buf).__name__}")
    mv = memoryview(buf)
    if not mv.c_contiguous:
        raise TypeError("decode_rows() argument 1 must be a contiguous buffer")
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    count = index(count)
    if not -_SSIZE_MAX - 1 <= count <= _SSIZE_MAX:
        raise OverflowError("Python int too large to convert to C ssize_t")
    end = len(mv)
    if count < 0:
        raise ValueError(f"record count {count} is negative")
    if count > end // 7:  # the smallest record is 7 bytes
        raise ValueError(f"{end} bytes cannot hold {count} records")
    rows = []
    pos = 0
    for i in range(count):
        if pos == end:
            raise ValueError(f"buffer ends after {i} of {count} records")
        length, pos = _vget(mv, pos, end, 5, i, "length")
        if length < 0 or length > end - pos:
            raise ValueError(
                f"record {i}: length {length} is negative or runs past the end of the buffer"
            )
        start, rend = pos, pos + length
        if length < 1:
            raise ValueError(f"record {i}: attributes: truncated")
        pos += 1  # attributes: unused in v2 records
        td, pos = _vget(mv, pos, rend, 10, i, "timestamp delta")
        od, pos = _vget(mv, pos, rend, 5, i, "offset delta")
        key, pos = _part(mv, pos, rend, i, "key", True)
        value, pos = _part(mv, pos, rend, i, "value", True)
        hn, pos = _vget(mv, pos, rend, 5, i, "header count")
        if hn < 0 or hn > (rend - pos) // 2:  # a header is at least 2 bytes
            raise ValueError(
                f"record {i}: header count {hn} is negative or runs past the end of the record"
            )
        headers = None
        if hn:
            hs = []
            for _ in range(hn):
                name, pos = _part(mv, pos, rend, i, "header key", False)
                try:
                    name = name.decode()
                except UnicodeDecodeError:
                    raise ValueError(f"record {i}: header key is not valid UTF-8") from None
                hval, pos = _part(mv, pos, rend, i, "header value", True)
                hs.append((name, hval))
            headers = tuple(hs)
        if pos != rend:
            raise ValueError(f"record {i}: length {length} but its fields use {pos - start} bytes")
        rows.append((od, td, key, value, headers))
    if pos != end:
        raise ValueError(f"{end - pos} trailing bytes after {count} records")
    return rows
