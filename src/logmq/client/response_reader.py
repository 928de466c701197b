"""Frame splitting for the client's buffered protocol, with reusable big buffers.

Like the server's ``FrameReader`` (net/frame_reader.py), this lends the event loop its
own memory: small frames land in a scratch buffer and are copied out once, and a frame
too big for the scratch is read by the socket straight into a buffer of its own. The
difference is what a client receives: a stream of multi-megabyte fetch responses, each
decoded and dropped before long. Allocating a fresh 16 MB bytearray per response costs
zero-filling and page-faulting it (about as much as receiving it), so big buffers are
kept in a small pool and reused once nothing refers to the previous frame any more.
Sans-IO: it never sees a socket.
"""

from __future__ import annotations

import sys

from logmq.errors import FrameTooLargeError
from logmq.net.codec import DEFAULT_MAX_FRAME_SIZE, SIZE

SCRATCH_SIZE = 256 * 1024
POOL_SIZE = 3  # one response being read, one buffered, one being decoded


class ResponseReader:
    """``get_buffer()`` -> write into it -> ``buffer_updated(n)`` -> complete frames.

    Frames come out as memoryviews without the size prefix. A big frame's memoryview
    slices a pooled buffer; the buffer is reused only after every view of it is gone
    (checked through its reference count), so a frame stays valid as long as it is held.
    """

    __slots__ = (
        "_big",
        "_big_filled",
        "_big_size",
        "_end",
        "_pool",
        "_scratch",
        "_start",
        "max_frame_size",
    )

    def __init__(
        self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, scratch_size: int = SCRATCH_SIZE
    ) -> None:
        if scratch_size < 64:
            raise ValueError("scratch_size must be at least 64 bytes")
        self.max_frame_size = max_frame_size
        self._scratch = bytearray(scratch_size)
        self._start = 0  # first unparsed byte in the scratch
        self._end = 0  # end of received bytes in the scratch
        self._big: bytearray | None = None  # the buffer a big frame is being read into
        self._big_size = 0
        self._big_filled = 0
        self._pool: list[bytearray] = []

    @property
    def buffered(self) -> int:
        """Bytes received that do not yet form a complete frame."""
        return self._end - self._start + self._big_filled

    def get_buffer(self) -> memoryview:
        if self._big is not None:
            return memoryview(self._big)[self._big_filled : self._big_size]
        if self._end == len(self._scratch):
            n = self._end - self._start  # compact: move the partial frame to the front
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
        """Copy-in path (tests, transports without buffered reads)."""
        src = memoryview(data)
        frames: list[memoryview] = []
        while src:
            buf = self.get_buffer()
            n = min(len(buf), len(src))
            buf[:n] = src[:n]
            src = src[n:]
            frames.extend(self.buffer_updated(n))
        return frames

    def _take_big(self, size: int) -> bytearray:
        """A buffer of at least ``size`` bytes: a free pooled one, or a new one."""
        pool = self._pool
        for buf in pool:
            # 3 references: the pool's list, ``buf`` and getrefcount's argument. Any
            # memoryview of it (a frame still in use) holds one more.
            if len(buf) >= size and sys.getrefcount(buf) <= 3:
                return buf
        new = bytearray(size)
        if len(pool) < POOL_SIZE:
            pool.append(new)
        else:  # replace a free one that was too small (frames grew), if any
            for i in range(len(pool)):
                if sys.getrefcount(pool[i]) <= 2:  # the list and the argument
                    pool[i] = new
                    break
        return new

    def _split(self) -> list[memoryview]:
        frames: list[memoryview] = []
        buf = self._scratch
        while self._end - self._start >= SIZE.size:
            (size,) = SIZE.unpack_from(buf, self._start)
            if size > self.max_frame_size:
                self._start = self._end = 0
                raise FrameTooLargeError(
                    f"frame of {size} bytes exceeds the {self.max_frame_size}-byte limit"
                )
            body_start = self._start + SIZE.size
            have = self._end - body_start
            if have >= size:
                frames.append(memoryview(bytearray(buf[body_start : body_start + size])))
                self._start = body_start + size
                continue
            if SIZE.size + size > len(buf):
                big = self._take_big(size)
                big[:have] = buf[body_start : self._end]
                self._big, self._big_size, self._big_filled = big, size, have
                self._start = self._end = 0
            break
        if self._start == self._end:
            self._start = self._end = 0
        return frames
