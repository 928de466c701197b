"""AsyncConsumer: pull records from assigned partitions, fetching ahead with bounded memory.

One fetch task per leader broker keeps at most one Fetch in flight and at most one
response buffered: while ``poll()`` works through the buffered response the next one is
already on its way, starting where the buffered data ends. Every batch is checksummed
before it is decoded, so a corrupt batch raises CorruptRecordError and is never
returned. Seeking bumps a per-partition epoch so data fetched for the old position is
dropped without waiting for it.

With ``group_id`` and ``topics`` (or ``pattern``) the consumer is a member of a consumer
group: a GroupSession (client/group_session.py) heartbeats to the coordinator and adds
and removes partitions here one by one, so the partitions that stay keep fetching
through every rebalance. Positions are committed with ``commit()`` /
``commit_async()`` or automatically (``enable_auto_commit``): auto-commit and
revocation commit what the application has finished with, i.e. the positions as of
its latest ``poll()`` call, which makes processing at-least-once.
"""

from __future__ import annotations

import asyncio
import collections
import re
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from logmq.client.cluster import ClusterClient, TopicPartition
from logmq.client.fetcher import (
    FetchedBatch,
    PartitionData,
    fetch_body,
    parse_fetch_response,
)
from logmq.client.group_consumer import GroupConsumerMixin
from logmq.client.group_session import Listener
from logmq.errors import (
    ConnectionError_,
    ErrorCode,
    LogMQError,
    MessageTooLargeError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    error_for,
)
from logmq.net.codec import ApiKey
from logmq.records import Record

CAUGHT_UP_BYTES = 64 << 10  # a fetch response this small means the consumer is caught up
EARLIEST = -2
LATEST = -1
_RESET = {"earliest": EARLIEST, "latest": LATEST, "none": None}
_REFRESH_CODES = {
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
}


@dataclass(slots=True)
class _PartitionState:
    position: int | None = None  # next offset poll() hands out; None until reset
    fetch_position: int | None = None  # where the next fetch starts (ahead of position)
    epoch: int = 0  # bumped by every seek: older fetched data is stale
    high_watermark: int = -1
    log_start_offset: int = -1
    error: LogMQError | None = None  # raised by the next poll()
    paused: bool = False  # by pause(), or while a group revokes it: not fetched
    processed: int | None = None  # position at the latest poll() call: done with
    committed: int | None = None  # last offset known committed for the group


@dataclass(slots=True)
class _CompletedFetch:
    node: int
    parts: collections.deque[tuple[int, PartitionData]] = field(default_factory=collections.deque)


