"""SASL on the native door: the same exchanges as Kafka's, in msgpack bodies.

``SaslHandshake`` (17) ``{"mechanism"}`` -> ``{"error", "mechanisms"}``;
``SaslAuthenticate`` (36) ``{"auth_bytes"}`` -> ``{"error", "message", "auth_bytes",
"session_lifetime_ms"}``. The authenticator, its rules and its guard are the Kafka
door's (security/authentication.py): on a SASL listener nothing but ApiVersions and
these two pass before a login, a failed login is answered after the delay and closed.
"""

from __future__ import annotations

import asyncio

from logmq.errors import ErrorCode, LogMQError
from logmq.native.request_fields import req_field, req_str
from logmq.net.codec import Request
from logmq.net.reply import Reply
from logmq.security.authentication import Authenticator

MAX_AUTH_BYTES = 64 * 1024  # a SCRAM message is a few hundred bytes, a JWT a few KB


class NativeSaslApi:
    """The SASL exchange; ``before_auth`` is what the registry admits before a login."""

    def __init__(self, authenticator: Authenticator, before_auth: frozenset[int]) -> None:
        self.auth = authenticator
        self.before_auth = before_auth

    async def sasl_handshake(self, req: Request) -> Reply:
        context = req.context
        try:
            self.auth.handshake(context, req_str(req.body, "mechanism"))
            error = ErrorCode.NONE
        except LogMQError as e:
            error = e.code
        return Reply(
            {"error": int(error), "mechanisms": list(self.auth.mechanisms(context))},
            close=error is ErrorCode.ILLEGAL_SASL_STATE,
        )

    async def sasl_authenticate(self, req: Request) -> Reply:
        data = req_field(req.body, "auth_bytes", bytes, b"")
        if len(data) > MAX_AUTH_BYTES:
            data = b""  # refused by the mechanism as malformed, after the delay
        answer = self.auth.authenticate(req.context, data)
        if answer.close:
            await asyncio.sleep(self.auth.settings.failed_auth_delay_ms / 1000)
        return Reply(
            {
                "error": int(answer.error),
                "message": answer.message,
                "auth_bytes": answer.challenge,
                "session_lifetime_ms": answer.session_lifetime_ms,
            },
            close=answer.close,
        )

    async def guard(self, req: Request) -> Reply | None:
        why = self.auth.admits(req.context, req.api_key in self.before_auth)
        if why is None:
            return None
        return Reply({"error": int(ErrorCode.ILLEGAL_SASL_STATE), "message": why}, close=True)
