"""A consumer's side of group membership (KIP-848): a sans-IO state machine.

The coordinator computes assignments; a member only heartbeats and reconciles. This
class decides *what* to send and *when*, and turns responses into actions for the
asyncio shell (client/group_session.py). It reads no clock (``now_ms`` comes in), opens
no socket and starts no task, so every path is unit-tested without a broker.

Driving it::

    body = m.poll(now_ms)           # a ConsumerGroupHeartbeat body to send now, or None
    actions = m.on_response(body, now_ms) / m.on_failure(now_ms)
    # carry out each action, then report back:
    m.reconciled(revoked, assigned, now_ms) / m.lost_done(now_ms)
    m.next_deadline_ms()            # sleep until then (or until woken)

Reconciliation runs one step at a time: while the shell works on a ``Reconcile``,
newer targets are only remembered, and ``reconciled()`` emits the next step. Partitions
are released (``owned`` shrinks, and the next heartbeat reports it at once) only after
the shell has stopped fetching and committed them, which is what keeps ownership
exclusive across members. Partitions that stay are never touched. Partitions the shell
is still taking count as owned in heartbeats: otherwise a heartbeat sent meanwhile
would tell the coordinator they are free while the shell is about to fetch them.

Session guard: with a known ``session_timeout_ms``, a member that has had no heartbeat
answered for most of it drops its partitions by itself (a DropAll), *before* the
coordinator can expire it and hand them to someone else. The clock starts when the
last answered heartbeat was *sent*, which is never after the coordinator received it,
so the guard fires first even when responses are slow.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from logmq.errors import ErrorCode

TopicPartition = tuple[str, int]

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
TEMPORARY_LEAVE_EPOCH = -2  # a static member leaving for a restart

# Errors after which the member no longer exists for the coordinator: its partitions
# may already belong to someone else, so they are dropped without a commit.
FENCING_ERRORS = frozenset({ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH})
# Errors that mean "this broker is not (yet) the group's coordinator".
COORDINATOR_ERRORS = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    }
)


class MembershipState(StrEnum):
    UNSUBSCRIBED = "unsubscribed"  # no subscription yet: nothing to send
    JOINING = "joining"  # the next heartbeat joins (epoch 0)
    STABLE = "stable"  # a member, nothing to reconcile
    RECONCILING = "reconciling"  # a Reconcile action is with the shell
    FENCED = "fenced"  # a DropAll action is with the shell; rejoin when it is done
    LEAVING = "leaving"  # the leave heartbeat is on its way
    LEFT = "left"
    FAILED = "failed"  # a non-retriable error: the consumer cannot go on


@dataclass(slots=True, frozen=True)
class Reconcile:
    """Give up ``revoke`` (stop fetching, commit, on_revoked), then take ``assign``
    (find starting offsets, on_assigned, start fetching); then call ``reconciled``."""

    revoke: frozenset[TopicPartition]
    assign: frozenset[TopicPartition]


@dataclass(slots=True, frozen=True)
class DropAll:
    """The coordinator no longer knows this member: drop every partition without
    committing (on_lost), then call ``lost_done``; the member rejoins after."""

    error: ErrorCode


@dataclass(slots=True, frozen=True)
class FindCoordinator:
    """The coordinator moved or is unreachable: forget it and look it up again."""

    error: ErrorCode


@dataclass(slots=True, frozen=True)
class Fatal:
    """A non-retriable error (e.g. INVALID_SESSION_TIMEOUT): surface it to the user."""

    error: ErrorCode
    message: str


Action = Reconcile | DropAll | FindCoordinator | Fatal


def tp_list(partitions: Iterable[TopicPartition]) -> list[dict[str, Any]]:
    """``{(topic, p)}`` -> the wire's ``[{"topic": t, "partitions": [p, ...]}]``, sorted."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]


