"""Zero-copy file-to-socket sending for uvloop transports.

uvloop implements neither ``loop.sendfile`` nor ``loop.sock_sendfile``, so the server
does it by hand: once the transport's write buffer is empty (bytes written through the
transport must reach the socket first, or the stream would be reordered), call
``os.sendfile`` on a ``dup()`` of the socket descriptor. The dup shares the socket's
non-blocking file description; when the socket is full we wait for writability with
``loop.add_writer`` on the dup (the transport keeps its own registration on the original
descriptor). Record bytes go from the page cache to the socket without entering Python.
The regions it sends are net/reply.py's FileRegion (storage.segment.FileSlice).
"""

from __future__ import annotations

import asyncio
import os


class ShortFileError(OSError):
    """The file ended before the announced region did (truncated under us).

    An OSError on purpose: the connection's writer treats it as any failed send (the
    connection closes; the answer is half written, so no error code can follow it)."""


async def wait_writable(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    fut = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_writer(fd, ready)
    try:
        await fut
    finally:
        loop.remove_writer(fd)


async def sendfile_all(
    loop: asyncio.AbstractEventLoop, sock_fd: int, file_fd: int, offset: int, count: int
) -> int:
    """Send ``count`` bytes of ``file_fd`` from ``offset`` to a non-blocking socket fd."""
    sent = 0
    while sent < count:
        try:
            n = os.sendfile(sock_fd, file_fd, offset + sent, count - sent)
        except BlockingIOError:
            await wait_writable(loop, sock_fd)
            continue
        except InterruptedError:
            continue
        if n == 0:
            raise ShortFileError(f"file ended after {sent} of {count} bytes at offset {offset}")
        sent += n
    return sent
