"""Who is on a connection: TLS client certificates and SASL exchanges, for either door.

Sans-IO apart from the clock it is given: a door's SASL handlers feed it the client's
bytes and encode what it answers; the request pipeline asks ``admits`` before every
request. The rules are Kafka's:

- A TLS listener with client certificates names the principal from the certificate's
  subject (``ssl.principal.mapping.rules``); without one it is ``User:ANONYMOUS``.
- On a SASL listener a connection may send only ApiVersions, SaslHandshake and
  SaslAuthenticate until it has authenticated; anything else closes it.
- A failed login is answered SASL_AUTHENTICATION_FAILED and the connection closed, after
  ``connection.failed.authentication.delay.ms`` (no cheap password guessing, and the
  answer's timing does not tell a wrong password from an unknown user).
- KIP-368: with ``connections.max.reauth.ms`` (or a token that expires) the answer
  carries the session's lifetime; the client re-authenticates on the same connection
  before it ends, as the same principal, or the broker closes the connection.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from logmq.errors import ErrorCode, LogMQError
from logmq.net.pipeline import ANONYMOUS, ConnectionContext
from logmq.security.sasl import (
    SaslAuthenticationError,
    SaslServer,
    SaslSessionLifetime,
    new_server,
)
from logmq.security.scram import ScramCredential, ScramServer
from logmq.security.settings import ListenerSecurity, SecuritySettings
from logmq.security.tls import NoMatchingRuleError, principal_from_peer_cert

log = logging.getLogger("logmq.security")

ScramLookup = Callable[[str, str], ScramCredential | None]  # (user, mechanism)
MAX_TRACKED_FAILURES = 10_000  # (principal, address) pairs remembered for the counters


@dataclass(slots=True)
class SaslState:
    """One connection's SASL progress (``ConnectionContext.auth``)."""

    mechanism: str | None = None
    server: SaslServer | None = None
    expires_at_ms: int | None = None  # the session ends here (KIP-368)
    reauthenticating: bool = False
    raw: bool = False  # handshake v0: tokens outside Kafka's framing (kafka/sasl.py)


@dataclass(frozen=True, slots=True)
class AuthAnswer:
    """What a SaslAuthenticate is answered: the challenge, or why it failed."""

    error: ErrorCode = ErrorCode.NONE
    message: str | None = None
    challenge: bytes = b""
    session_lifetime_ms: int = 0
    close: bool = False  # a failure: answer after the delay, then close


