"""Values exchanged by Raft nodes: log entries, snapshots and the messages between peers.

Everything here is an immutable slotted dataclass so the core can hand the same object to
the shell, the simulator and the tests without defensive copies. Field names ``src`` and
``dst`` stand for the sender and the receiver (``from`` is a Python keyword).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from logmq.net.limits import MAX_ARRAY_ELEMENTS

# The most entries one AppendRequest may carry: a leader never sends more (RaftNode refuses
# a larger max_entries_per_message; it sends 256 by default), and a member refuses a
# message with more before building any (raft_codec.py). The limit on any array a peer
# may send either front door (net/limits.py).
MAX_ENTRIES_PER_MESSAGE = MAX_ARRAY_ELEMENTS


class EntryKind(IntEnum):
    """Why an entry is in the log.

    A new leader appends a NOOP so it can commit entries of earlier terms (it may only
    count replicas for entries of its own term). The state machine skips NOOPs.
    """

    DATA = 0
    NOOP = 1


@dataclass(slots=True, frozen=True)
class Entry:
    index: int
    term: int
    data: bytes = b""
    kind: EntryKind = EntryKind.DATA


@dataclass(slots=True, frozen=True)
class Snapshot:
    """An opaque image of the state machine after applying every entry up to ``index``.

    ``index == 0`` is the empty snapshot every log starts from.
    """

    index: int
    term: int
    data: bytes = b""


EMPTY_SNAPSHOT = Snapshot(index=0, term=0, data=b"")


@dataclass(slots=True, frozen=True)
class VoteRequest:
    """Ask for a vote (``pre_vote=False``) or probe whether one would be granted.

    A pre-vote carries the term the sender *would* campaign in (its term + 1) but changes
    nobody's term or vote, so a node cut off from the quorum can't inflate terms and
    depose a healthy leader when it comes back. ``transfer`` marks an election the leader
    asked for (TimeoutNow): voters answer it even while they still hear from that leader.
    """

    src: int
    dst: int
    term: int
    last_log_index: int
    last_log_term: int
    pre_vote: bool = False
    transfer: bool = False


@dataclass(slots=True, frozen=True)
class VoteResponse:
    src: int
    dst: int
    term: int
    granted: bool
    pre_vote: bool = False


@dataclass(slots=True, frozen=True)
class AppendRequest:
    """Entries following ``(prev_index, prev_term)`` plus the leader's commit index."""

    src: int
    dst: int
    term: int
    prev_index: int
    prev_term: int
    entries: tuple[Entry, ...]
    commit: int


@dataclass(slots=True, frozen=True)
class AppendResponse:
    """Answer to an AppendRequest or a SnapshotRequest.

    On success ``match_index`` is the last index known to agree with the leader's log.
    On rejection ``reject_index`` is the ``prev_index`` that did not match (so the leader
    can tell stale rejections apart) and ``hint_index`` is where the leader should retry.
    """

    src: int
    dst: int
    term: int
    success: bool
    match_index: int = 0
    reject_index: int = 0
    hint_index: int = 0


@dataclass(slots=True, frozen=True)
class HeartbeatRequest:
    """Keeps followers from campaigning; ``commit`` never exceeds what the follower matched."""

    src: int
    dst: int
    term: int
    commit: int


@dataclass(slots=True, frozen=True)
class HeartbeatResponse:
    """Proves to the leader that this node is reachable (check-quorum counts these)."""

    src: int
    dst: int
    term: int


@dataclass(slots=True, frozen=True)
class SnapshotRequest:
    """Install-snapshot for a follower whose next entry the leader has already compacted."""

    src: int
    dst: int
    term: int
    snapshot: Snapshot


@dataclass(slots=True, frozen=True)
class TimeoutNow:
    """Leadership transfer: the leader tells an up-to-date voter to campaign at once."""

    src: int
    dst: int
    term: int


Message = (
    VoteRequest
    | VoteResponse
    | AppendRequest
    | AppendResponse
    | HeartbeatRequest
    | HeartbeatResponse
    | SnapshotRequest
    | TimeoutNow
)

# Messages only a leader sends: receiving one at a term proves who leads that term.
LEADER_MESSAGES = (AppendRequest, HeartbeatRequest, SnapshotRequest, TimeoutNow)


def check_entries(prev_index: int, prev_term: int, entries: Sequence[Entry]) -> None:
    """Raise ValueError unless ``entries`` can follow ``(prev_index, prev_term)``."""
    for entry in entries:
        if entry.index != prev_index + 1 or entry.term < prev_term:
            raise ValueError(
                f"entry {entry.index} (term {entry.term}) cannot follow "
                f"{prev_index} (term {prev_term})"
            )
        prev_index, prev_term = entry.index, entry.term


def validate_message(msg: Message, node_id: int) -> None:
    """Reject structurally impossible messages before they can change any state."""
    if msg.dst != node_id:
        raise ValueError(f"message for node {msg.dst} delivered to node {node_id}")
    if msg.src == node_id or msg.term < 0:
        raise ValueError(f"{type(msg).__name__} with bad source {msg.src} or term {msg.term}")
    if isinstance(msg, AppendRequest):
        if msg.prev_index < 0 or msg.commit < 0:
            raise ValueError("negative index in AppendRequest")
        check_entries(msg.prev_index, msg.prev_term, msg.entries)
        if msg.entries and msg.entries[-1].term > msg.term:
            raise ValueError("AppendRequest carries an entry from a future term")
    elif isinstance(msg, SnapshotRequest) and (
        msg.snapshot.index < 0 or msg.snapshot.term > msg.term
    ):
        raise ValueError("SnapshotRequest with an impossible snapshot")
