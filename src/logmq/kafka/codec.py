"""The Kafka wire protocol's frames: requests in, response heads out. Sans-IO.

Message types come from ``kio`` (every Kafka message and version, generated from
Kafka's own schemas, parsed by compiled code): a request frame becomes a ``Request``
whose body is the kio entity of its API and version. A handler answers a ``Reply``
whose body is a kio response entity, or ``bytes`` already encoded (Fetch encodes its
own, so record bytes can leave as file regions: see fetch_response.py); either way
``encode_head`` adds the size prefix and the response header of the request's version.

Requests this broker cannot read get Kafka's answers instead of a dropped connection:
an ApiVersions request of an unknown version is answered in v0 with
UNSUPPORTED_VERSION and the supported list (KIP-511), so the client retries with a
version both know; another API at a version not advertised gets UNSUPPORTED_VERSION in
that version's response; an API this broker does not serve, or a frame that does not
parse, an answer in the form every Kafka response header takes plus the error code
(clients close on it, as on a real broker's refusal).
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.serial import entity_reader, entity_writer
from kio.serial._introspect import EntityField, classify_field, is_optional
from kio.serial.readers import tz_aware_from_i64
from kio.static.primitive import i32Timedelta, i64, i64Timedelta

from logmq.errors import ErrorCode, InvalidFrameError
from logmq.kafka.frame_check import FrameShapeError, check_request, without_unknown_tags
from logmq.kafka.legacy import legacy_request, legacy_response
from logmq.kafka.versions import API_VERSIONS_KEY, api_versions_response
from logmq.net.codec import Request
from logmq.net.connection import ProtocolError
from logmq.net.reply import Reply

_HEADER = struct.Struct(">hhi")  # api_key, api_version, correlation_id
_SIZE = struct.Struct(">i")
_SIZE_CORR = struct.Struct(">ii")


class UnsupportedRequest(InvalidFrameError):
    """A well-formed header asking for an API or version this broker does not serve."""

    code = ErrorCode.UNSUPPORTED_VERSION

    def __init__(self, message: str, api_key: int, api_version: int) -> None:
        super().__init__(message)
        self.api_key = api_key
        self.api_version = api_version


Versions = Mapping[int, tuple[int, int]]


class KafkaWire:
    """The ``WireCodec`` (net/wire.py) of the Kafka listener: it refuses, before decoding,
    what ``served`` leaves out, and answers ApiVersions errors with ``advertised``
    (both from the door's registry, kafka/registry.py)."""

    __slots__ = ("advertised", "served")

    def __init__(self, advertised: Versions, served: Versions) -> None:
        self.advertised = advertised
        self.served = served

    def decode_request(self, frame: memoryview) -> Request:
        try:
            return self._decode(frame)
        except InvalidFrameError as e:
            e.client_id = peek_client_id(frame)  # type: ignore[attr-defined]  # for the log
            raise

    def _decode(self, frame: memoryview) -> Request:
        if len(frame) < _HEADER.size + 2:
            raise InvalidFrameError(f"request frame too short: {len(frame)} bytes")
        api_key, api_version, corr = _HEADER.unpack_from(frame, 0)
        versions = self.served.get(api_key)
        if versions is None:
            raise UnsupportedRequest(f"API key {api_key} is not supported", api_key, api_version)
        if not versions[0] <= api_version <= versions[1]:
            raise UnsupportedRequest(
                f"API key {api_key} version {api_version} is not supported "
                f"(versions {versions[0]}..{versions[1]})",
                api_key,
                api_version,
            )
        request_cls = _request_class(api_key, api_version)
        data = frame.toreadonly() if not frame.readonly else frame
        header_cls = request_cls.__header_schema__
        try:
            # kio's native reader trusts counts (a huge one aborts the process): every
            # length and count is bounded by the bytes left before it reads anything.
            end = len(data)
            unknown: list = []
            body_at = check_request(header_cls, data, 0, end, unknown)
            check_request(request_cls, data, body_at, end, unknown)
            if unknown:  # a newer client's tagged fields: skipped, as Kafka skips them
                data = memoryview(without_unknown_tags(data, unknown))
            header, pos = _reader(header_cls)(data, 0)
            body, _ = _reader(request_cls)(data, pos)
        except FrameShapeError as e:
            raise _Malformed(
                f"malformed {request_cls.__name__} v{api_version}: {e}", api_key, api_version
            ) from None
        except Exception as e:  # kio refusing a value: an ordinary exception of any type
            raise _Malformed(
                f"malformed {request_cls.__name__} v{api_version}: {e!r}", api_key, api_version
            ) from None
        # Bytes after the body are ignored, as Kafka's brokers do: librdkafka's
        # all-topics Metadata request, for one, carries a few.
        return Request(api_key, api_version, corr, header.client_id or "", body, memoryview(b""))

    def peek_correlation_id(self, frame: memoryview) -> int | None:
        if len(frame) >= _HEADER.size:
            return _HEADER.unpack_from(frame, 0)[2]
        return None

    def encode_head(self, request: Request, reply: Reply, tail_len: int) -> bytes:
        body = reply.body
        response_cls = response_class(request.api_key, request.api_version)
        header = _response_header(response_cls, request.correlation_id)
        if not isinstance(body, bytes | bytearray | memoryview):
            body = encode_entity(body)
        size = len(header) + len(body) + tail_len
        return _SIZE.pack(size) + header + body

    def encode_error(self, error: ProtocolError) -> bytes | None:
        if error.api_key < 0:
            return None  # not even the header: nobody could match an answer
        return encode_error_response(
            error.api_key, error.api_version, error.correlation_id, error.code, self.advertised
        )


def peek_client_id(frame: memoryview) -> str:
    """The header's client id, as far as the frame holds one (for logs only)."""
    if len(frame) < _HEADER.size + 2:
        return ""
    (n,) = struct.unpack_from(">h", frame, _HEADER.size)
    start = _HEADER.size + 2
    return bytes(frame[start : start + min(max(n, 0), 100)]).decode("utf-8", "replace")


class _Malformed(InvalidFrameError):
    """A request whose body does not parse at the version its header names."""

    code = ErrorCode.INVALID_REQUEST

    def __init__(self, message: str, api_key: int, api_version: int) -> None:
        super().__init__(message)
        self.api_key = api_key
        self.api_version = api_version


def encode_entity(entity: Any) -> bytes:
    out = io.BytesIO()
    _writer(type(entity))(out, entity)
    return out.getvalue()


def encode_error_response(
    api_key: int, api_version: int, corr: int, code: ErrorCode, advertised: Versions
) -> bytes:
    """A whole response frame carrying ``code`` for a request that was not carried out."""
    if api_key == API_VERSIONS_KEY:
        # KIP-511: v0 with the error and the versions, whatever version was asked
        body = encode_entity(api_versions_response(0, advertised, code))
        return _SIZE_CORR.pack(4 + len(body), corr) + body
    try:
        response_cls = response_class(api_key, api_version)
    except KioIndexError:
        # No schema to answer in: the header every response starts with, then the code.
        return _SIZE_CORR.pack(6, corr) + struct.pack(">h", int(code))
    header = _response_header(response_cls, corr)
    body = encode_entity(error_entity(response_cls, code))
    return _SIZE.pack(len(header) + len(body)) + header + body


def error_entity(cls: type, code: ErrorCode) -> Any:
    """An instance of response class ``cls`` with every field empty and the error set.

    Every field gets a value kio can write and every client (kio's reader included) can
    read back: see ``_empty``.
    """
    return cls(**{f.name: _empty(f, code) for f in dataclasses.fields(cls) if f.init})


_INT_TYPES = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})


