"""Kafka's SaslHandshake (v0-1) and SaslAuthenticate (v0-2), over the authenticator.

A handshake picks the mechanism (UNSUPPORTED_SASL_MECHANISM lists the listener's); each
SaslAuthenticate carries one message of the exchange. Handshake v0 would switch the
connection to raw SASL tokens outside Kafka's framing, which only pre-1.0 clients ask for:
it is answered, and the client's next frame is refused as malformed (documented).
"""

from __future__ import annotations

import asyncio
import datetime

from kio.static.primitive import i64Timedelta

from logmq.errors import ErrorCode
from logmq.kafka.apis import kafka_error_reply
from logmq.kafka.messages import build, kio_code, response_module
from logmq.net.codec import Request
from logmq.net.reply import Reply
from logmq.security.authentication import Authenticator

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
HANDSHAKE_APIS = frozenset({18, SASL_HANDSHAKE, SASL_AUTHENTICATE})  # with ApiVersions


class KafkaSaslApis:
    def __init__(self, authenticator: Authenticator) -> None:
        self.auth = authenticator

    async def sasl_handshake(self, req: Request) -> Reply:
        m = response_module(req.body)
        context = req.context
        error = self.auth.handshake(context, req.body.mechanism)
        mechanisms = self.auth.mechanisms(context)
        return Reply(
            m.SaslHandshakeResponse(error_code=kio_code(error), mechanisms=tuple(mechanisms)),
            close=error is ErrorCode.ILLEGAL_SASL_STATE,
        )

    async def sasl_authenticate(self, req: Request) -> Reply:
        m = response_module(req.body)
        answer = self.auth.authenticate(req.context, req.body.auth_bytes)
        if answer.close:
            # Kafka's connection.failed.authentication.delay.ms: a guesser waits for
            # each answer, and a failure takes as long whatever failed
            await asyncio.sleep(self.auth.settings.failed_auth_delay_ms / 1000)
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
        )

    async def guard(self, req: Request) -> Reply | None:
        """The pipeline's first step on every Kafka listener (see authentication.py)."""
        why = self.auth.admits(req.context, req.api_key in HANDSHAKE_APIS)
        if why is None:
            return None
        reply = kafka_error_reply(req, ErrorCode.ILLEGAL_SASL_STATE, why)
        reply.close = True
        return reply
