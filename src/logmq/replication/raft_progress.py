"""What a leader knows about one follower's log, and how fast it may send to it.

A follower is in one of three states:

* PROBE: we don't know where its log diverges; send one AppendRequest, then wait for the
  answer (or the next heartbeat response) before sending another.
* REPLICATE: its log matched; stream entries optimistically, at most ``max_inflight``
  unacknowledged requests at a time.
* SNAPSHOT: it needs entries we compacted; a SnapshotRequest is on its way, send nothing
  else until it is acknowledged or times out.
"""

from __future__ import annotations

from collections import deque
from enum import Enum


class ProgressState(Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


class Progress:
    __slots__ = (
        "inflight",
        "match",
        "max_inflight",
        "next",
        "paused",
        "pending_snapshot",
        "quiet_ticks",
        "snapshot_ticks",
        "stalled_match",
        "state",
    )

    def __init__(self, next_index: int, max_inflight: int) -> None:
        self.match = 0
        self.next = next_index
        self.state = ProgressState.PROBE
        self.paused = False
        self.inflight: deque[int] = deque()  # last index of each unacknowledged request
        self.max_inflight = max_inflight
        self.pending_snapshot = 0
        self.snapshot_ticks = 0
        self.quiet_ticks = 0  # leader ticks since we last heard from it (check-quorum)
        self.stalled_match = -1  # match at the previous heartbeat response

    def become_probe(self) -> None:
        self.state = ProgressState.PROBE
        self.next = self.match + 1
        self.paused = False
        self.inflight.clear()

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.paused = False
        self.inflight.clear()

    def become_snapshot(self, index: int) -> None:
        self.state = ProgressState.SNAPSHOT
        self.pending_snapshot = index
        self.snapshot_ticks = 0
        self.inflight.clear()

    @property
    def is_paused(self) -> bool:
        if self.state is ProgressState.PROBE:
            return self.paused
        if self.state is ProgressState.REPLICATE:
            return len(self.inflight) >= self.max_inflight
        return True

    def sent(self, last_index: int) -> None:
        """An AppendRequest ending at ``last_index`` went out."""
        if self.state is ProgressState.REPLICATE:
            if last_index >= self.next:
                self.next = last_index + 1
                self.inflight.append(last_index)
        else:
            self.paused = True

    def update(self, match: int) -> bool:
        """A success response: returns True when it told us something new."""
        self.paused = False
        if match <= self.match:
            return False
        self.match = match
        self.next = max(self.next, match + 1)
        while self.inflight and self.inflight[0] <= match:
            self.inflight.popleft()
        return True

    def reject(self, reject_index: int, hint_index: int) -> bool:
        """A rejection: returns True if it was not stale and ``next`` moved back."""
        if self.state is ProgressState.SNAPSHOT:
            return False  # an answer to something sent before the snapshot
        if self.state is ProgressState.REPLICATE:
            if reject_index <= self.match:
                return False
            self.become_probe()
        elif self.next - 1 != reject_index:
            return False
        self.next = max(min(reject_index, hint_index), self.match + 1)
        self.paused = False
        return True
