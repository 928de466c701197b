"""Hands out idempotent-producer ids that are never reused, even across crashes.

Ids are reserved in blocks: the end of the current block is persisted (atomically)
before any id from it is handed out, so after a restart, crash or not, the broker starts
from a fresh block. At most one block of ids is skipped per restart; that is the price of
one fsync per ``block_size`` producers instead of one per producer.
"""

from __future__ import annotations

from pathlib import Path

from logmq.broker.metadata_store import atomic_write

PRODUCER_ID_FILE = "producer-id-block"


class ProducerIdManager:
    def __init__(self, data_dir: Path, block_size: int = 1000):
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self._path = data_dir / PRODUCER_ID_FILE
        self._block_size = block_size
        start = 0
        if self._path.exists():
            text = self._path.read_text().strip()
            try:
                start = int(text)
            except ValueError:
                raise ValueError(f"malformed {self._path}: {text!r}") from None
        self._next = start
        self._block_end = start  # empty block: the first allocation reserves one

    def next_id(self) -> int:
        if self._next >= self._block_end:
            end = self._next + self._block_size
            atomic_write(self._path, f"{end}\n".encode())
            self._block_end = end
        pid = self._next
        self._next += 1
        return pid

    def was_issued(self, producer_id: int) -> bool:
        """True for ids this broker may have handed out (all below the next id).

        Ids skipped at a restart also count: they are never handed out again, so
        letting a client bump the epoch of one cannot collide with anyone.
        """
        return 0 <= producer_id < self._next
