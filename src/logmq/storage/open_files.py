"""A least-recently-used cap on segments holding open descriptors and index mmaps.

Thousands of partitions times many segments would otherwise pin thousands of file
descriptors and mappings for data nobody reads. Segments open lazily when touched and
the coldest are closed when the cap is passed. An evicted segment only drops its own
references: a FileSlice handed to a sender keeps its file object (and so its
descriptor) alive until the send is done.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Protocol


class Closable(Protocol):
    def close_handles(self) -> None: ...


class OpenFileCache:
    def __init__(self, capacity: int = 1000) -> None:
        self.capacity = max(2, capacity)
        self._open: OrderedDict[int, Closable] = OrderedDict()
        self._used: dict[int, float] = {}  # monotonic time of last use
        self.evictions = 0
        self._last = -1  # most recently touched key: the hot path skips reordering

    def __len__(self) -> int:
        return len(self._open)

    def touch(self, item: Closable) -> None:
        """Mark ``item`` as just used (it has opened its handles); evict the coldest."""
        key = id(item)
        self._used[key] = time.monotonic()
        if key == self._last:
            return
        self._last = key
        if key in self._open:
            self._open.move_to_end(key)
            return
        self._open[key] = item
        while len(self._open) > self.capacity:
            cold_key, cold = self._open.popitem(last=False)
            del self._used[cold_key]
            self.evictions += 1
            cold.close_handles()

    def close_idle(self, idle_seconds: float) -> int:
        """Close everything unused for ``idle_seconds`` (oldest first); returns how many."""
        limit = time.monotonic() - idle_seconds
        closed = 0
        while self._open:
            key, item = next(iter(self._open.items()))
            if self._used[key] > limit:
                break
            del self._open[key], self._used[key]
            if key == self._last:
                self._last = -1
            item.close_handles()
            closed += 1
        return closed

    def forget(self, item: Closable) -> None:
        """``item`` closed its handles itself (close, delete)."""
        self._open.pop(id(item), None)
        self._used.pop(id(item), None)
        if id(item) == self._last:
            self._last = -1
