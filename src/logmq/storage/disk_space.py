"""Free space of the data directory, and the guard that refuses produce before it runs out.

Like Redpanda's ``storage_min_free_bytes``: below ``min_free_bytes`` the broker refuses
client produce with DiskFullError, so that what must still be written (offset commits,
checkpoints, the metadata log, replication into this broker's own logs, recovery) has
room. Internal writes do not ask the guard; they stop only at a real ENOSPC.

Cheap by design: ``os.statvfs`` runs at most once per ``check_interval_s`` (plus once
when the estimate, last free space minus bytes appended since, crosses the guard), never
per request. A real ENOSPC marks the disk full at once; it clears when a later look
finds room again (retention, a deleted topic, a bigger disk), so appends resume by
themselves. Each change of state is logged once.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from logmq.errors import DiskFullError

log = logging.getLogger(__name__)

GIB = 1 << 30
DEFAULT_MIN_FREE_FRACTION = 0.05


def default_min_free_bytes(total_bytes: int) -> int:
    """The guard when none is configured: the smaller of 1 GiB and 5% of the disk."""
    return min(GIB, int(total_bytes * DEFAULT_MIN_FREE_FRACTION))


class DiskSpace:
    """Free bytes of one file system and whether produce must be refused.

    ``statvfs`` and ``clock`` are parameters so tests can drive it without a disk.
    """

    def __init__(
        self,
        path: str | Path,
        min_free_bytes: int | None = None,
        *,
        check_interval_s: float = 1.0,
        statvfs: Callable[[str | Path], os.statvfs_result] = os.statvfs,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self._configured_min = min_free_bytes
        self.min_free_bytes = min_free_bytes or 0
        self.check_interval_s = check_interval_s
        self._statvfs = statvfs
        self._clock = clock
        self.free_bytes = -1
        self.total_bytes = -1
        self._checked = float("-inf")
        self._since = 0  # bytes appended since the last statvfs
        self._need = 0  # > 0 after a refused or failed write: free bytes needed to resume
        self.full = False
        self.reason = ""

    def refresh(self) -> None:
        """Look at the file system now and update the state (logged when it changes)."""
        try:
            st = self._statvfs(self.path)
        except OSError as e:  # the directory vanished or the fs is gone: keep the last view
            log.error("cannot read free space of %s: %s", self.path, e)
            self._checked = self._clock()
            return
        self.free_bytes = st.f_bavail * st.f_frsize
        self.total_bytes = st.f_blocks * st.f_frsize
        if self._configured_min is None:
            self.min_free_bytes = default_min_free_bytes(self.total_bytes)
        self._checked = self._clock()
        self._since = 0
        self._evaluate()

    def _evaluate(self) -> None:
        # Resuming needs room for the write that was refused, beyond the guard: no
        # flapping (and no log line per second) while the disk hovers at the limit.
        if self._need and self.free_bytes >= self.min_free_bytes + self._need:
            self._need = 0
        if self.free_bytes < self.min_free_bytes:
            self._set_full(
                f"free space of {self.path} is below the minimum of "
                f"{self.min_free_bytes} bytes (--min-free-bytes)"
            )
        elif self._need:
            self._set_full(f"no room for a {self._need}-byte write in {self.path}")
        else:
            self._set_ok()

    def poll(self) -> bool:
        """Refresh if the last look is older than the interval; True if full."""
        if self._clock() - self._checked >= self.check_interval_s:
            self.refresh()
        return self.full

    def check_append(self, nbytes: int) -> None:
        """Raise DiskFullError if a client append of ``nbytes`` must be refused."""
        if self._clock() - self._checked >= self.check_interval_s:
            self.refresh()
        if not self.full and self._short_of(nbytes):
            if self._since:
                self.refresh()  # the estimate crossed the guard: look for real, once
            if self._short_of(nbytes):
                self._need = max(self._need, nbytes)
                self._evaluate()
        if self.full:
            raise DiskFullError(self.describe())

    def _short_of(self, nbytes: int) -> bool:
        """Whether the estimated free space after ``nbytes`` more is below the guard."""
        free = self.free_bytes
        return free >= 0 and free - self._since - nbytes < self.min_free_bytes

    def appended(self, nbytes: int) -> None:
        self._since += nbytes

    def write_failed(self, nbytes: int) -> None:
        """A write hit ENOSPC/EDQUOT: full until at least that much is free again."""
        self._need = max(self._need, nbytes, 1)
        self.refresh()

    def describe(self) -> str:
        """The message clients get: names the full disk, the data dir and the free bytes."""
        free = max(self.free_bytes - self._since, 0)
        return f"disk full: {self.reason} (data dir {self.path}, {free} bytes free)"

    def _set_full(self, reason: str) -> None:
        was = self.full
        self.full, self.reason = True, reason
        if not was:
            log.error(
                "disk full: %s (%d bytes free of %d): refusing produce until space is freed",
                reason,
                self.free_bytes,
                self.total_bytes,
            )

    def _set_ok(self) -> None:
        if self.full:
            log.warning(
                "disk space available again in %s (%d bytes free, minimum %d): accepting produce",
                self.path,
                self.free_bytes,
                self.min_free_bytes,
            )
        self.full, self.reason = False, ""
