"""A TCP proxy for fault tests: forwards bytes, and can swallow a response."""

from __future__ import annotations

import asyncio


class CutProxy:
    """A 127.0.0.1 TCP proxy that can swallow a response and drop the connection.

    ``arm()`` makes the next connection it accepts lose its first response: the broker
    has processed the request, the client never hears back and must retry.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.armed = False
        self.cut = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> CutProxy:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def arm(self) -> None:
        self.armed = True

    async def _handle(self, creader, cwriter) -> None:
        cut_this = self.armed
        self.armed = False
        breader, bwriter = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [cwriter, bwriter]

        async def pipe(reader, writer, cut: bool) -> None:
            try:
                while data := await reader.read(65536):
                    if cut:
                        cwriter.transport.abort()
                        bwriter.close()
                        self.cut.set()
                        return
                    writer.write(data)
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        up = asyncio.create_task(pipe(creader, bwriter, False))
        down = asyncio.create_task(pipe(breader, cwriter, cut_this))
        self._tasks |= {up, down}
        await asyncio.gather(up, down, return_exceptions=True)

    async def stop(self) -> None:
        self.server.close()
        for w in self._writers:
            w.close()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.server.wait_closed()
