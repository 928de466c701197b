"""The native data-path handlers: Produce, Fetch, ListOffsets, OffsetForLeaderEpoch.

They translate requests into calls on the services and answers into replies. Everything
is per batch or per partition, never per record: the produce tail is sliced into
per-partition memoryviews and handed to the produce path both front doors share
(broker/replica/produce_path.py, then ``ReplicaManager.append``: validation and stamping by the
storage, min.insync.replicas, the HW, acks=all); a fetch
answers with file regions that the server sends with ``os.sendfile``. Reads are the
replica manager's too: consumers read below the HW from the leader, fenced by their
leader epoch (``fetch_for_consumer``, ``leader_log``); fetches with ``replica_id >= 0``
come from followers (``fetch_for_follower``: their LEO, the HW, the reassignment
throttle).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from logmq.broker.coordinator.txn_verification import Guards, append_guard
from logmq.broker.replica.fetch_sessions import (
    FINAL_EPOCH,
    Entry,
    FetchSessionCache,
    FetchSessionError,
)
from logmq.broker.replica.produce_path import ProduceResult
from logmq.errors import ErrorCode, LogMQError
from logmq.gcpause import gc_paused
from logmq.native.request_fields import InvalidRequestError, req_int, req_list, req_str
from logmq.net.codec import Request
from logmq.net.reply import Reply

if TYPE_CHECKING:
    from logmq.broker.coordinator.txn_verification import TransactionalProduceCheck
    from logmq.broker.metrics import BrokerMetrics
    from logmq.broker.replica.consumer_reads import ConsumerReads
    from logmq.broker.replica.fetch_results import TopicRead
    from logmq.broker.replica.follower_reads import FollowerReads
    from logmq.broker.replica.produce_path import ProducePath
    from logmq.broker.replica.record_deletion import RecordDeletion
    from logmq.broker.replica.replica_manager import ReplicaManager
    from logmq.net.reply import FileRegion
    from logmq.security.quota_enforcer import QuotaEnforcer

log = logging.getLogger("logmq.broker")


def _perror(partition: int, code: ErrorCode, message: str | None = None, **extra: Any) -> dict:
    return {"partition": partition, "error": int(code), "message": message, **extra}


@gc_paused()  # a dict per partition: logmq/gcpause.py
def _fetch_reply(read: list[TopicRead], session_id: int) -> Reply:
    """A fetch answer in the native door's shape: per partition its numbers and the
    size of its records, which follow the msgpack head in order (``net/fetch_message``)."""
    topics = []
    tail: list[FileRegion] = []
    for name, parts in read:
        out = []
        for p in parts:
            records = p.records
            entry = {
                "partition": p.partition,
                "error": int(p.error),
                "high_watermark": p.high_watermark,
                "log_start_offset": p.log_start_offset,
                "size": 0,
            }
            if p.last_stable_offset != p.high_watermark:  # absent: the HW, as usual
                entry["last_stable_offset"] = p.last_stable_offset
            if p.aborted:
                entry["aborted_transactions"] = [list(a) for a in p.aborted]
            if records is not None:
                entry["size"] = p.size
                tail.append(records)
            if p.message is not None:
                entry["message"] = p.message
            out.append(entry)
        topics.append({"topic": name, "partitions": out})
    return Reply({"error": 0, "session_id": session_id, "topics": topics}, tail)


def _throttled_fetch(session_id: int, throttle_ms: int) -> Reply:
    """A consumer over its fetch quota: an empty answer, and the connection muted."""
    body = {"error": 0, "session_id": session_id, "topics": [], "throttle_ms": throttle_ms}
    return Reply(body, throttle_ms=throttle_ms)


class DataApi:
    """Produce, Fetch, ListOffsets and OffsetForLeaderEpoch over the logs and replicas."""

    def __init__(
        self,
        *,
        produce_path: ProducePath,
        replicas: ReplicaManager,
        reads: ConsumerReads,
        follower_reads: FollowerReads,
        deletions: RecordDeletion,
        metrics: BrokerMetrics,
        max_fetch_wait_ms: int,
        quotas: QuotaEnforcer | None = None,
        txn_produce: TransactionalProduceCheck | None = None,
    ) -> None:
        """``txn_produce`` checks produces that carry a transactional id (None:
        such produces are refused)."""
        self.produce_path = produce_path
        self.txn_produce = txn_produce
        self.quotas = quotas  # client byte-rate quotas, shared with the Kafka door
        self.replicas = replicas
        self.reads = reads
        self.follower_reads = follower_reads
        self.deletions = deletions
        self.metrics = metrics
        self.max_fetch_wait_ms = max_fetch_wait_ms
        self.sessions = FetchSessionCache.watched_by(replicas.waiters)
        self._event_loop: asyncio.AbstractEventLoop | None = None

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, looked up once (on 3.11 each lookup is a getpid() syscall)."""
        loop = self._event_loop
        if loop is None or loop.is_closed():
            loop = self._event_loop = asyncio.get_running_loop()
        return loop

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
        entries = [(name, partition, data) for name, parts in work for partition, data in parts]
        txn_id = body.get("transactional_id")
        if txn_id is None:
            outcomes = await self.produce_path.append_all(entries, acks, timeout_ms)
        else:
            outcomes = await self._transactional(req, txn_id, entries, acks, timeout_ms)
        results = [
            self._result(req.api_key, partition, result)
            for (_, partition, _), result in zip(entries, outcomes, strict=True)
        ]
        out = []
        i = 0
        for name, parts in work:
            out.append({"topic": name, "partitions": results[i : i + len(parts)]})
            i += len(parts)
        throttle = 0
        if self.quotas is not None and self.quotas.active():
            throttle = self.quotas.produce(req.context, req.client_id, len(tail))
        if acks == 0:  # no answer, but a client over its quota is muted all the same
            return Reply(None, silent=True, throttle_ms=throttle) if throttle else None  # type: ignore[arg-type]
        if not throttle:
            return Reply({"topics": out})
        return Reply({"topics": out, "throttle_ms": throttle}, throttle_ms=throttle)

    async def _transactional(
        self,
        req: Request,
        txn_id: Any,
        entries: list[tuple[str, int, memoryview]],
        acks: int,
        timeout_ms: int,
    ) -> list[ProduceResult]:
        """The results of a transactional produce: the refused partitions' errors, the
        appends of the others (each guarded, as on the Kafka door, against its
        transaction ending between the check and the append)."""
        if not isinstance(txn_id, str):
            raise InvalidRequestError("field 'transactional_id' must be str")
        if self.txn_produce is None:
            error = ProduceResult(
                ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "transactions are not served here"
            )
            return [error for _ in entries]
        guards: Guards = {}
        refused = await self.txn_produce.check(req.context, txn_id, entries, guards)
        allowed = [e for e in entries if (e[0], e[1]) not in refused]
        appended = iter(
            await self.produce_path.append_all(allowed, acks, timeout_ms, append_guard(guards))
        )
        return [refused.get((t, p)) or next(appended) for t, p, _ in entries]

    def _result(self, api_key: int, partition: int, result: ProduceResult) -> dict:
        """One partition's entry of a Produce answer (produce_path.append_all's result)."""
        if result.error is not ErrorCode.NONE:
            self.metrics.error(api_key, result.error)
        return _perror(
            partition,
            result.error,
            result.message,
            base_offset=result.base_offset,
            log_append_time=result.log_append_time,
            log_start_offset=result.log_start_offset,
        )

    # -- Fetch ------------------------------------------------------------------------
    async def fetch(self, req: Request) -> Reply:
        """Fetch, with or without a fetch session (broker/replica/fetch_sessions.py).

        ``session_id``/``session_epoch`` follow Kafka (KIP-227); without them (epoch -1)
        the request names every partition and the answer carries every one, as before
        sessions. ``forgotten`` lists ``{"topic", "partitions": [int]}`` to drop.
        """
        body = req.body
        max_wait_ms = min(max(req_int(body, "max_wait_ms", 0), 0), self.max_fetch_wait_ms)
        min_bytes = req_int(body, "min_bytes", 1)
        max_bytes = req_int(body, "max_bytes", 50 * 1024 * 1024)
        if max_bytes < 0:
            raise LogMQError("max_bytes must be >= 0", ErrorCode.INVALID_FETCH_SIZE)
        replica_id = req_int(body, "replica_id", -1)
        # 1: read_committed, below the LSO with the aborted transactions listed
        committed = req_int(body, "isolation_level", 0) == 1
        session_id = req_int(body, "session_id", 0)
        session_epoch = req_int(body, "session_epoch", FINAL_EPOCH)
        named = _named_partitions(body, replica_id >= 0)
        forgotten = [
            (req_str(t, "topic"), partition)
            for t in req_list(body, "forgotten", [])
            for partition in req_list(t, "partitions")
        ]

        try:
            context = self.sessions.new_context(
                session_id, session_epoch, replica_id, self.replicas.clock(), named, forgotten
            )
        except FetchSessionError as e:
            self.metrics.error(req.api_key, e.code)
            return Reply({"error": int(e.code), "message": str(e), "session_id": 0, "topics": []})
        # a consumer's fetch quota, as on the Kafka door (followers have the
        # reassignment throttle instead)
        quotas = self.quotas
        gate = quotas.fetch_gate(req.context, req.client_id) if quotas and replica_id < 0 else None
        if gate is not None:
            max_bytes = quotas.fetch_max_bytes(req.context, req.client_id, max_bytes)  # type: ignore[union-attr]
            min_bytes = min(min_bytes, max_bytes)
        session = context.session
        if session is not None:
            if replica_id >= 0:
                read = await self.follower_reads.fetch_session_for_follower(
                    replica_id, session, context.full, max_wait_ms, min_bytes, max_bytes
                )
            else:
                read = await self.reads.fetch_session_for_consumer(
                    session,
                    context.full,
                    max_wait_ms,
                    min_bytes,
                    max_bytes,
                    gate,
                    committed=committed,
                )
            if read is None:  # throttled: empty, and a new session not opened (as Kafka)
                assert gate is not None
                return _throttled_fetch(self.sessions.throttled(context), gate.throttle_ms)
            return _fetch_reply(read, session.id)

        wanted = [(topic, [p[:4] for p in parts]) for topic, parts in named]
        if replica_id >= 0:
            log_starts = {(t, p[0]): p[4] for t, parts in named for p in parts}
            read = await self.follower_reads.fetch_for_follower(
                replica_id, wanted, max_wait_ms, min_bytes, max_bytes, log_starts
            )
        else:
            read = await self.reads.fetch_for_consumer(
                wanted, max_wait_ms, min_bytes, max_bytes, committed=committed
            )
            if gate is not None and not gate(read):
                return _throttled_fetch(0, gate.throttle_ms)
        return _fetch_reply(read, 0)

    # -- OffsetsForLeaderEpoch ----------------------------------------------------------
    async def offsets_for_leader_epoch(self, req: Request) -> Reply:
        """Where does ``leader_epoch`` end in the leader's log (KIP-101/279)?

        Followers ask this before fetching under a new leader epoch and truncate there;
        the replica manager answers (``epoch_end_offset``), as for Kafka clients.
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
                found = rm.epoch_end_offset(name, partition, current, epoch)
                results.append(
                    {
                        "partition": partition,
                        "error": int(found.error),
                        "leader_epoch": found.leader_epoch,
                        "end_offset": found.end_offset,
                    }
                )
            out.append({"topic": name, "partitions": results})
        return Reply({"topics": out})

    # -- DeleteRecords ----------------------------------------------------------------
    async def delete_records(self, req: Request) -> Reply:
        """Move log start offsets forward (the replica manager waits for the ISR)."""
        timeout_ms = req_int(req.body, "timeout_ms", 30_000)
        offsets: dict[tuple[str, int], int] = {}
        for t in req_list(req.body, "topics"):
            name = req_str(t, "topic")
            for p in req_list(t, "partitions"):
                offsets[(name, req_int(p, "partition"))] = req_int(p, "offset")
        results = await self.deletions.delete_records(offsets, timeout_ms)
        out: dict[str, list[dict[str, Any]]] = {}
        for (name, partition), r in results.items():
            entry = {
                "partition": partition,
                "error": int(r.error),
                "low_watermark": r.low_watermark,
            }
            if r.message is not None:
                entry["message"] = r.message
            out.setdefault(name, []).append(entry)
        return Reply({"topics": [{"topic": n, "partitions": ps} for n, ps in out.items()]})

    # -- ListOffsets ------------------------------------------------------------------
    async def list_offsets(self, req: Request) -> Reply:
        committed = req_int(req.body, "isolation_level", 0) == 1  # "latest" is the LSO
        out = []
        for t in req_list(req.body, "topics"):
            name = req_str(t, "topic")
            results = []
            for p in req_list(t, "partitions"):
                partition, ts = req_int(p, "partition"), req_int(p, "timestamp")
                try:
                    plog = self.replicas.leader_log(name, partition)
                    offset, found_ts = await self.reads.list_offset(plog, ts, committed)
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


_PARTITION_MAX_BYTES = 1024 * 1024


@gc_paused()  # a full fetch names every partition: logmq/gcpause.py
def _named_partitions(body: Any, follower: bool) -> list[tuple[str, list[Entry]]]:
    """A Fetch's ``topics`` as fetch_sessions.Entry tuples by topic."""
    named: list[tuple[str, list[Entry]]] = []
    for t in req_list(body, "topics"):
        parts = []
        topic = req_str(t, "topic")
        for p in req_list(t, "partitions"):
            # A well-formed entry costs a few lookups and type checks (a full fetch
            # names every partition); anything else takes the checked path below,
            # which names the bad field.
            if type(p) is dict:
                get = p.get
                partition = get("partition")
                offset = get("fetch_offset")
                pmax = get("partition_max_bytes", _PARTITION_MAX_BYTES)
                epoch = get("current_leader_epoch", -1)
                start = get("log_start_offset", -1) if follower else -1
                if (
                    type(partition) is int
                    and type(offset) is int
                    and type(pmax) is int
                    and type(epoch) is int
                    and type(start) is int
                    and pmax >= 0
                ):
                    parts.append((partition, offset, pmax, epoch, start))
                    continue
            parts.append(_fetch_entry(p, follower))
        named.append((topic, parts))
    return named


def _fetch_entry(p: Any, follower: bool) -> Entry:
    """One partition of a Fetch, every field checked: INVALID_REQUEST names a bad one."""
    pmax = req_int(p, "partition_max_bytes", _PARTITION_MAX_BYTES)
    if pmax < 0:
        raise LogMQError("partition_max_bytes must be >= 0", ErrorCode.INVALID_FETCH_SIZE)
    return (
        req_int(p, "partition"),
        req_int(p, "fetch_offset"),
        pmax,
        req_int(p, "current_leader_epoch", -1),
        req_int(p, "log_start_offset", -1) if follower else -1,
    )