def parse_tp_list(entries: Any) -> frozenset[TopicPartition]:
    """The wire's TP list -> ``{(topic, partition)}`` (None or junk entries: empty)."""
    out = set()
    for entry in entries or ():
        if not isinstance(entry, dict):
            continue
        topic = entry.get("topic")
        for p in entry.get("partitions") or ():
            if isinstance(topic, str) and isinstance(p, int):
                out.add((topic, p))
    return frozenset(out)


def _code(value: Any) -> ErrorCode:
    try:
        return ErrorCode(value)
    except (ValueError, TypeError):
        return ErrorCode.UNKNOWN_SERVER_ERROR


class GroupMembership:
    """One consumer's membership in one group: what to heartbeat and what to do."""

    def __init__(
        self,
        group_id: str,
        *,
        instance_id: str | None = None,
        session_timeout_ms: int | None = None,
        rebalance_timeout_ms: int = 300_000,
        server_assignor: str | None = None,
        heartbeat_interval_ms: int = 3_000,
        retry_backoff_ms: int = 100,
        max_retry_backoff_ms: int = 1_000,
    ) -> None:
        if not group_id:
            raise ValueError("group_id must not be empty")
        self.group_id = group_id
        self.instance_id = instance_id
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.server_assignor = server_assignor
        # Until the coordinator answers with its own interval (which wins), ours.
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.max_retry_backoff_ms = max_retry_backoff_ms

        self.state = MembershipState.UNSUBSCRIBED
        self.member_id = ""
        self.member_epoch = JOIN_EPOCH
        self.owned: frozenset[TopicPartition] = frozenset()  # what the shell really has
        self._taking: frozenset[TopicPartition] = frozenset()  # the shell is starting these
        self.target: frozenset[TopicPartition] = frozenset()  # the coordinator's latest
        self.subscription: frozenset[str] | None = None
        self._sent_subscription: frozenset[str] | None = None  # acknowledged by a response
        self._in_flight: int | None = None  # the epoch of the request on its way, if any
        self._in_flight_subscription: frozenset[str] | None = None  # what it carries
        self._due_ms = 0  # when the next regular heartbeat is due
        self._urgent = False  # send at once (owned set or subscription changed)
        self._failures = 0  # consecutive failed requests: the backoff exponent
        self._sent_ms = 0  # when the request in flight was sent
        self._alive_since_ms: int | None = None  # send time of the last answered heartbeat

    # -- queries -------------------------------------------------------------------
    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    @property
    def is_member(self) -> bool:
        """The coordinator knows us with an epoch we may commit with."""
        return self.member_epoch > 0 and self.state in (
            MembershipState.STABLE,
            MembershipState.RECONCILING,
        )

    def next_deadline_ms(self) -> int | None:
        """When ``poll`` or ``expire`` next has something to do (None: only a response or
        a call to this class can change that)."""
        guard = self.session_deadline_ms()
        if self._in_flight is not None or not self._active():
            return guard
        due = 0 if self._urgent and self._failures == 0 else self._due_ms
        return due if guard is None else min(due, guard)

    def session_deadline_ms(self) -> int | None:
        """When the session guard drops our partitions (None: no guard now)."""
        if (
            self.session_timeout_ms is None
            or self._alive_since_ms is None
            or self.state not in (MembershipState.STABLE, MembershipState.RECONCILING)
        ):
            return None
        margin = max(1, self.session_timeout_ms // 5)
        return self._alive_since_ms + self.session_timeout_ms - margin

    def _active(self) -> bool:
        return self.state in (
            MembershipState.JOINING,
            MembershipState.STABLE,
            MembershipState.RECONCILING,
        )

    # -- inputs from the consumer ----------------------------------------------------
    def subscribe(self, topics: Iterable[str]) -> None:
        """Subscribe to exactly these topic names (a pattern is resolved by the shell)."""
        topics = frozenset(topics)
        if topics == self.subscription:
            return
        self.subscription = topics
        if self.state in (MembershipState.UNSUBSCRIBED, MembershipState.LEFT):
            self.state = MembershipState.JOINING
            self.member_epoch = JOIN_EPOCH
        self._urgent = True

    def request_heartbeat(self) -> None:
        """Heartbeat as soon as possible (e.g. a commit found its epoch stale)."""
        self._urgent = True

    def leave(self) -> dict[str, Any] | None:
        """The leave heartbeat (epoch -2 for a static member, else -1), or None when
        the coordinator does not know us. No further heartbeat is sent after it."""
        was_known = bool(self.member_id) and self.state not in (
            MembershipState.LEFT,
            MembershipState.FAILED,
            MembershipState.UNSUBSCRIBED,
        )
        self.state = MembershipState.LEAVING if was_known else MembershipState.LEFT
        if not was_known:
            return None
        epoch = TEMPORARY_LEAVE_EPOCH if self.instance_id is not None else LEAVE_EPOCH
        self._in_flight = epoch
        return self._body(epoch, topics=None, owned=None)

    def expire(self, now_ms: int) -> list[Action]:
        """The session guard: past ``session_deadline_ms`` the coordinator may expire us
        any moment, so give everything up now and rejoin (call before ``poll``)."""
        deadline = self.session_deadline_ms()
        if deadline is None or now_ms < deadline:
            return []
        return self._fenced(ErrorCode.REQUEST_TIMED_OUT, now_ms)

    # -- sending -------------------------------------------------------------------
    def poll(self, now_ms: int) -> dict[str, Any] | None:
        """The heartbeat to send now, or None. The caller must report its outcome with
        ``on_response`` or ``on_failure`` before the next one is handed out."""
        deadline = self.next_deadline_ms()
        if deadline is None or now_ms < deadline:
            return None
        self._urgent = False
        self._sent_ms = now_ms
        if self.state is MembershipState.JOINING:
            self._in_flight = JOIN_EPOCH
            self._in_flight_subscription = self.subscription or frozenset()
            body = self._body(JOIN_EPOCH, topics=self._in_flight_subscription, owned=())
            body["session_timeout_ms"] = self.session_timeout_ms
            body["server_assignor"] = self.server_assignor
            return body
        self._in_flight = self.member_epoch
        topics = self.subscription if self.subscription != self._sent_subscription else None
        self._in_flight_subscription = topics
        return self._body(self.member_epoch, topics=topics, owned=self.owned | self._taking)

    def _body(
        self, epoch: int, topics: Iterable[str] | None, owned: Iterable[TopicPartition] | None
    ) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "member_id": self.member_id,
            "member_epoch": epoch,
            "instance_id": self.instance_id,
            "rebalance_timeout_ms": self.rebalance_timeout_ms,
            "session_timeout_ms": None,
            "subscribed_topics": None if topics is None else sorted(topics),
            "server_assignor": None,
            "owned_partitions": None if owned is None else tp_list(owned),
        }

    # -- responses -----------------------------------------------------------------
    def on_response(self, body: dict[str, Any], now_ms: int) -> list[Action]:
        """Handle a ConsumerGroupHeartbeat response to the request in flight."""
        sent_epoch, self._in_flight = self._in_flight, None
        if sent_epoch is None:
            return []  # nothing was in flight (e.g. reset by leave): stale
        if self.state in (MembershipState.LEAVING, MembershipState.LEFT):
            self.state = MembershipState.LEFT
            self.owned = self.target = frozenset()
            self.member_epoch = JOIN_EPOCH
            return []
        if sent_epoch != JOIN_EPOCH and self.state in (
            MembershipState.FENCED,
            MembershipState.JOINING,
        ):
            return []  # answers a member we already gave up being (session guard)
        error = _code(body.get("error", 0))
        if error is ErrorCode.NONE:
            return self._accept(body, now_ms)
        message = body.get("message") or error.name
        if error in FENCING_ERRORS:
            return self._fenced(error, now_ms)
        if error in COORDINATOR_ERRORS:
            return [FindCoordinator(error), *self._backoff(now_ms)]
        if error.retriable:
            return self._backoff(now_ms)
        self.state = MembershipState.FAILED
        return [Fatal(error, f"group {self.group_id!r}: {message}")]

    def on_failure(self, now_ms: int) -> list[Action]:
        """The heartbeat got no answer (connection lost, timed out): the coordinator may
        or may not have seen it, so the next one repeats everything it must know."""
        if self._in_flight is None:
            return []
        self._in_flight = None
        if self.state in (MembershipState.LEAVING, MembershipState.LEFT):
            self.state = MembershipState.LEFT
            return []
        return [FindCoordinator(ErrorCode.NETWORK_EXCEPTION), *self._backoff(now_ms)]

    def _accept(self, body: dict[str, Any], now_ms: int) -> list[Action]:
        self._failures = 0
        self._alive_since_ms = self._sent_ms
        member_id = body.get("member_id")
        if isinstance(member_id, str) and member_id:
            self.member_id = member_id
        epoch = body.get("member_epoch")
        if isinstance(epoch, int) and epoch > 0:
            self.member_epoch = epoch
        interval = body.get("heartbeat_interval_ms")
        if isinstance(interval, int) and interval > 0:
            self.heartbeat_interval_ms = interval
        self._due_ms = now_ms + self.heartbeat_interval_ms
        if self._in_flight_subscription is not None:
            self._sent_subscription = self._in_flight_subscription
        if self.state is MembershipState.JOINING:
            self.state = MembershipState.STABLE
        if body.get("assignment") is not None:
            self.target = parse_tp_list(body["assignment"])
        if self.state is MembershipState.STABLE:
            return self._next_step()
        return []

    def _fenced(self, error: ErrorCode, now_ms: int) -> list[Action]:
        if error is ErrorCode.UNKNOWN_MEMBER_ID and self.instance_id is None:
            self.member_id = ""  # the coordinator forgot it: let it pick a new one
        self.member_epoch = JOIN_EPOCH
        self.target = frozenset()
        self._sent_subscription = None
        self._alive_since_ms = None
        self._due_ms = now_ms
        self.state = MembershipState.FENCED
        return [DropAll(error)]

    def _backoff(self, now_ms: int) -> list[Action]:
        self._failures += 1
        self._sent_subscription = None  # it may not have arrived: repeat it
        delay = min(self.max_retry_backoff_ms, self.retry_backoff_ms << min(self._failures - 1, 16))
        self._due_ms = now_ms + delay
        return []

    # -- reports from the shell ----------------------------------------------------
    def reconciled(
        self,
        revoked: Iterable[TopicPartition],
        assigned: Iterable[TopicPartition],
        now_ms: int,
    ) -> list[Action]:
        """The shell carried out a Reconcile: it no longer has ``revoked`` and now has
        ``assigned``. The next heartbeat reports it at once."""
        if self.state is not MembershipState.RECONCILING:
            return []  # fenced or left meanwhile: DropAll/leave takes over
        self.owned = (self.owned - frozenset(revoked)) | frozenset(assigned)
        self._taking = frozenset()
        self._urgent = True
        self.state = MembershipState.STABLE
        return self._next_step()

    def lost_done(self, now_ms: int) -> None:
        """The shell dropped every partition after a DropAll: rejoin with epoch 0."""
        if self.state is not MembershipState.FENCED:
            return
        self.owned = self._taking = frozenset()
        self.state = MembershipState.JOINING
        self._urgent = True
        self._due_ms = now_ms

    def _next_step(self) -> list[Action]:
        revoke = self.owned - self.target
        assign = self.target - self.owned
        if not revoke and not assign:
            return []
        self.state = MembershipState.RECONCILING
        self._taking = assign
        return [Reconcile(revoke, assign)]