def _empty(f: dataclasses.Field, code: ErrorCode) -> Any:
    """The empty value of one field, chosen by its wire type (``kafka_type``), not by
    its Python type's name (a ``ProducerId`` is an int64 too). An error code is set even
    where the schema gives it a default (OffsetFetch v2-v7's top-level one)."""
    if f.metadata.get("kafka_type") == "error_code":
        return KioErrorCode(int(code))
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    kind = classify_field(f)
    if kind.is_array:
        return ()
    if isinstance(kind, EntityField):
        # a nested struct without a default (UpdateRaftVoter's current leader): empty too
        return None if is_optional(f) else error_entity(kind.type_, code)
    kafka_type = f.metadata.get("kafka_type")
    if kafka_type in _INT_TYPES:
        return -1 if f.name.endswith(("_id", "offset", "epoch")) else 0
    if kafka_type == "timedelta_i32":
        return i32Timedelta.parse(datetime.timedelta(0))
    if kafka_type == "timedelta_i64":
        return i64Timedelta.parse(datetime.timedelta(0))
    if kafka_type == "datetime_i64":
        # Kafka's handlers answer -1 here (DelegationTokenManager.ErrorTimestamp), which
        # kio's reader refuses in a non-nullable timestamp; 0, kio's own empty value, is
        # read by every client and is what Kafka's generic error answers of Renew- and
        # ExpireDelegationToken (getErrorResponse) carry. A nullable one is null (-1).
        return None if is_optional(f) else tz_aware_from_i64(i64(0))
    if kafka_type == "uuid":
        return None  # written as the zero UUID, Kafka's "no id"
    if kafka_type in ("string", "bytes", "records"):
        if is_optional(f):
            return None
        return "" if kafka_type == "string" else b""
    if kafka_type == "bool":
        return False
    if kafka_type == "float64":
        return 0.0
    raise TypeError(f"field {f.name}: no empty value for kafka_type {kafka_type!r}")


@cache
def _request_class(api_key: int, api_version: int) -> type:
    """kio's type, or ours for a version kio no longer has (legacy.py)."""
    return legacy_request(api_key, api_version) or load_request_schema(api_key, api_version)


@cache
def response_class(api_key: int, api_version: int) -> type:
    return legacy_response(api_key, api_version) or load_response_schema(api_key, api_version)


@cache
def _reader(cls: type) -> Callable[..., Any]:
    return entity_reader(cls)


@cache
def _writer(cls: type) -> Callable[..., Any]:
    return entity_writer(cls)


def _response_header(response_cls: type, corr: int) -> bytes:
    header_cls = response_cls.__header_schema__
    if getattr(header_cls, "__flexible__", False):
        return _SIZE.pack(corr) + b"\x00"  # v1: no tagged fields
    return _SIZE.pack(corr)
