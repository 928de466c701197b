"""The asyncio shell around ServerConnection: sockets, tasks, flow control, sendfile.

``ClientConnection`` is the broker's end of one client's connection (the client's end is
``client.connection.BrokerConnection``).

Each connection has one worker task that answers its requests strictly in order (the
protocol promises pipelined answers in request order). The protocol object only frames
and queues; it stops reading when ``max_in_flight`` requests are queued, so a client
that floods gets TCP backpressure instead of unbounded broker memory. Fetch tails that
are file regions are sent with ``os.sendfile`` after draining the transport (see
zero_copy.py); bytes tails go through the transport. What a handler answers (``Reply``)
is defined sans-IO in reply.py.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from logmq.errors import ErrorCode
from logmq.net.codec import Request
from logmq.net.connection import (
    UNKNOWN_CORRELATION_ID,
    ProtocolError,
    RequestReceived,
    ServerConnection,
)
from logmq.net.pipeline import ConnectionContext
from logmq.net.reply import Bytes, Reply, Tail, is_region, tail_size
from logmq.net.wire import NativeWire, WireCodec
from logmq.net.zero_copy import sendfile_all

log = logging.getLogger("logmq.net")

WRITE_HIGH_WATER = 1024 * 1024
# Responses whose tail is smaller go through the transport (one pread, one write);
# larger ones are sent from the file with sendfile (see _write).
SENDFILE_MIN_BYTES = 64 * 1024
# Within a response sent by sendfile, a region smaller than this is read and written
# with the bytes around it: each sendfile costs a drain of the transport and a wait,
# which for the few-KB regions of a fetch across thousands of small partitions cost
# more than copying them (the bulk of a big region still never enters Python).
SENDFILE_MIN_REGION = 16 * 1024
TLS_HANDSHAKE_TIMEOUT_S = 10.0  # a client that opens a TLS connection and stalls
LINGER_S = 5.0  # how long a connection closing after a fatal error waits for the peer
MAX_LOGGED_REASONS = 8  # distinct bad-frame reasons logged per connection


Handler = Callable[[Request], Awaitable[Reply | None]]


@dataclass(slots=True)
class ServerOptions:
    max_frame_size: int
    max_connections: int = 1000
    idle_timeout_s: float = 600.0
    max_in_flight: int = 64
    socket_buffer_bytes: int = 4 * 1024 * 1024
    zero_copy: bool = True


class _NullMetrics:
    def connection_opened(self) -> None: ...
    def connection_closed(self) -> None: ...
    def bytes_in(self, n: int) -> None: ...
    def bytes_out(self, n: int) -> None: ...
    def request_done(
        self, listener: str, api_key: int, seconds: float, bytes_in: int, bytes_out: int
    ) -> None: ...
    def bad_frame(self, listener: str, reason: str) -> None: ...
    def handler_failed(self, listener: str, api_key: int) -> None: ...


class _Signal:
    """A wake-up for one waiting task: ``set`` before ``wait`` is not lost."""

    __slots__ = ("_fut", "_loop", "_set")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._fut: asyncio.Future[None] | None = None
        self._set = False

    def set(self) -> None:
        self._set = True
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def wait(self) -> None:
        """Return once ``set`` was called since the last ``wait`` returned."""
        if not self._set:
            self._fut = fut = self._loop.create_future()
            try:
                await fut
            finally:
                self._fut = None
        self._set = False


class ClientConnection(asyncio.BufferedProtocol):
    """One client's connection to the broker: queues requests, answers them in order.

    A BufferedProtocol: the loop reads straight into memory the FrameReader lends it,
    so a large produce frame is received into its final buffer without a copy.
    """

    def __init__(self, server: TcpServer):
        self._server = server
        self._opts = server.options
        self._wire = server.wire
        self._conn = ServerConnection(
            self._opts.max_frame_size, self._opts.max_in_flight, self._wire
        )
        self._queue: collections.deque[RequestReceived | ProtocolError] = collections.deque()
        # Wake-ups are plain loop futures, not asyncio.Event/Queue: on Python 3.11
        # those look the running loop up on every wait, one getpid() syscall each.
        self._loop = asyncio.get_running_loop()
        self._wakeup = _Signal(self._loop)
        self.transport: asyncio.Transport | None = None
        self._task: asyncio.Task | None = None
        self._dup_fd: int | None = None
        self._reading = True
        self._sending_file = False
        self._draining = False  # server shutdown: answer what is queued, read no more
        self._lingering = False  # after a fatal error: discard input until the peer closes
        self._abandoned = False  # an answer could not be written: closing (_abandon)
        self._closed = asyncio.Event()
        # (event, handler task or None for a protocol error, start time); None = stop
        self._replies: collections.deque[tuple[Any, asyncio.Task | None, float] | None] = (
            collections.deque()
        )
        self._replies_ready = _Signal(self._loop)
        self._running: set[asyncio.Task] = set()
        self._read_only: set[asyncio.Task] = set()  # cancelled if the peer goes away
        self._running_concurrent = True  # every running handler may overlap a produce
        self._write_resumed: asyncio.Future | None = None  # set while the protocol is paused
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_active = 0.0
        self._muted_until = 0.0  # loop time: a throttled client's requests wait until then
        self.peer = "?"
        self.peer_host = ""  # the client's address, given to handlers as request.client_host
        self.context = ConnectionContext("?", "", server.listener)  # on every request
        self._logged: set[tuple[str, int, int]] = set()  # bad-frame reasons logged

    # -- asyncio.Protocol callbacks ---------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop: not a subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.peer_host = str(peer[0]) if peer else ""
        server = self._server
        self.context = ConnectionContext(self.peer, self.peer_host, server.listener)
        if server.init_context is not None:
            server.init_context(self.context, transport.get_extra_info("ssl_object"))
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=0)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self._opts.socket_buffer_bytes:
                    sock.setsockopt(
                        socket.SOL_SOCKET, socket.SO_SNDBUF, self._opts.socket_buffer_bytes
                    )
                    sock.setsockopt(
                        socket.SOL_SOCKET, socket.SO_RCVBUF, self._opts.socket_buffer_bytes
                    )
            except OSError as e:  # pragma: no cover - platform specific
                log.debug("socket options on %s: %s", self.peer, e)
            if self._opts.zero_copy and hasattr(os, "sendfile") and server.tls is None:
                self._dup_fd = os.dup(sock.fileno())
        if not self._server.admit(self):
            log.warning("refusing connection from %s: max_connections reached", self.peer)
            refusal = ProtocolError(
                UNKNOWN_CORRELATION_ID, ErrorCode.TOO_MANY_CONNECTIONS, "too many connections", True
            )
            head = self._wire.encode_error(refusal)
            if head is not None:
                transport.write(head)
            transport.close()
            return
        self._task = self._loop.create_task(self._run(), name=f"logmq-conn-{self.peer}")
        self._touch()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._conn.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self._server.metrics.bytes_in(nbytes)
        self._touch()
        self._handle_events(self._conn.buffer_updated(nbytes))

    def _handle_events(self, events: list) -> None:
        for ev in events:
            if isinstance(ev, ProtocolError):
                self._bad_frame(ev)
        self._queue.extend(events)
        if events:
            self._wakeup.set()
        self._update_reading()

    def eof_received(self) -> bool:
        # Close: a peer that stops sending is gone for all practical purposes, and its
        # parked fetches must not hold resources until they time out.
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed.set()
        for task in self._read_only:
            task.cancel()  # nobody is left to answer: do not park fetches for a ghost
        self._wakeup.set()
        if self._write_resumed is not None and not self._write_resumed.done():
            self._write_resumed.set_result(None)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        if self._task is None:
            self._release()

    def pause_writing(self) -> None:
        if self._write_resumed is None:
            self._write_resumed = self._loop.create_future()

    def resume_writing(self) -> None:
        fut, self._write_resumed = self._write_resumed, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    # -- helpers ---------------------------------------------------------------------
    def _bad_frame(self, ev: ProtocolError) -> None:
        """A client's fault: counted always, logged at INFO once per connection and reason
        (one misbehaving client must not flood the log; the broker's own faults are
        logged at ERROR with a traceback where they happen)."""
        reason = ev.code.name
        self._server.metrics.bad_frame(self._server.name, reason)
        # A newer client's ApiVersions is the KIP-511 handshake, not a fault.
        key = (reason, ev.api_key, ev.api_version)
        if ev.api_key == 18 or key in self._logged:
            return
        if len(self._logged) < MAX_LOGGED_REASONS:
            self._logged.add(key)
            client = f" (client id {ev.client_id!r})" if ev.client_id else ""
            log.info(
                "bad request from %s%s on the %s listener: %s (%s); further ones of this "
                "kind on this connection are only counted",
                self.peer,
                client,
                self._server.name,
                ev.message,
                reason,
            )

    def _touch(self) -> None:
        """Note activity; the idle timer re-arms itself instead of being reset per read."""
        self._last_active = self._loop.time()
        if self._idle_timer is None and not self._closed.is_set():
            self._idle_timer = self._loop.call_later(self._opts.idle_timeout_s, self._idle)

    def _idle(self) -> None:
        self._idle_timer = None
        if self._closed.is_set():
            return
        quiet = self._loop.time() - self._last_active
        if self._conn.in_flight or quiet < self._opts.idle_timeout_s:
            delay = max(self._opts.idle_timeout_s - quiet, 0.001)
            self._idle_timer = self._loop.call_later(delay, self._idle)
            return
        log.info("closing idle connection from %s", self.peer)
        self.close()

    def _update_reading(self) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        want = self._lingering or (
            self._conn.wants_read
            and not self._sending_file
            and not self._draining
            and self._loop.time() >= self._muted_until
        )
        if want != self._reading:
            self._reading = want
            if want:
                t.resume_reading()
            else:
                t.pause_reading()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def begin_drain(self) -> None:
        """Server shutdown: stop reading; the worker answers what is queued, then closes."""
        self._draining = True
        self._update_reading()
        self._wakeup.set()

    def _release(self) -> None:
        if self._dup_fd is not None:
            os.close(self._dup_fd)
            self._dup_fd = None
        self._server.forget(self)

    async def wait_closed(self) -> None:
        await self._closed.wait()
        if self._task is not None:
            await asyncio.shield(self._task)

    def abort(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self.transport is not None:
            self.transport.abort()

    # -- the worker ------------------------------------------------------------------
    async def _run(self) -> None:
        """Dispatch requests to handlers; a second coroutine writes answers in order."""
        writer = self._loop.create_task(self._write_loop(), name=f"logmq-write-{self.peer}")
        try:
            await self._dispatch_loop()
        except Exception:
            log.exception("connection %s failed", self.peer)
        finally:
            self._reply(None)  # the writer stops after what is queued
            try:
                await writer
            except Exception:
                log.exception("connection %s writer failed", self.peer)
            finally:
                for task in list(self._read_only):
                    task.cancel()  # only left when the connection closed under us
                if self._running:
                    await asyncio.gather(*self._running, return_exceptions=True)
                self.close()
                await self._closed.wait()
                self._release()

    async def _dispatch_loop(self) -> None:
        """Start a handler per request, in order.

        Requests the server marks concurrent (produce) start without waiting for the
        ones before them, so their durability waits (fsync, group commit) overlap; any
        other request first waits for every running handler, so a request never
        overtakes one sent before it (a produce after a CreateTopics sees the topic).

        A peer that closes right after sending (acks=0 produce) still gets every fully
        received request carried out; only the answers are abandoned. Read-only
        requests have no effect to carry out, so they are skipped once the peer is gone.
        """
        while True:
            if self._abandoned:
                return  # nothing started now could be answered
            if not self._queue:
                if self._draining or self._conn.closing or self._closed.is_set():
                    return
                await self._wakeup.wait()
                continue
            ev = self._queue.popleft()
            if isinstance(ev, ProtocolError):
                self._reply((ev, None, 0.0))
                if ev.fatal:
                    return
                continue
            read_only = self._server.is_read_only(ev.request)
            if self._closed.is_set() and read_only:
                skipped: asyncio.Future = self._loop.create_future()
                skipped.set_result(None)
                self._reply((ev, skipped, time.perf_counter()))
                continue
            ev.request.client_host = self.peer_host
            ev.request.context = self.context
            muted = self._muted_until - self._loop.time()
            if muted > 0:  # over its quota: its next request waits out the throttle
                await asyncio.sleep(muted)
            concurrent = self._server.is_concurrent(ev.request)
            if self._running and not (concurrent and self._running_concurrent):
                await asyncio.wait(list(self._running))
            if not self._running:
                self._running_concurrent = True
            self._running_concurrent = self._running_concurrent and concurrent
            task = self._loop.create_task(self._server.handler(ev.request))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
            if read_only:
                self._read_only.add(task)
                task.add_done_callback(self._read_only.discard)
            self._reply((ev, task, time.perf_counter()))

    def _reply(self, item: tuple[Any, asyncio.Task | None, float] | None) -> None:
        """Queue an answer slot for the writer (None: stop after the ones queued)."""
        self._replies.append(item)
        self._replies_ready.set()

    async def _write_loop(self) -> None:
        """Write the answers in request order, to the end of the queue.

        Whatever goes wrong with one answer, the loop goes on: every handler is still
        awaited, and a connection whose answer could not be written is closed
        (``_abandon``), never left open with its later answers stuck behind a dead writer.
        """
        while True:
            while not self._replies:
                await self._replies_ready.wait()
            item = self._replies.popleft()
            if item is None:
                return
            try:
                if await self._answer(*item):
                    return
            except asyncio.CancelledError:
                raise  # this writer itself is being cancelled (handlers' are caught below)
            except Exception:
                ev = item[0]
                head = ev.request if isinstance(ev, RequestReceived) else ev
                log.exception(
                    "%s API %d v%d (correlation id %d) from %s: the answer could not be "
                    "written; closing the connection",
                    self._server.name,
                    head.api_key,
                    head.api_version,
                    head.correlation_id,
                    self.peer,
                )
                self._server.metrics.handler_failed(self._server.name, head.api_key)
                await self._abandon()

    async def _answer(self, ev: Any, task: asyncio.Task | None, start: float) -> bool:
        """Answer one request (or protocol error); True: the connection ends after it."""
        if isinstance(ev, ProtocolError):
            await self._answer_error(ev)
            self._conn.request_done()
            if ev.fatal:
                await self._linger()
                return True
            self._update_reading()
            return False
        assert task is not None
        try:
            reply = await task
        except asyncio.CancelledError:
            if not task.cancelled():
                raise  # this writer itself is being cancelled
            reply = None  # the connection closed and its handlers were cancelled
        except Exception:
            # A handler's fault is the broker's: answered, and the connection kept.
            self._handler_failed(ev.request, "failed")
            reply = None
            await self._answer_failure(ev.request)
        sent = 0
        if reply is not None and reply.wire is not None:
            self._conn.switch_wire(reply.wire)  # before the client can answer it
        if reply is not None and not reply.silent and not self._gone:
            try:
                sent = await self._write(ev.request, reply)
            except (OSError, asyncio.CancelledError):
                raise
            except Exception:
                # Encoding the answer failed before any byte of it was written.
                self._handler_failed(ev.request, "answer could not be encoded")
                await self._answer_failure(ev.request)
        self._server.metrics.request_done(
            self._server.name, ev.request.api_key, time.perf_counter() - start, ev.size, sent
        )
        self._conn.request_done()
        if reply is not None and reply.wire is not None:
            self._wire = reply.wire
        if reply is not None and reply.throttle_ms > 0:
            self._mute(reply.throttle_ms / 1000)
        if reply is not None and reply.close:
            # answered, then closed (a failed login): nothing after it is read
            self._draining = True
            await self._linger()
            self.close()
            return True
        self._update_reading()
        return False

    @property
    def _gone(self) -> bool:
        """Nothing more can be written: the peer is gone, or the connection abandoned."""
        return self._abandoned or self._closed.is_set()

    async def _abandon(self) -> None:
        """Close the connection after an answer that could not be written (the broker's
        fault, logged by the caller).

        Clients match answers to requests by order (Kafka's Java client insists on it), so
        no answer can be left out and the ones after it sent: closing makes the client
        retry what it has pending, where an open connection would leave it waiting. The
        answers written before reach it (half-close and linger, as after a fatal error);
        no further request is started, and the writer only awaits what already runs.
        """
        if self._abandoned:
            return
        self._abandoned = True
        self._conn.closing = True  # what the client still sends is read and discarded
        self._wakeup.set()  # the dispatcher stops
        await self._linger()
        self.close()

    def _mute(self, seconds: float) -> None:
        """Read and start nothing more from this client for ``seconds`` (KIP-219)."""
        until = self._loop.time() + seconds
        if until > self._muted_until:
            self._muted_until = until
            self._update_reading()
            self._loop.call_at(until, self._unmute)

    def _unmute(self) -> None:
        # a timer may fire a little early (the loop's clock resolution): check again
        left = self._muted_until - self._loop.time()
        if left > 0.001:
            self._loop.call_later(left, self._unmute)
            return
        self._muted_until = 0.0
        self._update_reading()

    async def _linger(self) -> None:
        """Half-close after a fatal error answer and swallow what the peer still sends.

        Closing a socket with unread input makes the kernel send a reset, which can
        destroy the error answer before the client reads it.
        """
        t = self.transport
        if t is None or t.is_closing() or not t.can_write_eof():
            return
        t.write_eof()
        self._lingering = True
        self._update_reading()
        try:
            async with asyncio.timeout(LINGER_S):
                await self._closed.wait()
        except TimeoutError:
            pass

    def _handler_failed(self, request: Request, what: str) -> None:
        log.exception(
            "%s API %d v%d from %s: %s",
            self._server.name,
            request.api_key,
            request.api_version,
            self.peer,
            what,
        )
        self._server.metrics.handler_failed(self._server.name, request.api_key)

    async def _answer_failure(self, request: Request) -> None:
        """UNKNOWN_SERVER_ERROR in the request's own response type, in its place."""
        await self._answer_error(
            ProtocolError(
                request.correlation_id,
                ErrorCode.UNKNOWN_SERVER_ERROR,
                "handler failed",
                False,
                request.api_key,
                request.api_version,
            )
        )

    async def _answer_error(self, ev: ProtocolError) -> None:
        if self._gone:
            return
        head = self._wire.encode_error(ev)
        t = self.transport
        if head is not None and t is not None:
            self._server.metrics.bytes_out(len(head))
            t.write(head)

    async def _write(self, request: Request, reply: Reply) -> int:
        """Send one answer; returns its size in bytes."""
        t = self.transport
        assert t is not None
        if self._gone:
            return 0
        tail = reply.tail
        tail_len, has_region = tail_size(tail)
        head = self._wire.encode_head(request, reply, tail_len)
        sent = len(head) + tail_len
        self._server.metrics.bytes_out(sent)
        if not has_region:
            t.writelines([head, *tail]) if tail else t.write(head)
        elif self._dup_fd is None or tail_len < SENDFILE_MIN_BYTES:
            self._write_buffered(head, tail)
        else:
            await self._write_zero_copy(head, tail)
        if self._write_resumed is not None:
            await self._write_resumed  # the client is slow: do not queue more for it
        return sent

    def _write_buffered(self, head: bytes, tail: Tail) -> None:
        """Read file regions into memory and write everything through the transport.

        For small responses (a caught-up consumer's fetch) this is one pread per region
        and one write: cheaper than draining the transport, pausing reads and waking up
        for sendfile, which only pays off when there are many bytes to move.
        """
        t = self.transport
        assert t is not None
        parts: list[Bytes] = [head]
        for p in tail:
            if is_region(p):
                data = self._read_region(p)
                if data is None:
                    return
                parts.append(data)
            else:
                parts.append(p)
        t.writelines(parts)

    def _read_region(self, region: Any) -> bytes | None:
        """A file region's bytes; None, with the connection closed, if the file came
        up short (truncated under us: the frame's length would lie)."""
        data = region.read()
        if len(data) != region.length:
            log.info("file region for %s came up short; closing", self.peer)
            self.close()
            return None
        return data

    async def _write_zero_copy(self, head: bytes, tail: Tail) -> None:
        """Bytes parts through the transport, regions with sendfile, in tail order.

        Before each region the bytes queued so far are written and the transport drained,
        so any interleaving of bytes and regions reaches the socket in order.
        """
        t = self.transport
        assert t is not None and self._dup_fd is not None
        pending: list[Bytes] = [head]
        pending_bytes = 0
        self._sending_file = True
        self._update_reading()
        try:
            for part in tail:
                if not is_region(part):
                    pending.append(part)
                    continue
                if part.length < SENDFILE_MIN_REGION:
                    data = self._read_region(part)
                    if data is None:
                        return
                    pending.append(data)
                    pending_bytes += len(data)
                    if pending_bytes >= WRITE_HIGH_WATER:  # bounded memory per response
                        t.writelines(pending)
                        pending, pending_bytes = [], 0
                        await self._drain_all()
                        if self._closed.is_set():
                            return
                    continue
                t.writelines(pending)
                pending_bytes = 0
                pending = []
                await self._drain_all()
                if self._closed.is_set():
                    return
                try:
                    await sendfile_all(
                        self._loop, self._dup_fd, part.file.fileno(), part.position, part.length
                    )
                except OSError as e:
                    # the peer went away mid-response (EPIPE, ECONNRESET) or the file
                    # shrank under us: the stream is broken either way
                    log.info("sendfile to %s failed: %s; closing", self.peer, e)
                    self.close()
                    return
            if pending:
                t.writelines(pending)
        finally:
            self._sending_file = False
            self._update_reading()

    async def _drain_all(self) -> None:
        """Wait until the transport buffer is empty, without polling.

        The low water mark is 0, so resume_writing fires exactly at empty; lowering the
        high mark to 0 makes a non-empty buffer pause the protocol right away.
        """
        t = self.transport
        assert t is not None
        while t.get_write_buffer_size() > 0 and not self._closed.is_set():
            if self._write_resumed is None:
                t.set_write_buffer_limits(high=0, low=0)
                t.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=0)
                if self._write_resumed is None:  # pragma: no cover - loop did not pause
                    self._write_resumed = self._loop.create_future()
            await self._write_resumed


