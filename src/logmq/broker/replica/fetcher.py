"""Follower fetching: one task and one connection per source broker (the leader).

A fetcher serves every partition this broker follows from one leader. A partition is
first in the "ask" state (OffsetsForLeaderEpoch, KIP-101/279, answered to the
replica manager, which truncates), then in the "fetch" state: one Fetch request per
round carries all of them with this broker's replica id and the current leader epoch,
and the batches that come back are appended as they are. Partitions whose leader
refused (NOT_LEADER, FENCED/UNKNOWN_LEADER_EPOCH) back off until the metadata moves
them; a lost connection is reopened after a backoff.

Reassignment throttle: partitions this broker is being added to (``adding_replicas``
in the latest metadata image) share the broker's inbound quota (replication/throttle.py,
``reassignment.throttled.rate``). Each round they ask for no more than the quota allows
and are left out while it is in debt; the bytes that arrive for them are charged after
the response. Other partitions keep fetching at full speed in the same requests.

Fetch session (KIP-227, broker/replica/fetch_sessions.py): outside a throttled reassignment the
fetcher keeps one session with its leader. The first Fetch names every partition; later
ones only the partitions whose position, leader epoch or log start moved (``_changed``)
and those to forget (removed, or backing off after an error), so an idle partition costs
neither side anything per round. While the inbound throttle is limiting, rounds are
full fetches as before (each carries per-partition limits) and the session is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from logmq.client.connection import BrokerConnection
from logmq.errors import ErrorCode, LogMQError
from logmq.net.codec import ApiKey
from logmq.net.fetch_message import fetch_request, fetched_partitions
from logmq.replication.throttle import configured_rate

if TYPE_CHECKING:
    from logmq.broker.replica.replica_manager import ReplicaManager

# below the leader's (local) log start: start over at the log start it answered
_RESET_ERRORS = (ErrorCode.OFFSET_OUT_OF_RANGE, ErrorCode.OFFSET_MOVED_TO_TIERED_STORAGE)

log = logging.getLogger("logmq.replication")

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class FetcherConfig:
    max_wait_ms: int = 500  # long poll at the leader
    max_bytes: int = 32 << 20
    partition_max_bytes: int = 8 << 20
    backoff_ms: int = 100  # after an error, before asking that leader again
    request_timeout_ms: int = 30_000  # on top of max_wait_ms
    # how this broker reaches the leader's native listener: TLS, its SASL login
    # (client/security.py ClientSecurity; None: plaintext)
    security: Any = None


@dataclass(slots=True)
class _Partition:
    leader_epoch: int
    offset: int = -1  # next offset to fetch ("fetch" state)
    ask_epoch: int | None = None  # epoch to ask the end of ("ask" state)
    retry_at: float = 0.0  # loop time before which it is left alone


@dataclass(slots=True)
class _Session:
    """The session with the leader: its id, next epoch (0: open with a full fetch) and
    what it holds per partition (fetch offset, leader epoch, log start offset)."""

    id: int = 0
    epoch: int = 0
    sent: dict[TopicPartition, tuple[int, int, int]] = field(default_factory=dict)

    def reset(self) -> None:
        self.id = 0
        self.epoch = 0
        self.sent = {}


class ReplicaFetcher:
    def __init__(self, manager: ReplicaManager, leader: int, config: FetcherConfig) -> None:
        self.manager = manager
        self.leader = leader
        self.config = config
        self.partitions: dict[TopicPartition, _Partition] = {}
        self._asking: set[TopicPartition] = set()  # in the "ask" state
        self._changed: set[TopicPartition] = set()  # to send again (or forget)
        self._backoff: dict[TopicPartition, float] = {}  # left out until then
        self._session = _Session()
        self._wake = asyncio.Event()
        self._conn: BrokerConnection | None = None
        self._task: asyncio.Task | None = None

    # -- what the replica manager tells it ---------------------------------------------

    def ask_epoch(self, key: TopicPartition, leader_epoch: int, epoch: int) -> None:
        self.partitions[key] = _Partition(leader_epoch, ask_epoch=epoch)
        self._asking.add(key)
        self._changed.add(key)
        self._backoff.pop(key, None)
        self._wake.set()

    def fetch_from(self, key: TopicPartition, leader_epoch: int, offset: int) -> None:
        self.partitions[key] = _Partition(leader_epoch, offset)
        self._asking.discard(key)
        self._changed.add(key)
        self._backoff.pop(key, None)
        self._wake.set()

    def remove(self, key: TopicPartition) -> None:
        self.partitions.pop(key, None)
        self._asking.discard(key)
        self._backoff.pop(key, None)
        self._changed.add(key)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self._close()

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def _idle(self, timeout: float | None) -> None:
        """Wait for a change of partitions, at most ``timeout`` seconds."""
        self._wake.clear()
        try:
            async with asyncio.timeout(timeout):
                await self._wake.wait()
        except TimeoutError:
            pass

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = self.config.backoff_ms / 1000
        while True:
            if not self.partitions:
                await self._idle(None)
                continue
            try:
                conn = await self._connect()
                if conn is None:
                    await self._idle(backoff)
                    continue
                now = loop.time()
                asks = {
                    k: p
                    for k in self._asking
                    if (p := self.partitions.get(k)) is not None
                    and p.ask_epoch is not None
                    and p.retry_at <= now
                }
                if asks:
                    await self._ask(conn, asks)
                now = loop.time()
                if not self._throttle_limited(now):
                    if not await self._fetch_in_session(conn, now) and not asks:
                        await self._idle(self._next_retry(now))
                    continue
                self._session.reset()
                fetches = {
                    k: p
                    for k, p in self.partitions.items()
                    if p.ask_epoch is None and p.offset >= 0 and p.retry_at <= now
                }
                limits, throttled, rate_wait = self._limits(fetches, now)
                if limits:
                    await self._fetch(conn, fetches, limits, throttled, rate_wait)
                elif not asks:
                    waits = [p.retry_at - now for p in self.partitions.values() if p.retry_at > now]
                    if rate_wait is not None:  # only throttled partitions: wait for the rate
                        waits.append(min(rate_wait, self.config.max_wait_ms / 1000))
                    await self._idle(max(min(waits), 0.001) if waits else backoff)
            except asyncio.CancelledError:
                raise
            except (LogMQError, OSError) as e:
                log.info("replica fetcher for broker %d: %s", self.leader, e)
                self._close()
                await self._idle(backoff)
            except Exception:
                log.exception("replica fetcher for broker %d failed", self.leader)
                self._close()
                await self._idle(backoff)

    async def _connect(self) -> BrokerConnection | None:
        conn = self._conn
        if conn is not None and conn.is_open:
            return conn
        self._close()
        self._session.reset()
        address = self.manager.broker_address(self.leader)
        if address is None:
            return None
        self._conn = await BrokerConnection.open(
            *address,
            client_id=f"replica-{self.manager.broker_id}",
            node_id=self.leader,
            security=self.config.security,
        )
        return self._conn

    # -- rounds ------------------------------------------------------------------------

    async def _ask(self, conn: BrokerConnection, asks: dict[TopicPartition, _Partition]) -> None:
        topics = _by_topic(asks, _ask_entry)
        body = {
            "replica_id": self.manager.broker_id,
            "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
        }
        # Asked again after a backoff unless an answer moves it on (the replica replaces
        # its entry): errors, odd answers and partitions missing from the response alike.
        retry_at = asyncio.get_running_loop().time() + self.config.backoff_ms / 1000
        for p in asks.values():
            p.retry_at = retry_at
        resp = await conn.request(
            ApiKey.OFFSET_FOR_LEADER_EPOCH, body, timeout=self.config.request_timeout_ms / 1000
        )
        for t in resp.body.get("topics", []):
            for r in t.get("partitions", []):
                key = (t["topic"], r["partition"])
                p = asks.get(key)
                if p is None or self.partitions.get(key) is not p:
                    continue  # moved on while we waited
                self.manager.on_leader_epoch_answer(
                    key,
                    ErrorCode(r.get("error", 0)),
                    r.get("leader_epoch", -1),
                    r.get("end_offset", -1),
                )

    def _throttle_limited(self, now: float) -> bool:
        quota = self.manager.inbound_throttle
        quota.set_rate(configured_rate(self.manager.image), now)
        return quota.limited

    def _next_retry(self, now: float) -> float | None:
        """Seconds until the first partition backing off may fetch again (None: none)."""
        waits = [t - now for t in self._backoff.values()]
        waits += [p.retry_at - now for k in self._asking if (p := self.partitions.get(k))]
        return max(min(waits), 0.001) if waits else None

    async def _fetch_in_session(self, conn: BrokerConnection, now: float) -> bool:
        """One round in the session; False when there is nothing to fetch."""
        cfg = self.config
        session = self._session
        if self._backoff:
            for key, until in list(self._backoff.items()):
                if until <= now:
                    del self._backoff[key]
                    self._changed.add(key)
        parts = self.partitions
        topics: dict[str, list[dict]] = {}
        forgotten: dict[str, list[int]] = {}
        opened = session.epoch == 0
        if opened:
            candidates: object = parts
            session.sent = {}
            self._changed.clear()
        else:
            candidates = self._changed
            self._changed = set()
        sent = session.sent
        pmax = cfg.partition_max_bytes
        for key in candidates:  # type: ignore[attr-defined]
            p = parts.get(key)
            if p is not None and p.ask_epoch is None and p.offset >= 0 and p.retry_at <= now:
                start = self._log_start(*key)
                entry = (p.offset, p.leader_epoch, start)
                if sent.get(key) != entry:
                    sent[key] = entry
                    topics.setdefault(key[0], []).append(_fetch_entry(key[1], p, pmax, start))
            else:
                if sent.pop(key, None) is not None:
                    forgotten.setdefault(key[0], []).append(key[1])
                if p is not None and p.ask_epoch is None and p.retry_at > now:
                    self._backoff[key] = p.retry_at  # back in once its backoff ends
        if not sent:
            if session.id:
                session.reset()  # the broker's copy idles out
            return False
        body = fetch_request(
            topics,
            max_wait_ms=cfg.max_wait_ms,
            min_bytes=1,
            max_bytes=cfg.max_bytes,
            replica_id=self.manager.broker_id,
            session_id=0 if opened else session.id,
            session_epoch=0 if opened else session.epoch,
            forgotten=forgotten,
        )
        resp = await conn.request(
            ApiKey.FETCH, body, timeout=(cfg.max_wait_ms + cfg.request_timeout_ms) / 1000
        )
        if session.sent is not sent:
            return True  # reset meanwhile (a reconnect): start over
        error = resp.body.get("error", 0)
        if error in (ErrorCode.FETCH_SESSION_ID_NOT_FOUND, ErrorCode.INVALID_FETCH_SESSION_EPOCH):
            session.reset()
            return True
        if opened:
            session.id = resp.body.get("session_id", 0) or 0
            session.epoch = 1 if session.id else 0  # no session: full every round
        else:
            session.epoch = 1 if session.epoch >= 0x7FFFFFFF else session.epoch + 1
        answers = list(fetched_partitions(resp.body, resp.tail))  # checked before any append
        retry_at = asyncio.get_running_loop().time() + cfg.backoff_ms / 1000
        for f in answers:
            key = (f.topic, f.partition)
            p = parts.get(key)
            was = sent.get(key)
            if p is None or was is None or was[0] != p.offset or p.ask_epoch is not None:
                continue  # moved on while the fetch was out
            self._changed.add(key)  # its position or log start may move: resend if so
            if f.error is ErrorCode.NONE:
                offset = p.offset
                leo = await self.manager.on_fetched(
                    key, f.records, f.high_watermark, f.log_start_offset
                )
                if leo is not None and parts.get(key) is p and p.offset == offset:
                    p.offset = leo
            elif f.error in _RESET_ERRORS:
                if not await self._reset(key, f.error, p.offset, f.log_start_offset):
                    p.retry_at = retry_at
                    self._backoff[key] = retry_at
            else:
                log.debug("fetch %s-%d from %d: %s", *key, self.leader, f.error.name)
                p.retry_at = retry_at
                self._backoff[key] = retry_at
        return True

    def _limits(
        self, fetches: dict[TopicPartition, _Partition], now: float
    ) -> tuple[dict[TopicPartition, int], set[TopicPartition], float | None]:
        """Max bytes per partition for this round, the throttled partitions among them,
        and (when some were left out for the inbound quota) how long until it allows more.
        """
        pmax = self.config.partition_max_bytes
        quota = self.manager.inbound_throttle
        image = self.manager.image
        quota.set_rate(configured_rate(image), now)
        if not quota.limited or not fetches or image is None:
            return dict.fromkeys(fetches, pmax), set(), None
        me = self.manager.broker_id
        throttled = set()
        for key in fetches:
            part = image.partition(*key)
            if part is not None and me in part.adding_replicas:
                throttled.add(key)
        limits = {k: pmax for k in fetches if k not in throttled}
        if not throttled:
            return limits, throttled, None
        allowance = quota.allowance(now) or 0
        if allowance <= 0:
            quota.held_back(len(throttled))
            return limits, set(), quota.wait_time(now)
        share = max(1, min(pmax, allowance // len(throttled)))  # the leader sends whole batches
        for key in throttled:
            limits[key] = share
        return limits, throttled, None

    async def _reset(
        self, key: TopicPartition, error: ErrorCode, offset: int, leader_start: int
    ) -> bool:
        """Below the leader's log start: start over there (for a tiered log, with the
        state the remote tier holds at the leader's local log start)."""
        if error is ErrorCode.OFFSET_MOVED_TO_TIERED_STORAGE:
            return await self.manager.on_moved_to_tier(key, offset, leader_start)
        return self.manager.on_out_of_range(key, offset, leader_start)

    def _log_start(self, topic: str, partition: int) -> int:
        plog = self.manager.logs.get_log(topic, partition)
        return self.manager.reported_log_start(plog) if plog is not None else -1

    async def _fetch(
        self,
        conn: BrokerConnection,
        fetches: dict[TopicPartition, _Partition],
        limits: dict[TopicPartition, int],
        throttled: set[TopicPartition],
        rate_wait: float | None,
    ) -> None:
        cfg = self.config
        max_wait_ms = cfg.max_wait_ms
        if rate_wait is not None:
            # Throttled partitions sit this round out: do not let a long poll on the
            # others keep them waiting past the moment the quota allows them again.
            max_wait_ms = min(max_wait_ms, math.ceil(rate_wait * 1000))
        body = fetch_request(
            _by_topic(
                {k: fetches[k] for k in limits},
                lambda partition, p, topic: _fetch_entry(
                    partition, p, limits[(topic, partition)], self._log_start(topic, partition)
                ),
            ),
            max_wait_ms=max_wait_ms,
            min_bytes=1,
            max_bytes=cfg.max_bytes,
            replica_id=self.manager.broker_id,
        )
        resp = await conn.request(
            ApiKey.FETCH, body, timeout=(max_wait_ms + cfg.request_timeout_ms) / 1000
        )
        answers = list(fetched_partitions(resp.body, resp.tail))  # checked before any append
        loop = asyncio.get_running_loop()
        retry_at = loop.time() + cfg.backoff_ms / 1000
        if throttled:
            charged = sum(len(f.records) for f in answers if (f.topic, f.partition) in throttled)
            self.manager.inbound_throttle.charge(charged, loop.time())
        for f in answers:
            key = (f.topic, f.partition)
            p = fetches.get(key)
            if p is None or self.partitions.get(key) is not p:
                continue
            if f.error is ErrorCode.NONE:
                offset = p.offset
                leo = await self.manager.on_fetched(
                    key, f.records, f.high_watermark, f.log_start_offset
                )
                if leo is not None and self.partitions.get(key) is p and p.offset == offset:
                    p.offset = leo
            elif f.error in _RESET_ERRORS:
                if not await self._reset(key, f.error, p.offset, f.log_start_offset):
                    p.retry_at = retry_at
            else:
                # NOT_LEADER_OR_FOLLOWER, FENCED/UNKNOWN_LEADER_EPOCH, unknown
                # partition: the metadata is about to move it; try again later.
                log.debug("fetch %s-%d from %d: %s", *key, self.leader, f.error.name)
                p.retry_at = retry_at


def _fetch_entry(partition: int, p: _Partition, max_bytes: int, log_start: int) -> dict:
    return {
        "partition": partition,
        "fetch_offset": p.offset,
        "partition_max_bytes": max_bytes,
        "current_leader_epoch": p.leader_epoch,
        "log_start_offset": log_start,  # the leader's DeleteRecords waits on it
    }


def _ask_entry(partition: int, p: _Partition, topic: str) -> dict:
    return {
        "partition": partition,
        "current_leader_epoch": p.leader_epoch,
        "leader_epoch": p.ask_epoch,
    }


def _by_topic(parts: dict[TopicPartition, _Partition], entry) -> dict[str, list[dict]]:
    topics: dict[str, list[dict]] = {}
    for (topic, partition), p in parts.items():
        topics.setdefault(topic, []).append(entry(partition, p, topic))
    return topics
