"""The contract between the Raft core and its shell: what is loaded, persisted and done.

The core never does I/O. At start-up the shell hands it a PersistentState read from disk;
afterwards each Ready says what to make durable, send and apply, in that order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from logmq.replication.raft_messages import EMPTY_SNAPSHOT, Entry, Message, Snapshot


@dataclass(slots=True, frozen=True)
class HardState:
    """What must be durable before the node acknowledges a vote or an append.

    ``commit`` is persisted too: not needed for safety, but it lets a restarted node
    replay committed entries into its state machine without waiting for a leader.
    """

    term: int = 0
    voted_for: int | None = None
    commit: int = 0


@dataclass(slots=True)
class PersistentState:
    """Everything the shell loaded from disk at start-up."""

    hard_state: HardState = field(default_factory=HardState)
    snapshot: Snapshot = EMPTY_SNAPSHOT
    entries: Sequence[Entry] = ()


@dataclass(slots=True, frozen=True)
class Ready:
    """One batch of work for the shell, to be carried out in this order.

    1. ``snapshot``: persist it and drop the whole persisted log; restore the state
       machine from ``snapshot.data``.
    2. ``truncate_from``: delete persisted entries with index >= this.
    3. ``entries``: append them to the persisted log.
    4. ``hard_state``: persist it. Then, if ``must_sync``, fsync everything above.
    5. ``messages``: send them (only now: they may acknowledge what was just persisted).
    6. ``committed_entries``: apply them to the state machine in order (skip NOOPs).
    7. ``take_snapshot_at``: if set, the log has grown; snapshot the state machine at this
       applied index when convenient and call ``RaftNode.compact``.
    Then call ``RaftNode.advance(ready)``.
    """

    hard_state: HardState | None
    snapshot: Snapshot | None
    truncate_from: int | None
    entries: tuple[Entry, ...]
    messages: tuple[Message, ...]
    committed_entries: tuple[Entry, ...]
    take_snapshot_at: int | None
    # Whether step 4 needs an fsync before sending: False when only the (advisory) commit
    # index changed, which may be written lazily.
    must_sync: bool
