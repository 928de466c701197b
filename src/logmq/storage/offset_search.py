"""Finding offsets by timestamp in a partition log (ListOffsets, both front doors).

Rare requests (a client seeking by time, an admin asking for the newest record), so
they may decode the one batch that holds the answer; everything else is found from
the time index and the batch headers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from logmq.errors import ErrorCode, LogMQError
from logmq.storage import batch as b
from logmq.storage.compression import InflateLimitError

if TYPE_CHECKING:
    from logmq.storage.partition_log import PartitionLog

# ListOffsets' special timestamps
EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3


def offset_for(plog: PartitionLog, ts: int, committed: bool = False) -> tuple[int, int]:
    """ListOffsets for one partition: (offset, timestamp or -1) for ``ts``.

    EARLIEST is the log start, LATEST the high watermark, MAX_TIMESTAMP the record with
    the largest timestamp, any other ``ts >= 0`` the first record at or after it.
    ``committed`` (isolation level read_committed) bounds all of it by the last stable
    offset instead of the HW, as Kafka does: a read_committed consumer's "end" is where
    it can read to, and a search never answers a record it could not read yet.
    """
    if ts == EARLIEST:
        return plog.log_start_offset, -1
    bound = plog.last_stable_offset if committed else plog.high_watermark
    if ts == LATEST:
        return bound, -1
    if ts == MAX_TIMESTAMP:
        offset, found = max_timestamp_record(plog)
    elif ts < 0:
        raise LogMQError(f"invalid timestamp {ts}", ErrorCode.INVALID_REQUEST)
    else:
        offset, found = first_record_at_or_after(plog, ts)
    return (offset, found) if offset < bound else (-1, -1)


def first_record_at_or_after(plog: PartitionLog, ts: int) -> tuple[int, int]:
    """(offset, timestamp) of the first visible record, in offset order, with timestamp >= ts.

    The time index finds the first batch whose largest timestamp is >= ``ts``; every
    earlier batch is wholly older, so the answer is the first qualifying record of that
    batch (CreateTime timestamps need not grow within a batch, so its first records may
    be older). Only records at or above the log start offset count, which can push the
    answer into later batches. ListOffsets is rare, so decoding these batches is fine.
    (-1, -1) when no record below the high watermark is that recent.
    """
    hit = plog.offset_for_timestamp(ts)
    if hit is None:
        return -1, -1
    hw = plog.high_watermark
    offset = max(hit[0], plog.log_start_offset)
    while offset < hw:
        region = plog.read(offset, 1, max_offset=hw)  # the batch holding ``offset``, whole
        if region is None or region.length == 0:
            break
        data = region.read()
        for pos, h in b.iter_headers(data):
            if h.max_timestamp < ts or h.next_offset <= offset:
                continue
            if h.attributes & b.ATTR_LOG_APPEND_TIME:  # every record has the append time
                first = max(h.base_offset, offset)
                return (first, h.max_timestamp) if first < hw else (-1, -1)
            try:
                records = b.decode_records(data, pos, max_size=_budget(plog, h))
            except InflateLimitError:  # a bomb stored as sent: answer for the batch
                first = max(h.base_offset, offset)
                return (first, h.max_timestamp) if first < hw else (-1, -1)
            for rec_offset, rec_ts, *_ in records:
                if rec_offset >= hw:
                    return -1, -1
                if rec_offset >= offset and rec_ts >= ts:
                    return rec_offset, rec_ts
        if region.end_offset <= offset:
            break
        offset = region.end_offset
    return -1, -1


def max_timestamp_record(plog: Any) -> tuple[int, int]:
    """(offset, timestamp) of the record with the largest timestamp below the HW.

    The batches' headers say which batch holds it (the first with the largest
    ``max_timestamp``); only that batch is decoded. Rare (an admin asking), so a scan
    of the headers is fine.
    """
    hw = plog.high_watermark
    offset = plog.log_start_offset
    best: tuple[int, int, Any] | None = None  # (max ts, base offset, batch bytes)
    while offset < hw:
        region = plog.read(offset, 1 << 20, max_offset=hw)
        if region is None or region.length == 0:
            break
        data = region.read()
        nxt = offset
        for pos, h in b.iter_headers(data):
            if h.next_offset <= offset:
                continue
            if best is None or h.max_timestamp > best[0]:
                best = (h.max_timestamp, h.base_offset, bytes(data[pos : pos + h.size]))
            nxt = h.next_offset
        if nxt <= offset:
            break
        offset = nxt
    if best is None:
        return -1, -1
    ts, base, data = best
    try:
        records = b.decode_records(data, 0, max_size=_budget(plog, b.read_header(data)))
    except InflateLimitError:  # a bomb stored as sent: answer for the batch
        first = max(base, plog.log_start_offset)
        return (first, ts) if first < hw else (-1, -1)
    for rec_offset, rec_ts, *_ in records:
        if rec_ts == ts and rec_offset >= plog.log_start_offset and rec_offset < hw:
            return rec_offset, rec_ts
    return -1, -1


def _budget(plog: Any, h: b.BatchHeader) -> int:
    """How far a stored batch may inflate here: a bomb is answered for, never inflated."""
    return b.inflate_budget(h.size, plog.config.max_message_bytes)
