"""Hands out idempotent-producer ids that are never reused, cluster-wide, even across crashes.

Ids come in blocks allocated by the controller through the metadata log
(ProducerIdsBlock: every id below the image's ``next_producer_id`` is taken), so two
brokers never hand out the same id and a restarted broker never hands out one again. A
broker asks for a new block only when its current one is used up: one metadata commit per
``block_size`` producers. At most one block of ids is skipped per restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

Allocate = Callable[[int], Awaitable[int]]  # count -> first id of a fresh block


class ProducerIdManager:
    def __init__(self, allocate: Allocate, issued_below: Callable[[], int], block_size: int = 1000):
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self._allocate = allocate
        self._issued_below = issued_below
        self._block_size = block_size
        self._next = 0
        self._block_end = 0  # empty block: the first id asks for one
        self._lock = asyncio.Lock()

    async def next_id(self) -> int:
        async with self._lock:  # one allocation at a time; the others wait for its block
            if self._next >= self._block_end:
                start = await self._allocate(self._block_size)
                self._next, self._block_end = start, start + self._block_size
            pid = self._next
            self._next += 1
            return pid

    def was_issued(self, producer_id: int) -> bool:
        """True for ids some broker may have handed out (all below the allocated end).

        Ids skipped at a restart also count: they are never handed out again, so
        letting a client bump the epoch of one cannot collide with anyone.
        """
        return 0 <= producer_id < self._issued_below()
