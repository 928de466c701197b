"""AsyncConsumer: pull records from assigned partitions, fetching ahead with bounded memory.

The public API and the positions behind it live here. Fetch tasks (client/fetch_loop.py)
fill a small buffer that ``poll()`` drains. Every batch is checksummed before it is
decoded, so a corrupt batch raises CorruptRecordError and is never returned. Seeking
bumps a per-partition epoch so data fetched for the old position is dropped without
waiting for it.

With ``group_id`` and ``topics`` (or ``pattern``) the consumer is a member of a consumer
group: a GroupSession (client/group_session.py) heartbeats to the coordinator and adds
and removes partitions here one by one, so the partitions that stay keep fetching
through every rebalance. Positions are committed with ``commit()`` /
``commit_async()`` or automatically (``enable_auto_commit``): auto-commit and
revocation commit what the application has finished with, i.e. the positions as of
its latest ``poll()`` call, which makes processing at-least-once.

``isolation_level="read_committed"`` reads only committed transactions: fetches stop
at the last stable offset (an open transaction holds the consumer back there) and the
batches of aborted transactions are dropped (client/fetcher.py); "latest" offsets are
the last stable offset too. Transaction markers are never returned at either level.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterable
from typing import Any

from logmq.client.cluster import ClusterClient, TopicPartition
from logmq.client.consumer_positions import EARLIEST, LATEST, RESET_TARGETS, Changes, PartitionState
from logmq.client.fetch_loop import FetchLoopMixin
from logmq.client.fetcher import FetchedBatch
from logmq.client.group_consumer import GroupConsumerMixin
from logmq.client.group_session import Listener
from logmq.client.security import ClientSecurity
from logmq.errors import LogMQError, NoOffsetForPartitionError
from logmq.gcpause import gc_paused
from logmq.records import Record

ISOLATION_LEVELS = {"read_uncommitted": 0, "read_committed": 1}


class AsyncConsumer(GroupConsumerMixin, FetchLoopMixin):
    """Consume assigned partitions, or a consumer group's share of topics, from asyncio.

    ``poll()`` returns Records; ``poll_batches()`` is the batch-wise fast path returning
    FetchedBatch objects whose ``rows`` are the raw decoded records. ``async for record
    in consumer`` iterates forever. Group options are described in docs/clients.md.
    ``isolation_level``: "read_uncommitted" (the default: every record, markers
    excepted) or "read_committed" (committed transactions only).
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        group_id: str | None = None,
        topics: Iterable[str] | None = None,
        pattern: str | re.Pattern[str] | None = None,
        on_assigned: Listener | None = None,
        on_revoked: Listener | None = None,
        on_lost: Listener | None = None,
        group_instance_id: str | None = None,
        session_timeout_ms: int | None = None,
        heartbeat_interval_ms: int = 3000,
        rebalance_timeout_ms: int = 300_000,
        server_assignor: str | None = None,
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5000,
        metadata_max_age_ms: int = 300_000,
        client_id: str = "logmq-consumer",
        auto_offset_reset: str = "latest",
        fetch_min_bytes: int = 1,
        fetch_max_bytes: int = 50 << 20,
        max_partition_fetch_bytes: int = 1 << 20,
        fetch_max_wait_ms: int = 500,
        max_poll_records: int = 500,
        request_timeout_ms: int = 30000,
        retry_backoff_ms: int = 100,
        security: ClientSecurity | None = None,
        isolation_level: str = "read_uncommitted",
    ) -> None:
        if auto_offset_reset not in RESET_TARGETS:
            raise ValueError("auto_offset_reset must be 'earliest', 'latest' or 'none'")
        if isolation_level not in ISOLATION_LEVELS:
            raise ValueError("isolation_level must be 'read_uncommitted' or 'read_committed'")
        self.isolation_level = ISOLATION_LEVELS[isolation_level]
        self._read_committed = self.isolation_level == 1
        self.auto_offset_reset = auto_offset_reset
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_bytes = fetch_max_bytes
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.max_poll_records = max_poll_records
        self.retry_backoff = retry_backoff_ms / 1000
        self.request_timeout = request_timeout_ms / 1000
        self._cluster = ClusterClient(
            bootstrap,
            client_id=client_id,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            security=security,
            metadata_max_age_ms=metadata_max_age_ms,
        )
        self._assigned: dict[TopicPartition, PartitionState] = {}
        self._init_fetching()
        self._init_group(
            group_id,
            topics=topics,
            pattern=pattern,
            instance_id=group_instance_id,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            server_assignor=server_assignor,
            heartbeat_interval_ms=heartbeat_interval_ms,
            retry_backoff_ms=retry_backoff_ms,
            on_assigned=on_assigned,
            on_revoked=on_revoked,
            on_lost=on_lost,
            enable_auto_commit=enable_auto_commit,
            auto_commit_interval_ms=auto_commit_interval_ms,
            metadata_max_age_ms=metadata_max_age_ms,
        )
        self._changes = Changes()
        self._changed: asyncio.Event | None = None
        self._data_ready: asyncio.Event | None = None
        self._slot_free: asyncio.Event | None = None
        self._started = False
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------
    async def start(self) -> AsyncConsumer:
        if not self._started:
            self._changed = asyncio.Event()
            self._data_ready = asyncio.Event()
            self._slot_free = asyncio.Event()
            try:
                await self._cluster.refresh_metadata()
            except BaseException:
                await self._cluster.close()
                raise
            self._started = True
            self._layout_changed()
            if self._group is not None:
                await self._group.start()
        return self

    async def __aenter__(self) -> AsyncConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop; a group member first commits (with auto-commit), gives up its
        partitions (on_revoked) and leaves the group."""
        if self._closed:
            return
        if self._commits:
            await asyncio.wait(self._commits, timeout=self.request_timeout)
        if self._group is not None and self._started:
            await self._group.close(self.request_timeout)
        self._closed = True
        await self._stop_fetching()
        await self._cluster.close()

    # -- assignment and positions -------------------------------------------------
    @gc_paused()  # a state per partition, thousands at once: logmq/gcpause.py
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these (topic, partition) pairs from now on."""
        if self._group is not None:
            raise ValueError("assign() cannot be used on a consumer subscribed to a group")
        wanted = [(str(t), int(p)) for t, p in partitions]
        old = self._assigned
        self._assigned = {
            tp: old.get(tp) or PartitionState(tp=tp, changes=self._changes) for tp in wanted
        }
        for tp, st in old.items():
            if tp not in self._assigned:
                st.forget()
        for st in self._assigned.values():
            st.epoch += 1  # drop data fetched under the previous assignment
            st.fetch_position = st.position
        self._layout_changed()

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    # -- pausing ---------------------------------------------------------------------
    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching these partitions (poll() returns none of their records) until
        ``resume``; a group member keeps them and keeps heartbeating."""
        for tp in partitions:
            st = self._state(*tp)
            st.paused = True
            self._refetch(tp, st)

    def resume(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self._state(*tp).paused = False
        self._signal_change()

    def paused(self) -> set[TopicPartition]:
        return {tp for tp, st in self._assigned.items() if st.paused}

    def _wake_poll(self) -> None:
        if self._data_ready is not None:
            self._data_ready.set()

    async def _reset_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Starting positions by ``auto_offset_reset`` (empty if 'none' or on failure:
        the fetch loop resolves, or reports, those later)."""
        where = RESET_TARGETS[self.auto_offset_reset]
        if where is None:
            return {}
        try:
            found = await self._cluster.list_offsets(
                dict.fromkeys(tps, where), isolation_level=self.isolation_level
            )
        except LogMQError:
            return {}
        return {tp: off for tp, (off, _) in found.items()}

    def _add_partition(
        self, tp: TopicPartition, position: int | None, committed: int | None
    ) -> None:
        st = PartitionState(position, position, committed, tp=tp, changes=self._changes)
        st.processed = position
        self._assigned[tp] = st

    def _state(self, topic: str, partition: int) -> PartitionState:
        st = self._assigned.get((topic, partition))
        if st is None:
            raise LogMQError(f"{topic}-{partition} is not assigned")
        return st

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Make ``offset`` the next record poll() returns for this partition."""
        if offset < 0:
            raise ValueError("offset must be >= 0")
        st = self._state(topic, partition)
        st.position = st.fetch_position = offset
        st.epoch += 1
        st.error = None
        self._signal_change()

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        await self._seek_to(partitions, EARLIEST)

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        await self._seek_to(partitions, LATEST)

    async def _seek_to(self, partitions: tuple[TopicPartition, ...], where: int) -> None:
        tps = list(partitions) or list(self._assigned)
        for tp in tps:
            self._state(*tp)
        offsets = await self._cluster.list_offsets(
            dict.fromkeys(tps, where), isolation_level=self.isolation_level
        )
        for tp, (offset, _) in offsets.items():
            self.seek(tp[0], tp[1], offset)

    async def position(self, topic: str, partition: int) -> int:
        """The offset of the next record poll() will return (resolving a reset first)."""
        st = self._state(topic, partition)
        if st.position is None:
            await self._reset_positions()
            if st.error is not None:
                raise st.error
        assert st.position is not None
        return st.position

    def highwater(self, topic: str, partition: int) -> int:
        """The high watermark seen in the last fetch (-1 before any)."""
        return self._state(topic, partition).high_watermark

    async def offsets_for_times(
        self, timestamps: dict[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int, int] | None]:
        """For each partition, ``(offset, timestamp)`` of the first record at or after the
        time, or None when no record is that recent.

        The broker's time index may answer with the start of the batch that holds the
        time; the exact record is then found by reading that one batch.
        """
        res = await self._cluster.list_offsets(dict(timestamps))
        out: dict[TopicPartition, tuple[int, int] | None] = {}
        for tp, target in timestamps.items():
            offset, ts = res[tp]
            if offset < 0:
                out[tp] = None
            elif target >= 0 and ts != target:
                exact = await self._cluster.exact_time_offset(
                    tp, offset, target, self.max_partition_fetch_bytes
                )
                out[tp] = exact or (offset, ts)
            else:
                out[tp] = (offset, ts)
        return out

    async def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict:
        res = await self._cluster.list_offsets(dict.fromkeys(partitions, EARLIEST))
        return {tp: v[0] for tp, v in res.items()}

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict:
        res = await self._cluster.list_offsets(
            dict.fromkeys(partitions, LATEST), isolation_level=self.isolation_level
        )
        return {tp: v[0] for tp, v in res.items()}

    async def _reset_positions(self) -> None:
        assigned = self._assigned
        unpositioned = self._changes.unpositioned
        todo = []
        for tp in list(unpositioned):
            st = assigned.get(tp)
            if st is None or st.position is not None:
                unpositioned.discard(tp)
            elif not st.error:
                todo.append(tp)
        if not todo:
            return
        where = RESET_TARGETS[self.auto_offset_reset]
        if where is None:
            for tp in todo:
                self._assigned[tp].error = NoOffsetForPartitionError(
                    f"no position (no committed offset) for {tp[0]}-{tp[1]} and "
                    "auto_offset_reset is 'none': seek() to choose one"
                )
            self._wake_poll()
            return
        offsets = await self._cluster.list_offsets(
            dict.fromkeys(todo, where), isolation_level=self.isolation_level
        )
        for tp, (offset, _) in offsets.items():
            st = self._assigned.get(tp)
            if st is not None and st.position is None:
                st.position = st.fetch_position = offset
                st.epoch += 1

    # -- polling ------------------------------------------------------------------
    async def poll(self, timeout: float = 1.0, max_records: int | None = None) -> list[Record]:
        """Records from any assigned partition, waiting up to ``timeout`` s for some."""
        return await self._poll(timeout, max_records, batches=False)

    async def poll_batches(
        self, timeout: float = 1.0, max_records: int | None = None
    ) -> list[FetchedBatch]:
        """Like poll() but returns decoded batches: the fast path for bulk consumers."""
        return await self._poll(timeout, max_records, batches=True)

    async def _poll(self, timeout: float, max_records: int | None, batches: bool) -> list:
        if not self._started:
            await self.start()
        assert self._data_ready is not None
        limit = max_records or self.max_poll_records
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        # Everything returned before this call is processed: auto-commit may take it.
        moved = self._changes.moved
        if moved:
            assigned = self._assigned
            for tp in moved:
                st = assigned.get(tp)
                if st is not None:
                    st.processed = st.position
            moved.clear()
        while True:
            self._data_ready.clear()
            if self._group is not None and self._group.error is not None:
                err, self._group.error = self._group.error, None
                raise err
            out = self._drain(limit, batches)
            if out:
                return out
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            try:
                async with asyncio.timeout(remaining):
                    await self._data_ready.wait()
            except TimeoutError:
                return []

    def _drain(self, limit: int, batches: bool) -> list:
        """Hand out buffered data up to ``limit`` records; raise a partition's error.

        The cyclic GC pauses once for the whole drain, not once per partition: with
        thousands of partitions in one poll the pause and resume alone cost 20 µs each.
        """
        with gc_paused():
            return self._drain_paused(limit, batches)

    def _drain_paused(self, limit: int, batches: bool) -> list:
        errors = self._changes.errors
        if errors:
            for tp in list(errors):
                st = self._assigned.get(tp)
                if st is None:
                    errors.discard(tp)
                elif st.error is not None:
                    err, st.error = st.error, None
                    raise err
        out: list[Any] = []
        count = 0
        while self._buffer and count < limit:
            completed = self._buffer[0]
            while completed.parts and count < limit:
                epoch, pd = completed.parts[0]
                st = self._assigned.get(pd.tp)
                if st is None or st.epoch != epoch or st.position != pd.position:
                    completed.parts.popleft()  # stale: seeked, reassigned or superseded
                    continue
                try:
                    if batches:
                        got = pd.take_batches(limit - count)
                        count += sum(len(b) for b in got)
                    else:
                        got = pd.take_paused(limit - count)  # the drain paused the GC
                        count += len(got)
                except LogMQError as e:
                    completed.parts.popleft()
                    self._refetch(pd.tp, st)
                    if out:
                        st.error = e  # hand out what we have; raise on the next poll
                        return out
                    raise
                out.extend(got)
                st.position = pd.position
                if pd.exhausted:
                    completed.parts.popleft()
            if not completed.parts:
                self._buffer.popleft()
                self._buffered_per_node[completed.node] -= 1
                assert self._slot_free is not None
                self._slot_free.set()
        return out

    def _refetch(self, tp: TopicPartition, st: PartitionState) -> None:
        st.fetch_position = st.position
        st.epoch += 1
        self._signal_change()

    def __aiter__(self) -> AsyncIterator[Record]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Record]:
        while not self._closed:
            for record in await self.poll(timeout=1.0):
                yield record
