"""Can the broker listen where it was told to? Asked before it touches its data dir.

A port already taken used to surface as a bare ``[Errno 98] ... address already in use``
from deep inside the start, after storage had created the data dir, with no word of which
listener it was or which option moves it. The broker now tries every fixed port of its
plan first (bind and listen, as ``loop.create_server`` will, then close at once) and
stops with one line naming the listener and its option. The real bind can still lose a
race to another process; ``unavailable`` words that failure the same way.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from logmq.errors import ErrorCode, LogMQError


@dataclass(frozen=True, slots=True)
class PlannedListener:
    """A port the broker will listen on, with what to tell a user about it."""

    what: str  # "the Kafka listener PLAINTEXT", "the metrics endpoint"
    host: str
    port: int
    option: str  # how to move it: "--kafka-port", "the listeners property", ...
    any_port: bool = True  # whether port 0 (any free port) is a choice there


class ListenerUnavailableError(LogMQError):
    """A listener cannot bind its address; the message names the option that moves it."""

    def __init__(self, listener: PlannedListener, message: str):
        self.listener = listener
        super().__init__(message, ErrorCode.BROKER_NOT_AVAILABLE)


def unavailable(listener: PlannedListener, err: OSError) -> ListenerUnavailableError:
    """The user's view of a failed bind of ``listener``."""
    where = f"{listener.host or '*'}:{listener.port}"
    if err.errno == errno.EADDRINUSE:
        why = "address already in use"
        fix = f"stop what holds it or choose another port with {listener.option}"
        if listener.any_port:
            fix += " (0: any free port)"
    elif err.errno == errno.EADDRNOTAVAIL:
        why = f"{listener.host} is not an address of this machine"
        fix = f"change the host ({listener.option})"
    elif err.errno == errno.EACCES:
        why = f"no permission to listen on port {listener.port}"
        fix = f"use a port above 1023 ({listener.option})"
    else:
        why = err.strerror or str(err)
        fix = f"check {listener.option}"
    return ListenerUnavailableError(
        listener, f"{listener.what} cannot listen on {where}: {why}; {fix}"
    )


def check_listeners(listeners: Iterable[PlannedListener]) -> None:
    """Raise ListenerUnavailableError for the first listener of the plan that cannot bind:
    two of them on one port, or a port another process holds. Port 0 always binds."""
    planned = [lst for lst in listeners if lst.port != 0]
    for i, a in enumerate(planned):
        for b in planned[:i]:
            if a.port == b.port and _overlap(a.host, b.host):
                raise ListenerUnavailableError(
                    a,
                    f"{b.what} and {a.what} both want port {a.port}: give one of them "
                    f"another port ({b.option}, {a.option})",
                )
    for lst in planned:
        try:
            _try_bind(lst.host, lst.port)
        except OSError as err:
            raise unavailable(lst, err) from None


def _overlap(a: str, b: str) -> bool:
    return a == b or _wildcard(a) or _wildcard(b)


def _wildcard(host: str) -> bool:
    if not host:
        return True
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _try_bind(host: str, port: int) -> None:
    """Bind and listen on every address ``host`` resolves to, as asyncio's create_server
    does (SO_REUSEADDR, IPv6 sockets v6-only), and close them again."""
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as err:
        raise OSError(errno.EADDRNOTAVAIL, f"cannot resolve {host!r}: {err}") from None
    opened: list[socket.socket] = []
    try:
        for family, kind, proto, _name, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            opened.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(1)
    finally:
        for sock in opened:
            sock.close()
