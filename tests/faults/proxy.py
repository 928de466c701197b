"""A TCP proxy on 127.0.0.1 that cuts, blackholes and delays a link on command.

Put one between two processes (listen port -> target port) and a test can break the
link the way networks break: ``cut("reset")`` kills every connection with a TCP reset
and resets new ones as soon as they are accepted (what a crashed peer or a firewall
REJECT looks like); ``cut("blackhole")`` keeps connections open but moves no byte, and
accepts new ones without ever connecting them onward (what a partition looks like:
writes vanish, requests time out, nobody is told). A blackhole can hold one direction
only (``direction="upstream"``: client to target; ``"downstream"``: target to client).
``heal()`` lifts cuts and delays; bytes held by a blackhole are then delivered, in
order, as TCP delivers after a partition heals. ``delay(ms)`` delays every chunk.

Proxies run on a ``ProxyLoop``: an event loop in its own daemon thread, so synchronous
tests (and nemesis threads) drive them with plain calls that return once the change is
in effect. Several proxies may share one loop (a cluster has one per link).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

UPSTREAM = "upstream"  # bytes from the client towards the target
DOWNSTREAM = "downstream"  # bytes from the target back to the client
BOTH = "both"
RESET = "reset"
BLACKHOLE = "blackhole"
HOST = "127.0.0.1"

CALL_TIMEOUT = 10.0
QUEUE_LIMIT = 4 << 20  # bytes held per direction before the proxy stops reading the source

T = TypeVar("T")


def _directions(direction: str) -> tuple[str, ...]:
    if direction == BOTH:
        return (UPSTREAM, DOWNSTREAM)
    if direction in (UPSTREAM, DOWNSTREAM):
        return (direction,)
    raise ValueError(f"direction must be {UPSTREAM!r}, {DOWNSTREAM!r} or {BOTH!r}")


def _reset(transport: asyncio.BaseTransport) -> None:
    """Close with a TCP RST (SO_LINGER 0), not a FIN: the peer sees ECONNRESET."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class ProxyLoop:
    """An event loop running in a daemon thread; ``call`` runs code on it and waits."""

    def __init__(self, name: str = "fault-proxy") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._closed = False

    def call(self, fn: Callable[..., T] | Coroutine[Any, Any, T], *args: Any) -> T:
        """Run ``fn(*args)`` (or await a coroutine) on the loop; return its result."""
        if self._closed:
            raise RuntimeError("proxy loop is closed")
        if asyncio.iscoroutine(fn):
            return asyncio.run_coroutine_threadsafe(fn, self.loop).result(CALL_TIMEOUT)
        if threading.current_thread() is self._thread:
            return fn(*args)  # type: ignore[operator]
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(fn(*args))  # type: ignore[operator]
            except BaseException as e:
                fut.set_exception(e)

        self.loop.call_soon_threadsafe(run)
        return fut.result(CALL_TIMEOUT)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(CALL_TIMEOUT)
        self.loop.close()

    def __enter__(self) -> ProxyLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(slots=True)
class ProxyStats:
    accepted: int = 0  # connections accepted
    reset_on_accept: int = 0  # accepted during a reset cut and reset at once
    resets: int = 0  # established connections reset by cut("reset") / reset_connections()
    open: int = 0  # connections open now
    bytes_upstream: int = 0  # delivered to the target
    bytes_downstream: int = 0  # delivered to the client


class _Lane:
    """One direction of one connection: what waits to be delivered, and why."""

    __slots__ = ("direction", "eof", "error", "finished", "held", "last_due", "paused")

    def __init__(self, direction: str) -> None:
        self.direction = direction
        self.held = False  # blackholed: nothing moves until heal
        self.eof = False  # the source closed: pass it on once the queue is delivered
        self.error = False  # ...and it closed with an error: reset the destination
        self.finished = False
        self.last_due = 0.0
        self.paused: set[str] = set()  # reasons the source is not being read


