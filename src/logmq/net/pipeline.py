"""The one path every request of either front door takes from its codec to its handler.

A front door is a codec (net/wire.py) plus a ``FrontDoor``: its handler table, the
versions it serves, and how it answers an error in its own protocol. ``RequestPipeline``
runs every request of a door through the same steps, so a rule that must hold for every
request is written once, here, never in a handler:

1. the connection's context (peer, listener, principal) is on the request;
2. an API the door does not serve, or a version outside its range, is answered
   UNSUPPORTED_VERSION (the Kafka codec already refuses them before decoding; the native
   one decodes any version, so this is where it is refused);
3. the door's guards run in order: each may answer the request itself (a forward to the
   controller) or prepare for it (the offsets topic before a group request); the next
   issue's authentication, ACLs and quotas are guards here;
4. the handler;
5. errors: a LogMQError becomes the door's answer with its code, anything else is the
   broker's fault (logged at ERROR with its traceback, UNKNOWN_SERVER_ERROR) and the
   connection carries on; both are counted per listener, API and code.

Per-API requests, latency and bytes are recorded by the connection (net/server.py), which
alone knows when the answer left and how many bytes it took.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from logmq.errors import ErrorCode, LogMQError
from logmq.net.codec import Request
from logmq.net.reply import Reply

log = logging.getLogger("logmq.net")

Handler = Callable[[Request], Awaitable[Reply | None]]
ANONYMOUS = "User:ANONYMOUS"


@dataclass(slots=True)
class ConnectionContext:
    """Who is on the other end of one connection; every request of it carries this."""

    peer: str  # host:port
    host: str
    listener: str  # the listener's name (NATIVE, PLAINTEXT, SASL_SSL, ...)
    principal: str = ANONYMOUS  # the authenticated identity (set by authentication)
    # False on a SASL listener until the client has authenticated: only the handshake
    # APIs pass the pipeline then (security/authentication.py)
    authenticated: bool = True
    auth: Any = None  # the connection's authentication state, owned by security/
    authz: Any = None  # its cached authorization decisions, owned by security/


class Guard(Protocol):
    """A step before the handler: answer the request (a Reply) or let it through (None)."""

    def __call__(self, request: Request) -> Awaitable[Reply | None]: ...


@dataclass(frozen=True, slots=True)
class GuardStep:
    guard: Guard
    api_keys: frozenset[int] | None = None  # None: every request of the door


@dataclass(slots=True)
class FrontDoor:
    """What a door gives the pipeline: handlers, served versions, its error answer."""

    name: str
    handlers: dict[int, Handler]
    versions: dict[int, tuple[int, int]]
    error_reply: Callable[[Request, ErrorCode, str], Reply]
    api_name: Callable[[int], str] = str
    unknown_api: ErrorCode = ErrorCode.UNSUPPORTED_VERSION  # Kafka's answer to an unknown key
    guards: list[GuardStep] = field(default_factory=list)
    # after each handler while it is active: the request-time quota, which throttles an
    # answer by the handler's time on the loop (security/quota_enforcer.py)
    after: AfterHandler | None = None


class AfterHandler(Protocol):
    def active(self) -> bool:
        """Measure handlers now? (Not measuring costs nothing.)"""
        ...

    def __call__(self, request: Request, reply: Reply | None, seconds: float) -> Reply | None:
        """The answer to send, given the handler's answer and its seconds on the loop."""
        ...


class LoopTime:
    """Awaits a handler's coroutine and adds up the time it runs on the event loop.

    Kafka's request_percentage counts a request thread's busy time, not the time a request
    waits in purgatory; here that is the time between a handler's suspensions: a Fetch
    parked for ``max_wait_ms`` or a Produce awaiting its replicas costs only what it ran.
    """

    __slots__ = ("_coro", "seconds")

    def __init__(self, coro: Awaitable[Any]) -> None:
        self._coro = coro
        self.seconds = 0.0

    def __await__(self) -> Any:
        steps = self._coro.__await__()
        clock = time.perf_counter
        value: Any = None
        error: BaseException | None = None
        while True:
            start = clock()
            try:
                if error is None:
                    yielded = steps.send(value)
                else:
                    yielded = steps.throw(error)
            except StopIteration as done:
                self.seconds += clock() - start
                return done.value
            except BaseException:
                self.seconds += clock() - start
                raise
            self.seconds += clock() - start
            try:
                value = yield yielded
                error = None
            except BaseException as e:  # a cancellation, passed on into the handler
                value = None
                error = e


class RequestPipeline:
    """The handler a door's TcpServer calls for each request (see the module's steps)."""

    __slots__ = ("door", "metrics")

    def __init__(self, door: FrontDoor, metrics: Any) -> None:
        self.door = door
        self.metrics = metrics

    def add_guard(self, guard: Guard, api_keys: Sequence[int] | None = None) -> None:
        """Run ``guard`` before the handlers of ``api_keys`` (every API when None)."""
        keys = None if api_keys is None else frozenset(api_keys)
        self.door.guards.append(GuardStep(guard, keys))

    async def __call__(self, request: Request) -> Reply | None:
        door = self.door
        key = request.api_key
        handler = door.handlers.get(key)
        versions = door.versions.get(key)
        if handler is None or versions is None:
            return self._refuse(request, door.unknown_api, f"API key {key} is not served")
        lo, hi = versions
        if not lo <= request.api_version <= hi:
            message = (
                f"{door.api_name(key)} version {request.api_version} is not served "
                f"(versions {lo}..{hi})"
            )
            return self._refuse(request, ErrorCode.UNSUPPORTED_VERSION, message)
        try:
            for step in door.guards:
                if step.api_keys is None or key in step.api_keys:
                    answer = await step.guard(request)
                    if answer is not None:
                        return answer
            after = door.after
            if after is None or not after.active():
                return await handler(request)
            timed = LoopTime(handler(request))
            reply = await timed
            return after(request, reply, timed.seconds)
        except LogMQError as e:
            return self._refuse(request, e.code, str(e))
        except Exception as e:
            log.exception(
                "%s %s v%d from %s (client id %r) failed",
                door.name,
                door.api_name(key),
                request.api_version,
                request.client_host or "?",
                request.client_id,
            )
            self.metrics.handler_failed(door.name, key)
            return self._refuse(request, ErrorCode.UNKNOWN_SERVER_ERROR, f"{type(e).__name__}: {e}")

    def _refuse(self, request: Request, code: ErrorCode, message: str) -> Reply:
        self.metrics.error(request.api_key, code, self.door.name)
        return self.door.error_reply(request, code, message)
