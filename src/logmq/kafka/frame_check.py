"""Bounds a Kafka request's every length and count before kio's native reader sees it.

kio's compiled reader allocates an array's count before reading its elements, so a
few-dozen-byte frame claiming four billion elements aborts the whole process (a Rust
allocation failure, which no ``except`` catches). This module walks the frame's structure
first, from the same schemas kio decodes with, and refuses any length or count the bytes
left cannot hold: every array is checked as ``count * smallest element`` against what
remains, every string and byte string against what remains, tagged fields inside their
declared size. It also refuses what Kafka's own readers refuse: a null where the schema
allows none, a negative length other than the null marker, a varint over five bytes, and
(as Kafka 4.4 does) an array of more than 1,000,000 elements or a tagged-field section of
more than 10,000 fields, however many bytes follow (net/limits.py).

Tagged fields the schema does not know (a newer client's, KIP-482) are skipped, as
Kafka's readers skip them: kio refuses them, so ``check_request`` notes where each
section's unknown fields lie and ``without_unknown_tags`` returns the frame without them
(a copy, made only for such a frame). Sections inside a known tagged field's value keep
theirs (kio then refuses the request): no client sends them.

A checker per message class is generated once as Python source (fixed-size runs become
one addition, so a Fetch of 10,000 partitions costs one step per partition, not one per
field) and cached; docs/design.md has the measured cost per request. Only the shape is
checked: values (UTF-8, enum ranges) are kio's to refuse, with ordinary exceptions.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from functools import cache
from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    is_optional,
)

from logmq.errors import InvalidFrameError
from logmq.kafka.fetch_response import uvarint
from logmq.net.limits import MAX_ARRAY_ELEMENTS, MAX_TAGGED_FIELDS

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

# Wire sizes of kio's fixed-size kafka_types.
FIXED_SIZE = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "uuid": 16,
    "timedelta_i32": 4,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "error_code": 2,
}
_VARIABLE = frozenset({"string", "bytes", "records"})
MAX_VARINT_BYTES = 5  # lengths and counts are unsigned 32-bit varints

Checker = Callable[[Any, int, int], int]


class FrameShapeError(InvalidFrameError, ValueError):
    """The frame's structure is not what its API and version define (says where)."""


# Where the running check notes the unknown tagged fields it skipped (None: not noting,
# or inside a known tagged field's value). One check runs at a time: decoding is
# synchronous on the event loop.
_unknown: list[UnknownTags] | None = None

# (the section's count varint: start, end, count), then the skipped fields' spans
UnknownTags = tuple[int, int, int, list[tuple[int, int]]]


def check_request(
    cls: type, buf: Any, pos: int, end: int, unknown: list[UnknownTags] | None = None
) -> int:
    """Check one ``cls`` entity at ``buf[pos:end]``; return where it ends. ``unknown``
    gets the tagged-field sections holding fields the schema does not know."""
    global _unknown
    _unknown = unknown
    try:
        return checker(cls)(buf, pos, end)
    finally:
        _unknown = None


def without_unknown_tags(buf: Any, unknown: list[UnknownTags]) -> bytes:
    """``buf`` with the fields ``unknown`` notes removed and their sections' counts
    rewritten: what kio can read, meaning what Kafka's reader would."""
    out = bytearray()
    at = 0
    for count_start, count_end, count, spans in sorted(unknown):
        out += buf[at:count_start]
        out += uvarint(count - len(spans))
        at = count_end
        for start, stop in spans:
            out += buf[at:start]
            at = stop
    out += buf[at:]
    return bytes(out)


# -- primitives the generated code calls ------------------------------------------------


def _short(what: str, need: int, left: int) -> FrameShapeError:
    return FrameShapeError(f"{what}: needs {need} bytes, {max(left, 0)} left")


def _uvarint(b: Any, p: int, e: int) -> tuple[int, int]:
    value = shift = 0
    for i in range(MAX_VARINT_BYTES):
        if p >= e:
            raise FrameShapeError("varint runs past the end of the frame")
        byte = b[p]
        p += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, p
        shift += 7
        if i == MAX_VARINT_BYTES - 1:
            break
    raise FrameShapeError("varint longer than 5 bytes")


