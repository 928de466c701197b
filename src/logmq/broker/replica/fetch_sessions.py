"""Fetch sessions (Kafka's incremental fetch, KIP-227), for both front doors.

A consumer or follower that fetches thousands of partitions names them all once; the
broker keeps them in a session, and later fetches carry only the partitions whose
fetch position (or leader epoch, or follower log start) changed, plus those to forget.
Answers carry only the partitions with records, an error, or a new high watermark or
log start offset.

Idle partitions cost nothing per fetch on the broker either: a session reads only its
*ready* partitions — those just named in a request, those with data left at their
session position or an error at the last read, and those an append, a high-watermark
move or a leadership change touched since (``mark_ready``, called by the fetch waiters).

Sans-IO: the cache and sessions are plain state. The door keeps one cache; the replica
manager reads a session's ready partitions; ``FetchWaiters`` calls ``mark_ready`` and
wakes a session's parked fetch.

Epochs follow Kafka: a request with session id 0 and epoch 0 opens a session (its
answer carries the new id, or 0 if the cache is full); epoch -1 fetches without one
(closing the named session, if any); an incremental fetch names the session and its
next epoch, which moves on by one per answer. An unknown id is
FETCH_SESSION_ID_NOT_FOUND, a wrong epoch INVALID_FETCH_SESSION_EPOCH: the fetcher
then opens a new session with a full fetch.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from logmq.errors import ErrorCode, LogMQError
from logmq.gcpause import gc_paused

if TYPE_CHECKING:
    from logmq.broker.replica.fetch_results import TopicRead
    from logmq.broker.replica.fetch_waiter import FetchWaiters

TopicPartition = tuple[str, int]
INITIAL_EPOCH = 0  # with session id 0: open a session
FINAL_EPOCH = -1  # no session (and close the one named)
MAX_EPOCH = 0x7FFFFFFF

# What a request names for one partition: (partition, fetch offset, max bytes,
# current leader epoch, the follower's log start offset or -1).
Entry = tuple[int, int, int, int, int]
Wanted = list[tuple[str, list[tuple[int, int, int, int]]]]


@dataclass(slots=True)
class SessionPartition:
    """One partition of a session: what the fetcher last named, and what it last heard."""

    fetch_offset: int
    max_bytes: int
    leader_epoch: int
    log_start_offset: int = -1  # a follower's own (DeleteRecords waits on it)
    high_watermark: int = -2  # last sent; -2: never sent
    sent_log_start: int = -2


More = Callable[[TopicPartition, "SessionPartition"], bool]


class FetchSession:
    """A fetcher's partitions between fetches; see the module docstring."""

    def __init__(self, session_id: int, replica_id: int, now_ms: int) -> None:
        self.id = session_id
        self.replica_id = replica_id
        self.epoch = 1  # the epoch the next incremental fetch must carry
        self.last_used_ms = now_ms
        self.partitions: dict[TopicPartition, SessionPartition] = {}
        # Ordered, so partitions that just sent data go to the back: a max_bytes budget
        # then reaches every partition in turn.
        self.ready: dict[TopicPartition, None] = {}
        self.wake: Callable[[], None] | None = None  # the shell's, while a fetch is parked
        self.closed = False

    def __len__(self) -> int:
        return len(self.partitions)

    def mark_ready(self, tp: TopicPartition) -> None:
        """Something happened to ``tp`` (an append, an HW move, a leader change)."""
        if tp in self.partitions:
            self.ready[tp] = None
            if self.wake is not None:
                self.wake()

    @gc_paused()  # a full fetch names every partition: logmq/gcpause.py
    def update(
        self, named: Iterable[tuple[str, Iterable[Entry]]], forgotten: Iterable[TopicPartition]
    ) -> tuple[list[TopicPartition], list[TopicPartition]]:
        """Take a request's partitions and forgotten ones; returns (added, removed)."""
        added: list[TopicPartition] = []
        removed: list[TopicPartition] = []
        for tp in forgotten:
            if self.partitions.pop(tp, None) is not None:
                self.ready.pop(tp, None)
                removed.append(tp)
        parts = self.partitions
        ready = self.ready
        for topic, entries in named:
            for partition, offset, max_bytes, leader_epoch, log_start in entries:
                tp = (topic, partition)
                sp = parts.get(tp)
                if sp is None:
                    parts[tp] = SessionPartition(offset, max_bytes, leader_epoch, log_start)
                    added.append(tp)
                else:
                    sp.fetch_offset = offset
                    sp.max_bytes = max_bytes
                    sp.leader_epoch = leader_epoch
                    sp.log_start_offset = log_start
                ready.pop(tp, None)
                ready[tp] = None
        return added, removed

    def to_read(self) -> Wanted:
        """The ready partitions, grouped by topic, in the replica manager's shape."""
        by_topic: dict[str, list[tuple[int, int, int, int]]] = {}
        parts = self.partitions
        for tp in self.ready:
            sp = parts[tp]
            entry = (tp[1], sp.fetch_offset, sp.max_bytes, sp.leader_epoch)
            lst = by_topic.get(tp[0])
            if lst is None:
                by_topic[tp[0]] = [entry]
            else:
                lst.append(entry)
        return list(by_topic.items())

    def has_news(self, topics: list[TopicRead]) -> bool:
        """Does a read hold an error, or an HW or log start the fetcher has not heard?"""
        parts = self.partitions
        for topic, reads in topics:
            for p in reads:
                sp = parts.get((topic, p.partition))
                if sp is None:
                    continue
                if (
                    p.error
                    or p.high_watermark != sp.high_watermark
                    or p.log_start_offset != sp.sent_log_start
                ):
                    return True
        return False

    def settle(self, topics: list[TopicRead], more: More) -> None:
        """A read that will not be sent: unready the partitions with nothing to send."""
        parts = self.partitions
        ready = self.ready
        for topic, reads in topics:
            for p in reads:
                tp = (topic, p.partition)
                sp = parts.get(tp)
                if sp is not None and not p.error and p.records is None and not more(tp, sp):
                    ready.pop(tp, None)

    @gc_paused()  # an entry per partition of a full answer: logmq/gcpause.py
    def answered(self, topics: list[TopicRead], full: bool, more: More) -> list[TopicRead]:
        """Keep an answer's partitions to send and note what was sent.

        ``topics`` is the replica manager's answer for ``to_read()``. A partition stays
        ready while ``more(tp, sp)`` (data left at its session position) or it has an
        error. An incremental answer (``full`` False) drops the partitions with no
        records, no error and the HW and log start offset the fetcher already has.
        """
        out = []
        parts = self.partitions
        ready = self.ready
        sent_data = []
        for topic, reads in topics:
            keep = []
            for p in reads:
                tp = (topic, p.partition)
                sp = parts.get(tp)
                if sp is None:
                    continue
                error = p.error
                hw = p.high_watermark
                start = p.log_start_offset
                changed = hw != sp.high_watermark or start != sp.sent_log_start
                sp.high_watermark = hw
                sp.sent_log_start = start
                sent = p.records is not None
                if sent:
                    ready.pop(tp, None)
                    sent_data.append(tp)
                elif error or more(tp, sp):
                    # keeps its place: a batch that did not fit the budget comes first
                    # in the next fetch, where it may exceed it
                    ready.setdefault(tp, None)
                else:
                    ready.pop(tp, None)
                if full or sent or error or changed:
                    keep.append(p)
            if keep:
                out.append((topic, keep))
        for tp in sent_data:  # to the back of the line, behind those a budget left out
            ready[tp] = None
        return out