class TcpServer:
    """Listens, admits connections up to a limit and shuts down in order."""

    def __init__(
        self,
        handler: Handler,
        options: ServerOptions,
        metrics: Any = None,
        is_concurrent: Callable[[Request], bool] | None = None,
        is_read_only: Callable[[Request], bool] | None = None,
        wire: WireCodec | None = None,
        name: str = "native",
        tls: ssl.SSLContext | None = None,
        init_context: Callable[[ConnectionContext, Any], None] | None = None,
        listener: str | None = None,
    ):
        self.handler = handler
        self.name = name  # the front door, in logs and metrics
        self.listener = listener or name  # the listener's own name (on every request)
        # TLS: every connection is wrapped; record bytes cannot leave by sendfile then
        self.tls = tls
        # fills in what the handshake established (the principal of a client certificate,
        # whether SASL must follow); given the context and the ssl object (None: no TLS)
        self.init_context = init_context
        self.wire = wire if wire is not None else NativeWire()  # the front door's codec
        # requests whose handlers may run while earlier ones of the connection still run
        self.is_concurrent = is_concurrent or (lambda _req: False)
        # requests without side effects: not worth running once their peer is gone
        self.is_read_only = is_read_only or (lambda _req: False)
        self.options = options
        self.metrics = metrics or _NullMetrics()
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[ClientConnection] = set()
        self.port = 0

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ClientConnection(self),
            host,
            port,
            reuse_address=True,
            backlog=1024,
            ssl=self.tls,
            ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if self.tls is not None else None,
        )
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def admit(self, conn: ClientConnection) -> bool:
        if self._server is None or len(self._connections) >= self.options.max_connections:
            return False
        self._connections.add(conn)
        self.metrics.connection_opened()
        return True

    def forget(self, conn: ClientConnection) -> None:
        if conn in self._connections:
            self._connections.discard(conn)
            self.metrics.connection_closed()

    def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def stop(self, grace_s: float, before_drain: Callable[[], None] | None = None) -> None:
        """Stop accepting, let every connection answer what it has read, then close."""
        self.stop_accepting()
        conns = list(self._connections)
        for c in conns:
            c.begin_drain()
        if before_drain is not None:
            before_drain()
        if conns:
            waits = [asyncio.ensure_future(c.wait_closed()) for c in conns]
            _done, pending = await asyncio.wait(waits, timeout=grace_s)
            for c in conns:
                if not c._closed.is_set():
                    log.warning("connection %s did not finish in time; aborting", c.peer)
                    c.abort()
            for w in pending:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
