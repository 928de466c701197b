"""Kafka's SaslHandshake (v0-1) and SaslAuthenticate (v0-2), over the authenticator.

A handshake picks the mechanism (UNSUPPORTED_SASL_MECHANISM lists the listener's); each
SaslAuthenticate carries one message of the exchange. Handshake v0 (pre-1.0 clients, or a
client told an old ``api_version``) switches the connection to raw SASL tokens, each a
size-prefixed frame with no Kafka header either way, until the exchange completes: the
``RawSaslWire`` below reads them as SaslAuthenticate v0 requests and writes the answers'
tokens bare. A failed raw exchange gets no answer: the connection closes, as Kafka's does.
"""

from __future__ import annotations

import asyncio
import datetime
import struct
from functools import cache

from kio.index import load_request_schema
from kio.static.primitive import i64Timedelta

from logmq.errors import ErrorCode, LogMQError
from logmq.kafka.apis import kafka_error_reply
from logmq.kafka.codec import KafkaWire
from logmq.kafka.messages import build, kio_code, response_module
from logmq.net.codec import Request
from logmq.net.connection import ProtocolError
from logmq.net.reply import Reply
from logmq.security.authentication import Authenticator

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
_SIZE = struct.Struct(">i")


@cache
def _authenticate_v0() -> type:
    return load_request_schema(SASL_AUTHENTICATE, 0)


class RawSaslWire:
    """The codec of a connection between SaslHandshake v0 and the end of its exchange."""

    def decode_request(self, frame: memoryview) -> Request:
        body = _authenticate_v0()(auth_bytes=bytes(frame))
        return Request(SASL_AUTHENTICATE, 0, 0, "", body, memoryview(b""))

    def peek_correlation_id(self, frame: memoryview) -> int | None:
        return None  # never asked: any bytes are a token

    def encode_head(self, request: Request, reply: Reply, tail_len: int) -> bytes:
        body = reply.body
        if getattr(body, "error_code", None) != kio_code(ErrorCode.NONE):
            return b""  # a failure is said by closing the connection
        token = body.auth_bytes or b""
        return _SIZE.pack(len(token)) + token

    def encode_error(self, error: ProtocolError) -> bytes | None:
        return None  # a token over the frame limit: closed without a word


RAW_SASL_WIRE = RawSaslWire()


class KafkaSaslApis:
    """The SASL exchange, and the pipeline's first step on every Kafka listener.

    ``before_auth`` is what the registry admits before a login (ApiVersions and these
    two); ``wire`` is the listener's codec, back in force after a raw exchange."""

    def __init__(
        self, authenticator: Authenticator, before_auth: frozenset[int], wire: KafkaWire
    ) -> None:
        self.auth = authenticator
        self.before_auth = before_auth
        self.wire = wire

    async def sasl_handshake(self, req: Request) -> Reply:
        m = response_module(req.body)
        context = req.context
        try:
            self.auth.handshake(context, req.body.mechanism)
            error = ErrorCode.NONE
        except LogMQError as e:
            error = e.code
        mechanisms = self.auth.mechanisms(context)
        raw = req.api_version == 0 and error is ErrorCode.NONE
        if raw:
            context.auth.raw = True
        return Reply(
            m.SaslHandshakeResponse(error_code=kio_code(error), mechanisms=tuple(mechanisms)),
            close=error is ErrorCode.ILLEGAL_SASL_STATE,
            wire=RAW_SASL_WIRE if raw else None,
        )

    async def sasl_authenticate(self, req: Request) -> Reply:
        m = response_module(req.body)
        answer = self.auth.authenticate(req.context, req.body.auth_bytes)
        if answer.close:
            # Kafka's connection.failed.authentication.delay.ms: a guesser waits for
            # each answer, and a failure takes as long whatever failed
            await asyncio.sleep(self.auth.settings.failed_auth_delay_ms / 1000)
        state = req.context.auth
        raw_done = state is not None and state.raw and req.context.authenticated
        if raw_done:
            state.raw = False
        lifetime = i64Timedelta.parse(datetime.timedelta(milliseconds=answer.session_lifetime_ms))
        return Reply(
            build(
                m.SaslAuthenticateResponse,
                error_code=kio_code(answer.error),
                error_message=answer.message,
                auth_bytes=answer.challenge,
                session_lifetime=lifetime,
            ),
            close=answer.close,
            # a raw exchange (handshake v0) done: Kafka's framing from the next request
            wire=self.wire if raw_done else None,
        )

    async def guard(self, req: Request) -> Reply | None:
        """The pipeline's first step on every Kafka listener (see authentication.py)."""
        why = self.auth.admits(req.context, req.api_key in self.before_auth)
        if why is None:
            return None
        reply = kafka_error_reply(req, ErrorCode.ILLEGAL_SASL_STATE, why)
        reply.close = True
        return reply
