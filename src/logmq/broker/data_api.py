"""Handlers of the data path: Produce, Fetch, ListOffsets.

Everything here is per batch or per partition, never per record: the produce tail is
sliced into per-partition memoryviews and handed to the storage, which validates and
stamps batches from their headers; a fetch answers with file regions that the server
sends with ``os.sendfile``. On a single node the high watermark is the log end offset,
set after every append.

Replicated partitions (those the replica manager holds, ``self.replicas``) differ: only
the leader appends, stamping its leader epoch; the replica manager moves the HW;
acks=all waits until the HW passes the batch; fetches with ``replica_id >= 0`` come from
followers, whose fetch offset is their log end offset, and may read up to the leader's.
A follower being added by a reassignment reads under the broker's outbound reassignment
quota (replication/throttle.py): while it is in debt, those partitions send nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from logmq.broker.metadata_store import is_internal
from logmq.broker.request_fields import InvalidRequestError, req_int, req_list, req_str
from logmq.broker.topic_creation import PendingTopics
from logmq.errors import ErrorCode, LogMQError
from logmq.net.codec import Request
from logmq.net.reply import FileRegion, Reply
from logmq.replication.throttle import configured_rate
from logmq.storage import batch as b

if TYPE_CHECKING:
    from logmq.broker.fetch_waiter import FetchWaiters
    from logmq.broker.metadata_store import TopicInfo
    from logmq.broker.metrics import BrokerMetrics
    from logmq.broker.replica_manager import ReplicaManager
    from logmq.cluster.metadata_image import MetadataImage
    from logmq.storage.log_manager import LogManager
    from logmq.storage.partition_log import PartitionLog

log = logging.getLogger("logmq.broker")

LEADER_EPOCH = 0  # single node: the one and only leader epoch
EARLIEST = -2
LATEST = -1


def _perror(partition: int, code: ErrorCode, message: str | None = None, **extra: Any) -> dict:
    return {"partition": partition, "error": int(code), "message": message, **extra}


def first_record_at_or_after(plog: PartitionLog, ts: int) -> tuple[int, int]:
    """(offset, timestamp) of the first visible record, in offset order, with timestamp >= ts.

    The time index finds the first batch whose largest timestamp is >= ``ts``; every
    earlier batch is wholly older, so the answer is the first qualifying record of that
    batch (CreateTime timestamps need not grow within a batch, so its first records may
    be older). Only records at or above the log start offset count, which can push the
    answer into later batches. ListOffsets is rare, so decoding these batches is fine.
    (-1, -1) when no record below the high watermark is that recent.
    """
    hit = plog.offset_for_timestamp(ts)
    if hit is None:
        return -1, -1
    hw = plog.high_watermark
    offset = max(hit[0], plog.log_start_offset)
    while offset < hw:
        region = plog.read(offset, 1, max_offset=hw)  # the batch holding ``offset``, whole
        if region is None or region.length == 0:
            break
        data = region.read()
        for pos, h in b.iter_headers(data):
            if h.max_timestamp < ts or h.next_offset <= offset:
                continue
            if h.attributes & b.ATTR_LOG_APPEND_TIME:  # every record has the append time
                first = max(h.base_offset, offset)
                return (first, h.max_timestamp) if first < hw else (-1, -1)
            for rec_offset, rec_ts, *_ in b.decode_records(data, pos):
                if rec_offset >= hw:
                    return -1, -1
                if rec_offset >= offset and rec_ts >= ts:
                    return rec_offset, rec_ts
        if region.end_offset <= offset:
            break
        offset = region.end_offset
    return -1, -1


class LeaderLogs(Protocol):
    def get_log(self, topic: str, partition: int) -> PartitionLog | None:
        """The log of a partition this broker leads (NOT_LEADER_OR_FOLLOWER otherwise)."""


class AutoCreator(Protocol):
    def maybe_auto_create(self, topic: str) -> TopicInfo | None: ...

    async def auto_create(self, topic: str) -> TopicInfo | None: ...


class DataApi:
    """Produce, Fetch, ListOffsets and OffsetForLeaderEpoch over the logs and replicas."""

    def __init__(
        self,
        *,
        logs: LogManager,
        leader_logs: LeaderLogs,
        image: Callable[[], MetadataImage],
        replicas: ReplicaManager | None,
        waiters: FetchWaiters,
        topic_creator: AutoCreator,
        metrics: BrokerMetrics,
        max_fetch_wait_ms: int,
    ) -> None:
        self.logs = logs
        self.leader_logs = leader_logs
        self.image = image
        # None on a single broker: every partition is a single replica.
        self.replicas = replicas
        self.waiters = waiters
        self.topic_creator = topic_creator
        self.metrics = metrics
        self.max_fetch_wait_ms = max_fetch_wait_ms
        self._event_loop: asyncio.AbstractEventLoop | None = None
        # Produces to topics being auto-created wait here, in arrival order.
        self.pending_topics = PendingTopics(topic_creator.auto_create)

    def stop(self) -> None:
        """Cancel auto-creations still running (the broker is shutting down)."""
        self.pending_topics.stop()

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, looked up once (on 3.11 each lookup is a getpid() syscall)."""
        loop = self._event_loop
        if loop is None or loop.is_closed():
            loop = self._event_loop = asyncio.get_running_loop()
        return loop

    def _log_for(self, topic: str, partition: int, *, auto_create: bool = False) -> PartitionLog:
        plog = self.leader_logs.get_log(topic, partition)
        if (
            plog is None
            and auto_create
            and topic not in self.image().topics
            and self.topic_creator.maybe_auto_create(topic) is not None
        ):
            plog = self.leader_logs.get_log(topic, partition)
        if plog is None:
            raise LogMQError(
                f"unknown topic or partition {topic}-{partition}",
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            )
        return plog

    def _local_log(self, topic: str, partition: int) -> PartitionLog | None:
        """This broker's replica, whatever its role (the replica manager checked it)."""
        return self.logs.get_log(topic, partition)

    # -- Produce ----------------------------------------------------------------------
    async def produce(self, req: Request) -> Reply | None:
        body = req.body
        acks = req_int(body, "acks")
        timeout_ms = req_int(body, "timeout_ms", 30_000)
        topics = req_list(body, "topics")
        # Slice the tail first: sizes that do not add up make the whole request invalid.
        work: list[tuple[str, list[tuple[int, memoryview]]]] = []
        tail = req.tail
        pos = 0
        for t in topics:
            name = req_str(t, "topic")
            parts = []
            for p in req_list(t, "partitions"):
                partition, size = req_int(p, "partition"), req_int(p, "size")
                if size < 0 or pos + size > len(tail):
                    raise InvalidRequestError(
                        f"partition sizes exceed the {len(tail)}-byte tail at {name}-{partition}"
                    )
                parts.append((partition, tail[pos : pos + size]))
                pos += size
            work.append((name, parts))
        if pos != len(tail):
            raise InvalidRequestError(f"tail has {len(tail) - pos} bytes not claimed by any entry")

        if acks not in (0, 1, -1):
            msg = f"acks must be 0, 1 or -1, got {acks}"
            out = [
                {"topic": name, "partitions": [
                    _perror(p, ErrorCode.INVALID_REQUIRED_ACKS, msg, base_offset=-1,
                            log_append_time=-1, log_start_offset=-1)
                    for p, _ in parts
                ]}
                for name, parts in work
            ]  # fmt: skip
            return Reply({"topics": out})
        # Pipelined produce requests run concurrently (the server overlaps their
        # durability waits) yet must append in the order they were sent. Each append is
        # a task created before this handler first yields; handlers take their first
        # step in arrival order, so the appends start in arrival order too. (Awaiting
        # one coroutine directly would let it overtake an earlier request's tasks.)
        loop = self._loop()
        tasks = [
            loop.create_task(self._append(req.api_key, name, partition, data, acks, timeout_ms))
            for name, parts in work
            for partition, data in parts
        ]
        results = [await tasks[0]] if len(tasks) == 1 else await asyncio.gather(*tasks)
        out = []
        i = 0
        for name, parts in work:
            out.append({"topic": name, "partitions": results[i : i + len(parts)]})
            i += len(parts)
        if acks == 0:
            return None
        return Reply({"topics": out})

    async def _append(
        self,
        api_key: int,
        topic: str,
        partition: int,
        data: memoryview,
        acks: int = 1,
        timeout_ms: int = 30_000,
    ) -> dict:
        try:
            if is_internal(topic):  # only the broker itself writes __consumer_offsets
                raise LogMQError(
                    f"{topic!r} is an internal topic: clients cannot produce to it",
                    ErrorCode.INVALID_TOPIC_EXCEPTION,
                )
            pending = self.pending_topics
            if topic not in self.image().topics or pending.waiting(topic):
                await pending.wait(topic)  # auto-create runs on the controller; in order
            plog = self._log_for(topic, partition)
            if not data:
                raise LogMQError("empty record set", ErrorCode.CORRUPT_MESSAGE)
            rm = self.replicas
            key = (topic, partition)
            if rm is not None and key in rm.replicas:
                info = await self._append_replicated(rm, key, plog, data, acks, timeout_ms)
            else:
                info = await self.logs.append(plog, data, leader_epoch=LEADER_EPOCH)
                plog.high_watermark = plog.log_end_offset
                if not info.duplicate:
                    self.waiters.notify(key)
            append_time = (
                info.max_timestamp if plog.config.message_timestamp_type == "LogAppendTime" else -1
            )
            return _perror(
                partition,
                ErrorCode.NONE,
                None,
                base_offset=info.first_offset,
                log_append_time=append_time,
                log_start_offset=plog.log_start_offset,
            )
        except LogMQError as e:
            self.metrics.error(api_key, e.code)
            return _perror(
                partition, e.code, str(e), base_offset=-1, log_append_time=-1, log_start_offset=-1
            )
        except Exception as e:
            log.exception("append to %s-%d failed", topic, partition)
            return _perror(
                partition,
                ErrorCode.UNKNOWN_SERVER_ERROR,
                f"{type(e).__name__}: {e}",
                base_offset=-1,
                log_append_time=-1,
                log_start_offset=-1,
            )

    async def _append_replicated(
        self,
        rm: ReplicaManager,
        key: tuple[str, int],
        plog: PartitionLog,
        data: memoryview,
        acks: int,
        timeout_ms: int,
    ):
        """Leader append: min.insync.replicas first, then (acks=all) wait for the HW."""
        error, epoch = rm.check_append(key, acks, plog.config.min_insync_replicas)
        if error is not ErrorCode.NONE:
            raise LogMQError(f"cannot append to {key[0]}-{key[1]}: {error.name}", error)
        info = await self.logs.append(plog, data, leader_epoch=epoch)
        if not info.duplicate:
            rm.on_append(key, plog.log_end_offset)
            self.waiters.notify(key)
        if acks == -1:
            # A retried duplicate waits too: its first attempt may not be replicated yet.
            error = await rm.wait_replicated(key, info.last_offset + 1, timeout_ms)
            if error is not ErrorCode.NONE:
                raise LogMQError(
                    f"{key[0]}-{key[1]} offsets {info.first_offset}..{info.last_offset}: "
                    f"{error.name}",
                    error,
                )
        return info

    # -- Fetch ------------------------------------------------------------------------
    async def fetch(self, req: Request) -> Reply:
        body = req.body
        max_wait_ms = min(max(req_int(body, "max_wait_ms", 0), 0), self.max_fetch_wait_ms)
        min_bytes = req_int(body, "min_bytes", 1)
        max_bytes = req_int(body, "max_bytes", 50 * 1024 * 1024)
        if max_bytes < 0:
            raise LogMQError("max_bytes must be >= 0", ErrorCode.INVALID_FETCH_SIZE)
        wanted: list[tuple[str, list[tuple[int, int, int, int]]]] = []
        for t in req_list(body, "topics"):
            parts = []
            for p in req_list(t, "partitions"):
                pmax = req_int(p, "partition_max_bytes", 1024 * 1024)
                if pmax < 0:
                    raise LogMQError(
                        "partition_max_bytes must be >= 0", ErrorCode.INVALID_FETCH_SIZE
                    )
                parts.append(
                    (
                        req_int(p, "partition"),
                        req_int(p, "fetch_offset"),
                        pmax,
                        req_int(p, "current_leader_epoch", -1),
                    )
                )
            wanted.append((req_str(t, "topic"), parts))

        replica_id = req_int(body, "replica_id", -1)
        if replica_id >= 0:
            return await self._follower_fetch(replica_id, wanted, max_wait_ms, min_bytes, max_bytes)
        loop = self._loop()
        deadline = loop.time() + max_wait_ms / 1000
        tps = [(name, p[0]) for name, parts in wanted for p in parts]
        while True:
            topics, tail, total, any_error = self._read(wanted, max_bytes)
            remaining = deadline - loop.time()
            if total >= min_bytes or any_error or remaining <= 0 or not tps:
                return Reply({"error": 0, "topics": topics}, tail)
            if not await self.waiters.wait(tps, remaining):
                # timed out; one last read so the answer is current
                topics, tail, _, _ = self._read(wanted, max_bytes)
                return Reply({"error": 0, "topics": topics}, tail)

    def _read(self, wanted, max_bytes: int) -> tuple[list, list[FileRegion], int, bool]:
        topics = []
        tail: list[FileRegion] = []
        total = 0
        any_error = False
        budget = max_bytes
        for name, parts in wanted:
            results = []
            for partition, offset, pmax, epoch in parts:
                try:
                    plog = self._log_for(name, partition)
                    self._check_leader(name, partition, epoch)
                    hw = plog.high_watermark
                    start = plog.log_start_offset
                    # Valid up to the log end (as Kafka does): a new leader's HW may lag
                    # what its predecessor exposed, and a consumer there must wait, not
                    # reset. It reads only below the HW.
                    if not start <= offset <= plog.log_end_offset:
                        raise LogMQError(
                            f"offset {offset} is outside [{start}, {plog.log_end_offset}] "
                            f"of {name}-{partition}",
                            ErrorCode.OFFSET_OUT_OF_RANGE,
                        )
                    size = 0
                    limit = min(pmax, budget)
                    if offset < hw and (limit > 0 or total == 0):
                        region = plog.read(offset, max(limit, 1), max_offset=hw)
                        if region is not None and region.length > 0:
                            size = region.length
                            tail.append(region)
                            total += size
                            budget = max(0, budget - size)
                    results.append(
                        {
                            "partition": partition,
                            "error": 0,
                            "high_watermark": hw,
                            "log_start_offset": start,
                            "size": size,
                        }
                    )
                except LogMQError as e:
                    any_error = True
                    results.append(
                        {
                            "partition": partition,
                            "error": int(e.code),
                            "message": str(e),
                            "high_watermark": -1,
                            "log_start_offset": -1,
                            "size": 0,
                        }
                    )
            topics.append({"topic": name, "partitions": results})
        return topics, tail, total, any_error

    def _check_leader(self, topic: str, partition: int, epoch: int) -> None:
        """Consumers read from the leader only, fenced by their view of its epoch."""
        rm = self.replicas
        replica = rm.replicas.get((topic, partition)) if rm is not None else None
        if replica is None:  # no replica manager: the metadata image knows the epoch
            part = self.image().partition(topic, partition)
            current = part.leader_epoch if part is not None else LEADER_EPOCH
        elif not replica.is_leader:
            raise LogMQError(
                f"broker {rm.broker_id} is not the leader of {topic}-{partition}",  # type: ignore[union-attr]
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
            )
        else:
            current = replica.leader_epoch
        if epoch > current:
            raise LogMQError(
                f"leader epoch {epoch} is newer than {current}", ErrorCode.UNKNOWN_LEADER_EPOCH
            )
        if 0 <= epoch < current:
            raise LogMQError(
                f"leader epoch {epoch} is older than {current}", ErrorCode.FENCED_LEADER_EPOCH
            )

    async def _follower_fetch(
        self, replica_id: int, wanted, max_wait_ms: int, min_bytes: int, max_bytes: int
    ) -> Reply:
        """A follower's fetch: record its LEO once, then long-poll on appends and HW moves.

        It reads up to the leader's log end offset (not the HW) and learns the HW from the
        answer, so the response also returns early when an HW it would carry changes.
        Partitions the follower is being added to (a reassignment) are throttled: held
        back while the outbound quota is in debt, the long poll then waking when it
        allows more; the bytes sent for them are charged as the response goes out.
        """
        rm = self.replicas
        errors: dict[tuple[str, int], ErrorCode] = {}
        moved = False  # this very fetch moved an HW: answer at once so it travels
        for name, parts in wanted:
            for partition, offset, _, epoch in parts:
                key = (name, partition)
                plog = self._local_log(name, partition)
                if rm is None:
                    errors[key] = ErrorCode.NOT_LEADER_OR_FOLLOWER
                elif plog is not None and offset < plog.log_start_offset:
                    errors[key] = ErrorCode.OFFSET_OUT_OF_RANGE
                else:
                    hw_before = plog.high_watermark if plog is not None else -1
                    error = rm.follower_fetch(key, replica_id, offset, epoch)
                    if error is not ErrorCode.NONE:
                        errors[key] = error
                    elif plog is not None and plog.high_watermark != hw_before:
                        moved = True
        loop = self._loop()
        deadline = loop.time() + max_wait_ms / 1000
        tps = [(name, p[0]) for name, parts in wanted for p in parts]
        throttled = self._reassignment_reads(replica_id, wanted, loop.time())
        first_hws: dict[tuple[str, int], int] | None = None
        while True:
            topics, tail, total, hws, held = self._read_for_follower(
                wanted, max_bytes, errors, throttled
            )
            if first_hws is None:
                first_hws = hws
            now = loop.time()
            remaining = deadline - now
            if total >= min_bytes or errors or moved or remaining <= 0 or hws != first_hws:
                return self._follower_reply(topics, tail, throttled, held)
            wait = remaining
            if held:  # the quota allows more before the deadline: read again then
                assert rm is not None
                wait = min(remaining, max(rm.outbound_throttle.wait_time(now), 0.001))
            if not await self.waiters.wait(tps, wait) and (not held or wait >= remaining):
                topics, tail, _, _, held = self._read_for_follower(
                    wanted, max_bytes, errors, throttled
                )
                return self._follower_reply(topics, tail, throttled, held)

    def _reassignment_reads(
        self, replica_id: int, wanted, now: float
    ) -> dict[tuple[str, int], int]:
        """The partitions this follower is being added to, while a throttle is set.

        Maps each to 0: ``_read_for_follower`` fills in the bytes it read for them.
        """
        rm = self.replicas
        if rm is None:
            return {}
        image = rm.image
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
        self, topics: list, tail: list[FileRegion], throttled: dict[tuple[str, int], int], held: int
    ) -> Reply:
        rm = self.replicas
        if throttled and rm is not None:
            quota = rm.outbound_throttle
            quota.charge(sum(throttled.values()), self._loop().time())
            if held:
                quota.held_back(held)
        return Reply({"error": 0, "topics": topics}, tail)

    def _read_for_follower(
        self, wanted, max_bytes: int, errors: dict, throttled: dict[tuple[str, int], int]
    ) -> tuple:
        """Read what the follower asked for; returns (topics, tail, total, hws, held).

        Throttled partitions share the outbound quota's allowance (whole batches, so the
        last may overdraw it); ``held`` counts those left out because nothing was left.
        """
        topics = []
        tail: list[FileRegion] = []
        total = 0
        budget = max_bytes
        hws: dict[tuple[str, int], int] = {}
        held = 0
        allowance: int | None = None
        rm = self.replicas
        if throttled and rm is not None:
            for key in throttled:  # what this read sends, should it be the answer
                throttled[key] = 0
            allowance = rm.outbound_throttle.allowance(self._loop().time())
        for name, parts in wanted:
            results = []
            for partition, offset, pmax, _ in parts:
                plog = self._local_log(name, partition)
                error = errors.get((name, partition))
                if error is None and plog is None:
                    error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                if error is not None:
                    results.append(
                        {
                            "partition": partition,
                            "error": int(error),
                            "message": error.name,
                            "high_watermark": -1,
                            "log_start_offset": plog.log_start_offset if plog else -1,
                            "size": 0,
                        }
                    )
                    continue
                assert plog is not None
                key = (name, partition)
                hw = hws[key] = plog.high_watermark
                size = 0
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
                    if region is not None and region.length > 0:
                        size = region.length
                        tail.append(region)
                        total += size
                        budget = max(0, budget - size)
                if quota_left is not None:
                    throttled[key] = size
                    allowance = quota_left - size
                results.append(
                    {
                        "partition": partition,
                        "error": 0,
                        "high_watermark": hw,
                        "log_start_offset": plog.log_start_offset,
                        "size": size,
                    }
                )
            topics.append({"topic": name, "partitions": results})
        return topics, tail, total, hws, held

    # -- OffsetsForLeaderEpoch ----------------------------------------------------------
    async def offsets_for_leader_epoch(self, req: Request) -> Reply:
        """Where does ``leader_epoch`` end in the leader's log (KIP-101/279)?

        Followers ask this before fetching under a new leader epoch and truncate there.
        A partition without replication answers from its own epoch history as leader 0.
        """
        rm = self.replicas
        out = []
        for t in req_list(req.body, "topics"):
            name = req_str(t, "topic")
            results = []
            for p in req_list(t, "partitions"):
                partition = req_int(p, "partition")
                current = req_int(p, "current_leader_epoch", -1)
                epoch = req_int(p, "leader_epoch")
                key = (name, partition)
                plog = self._local_log(name, partition)
                if rm is not None and key in rm.replicas:
                    error, found, end = rm.end_offset_for_epoch(key, current, epoch)
                elif plog is None:
                    error, found, end = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1
                elif current > LEADER_EPOCH:
                    error, found, end = ErrorCode.UNKNOWN_LEADER_EPOCH, -1, -1
                else:
                    error = ErrorCode.NONE
                    found, end = plog.leader_epochs.end_offset_for_epoch(epoch, plog.log_end_offset)
                results.append(
                    {
                        "partition": partition,
                        "error": int(error),
                        "leader_epoch": found,
                        "end_offset": end,
                    }
                )
            out.append({"topic": name, "partitions": results})
        return Reply({"topics": out})

    # -- ListOffsets ------------------------------------------------------------------
    async def list_offsets(self, req: Request) -> Reply:
        out = []
        for t in req_list(req.body, "topics"):
            name = req_str(t, "topic")
            results = []
            for p in req_list(t, "partitions"):
                partition, ts = req_int(p, "partition"), req_int(p, "timestamp")
                try:
                    plog = self._log_for(name, partition)
                    self._check_leader(name, partition, -1)
                    if ts == EARLIEST:
                        offset, found_ts = plog.log_start_offset, -1
                    elif ts == LATEST:
                        offset, found_ts = plog.high_watermark, -1
                    elif ts < 0:
                        raise InvalidRequestError(f"invalid timestamp {ts}")
                    else:
                        offset, found_ts = first_record_at_or_after(plog, ts)
                    results.append(
                        {
                            "partition": partition,
                            "error": 0,
                            "timestamp": found_ts,
                            "offset": offset,
                        }
                    )
                except LogMQError as e:
                    results.append(
                        {
                            "partition": partition,
                            "error": int(e.code),
                            "message": str(e),
                            "timestamp": -1,
                            "offset": -1,
                        }
                    )
            out.append({"topic": name, "partitions": results})
        return Reply({"topics": out})
