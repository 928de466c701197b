"""Reads below a tiered partition's local log start, for both front doors.

A consumer's fetch of an offset the local log no longer holds (consumer_reads.py hands
it here), and ListOffsets over both tiers: the remote segment that holds the offset is
found in the metadata image and read through the RemoteReader, which fetches only the
chunks it needs and checks each against the segment's manifest, so a corrupted object
is refused (and logged once), never served: the leader marks it corrupt in the quorum
(RemoteLogManager.report_corrupt), and until a replica that still holds its offsets
has copied them again they are answered KAFKA_STORAGE_ERROR, which clients retry.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from logmq.errors import ErrorCode, LogMQError
from logmq.storage.remote import planner
from logmq.storage.remote.segment_files import RemoteCorruptionError
from logmq.storage.remote.store import RemoteStorageError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from logmq.broker.replica.remote_log import RemoteLogManager
    from logmq.storage.partition_log import PartitionLog
    from logmq.storage.remote.segment_metadata import RemoteSegment

log = logging.getLogger("logmq.remote")


class RemoteReads:
    """The remote tier's read side, over the manager's segments, reader and counters."""

    def __init__(self, manager: RemoteLogManager) -> None:
        self.manager = manager
        self._corrupt: set[str] = set()  # segment ids found corrupt (logged once)

    def log_start_offset(self, plog: PartitionLog) -> int:
        """The partition's log start over both tiers (what clients are told)."""
        return self.manager.log_start_offset(plog)

    # -- ListOffsets over the remote part ----------------------------------------------
    async def offset_for_timestamp(
        self, plog: PartitionLog, ts: int, committed: bool
    ) -> tuple[int, int] | None:
        """The first record at or after ``ts`` in the remote tier, if it is there: the
        first readable remote segment whose max timestamp reaches ``ts`` and which the
        local log does not hold (None: search the local log)."""
        bound = plog.last_stable_offset if committed else plog.high_watermark
        remote = self.manager.remote_segments(plog.topic, plog.partition)
        for seg in remote:
            if not seg.finished or seg.max_timestamp < ts:
                continue
            if seg.base_offset >= plog.log_start_offset:
                return None  # the local log holds it, and the rest
            seg = self._servable(plog, remote, seg)
            hit = await self.manager.reader.offset_for_timestamp(plog.topic, seg, ts)
            if hit is not None:
                return hit if hit[0] < bound else (-1, -1)
        return None

    async def max_timestamp_offset(self, plog: PartitionLog, committed: bool) -> tuple[int, int]:
        """The record with the largest timestamp over both tiers (the first such)."""
        from logmq.storage.offset_search import MAX_TIMESTAMP, offset_for

        local = offset_for(plog, MAX_TIMESTAMP, committed)
        best = None
        remote = self.manager.remote_segments(plog.topic, plog.partition)
        for seg in remote:
            below = seg.finished and seg.base_offset < plog.log_start_offset
            if below and (best is None or seg.max_timestamp > best.max_timestamp):
                best = seg
        if best is None or (local[0] >= 0 and local[1] >= best.max_timestamp):
            return local
        best = self._servable(plog, remote, best)
        hit = await self.manager.reader.offset_for_timestamp(plog.topic, best, best.max_timestamp)
        return hit if hit is not None else local

    # -- reads below the local log start -----------------------------------------------
    async def read(
        self, plog: PartitionLog, offset: int, max_bytes: int, upper: int, committed: bool
    ) -> tuple[bytes | None, list[tuple[int, int]] | None]:
        """Whole batches from the remote segment holding ``offset``, below ``upper``, and
        for read_committed the aborted transactions among them."""
        remote = self.manager.remote_segments(plog.topic, plog.partition)
        seg = planner.segment_for_offset(remote, offset)
        if seg is None:
            self._refuse_corrupt(remote, offset)
            raise LogMQError(
                f"offset {offset} of {plog.topic}-{plog.partition} is in no remote segment",
                ErrorCode.OFFSET_OUT_OF_RANGE,
            )
        self.manager.stats.fetch_requests += 1
        try:
            data = await self.manager.reader.read(
                plog.topic, seg, offset, max_bytes, max_offset=min(upper, seg.end_offset + 1)
            )
        except RemoteStorageError as e:
            self.manager.stats.fetch_errors += 1
            if isinstance(e, RemoteCorruptionError) and seg.segment_id not in self._corrupt:
                self._corrupt.add(seg.segment_id)  # said once per segment
                self.manager.report_corrupt(plog, seg)
                log.error(
                    "remote segment %s of %s-%d [%d, %d] is corrupt and is not served: %s",
                    seg.segment_id,
                    plog.topic,
                    plog.partition,
                    seg.base_offset,
                    seg.end_offset,
                    e,
                )
            raise
        if not data:
            return None, None
        self.manager.stats.fetch_bytes += len(data)
        aborted = None
        if committed:
            end = _batches_end(data)
            # an ABORT marker may be in a later segment than the data it aborts: go on
            # through the later remote segments, then the local log, as Kafka does
            # (a corrupt one's transaction index too: verified on its own, its markers
            # are still the log's)
            later = [s for s in remote if s.finished and s.base_offset >= seg.base_offset]
            found, passed = await self.manager.reader.collect_aborted(
                plog.topic, later, offset, end
            )
            if not passed:
                found += plog.aborted_transactions(offset, end)
            aborted = list(dict.fromkeys(found)) or None
        return data, aborted

    def _servable(
        self, plog: PartitionLog, remote: Sequence[RemoteSegment], seg: RemoteSegment
    ) -> RemoteSegment:
        """``seg``, or the copy that replaced it; a corrupt one with none is refused."""
        if not seg.corrupt:
            return seg
        better = planner.segment_for_offset(remote, seg.base_offset)
        if better is not None:
            return better
        self._refuse_corrupt(remote, seg.base_offset)
        return seg

    def _refuse_corrupt(self, remote: Sequence[RemoteSegment], offset: int) -> None:
        """Raise for ``offset`` if a segment found corrupt holds it (and none else)."""
        for seg in remote:
            if seg.corrupt and seg.finished and seg.base_offset <= offset <= seg.end_offset:
                self.manager.stats.fetch_errors += 1
                raise RemoteCorruptionError(
                    f"offset {offset} is in remote segment {seg.segment_id}, found corrupt: "
                    "not served until a replica that holds it copies it again"
                )


