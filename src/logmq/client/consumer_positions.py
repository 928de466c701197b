"""What an AsyncConsumer knows about each assigned partition, and where it starts.

The public API (client/consumer.py), the fetch tasks (client/fetch_loop.py) and the
group hooks (client/group_consumer.py) all read and move these positions, so they live
apart from any one of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from logmq.errors import LogMQError

EARLIEST = -2  # ListOffsets' special timestamps
LATEST = -1
RESET_TARGETS = {"earliest": EARLIEST, "latest": LATEST, "none": None}
"""``auto_offset_reset`` -> where ListOffsets looks (None: never reset, report it)."""


@dataclass(slots=True)
class PartitionState:
    position: int | None = None  # next offset poll() hands out; None until reset
    fetch_position: int | None = None  # where the next fetch starts (ahead of position)
    epoch: int = 0  # bumped by every seek: older fetched data is stale
    high_watermark: int = -1
    log_start_offset: int = -1
    error: LogMQError | None = None  # raised by the next poll()
    paused: bool = False  # by pause(), or while a group revokes it: not fetched
    processed: int | None = None  # position at the latest poll() call: done with
    committed: int | None = None  # last offset known committed for the group
