"""Sans-IO state of one partition replica: HW/LEO/ISR as leader, epoch truncation as follower.

The broker's replica manager owns one PartitionReplica per hosted partition. It tells the
replica what the controller decided (``become_leader``/``become_follower``/
``update_metadata``), what the local log did (``on_append``, ``on_fetched``) and what
followers asked (``on_follower_fetch``), passes ``now_ms`` in, and carries out the
returned actions. The replica never reads or writes the log itself; it only decides.

Leader, Kafka semantics:

* each follower's LEO is the offset it fetches from (fetches must carry the current
  leader epoch, so a replica that has not truncated for this epoch is never counted);
* HW = min LEO over the *maximal* ISR (the confirmed ISR plus members an in-flight
  AlterPartition adds; during a shrink the confirmed, larger ISR still counts) and never
  moves back. An ISR change is only adopted once the controller has committed it, so the
  HW never counts on a set the controller could elect outside of;
* a follower leaves the ISR when it has not been caught up (fetched up to the leader's
  LEO at the time) for ``replica_lag_time_max_ms``, and rejoins once it fetches at or
  beyond the HW and the start of the current leader epoch;
* acks=all: ``min_insync_replicas`` is checked before appending (NOT_ENOUGH_REPLICAS);
  the request then waits in a purgatory keyed by offset until the HW passes it, fails
  with NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR falls below the minimum meanwhile, or
  with REQUEST_TIMED_OUT at its deadline.

Follower, KIP-101/279: on every new leader epoch it asks the leader where its latest
epoch ends (OffsetsForLeaderEpoch) and truncates to the smaller of that and its own end
of that epoch; if the leader answers with an older epoch the follower does not have, it
asks again about its own older epoch. It never truncates to its high watermark, which
loses acknowledged records when leaders fail over quickly twice
(tests/replication/test_partition_sim.py shows both).
"""

from __future__ import annotations

import heapq
from collections.abc import Container, Hashable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from logmq.errors import ErrorCode

NO_LEADER = -1
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1
ACKS_ALL = -1


class EpochHistory(Protocol):
    """The local log's leader-epoch history (storage/leader_epoch.py's LeaderEpochCache)."""

    @property
    def latest_epoch(self) -> int: ...

    def end_offset_for_epoch(self, epoch: int, log_end_offset: int) -> tuple[int, int]: ...

    def entries(self) -> list[tuple[int, int]]: ...


class PartitionState(Protocol):
    """What the controller decided (cluster/metadata_image.py's PartitionRegistration)."""

    @property
    def leader(self) -> int: ...
    @property
    def leader_epoch(self) -> int: ...
    @property
    def partition_epoch(self) -> int: ...
    @property
    def replicas(self) -> tuple[int, ...]: ...
    @property
    def isr(self) -> tuple[int, ...]: ...


class ReplicaRole(Enum):
    OFFLINE = "offline"
    LEADER = "leader"
    FOLLOWER = "follower"


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    replica_lag_time_max_ms: int = 30_000
    min_insync_replicas: int = 1
    # An AlterIsr without an answer (lost on the way) is sent again after this long.
    alter_isr_retry_ms: int = 5_000
    # After a refused or failed AlterIsr, the next one waits this long, doubling with
    # every further failure up to the cap; a committed ISR change resets it.
    alter_isr_backoff_ms: int = 100
    alter_isr_backoff_max_ms: int = 10_000


# -- actions for the shell --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AlterIsr:
    """Ask the controller to set the ISR (AlterPartition with these epochs)."""

    isr: tuple[int, ...]
    leader_epoch: int
    partition_epoch: int


@dataclass(frozen=True, slots=True)
class HighWatermarkChanged:
    high_watermark: int


@dataclass(frozen=True, slots=True)
class ProduceCompleted:
    """An acks=all request parked by ``await_replication`` is done."""

    key: Hashable
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class AskLeaderEpoch:
    """Send OffsetsForLeaderEpoch(``epoch``) to the leader, fenced by ``current_leader_epoch``."""

    leader: int
    current_leader_epoch: int
    epoch: int


