"""The cleaner's offset map: key hash -> newest offset of that key in the dirty section.

Keys are replaced by 128-bit xxh3 hashes (Kafka uses 128-bit MD5): a collision would make
the cleaner drop the newest record of a live key, and at 128 bits the odds for a billion
keys are about 10^-21. The map is a plain dict filled batch-wise with C-level
``dict.update(zip(...))``, so a newer offset simply overwrites an older one. Its size is
bounded by the cleaner buffer: at about ``ENTRY_BYTES`` of Python objects per key, a
dirty section with more keys than fit is cleaned in several passes, each ending at a
segment boundary (see log_cleaner.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from xxhash import xxh3_128_intdigest

ENTRY_BYTES = 128  # a 128-bit int key, an int offset and the dict slot, measured
NO_KEY = None  # hash of a record without a key (or with a key of an unusable type)


def key_hash(key: Any) -> int | None:
    """Hash of one record key; None for a missing key (bytes normally, str tolerated)."""
    if isinstance(key, bytes):
        return xxh3_128_intdigest(key)
    if isinstance(key, str):
        return xxh3_128_intdigest(key.encode())
    return NO_KEY


def key_hashes(keys: list[Any]) -> list[int | None]:
    """Hashes of a batch's keys: one C-level map when every key is bytes."""
    try:
        return list(map(xxh3_128_intdigest, keys))
    except TypeError:  # a None (keyless) or str key somewhere: the per-key path
        return list(map(key_hash, keys))


class OffsetMap:
    """Newest offset per key hash, with a capacity in entries."""

    __slots__ = ("_offsets", "capacity", "get")

    def __init__(self, buffer_bytes: int) -> None:
        self.capacity = max(1, buffer_bytes // ENTRY_BYTES)
        self._offsets: dict[int | None, int] = {}
        self.get = self._offsets.get  # hot in the cleaner: one bound method, no wrapper

    def __len__(self) -> int:
        return len(self._offsets)

    def __contains__(self, h: object) -> bool:
        return h in self._offsets

    def room_for(self, n: int) -> bool:
        return len(self._offsets) + n <= self.capacity

    def update(self, entries: dict[int | None, int] | Iterable[tuple[int | None, int]]) -> None:
        """Add (hash, offset) pairs in offset order: later offsets win."""
        self._offsets.update(entries)
        self._offsets.pop(NO_KEY, None)  # keyless records are never "the newest"