class AsyncConsumer(GroupConsumerMixin):
    """Consume assigned partitions, or a consumer group's share of topics, from asyncio.

    ``poll()`` returns Records; ``poll_batches()`` is the batch-wise fast path returning
    FetchedBatch objects whose ``rows`` are the raw decoded records. ``async for record
    in consumer`` iterates forever. Group options are described in docs/clients.md.
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
    ) -> None:
        if auto_offset_reset not in _RESET:
            raise ValueError("auto_offset_reset must be 'earliest', 'latest' or 'none'")
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
            metadata_max_age_ms=metadata_max_age_ms,
        )
        self._assigned: dict[TopicPartition, _PartitionState] = {}
        self._buffer: collections.deque[_CompletedFetch] = collections.deque()
        self._buffered_per_node: collections.Counter[int] = collections.Counter()
        self._fetchers: dict[int, asyncio.Task[None]] = {}
        self._rotation = 0
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
            self._spawn_fetchers()
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
        tasks = list(self._fetchers.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._fetchers.clear()
        await self._cluster.close()

    # -- assignment and positions -------------------------------------------------
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these (topic, partition) pairs from now on."""
        if self._group is not None:
            raise ValueError("assign() cannot be used on a consumer subscribed to a group")
        wanted = [(str(t), int(p)) for t, p in partitions]
        old = self._assigned
        self._assigned = {tp: old.get(tp) or _PartitionState() for tp in wanted}
        for st in self._assigned.values():
            st.epoch += 1  # drop data fetched under the previous assignment
            st.fetch_position = st.position
        self._signal_change()

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
        where = _RESET[self.auto_offset_reset]
        if where is None:
            return {}
        try:
            found = await self._cluster.list_offsets(dict.fromkeys(tps, where))
        except LogMQError:
            return {}
        return {tp: off for tp, (off, _) in found.items()}

    def _add_partition(
        self, tp: TopicPartition, position: int | None, committed: int | None
    ) -> None:
        st = _PartitionState(position=position, fetch_position=position, committed=committed)
        st.processed = position
        self._assigned[tp] = st

    def _state(self, topic: str, partition: int) -> _PartitionState:
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
        offsets = await self._cluster.list_offsets(dict.fromkeys(tps, where))
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
        res = await self._cluster.list_offsets(dict.fromkeys(partitions, LATEST))
        return {tp: v[0] for tp, v in res.items()}

    async def _reset_positions(self) -> None:
        todo = [tp for tp, st in self._assigned.items() if st.position is None and not st.error]
        if not todo:
            return
        where = _RESET[self.auto_offset_reset]
        if where is None:
            for tp in todo:
                self._assigned[tp].error = NoOffsetForPartitionError(
                    f"no position (no committed offset) for {tp[0]}-{tp[1]} and "
                    "auto_offset_reset is 'none': seek() to choose one"
                )
            self._wake_poll()
            return
        offsets = await self._cluster.list_offsets(dict.fromkeys(todo, where))
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
        for st in self._assigned.values():
            st.processed = st.position
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
        """Hand out buffered data up to ``limit`` records; raise a partition's error."""
        for st in self._assigned.values():
            if st.error is not None:
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
                        got = pd.take(limit - count)
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

    def _refetch(self, tp: TopicPartition, st: _PartitionState) -> None:
        st.fetch_position = st.position
        st.epoch += 1
        self._signal_change()

    def __aiter__(self) -> AsyncIterator[Record]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Record]:
        while not self._closed:
            for record in await self.poll(timeout=1.0):
                yield record

    # -- fetching -----------------------------------------------------------------
    def _signal_change(self) -> None:
        if self._changed is not None:
            self._changed.set()
        self._spawn_fetchers()

    def _spawn_fetchers(self) -> None:
        if not self._started or self._closed:
            return
        nodes = {self._cluster.metadata.leader_for(*tp) for tp in self._assigned}
        if -1 in nodes or not self._fetchers:
            nodes.add(-1)  # the task for partitions without a known leader refreshes them
        for node in nodes:
            if node not in self._fetchers or self._fetchers[node].done():
                self._fetchers[node] = asyncio.create_task(
                    self._fetch_loop(node), name=f"logmq-fetch-{node}"
                )

    async def _fetch_loop(self, node: int) -> None:
        """Keep one fetch in flight to ``node`` and at most one response buffered."""
        assert self._changed is not None and self._slot_free is not None
        while True:
            try:
                if any(st.position is None for st in self._assigned.values()):
                    await self._reset_positions()
                if node < 0:
                    await self._refresh_leaderless()
                    continue
                request = self._build_fetch(node)
                if request is None:
                    self._changed.clear()
                    await self._changed.wait()
                    continue
                body, offsets = request
                conn = await self._cluster.connection(node)
                timeout = self.request_timeout + self.fetch_max_wait_ms / 1000
                resp = await conn.request(ApiKey.FETCH, body, timeout=timeout)
                completed, moved = self._handle_fetch(node, resp.body, resp.tail, offsets)
                if any(st.error is not None for st in self._assigned.values()):
                    self._data_ready.set()  # type: ignore[union-attr]  # poll() raises it
                while self._buffered_per_node[node] >= 1:
                    self._slot_free.clear()
                    await self._slot_free.wait()
                if completed.parts:
                    self._buffer.append(completed)
                    self._buffered_per_node[node] += 1
                    assert self._data_ready is not None
                    self._data_ready.set()
                    if len(resp.tail) < CAUGHT_UP_BYTES:
                        # Caught up with the log: let a waiting poll() return these
                        # records before this task spends time sending the next fetch.
                        # (Behind, the next fetch goes first, so the network overlaps
                        # with decoding.)
                        await asyncio.sleep(0)
                if moved:
                    await asyncio.sleep(self.retry_backoff)
                    await self._safe_refresh()
            except asyncio.CancelledError:
                raise
            except LogMQError as e:
                if not e.retriable and not isinstance(e, ConnectionError_):
                    self._fail_node(node, e)
                await asyncio.sleep(self.retry_backoff)
                await self._safe_refresh()

    async def _refresh_leaderless(self) -> None:
        assert self._changed is not None
        leaderless = [tp for tp in self._assigned if self._cluster.metadata.leader_for(*tp) < 0]
        if not leaderless:
            self._changed.clear()
            await self._changed.wait()
            return
        await self._safe_refresh({t for t, _ in leaderless})
        self._spawn_fetchers()
        if any(self._cluster.metadata.leader_for(*tp) < 0 for tp in leaderless):
            await asyncio.sleep(self.retry_backoff)

    async def _safe_refresh(self, topics: Iterable[str] | None = None) -> None:
        try:
            await self._cluster.refresh_metadata(
                list(topics) if topics is not None else [t for t, _ in self._assigned]
            )
        except LogMQError:
            pass
        # wake idle fetch tasks too: a partition may now lead on a broker whose task
        # had nothing to fetch and waits for a change
        self._signal_change()

    def _fail_node(self, node: int, err: LogMQError) -> None:
        for tp, st in self._assigned.items():
            if self._cluster.metadata.leader_for(*tp) == node:
                st.error = err
        if self._data_ready is not None:
            self._data_ready.set()

    def _build_fetch(self, node: int) -> tuple[dict[str, Any], dict[TopicPartition, int]] | None:
        topics: dict[str, list[dict[str, int]]] = {}
        offsets: dict[TopicPartition, int] = {}
        budget = self.fetch_max_bytes
        items = list(self._assigned.items())
        if len(items) > 1:  # rotate, so a fetch_max_bytes budget never starves the last ones
            self._rotation = (self._rotation + 1) % len(items)
            items = items[self._rotation :] + items[: self._rotation]
        for tp, st in items:
            if st.fetch_position is None or st.error is not None or st.paused:
                continue
            if self._cluster.metadata.leader_for(*tp) != node or budget <= 0:
                continue
            info = self._cluster.metadata.partition(*tp)
            topics.setdefault(tp[0], []).append(
                {
                    "partition": tp[1],
                    "fetch_offset": st.fetch_position,
                    "partition_max_bytes": self.max_partition_fetch_bytes,
                    "current_leader_epoch": info.leader_epoch if info else -1,
                }
            )
            offsets[tp] = st.fetch_position
            budget -= self.max_partition_fetch_bytes
        if not offsets:
            return None
        body = fetch_body(
            topics, self.fetch_max_wait_ms, self.fetch_min_bytes, self.fetch_max_bytes
        )
        return body, offsets

    def _handle_fetch(
        self,
        node: int,
        body: dict[str, Any],
        tail: memoryview,
        offsets: dict[TopicPartition, int],
    ) -> tuple[_CompletedFetch, bool]:
        """Buffer-ready data of one response, and whether some partition's leader moved."""
        epochs = {tp: self._assigned[tp].epoch for tp in offsets if tp in self._assigned}
        completed = _CompletedFetch(node)
        refresh = False
        for pd in parse_fetch_response(body, tail, offsets):
            st = self._assigned.get(pd.tp)
            if st is None or st.epoch != epochs.get(pd.tp) or st.fetch_position != pd.fetch_offset:
                continue  # seeked or unassigned while the fetch was in flight
            if st.paused:
                continue
            if pd.error != ErrorCode.NONE:
                if pd.error == ErrorCode.OFFSET_OUT_OF_RANGE:
                    self._out_of_range(pd.tp, st)
                elif pd.error in _REFRESH_CODES or pd.error.retriable:
                    refresh = True
                else:
                    st.error = error_for(pd.error, f"fetch {pd.topic}-{pd.partition}")
                continue
            st.high_watermark = pd.high_watermark
            st.log_start_offset = pd.log_start_offset
            nxt = pd.next_fetch_offset()
            if nxt == pd.fetch_offset and len(pd.data) and pd.exhausted:
                # only part of one batch came back: it can never fit, so stop, loudly
                st.error = MessageTooLargeError(
                    f"batch at {pd.topic}-{pd.partition}@{nxt} exceeds "
                    f"max_partition_fetch_bytes={self.max_partition_fetch_bytes}"
                )
                continue
            st.fetch_position = nxt
            if nxt > pd.fetch_offset or not pd.exhausted:
                completed.parts.append((st.epoch, pd))
        return completed, refresh

    def _out_of_range(self, tp: TopicPartition, st: _PartitionState) -> None:
        if _RESET[self.auto_offset_reset] is None:
            st.error = OffsetOutOfRangeError(
                f"offset {st.fetch_position} is out of range for {tp[0]}-{tp[1]}"
            )
        else:
            st.position = st.fetch_position = None
            st.epoch += 1
