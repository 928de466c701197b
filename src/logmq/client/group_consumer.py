"""The consumer-group half of AsyncConsumer: subscribing, committing, committed offsets,
and the hooks through which a GroupSession (client/group_session.py) adds, pauses and
drops partitions one by one.

A mixin so that client/consumer.py keeps to positions and polling; it works on the
consumer's per-partition state (``_assigned``) and never touches fetch internals.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from logmq.client.cluster import TopicPartition
from logmq.client.group_membership import GroupMembership
from logmq.client.group_offsets import (
    OffsetAndMetadata,
    OffsetsArg,
    fetch_committed,
    normalize_offsets,
    standalone_commit,
)
from logmq.client.group_session import GroupSession
from logmq.errors import CommitFailedError, ErrorCode, LogMQError

if TYPE_CHECKING:
    from logmq.client.cluster import ClusterClient


class GroupConsumerMixin:
    """Mixed into AsyncConsumer; see its docstring for what the options mean."""

    # provided by AsyncConsumer
    group_id: str | None
    auto_offset_reset: str
    request_timeout: float
    _cluster: ClusterClient
    _assigned: dict[TopicPartition, Any]
    _group: GroupSession | None
    _membership: GroupMembership
    _group_options: dict[str, Any]
    _lost_uncommitted: set[TopicPartition]
    _commits: set[asyncio.Task[None]]
    _started: bool

    if TYPE_CHECKING:

        async def start(self) -> Any: ...
        def _signal_change(self) -> None: ...

        def _layout_changed(self) -> None: ...
        def _add_partition(
            self, tp: TopicPartition, position: int | None, committed: int | None
        ) -> None: ...

    def _init_group(
        self,
        group_id: str | None,
        *,
        topics: Iterable[str] | None,
        pattern: str | re.Pattern[str] | None,
        instance_id: str | None,
        session_timeout_ms: int | None,
        rebalance_timeout_ms: int,
        server_assignor: str | None,
        heartbeat_interval_ms: int,
        retry_backoff_ms: int,
        **session_options: Any,
    ) -> None:
        if group_id is not None and not group_id:
            raise ValueError("group_id must not be empty")
        if (topics is not None or pattern is not None) and group_id is None:
            raise ValueError("subscribing to topics needs a group_id")
        if session_options["auto_commit_interval_ms"] <= 0:
            raise ValueError("auto_commit_interval_ms must be positive")
        self.group_id = group_id
        self._group = None
        self._group_options = session_options
        self._lost_uncommitted = set()
        self._commits = set()
        if group_id is None:
            return
        self._membership = GroupMembership(
            group_id,
            instance_id=instance_id,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            server_assignor=server_assignor,
            heartbeat_interval_ms=heartbeat_interval_ms,
            retry_backoff_ms=retry_backoff_ms,
        )
        if topics is not None or pattern is not None:
            self._group = GroupSession(
                self, self._membership, topics=topics, pattern=pattern, **session_options
            )

    async def subscribe(
        self,
        topics: Iterable[str] | None = None,
        *,
        pattern: str | re.Pattern[str] | None = None,
    ) -> None:
        """Join ``group_id`` for these topics (or every topic the regex ``pattern``
        matches in full); calling it again changes the subscription."""
        if self.group_id is None:
            raise ValueError("subscribe() needs a consumer created with a group_id")
        if self._group is None:
            if self._assigned:
                raise ValueError("subscribe() cannot be used after assign()")
            self._group = GroupSession(
                self, self._membership, topics=topics, pattern=pattern, **self._group_options
            )
            if self._started:
                await self._group.start()
            return
        self._group.set_subscription(topics, pattern)
        if pattern is not None and self._started:
            await self._group._resolve_pattern()

    def subscription(self) -> set[str]:
        """The topic names subscribed to (a pattern's current matches)."""
        if self._group is None:
            return set()
        return set(self._membership.subscription or ())

    @property
    def member_id(self) -> str | None:
        return self._membership.member_id if self._group is not None else None

    async def commit(
        self, offsets: OffsetsArg | None = None, *, metadata: str | None = None
    ) -> None:
        """Commit the positions of every record poll() has returned, or the given
        ``{(topic, partition): offset | (offset, metadata) | OffsetAndMetadata}``
        (the offset of the next record to read). Waits for the coordinator; raises
        CommitFailedError if this consumer is no longer the group member that owns them."""
        await self._commit(offsets, metadata, retry=True)

    def commit_async(
        self,
        offsets: OffsetsArg | None = None,
        *,
        metadata: str | None = None,
        callback: Callable[[dict, BaseException | None], Any] | None = None,
    ) -> asyncio.Task[None]:
        """Start a commit and return its task (await it, or pass ``callback(offsets,
        error)``). Async commits are not retried, so a later one never overwrites a
        newer position."""
        try:
            snapshot = self._commit_offsets(offsets, metadata)
            coro = self._commit(snapshot, None, retry=False)
        except (LogMQError, ValueError) as e:
            snapshot, coro = {}, _raise(e)
        task = asyncio.ensure_future(coro)
        self._commits.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._commits.discard(t)
            err = None if t.cancelled() else t.exception()
            if callback is not None:
                callback(snapshot, err)

        task.add_done_callback(done)
        return task

    async def committed(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets of these partitions (None: nothing committed)."""
        if self.group_id is None:
            raise ValueError("committed() needs a consumer created with a group_id")
        if not self._started:
            await self.start()
        return await fetch_committed(
            self._cluster, self.group_id, [(str(t), int(p)) for t, p in partitions]
        )

    def _commit_offsets(
        self, offsets: OffsetsArg | None, metadata: str | None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        if offsets is not None:
            return normalize_offsets(offsets, metadata)
        if self._lost_uncommitted:
            lost, self._lost_uncommitted = self._lost_uncommitted, set()
            raise CommitFailedError(
                f"group {self.group_id!r} fenced this consumer and its partitions were "
                f"reassigned before the records consumed from {len(lost)} of them were "
                "committed; they will be processed again by their new owner",
                ErrorCode.FENCED_MEMBER_EPOCH,
            )
        return {
            tp: OffsetAndMetadata(st.position, metadata or "")
            for tp, st in self._assigned.items()
            if st.position is not None
        }

    async def _commit(
        self, offsets: OffsetsArg | None, metadata: str | None, *, retry: bool
    ) -> None:
        if self.group_id is None:
            raise ValueError("committing offsets needs a consumer created with a group_id")
        if not self._started:
            await self.start()
        norm = (
            offsets
            if isinstance(offsets, dict) and metadata is None and _all_oam(offsets)
            else self._commit_offsets(offsets, metadata)
        )
        if not norm:
            return
        if self._group is not None:
            await self._group.commit(norm, retry=retry)
        else:  # manual assignment: a standalone commit, accepted while the group is empty
            await standalone_commit(self._cluster, self.group_id, norm)
            self._mark_committed({tp: o.offset for tp, o in norm.items()})

    # -- hooks the GroupSession (client/group_session.py) drives ---------------------
    def _group_pause(self, tps: Iterable[TopicPartition]) -> None:
        """Revocation starts: stop fetching and drop what is buffered for ``tps``."""
        for tp in tps:
            st = self._assigned.get(tp)
            if st is not None:
                st.paused = True
                st.epoch += 1
                st.fetch_position = st.position

    def _group_drop(self, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            st = self._assigned.pop(tp, None)
            if st is not None:
                st.forget()
        self._layout_changed()

    def _group_lose(self) -> set[TopicPartition]:
        """Fenced: drop every partition at once; remember which had uncommitted progress
        so the application's next commit() tells it."""
        lost = set(self._assigned)
        self._lost_uncommitted |= {
            tp
            for tp, st in self._assigned.items()
            if st.position is not None and st.position != st.committed
        }
        for st in self._assigned.values():
            st.forget()
        self._assigned = {}
        self._layout_changed()
        return lost

    def _group_add(
        self,
        positions: Mapping[TopicPartition, int | None],
        committed: Mapping[TopicPartition, int],
    ) -> None:
        for tp, pos in positions.items():
            self._add_partition(tp, pos, committed.get(tp))
        self._layout_changed()

    def _uncommitted(
        self, tps: Iterable[TopicPartition] | None, *, processed: bool
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """Positions (or processed positions) that differ from the last commit."""
        out = {}
        for tp in self._assigned if tps is None else tps:
            st = self._assigned.get(tp)
            if st is None:
                continue
            pos = st.processed if processed else st.position
            if pos is not None and pos != st.committed:
                out[tp] = OffsetAndMetadata(pos)
        return out

    def _mark_committed(self, offsets: Mapping[TopicPartition, int]) -> None:
        for tp, off in offsets.items():
            st = self._assigned.get(tp)
            if st is not None:
                st.committed = off


def _all_oam(offsets: dict) -> bool:
    return all(isinstance(v, OffsetAndMetadata) for v in offsets.values())


async def _raise(error: BaseException) -> None:
    raise error
