"""Checksumming batches already on disk: recovery scans and first-read verification.

Offsets and leader epochs sit outside the batch checksum, so a recovery scan also
checks that they chain. Reads of data from before a restart are checksummed once per
byte range; ``VerifiedRanges`` remembers which ranges are done.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from logmq.errors import CorruptRecordError, StorageError
from logmq.storage import batch as b

log = logging.getLogger(__name__)

RECOVERY_CHUNK = 4 << 20
VERIFY_CHUNK = 4 << 20
# Batches of logmq's format before Kafka's v2: never truncated as damage (format_upgrade.py).
OLD_MAGIC = 1


class VerifiedRanges:
    """Disjoint sorted byte ranges already checksummed."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def add(self, start: int, end: int) -> None:
        if start >= end:
            return
        if self.ends and self.ends[-1] == start:  # the append path: extend the tail
            self.ends[-1] = end
            return
        i = bisect.bisect_left(self.ends, start)
        j = bisect.bisect_right(self.starts, end)
        if i < j:
            start = min(start, self.starts[i])
            end = max(end, self.ends[j - 1])
        self.starts[i:j] = [start]
        self.ends[i:j] = [end]

    def gaps(self, start: int, end: int) -> Iterator[tuple[int, int]]:
        """Sub-ranges of [start, end) not yet verified, in order."""
        i = bisect.bisect_right(self.ends, start)
        pos = start
        while pos < end:
            if i < len(self.starts) and self.starts[i] <= pos:
                pos = self.ends[i]
                i += 1
                continue
            nxt = self.starts[i] if i < len(self.starts) else end
            yield pos, min(nxt, end)
            pos = min(nxt, end)

    def cut(self, size: int) -> None:
        i = bisect.bisect_left(self.starts, size)
        del self.starts[i:], self.ends[i:]
        if self.ends and self.ends[-1] > size:
            self.ends[-1] = size


class RecoveryScan:
    """Iterate (position, header) of the valid prefix of a segment file.

    Reads in large chunks; stops at the first batch that fails validation or breaks
    the offset/epoch chain. Afterwards ``valid`` is the end of the valid prefix and
    ``reason`` says why the scan stopped early ("" for a clean end or a torn tail).
    """

    def __init__(self, fd: int, size: int, base_offset: int, *, allow_gaps: bool = False) -> None:
        self.fd = fd
        self.size = size
        self.base_offset = base_offset
        self.allow_gaps = allow_gaps  # compacted logs: offsets only increase
        self.valid = 0
        self.reason = ""
        self.producers = False  # a valid batch had a producer id (idempotent producer)

    def __iter__(self) -> Iterator[tuple[int, b.BatchHeader]]:
        need = 0
        expect, epoch = self.base_offset, -1
        while self.valid < self.size:
            chunk = os.pread(
                self.fd, min(max(RECOVERY_CHUNK, need), self.size - self.valid), self.valid
            )
            need, pos = 0, 0
            while pos < len(chunk):
                rem = len(chunk) - pos
                size = b.peek_size(chunk, pos) if rem >= b.LOG_OVERHEAD else b.HEADER_SIZE
                more = self.valid + len(chunk) < self.size
                if more and max(size, b.HEADER_SIZE) > rem and size <= b.MAX_BATCH_SIZE:
                    need = max(size, b.HEADER_SIZE)  # batch spans the chunk: refill
                    break
                try:
                    h = b.validate(chunk, pos, contiguous=False)
                    check_chain(h, expect, epoch, self.allow_gaps)
                except CorruptRecordError as e:
                    if rem > b.MAGIC_POS and chunk[pos + b.MAGIC_POS] == OLD_MAGIC:
                        raise StorageError(
                            f"batch at position {self.valid + pos} is in logmq's batch format "
                            "1: this log was not converted to format 2 (docs/format.md)"
                        ) from None
                    self.valid += pos
                    self.reason = str(e)
                    return
                yield self.valid + pos, h
                if h.producer_id >= 0:
                    self.producers = True
                expect, epoch = h.next_offset, h.leader_epoch
                pos += h.size
            self.valid += pos


def check_chain(h: b.BatchHeader, expect: int, epoch: int, allow_gaps: bool = False) -> None:
    """Offsets and leader epochs are outside the checksum: check they chain instead.

    With ``allow_gaps`` (a compacted log, whose cleaner drops whole batches) a batch
    may start after the previous one's end, but never before it.
    """
    if expect >= 0 and (h.base_offset < expect if allow_gaps else h.base_offset != expect):
        raise CorruptRecordError(f"batch base offset {h.base_offset} does not follow {expect}")
    if h.leader_epoch < epoch:
        raise CorruptRecordError(f"leader epoch {h.leader_epoch} goes back from {epoch}")


def verify_range(fd: int, path: Path, verified: VerifiedRanges, start: int, end: int) -> int:
    """Checksum unverified bytes of [start, end); returns the end of the valid prefix.

    ``start`` and ``end`` are batch boundaries. Raises CorruptRecordError (naming file
    and position) if the batch at ``start`` itself is bad.
    """
    for gap_start, gap_end in list(verified.gaps(start, end)):
        pos = gap_start
        while pos < gap_end:  # bounded chunks: a huge fetch must not mean a huge buffer
            data = os.pread(fd, min(gap_end - pos, VERIFY_CHUNK), pos)
            if len(data) >= b.LOG_OVERHEAD:
                need = b.peek_size(data, 0)
                if len(data) < need <= gap_end - pos:  # one batch larger than a chunk
                    data = os.pread(fd, need, pos)
            at = 0
            while at < len(data):
                rem = len(data) - at
                if (
                    at
                    and pos + len(data) < gap_end
                    and (rem < b.HEADER_SIZE or b.peek_size(data, at) > rem)
                ):
                    break  # this batch spans the chunk end: the next chunk starts at it
                try:
                    h = b.validate(data, at, contiguous=False)
                except CorruptRecordError as e:
                    where = pos + at
                    log.error("corrupt batch in %s at position %d: %s", path, where, e)
                    if where == start:
                        raise CorruptRecordError(
                            f"corrupt batch in {path} at position {where}: {e}"
                        ) from None
                    verified.add(gap_start, where)
                    return where
                at += h.size
            pos += at
            verified.add(gap_start, pos)
    return end