def _too_many(what: str, n: int, left: int) -> FrameShapeError:
    if n > MAX_ARRAY_ELEMENTS:
        return FrameShapeError(
            f"{what}: {n} elements, over the limit of {MAX_ARRAY_ELEMENTS:,} per array"
        )
    return FrameShapeError(f"{what}: {n} elements cannot fit in {left} bytes")


def _null(what: str) -> FrameShapeError:
    return FrameShapeError(f"{what}: null (not nullable)")


def _lstr(b: Any, p: int, e: int, nullable: bool, what: str, width: int) -> int:
    """A legacy string (int16 length, ``width`` 2) or byte string (int32, ``width`` 4)."""
    if p + width > e:
        raise _short(what, width, e - p)
    n = (_I16 if width == 2 else _I32).unpack_from(b, p)[0]
    p += width
    if n < 0:
        if n == -1 and nullable:
            return p
        raise FrameShapeError(f"{what}: length {n}" + ("" if nullable else " (not nullable)"))
    if n > e - p:
        raise _short(what, n, e - p)
    return p + n


def _cstr(b: Any, p: int, e: int, nullable: bool, what: str) -> int:
    """A compact string or byte string (unsigned varint length + 1, 0 for null)."""
    n, p = _uvarint(b, p, e)
    if n == 0:
        if nullable:
            return p
        raise FrameShapeError(f"{what}: null (not nullable)")
    n -= 1
    if n > e - p:
        raise _short(what, n, e - p)
    return p + n


def _larr(b: Any, p: int, e: int, nullable: bool, what: str, least: int) -> tuple[int, int]:
    """A legacy array's count (int32, -1 for null), checked against the bytes left."""
    if p + 4 > e:
        raise _short(what, 4, e - p)
    n = _I32.unpack_from(b, p)[0]
    p += 4
    if n < 0:
        if n == -1 and nullable:
            return 0, p
        raise FrameShapeError(f"{what}: count {n}" + ("" if nullable else " (not nullable)"))
    if n * least > e - p or n > MAX_ARRAY_ELEMENTS:
        raise _too_many(what, n, e - p)
    return n, p


def _struct_marker(b: Any, p: int, e: int, what: str) -> tuple[bool, int]:
    """A nullable struct's int8 marker: -1 null, 1 present."""
    if p >= e:
        raise _short(what, 1, 0)
    marker = b[p]
    if marker == 0xFF:
        return False, p + 1
    if marker == 1:
        return True, p + 1
    raise FrameShapeError(f"{what}: null marker {marker}")


def _tags(b: Any, p: int, e: int, known: dict[int, Checker], what: str) -> int:
    """Tagged fields: each inside its declared size; known ones checked within it,
    unknown ones noted (``check_request``) to be skipped."""
    global _unknown
    count_start = p
    n, p = _uvarint(b, p, e)
    if n > MAX_TAGGED_FIELDS:
        raise FrameShapeError(f"{what}: {n} tagged fields, over the limit of {MAX_TAGGED_FIELDS:,}")
    if n * 2 > e - p:
        raise FrameShapeError(f"{what}: {n} tagged fields cannot fit in {e - p} bytes")
    count_end = p
    skipped: list[tuple[int, int]] = []
    for _ in range(n):
        field_start = p
        tag, p = _uvarint(b, p, e)
        size, p = _uvarint(b, p, e)
        if size > e - p:
            raise _short(f"{what} tag {tag}", size, e - p)
        check = known.get(tag)
        if check is not None:
            noting, _unknown = _unknown, None  # inside a value: not skippable here
            try:
                check(b, p, p + size)
            finally:
                _unknown = noting
        else:
            skipped.append((field_start, p + size))
        p += size
    if skipped and _unknown is not None:
        _unknown.append((count_start, count_end, n, skipped))
    return p


_RUNTIME = {
    "_uvarint": _uvarint,
    "_short": _short,
    "_too_many": _too_many,
    "_null": _null,
    "_lstr": _lstr,
    "_cstr": _cstr,
    "_larr": _larr,
    "_struct_marker": _struct_marker,
    "_tags": _tags,
    "FrameShapeError": FrameShapeError,
}


# -- the generator --------------------------------------------------------------------


