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
from logmq.storage.batch_scan import (
    R_BASE_OFFSET,
    R_LAST_OFFSET_DELTA,
    R_LEADER_EPOCH,
    R_PRODUCER_ID,
    HeaderRow,
    scan_batches,
)

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
    """Iterate the rows (``batch_scan``: position, then the header's fields) of the valid
    prefix of a segment file.

    Reads in large chunks and checks each with one compiled call; stops at the first
    batch that fails validation or breaks the offset/epoch chain. Afterwards ``valid`` is
    the end of the valid prefix and ``reason`` says why the scan stopped early ("" for a
    clean end or a torn tail). Recovery also learns, without a second read, the rows of
    idempotent batches (``producer_rows``: producer state is rebuilt from them) and where
    each leader epoch starts (``epoch_starts``: the epoch cache is rebuilt from them,
    since it reaches disk only when the log is flushed).
    """

    def __init__(self, fd: int, size: int, base_offset: int, *, allow_gaps: bool = False) -> None:
        self.fd = fd
        self.size = size
        self.base_offset = base_offset
        self.allow_gaps = allow_gaps  # compacted logs: offsets only increase
        self.valid = 0
        self.reason = ""
        self.producer_rows: list[HeaderRow] = []  # valid batches with a producer id
        self.epoch_starts: list[tuple[int, int]] = []  # (leader epoch, first offset)

    @property
    def producers(self) -> bool:
        """A valid batch had a producer id (idempotent producer)."""
        return bool(self.producer_rows)

    def __iter__(self) -> Iterator[HeaderRow]:
        need = 0
        expect, epoch = self.base_offset, -1
        while self.valid < self.size:
            chunk = os.pread(
                self.fd, min(max(RECOVERY_CHUNK, need), self.size - self.valid), self.valid
            )
            rows, stop, need, reason = scan_batches(
                chunk, 0, len(chunk), expect, epoch, self.allow_gaps, False, self.valid
            )
            for row in rows:
                if row[R_PRODUCER_ID] >= 0:
                    self.producer_rows.append(row)
                if row[R_LEADER_EPOCH] > epoch:
                    epoch = row[R_LEADER_EPOCH]
                    self.epoch_starts.append((epoch, row[R_BASE_OFFSET]))
                yield row
            if rows:
                last = rows[-1]
                expect = last[R_BASE_OFFSET] + last[R_LAST_OFFSET_DELTA] + 1
            if reason and need and self.valid + len(chunk) < self.size:
                self.valid += stop  # a batch runs past the chunk: read on from it
                continue
            if reason:
                if len(chunk) - stop > b.MAGIC_POS and chunk[stop + b.MAGIC_POS] == OLD_MAGIC:
                    raise StorageError(
                        f"batch at position {self.valid + stop} is in logmq's batch format "
                        "1: this log was not converted to format 2 (docs/format.md)"
                    )
                self.valid += stop
                self.reason = reason
                return
            self.valid += stop


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