class _Pipe:
    """An accepted connection, its onward connection, and the two lanes between them."""

    def __init__(self, proxy: FaultProxy, client: asyncio.Transport) -> None:
        self.proxy = proxy
        self.client = client
        self.server: asyncio.Transport | None = None
        self.connecting = False
        self.closed = False
        self.lanes = {UPSTREAM: _Lane(UPSTREAM), DOWNSTREAM: _Lane(DOWNSTREAM)}
        self.queues: dict[str, collections.deque[tuple[float, bytes]]] = {
            UPSTREAM: collections.deque(),
            DOWNSTREAM: collections.deque(),
        }
        self.queued = {UPSTREAM: 0, DOWNSTREAM: 0}
        self.timers: dict[str, asyncio.TimerHandle | None] = {UPSTREAM: None, DOWNSTREAM: None}
        self.source_paused = {UPSTREAM: False, DOWNSTREAM: False}

    def source(self, direction: str) -> asyncio.Transport | None:
        return self.client if direction == UPSTREAM else self.server

    def dest(self, direction: str) -> asyncio.Transport | None:
        return self.server if direction == UPSTREAM else self.client

    # -- reading the sources ------------------------------------------------------------
    def pause(self, direction: str, reason: str) -> None:
        self.lanes[direction].paused.add(reason)
        self.apply_reading(direction)

    def resume(self, direction: str, reason: str) -> None:
        self.lanes[direction].paused.discard(reason)
        self.apply_reading(direction)

    def apply_reading(self, direction: str) -> None:
        src = self.source(direction)
        if src is None or src.is_closing():
            return
        want_paused = bool(self.lanes[direction].paused)
        if want_paused != self.source_paused[direction]:
            self.source_paused[direction] = want_paused
            if want_paused:
                src.pause_reading()
            else:
                src.resume_reading()

    # -- moving bytes -------------------------------------------------------------------
    def on_data(self, direction: str, data: bytes) -> None:
        lane = self.lanes[direction]
        now = self.proxy.loop.time()
        due = max(now + self.proxy.delay_s[direction], lane.last_due)
        lane.last_due = due
        self.queues[direction].append((due, data))
        self.queued[direction] += len(data)
        if self.queued[direction] > QUEUE_LIMIT:
            self.pause(direction, "queue")
        self.pump(direction)

    def on_eof(self, direction: str, error: bool) -> None:
        lane = self.lanes[direction]
        lane.eof = True
        lane.error = lane.error or error
        self.pump(direction)

    def pump(self, direction: str) -> None:
        """Deliver what is due, unless held or not connected; pass an EOF on at the end."""
        lane = self.lanes[direction]
        dest = self.dest(direction)
        if lane.held or lane.finished or dest is None or self.closed:
            return
        queue = self.queues[direction]
        now = self.proxy.loop.time()
        while queue and queue[0][0] <= now:
            _, data = queue.popleft()
            self.queued[direction] -= len(data)
            if not dest.is_closing():
                dest.write(data)
                self.proxy.count(direction, len(data))
        if self.queued[direction] <= QUEUE_LIMIT // 2:
            self.resume(direction, "queue")
        if queue:
            timer = self.timers[direction]
            if timer is None:
                delay = max(0.0, queue[0][0] - now)
                self.timers[direction] = self.proxy.loop.call_later(delay, self._tick, direction)
            return
        if lane.eof:
            lane.finished = True
            if lane.error or dest.is_closing():
                self.close(reset=lane.error)
            elif dest.can_write_eof():
                dest.write_eof()
            else:
                self.close()
            if all(x.finished for x in self.lanes.values()):
                self.close()

    def _tick(self, direction: str) -> None:
        self.timers[direction] = None
        self.pump(direction)

    # -- faults -------------------------------------------------------------------------
    def hold(self, direction: str) -> None:
        self.lanes[direction].held = True
        self.pause(direction, "cut")

    def release(self, direction: str) -> None:
        self.lanes[direction].held = False
        self.resume(direction, "cut")
        self.pump(direction)

    def close(self, reset: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        for direction, timer in self.timers.items():
            if timer is not None:
                timer.cancel()
                self.timers[direction] = None
        for t in (self.client, self.server):
            if t is not None and not t.is_closing():
                if reset:
                    _reset(t)
                else:
                    t.close()
        self.proxy.forget(self)


class _Side(asyncio.Protocol):
    """Protocol for either end of a pipe; ``direction`` is the lane this end feeds."""

    def __init__(self, pipe: _Pipe | None, direction: str) -> None:
        self.pipe = pipe
        self.direction = direction

    def data_received(self, data: bytes) -> None:
        if self.pipe is not None:
            self.pipe.on_data(self.direction, data)

    def eof_received(self) -> bool:
        if self.pipe is not None:
            self.pipe.on_eof(self.direction, error=False)
        return True  # keep the other half open: the EOF travels like data

    def connection_lost(self, exc: Exception | None) -> None:
        pipe = self.pipe
        if pipe is None:
            return
        other = DOWNSTREAM if self.direction == UPSTREAM else UPSTREAM
        pipe.lanes[other].finished = True  # nothing can be written to this end any more
        pipe.queues[other].clear()
        pipe.queued[other] = 0
        if not pipe.lanes[self.direction].eof:
            pipe.on_eof(self.direction, error=exc is not None)
        elif all(x.finished for x in pipe.lanes.values()):
            pipe.close()

    def pause_writing(self) -> None:  # this end's send buffer is full
        if self.pipe is not None:
            other = DOWNSTREAM if self.direction == UPSTREAM else UPSTREAM
            self.pipe.pause(other, "flow")

    def resume_writing(self) -> None:
        if self.pipe is not None:
            other = DOWNSTREAM if self.direction == UPSTREAM else UPSTREAM
            self.pipe.resume(other, "flow")


class _ClientSide(_Side):
    def __init__(self, proxy: FaultProxy) -> None:
        super().__init__(None, UPSTREAM)
        self.proxy = proxy

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.pipe = self.proxy.accept(transport)


class FaultProxy:
    """Forwards 127.0.0.1:``port`` to ``target_host``:``target_port``; faults on command.

    Every control method is a plain call, safe from any thread, that returns once the
    fault is in effect for existing and new connections.
    """

    def __init__(
        self,
        target_port: int,
        *,
        target_host: str = HOST,
        listen_port: int = 0,
        loop: ProxyLoop | None = None,
        name: str = "",
    ) -> None:
        self.target = (target_host, target_port)
        self.name = name or f"proxy->{target_port}"
        self._listen_port = listen_port
        self._own_loop = loop is None
        self._ploop = loop if loop is not None else ProxyLoop(f"fault-proxy {self.name}")
        self.loop = self._ploop.loop
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._pipes: set[_Pipe] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._mode: str | None = None  # RESET or BLACKHOLE while cut
        self._held: set[str] = set()
        self.delay_s = {UPSTREAM: 0.0, DOWNSTREAM: 0.0}
        self._stats = ProxyStats()

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._ploop.call(self._start())
        return self

    async def _start(self) -> None:
        self._server = await self.loop.create_server(
            lambda: _ClientSide(self), HOST, self._listen_port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    def close(self) -> None:
        """Stop listening and drop every connection (with a reset)."""
        if self._server is not None:
            self._ploop.call(self._close())
            self._server = None
        if self._own_loop:
            self._ploop.close()

    async def _close(self) -> None:
        assert self._server is not None
        self._server.close()
        for pipe in list(self._pipes):
            pipe.close(reset=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def __enter__(self) -> FaultProxy:
        return self.start() if self._server is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    # -- controls (any thread) ----------------------------------------------------------
    def cut(self, mode: str = BLACKHOLE, direction: str = BOTH) -> None:
        """Break the link: ``"reset"`` (both directions only) or ``"blackhole"``."""
        directions = _directions(direction)
        if mode not in (RESET, BLACKHOLE):
            raise ValueError(f"mode must be {RESET!r} or {BLACKHOLE!r}")
        if mode == RESET and direction != BOTH:
            raise ValueError("a reset cuts both directions: a TCP connection dies whole")
        self._ploop.call(self._cut, mode, directions)

    def _cut(self, mode: str, directions: tuple[str, ...]) -> None:
        if mode == RESET:
            self._mode = RESET
            self._held.clear()
            self._reset_all()
            return
        if self._mode != RESET:
            self._mode = BLACKHOLE
        self._held.update(directions)
        for pipe in list(self._pipes):
            for d in directions:
                pipe.hold(d)

    def heal(self) -> None:
        """Lift every cut and delay; held bytes and connections then flow in order."""
        self._ploop.call(self._heal)

    def _heal(self) -> None:
        self._mode = None
        self._held.clear()
        self.delay_s = {UPSTREAM: 0.0, DOWNSTREAM: 0.0}
        for pipe in list(self._pipes):
            if pipe.server is None and not pipe.connecting:
                self._connect(pipe)
            for d in (UPSTREAM, DOWNSTREAM):
                pipe.release(d)

    def delay(self, ms: float, direction: str = BOTH) -> None:
        """Deliver every chunk ``ms`` later than it arrived (0 removes the delay)."""
        directions = _directions(direction)
        if ms < 0:
            raise ValueError("delay must be >= 0")
        self._ploop.call(self._delay, ms / 1000, directions)

    def _delay(self, seconds: float, directions: tuple[str, ...]) -> None:
        for d in directions:
            self.delay_s[d] = seconds

    def reset_connections(self) -> None:
        """Reset the connections open now; new ones are forwarded as usual."""
        self._ploop.call(self._reset_all)

    def _reset_all(self) -> None:
        for pipe in list(self._pipes):
            self._stats.resets += 1
            pipe.close(reset=True)

    def stats(self) -> ProxyStats:
        return self._ploop.call(self._snapshot)

    def _snapshot(self) -> ProxyStats:
        s = self._stats
        return ProxyStats(
            s.accepted,
            s.reset_on_accept,
            s.resets,
            len(self._pipes),
            s.bytes_upstream,
            s.bytes_downstream,
        )

    @property
    def state(self) -> str:
        """``"open"``, ``"reset"`` or ``"blackhole upstream,downstream"``, for reports."""
        if self._mode == BLACKHOLE:
            return "blackhole " + ",".join(sorted(self._held))
        return self._mode or "open"

    # -- the loop side ------------------------------------------------------------------
    def accept(self, transport: asyncio.Transport) -> _Pipe | None:
        self._stats.accepted += 1
        if self._mode == RESET:
            self._stats.reset_on_accept += 1
            _reset(transport)
            return None
        pipe = _Pipe(self, transport)
        self._pipes.add(pipe)
        for d in self._held:
            pipe.hold(d)
        if self._held != {UPSTREAM, DOWNSTREAM}:
            self._connect(pipe)  # a full blackhole connects nothing until heal
        return pipe

    def _connect(self, pipe: _Pipe) -> None:
        pipe.connecting = True
        task = self.loop.create_task(self._open_upstream(pipe))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open_upstream(self, pipe: _Pipe) -> None:
        try:
            transport, _ = await self.loop.create_connection(
                lambda: _Side(pipe, DOWNSTREAM), *self.target
            )
        except OSError:
            pipe.close(reset=True)  # the target refused: so does the proxy
            return
        finally:
            pipe.connecting = False
        if pipe.closed:
            transport.close()
            return
        pipe.server = transport
        for d in (UPSTREAM, DOWNSTREAM):
            pipe.apply_reading(d)
            pipe.pump(d)

    def forget(self, pipe: _Pipe) -> None:
        self._pipes.discard(pipe)

    def count(self, direction: str, n: int) -> None:
        if direction == UPSTREAM:
            self._stats.bytes_upstream += n
        else:
            self._stats.bytes_downstream += n

    def __repr__(self) -> str:
        return f"FaultProxy({self.name}: {self.address} -> {self.target[0]}:{self.target[1]})"
