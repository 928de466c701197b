"""A follower's fetches from this leader: its log end offset in, the leader's batches out.

Each fetch records the follower's position with its partition's replica (which may move
the high watermark and ISR), then reads up to the leader's log end offset and long-polls
on appends and high-watermark moves. Partitions a reassignment is adding the follower to
are throttled by the outbound reassignment quota (replication/throttle.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from logmq.broker.replica.fetch_results import PartitionRead, TopicRead, failed
from logmq.errors import ErrorCode
from logmq.replication.throttle import configured_rate

if TYPE_CHECKING:
    from logmq.broker.replica.fetch_sessions import FetchSession, SessionPartition
    from logmq.broker.replica.replica_manager import ReplicaManager

NO_ERROR = ErrorCode.NONE
TopicPartition = tuple[str, int]


class FollowerReads:
    """Followers' fetches over the replica manager's replicas and the local logs."""

    def __init__(self, replicas: ReplicaManager, remote_log: Any = None) -> None:
        self.replicas = replicas
        # a tiered log's answers carry its log start over both tiers (Kafka's
        # logStartOffset), so followers learn what DeleteRecords and remote expiry deleted
        self._log_start = plog_start if remote_log is None else remote_log.log_start_offset
        self.logs = replicas.logs
        self.waiters = replicas.waiters

    async def fetch_for_follower(
        self,
        replica_id: int,
        wanted,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        log_starts: dict[TopicPartition, int] | None = None,
    ) -> list[TopicRead]:
        """A follower's fetch: record its LEO once, then long-poll on appends and HW moves.

        It reads up to the leader's log end offset (not the HW) and learns the HW from the
        answer, so the response also returns early when an HW it would carry changes.
        Partitions the follower is being added to (a reassignment) are throttled: held
        back while the outbound quota is in debt, the long poll then waking when it
        allows more; the bytes sent for them are charged as the response goes out.
        """
        rm = self.replicas
        self.replicas.follower_seen[replica_id] = self.replicas.clock()
        errors: dict[tuple[str, int], ErrorCode] = {}
        moved = False  # this very fetch moved an HW: answer at once so it travels
        for name, parts in wanted:
            for partition, offset, _, epoch in parts:
                key = (name, partition)
                plog = self.logs.get_log(name, partition)
                if plog is not None and offset < plog.log_start_offset:
                    errors[key] = _below_local_start(plog)
                else:
                    hw_before = plog.high_watermark if plog is not None else -1
                    start = log_starts.get(key, -1) if log_starts else -1
                    fetched = rm.follower_fetch(key, replica_id, offset, epoch, start)
                    if not fetched.ok:
                        errors[key] = fetched.error
                    elif plog is not None and plog.high_watermark != hw_before:
                        moved = True
        loop = self.replicas.loop()
        deadline = loop.time() + max_wait_ms / 1000
        tps = [(name, p[0]) for name, parts in wanted for p in parts]
        throttled = self._reassignment_reads(replica_id, wanted, loop.time())
        first_hws: dict[tuple[str, int], int] | None = None
        while True:
            topics, total, hws, held = self._read_for_follower(wanted, max_bytes, errors, throttled)
            if first_hws is None:
                first_hws = hws
            now = loop.time()
            remaining = deadline - now
            if total >= min_bytes or errors or moved or remaining <= 0 or hws != first_hws:
                return self._follower_reply(topics, throttled, held)
            wait = remaining
            if held:  # the quota allows more before the deadline: read again then
                wait = min(remaining, max(rm.outbound_throttle.wait_time(now), 0.001))
            if not await self.waiters.wait(tps, wait) and (not held or wait >= remaining):
                topics, _, _, held = self._read_for_follower(wanted, max_bytes, errors, throttled)
                return self._follower_reply(topics, throttled, held)

    async def fetch_session_for_follower(
        self,
        replica_id: int,
        session: FetchSession,
        full: bool,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
    ) -> list[TopicRead]:
        """A follower's fetch in a session: its ready partitions only.

        The session position of a ready partition is the follower's LEO now (it named
        it, or it is behind, or something moved); a caught-up idle partition is left
        alone: its follower stays caught up (``PartitionReplica.tick``) while it keeps
        fetching at all (``follower_seen``). Answers at once with news for the follower
        (data, an error, a new HW or log start), else long-polls on the session.
        """
        loop = self.replicas.loop()
        self.replicas.follower_seen[replica_id] = self.replicas.clock()
        errors: dict[tuple[str, int], ErrorCode] = {}
        parts = session.partitions
        for key in list(session.ready):
            sp = parts[key]
            plog = self.logs.get_log(*key)
            if plog is not None and sp.fetch_offset < plog.log_start_offset:
                errors[key] = _below_local_start(plog)
                continue
            fetched = self.replicas.follower_fetch(
                key, replica_id, sp.fetch_offset, sp.leader_epoch, sp.log_start_offset
            )
            if not fetched.ok:
                errors[key] = fetched.error
        deadline = loop.time() + max_wait_ms / 1000
        more = self._below_leo
        while True:
            wanted = session.to_read()
            throttled = self._reassignment_reads(replica_id, wanted, loop.time())
            topics, total, _, held = self._read_for_follower(wanted, max_bytes, errors, throttled)
            remaining = deadline - loop.time()
            if full or total >= min_bytes or errors or remaining <= 0 or session.has_news(topics):
                topics = self._follower_reply(topics, throttled, held)
                return session.answered(topics, full, more)
            session.settle(topics, more)
            wait = remaining
            if held:  # the quota allows more before the deadline: read again then
                quota = self.replicas.outbound_throttle
                wait = min(remaining, max(quota.wait_time(loop.time()), 0.001))
            if not await self.waiters.wait_session(session, wait) and wait >= remaining:
                wanted = session.to_read()
                throttled = self._reassignment_reads(replica_id, wanted, loop.time())
                topics, _, _, held = self._read_for_follower(wanted, max_bytes, errors, throttled)
                topics = self._follower_reply(topics, throttled, held)
                return session.answered(topics, full, more)

    def _reassignment_reads(
        self, replica_id: int, wanted, now: float
    ) -> dict[tuple[str, int], int]:
        """The partitions this follower is being added to, while a throttle is set.

        Maps each to 0: ``_read_for_follower`` fills in the bytes it read for them.
        """
        rm = self.replicas
        image = rm.image
        if image is None:
            return {}
        quota = rm.outbound_throttle
        quota.set_rate(configured_rate(image), now)
        if not quota.limited or image is None:
            return {}
        throttled = {}
        for name, parts in wanted:
            for partition, *_ in parts:
                part = image.partition(name, partition)
                if part is not None and replica_id in part.adding_replicas:
                    throttled[(name, partition)] = 0
        return throttled

    def _follower_reply(
        self, topics: list[TopicRead], throttled: dict[tuple[str, int], int], held: int
    ) -> list[TopicRead]:
        rm = self.replicas
        if throttled:
            quota = rm.outbound_throttle
            quota.charge(sum(throttled.values()), self.replicas.loop().time())
            if held:
                quota.held_back(held)
        return topics

    def _read_for_follower(
        self, wanted, max_bytes: int, errors: dict, throttled: dict[tuple[str, int], int]
    ) -> tuple:
        """Read what the follower asked for; returns (topics, total, hws, held).

        Throttled partitions share the outbound quota's allowance (whole batches, so the
        last may overdraw it); ``held`` counts those left out because nothing was left.
        """
        topics: list[TopicRead] = []
        total = 0
        budget = max_bytes
        hws: dict[tuple[str, int], int] = {}
        held = 0
        allowance: int | None = None
        rm = self.replicas
        if throttled:
            for key in throttled:  # what this read sends, should it be the answer
                throttled[key] = 0
            allowance = rm.outbound_throttle.allowance(self.replicas.loop().time())
        for name, parts in wanted:
            results = []
            for partition, offset, pmax, _ in parts:
                plog = self.logs.get_log(name, partition)
                error = errors.get((name, partition))
                if error is None and plog is None:
                    error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                if error is not None:
                    start = plog.log_start_offset if plog else -1
                    results.append(failed(partition, error, error.name, start))
                    continue
                assert plog is not None
                key = (name, partition)
                hw = hws[key] = plog.high_watermark
                size = 0
                region = None
                limit = min(pmax, budget)
                quota_left = allowance if key in throttled else None
                if quota_left is not None and offset < plog.log_end_offset:
                    if quota_left <= 0:
                        held += 1
                        limit = -1  # nothing this round: the HW etc. still go back
                    else:
                        limit = min(limit, quota_left)
                if offset < plog.log_end_offset and (limit > 0 or (total == 0 and limit == 0)):
                    region = plog.read(offset, max(limit, 1))
                    fits = min(pmax, budget)  # the quota alone may be overdrawn
                    if region is not None and total and region.length > fits:
                        # only the answer's first batch may exceed max_bytes (as above)
                        if region.length > budget:
                            budget = 0
                        region = None
                    if region is not None and region.length > 0:
                        size = region.length
                        total += size
                        budget = max(0, budget - size)
                    else:
                        region = None
                if quota_left is not None:
                    throttled[key] = size
                    allowance = quota_left - size
                results.append(
                    PartitionRead(partition, NO_ERROR, hw, self._log_start(plog), region)
                )
            topics.append((name, results))
        return topics, total, hws, held

    def _below_leo(self, tp: TopicPartition, sp: SessionPartition) -> bool:
        plog = self.logs.get_log(*tp)
        return plog is not None and sp.fetch_offset < plog.log_end_offset


def plog_start(plog) -> int:
    return plog.log_start_offset


def _below_local_start(plog) -> ErrorCode:
    """A follower behind the leader's local log start: out of range, or for a tiered
    log OFFSET_MOVED_TO_TIERED_STORAGE (KIP-405): the older part is in the remote tier,
    so the follower starts at the leader's local log start (the answer's log start) and
    copies only the local tail."""
    if plog.remote_managed:
        return ErrorCode.OFFSET_MOVED_TO_TIERED_STORAGE
    return ErrorCode.OFFSET_OUT_OF_RANGE
