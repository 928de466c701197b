"""What only a leader does: replicate its log to each follower and decide what is committed.

One Leader object lives for exactly one term of leadership, so its term never changes;
RaftNode creates it on winning an election and drops it on stepping down. It shares the
node's RaftLog and emits messages through the node's ``send``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from logmq.replication.raft_log import RaftLog
from logmq.replication.raft_messages import (
    AppendRequest,
    AppendResponse,
    Entry,
    EntryKind,
    HeartbeatRequest,
    HeartbeatResponse,
    Message,
    SnapshotRequest,
    TimeoutNow,
)
from logmq.replication.raft_progress import Progress, ProgressState


class Leader:
    def __init__(
        self,
        node_id: int,
        term: int,
        log: RaftLog,
        voters: frozenset[int],
        observers: Iterable[int],
        send: Callable[[Message], None],
        *,
        election_ticks: int,
        heartbeat_ticks: int,
        max_entries_per_message: int,
        max_inflight: int,
        max_bytes_per_message: int = 8 << 20,
    ) -> None:
        self.node_id = node_id
        self.term = term
        self.log = log
        self.voters = voters
        self.quorum = len(voters) // 2 + 1
        self._send = send
        self.election_ticks = election_ticks
        self.heartbeat_ticks = heartbeat_ticks
        self.max_entries_per_message = max_entries_per_message
        self.max_bytes_per_message = max_bytes_per_message
        self.max_inflight = max_inflight
        self._heartbeat_elapsed = 0
        self.transferee: int | None = None  # leadership is being handed to this voter
        self._transfer_elapsed = 0
        self.progress: dict[int, Progress] = {}
        for peer in sorted((voters | set(observers)) - {node_id}):
            self.progress[peer] = Progress(log.last_index + 1, max_inflight)

    def start(self) -> None:
        # A leader may only commit by counting entries of its own term: the no-op gives it
        # one at once, which also commits whatever earlier leaders left behind.
        self.append([b""], EntryKind.NOOP)

    def add_peer(self, peer: int) -> None:
        self.progress[peer] = Progress(self.log.last_index + 1, self.max_inflight)
        self.send_append(peer, allow_empty=True)

    def transfer(self, target: int) -> None:
        """Hand leadership to ``target``: catch it up, then tell it to campaign."""
        self.transferee, self._transfer_elapsed = target, 0
        self._maybe_timeout_now(target)

    def _maybe_timeout_now(self, peer: int) -> None:
        if peer != self.transferee:
            return
        if self.progress[peer].match == self.log.last_index:
            self._send(TimeoutNow(self.node_id, peer, self.term))
        else:
            self.send_append(peer)

    def append(self, items: Iterable[bytes], kind: EntryKind = EntryKind.DATA) -> range:
        first = self.log.last_index + 1
        for data in items:
            self.log.append(Entry(self.log.last_index + 1, self.term, data, kind))
        self.maybe_commit()
        for peer in self.progress:
            self.send_append(peer)
        return range(first, self.log.last_index + 1)

    def tick(self, check_quorum: bool) -> bool:
        """One tick of leadership; False means we lost the quorum and must step down."""
        for progress in self.progress.values():
            progress.quiet_ticks += 1
        if check_quorum and not self.quorum_active():
            return False
        if self.transferee is not None:
            self._transfer_elapsed += 1
            if self._transfer_elapsed >= self.election_ticks:
                self.transferee = None  # the target never took over: keep leading
        for peer, progress in self.progress.items():
            if progress.state is ProgressState.SNAPSHOT:
                progress.snapshot_ticks += 1
                if progress.snapshot_ticks >= self.election_ticks:
                    progress.become_probe()  # the snapshot was probably lost: try again
                    self.send_append(peer)
        self._heartbeat_elapsed += 1
        if self._heartbeat_elapsed >= self.heartbeat_ticks:
            self._heartbeat_elapsed = 0
            for peer, progress in self.progress.items():
                commit = min(progress.match, self.log.commit)  # never beyond what it matched
                self._send(HeartbeatRequest(self.node_id, peer, self.term, commit))
        return True

    def quorum_active(self) -> bool:
        """Whether a majority of voters (us included) spoke within an election timeout.

        Checked every tick, so a leader cut off from the majority gives up before the
        other side's followers even start an election (they wait election_ticks or more).
        """
        active = 1 if self.node_id in self.voters else 0
        for voter in self.voters:
            progress = self.progress.get(voter)
            if progress is not None and progress.quiet_ticks < self.election_ticks:
                active += 1
        return active >= self.quorum

    def maybe_commit(self) -> bool:
        log = self.log
        matches = sorted(
            (log.last_index if v == self.node_id else self.progress[v].match for v in self.voters),
            reverse=True,
        )
        index = matches[self.quorum - 1]
        # Counting replicas proves nothing for entries of older terms (Raft paper, 5.4.2).
        if index > log.commit and log.term_at(index) == self.term:
            return log.commit_to(index)
        return False

    def send_append(self, peer: int, allow_empty: bool = False) -> None:
        progress = self.progress[peer]
        if progress.is_paused:
            return
        prev_index = progress.next - 1
        prev_term = self.log.term_at(prev_index)
        if prev_term is None:  # compacted: only the snapshot can catch this one up
            snapshot = self.log.snapshot
            self._send(SnapshotRequest(self.node_id, peer, self.term, snapshot))
            progress.become_snapshot(snapshot.index)
            return
        last = min(self.log.last_index, prev_index + self.max_entries_per_message)
        entries = _within(self.log.slice(progress.next, last), self.max_bytes_per_message)
        if not entries and not allow_empty:
            return
        self._send(
            AppendRequest(
                self.node_id, peer, self.term, prev_index, prev_term, entries, self.log.commit
            )
        )
        progress.sent(entries[-1].index if entries else prev_index)

    def on_append_response(self, msg: AppendResponse) -> None:
        progress = self.progress.get(msg.src)
        if progress is None:
            return
        progress.quiet_ticks = 0
        if not msg.success:
            if progress.reject(msg.reject_index, msg.hint_index):
                progress.next = min(progress.next, self.log.last_index + 1)
                self.send_append(msg.src)
            return
        if msg.match_index > self.log.last_index:
            return  # claims entries we never sent: a confused peer, not a reason to crash
        if not progress.update(msg.match_index):
            self.send_append(msg.src)
            return
        installed = progress.state is ProgressState.SNAPSHOT and (
            progress.match >= progress.pending_snapshot
        )
        if progress.state is ProgressState.PROBE:
            progress.become_replicate()
        elif installed:
            progress.become_probe()
        if msg.src in self.voters and self.maybe_commit():
            for peer in self.progress:  # tell everyone the new commit index
                self.send_append(peer, allow_empty=True)
        else:
            self.send_append(msg.src)
        self._maybe_timeout_now(msg.src)

    def on_heartbeat_response(self, msg: HeartbeatResponse) -> None:
        progress = self.progress.get(msg.src)
        if progress is None:
            return
        progress.quiet_ticks = 0
        progress.paused = False
        if progress.match < self.log.last_index:
            stalled = progress.match == progress.stalled_match
            if progress.state is ProgressState.REPLICATE and stalled:
                progress.become_probe()  # no progress for a heartbeat: assume loss, resend
            progress.stalled_match = progress.match
            self.send_append(msg.src)


def _within(entries: list[Entry], max_bytes: int) -> tuple[Entry, ...]:
    """The first of ``entries`` whose data fit in ``max_bytes`` (at least one entry)."""
    total = 0
    for i, entry in enumerate(entries):
        total += len(entry.data)
        if total > max_bytes and i:
            return tuple(entries[:i])
    return tuple(entries)
