"""Replication: the metadata quorum (Raft core, disk, shell, transport) and partition replicas.

See docs/raft.md and docs/replication.md.
"""

from logmq.replication.raft import RaftNode, Role
from logmq.replication.raft_messages import (
    AppendRequest,
    AppendResponse,
    Entry,
    EntryKind,
    HeartbeatRequest,
    HeartbeatResponse,
    Message,
    Snapshot,
    SnapshotRequest,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from logmq.replication.raft_ready import HardState, PersistentState, Ready

__all__ = [
    "AppendRequest",
    "AppendResponse",
    "Entry",
    "EntryKind",
    "HardState",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "Message",
    "PersistentState",
    "RaftNode",
    "Ready",
    "Role",
    "Snapshot",
    "SnapshotRequest",
    "TimeoutNow",
    "VoteRequest",
    "VoteResponse",
]
