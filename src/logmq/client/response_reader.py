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

from logmq.net.codec import DEFAULT_MAX_FRAME_SIZE
from logmq.net.frame_reader import FrameReader

SCRATCH_SIZE = 256 * 1024
POOL_SIZE = 3  # one response being read, one buffered, one being decoded


class ResponseReader(FrameReader):
    """``get_buffer()`` -> write into it -> ``buffer_updated(n)`` -> complete frames.

    Frames come out as memoryviews without the size prefix. A big frame's memoryview
    slices a pooled buffer; the buffer is reused only after every view of it is gone
    (checked through its reference count), so a frame stays valid as long as it is held.
    """

    __slots__ = ("_pool",)

    def __init__(
        self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, scratch_size: int = SCRATCH_SIZE
    ) -> None:
        super().__init__(max_frame_size, scratch_size)
        self._pool: list[bytearray] = []

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