def _kafka_type(f: dataclasses.Field) -> str:
    kafka_type = f.metadata.get("kafka_type")
    if kafka_type is None:
        raise TypeError(f"field {f.name} has no kafka_type")
    if kafka_type not in FIXED_SIZE and kafka_type not in _VARIABLE:
        raise TypeError(f"field {f.name}: unknown kafka_type {kafka_type!r}")
    return kafka_type


def _legacy_string_field(cls: type, f: dataclasses.Field) -> bool:
    # Every request header's client_id is a legacy string, in flexible headers too.
    return f.name == "client_id" and cls.__name__ == "RequestHeader"


@cache
def smallest(cls: type) -> int:
    """The fewest bytes one ``cls`` entity can take on the wire."""
    flexible = getattr(cls, "__flexible__", False)
    total = 1 if flexible else 0  # the tagged-field count
    for f in dataclasses.fields(cls):
        if not f.init or (flexible and "tag" in f.metadata):
            continue
        total += _smallest_field(cls, f, flexible)
    return total


def _smallest_field(cls: type, f: dataclasses.Field, flexible: bool) -> int:
    kind = classify_field(f)
    if kind.is_array:
        return 1 if flexible else 4
    if isinstance(kind, EntityField):
        return 1 if is_optional(f) else smallest(kind.type_)
    kafka_type = _kafka_type(f)
    if kafka_type in FIXED_SIZE:
        return FIXED_SIZE[kafka_type]
    if kafka_type == "string":
        return 2 if (not flexible or _legacy_string_field(cls, f)) else 1
    return 1 if flexible else 4


class _Source:
    """Lines of one generated checker, with fixed-size runs folded into one addition.

    Nested structs are generated inline (a call per element would cost more than the
    element's own checks) and the common one-byte varints and empty tag sections take
    a fast path; everything rarer calls the helpers above.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.pending = 0
        self.names: dict[str, Any] = {}
        self.depth = 0

    def fixed(self, n: int) -> None:
        self.pending += n

    def flush(self, ind: str, what: str) -> None:
        if self.pending:
            self.lines.append(f"{ind}p += {self.pending}")
            self.lines.append(f"{ind}if p > e:")
            self.lines.append(f"{ind}    raise _short({what!r}, p - e, 0)")
            self.pending = 0

    def ref(self, value: Any) -> str:
        name = f"_r{len(self.names)}"
        self.names[name] = value
        return name

    def uvarint(self, ind: str, var: str) -> None:
        """``var`` = the unsigned varint at ``p``, one-byte values without a call."""
        self.lines += [
            f"{ind}{var} = b[p] if p < e else 128",
            f"{ind}if {var} & 128:",
            f"{ind}    {var}, p = _uvarint(b, p, e)",
            f"{ind}else:",
            f"{ind}    p += 1",
        ]

    def compact(self, ind: str, var: str, then: list[str], nullable: bool, what: str) -> None:
        """A compact length or count (a varint of the value + 1, 0 for null) into
        ``var``; the lines ``then`` run when it is not null."""
        self.uvarint(ind, var)
        self.lines.append(f"{ind}if {var}:")
        self.lines += [f"{ind}    {line}" for line in then]
        if not nullable:
            self.lines += [f"{ind}else:", f"{ind}    raise _null({what!r})"]


def _emit_entity(src: _Source, cls: type, ind: str) -> None:
    """Inline checks of one ``cls`` entity starting at ``p``."""
    flexible = getattr(cls, "__flexible__", False)
    tagged: dict[int, Checker] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if flexible and "tag" in f.metadata:
            tagged[int(f.metadata["tag"])] = _field_checker(cls, f)
            continue
        _emit_field(src, cls, f, flexible, ind)
    src.flush(ind, cls.__name__)
    if flexible:
        what = f"{cls.__name__} tags"
        src.lines += [
            f"{ind}if p < e and not b[p]:",
            f"{ind}    p += 1",
            f"{ind}else:",
            f"{ind}    p = _tags(b, p, e, {src.ref(tagged)}, {what!r})",
        ]


def _emit_count(
    src: _Source, ind: str, var: str, flexible: bool, nullable: bool, what: str, least: int
) -> None:
    """``var`` = an array's element count, checked against the bytes left."""
    if not flexible:
        src.lines.append(f"{ind}{var}, p = _larr(b, p, e, {nullable}, {what!r}, {least})")
        return
    then = [
        f"{var} -= 1",
        f"if {var} * {least} > e - p or {var} > {MAX_ARRAY_ELEMENTS}:",
        f"    raise _too_many({what!r}, {var}, e - p)",
    ]
    src.compact(ind, var, then, nullable, what)