def _batches_end(data: bytes) -> int:
    """The offset after the last batch in ``data`` (headers only)."""
    from logmq.storage import batch as b

    end = -1
    for _pos, h in b.iter_headers(data):
        end = h.next_offset
    return end


EARLIEST_LOCAL, LATEST_TIERED = -4, -5  # ListOffsets v8 and v9 (KIP-405, KIP-1005)


async def list_offset(
    remote: RemoteReads | None, plog: PartitionLog, ts: int, committed: bool
) -> tuple[int, int]:
    """ListOffsets for one partition over both tiers, for both front doors.

    EARLIEST is the start of the remote tier when the partition tiers, EARLIEST_LOCAL
    (-4) the local log start, LATEST_TIERED (-5) the highest offset copied (-1: none, as
    on an untiered topic), and a timestamp is searched in the remote segments first
    when the local log does not reach back far enough.
    """
    from logmq.storage.offset_search import EARLIEST, MAX_TIMESTAMP, offset_for

    if remote is None or not plog.remote_managed:
        if ts == LATEST_TIERED:
            return -1, -1
        return offset_for(plog, EARLIEST if ts == EARLIEST_LOCAL else ts, committed)
    if ts == EARLIEST:
        return remote.manager.log_start_offset(plog), -1
    if ts == EARLIEST_LOCAL:
        return plog.log_start_offset, -1
    if ts == LATEST_TIERED:
        return remote.manager.highest_copied_offset(plog), -1
    if ts == MAX_TIMESTAMP:
        return await remote.max_timestamp_offset(plog, committed)
    if ts >= 0:
        found = await remote.offset_for_timestamp(plog, ts, committed)
        if found is not None:
            return found
    return offset_for(plog, ts, committed)
