"""The fetch-ahead half of AsyncConsumer: one fetch task per leader broker.

Each task keeps at most one Fetch in flight and at most one response buffered: while
``poll()`` works through the buffered response the next one is already on its way,
starting where the buffered data ends, so memory stays bounded without stalling the
network. Responses are only split per partition here; decoding is left to ``poll()``.

Each task keeps a fetch session with its broker (KIP-227, broker/replica/fetch_sessions.py):
the first fetch names every partition that broker leads, later ones only those whose
fetch position changed (``Changes.fetch``) and those to forget, and the answers carry
only partitions with something new. So the work per fetch follows the data, not the
assignment: at 10,000 partitions a fetch that returns three partitions costs three.
A broker without sessions (or with its cache full) gets full fetches every time.

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
from logmq.client.consumer_positions import RESET_TARGETS, Changes, PartitionState
from logmq.client.fetcher import PartitionData
from logmq.errors import (
    ConnectionError_,
    ErrorCode,
    LogMQError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    error_for,
)
from logmq.gcpause import gc_paused
from logmq.net.codec import ApiKey
from logmq.net.fetch_message import fetch_request, fetched_partitions

if TYPE_CHECKING:
    from logmq.client.cluster import ClusterClient, ClusterMetadata

CAUGHT_UP_BYTES = 64 << 10  # a fetch response this small means the consumer is caught up
_REFRESH_CODES = {
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
}


MAX_SESSION_EPOCH = 0x7FFFFFFF
_SESSION_ERRORS = {ErrorCode.FETCH_SESSION_ID_NOT_FOUND, ErrorCode.INVALID_FETCH_SESSION_EPOCH}


@dataclass(slots=True)
class CompletedFetch:
    """One buffered response: ``(epoch at fetch time, data)`` per partition, in order."""

    node: int
    parts: collections.deque[tuple[int, PartitionData]] = field(default_factory=collections.deque)


@dataclass(slots=True)
class NodeSession:
    """The fetch session with one broker, as this client sees it.

    ``epoch`` 0 means the next fetch is full (and opens a session); ``sent`` is what
    the broker's session holds per partition: (fetch offset, leader epoch, the
    partition state's epoch when sent).
    """

    id: int = 0
    epoch: int = 0
    sent: dict[TopicPartition, tuple[int, int, int]] = field(default_factory=dict)
    generation: int = 0  # bumped by reset: an answer to an older request is dropped

    def reset(self) -> None:
        self.id = 0
        self.epoch = 0
        self.sent = {}
        self.generation += 1


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
    _changes: Changes
    _changed: asyncio.Event | None
    _data_ready: asyncio.Event | None
    _slot_free: asyncio.Event | None
    _started: bool
    _closed: bool
    _read_committed: bool

    if TYPE_CHECKING:

        async def _reset_positions(self) -> None: ...

    def _init_fetching(self) -> None:
        self._buffer: collections.deque[CompletedFetch] = collections.deque()
        self._buffered_per_node: collections.Counter[int] = collections.Counter()
        self._fetchers: dict[int, asyncio.Task[None]] = {}
        self._sessions: dict[int, NodeSession] = {}
        self._leaders: dict[TopicPartition, int] = {}  # as of the last layout change
        self._node_parts: dict[int, set[TopicPartition]] = {}
        self._pending: dict[int, set[TopicPartition]] = {}  # changed, by node
        self._rotation = 0

    async def _stop_fetching(self) -> None:
        tasks = list(self._fetchers.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._fetchers.clear()

    def _signal_change(self) -> None:
        """A position, pause or error changed: wake the fetch tasks (they read
        ``Changes.fetch`` to see which)."""
        if self._changed is not None:
            self._changed.set()

    def _layout_changed(self) -> None:
        """The assignment or the leaders changed: map partitions to brokers again.

        The one walk over the whole assignment, run on assignment changes and metadata
        refreshes only. A broker whose set of partitions changed gets a full fetch.
        """
        metadata = self._cluster.metadata
        leaders = {tp: metadata.leader_for(*tp) for tp in self._assigned}
        node_parts: dict[int, set[TopicPartition]] = {}
        for tp, node in leaders.items():
            node_parts.setdefault(node, set()).add(tp)
        for node, session in self._sessions.items():
            if node_parts.get(node) != self._node_parts.get(node):
                session.reset()
        self._leaders = leaders
        self._node_parts = node_parts
        for tps in self._pending.values():  # routed by the old leaders: route them again
            self._changes.fetch.update(tps)
        self._pending.clear()
        self._signal_change()
        self._spawn_fetchers()

    def _spawn_fetchers(self) -> None:
        if not self._started or self._closed:
            return
        nodes = set(self._node_parts)
        if not self._fetchers:
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
                if self._changes.unpositioned:
                    await self._reset_positions()
                if node < 0:
                    await self._refresh_leaderless()
                    continue
                request = self._build_fetch(node)
                if request is None:
                    self._changed.clear()
                    await self._changed.wait()
                    continue
                body, session = request
                opened = session.epoch == 0
                generation = session.generation
                conn = await self._cluster.connection(node)
                timeout = self.request_timeout + self.fetch_max_wait_ms / 1000
                resp = await conn.request(ApiKey.FETCH, body, timeout=timeout)
                if session.generation != generation:
                    continue  # the partitions moved meanwhile: a full fetch follows
                if resp.body.get("error", 0) in _SESSION_ERRORS:
                    session.reset()  # the broker lost it (evicted, restarted): start over
                    continue
                if opened:
                    session.id = resp.body.get("session_id", 0) or 0
                    session.epoch = 1 if session.id else 0  # no session: full every time
                else:
                    session.epoch = 1 if session.epoch >= MAX_SESSION_EPOCH else session.epoch + 1
                completed, moved = self._handle_fetch(node, resp.body, resp.tail, session)
                if self._changes.errors:
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
                self._sessions.get(node, NodeSession()).reset()  # its answer never came
                if not e.retriable and not isinstance(e, ConnectionError_):
                    self._fail_node(node, e)
                await asyncio.sleep(self.retry_backoff)
                await self._safe_refresh()

    async def _refresh_leaderless(self) -> None:
        assert self._changed is not None
        leaderless = self._node_parts.get(-1)
        if not leaderless:
            self._changed.clear()
            await self._changed.wait()
            return
        await self._safe_refresh({t for t, _ in leaderless})
        if self._node_parts.get(-1):
            await asyncio.sleep(self.retry_backoff)

    async def _safe_refresh(self, topics: Iterable[str] | None = None) -> None:
        try:
            await self._cluster.refresh_metadata(
                list(topics) if topics is not None else list({t for t, _ in self._assigned})
            )
        except LogMQError:
            pass
        # wake idle fetch tasks too: a partition may now lead on a broker whose task
        # had nothing to fetch and waits for a change
        self._layout_changed()

    def _fail_node(self, node: int, err: LogMQError) -> None:
        for tp in self._node_parts.get(node, ()):
            st = self._assigned.get(tp)
            if st is not None:
                st.error = err
        if self._data_ready is not None:
            self._data_ready.set()

    def _fetchable(self, st: PartitionState | None) -> bool:
        return (
            st is not None and st.fetch_position is not None and st.error is None and not st.paused
        )

    def _entry(
        self, tp: TopicPartition, st: PartitionState, metadata: ClusterMetadata
    ) -> tuple[dict[str, int], tuple]:
        info = metadata.partition(tp[0], tp[1])
        leader_epoch = info.leader_epoch if info is not None else -1
        position = st.fetch_position
        entry = {
            "partition": tp[1],
            "fetch_offset": position,
            "partition_max_bytes": self.max_partition_fetch_bytes,
            "current_leader_epoch": leader_epoch,
        }
        return entry, (position, leader_epoch, st.epoch)

    @gc_paused()
    def _build_fetch(self, node: int) -> tuple[dict[str, Any], NodeSession] | None:
        """The next fetch to ``node``: full when opening a session, else what changed.

        With the cyclic GC paused: a full fetch, or the one after an answer that moved
        every partition, builds an entry per partition (see logmq/gcpause.py).
        """
        session = self._sessions.get(node)
        if session is None:
            session = self._sessions[node] = NodeSession()
        changed = self._changes.fetch
        if changed:  # route the changes to the broker that leads each partition
            leaders = self._leaders
            pending = self._pending
            for tp in changed:
                n = leaders.get(tp)
                if n is not None:
                    s = pending.get(n)
                    if s is None:
                        pending[n] = {tp}
                    else:
                        s.add(tp)
            changed.clear()
        assigned = self._assigned
        topics: dict[str, list[dict[str, int]]] = {}
        forgotten: dict[str, list[int]] = {}
        if session.epoch == 0:
            self._pending.pop(node, None)
            tps = list(self._node_parts.get(node, ()))
            if len(tps) > 1:  # rotate, so a max_bytes budget never starves the last ones
                self._rotation = (self._rotation + 1) % len(tps)
                tps = tps[self._rotation :] + tps[: self._rotation]
            sent = {}
            entry_for = self._entry
            metadata = self._cluster.metadata
            for tp in tps:  # _fetchable inline: one pass over thousands
                st = assigned.get(tp)
                if st is None or st.fetch_position is None or st.error is not None or st.paused:
                    continue
                entry, sent[tp] = entry_for(tp, st, metadata)
                lst = topics.get(tp[0])
                if lst is None:
                    topics[tp[0]] = [entry]
                else:
                    lst.append(entry)
            session.sent = sent
            if not sent:
                return None
            session_id, session_epoch = 0, 0
        else:
            sent = session.sent
            leaders = self._leaders
            metadata = self._cluster.metadata
            for tp in self._pending.pop(node, ()):
                st = assigned.get(tp)
                if leaders.get(tp) == node and self._fetchable(st):
                    assert st is not None
                    entry, key = self._entry(tp, st, metadata)
                    if sent.get(tp) != key:
                        sent[tp] = key
                        topics.setdefault(tp[0], []).append(entry)
                elif sent.pop(tp, None) is not None:
                    forgotten.setdefault(tp[0], []).append(tp[1])
            if not sent:
                # Nothing left to fetch here: close the session, wait for a change.
                session.reset()
                return None
            session_id, session_epoch = session.id, session.epoch
        body = fetch_request(
            topics,
            max_wait_ms=self.fetch_max_wait_ms,
            min_bytes=self.fetch_min_bytes,
            max_bytes=self.fetch_max_bytes,
            session_id=session_id,
            session_epoch=session_epoch,
            forgotten=forgotten,
        )
        if self._read_committed:
            body["isolation_level"] = 1  # stop at the LSO, list aborted transactions
        return body, session

    @gc_paused()
    def _handle_fetch(
        self,
        node: int,
        body: dict[str, Any],
        tail: memoryview,
        session: NodeSession,
    ) -> tuple[CompletedFetch, bool]:
        """Buffer-ready data of one response, and whether some partition's leader moved.

        With the cyclic GC paused: it allocates a PartitionData per partition with records.
        """
        completed = CompletedFetch(node)
        refresh = False
        sent = session.sent
        assigned = self._assigned
        parts = completed.parts
        none = ErrorCode.NONE
        committed = self._read_committed
        aborted = _aborted_lists(body) if committed else {}
        # One pass over the answer, and a PartitionData only for a partition with
        # records: an answer can name thousands of partitions.
        for f in fetched_partitions(body, tail):
            tp = (f.topic, f.partition)
            key = sent.get(tp)
            st = assigned.get(tp)
            if key is None or st is None or st.epoch != key[2] or st.fetch_position != key[0]:
                continue  # not asked here, or seeked or unassigned while in flight
            if st.paused:
                continue
            if f.error != none:
                if f.error == ErrorCode.OFFSET_OUT_OF_RANGE:
                    self._out_of_range(tp, st)
                elif f.error in _REFRESH_CODES or f.error.retriable:
                    refresh = True
                else:
                    st.error = error_for(f.error, f"fetch {f.topic}-{f.partition}")
                continue
            st.high_watermark = f.high_watermark
            st.log_start_offset = f.log_start_offset
            if not f.records:
                continue
            offset = key[0]
            pd = PartitionData(
                f.topic, f.partition, offset, none, f.high_watermark, f.log_start_offset, f.records
            )
            nxt = pd.next_fetch_offset()
            if nxt == offset and pd.exhausted:
                # only part of one batch came back: it can never fit, so stop, loudly
                st.error = MessageTooLargeError(
                    f"batch at {f.topic}-{f.partition}@{nxt} exceeds "
                    f"max_partition_fetch_bytes={self.max_partition_fetch_bytes}"
                )
                continue
            if nxt != offset:
                st.fetch_position = nxt
            if nxt > offset or not pd.exhausted:
                pd.drop_txn_batches(aborted.get(tp), committed)  # markers, aborted txns
                parts.append((st.epoch, pd))
        return completed, refresh

    def _out_of_range(self, tp: TopicPartition, st: PartitionState) -> None:
        if RESET_TARGETS[self.auto_offset_reset] is None:
            st.error = OffsetOutOfRangeError(
                f"offset {st.fetch_position} is out of range for {tp[0]}-{tp[1]}"
            )
        else:
            st.position = st.fetch_position = None
            st.epoch += 1


def _aborted_lists(body: dict[str, Any]) -> dict[TopicPartition, list[Any]]:
    """A read_committed answer's ``aborted_transactions`` by partition (only the
    partitions that list some)."""
    out: dict[TopicPartition, list[Any]] = {}
    for t in body.get("topics") or ():
        for p in t.get("partitions") or ():
            aborted = p.get("aborted_transactions")
            if aborted and isinstance(aborted, list):
                out[(t.get("topic"), p.get("partition"))] = [
                    a for a in aborted if isinstance(a, list | tuple)
                ]
    return out
