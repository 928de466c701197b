"""Byte-bounded LRU caches for what remote reads download.

A consumer reading below the local log start reads a segment front to back, so the
chunk a fetch stopped in is usually the next fetch's first: ``ChunkCache`` keeps
verified ``.log`` chunks by (segment id, chunk index). ``IndexCache`` keeps each
segment's manifest and parsed indexes (Kafka's remote index cache, sized by
``remote.log.index.file.cache.total.size.bytes``): every fetch of a segment needs
them, and downloading them per fetch would double the store calls. Both are bounded
by the bytes they hold, not by entry count, since chunks and indexes vary in size
by orders of magnitude. Sans-IO: the reader fills them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any


class ByteLRU:
    """An LRU map whose bound is the total of its values' sizes (given at ``put``)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"a cache size cannot be negative: {max_bytes}")
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self.size_bytes = 0
        self.hits = self.misses = self.evictions = 0

    def get(self, key: Hashable) -> Any:
        """The value (now most recently used), or None; counts a hit or a miss."""
        item = self._items.get(key)
        if item is None:
            self.misses += 1
            return None
        self.hits += 1
        self._items.move_to_end(key)
        return item[0]

    def peek(self, key: Hashable) -> Any:
        """The value without counting or reordering (read-ahead asks this)."""
        item = self._items.get(key)
        return None if item is None else item[0]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def put(self, key: Hashable, value: Any, size: int) -> bool:
        """Keep ``value`` (``size`` bytes), evicting the least recently used to fit.

        A value larger than the whole cache is not kept (it would evict everything and
        then itself); returns whether it was kept.
        """
        if size < 0:
            raise ValueError(f"a cached value cannot have size {size}")
        self.discard(key)
        if size > self.max_bytes:
            return False
        items = self._items
        while self.size_bytes + size > self.max_bytes:
            _, (_, old) = items.popitem(last=False)
            self.size_bytes -= old
            self.evictions += 1
        items[key] = (value, size)
        self.size_bytes += size
        return True

    def discard(self, key: Hashable) -> None:
        item = self._items.pop(key, None)
        if item is not None:
            self.size_bytes -= item[1]

    def discard_where(self, segment_id: str) -> int:
        """Drop every entry of a segment (keys are ``(segment_id, ...)``): a deleted
        segment's bytes are never served again. Returns how many went."""
        gone = [k for k in self._items if isinstance(k, tuple) and k and k[0] == segment_id]
        for k in gone:
            self.discard(k)
        return len(gone)

    def clear(self) -> None:
        self._items.clear()
        self.size_bytes = 0


class ChunkCache(ByteLRU):
    """Verified ``.log`` chunks: (segment_id, chunk_index) -> bytes."""

    def get_chunk(self, segment_id: str, index: int) -> bytes | None:
        return self.get((segment_id, index))

    def put_chunk(self, segment_id: str, index: int, data: bytes) -> bool:
        return self.put((segment_id, index), data, len(data))


class IndexCache(ByteLRU):
    """A segment's manifest and parsed indexes: (segment_id, suffix) -> object, each
    counted at the size of the object it came from."""