def _emit_field(src: _Source, cls: type, f: dataclasses.Field, flexible: bool, ind: str) -> None:
    what = f"{cls.__name__}.{f.name}"
    kind = classify_field(f)
    nullable = is_optional(f)
    if kind.is_array:
        src.flush(ind, what)
        var = f"n{src.depth}"
        if isinstance(kind, EntityTupleField):
            elem = kind.type_
            least = max(smallest(elem), 1)
            _emit_count(src, ind, var, flexible, nullable, what, least)
            if _fixed_size(elem) is not None:
                src.lines.append(f"{ind}p += {var} * {least}")
            else:
                src.lines.append(f"{ind}for _ in range({var}):")
                src.depth += 1
                _emit_entity(src, elem, ind + "    ")
                src.depth -= 1
            return
        assert isinstance(kind, PrimitiveTupleField)
        kafka_type = _kafka_type(f)
        if kafka_type in FIXED_SIZE:
            size = FIXED_SIZE[kafka_type]
            _emit_count(src, ind, var, flexible, nullable, what, size)
            src.lines.append(f"{ind}p += {var} * {size}")
            return
        least = 1 if flexible else (2 if kafka_type == "string" else 4)
        _emit_count(src, ind, var, flexible, nullable, what, least)
        src.lines.append(f"{ind}for _ in range({var}):")
        src.lines.append(f"{ind}    {_variable_call(kafka_type, flexible, False, what)}")
        return
    if isinstance(kind, EntityField):
        src.flush(ind, what)
        if nullable:
            src.lines.append(f"{ind}present, p = _struct_marker(b, p, e, {what!r})")
            src.lines.append(f"{ind}if present:")
            ind += "    "
        src.lines.append(f"{ind}p = {src.ref(checker(kind.type_))}(b, p, e)")
        return
    kafka_type = _kafka_type(f)
    if kafka_type in FIXED_SIZE:
        src.fixed(FIXED_SIZE[kafka_type])
        return
    src.flush(ind, what)
    if not flexible or _legacy_string_field(cls, f):
        src.lines.append(f"{ind}{_variable_call(kafka_type, False, nullable, what)}")
        return
    then = ["p += c - 1", "if p > e:", f"    raise _short({what!r}, p - e, 0)"]
    src.compact(ind, "c", then, nullable, what)


def _variable_call(kafka_type: str, compact: bool, nullable: bool, what: str) -> str:
    if compact:
        return f"p = _cstr(b, p, e, {nullable}, {what!r})"
    width = 2 if kafka_type == "string" else 4
    return f"p = _lstr(b, p, e, {nullable}, {what!r}, {width})"


@cache
def _fixed_size(cls: type) -> int | None:
    """The wire size of ``cls`` when every field is fixed-size (and it has no tags)."""
    if getattr(cls, "__flexible__", False):
        return None
    total = 0
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        kind = classify_field(f)
        if kind.is_array or isinstance(kind, EntityField):
            return None
        kafka_type = _kafka_type(f)
        if kafka_type not in FIXED_SIZE:
            return None
        total += FIXED_SIZE[kafka_type]
    return total


@cache
def checker(cls: type) -> Checker:
    """The generated checker of one message class: ``(buf, pos, end) -> end of entity``."""
    src = _Source()
    _emit_entity(src, cls, "    ")
    return _compile(src, f"{cls.__module__}.{cls.__name__}")


def _field_checker(cls: type, f: dataclasses.Field) -> Checker:
    """A checker for one tagged field's value, run inside the tag's declared size."""
    src = _Source()
    _emit_field(src, cls, f, True, "    ")
    src.flush("    ", f"{cls.__name__}.{f.name}")
    return _compile(src, f"tag {cls.__name__}.{f.name}")


def _compile(src: _Source, name: str) -> Checker:
    body = "\n".join(src.lines) or "    pass"
    code = f"def check(b, p, e):\n{body}\n    return p\n"
    namespace = dict(_RUNTIME, **src.names)
    exec(compile(code, f"<frame_check {name}>", "exec"), namespace)
    return namespace["check"]
