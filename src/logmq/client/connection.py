"""One pipelined TCP connection to one broker.

Requests are written as soon as they are made and answered in order (docs/protocol.md,
"Pipelining"), so a deque of pending futures matched by correlation id is all the
bookkeeping needed. The connection is an ``asyncio.BufferedProtocol``: the sans-IO
``ResponseReader`` lends the event loop its memory, so a large response (a fetch of many
megabytes) is read by the socket straight into one (reused) buffer and handed on as a
memoryview, never appended to a growing buffer or copied in Python. This module only
moves bytes and resolves futures.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
from collections.abc import Iterable
from typing import Any

from logmq.client.response_reader import ResponseReader
from logmq.client.security import ClientSecurity, login
from logmq.errors import ConnectionError_, InvalidFrameError, LogMQError, error_for
from logmq.net.codec import DEFAULT_MAX_FRAME_SIZE, Response, decode_response
from logmq.net.codec import encode_request as _encode_request

SOCKET_BUFFER = 4 * 1024 * 1024


class HandshakeError(ConnectionError_):
    """The address accepted the connection, then TLS or the SASL login failed on the
    wire: it may be another kind of listener (client/kafka_probe.py looks)."""


class BrokerConnection(asyncio.BufferedProtocol):
    """A client connection: ``send()`` writes a request and returns its response future.

    The transport's write buffer is watched through pause_writing/resume_writing; callers
    that produce a lot ``await drain()`` between requests so memory stays bounded.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_id: str = "logmq-python",
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        node_id: int = -1,
    ) -> None:
        self.host = host
        self.port = port
        self.node_id = node_id
        self.client_id = client_id
        self._reader = ResponseReader(max_frame_size)
        self._pending: collections.deque[tuple[int, asyncio.Future[Response]]] = collections.deque()
        self._transport: asyncio.Transport | None = None
        self._next_correlation = 1
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._closed_error: LogMQError | None = None
        # kept: on Python 3.11 every get_running_loop() is a getpid() syscall
        self._loop = asyncio.get_running_loop()
        self._closed = self._loop.create_future()

    # -- lifecycle ----------------------------------------------------------------
    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        connect_timeout: float = 10.0,
        security: ClientSecurity | None = None,
        **kwargs: Any,
    ) -> BrokerConnection:
        """Connect (over TLS and logged in with SASL when ``security`` says so)."""
        loop = asyncio.get_running_loop()
        tls = security is not None and security.tls
        try:
            async with asyncio.timeout(connect_timeout):
                _, proto = await loop.create_connection(
                    lambda: cls(host, port, **kwargs),
                    host,
                    port,
                    ssl=security.ssl_context if tls else None,  # type: ignore[union-attr]
                    server_hostname=host if tls else None,
                )
                if security is not None and security.sasl:
                    try:
                        await login(proto, security)
                    except BaseException:
                        proto.close()
                        raise
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as e:
            # connected, then the TLS handshake failed: the peer may be another kind
            reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
            raise HandshakeError(f"cannot connect to {host}:{port}: {reason}") from None
        except (OSError, TimeoutError) as e:
            reason = getattr(e, "strerror", None) or str(e) or "timed out"
            raise ConnectionError_(f"cannot connect to {host}:{port}: {reason}") from None
        except ConnectionError_ as e:
            if isinstance(e, HandshakeError):
                raise
            # the login's answers could not be read: not a native SASL listener?
            raise HandshakeError(str(e)) from None
        return proto

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
            except OSError:
                pass
        transport.set_write_buffer_limits(high=SOCKET_BUFFER)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(
            ConnectionError_(f"connection to {self.host}:{self.port} lost: {exc or 'closed'}")
        )

    def _fail(self, err: LogMQError, *, abort: bool = True) -> None:
        if self._closed_error is None:
            self._closed_error = err
        pending, self._pending = self._pending, collections.deque()
        for _, fut in pending:
            if not fut.done():
                fut.set_exception(self._closed_error)
                fut.exception()  # a caller that gave up on it must not get a warning
        for w in self._drain_waiters:
            if not w.done():
                w.set_exception(self._closed_error)
        self._drain_waiters.clear()
        if self._transport is not None and abort:
            self._transport.abort()
        if not self._closed.done():
            self._closed.set_result(None)

    @property
    def is_open(self) -> bool:
        return self._closed_error is None and self._transport is not None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        """Close after the buffered writes; pending requests fail with ConnectionError_."""
        if self._transport is not None and self._closed_error is None:
            err = ConnectionError_(f"connection to {self.host}:{self.port} closed")
            self._fail(err, abort=False)
            self._transport.close()  # writes what is buffered (acks=0 sends) first

    async def wait_closed(self) -> None:
        await self._closed

    # -- flow control -------------------------------------------------------------
    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        for w in self._drain_waiters:
            if not w.done():
                w.set_result(None)
        self._drain_waiters.clear()

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        if self._closed_error is not None:
            raise self._closed_error
        if not self._paused:
            return
        w = self._loop.create_future()
        self._drain_waiters.append(w)
        await w

    # -- requests -----------------------------------------------------------------
    def send(
        self,
        api_key: int,
        body: dict[str, Any],
        tail: Iterable[bytes | memoryview] = (),
        *,
        api_version: int = 0,
        expect_response: bool = True,
    ) -> asyncio.Future[Response] | None:
        """Write one request now; return the future of its response (None if none comes)."""
        if self._closed_error is not None:
            raise self._closed_error
        assert self._transport is not None
        if self._transport.is_closing():
            # Reset by the peer, connection_lost not run yet: uvloop would raise a
            # RuntimeError on write, which no caller expects from a lost connection.
            raise ConnectionError_(f"connection to {self.host}:{self.port} lost")
        corr = self._next_correlation
        self._next_correlation = (corr + 1) & 0xFFFFFFFF
        frame = _encode_request(api_key, api_version, corr, self.client_id, body, tail)
        self._transport.writelines(frame)
        if not expect_response:
            return None
        fut: asyncio.Future[Response] = self._loop.create_future()
        self._pending.append((corr, fut))
        return fut

    async def request(
        self,
        api_key: int,
        body: dict[str, Any],
        tail: Iterable[bytes | memoryview] = (),
        *,
        api_version: int = 0,
        timeout: float | None = None,
    ) -> Response:
        """Send and await the response; a request-level error body raises.

        A timeout closes the connection: the broker is not answering in order any more
        as far as we can tell, and the caller retries on a fresh connection.
        """
        await self.drain()
        fut = self.send(api_key, body, tail, api_version=api_version)
        assert fut is not None
        timer = None if timeout is None else self._loop.call_later(timeout, _time_out, fut)
        try:
            resp = await fut
        except TimeoutError:
            self._fail(ConnectionError_(f"request to {self.host}:{self.port} timed out"))
            raise ConnectionError_(f"request to {self.host}:{self.port} timed out") from None
        finally:
            if timer is not None:
                timer.cancel()
        check_request_error(resp.body)
        return resp

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            frames = self._reader.buffer_updated(nbytes)
        except InvalidFrameError as e:
            self._fail(ConnectionError_(f"bad frame from {self.host}:{self.port}: {e}"))
            return
        if frames:
            self._dispatch(frames)

    def data_received(self, data: bytes) -> None:
        """Copy-in path for transports that do not support buffered reading."""
        try:
            frames = self._reader.feed(data)
        except InvalidFrameError as e:
            self._fail(ConnectionError_(f"bad frame from {self.host}:{self.port}: {e}"))
            return
        self._dispatch(frames)

    def _dispatch(self, frames: list[memoryview]) -> None:
        for frame in frames:
            try:
                resp = decode_response(frame)
            except InvalidFrameError as e:
                self._fail(ConnectionError_(f"bad response from {self.host}:{self.port}: {e}"))
                return
            if not self._pending:
                self._fail(ConnectionError_(f"unexpected response from {self.host}:{self.port}"))
                return
            corr, fut = self._pending[0]
            if corr != resp.correlation_id:
                self._fail(
                    ConnectionError_(
                        f"response correlation id {resp.correlation_id} does not match {corr}"
                    )
                )
                return
            self._pending.popleft()
            if not fut.done():
                fut.set_result(resp)

    def eof_received(self) -> bool | None:
        return None


def _time_out(fut: asyncio.Future[Response]) -> None:
    """A timer for ``request``: cheaper than asyncio.timeout on this per-request path."""
    if not fut.done():
        fut.set_exception(TimeoutError())


def check_request_error(body: dict[str, Any]) -> None:
    """Raise for a whole-request error (``{"error": code, "message": ...}`` with no payload)."""
    code = body.get("error", 0)
    if code and len(body) <= 2 and set(body) <= {"error", "message"}:
        raise error_for(code, body.get("message") or "")
