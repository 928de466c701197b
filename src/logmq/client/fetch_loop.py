"""The fetch-ahead half of AsyncConsumer: one fetch task per leader broker.

Each task keeps at most one Fetch in flight and at most one response buffered: while
``poll()`` works through the buffered response the next one is already on its way,
starting where the buffered data ends, so memory stays bounded without stalling the
network. Responses are only split per partition here; decoding is left to ``poll()``.

A mixin so that client/consumer.py keeps to the public API and positions; it shares
the consumer's per-partition state (``_assigned``) and the buffer ``poll()`` drains.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from logmq.client.cluster import TopicPartition
from logmq.client.consumer_positions import RESET_TARGETS, PartitionState
from logmq.client.fetcher import PartitionData, parse_fetch_response
from logmq.errors import (
    ConnectionError_,
    ErrorCode,
    LogMQError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    error_for,
)
from logmq.net.codec import ApiKey
from logmq.net.fetch_message import fetch_request

if TYPE_CHECKING:
    from logmq.client.cluster import ClusterClient

CAUGHT_UP_BYTES = 64 << 10  # a fetch response this small means the consumer is caught up
_REFRESH_CODES = {
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
}


@dataclass(slots=True)
class CompletedFetch:
    """One buffered response: ``(epoch at fetch time, data)`` per partition, in order."""

    node: int
    parts: collections.deque[tuple[int, PartitionData]] = field(default_factory=collections.deque)


class FetchLoopMixin:
    """Mixed into AsyncConsumer; see its docstring for what the options mean."""

    # provided by AsyncConsumer
    auto_offset_reset: str
    fetch_min_bytes: int
    fetch_max_bytes: int
    max_partition_fetch_bytes: int
    fetch_max_wait_ms: int
    retry_backoff: float
    request_timeout: float
    _cluster: ClusterClient
    _assigned: dict[TopicPartition, PartitionState]
    _changed: asyncio.Event | None
    _data_ready: asyncio.Event | None
    _slot_free: asyncio.Event | None
    _started: bool
    _closed: bool

    if TYPE_CHECKING:

        async def _reset_positions(self) -> None: ...

    def _init_fetching(self) -> None:
        self._buffer: collections.deque[CompletedFetch] = collections.deque()
        self._buffered_per_node: collections.Counter[int] = collections.Counter()
        self._fetchers: dict[int, asyncio.Task[None]] = {}
        self._rotation = 0

    async def _stop_fetching(self) -> None:
        tasks = list(self._fetchers.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._fetchers.clear()

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
        body = fetch_request(
            topics,
            max_wait_ms=self.fetch_max_wait_ms,
            min_bytes=self.fetch_min_bytes,
            max_bytes=self.fetch_max_bytes,
        )
        return body, offsets

    def _handle_fetch(
        self,
        node: int,
        body: dict[str, Any],
        tail: memoryview,
        offsets: dict[TopicPartition, int],
    ) -> tuple[CompletedFetch, bool]:
        """Buffer-ready data of one response, and whether some partition's leader moved."""
        epochs = {tp: self._assigned[tp].epoch for tp in offsets if tp in self._assigned}
        completed = CompletedFetch(node)
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

    def _out_of_range(self, tp: TopicPartition, st: PartitionState) -> None:
        if RESET_TARGETS[self.auto_offset_reset] is None:
            st.error = OffsetOutOfRangeError(
                f"offset {st.fetch_position} is out of range for {tp[0]}-{tp[1]}"
            )
        else:
            st.position = st.fetch_position = None
            st.epoch += 1