@dataclass(frozen=True, slots=True)
class TruncateTo:
    """Remove every record at or after ``offset`` from the local log."""

    offset: int


@dataclass(frozen=True, slots=True)
class ResetTo:
    """Replace the local log by an empty one starting at ``offset`` (leader deleted ours)."""

    offset: int


@dataclass(frozen=True, slots=True)
class StartFetching:
    leader: int
    leader_epoch: int
    offset: int


Action = (
    AlterIsr
    | HighWatermarkChanged
    | ProduceCompleted
    | AskLeaderEpoch
    | TruncateTo
    | ResetTo
    | StartFetching
)


@dataclass(frozen=True, slots=True)
class FollowerFetch:
    """What a follower's fetch did to the leader's state: NONE, or why it is refused
    (nothing changed then), and the actions that follow (an ISR request, an HW move)."""

    error: ErrorCode
    actions: list[Action]


@dataclass(frozen=True, slots=True)
class EpochEndOffset:
    """Where a leader epoch ends (KIP-101): the largest epoch up to the one asked about
    that the leader has, and the offset it ends at; or the error, with both undefined."""

    error: ErrorCode
    leader_epoch: int = UNDEFINED_EPOCH
    end_offset: int = UNDEFINED_OFFSET


@dataclass(slots=True)
class FollowerState:
    leo: int = UNDEFINED_OFFSET  # unknown until it fetches in the current epoch
    last_caught_up_ms: int = 0
    last_fetch_ms: int = -1
    leader_leo_at_last_fetch: int = UNDEFINED_OFFSET
    log_start_offset: int = UNDEFINED_OFFSET  # as its latest fetch reported it


