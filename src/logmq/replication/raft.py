"""The sans-IO Raft core behind the metadata quorum.

RaftNode is a deterministic state machine: the shell feeds it ticks (``tick``), messages
from peers (``step``) and proposals (``propose``), then drains a Ready (``ready``) telling it
what to persist, what to send and what to apply, and reports back with ``advance``. It never
touches a clock, a socket or a disk, so whole clusters run in memory under test.

Persistence rule: nothing in a Ready may be sent or applied before its hard state, snapshot
and entries are durable, and Readys are carried out one at a time, in order. That single
rule is what makes every vote and every acknowledgement survive a crash.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from enum import Enum

from logmq.replication.raft_leader import Leader
from logmq.replication.raft_log import RaftLog
from logmq.replication.raft_messages import (
    LEADER_MESSAGES,
    MAX_ENTRIES_PER_MESSAGE,
    AppendRequest,
    AppendResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    Message,
    SnapshotRequest,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
    validate_message,
)
from logmq.replication.raft_progress import Progress
from logmq.replication.raft_ready import HardState, PersistentState, Ready


class Role(Enum):
    FOLLOWER = "follower"
    OBSERVER = "observer"  # not a voter: follows the log, never votes or campaigns
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


class RaftNode:
    def __init__(
        self,
        node_id: int,
        voters: Iterable[int],
        state: PersistentState | None = None,
        *,
        observers: Iterable[int] = (),
        election_ticks: int = 10,
        heartbeat_ticks: int = 1,
        rng: random.Random | None = None,
        pre_vote: bool = True,
        check_quorum: bool = True,
        max_entries_per_message: int = 256,
        max_bytes_per_message: int = 8 << 20,
        max_inflight: int = 64,
        snapshot_threshold: int | None = 10_000,
        snapshot_bytes: int | None = None,
    ) -> None:
        """``snapshot_threshold``: applied entries between snapshots. ``snapshot_bytes``:
        also snapshot once the entries applied since the last snapshot hold more bytes
        than this or than that snapshot, whichever is more: a few entries can carry a
        whole 10,000-partition topic, and replaying them at every start costs seconds
        (while snapshotting more often than the snapshot's own size would cost more)."""
        self.voters = frozenset(voters)
        if not self.voters:
            raise ValueError("a quorum needs at least one voter")
        if not 1 <= heartbeat_ticks < election_ticks:
            raise ValueError("need 1 <= heartbeat_ticks < election_ticks")
        if not 1 <= max_entries_per_message <= MAX_ENTRIES_PER_MESSAGE:
            raise ValueError(f"need 1 <= max_entries_per_message <= {MAX_ENTRIES_PER_MESSAGE}")
        state = state or PersistentState()
        self.node_id = node_id
        self.observers = frozenset(observers) - self.voters - {node_id}
        self.election_ticks = election_ticks
        self.heartbeat_ticks = heartbeat_ticks
        self.pre_vote = pre_vote
        self.check_quorum = check_quorum
        self.max_entries_per_message = max_entries_per_message
        # entries' bytes per AppendRequest (at least one entry): 256 entries of a few
        # MB each would pass the transport's frame limit, the follower drop the
        # connection and the leader send the same message again, for ever
        self.max_bytes_per_message = max_bytes_per_message
        self.max_inflight = max_inflight
        self.snapshot_threshold = snapshot_threshold
        self.snapshot_bytes = snapshot_bytes
        self._bytes_since_snapshot = 0
        self._rng = rng or random.Random()
        self.log = RaftLog(state.snapshot, state.entries, state.hard_state.commit)
        self.term = state.hard_state.term
        self.voted_for = state.hard_state.voted_for
        self.role = Role.FOLLOWER
        self.leader_id: int | None = None
        self._votes: dict[int, bool] = {}
        self._leader: Leader | None = None  # exists while we lead
        self._messages: list[Message] = []
        self._election_elapsed = 0
        self._timeout = election_ticks
        self._persisted = HardState(self.term, self.voted_for, self.log.commit)
        self._outstanding: Ready | None = None
        self._snapshot_asked_at = self.log.snapshot.index
        self._reset(self.term)
        self._become_follower(self.term, None)

    # -- read-only view ------------------------------------------------------------------

    @property
    def is_voter(self) -> bool:
        return self.node_id in self.voters

    @property
    def commit_index(self) -> int:
        return self.log.commit

    @property
    def last_index(self) -> int:
        return self.log.last_index

    @property
    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    def progress(self, peer: int) -> Progress | None:
        """The leader's view of ``peer`` (None when not leader)."""
        return self._leader.progress.get(peer) if self._leader else None

    # -- inputs ----------------------------------------------------------------------------

    def tick(self) -> None:
        """One unit of logical time (the shell calls it every ~100 ms)."""
        self._election_elapsed += 1
        if self._leader is not None:
            if self._election_elapsed >= self.election_ticks:
                self._election_elapsed = 0  # the lease window during which we ignore votes
            if not self._leader.tick(self.check_quorum):
                self._become_follower(self.term, None)  # we may be the minority side
        elif self.is_voter and self._election_elapsed >= self._timeout:
            self.campaign()

    def campaign(self, *, transfer: bool = False) -> None:
        """Start an election now (the shell may call this instead of waiting for a timeout)."""
        if not self.is_voter or self.role is Role.LEADER:
            return
        if self.pre_vote and not transfer:
            self._become_pre_candidate()
        else:
            self._become_candidate()
        self._ask_for_votes(transfer)

    def transfer_leadership(self, target: int) -> bool:
        """Hand leadership to voter ``target`` (e.g. before a graceful shutdown).

        Proposals are refused until it completes or, after an election timeout, is given
        up. Returns False if we don't lead or ``target`` can't lead.
        """
        if self._leader is None or target not in self.voters or target == self.node_id:
            return False
        self._leader.transfer(target)
        return True

    def propose(self, data: bytes) -> int | None:
        """Append ``data`` if we lead; returns its index, or None (redirect to leader_id)."""
        indexes = self.propose_many((data,))
        return indexes[0] if indexes else None

    def propose_many(self, items: Iterable[bytes]) -> range | None:
        """Append several entries with one round of AppendRequests; returns their indexes."""
        if self._leader is None or self._leader.transferee is not None:
            return None
        return self._leader.append(items)

    def step(self, msg: Message) -> None:
        """Feed one message from a peer. Malformed messages raise ValueError untouched."""
        validate_message(msg, self.node_id)
        if msg.src not in self.voters and (
            isinstance(msg, (VoteRequest, *LEADER_MESSAGES)) or msg.term > self.term
        ):
            # Only voters campaign, lead or move the term: a misconfigured node (or anyone
            # reaching the quorum port as a non-voter) must not bump our term, collect our
            # vote, or get an append or a snapshot into the log.
            return
        if msg.term > self.term:
            if isinstance(msg, VoteRequest):
                if self._in_lease() and not msg.transfer:
                    return  # we have a live leader: don't let a stray candidate depose it
                if not msg.pre_vote:
                    self._become_follower(msg.term, None)
            elif isinstance(msg, VoteResponse) and msg.pre_vote and msg.granted:
                pass  # carries the term we would campaign in, not a newer real term
            elif isinstance(msg, LEADER_MESSAGES):
                self._become_follower(msg.term, msg.src)
            else:
                self._become_follower(msg.term, None)
        elif msg.term < self.term:
            self._answer_stale(msg)
            return

        match msg:
            case VoteRequest():
                self._on_vote_request(msg)
            case VoteResponse():
                self._on_vote_response(msg)
            case AppendRequest() | HeartbeatRequest() | SnapshotRequest() | TimeoutNow():
                if self.role is Role.LEADER:
                    return  # two leaders in one term is impossible; ignore the impostor
                self._become_follower(self.term, msg.src)
                self._election_elapsed = 0
                if isinstance(msg, AppendRequest):
                    self._on_append(msg)
                elif isinstance(msg, HeartbeatRequest):
                    self._on_heartbeat(msg)
                elif isinstance(msg, SnapshotRequest):
                    self._on_snapshot(msg)
                else:
                    self.campaign(transfer=True)
            case AppendResponse() if self._leader:
                self._leader.on_append_response(msg)
            case HeartbeatResponse() if self._leader:
                self._leader.on_heartbeat_response(msg)

    def add_observer(self, node_id: int) -> None:
        """Start replicating to a non-voter (e.g. a broker that just registered)."""
        if node_id in self.voters or node_id == self.node_id or node_id in self.observers:
            return
        self.observers = self.observers | {node_id}
        if self._leader is not None:
            self._leader.add_peer(node_id)

    def remove_observer(self, node_id: int) -> None:
        self.observers = self.observers - {node_id}
        if self._leader is not None:
            self._leader.progress.pop(node_id, None)

    def compact(self, index: int, snapshot_data: bytes) -> None:
        """The shell durably stored a state-machine snapshot taken at applied ``index``."""
        self.log.compact(index, snapshot_data)

    # -- outputs ---------------------------------------------------------------------------

    def has_ready(self) -> bool:
        if self._outstanding is not None:
            return False
        return bool(self._messages or self._hard_state() != self._persisted or self.log.has_work())

    def ready(self) -> Ready | None:
        """The next batch of work, or None if there is none or one is still outstanding."""
        if not self.has_ready():
            return None
        hard_state = self._hard_state()
        snapshot, truncate_from, entries = self.log.take_unstable()
        committed = self.log.take_committed()
        take_snapshot_at = None
        applied, threshold = self.log.applied, self.snapshot_threshold
        since = max(self._snapshot_asked_at, self.log.snapshot.index)
        self._bytes_since_snapshot += sum(len(e.data) for e in committed)
        if (threshold is not None and applied - since >= threshold) or (
            self.snapshot_bytes is not None
            and applied > since
            and self._bytes_since_snapshot >= max(self.snapshot_bytes, len(self.log.snapshot.data))
        ):
            take_snapshot_at = self._snapshot_asked_at = applied
            self._bytes_since_snapshot = 0
        vote_changed = (hard_state.term, hard_state.voted_for) != (
            self._persisted.term,
            self._persisted.voted_for,
        )
        rd = Ready(
            hard_state=None if hard_state == self._persisted else hard_state,
            snapshot=snapshot,
            truncate_from=truncate_from,
            entries=tuple(entries),
            messages=tuple(self._messages),
            committed_entries=tuple(committed),
            take_snapshot_at=take_snapshot_at,
            must_sync=bool(vote_changed or snapshot or entries or truncate_from is not None),
        )
        self._messages = []
        self._persisted = hard_state
        self._outstanding = rd
        return rd

    def advance(self, ready: Ready) -> None:
        """The shell carried out ``ready``; the next one may be taken."""
        if ready is not self._outstanding:
            raise ValueError("advance() must be given the Ready last returned by ready()")
        self._outstanding = None

    # -- role changes ----------------------------------------------------------------------

    def _reset(self, term: int) -> None:
        if term != self.term:
            self.term = term
            self.voted_for = None
        self._votes = {}
        self._leader = None
        self._election_elapsed = 0
        self._timeout = self.election_ticks + self._rng.randrange(self.election_ticks)

    def _become_follower(self, term: int, leader_id: int | None) -> None:
        if term != self.term or self.role not in (Role.FOLLOWER, Role.OBSERVER):
            self._reset(term)
        self.role = Role.FOLLOWER if self.is_voter else Role.OBSERVER
        self.leader_id = leader_id

    def _become_pre_candidate(self) -> None:
        self._reset(self.term)  # a pre-vote changes neither our term nor our vote
        self.role = Role.PRE_CANDIDATE
        self.leader_id = None

    def _become_candidate(self) -> None:
        self._reset(self.term + 1)
        self.voted_for = self.node_id
        self.role = Role.CANDIDATE
        self.leader_id = None

    def _become_leader(self) -> None:
        self._reset(self.term)
        self.role = Role.LEADER
        self.leader_id = self.node_id
        self._leader = Leader(
            self.node_id,
            self.term,
            self.log,
            self.voters,
            self.observers,
            self._send,
            election_ticks=self.election_ticks,
            heartbeat_ticks=self.heartbeat_ticks,
            max_entries_per_message=self.max_entries_per_message,
            max_bytes_per_message=self.max_bytes_per_message,
            max_inflight=self.max_inflight,
        )
        self._leader.start()

    # -- elections -------------------------------------------------------------------------

    def _in_lease(self) -> bool:
        return (
            self.check_quorum
            and self.leader_id is not None
            and self._election_elapsed < self.election_ticks
        )

    def _ask_for_votes(self, transfer: bool = False) -> None:
        pre = self.role is Role.PRE_CANDIDATE
        term = self.term + 1 if pre else self.term
        if self._poll(self.node_id, True):
            return
        for voter in sorted(self.voters - {self.node_id}):
            self._send(
                VoteRequest(
                    src=self.node_id,
                    dst=voter,
                    term=term,
                    last_log_index=self.log.last_index,
                    last_log_term=self.log.last_term,
                    pre_vote=pre,
                    transfer=transfer,
                )
            )

    def _poll(self, voter: int, granted: bool) -> bool:
        """Record a vote; returns True once the election is decided either way."""
        self._votes.setdefault(voter, granted)
        yes = sum(self._votes.values())
        no = len(self._votes) - yes
        if yes >= self.quorum:
            if self.role is Role.PRE_CANDIDATE:
                self._become_candidate()
                self._ask_for_votes()
            else:
                self._become_leader()
            return True
        if no > len(self.voters) - self.quorum:
            self._become_follower(self.term, None)
            return True
        return False

    def _on_vote_request(self, msg: VoteRequest) -> None:
        if not self.is_voter:
            return
        can_vote = (
            self.voted_for == msg.src
            or (self.voted_for is None and self.leader_id is None)
            or (msg.pre_vote and msg.term > self.term)
        )
        granted = can_vote and self.log.is_up_to_date(msg.last_log_index, msg.last_log_term)
        if granted and not msg.pre_vote:
            self.voted_for = msg.src
            self._election_elapsed = 0
        self._send(
            VoteResponse(
                src=self.node_id,
                dst=msg.src,
                term=msg.term if granted else self.term,
                granted=granted,
                pre_vote=msg.pre_vote,
            )
        )

    def _on_vote_response(self, msg: VoteResponse) -> None:
        if msg.src not in self.voters:
            return
        if msg.pre_vote and self.role is Role.PRE_CANDIDATE:
            if msg.granted and msg.term != self.term + 1:
                return
            self._poll(msg.src, msg.granted)
        elif not msg.pre_vote and self.role is Role.CANDIDATE:
            self._poll(msg.src, msg.granted)

    def _answer_stale(self, msg: Message) -> None:
        """A message from an older term: tell the sender when that helps it catch up."""
        if isinstance(msg, LEADER_MESSAGES) and (self.pre_vote or self.check_quorum):
            # A deposed leader that no longer hears from anyone must learn the new term,
            # or with pre-vote a node at a higher term could never be caught up.
            self._send(AppendResponse(self.node_id, msg.src, self.term, success=False))
        elif isinstance(msg, VoteRequest) and msg.pre_vote:
            self._send(VoteResponse(self.node_id, msg.src, self.term, False, pre_vote=True))

    # -- follower side ---------------------------------------------------------------------

    def _on_append(self, msg: AppendRequest) -> None:
        log = self.log
        prev_index, prev_term, entries = msg.prev_index, msg.prev_term, msg.entries
        if prev_index < log.commit:
            # Everything up to our commit matches the leader already: skip that part.
            entries = entries[log.commit - prev_index :]
            prev_index = log.commit
            prev_term = log.term_at(prev_index)
            assert prev_term is not None
        if not log.matches(prev_index, prev_term):
            if prev_index > log.last_index:
                hint = log.last_index + 1
            else:
                hint = log.first_index_of_term(prev_index)
            self._reply(msg, success=False, reject_index=msg.prev_index, hint_index=hint)
            return
        last_new = log.merge(prev_index, entries)
        log.commit_to(min(msg.commit, last_new))
        self._reply(msg, success=True, match_index=last_new)

    def _on_heartbeat(self, msg: HeartbeatRequest) -> None:
        self.log.commit_to(min(msg.commit, self.log.last_index))
        self._send(HeartbeatResponse(src=self.node_id, dst=msg.src, term=self.term))

    def _on_snapshot(self, msg: SnapshotRequest) -> None:
        snap, log = msg.snapshot, self.log
        if snap.index <= log.commit:
            match = log.commit
        elif log.matches(snap.index, snap.term):
            log.commit_to(snap.index)  # we hold the entries it covers: no need to install
            match = snap.index
        else:
            log.install(snap)
            match = snap.index
        self._reply(msg, success=True, match_index=match)

    def _reply(self, msg: Message, **fields: object) -> None:
        self._send(AppendResponse(src=self.node_id, dst=msg.src, term=self.term, **fields))

    # -- helpers ---------------------------------------------------------------------------

    def _send(self, msg: Message) -> None:
        self._messages.append(msg)

    def _hard_state(self) -> HardState:
        return HardState(term=self.term, voted_for=self.voted_for, commit=self.log.commit)
