"""The producer's one background task: ready batches out, responses back in.

Each round takes the batches the accumulator and the DeliveryTracker allow, groups them
by partition leader and writes one Produce request per leader (at most one batch per
partition per request, so each response entry maps to exactly one batch); requests are
pipelined and their responses handled in done-callbacks, so the task never waits for a
round trip before sending more. It sleeps until the next linger deadline, retry time,
or wake-up (new batch, full batch, response, flush).

A transactional producer's sender holds back a partition's batches until the partition
is in the transaction: it asks the TransactionManager to add the partitions it found
waiting (one AddPartitionsToTxn at a time, for all of them) and sends them in a later
round. It never renews the producer id by itself: a transactional producer's epoch
changes only through its coordinator (abort_transaction).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from logmq.client.accumulator import ProducerBatch, RecordAccumulator, TopicPartition
from logmq.client.cluster import ClusterClient
from logmq.client.inflight import DeliveryTracker, Outcome, needs_metadata
from logmq.errors import (
    ErrorCode,
    LogMQError,
    OutOfOrderSequenceError,
    RequestTimedOutError,
    error_for,
)
from logmq.net.codec import ApiKey, Response

if TYPE_CHECKING:
    from logmq.client.missing_topics import MissingTopics
    from logmq.client.transactions import TransactionManager

TIMER_RESOLUTION = 0.001  # seconds; the event loop's timers are no finer


def _now() -> float:
    return time.monotonic() * 1000


class Sender:
    def __init__(
        self,
        cluster: ClusterClient,
        acc: RecordAccumulator,
        tracker: DeliveryTracker,
        *,
        acks: int,
        compression: int,
        request_timeout_ms: int,
        retry_backoff_ms: int,
        buffer_memory: int,
        txn: TransactionManager | None = None,
        missing: MissingTopics | None = None,
    ) -> None:
        self.cluster = cluster
        self.txn = txn
        # says, once per topic, that a broker no longer knows a topic it had batches for
        self.missing = missing
        # a transactional sender's batches taken for this round, not yet sent: what a
        # commit's flush must wait for too
        self.in_transit: list[ProducerBatch] = []
        self._add_task: asyncio.Task[None] | None = None
        self.acc = acc
        self.tracker = tracker
        self.acks = acks
        self.compression = compression
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.buffer_memory = buffer_memory
        self.wakeup = asyncio.Event()
        self.space = asyncio.Event()
        self.closing = False
        self._task: asyncio.Task[None] | None = None
        self._refresh_task: asyncio.Task[None] | None = None

    # -- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        if self.tracker.idempotent and self.txn is None:  # else init_transactions()
            await self.init_producer_id()
        self._task = asyncio.create_task(self._run(), name="logmq-producer-sender")

    async def stop(self) -> None:
        """Send what is left (until it completes or times out), then end the task."""
        self.closing = True
        self.wakeup.set()
        if self._task is not None:
            await self._task
        for task in (self._refresh_task, self._add_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def init_producer_id(self) -> None:
        resp = await self.cluster.request_any(
            ApiKey.INIT_PRODUCER_ID,
            {"transactional_id": None, "producer_id": -1, "producer_epoch": -1},
        )
        code = resp.body.get("error", 0)
        if code:
            raise error_for(code, resp.body.get("message") or "InitProducerId failed")
        self.tracker.set_producer(resp.body["producer_id"], resp.body["producer_epoch"])

    # -- the loop -------------------------------------------------------------------
    async def _run(self) -> None:
        while not (self.closing and not len(self.acc) and not self.tracker.busy):
            self.wakeup.clear()
            try:
                if self.tracker.needs_new_producer_id and self.txn is None:
                    await self.init_producer_id()
                sent = await self._send_ready(_now())
            except LogMQError:
                await asyncio.sleep(self.retry_backoff_ms / 1000)
                continue
            deadline = self._next_wakeup()
            if deadline is None:
                await self.wakeup.wait()
                continue
            delay = (deadline - _now()) / 1000
            if delay <= 0:
                if sent:
                    await asyncio.sleep(0)  # let responses in before the next round
                    continue
                # Ready but blocked (in-flight limit, retries in order): a response wakes us.
                delay = self.retry_backoff_ms / 1000
            elif delay < TIMER_RESOLUTION:
                # uvloop rounds timers to whole milliseconds: a shorter timeout fires at
                # once and the loop would spin until the deadline.
                delay = TIMER_RESOLUTION
            try:
                async with asyncio.timeout(delay):
                    await self.wakeup.wait()
            except TimeoutError:
                pass

    def _next_wakeup(self) -> float | None:
        times = [t for t in (self.acc.next_deadline(), self.tracker.next_retry_time()) if t]
        md = self.cluster.metadata
        if any(md.leader_for(*tp) < 0 for tp in self.acc.partitions()):
            times.append(_now() + self.retry_backoff_ms)
        return min(times) if times else None

    async def _send_ready(self, now: float) -> int:
        """Send what may go now; returns the number of batches written."""
        by_node: dict[int, list[list[ProducerBatch]]] = {}
        leaderless: set[str] = set()
        expired: list[ProducerBatch] = []
        md = self.cluster.metadata
        tracker = self.tracker
        tps = set(self.acc.partitions())
        tps.update(tracker.retry_partitions())
        txn = self.txn
        to_add: list[TopicPartition] = []
        with self.acc.lock:
            for tp in tps:
                leader = md.leader_for(*tp)
                if leader < 0:
                    leaderless.add(tp[0])
                    # nowhere to resend them (a deleted topic): they still expire in time
                    expired.extend(tracker.expire_retries(tp, now))
                    expired.extend(self._expire(tp, now))
                    continue
                if tracker.has_retries(tp):
                    taken = tracker.take_retries(tp, now)
                elif txn is not None and tp not in txn.added:
                    to_add.append(tp)  # not in the transaction yet: its batches wait
                    continue
                else:
                    taken = []
                    room = tracker.room(tp)
                    while len(taken) < room:
                        b = self.acc.pop(tp, now, self.closing)
                        if b is None:
                            break
                        taken.append(b)
                rounds = by_node.setdefault(leader, [])
                for i, b in enumerate(taken):
                    if len(rounds) <= i:
                        rounds.append([])
                    rounds[i].append(b)
        for b in expired:
            self._finish(b, RequestTimedOutError(f"no leader for {b.topic}-{b.partition} in time"))
        if leaderless:
            self._refresh_soon(leaderless)
        if to_add:
            self._add_soon(to_add)
        if txn is not None:
            self.in_transit = [b for rounds in by_node.values() for bs in rounds for b in bs]
        sent = 0
        try:
            for node, rounds in by_node.items():
                for batches in rounds:
                    await self._send_round(node, batches)
                    sent += len(batches)
        finally:
            if txn is not None:
                self.in_transit = []
        return sent

    def _add_soon(self, tps: list[TopicPartition]) -> None:
        """AddPartitionsToTxn for partitions whose batches wait, in the background (one
        at a time: partitions found meanwhile go in the next one)."""
        if self._add_task is not None and not self._add_task.done():
            return
        self._add_task = asyncio.create_task(self._add(tps))

    async def _add(self, tps: list[TopicPartition]) -> None:
        assert self.txn is not None
        try:
            failed = await self.txn.add_partitions(tps)
        except LogMQError as e:
            failed = dict.fromkeys(tps, e)
        if failed:  # their batches can never be sent in this transaction
            with self.acc.lock:
                dropped = [
                    (b, err) for tp, err in failed.items() for b in self.acc.remove_partition(tp)
                ]
            for b, err in dropped:
                self._finish(b, err)
        self.wakeup.set()

    def _expire(self, tp: TopicPartition, now: float) -> list[ProducerBatch]:
        out = []
        head = self.acc.peek(tp)
        while head is not None and head.deadline <= now and not self.tracker.has_retries(tp):
            b = self.acc.pop(tp, now, force=True)
            assert b is not None
            out.append(b)
            head = self.acc.peek(tp)
        return out

    async def _send_round(self, node: int, batches: list[ProducerBatch]) -> None:
        topics: dict[str, list[dict[str, int]]] = {}
        tail = []
        for b in batches:
            payload = self.tracker.prepare(b, self.compression)
            self.tracker.sent(b)
            topics.setdefault(b.topic, []).append({"partition": b.partition, "size": len(payload)})
            tail.append(payload)
        body = {
            "acks": self.acks,
            "timeout_ms": self.request_timeout_ms,
            "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
        }
        try:
            conn = await self.cluster.connection(node)
            fut = conn.send(ApiKey.PRODUCE, body, tail, expect_response=self.acks != 0)
        except LogMQError as e:
            for b in batches:
                self._on_result(b, ErrorCode.NETWORK_EXCEPTION, -1, -1, str(e))
            return
        if fut is None:  # acks=0: written is all we will ever know
            for b in batches:
                self._on_result(b, ErrorCode.NONE, -1, -1, None)
        else:
            fut.add_done_callback(lambda f: self._on_response(f, batches))
        try:
            await conn.drain()
        except LogMQError:
            pass  # the response future fails as well, and the batches are retried

    # -- results --------------------------------------------------------------------
    def _on_response(self, fut: asyncio.Future[Response], batches: list[ProducerBatch]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            msg = "cancelled" if fut.cancelled() else str(fut.exception())
            for b in batches:
                self._on_result(b, ErrorCode.NETWORK_EXCEPTION, -1, -1, msg)
            self.wakeup.set()
            return
        body = fut.result().body
        results: dict[Any, dict[str, Any]] = {}
        for t in body.get("topics") or ():
            for p in t.get("partitions") or ():
                results[(t.get("topic"), p.get("partition"))] = p
        for b in batches:
            r = results.get(b.tp)
            if r is None:
                code = body.get("error") or ErrorCode.NETWORK_EXCEPTION
                self._on_result(b, code, -1, -1, body.get("message") or "no result for partition")
            else:
                self._on_result(
                    b,
                    r.get("error", 0),
                    r.get("base_offset", -1),
                    r.get("log_append_time", -1),
                    r.get("message"),
                )
        self.wakeup.set()

    def _on_result(
        self, b: ProducerBatch, code: int, base_offset: int, append_time: int, msg: str | None
    ) -> None:
        outcome = self.tracker.on_result(b, code, _now())
        missing = self.missing
        if outcome is Outcome.COMPLETE:
            b.complete(base_offset, -1 if append_time is None else append_time)
            self._release(b)
            if missing is not None and missing.warned:
                missing.found(b.topic)
        elif outcome is Outcome.RETRY:
            if needs_metadata(code):
                self._refresh_soon({b.topic})
            if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and missing is not None:
                missing.batch_refused(b.topic, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        elif outcome is Outcome.FATAL:
            err = OutOfOrderSequenceError(msg or f"sequence gap on {b.topic}-{b.partition}")
            self._finish(b, err)
            for other in self.tracker.drop_retries(b.tp):
                self._finish(other, err)
            with self.acc.lock:
                queued = self.acc.remove_partition(b.tp)
            for other in queued:
                self._finish(other, err)
        else:
            err = error_for(code, msg or "")
            if err.retriable:
                err = RequestTimedOutError(f"{b.topic}-{b.partition}: gave up after {err}")
            self._finish(b, err)

    def _finish(self, b: ProducerBatch, err: BaseException) -> None:
        if self.txn is not None:
            self.txn.fail(err)  # the transaction can only abort now
        b.fail(err)
        self._release(b)

    def _release(self, b: ProducerBatch) -> None:
        with self.acc.lock:
            self.acc.release(b)
        self._space_check()

    def _space_check(self) -> None:
        if self.acc.buffered_bytes <= self.buffer_memory:
            self.space.set()

    def _refresh_soon(self, topics: set[str]) -> None:
        """Refresh metadata in the background: one refresh task at a time, owned here."""
        if self._refresh_task is not None and not self._refresh_task.done():
            return
        self._refresh_task = asyncio.create_task(self._refresh(topics))

    async def _refresh(self, topics: set[str]) -> None:
        try:
            await self.cluster.refresh_metadata(topics)
        except LogMQError:
            pass
        self.wakeup.set()