class PartitionReplica:
    def __init__(
        self,
        broker_id: int,
        epochs: EpochHistory,
        *,
        log_end_offset: int,
        high_watermark: int,
        config: ReplicaConfig | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.epochs = epochs
        self.config = config or ReplicaConfig()
        self.role = ReplicaRole.OFFLINE
        self.leo = log_end_offset
        self.hw = min(high_watermark, log_end_offset)
        self.leader_id = NO_LEADER
        self.leader_epoch = -1
        self.partition_epoch = -1
        self.replicas: tuple[int, ...] = ()
        self.isr: tuple[int, ...] = ()  # as committed by the controller
        self.pending_isr: AlterIsr | None = None  # the request awaiting an answer
        self._pending_sent_ms = 0
        self.isr_failures = 0  # AlterIsr refusals/failures in a row (backoff exponent)
        self._next_isr_request_ms = 0  # no new AlterIsr before this (backoff)
        # Members any AlterIsr sent at the current partition epoch adds: one of those
        # requests (a copy, a retry) may still be applied by the controller, so they count
        # for the HW until the metadata shows a newer partition epoch.
        self._requested: set[int] = set()
        self.followers: dict[int, FollowerState] = {}
        self.leader_epoch_start_offset = 0
        self.fetching = False  # follower: truncation done, fetching from the leader
        self.asked_epoch: int | None = None  # follower: OffsetsForLeaderEpoch in flight
        self._by_offset: list[tuple[int, int]] = []  # (required offset, seq) heap
        self._by_deadline: list[tuple[int, int]] = []  # (deadline ms, seq) heap
        self._waiting: dict[int, Hashable] = {}  # seq -> key, for waiters still parked
        self._seq = 0

    # -- views -------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.role is ReplicaRole.LEADER

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The confirmed ISR plus members a request in flight may add (during a shrink,
        the confirmed ISR still holds the members being removed)."""
        return self.isr + tuple(sorted(self._requested - set(self.isr)))

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    # -- metadata from the controller --------------------------------------------------------

    def become_leader(self, state: PartitionState, now_ms: int) -> list[Action]:
        if self.is_leader and state.leader_epoch == self.leader_epoch:
            return self.update_metadata(state)
        actions: list[Action] = []
        if self.role is ReplicaRole.FOLLOWER:
            self.fetching, self.asked_epoch = False, None
        self.role = ReplicaRole.LEADER
        self.leader_id = self.broker_id
        self._adopt(state)
        self.pending_isr, self._requested = None, set()
        self._reset_isr_backoff()
        self.leader_epoch_start_offset = self.leo
        self.followers = {
            r: FollowerState(last_caught_up_ms=now_ms if r in self.isr else 0)
            for r in self.replicas
            if r != self.broker_id
        }
        actions += self._advance_hw()
        actions += self._check_min_isr()
        return actions

    def become_follower(self, state: PartitionState) -> list[Action]:
        if (
            self.role is ReplicaRole.FOLLOWER
            and state.leader_epoch == self.leader_epoch
            and state.leader == self.leader_id
        ):
            self._adopt(state)
            return []
        actions = self._fail_waiters(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        self.role = ReplicaRole.FOLLOWER
        self.leader_id = state.leader
        self._adopt(state)
        self.pending_isr, self._requested = None, set()
        self.followers = {}
        self.fetching, self.asked_epoch = False, None
        if state.leader == NO_LEADER:
            return actions  # wait for an election
        latest = self.epochs.latest_epoch
        if latest == UNDEFINED_EPOCH:
            # No epoch history: nothing written under any leader (an empty log), or a
            # log from before epochs were recorded, where the HW is all we have.
            return actions + self._truncated(min(self.hw, self.leo))
        self.asked_epoch = latest
        return [*actions, AskLeaderEpoch(self.leader_id, self.leader_epoch, latest)]

    def update_metadata(self, state: PartitionState) -> list[Action]:
        """Same leader epoch, new partition state (an ISR change, a reassignment)."""
        if state.leader_epoch != self.leader_epoch or state.partition_epoch < self.partition_epoch:
            return []
        if state.partition_epoch > self.partition_epoch:
            # Requests made at an older partition epoch can never be applied any more.
            self._requested = set()
            self.pending_isr = None
            self._reset_isr_backoff()
        self._adopt(state)
        if not self.is_leader:
            return []
        for r in self.replicas:
            if r != self.broker_id and r not in self.followers:
                self.followers[r] = FollowerState()
        return self._advance_hw() + self._check_min_isr()

    def stop(self) -> list[Action]:
        """No longer a replica (deleted, reassigned away) or the broker is shutting down."""
        actions = self._fail_waiters(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        self.role = ReplicaRole.OFFLINE
        self.pending_isr, self.followers, self.fetching, self.asked_epoch = None, {}, False, None
        self._requested = set()
        return actions

    def _adopt(self, state: PartitionState) -> None:
        self.leader_epoch = state.leader_epoch
        self.partition_epoch = state.partition_epoch
        self.replicas = tuple(state.replicas)
        self.isr = tuple(state.isr)

    # -- leader: produce -----------------------------------------------------------------------

    def check_append(self, acks: int) -> ErrorCode:
        """Before appending a produce: may this replica take it with these acks?"""
        if not self.is_leader:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if acks == ACKS_ALL and len(self.isr) < self.config.min_insync_replicas:
            return ErrorCode.NOT_ENOUGH_REPLICAS
        return ErrorCode.NONE

    def on_append(self, log_end_offset: int, now_ms: int | None = None) -> list[Action]:
        """The local log grew (a produce as leader).

        Followers that had everything until now were caught up until ``now_ms``: they
        may not have fetched this partition for long (a fetch session leaves idle
        partitions out), and their lag counts from this append.
        """
        if self.is_leader and now_ms is not None and log_end_offset > self.leo:
            for follower in self.followers.values():
                if follower.leo >= self.leo:
                    follower.last_caught_up_ms = max(follower.last_caught_up_ms, now_ms)
        self.leo = log_end_offset
        return self._advance_hw() if self.is_leader else []

    def await_replication(
        self, key: Hashable, required_offset: int, deadline_ms: int
    ) -> ErrorCode | None:
        """acks=all for records ending before ``required_offset``.

        Returns the outcome at once if known, else None: a ProduceCompleted(key) action
        follows later from an HW move, an ISR change, a tick past the deadline, or a loss
        of leadership.
        """
        if not self.is_leader:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if self.hw >= required_offset:
            return self._ack_error()
        if len(self.isr) < self.config.min_insync_replicas:
            return ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        self._seq += 1
        self._waiting[self._seq] = key
        heapq.heappush(self._by_offset, (required_offset, self._seq))
        heapq.heappush(self._by_deadline, (deadline_ms, self._seq))
        return None

    def _ack_error(self) -> ErrorCode:
        if len(self.isr) < self.config.min_insync_replicas:
            return ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        return ErrorCode.NONE

    # -- leader: followers -----------------------------------------------------------------------

    def on_follower_fetch(
        self,
        replica_id: int,
        fetch_offset: int,
        current_leader_epoch: int,
        now_ms: int,
        log_start_offset: int = UNDEFINED_OFFSET,
    ) -> FollowerFetch:
        """A follower fetches from ``fetch_offset`` (its LEO). Answer with ``self.hw``.

        ``log_start_offset`` is the follower's own, for the low watermark.
        """
        if not self.is_leader:
            return FollowerFetch(ErrorCode.NOT_LEADER_OR_FOLLOWER, [])
        if current_leader_epoch < self.leader_epoch:
            return FollowerFetch(ErrorCode.FENCED_LEADER_EPOCH, [])
        if current_leader_epoch > self.leader_epoch:
            return FollowerFetch(ErrorCode.UNKNOWN_LEADER_EPOCH, [])
        follower = self.followers.get(replica_id)
        if follower is None:
            return FollowerFetch(ErrorCode.NOT_LEADER_OR_FOLLOWER, [])
        if not 0 <= fetch_offset <= self.leo:
            return FollowerFetch(ErrorCode.OFFSET_OUT_OF_RANGE, [])
        # Caught up now, or at least up to where we were at its previous fetch.
        if fetch_offset >= self.leo:
            follower.last_caught_up_ms = max(follower.last_caught_up_ms, now_ms)
        elif fetch_offset >= follower.leader_leo_at_last_fetch >= 0:
            follower.last_caught_up_ms = max(follower.last_caught_up_ms, follower.last_fetch_ms)
        follower.leader_leo_at_last_fetch = self.leo
        follower.last_fetch_ms = now_ms
        follower.leo = fetch_offset
        follower.log_start_offset = log_start_offset
        actions = self._maybe_expand_isr(replica_id, follower, now_ms)
        return FollowerFetch(ErrorCode.NONE, actions + self._advance_hw())

    def _maybe_expand_isr(
        self, replica_id: int, follower: FollowerState, now_ms: int
    ) -> list[Action]:
        if (
            self.pending_isr is not None
            or now_ms < self._next_isr_request_ms
            or replica_id in self.isr
            or replica_id not in self.replicas
            or follower.leo < self.hw
            or follower.leo < self.leader_epoch_start_offset
        ):
            return []
        return [self._request_isr((*self.isr, replica_id), now_ms)]

    def tick(self, now_ms: int, silent: Container[int] = ()) -> list[Action]:
        """Shrink the ISR of laggards; resend a lost AlterIsr; time out parked acks=all.

        A laggard is behind the leader's LEO and has not been caught up for
        ``replica_lag_time_max_ms`` (Kafka's rule: one at the LEO is in sync however
        long ago it fetched, as an idle partition in a fetch session sees no fetches),
        or is ``silent``: its broker has not fetched anything for that long. A caught-up
        replica outside the ISR is asked back in (a refused request is retried here).
        """
        actions: list[Action] = []
        pending = self.pending_isr
        if pending is not None and now_ms - self._pending_sent_ms >= self.config.alter_isr_retry_ms:
            self._pending_sent_ms = now_ms
            actions.append(pending)
        if self.is_leader and self.pending_isr is None and now_ms >= self._next_isr_request_ms:
            lag = self.config.replica_lag_time_max_ms
            leo = self.leo
            followers = self.followers
            out = [
                r
                for r in self.maximal_isr
                if r != self.broker_id
                and (
                    r in silent
                    or (followers[r].leo < leo and now_ms - followers[r].last_caught_up_ms > lag)
                )
            ]
            if not out:
                for r, follower in followers.items():
                    if r not in self.isr and r not in silent:
                        actions += self._maybe_expand_isr(r, follower, now_ms)
                        if self.pending_isr is not None:
                            break
            if out:
                # If only members of refused requests lag, this asks for the ISR we have:
                # the controller records it anyway, moving the partition epoch past every
                # older request, so they stop counting.
                keep = tuple(r for r in self.isr if r not in out)
                actions.append(self._request_isr(keep, now_ms))
        while self._by_deadline and self._by_deadline[0][0] <= now_ms:
            _, seq = heapq.heappop(self._by_deadline)
            key = self._waiting.pop(seq, None)
            if key is not None:
                actions.append(ProduceCompleted(key, ErrorCode.REQUEST_TIMED_OUT))
        return actions

    def idle(self, silent: Container[int] = ()) -> bool:
        """Nothing for ``tick`` to do until something happens to this partition: no
        AlterIsr or acks=all waiting, every ISR follower at the LEO, and no caught-up
        replica outside the ISR (for a follower replica, only the first two)."""
        if self.pending_isr is not None:
            return False
        if self._waiting:
            return False
        if self._by_deadline:  # only answered waits left: drop them, nothing to time
            self._by_deadline, self._by_offset = [], []
        if not self.is_leader:
            return True
        leo, hw, isr = self.leo, self.hw, self.isr
        for r, follower in self.followers.items():
            if r in silent:
                if r in self.maximal_isr:
                    return False
            elif r in isr:
                if follower.leo < leo:
                    return False
            elif follower.leo >= hw and follower.leo >= self.leader_epoch_start_offset:
                return False
        return True

    def _request_isr(self, isr: tuple[int, ...], now_ms: int) -> AlterIsr:
        self._requested |= set(isr) - set(self.isr)
        self.pending_isr = AlterIsr(isr, self.leader_epoch, self.partition_epoch)
        self._pending_sent_ms = now_ms
        return self.pending_isr

    def on_alter_isr_response(
        self, error: ErrorCode, state: PartitionState | None = None
    ) -> list[Action]:
        """The controller answered an AlterIsr (``state``: the partition afterwards).

        A success is the committed state, adopted whenever it arrives (even after a
        refusal of another copy). A refusal ends the wait, so a later tick or fetch may
        ask again once the backoff has passed, but the members it would have added keep
        counting for the HW until the partition epoch moves: another copy may still be
        applied.
        """
        if error is ErrorCode.NONE and state is not None:
            return self.update_metadata(state)
        if self.pending_isr is not None:
            # Ask again only after a capped exponential backoff: a controller that keeps
            # refusing (or cannot be reached) is not asked ten times a second.
            cfg = self.config
            backoff = cfg.alter_isr_backoff_ms << min(self.isr_failures, 30)
            delay = min(backoff, cfg.alter_isr_backoff_max_ms)
            self.isr_failures += 1
            self._next_isr_request_ms = self._pending_sent_ms + delay
        self.pending_isr = None
        return []

    def _reset_isr_backoff(self) -> None:
        self.isr_failures = 0
        self._next_isr_request_ms = 0

    # -- leader: high watermark and purgatory ------------------------------------------------

    def _advance_hw(self) -> list[Action]:
        if not self.is_leader:
            return []
        low = self.leo
        for r in self.maximal_isr:
            if r != self.broker_id:
                follower = self.followers.get(r)
                low = min(low, follower.leo if follower is not None else UNDEFINED_OFFSET)
        if low <= self.hw:
            return []
        self.hw = low
        actions: list[Action] = [HighWatermarkChanged(low)]
        error = self._ack_error()
        while self._by_offset and self._by_offset[0][0] <= low:
            _, seq = heapq.heappop(self._by_offset)
            key = self._waiting.pop(seq, None)
            if key is not None:
                actions.append(ProduceCompleted(key, error))
        return actions

    def low_watermark(self, log_start_offset: int) -> int:
        """The lowest log start offset of the ISR, given the leader's own (DeleteRecords).

        UNDEFINED_OFFSET until every follower in the ISR has reported its start in a
        fetch of the current leader epoch.
        """
        low = log_start_offset
        for r in self.isr:
            if r != self.broker_id:
                follower = self.followers.get(r)
                if follower is None or follower.log_start_offset < 0:
                    return UNDEFINED_OFFSET
                low = min(low, follower.log_start_offset)
        return low

    def _check_min_isr(self) -> list[Action]:
        if len(self.isr) >= self.config.min_insync_replicas:
            return []
        return self._fail_waiters(ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND)

    def _fail_waiters(self, error: ErrorCode) -> list[Action]:
        waiting, self._waiting = self._waiting, {}
        self._by_offset, self._by_deadline = [], []
        return [ProduceCompleted(key, error) for _, key in sorted(waiting.items())]

    # -- OffsetsForLeaderEpoch -------------------------------------------------------------------

    def end_offset_for_epoch(self, current_leader_epoch: int, epoch: int) -> EpochEndOffset:
        """Leader side: the largest epoch <= ``epoch`` we have, and where it ends."""
        if not self.is_leader:
            return EpochEndOffset(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        if current_leader_epoch < self.leader_epoch:
            return EpochEndOffset(ErrorCode.FENCED_LEADER_EPOCH)
        if current_leader_epoch > self.leader_epoch or epoch > self.leader_epoch:
            return EpochEndOffset(ErrorCode.UNKNOWN_LEADER_EPOCH)
        found, end = self.epochs.end_offset_for_epoch(epoch, self.leo)
        return EpochEndOffset(ErrorCode.NONE, found, end)

    def on_leader_epoch_answer(self, error: ErrorCode, epoch: int, end_offset: int) -> list[Action]:
        """Follower side: the leader's answer to our AskLeaderEpoch."""
        asked = self.asked_epoch
        if self.role is not ReplicaRole.FOLLOWER or asked is None or error is not ErrorCode.NONE:
            return []  # the shell asks again after a backoff (``asked_epoch`` is kept)
        if epoch == UNDEFINED_EPOCH or end_offset == UNDEFINED_OFFSET:
            # The leader has no epoch that old (its log starts later): the HW is the
            # only bound left; fetching then resets us to the leader's log start.
            return self._truncated(min(self.hw, self.leo))
        if epoch > asked:
            return []  # impossible from a correct leader: ignore, ask again later
        mine, my_end = self.epochs.end_offset_for_epoch(epoch, self.leo)
        if mine == epoch:
            return self._truncated(min(end_offset, my_end))
        if mine == UNDEFINED_EPOCH:
            # Every epoch we hold is newer than anything the leader has up to ``epoch``.
            entries = self.epochs.entries()
            first = entries[0][1] if entries else self.leo
            return self._truncated(min(end_offset, first))
        # The leader's epoch is one we never had: ask about our own older epoch.
        self.asked_epoch = mine
        return [AskLeaderEpoch(self.leader_id, self.leader_epoch, mine)]

    def _truncated(self, offset: int) -> list[Action]:
        actions: list[Action] = []
        offset = min(offset, self.leo)
        if offset < self.leo:
            actions.append(TruncateTo(offset))
            self.leo = offset
        self.hw = min(self.hw, self.leo)
        self.asked_epoch = None
        self.fetching = True
        actions.append(StartFetching(self.leader_id, self.leader_epoch, self.leo))
        return actions

    # -- follower: fetching ----------------------------------------------------------------------

    def on_fetched(self, log_end_offset: int, leader_hw: int) -> list[Action]:
        """Records from the leader were appended (or none were); the response carried HW."""
        self.leo = log_end_offset
        hw = min(max(self.hw, leader_hw), self.leo)
        if hw == self.hw:
            return []
        self.hw = hw
        return [HighWatermarkChanged(hw)]

    def on_out_of_range(self, leader_log_start: int) -> list[Action]:
        """Our fetch offset is below the leader's log start: start over from there."""
        self.leo = self.hw = leader_log_start
        return [
            ResetTo(leader_log_start),
            StartFetching(self.leader_id, self.leader_epoch, self.leo),
        ]
