"""What an AsyncConsumer knows about each assigned partition, and where it starts.

The public API (client/consumer.py), the fetch tasks (client/fetch_loop.py) and the
group hooks (client/group_consumer.py) all read and move these positions, so they live
apart from any one of them.
"""

from __future__ import annotations

from logmq.errors import LogMQError

TopicPartition = tuple[str, int]

EARLIEST = -2  # ListOffsets' special timestamps
LATEST = -1
RESET_TARGETS = {"earliest": EARLIEST, "latest": LATEST, "none": None}
"""``auto_offset_reset`` -> where ListOffsets looks (None: never reset, report it)."""


class Changes:
    """Which partitions changed since each reader last looked, so that no poll or fetch
    walks the whole assignment: with 10,000 partitions that walk was most of the work.

    ``fetch``: where the next fetch starts, pausing or an error changed (the fetch
    tasks send these); ``moved``: the position moved (``poll`` marks them processed);
    ``errors``/``unpositioned``: partitions with an error or without a position now.
    """

    __slots__ = ("errors", "fetch", "moved", "unpositioned")

    def __init__(self) -> None:
        self.fetch: set[TopicPartition] = set()
        self.moved: set[TopicPartition] = set()
        self.errors: set[TopicPartition] = set()
        self.unpositioned: set[TopicPartition] = set()


_NO_CHANGES = Changes()  # for states nobody tracks (tests, throwaway copies)


class PartitionState:
    """One assigned partition; setting a tracked field records the change in ``changes``."""

    __slots__ = (
        "_error",
        "_fetch_position",
        "_paused",
        "_position",
        "changes",
        "committed",
        "epoch",
        "high_watermark",
        "log_start_offset",
        "processed",
        "tp",
    )

    def __init__(
        self,
        position: int | None = None,
        fetch_position: int | None = None,
        committed: int | None = None,
        *,
        tp: TopicPartition = ("", -1),
        changes: Changes | None = None,
    ) -> None:
        self.tp = tp
        self.changes = changes if changes is not None else _NO_CHANGES
        self._position: int | None = None
        self._fetch_position: int | None = None
        self._error: LogMQError | None = None
        self._paused = False
        self.epoch = 0  # bumped by every seek: older fetched data is stale
        self.high_watermark = -1
        self.log_start_offset = -1
        self.processed: int | None = None  # position at the latest poll() call: done with
        self.committed = committed  # last offset known committed for the group
        self.position = position
        self.fetch_position = fetch_position

    @property
    def position(self) -> int | None:
        """The next offset poll() hands out; None until reset."""
        return self._position

    @position.setter
    def position(self, value: int | None) -> None:
        self._position = value
        changes = self.changes
        changes.moved.add(self.tp)
        if value is None:
            changes.unpositioned.add(self.tp)
        else:
            changes.unpositioned.discard(self.tp)

    @property
    def fetch_position(self) -> int | None:
        """Where the next fetch starts (ahead of ``position``)."""
        return self._fetch_position

    @fetch_position.setter
    def fetch_position(self, value: int | None) -> None:
        self._fetch_position = value
        self.changes.fetch.add(self.tp)

    @property
    def error(self) -> LogMQError | None:
        """Raised by the next poll()."""
        return self._error

    @error.setter
    def error(self, value: LogMQError | None) -> None:
        self._error = value
        changes = self.changes
        changes.fetch.add(self.tp)
        if value is None:
            changes.errors.discard(self.tp)
        else:
            changes.errors.add(self.tp)

    @property
    def paused(self) -> bool:
        """By pause(), or while a group revokes it: not fetched."""
        return self._paused

    @paused.setter
    def paused(self, value: bool) -> None:
        self._paused = value
        self.changes.fetch.add(self.tp)

    def forget(self) -> None:
        """Unassigned: drop out of the change sets (the fetch tasks forget it anyway)."""
        changes = self.changes
        changes.errors.discard(self.tp)
        changes.unpositioned.discard(self.tp)
        changes.moved.discard(self.tp)