class Authenticator:
    """The broker's authentication rules over its settings and the SCRAM credentials."""

    def __init__(
        self,
        settings: SecuritySettings,
        scram_lookup: ScramLookup,
        metrics: Any = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self.settings = settings
        self.scram_lookup = scram_lookup
        self.metrics = metrics
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        # failed logins per (principal, address), bounded: the oldest pairs are forgotten
        self.failures: collections.OrderedDict[tuple[str, str], int] = collections.OrderedDict()

    # -- connection set-up -------------------------------------------------------------
    def context_initializer(self, listener: str) -> Callable[[ConnectionContext, Any], None]:
        """What a listener's server calls for each new connection (after TLS)."""
        sec = self.settings.of(listener)

        def init(context: ConnectionContext, ssl_object: Any) -> None:
            context.authenticated = not sec.listener.sasl
            if ssl_object is not None and sec.principal_mapper is not None:
                context.principal = self._certificate_principal(sec, ssl_object, context)

        return init

    def _certificate_principal(
        self, sec: ListenerSecurity, ssl_object: Any, context: ConnectionContext
    ) -> str:
        try:
            der = ssl_object.getpeercert(binary_form=True)
        except ValueError:  # handshake not complete: no certificate to read
            return ANONYMOUS
        if not der:
            return ANONYMOUS
        assert sec.principal_mapper is not None
        try:
            return principal_from_peer_cert(der, sec.principal_mapper)
        except (NoMatchingRuleError, ValueError) as e:
            log.info("client certificate of %s maps to no principal: %s", context.peer, e)
            context.authenticated = False  # no rule names it: it may do nothing
            return ANONYMOUS

    # -- the pipeline's check --------------------------------------------------------------
    def admits(self, context: ConnectionContext, handshake_api: bool) -> str | None:
        """None if the connection may send this request now, else why not (then it is
        closed): unauthenticated on a SASL listener, or its session has ended."""
        if not context.authenticated:
            if handshake_api:
                return None
            sec = self.settings.of(context.listener)
            return (
                f"authentication is required first: listener {sec.name} is "
                f"{sec.listener.protocol} and takes a SASL login "
                f"({', '.join(sec.mechanisms) or 'no mechanism'}; client: security.protocol="
                f"{sec.listener.protocol}, sasl.mechanism, sasl.username, sasl.password)"
            )
        state = context.auth
        if (
            state is not None
            and state.expires_at_ms is not None
            and not handshake_api
            and self.clock_ms() >= state.expires_at_ms
        ):
            return "the SASL session has expired: re-authenticate"
        return None

    # -- SaslHandshake ---------------------------------------------------------------------
    def mechanisms(self, context: ConnectionContext) -> tuple[str, ...]:
        return self.settings.of(context.listener).mechanisms

    def handshake(self, context: ConnectionContext, mechanism: str) -> None:
        """Start an exchange with ``mechanism`` (a re-authentication if already in).

        Refused with UnsupportedSaslMechanismError, or a LogMQError ILLEGAL_SASL_STATE
        (the connection is then closed): no SASL on this listener, a handshake in the
        middle of an exchange, nothing to renew, another mechanism on re-authentication.
        """
        sec = self.settings.of(context.listener)
        if not sec.listener.sasl:
            raise _illegal(f"listener {sec.name} takes no SASL login")
        state = context.auth
        if state is None:
            state = context.auth = SaslState()
        if state.server is not None and not state.server.complete:
            raise _illegal("a SASL exchange is already under way")
        if context.authenticated and state.expires_at_ms is None:
            raise _illegal("the session has no lifetime to renew")  # KIP-368
        server = self._server(sec, mechanism)  # UnsupportedSaslMechanismError
        state.server = server
        state.reauthenticating = context.authenticated
        if state.reauthenticating and mechanism != state.mechanism:
            state.server = None
            raise _illegal(f"re-authentication must use {state.mechanism}")  # as Kafka
        state.mechanism = mechanism

    def _server(self, sec: ListenerSecurity, mechanism: str) -> SaslServer:
        if mechanism.startswith("SCRAM-") and mechanism in sec.mechanisms:
            lookup = self.scram_lookup
            return ScramServer(
                mechanism,
                lambda name: lookup(name, mechanism),
                strict_nonce=sec.scram_strict_nonce,
            )
        return new_server(
            mechanism,
            plain_users=sec.plain_users,
            oauth_validator=sec.oauth,
            enabled=sec.mechanisms,
            scram_lookup=None,
        )

    # -- SaslAuthenticate ------------------------------------------------------------------
    def authenticate(self, context: ConnectionContext, data: bytes) -> AuthAnswer:
        state = context.auth
        if state is None or state.server is None or state.server.complete:
            return AuthAnswer(
                ErrorCode.ILLEGAL_SASL_STATE,
                "SaslAuthenticate before SaslHandshake",
                close=True,
            )
        server = state.server
        try:
            challenge = server.step(bytes(data))
        except SaslAuthenticationError as e:
            return self._failed(context, state, str(e))
        if not server.complete:
            return AuthAnswer(challenge=challenge)
        principal = f"User:{server.username}"
        if state.reauthenticating and principal != context.principal:
            return self._failed(
                context, state, "re-authentication must keep the principal of the connection"
            )
        now = self.clock_ms()
        lifetime = SaslSessionLifetime.start(
            now, self.settings.max_reauth_ms, server.credential_expiry_ms
        )
        state.expires_at_ms = lifetime.expires_at_ms
        context.principal = principal
        context.authenticated = True
        context.authz = None  # a new principal: nothing decided for the old one holds
        if self.metrics is not None:
            self.metrics.login(context.listener, state.mechanism or "?", True)
        return AuthAnswer(challenge=challenge, session_lifetime_ms=lifetime.session_lifetime_ms)

    def _failed(self, context: ConnectionContext, state: SaslState, why: str) -> AuthAnswer:
        server = state.server
        user = getattr(server, "username", None) or getattr(server, "attempted_username", None)
        who = f"User:{user}" if user else "?"
        key = (who, context.host)
        self.failures[key] = self.failures.pop(key, 0) + 1
        while len(self.failures) > MAX_TRACKED_FAILURES:
            self.failures.popitem(last=False)
        if self.metrics is not None:
            self.metrics.login(context.listener, state.mechanism or "?", False)
        log.info(
            "failed %s login on %s from %s (%s): %s",
            state.mechanism,
            context.listener,
            context.peer,
            who,
            why,
        )
        state.server = None
        return AuthAnswer(ErrorCode.SASL_AUTHENTICATION_FAILED, why, close=True)


def _illegal(why: str) -> LogMQError:
    return LogMQError(why, ErrorCode.ILLEGAL_SASL_STATE)