class FetchSessionError(LogMQError):
    """An incremental fetch names a session that is gone, or the wrong epoch."""


@dataclass(slots=True)
class FetchContext:
    """What one fetch request is under the session rules (Kafka's FetchContext)."""

    session: FetchSession | None  # None: a fetch without a session
    full: bool  # answered for every partition it names (a new session, or none)

    @property
    def session_id(self) -> int:
        """The session id its answer carries (0: none)."""
        return self.session.id if self.session is not None else 0


class FetchSessionCache:
    """The broker's sessions (one cache per front door), bounded in count.

    When full, a new session takes the slot of the least recently used one that has
    been idle for ``evict_idle_ms``; if none has, the fetcher goes without a session
    (it fetches in full, as before sessions). ``watch``/``unwatch`` tell the fetch
    waiters which partitions a session follows.
    """

    def __init__(
        self,
        *,
        max_sessions: int = 1000,
        evict_idle_ms: int = 120_000,
        watch: Callable[[FetchSession, Iterable[TopicPartition]], None] = lambda s, tps: None,
        unwatch: Callable[[FetchSession, Iterable[TopicPartition]], None] = lambda s, tps: None,
        rng: random.Random | None = None,
    ) -> None:
        self.max_sessions = max_sessions
        self.evict_idle_ms = evict_idle_ms
        self._watch = watch
        self._unwatch = unwatch
        self._rng = rng or random.Random()
        self._sessions: dict[int, FetchSession] = {}  # least recently used first

    @classmethod
    def watched_by(cls, waiters: FetchWaiters) -> FetchSessionCache:
        """A door's cache whose sessions hear of appends through ``waiters``."""
        return cls(watch=waiters.watch, unwatch=waiters.unwatch)

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: int) -> bool:
        return session_id in self._sessions

    @property
    def partitions(self) -> int:
        """Partitions held by every session (the memory they cost)."""
        return sum(len(s) for s in self._sessions.values())

    def open(self, replica_id: int, now_ms: int) -> FetchSession | None:
        """A new session, or None when the cache is full of sessions in use."""
        if len(self._sessions) >= self.max_sessions:
            oldest = next(iter(self._sessions.values()), None)
            if oldest is None or now_ms - oldest.last_used_ms < self.evict_idle_ms:
                return None
            self.close(oldest.id)
        while True:
            sid = self._rng.randrange(1, MAX_EPOCH)
            if sid not in self._sessions:
                break
        session = FetchSession(sid, replica_id, now_ms)
        self._sessions[sid] = session
        return session

    def get(self, session_id: int, epoch: int, replica_id: int, now_ms: int) -> FetchSession:
        """The session an incremental fetch names, checked; it becomes the most recent
        and expects the next epoch from now on (so a second fetch sent with the same
        epoch while this one is parked is refused)."""
        session = self._sessions.get(session_id)
        if session is None or session.replica_id != replica_id:
            raise FetchSessionError(
                f"fetch session {session_id} not found", ErrorCode.FETCH_SESSION_ID_NOT_FOUND
            )
        if epoch != session.epoch:
            raise FetchSessionError(
                f"fetch session {session_id} expects epoch {session.epoch}, got {epoch}",
                ErrorCode.INVALID_FETCH_SESSION_EPOCH,
            )
        del self._sessions[session_id]
        self._sessions[session_id] = session
        session.last_used_ms = now_ms
        session.epoch = 1 if epoch >= MAX_EPOCH else epoch + 1
        return session

    def update(
        self,
        session: FetchSession,
        named: Iterable[tuple[str, Iterable[Entry]]],
        forgotten: Iterable[TopicPartition],
    ) -> None:
        """Apply a request to ``session`` and keep the waiters' view in step."""
        added, removed = session.update(named, forgotten)
        if removed:
            self._unwatch(session, removed)
        if added:
            self._watch(session, added)

    def new_context(
        self,
        session_id: int,
        epoch: int,
        replica_id: int,
        now_ms: int,
        named: list[tuple[str, list[Entry]]],
        forgotten: Iterable[TopicPartition],
    ) -> FetchContext:
        """The session a fetch uses, by KIP-227's epochs, for both doors (the rule of
        Kafka's ``FetchManager.newContext``): epoch -1 fetches without one, closing the
        session named; epoch 0 opens one (closing the session named), or goes without
        when the cache is full; any other epoch is an incremental fetch of the session
        named, which applies the request's changes and ``forgotten`` partitions.
        FetchSessionError for an unknown session or a wrong epoch."""
        if epoch == FINAL_EPOCH:
            if session_id:
                self.close(session_id)
            return FetchContext(None, True)
        if epoch == INITIAL_EPOCH:
            if session_id:
                self.close(session_id)
            session = self.open(replica_id, now_ms)
            if session is not None:
                self.update(session, named, ())
            return FetchContext(session, True)
        session = self.get(session_id, epoch, replica_id, now_ms)
        self.update(session, named, forgotten)
        return FetchContext(session, False)

    def throttled(self, context: FetchContext) -> int:
        """A fetch over its quota is answered empty, and a session it opened is not
        kept, as in Kafka: the session id its answer carries."""
        if context.session is not None and context.full:
            self.close(context.session.id)
            return 0
        return context.session_id

    def close(self, session_id: int) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            session.closed = True
            self._unwatch(session, list(session.partitions))
            if session.wake is not None:
                session.wake()

    def close_all(self) -> None:
        for sid in list(self._sessions):
            self.close(sid)
