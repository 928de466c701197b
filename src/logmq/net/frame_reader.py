"""The one frame reader: ``u32 size`` + ``size`` bytes, with a size limit checked first.

FrameReader serves ``readinto``-style receiving (asyncio.BufferedProtocol): it lends the
loop its own memory to read into, so small frames land in a reusable scratch buffer and
are copied out once, and a frame too big for the scratch gets a buffer of its exact size,
allocated after the size check, which the socket reads the rest of it straight into — a
1 MB produce is never copied in Python. A size prefix is a claim, not bytes: above
``eager_size`` (1 MiB) the buffer starts at that and doubles as the bytes arrive, so four
bytes announcing 100 MB cost 1 MiB, not 100 MB (the doubling copies at most the frame's
size once more). FrameReader is sans-IO: it never sees a socket.
``read_frame`` is the same framing for code on asyncio streams (the Raft transport), so
the format, the limit check and its error exist once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from logmq.errors import FrameTooLargeError
from logmq.net.codec import DEFAULT_MAX_FRAME_SIZE, SIZE

if TYPE_CHECKING:
    import asyncio

SCRATCH_SIZE = 64 * 1024  # per connection: 1,000 connections cost 64 MiB
EAGER_SIZE = 1 << 20  # a frame up to this gets its whole buffer at once


def frame_too_large(size: int, max_frame_size: int) -> FrameTooLargeError:
    """The error for a frame announcing ``size`` bytes over the limit."""
    return FrameTooLargeError(f"frame of {size} bytes exceeds the {max_frame_size}-byte limit")


async def read_frame(reader: asyncio.StreamReader, max_frame_size: int) -> bytes:
    """Read one frame's payload from a stream; FrameTooLargeError before allocating it.

    Raises asyncio.IncompleteReadError if the stream ends mid-frame.
    """
    (size,) = SIZE.unpack(await reader.readexactly(SIZE.size))
    if size > max_frame_size:
        raise frame_too_large(size, max_frame_size)
    return await reader.readexactly(size)


class FrameReader:
    """``get_buffer()`` -> write into it -> ``buffer_updated(n)`` -> complete frames.

    Frames come out as writable memoryviews (without the size prefix) that own their
    memory. A size above ``max_frame_size`` raises FrameTooLargeError before anything
    is allocated for it.
    """

    __slots__ = (
        "_big",
        "_big_filled",
        "_big_size",
        "_end",
        "_scratch",
        "_start",
        "eager_size",
        "max_frame_size",
    )

    def __init__(
        self,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        scratch_size: int = SCRATCH_SIZE,
        eager_size: int = EAGER_SIZE,
    ):
        if scratch_size < 64:
            raise ValueError("scratch_size must be at least 64 bytes")
        self.max_frame_size = max_frame_size
        self.eager_size = max(eager_size, scratch_size)
        self._scratch = bytearray(scratch_size)
        self._start = 0  # first unparsed byte in the scratch
        self._end = 0  # end of received bytes in the scratch
        self._big: bytearray | None = None  # the buffer a large frame is received into
        self._big_size = 0  # that frame's size (the buffer may be smaller: see _grow_big)
        self._big_filled = 0

    @property
    def buffered(self) -> int:
        """Bytes received that do not yet form a complete frame."""
        return self._end - self._start + self._big_filled

    def get_buffer(self) -> memoryview:
        if self._big is not None:
            if self._big_filled == len(self._big):
                self._grow_big()
            return memoryview(self._big)[self._big_filled : self._big_size]
        if self._end == len(self._scratch):
            # compact: move the partial frame to the front (at most one small frame)
            n = self._end - self._start
            self._scratch[:n] = self._scratch[self._start : self._end]
            self._start, self._end = 0, n
        return memoryview(self._scratch)[self._end :]

    def buffer_updated(self, nbytes: int) -> list[memoryview]:
        if self._big is not None:
            self._big_filled += nbytes
            if self._big_filled < self._big_size:
                return []
            frame = memoryview(self._big)[: self._big_size]
            self._big, self._big_filled, self._big_size = None, 0, 0
            return [frame]
        self._end += nbytes
        return self._split()

    def feed(self, data: bytes | bytearray | memoryview) -> list[memoryview]:
        """Copy ``data`` in and return the frames it completes (tests, ``bytes`` callers)."""
        src = memoryview(data)
        frames: list[memoryview] = []
        while src:
            buf = self.get_buffer()
            n = min(len(buf), len(src))
            buf[:n] = src[:n]
            src = src[n:]
            frames.extend(self.buffer_updated(n))
        return frames

    def _split(self) -> list[memoryview]:
        frames: list[memoryview] = []
        buf = self._scratch
        while self._end - self._start >= SIZE.size:
            (size,) = SIZE.unpack_from(buf, self._start)
            if size > self.max_frame_size:
                self._start = self._end = 0
                raise frame_too_large(size, self.max_frame_size)
            body_start = self._start + SIZE.size
            have = self._end - body_start
            if have >= size:
                frames.append(memoryview(bytearray(buf[body_start : body_start + size])))
                self._start = body_start + size
                continue
            if SIZE.size + size > len(buf):
                # Too big for the scratch: give it its own buffer; the socket fills the rest.
                big = self._take_big(size)
                big[:have] = buf[body_start : self._end]
                self._big, self._big_size, self._big_filled = big, size, have
                self._start = self._end = 0
            break
        if self._start == self._end:
            self._start = self._end = 0
        return frames

    def _take_big(self, size: int) -> bytearray:
        """The buffer a frame too big for the scratch starts in: ``size`` bytes up to
        ``eager_size``, else ``eager_size`` bytes that ``_grow_big`` doubles as the bytes
        arrive. (A subclass may return a larger buffer, even one over ``size``.)"""
        return bytearray(min(size, self.eager_size))

    def _grow_big(self) -> None:
        """The large frame's buffer is full but the frame is not: a new one twice as big
        (at most the frame), so memory follows the bytes received, not the size claimed.
        A new buffer, not a resize: the loop may still hold a view of the old one."""
        old = self._big
        assert old is not None
        big = bytearray(min(self._big_size, 2 * len(old)))
        big[: len(old)] = old
        self._big = big
