"""The asyncio shell that keeps an AsyncConsumer in its consumer group.

It feeds the sans-IO ``GroupMembership`` (client/group_membership.py) and carries out
its actions. Three tasks, all owned here and stopped by ``close()``:

* the heartbeat task sends what the membership asks for, on the coordinator's own
  connection, and sleeps until the next deadline or until woken;
* the reconcile task carries out Reconcile/DropAll actions one at a time, so rebalance
  callbacks and commits never hold up heartbeats, and partitions that do not move keep
  fetching throughout;
* the auto-commit task (``enable_auto_commit``) commits, every interval, the positions
  the application has finished with: those as of its latest ``poll()`` call.

A pattern subscription re-resolves the regex against the topic list on every metadata
refresh (``metadata_max_age_ms``), and the membership sends the new names.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from logmq.client.cluster import TopicPartition
from logmq.client.group_membership import (
    FENCING_ERRORS,
    Action,
    DropAll,
    Fatal,
    FindCoordinator,
    GroupMembership,
    MembershipState,
    Reconcile,
)
from logmq.client.group_offsets import (
    OffsetAndMetadata,
    commit_error_text,
    fetch_committed,
    send_commit,
)
from logmq.errors import (
    CommitFailedError,
    ConnectionError_,
    ErrorCode,
    LogMQError,
    error_for,
)
from logmq.net.codec import ApiKey

if TYPE_CHECKING:
    from logmq.client.consumer import AsyncConsumer

log = logging.getLogger(__name__)

Listener = Callable[[set[TopicPartition]], Any | Awaitable[Any]]


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class GroupSession:
    """Membership, rebalancing and offset commits of one group-managed consumer."""

    def __init__(
        self,
        consumer: AsyncConsumer,
        membership: GroupMembership,
        *,
        topics: Iterable[str] | None = None,
        pattern: str | re.Pattern[str] | None = None,
        on_assigned: Listener | None = None,
        on_revoked: Listener | None = None,
        on_lost: Listener | None = None,
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5000,
        metadata_max_age_ms: int = 300_000,
    ) -> None:
        self.consumer = consumer
        self.membership = membership
        self.group_id = membership.group_id
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        self.on_lost = on_lost
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval = auto_commit_interval_ms / 1000
        self.metadata_max_age = metadata_max_age_ms / 1000
        self.topics: frozenset[str] | None = None
        self.pattern: re.Pattern[str] | None = None
        self.error: BaseException | None = None  # raised by the consumer's next poll()
        self._tasks: list[asyncio.Task[None]] = []
        self._reconciler: asyncio.Task[None] | None = None
        self._actions: asyncio.Queue[Action] | None = None
        self._wake: asyncio.Event | None = None
        self._beat: asyncio.Event | None = None  # replaced after every heartbeat answer
        self._closing = False
        self._step: asyncio.Future[None] | None = None  # the rebalance step under way
        self.set_subscription(topics, pattern)

    @property
    def _cluster(self):
        return self.consumer._cluster

    # -- subscription --------------------------------------------------------------
    def set_subscription(
        self, topics: Iterable[str] | None, pattern: str | re.Pattern[str] | None
    ) -> None:
        if (topics is None) == (pattern is None):
            raise ValueError("subscribe to a list of topics or to a pattern (one of them)")
        if pattern is not None:
            self.topics, self.pattern = None, re.compile(pattern)
        else:
            assert topics is not None
            names = [topics] if isinstance(topics, str) else list(topics)
            self.topics, self.pattern = frozenset(names), None
            self.membership.subscribe(self.topics)
        if self._wake is not None:
            self._wake.set()

    async def _resolve_pattern(self) -> None:
        """Subscribe to the topics the pattern matches now (internal ones excluded)."""
        if self.pattern is None:
            return
        await self._cluster.refresh_metadata()
        names = [
            name
            for name, info in self._cluster.metadata.topics.items()
            if info.error is ErrorCode.NONE
            and not info.internal
            and self.pattern.fullmatch(name) is not None
        ]
        self.membership.subscribe(names)
        if self._wake is not None:
            self._wake.set()

    # -- lifecycle -----------------------------------------------------------------
    async def start(self) -> None:
        self._actions = asyncio.Queue()
        self._wake = asyncio.Event()
        self._beat = asyncio.Event()
        if self.pattern is not None:
            try:
                await self._resolve_pattern()
            except LogMQError as e:
                log.warning("group %r: cannot resolve the pattern yet: %s", self.group_id, e)
        name = f"logmq-group-{self.group_id}"
        self._tasks.append(asyncio.create_task(self._heartbeat_loop(), name=f"{name}-heartbeat"))
        self._reconciler = asyncio.create_task(self._reconcile_loop(), name=f"{name}-reconcile")
        if self.enable_auto_commit:
            self._tasks.append(
                asyncio.create_task(self._auto_commit_loop(), name=f"{name}-autocommit")
            )
        if self.pattern is not None:
            self._tasks.append(asyncio.create_task(self._pattern_loop(), name=f"{name}-pattern"))
        for task in [*self._tasks, self._reconciler]:
            task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        """A task of ours must only end when cancelled: anything else is a bug, and the
        application hears of it from poll() rather than the group going silent."""
        if task.cancelled() or task.exception() is None:
            return
        log.error("group %r: %s failed", self.group_id, task.get_name(), exc_info=task.exception())
        if self.error is None:
            self.error = task.exception()
            self.consumer._wake_poll()

    async def close(self, timeout: float) -> None:
        """Finish the rebalance step under way, give up every partition (committing
        them with auto-commit, then on_revoked) and leave the group (a static member
        leaves temporarily, keeping its partitions for its restart), all within
        ``timeout`` seconds however unreachable the coordinator is."""
        if self._closing:
            return
        self._closing = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout

        def left() -> float:
            return max(0.001, deadline - loop.time())

        await _cancel(self._tasks[1:])  # auto-commit, pattern
        if self._step is not None:
            await asyncio.wait({self._step}, timeout=left())
        if self._reconciler is not None:
            await _cancel([self._reconciler])
        await _cancel(self._tasks[:1])  # heartbeat
        m = self.membership
        c = self.consumer
        owned = c.assignment()
        if m.is_member and owned:
            c._group_pause(owned)
            if self.enable_auto_commit:
                offsets = c._uncommitted(owned, processed=False)
                if offsets:
                    try:
                        await self.commit(offsets, retry=True, timeout=left())
                    except LogMQError as e:
                        log.warning("group %r: final commit failed: %s", self.group_id, e)
            await self._call(self.on_revoked, owned)
        body = m.leave()
        if body is not None:
            try:
                conn = await asyncio.wait_for(
                    self._cluster.coordinator_connection(self.group_id), left()
                )
                resp = await conn.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, body, timeout=left())
                m.on_response(resp.body, _now_ms())
            except (LogMQError, TimeoutError) as e:
                log.info("group %r: leave not confirmed: %s", self.group_id, e)
                m.on_failure(_now_ms())
        c._group_drop(c.assignment())

    # -- heartbeats ----------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        m = self.membership
        assert self._wake is not None
        timeout = self.consumer.request_timeout
        if m.session_timeout_ms:
            timeout = min(timeout, m.session_timeout_ms / 1000)
        while True:
            now = _now_ms()
            self._dispatch(m.expire(now))
            body = m.poll(now)
            if body is None:
                deadline = m.next_deadline_ms()
                self._wake.clear()
                wait = None if deadline is None else max(0.001, (deadline - now) / 1000)
                try:
                    async with asyncio.timeout(wait):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                continue
            try:
                conn = await self._cluster.coordinator_connection(self.group_id)
                resp = await conn.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, body, timeout=timeout)
                actions = m.on_response(resp.body, _now_ms())
            except LogMQError as e:
                if e.retriable or isinstance(e, ConnectionError_):
                    actions = m.on_failure(_now_ms())
                else:  # e.g. INVALID_GROUP_ID from FindCoordinator
                    actions = m.on_response({"error": int(e.code), "message": str(e)}, _now_ms())
            self._dispatch(actions)
            assert self._beat is not None
            self._beat.set()
            self._beat = asyncio.Event()

    def _dispatch(self, actions: list[Action]) -> None:
        assert self._actions is not None
        for action in actions:
            if isinstance(action, FindCoordinator):
                self._cluster.forget_coordinator(self.group_id)
            elif isinstance(action, Fatal):
                self.error = error_for(action.error, action.message)
                self.consumer._wake_poll()
            else:
                if isinstance(action, DropAll):  # stop fetching now, the rest in turn
                    self.consumer._group_pause(self.consumer.assignment())
                self._actions.put_nowait(action)

    def _wake_heartbeat(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # -- reconciliation ------------------------------------------------------------
    async def _reconcile_loop(self) -> None:
        assert self._actions is not None
        m = self.membership
        while not self._closing:
            action = await self._actions.get()
            if self._closing:
                break
            self._step = asyncio.get_running_loop().create_future()
            try:
                if isinstance(action, Reconcile):
                    revoked, assigned = await self._reconcile(action)
                    self._dispatch(m.reconciled(revoked, assigned, _now_ms()))
                elif isinstance(action, DropAll):
                    await self._drop_all(action)
                    m.lost_done(_now_ms())
            finally:
                self._step.set_result(None)
                self._step = None
            self._wake_heartbeat()

    async def _reconcile(
        self, action: Reconcile
    ) -> tuple[frozenset[TopicPartition], frozenset[TopicPartition]]:
        c = self.consumer
        revoked = action.revoke
        if revoked:
            c._group_pause(revoked)  # no more fetching, buffered records dropped
            if self.enable_auto_commit:
                offsets = c._uncommitted(revoked, processed=True)
                if offsets:
                    try:
                        await self.commit(offsets, retry=True)
                    except LogMQError as e:
                        log.warning("group %r: commit on revocation failed: %s", self.group_id, e)
            await self._call(self.on_revoked, set(revoked))
            c._group_drop(revoked)
        if not action.assign:
            return revoked, frozenset()
        try:
            committed = await fetch_committed(self._cluster, self.group_id, action.assign)
        except LogMQError as e:
            # Report only the revocation; the membership asks for the rest again.
            log.warning("group %r: cannot fetch committed offsets: %s", self.group_id, e)
            await asyncio.sleep(c.retry_backoff)
            return revoked, frozenset()
        positions = {tp: (None if co is None else co.offset) for tp, co in committed.items()}
        unknown = [tp for tp, pos in positions.items() if pos is None]
        if unknown:
            positions.update(await c._reset_offsets(unknown))
        if self.membership.state is not MembershipState.RECONCILING:
            return revoked, frozenset()  # fenced meanwhile: do not start them
        c._group_add(positions, {tp: co.offset for tp, co in committed.items() if co})
        await self._call(self.on_assigned, set(action.assign))
        return revoked, action.assign

    async def _drop_all(self, action: DropAll) -> None:
        c = self.consumer
        lost = c._group_lose()
        log.warning(
            "group %r: member fenced (%s); dropping %d partition(s) without committing",
            self.group_id,
            action.error.name,
            len(lost),
        )
        if lost:
            await self._call(self.on_lost or self.on_revoked, lost)

    async def _call(self, listener: Listener | None, partitions: set[TopicPartition]) -> None:
        if listener is None:
            return
        try:
            result = listener(set(partitions))
            if inspect.isawaitable(result):
                await result
        except Exception as e:  # the application's bug: hand it to its poll()
            log.exception("group %r: rebalance listener failed", self.group_id)
            if self.error is None:
                self.error = e
                self.consumer._wake_poll()

    # -- commits -------------------------------------------------------------------
    async def commit(
        self,
        offsets: dict[TopicPartition, OffsetAndMetadata],
        *,
        retry: bool,
        timeout: float | None = None,
    ) -> None:
        """Commit as the current member. A stale epoch waits for the next heartbeat
        and tries again (when ``retry``); a member the coordinator no longer knows gets
        CommitFailedError."""
        m = self.membership
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.consumer.request_timeout if timeout is None else timeout)
        while True:
            if not m.is_member:
                raise CommitFailedError(
                    f"cannot commit: this consumer is not a member of group {self.group_id!r} "
                    f"({m.state.value}); its partitions may belong to another member",
                    ErrorCode.UNKNOWN_MEMBER_ID,
                )
            epoch = m.member_epoch
            top, per_partition, message = await send_commit(
                self._cluster,
                self.group_id,
                m.member_id,
                epoch,
                offsets,
                timeout=max(0.001, deadline - loop.time()),
            )
            if top is ErrorCode.STALE_MEMBER_EPOCH and retry and loop.time() < deadline:
                await self._next_heartbeat(deadline - loop.time())
                continue
            if top in FENCING_ERRORS or top is ErrorCode.STALE_MEMBER_EPOCH:
                m.request_heartbeat()
                self._wake_heartbeat()
                raise CommitFailedError(
                    f"offset commit of group {self.group_id!r} refused ({top.name}): this "
                    "consumer is no longer the member that owned these partitions",
                    top,
                )
            if top is not ErrorCode.NONE:
                what = f"commit offsets of group {self.group_id!r}"
                raise error_for(top, commit_error_text(what, top, message))
            done = {tp: o.offset for tp, o in offsets.items() if not per_partition.get(tp)}
            self.consumer._mark_committed(done)
            for tp, code in sorted(per_partition.items()):
                if code is not ErrorCode.NONE:
                    raise error_for(code, f"commit offset of {tp[0]}-{tp[1]}: {code.name}")
            return

    async def _next_heartbeat(self, timeout: float) -> None:
        assert self._beat is not None
        beat = self._beat
        self.membership.request_heartbeat()
        self._wake_heartbeat()
        try:
            async with asyncio.timeout(max(0.001, timeout)):
                await beat.wait()
        except TimeoutError:
            pass

    async def _auto_commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.auto_commit_interval)  # a period, not a sync point
            await self.auto_commit()

    async def auto_commit(self) -> None:
        """Commit what the application has finished with (positions as of its latest
        poll); failures are logged, the next round tries again."""
        if not self.membership.is_member:
            return
        offsets = self.consumer._uncommitted(None, processed=True)
        if not offsets:
            return
        try:
            await self.commit(offsets, retry=False)
        except LogMQError as e:
            log.info("group %r: auto-commit failed: %s", self.group_id, e)

    # -- pattern -------------------------------------------------------------------
    async def _pattern_loop(self) -> None:
        delay = self.metadata_max_age if self.membership.subscription is not None else 0.0
        while True:
            await asyncio.sleep(delay)  # the metadata's age, not a sync point
            try:
                await self._resolve_pattern()
                delay = self.metadata_max_age
            except LogMQError as e:
                log.info("group %r: metadata refresh failed: %s", self.group_id, e)
                delay = min(self.metadata_max_age, 1.0)  # try again soon

    @property
    def state(self) -> MembershipState:
        return self.membership.state


async def _cancel(tasks: Iterable[asyncio.Task[Any]]) -> None:
    tasks = [t for t in tasks if not t.done()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
