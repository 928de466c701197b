"""FaultProxy against an echo server: forwarding, resets, blackholes, one-way cuts, delays.

Plain blocking sockets with timeouts drive it, as a synchronous test or a nemesis thread
would. Checks that something does *not* arrive wait a short while: a blackhole never
delivers, so those waits can only make the test slower, never flaky.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.faults.proxy import BLACKHOLE, DOWNSTREAM, RESET, UPSTREAM, FaultProxy, ProxyLoop

QUIET = 0.3  # how long "nothing arrives" is watched
TIMEOUT = 10.0


class EchoServer:
    """Echoes every byte back; counts connections and bytes, on its own loop thread."""

    def __init__(self, loop: ProxyLoop) -> None:
        self.ploop = loop
        self.connections = 0
        self.received = 0
        self.server = loop.call(self._start())
        self.port = self.server.sockets[0].getsockname()[1]

    async def _start(self) -> asyncio.base_events.Server:
        server = self

        class Echo(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                server.connections += 1
                self.transport = transport

            def data_received(self, data: bytes) -> None:
                server.received += len(data)
                self.transport.write(data)  # type: ignore[attr-defined]

        return await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def loop() -> Iterator[ProxyLoop]:
    with ProxyLoop("test-proxy") as lp:
        yield lp


@pytest.fixture
def echo(loop: ProxyLoop) -> Iterator[EchoServer]:
    server = EchoServer(loop)
    yield server
    loop.call(server.close)


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy(echo.port) as p:
        yield p


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    s.settimeout(TIMEOUT)
    return s


def recv_exactly(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def nothing_arrives(s: socket.socket) -> bool:
    s.settimeout(QUIET)
    try:
        data = s.recv(1)
    except TimeoutError:
        return True
    finally:
        s.settimeout(TIMEOUT)
    raise AssertionError(f"received {data!r} through a cut link")


def wait_for(condition, what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def test_forwards_both_ways_in_order_with_backpressure(proxy: FaultProxy) -> None:
    payload = bytes(range(256)) * (8 << 10)  # 2 MiB: more than the socket buffers hold
    with connect(proxy.port) as s:
        sender = threading.Thread(target=s.sendall, args=(payload,))
        sender.start()
        assert recv_exactly(s, len(payload)) == payload
        sender.join()
    stats = proxy.stats()
    assert stats.accepted == 1
    assert stats.bytes_upstream == stats.bytes_downstream == len(payload)


def test_reset_kills_connections_and_refuses_new_ones(proxy: FaultProxy, echo: EchoServer) -> None:
    with connect(proxy.port) as s:
        s.sendall(b"ping")
        assert recv_exactly(s, 4) == b"ping"
        proxy.cut(RESET)
        with pytest.raises(ConnectionResetError):
            s.sendall(b"x")
            s.recv(1)
    with pytest.raises(ConnectionResetError), connect(proxy.port) as s:
        s.recv(1)  # accepted, then reset at once (maybe before connect() returns)
    assert echo.connections == 1
    assert proxy.stats().reset_on_accept == 1
    proxy.heal()
    with connect(proxy.port) as s:
        s.sendall(b"back")
        assert recv_exactly(s, 4) == b"back"


def test_blackhole_holds_everything_and_heal_delivers_it(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    with connect(proxy.port) as old:
        old.sendall(b"a")
        assert recv_exactly(old, 1) == b"a"
        proxy.cut(BLACKHOLE)
        assert proxy.state == "blackhole downstream,upstream"
        old.sendall(b"held")
        with connect(proxy.port) as new:  # accepted, never connected onward
            new.sendall(b"new")
            wait_for(lambda: proxy.stats().accepted == 2, "the second connection")
            assert nothing_arrives(old) and nothing_arrives(new)
            assert echo.connections == 1 and echo.received == 1
            proxy.heal()
            assert recv_exactly(old, 4) == b"held"
            assert recv_exactly(new, 3) == b"new"
    assert echo.connections == 2


@pytest.mark.parametrize("direction", [UPSTREAM, DOWNSTREAM])
def test_one_way_cut(proxy: FaultProxy, echo: EchoServer, direction: str) -> None:
    with connect(proxy.port) as s:
        proxy.cut(BLACKHOLE, direction=direction)
        s.sendall(b"one-way")
        if direction == DOWNSTREAM:  # the target gets it; its answer is held
            wait_for(lambda: echo.received == 7, "the target to receive")
        assert nothing_arrives(s)
        assert echo.received == (7 if direction == DOWNSTREAM else 0)
        proxy.heal()
        assert recv_exactly(s, 7) == b"one-way"


def test_delay_postpones_every_chunk_and_keeps_order(proxy: FaultProxy) -> None:
    proxy.delay(150, direction=UPSTREAM)
    with connect(proxy.port) as s:
        started = time.monotonic()
        for i in range(20):
            s.sendall(b"%02d" % i)
        got = recv_exactly(s, 40)
        assert time.monotonic() - started >= 0.149  # not before its due time
        assert got == b"".join(b"%02d" % i for i in range(20))
        proxy.delay(0)
        s.sendall(b"now")
        assert recv_exactly(s, 3) == b"now"


def test_half_close_travels_through(proxy: FaultProxy) -> None:
    with connect(proxy.port) as s:
        s.sendall(b"last words")
        s.shutdown(socket.SHUT_WR)
        assert recv_exactly(s, 10) == b"last words"
        assert s.recv(1) == b""  # the echo server closed after our EOF


def test_a_dead_target_is_a_reset(loop: ProxyLoop) -> None:
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        dead_port = placeholder.getsockname()[1]  # bound, never listening: refuses
        with (
            FaultProxy(dead_port, loop=loop) as p,
            pytest.raises((ConnectionResetError, EOFError)),
            connect(p.port) as s,  # the reset may come before connect() returns
        ):
            if not s.recv(1):
                raise EOFError


def test_close_resets_connections_and_stops_listening(echo: EchoServer) -> None:
    p = FaultProxy(echo.port).start()
    port = p.port
    s = connect(port)
    s.sendall(b"hi")
    assert recv_exactly(s, 2) == b"hi"
    p.close()
    with pytest.raises(ConnectionResetError):
        s.recv(1)
    s.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT).close()


def test_proxies_share_a_loop_and_take_controls_from_any_thread(
    loop: ProxyLoop, echo: EchoServer
) -> None:
    with FaultProxy(echo.port, loop=loop) as a, FaultProxy(echo.port, loop=loop) as b:
        with connect(a.port) as sa, connect(b.port) as sb:
            t = threading.Thread(target=a.cut, args=(BLACKHOLE,))
            t.start()
            t.join()
            sa.sendall(b"a")
            sb.sendall(b"b")
            assert recv_exactly(sb, 1) == b"b"  # the other link is untouched
            assert nothing_arrives(sa)
            a.reset_connections()
            with pytest.raises(ConnectionResetError):
                sa.recv(1)
        assert a.stats().resets == 1


def test_bad_controls_are_refused(proxy: FaultProxy) -> None:
    with pytest.raises(ValueError, match="both directions"):
        proxy.cut(RESET, direction=UPSTREAM)
    with pytest.raises(ValueError, match="mode"):
        proxy.cut("drop")
    with pytest.raises(ValueError, match="direction"):
        proxy.delay(10, direction="sideways")
    with pytest.raises(ValueError, match=">= 0"):
        proxy.delay(-1)
