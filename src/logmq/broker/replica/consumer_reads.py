"""A consumer's fetches: what it may read of the partitions this broker leads.

Reads go below each partition's high watermark (read_committed: below its last stable
offset, with the aborted transactions of what was read), from the leader only, fenced by
the leader epoch the consumer knows (``ReplicaManager.leader_log``), and long-poll on
appends until enough bytes are there. A fetch session's reads take only its ready
partitions (broker/replica/fetch_sessions.py). The answer's record bytes are file regions, never
decoded here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from logmq.broker.replica.fetch_results import PartitionRead, TopicRead, failed
from logmq.broker.replica.remote_reads import list_offset
from logmq.errors import ErrorCode, LogMQError
from logmq.gcpause import gc_paused

if TYPE_CHECKING:
    from logmq.broker.replica.fetch_sessions import FetchSession, SessionPartition
    from logmq.broker.replica.remote_reads import RemoteReads
    from logmq.broker.replica.replica_manager import ReplicaManager

NO_ERROR = ErrorCode.NONE
TopicPartition = tuple[str, int]


class _RemoteRead(NamedTuple):
    """A partition of a fetch whose records the remote tier reads (filled in later)."""

    read: PartitionRead
    plog: Any
    offset: int
    max_bytes: int
    upper: int

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.plog.topic, self.plog.partition, self.offset)


def _drop_result(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a late read's failure was counted by the manager


# a remote read's answer nobody came back for is dropped this long after it finished
# (its chunks stay in the reader's cache)
REMOTE_RESULT_KEEP_S = 30.0
_RemoteKey = tuple[str, int, int, bool]  # topic, partition, offset, read_committed


class ConsumerReads:
    """Consumers' fetches over the replica manager's leadership and the local logs.

    ``remote`` (RemoteReads, when the broker tiers) answers reads below a tiered
    partition's local log start: those partitions' records come from the remote tier
    after the local ones are read, within ``remote_fetch_max_wait_ms`` (Kafka's
    remote.fetch.max.wait.ms); a store slower than that answers the partition empty
    while its read goes on, and the consumer's next fetch of that offset takes its
    answer. A fetch that has local records to give does not wait for the store at all,
    and one waiting for it answers as soon as its local partitions get records: a slow
    store never holds back local data, in the same fetch or on the same connection.
    """

    def __init__(
        self,
        replicas: ReplicaManager,
        remote: RemoteReads | None = None,
        remote_fetch_max_wait_ms: int = 500,
    ) -> None:
        self.replicas = replicas
        self.logs = replicas.logs
        self.waiters = replicas.waiters
        self.remote = remote
        self.remote_fetch_max_wait_ms = remote_fetch_max_wait_ms
        # remote reads by what they read: a fetch that gave up waiting leaves its read
        # here for the next fetch of the same offset, which never starts another
        self._remote_reads: dict[_RemoteKey, asyncio.Future[Any]] = {}

    async def fetch_for_consumer(
        self,
        wanted,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        *,
        committed: bool = False,
    ) -> list[TopicRead]:
        """A consumer's fetch: read below the HW (``committed``: read_committed, below
        the LSO, with the aborted transactions of what it read), long-polling on
        appends until ``min_bytes`` are there, an error is, or ``max_wait_ms`` has
        passed."""
        loop = self.replicas.loop()
        deadline = loop.time() + max_wait_ms / 1000
        remote_deadline = loop.time() + self.remote_fetch_max_wait_ms / 1000
        tps = [(name, p[0]) for name, parts in wanted for p in parts]
        while True:
            pending: list[_RemoteRead] = []
            topics, total, any_error = self._read_for_consumer(
                wanted, max_bytes, committed=committed, pending=pending
            )
            if pending:
                keys = {r.key[:2] for r in pending}
                local = [tp for tp in tps if tp not in keys]
                if await self._read_remote(pending, committed, total, local, remote_deadline):
                    return topics
                continue  # local records came while the store was slow: read them
            remaining = deadline - loop.time()
            if total >= min_bytes or any_error or remaining <= 0 or not tps:
                return topics
            if not await self.waiters.wait(tps, remaining):
                # timed out; one last read so the answer is current
                return self._read_for_consumer(wanted, max_bytes, committed=committed)[0]

    async def fetch_session_for_consumer(
        self,
        session: FetchSession,
        full: bool,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        admit: Callable[[list[TopicRead]], bool] | None = None,
        *,
        committed: bool = False,
    ) -> list[TopicRead] | None:
        """A consumer's fetch in a session (fetch_sessions.py): reads only the session's
        ready partitions, and an incremental answer only those with something new.

        ``admit(read)`` False (a client over its fetch quota) answers None and leaves the
        session as it was, so the next fetch reads the same partitions: Kafka's
        throttled answer is empty and does not update the session either."""
        loop = self.replicas.loop()
        deadline = loop.time() + max_wait_ms / 1000
        remote_deadline = loop.time() + self.remote_fetch_max_wait_ms / 1000
        more = self._below_lso if committed else self._below_hw
        while True:
            pending: list[_RemoteRead] = []
            topics, total, any_error = self._read_for_consumer(
                session.to_read(),
                max_bytes,
                partial=not full,
                committed=committed,
                pending=pending,
            )
            if pending:
                keys = {r.key[:2] for r in pending}
                local = [tp for tp in session.partitions if tp not in keys]
                if await self._read_remote(pending, committed, total, local, remote_deadline):
                    break
                continue
            remaining = deadline - loop.time()
            if full or total >= min_bytes or any_error or remaining <= 0:
                break
            session.settle(topics, more)
            if not await self.waiters.wait_session(session, remaining):
                topics = self._read_for_consumer(
                    session.to_read(), max_bytes, partial=not full, committed=committed
                )[0]
                break
        if admit is not None and not admit(topics):
            return None
        return session.answered(topics, full, more)

    def _below_hw(self, tp: TopicPartition, sp: SessionPartition) -> bool:
        plog = self.logs.get_log(*tp)
        return plog is not None and sp.fetch_offset < plog.high_watermark

    def _below_lso(self, tp: TopicPartition, sp: SessionPartition) -> bool:
        plog = self.logs.get_log(*tp)
        return plog is not None and sp.fetch_offset < plog.last_stable_offset

    async def list_offset(self, plog: Any, ts: int, committed: bool) -> tuple[int, int]:
        """ListOffsets for one partition, both doors: over both tiers when it tiers."""
        if plog is None:
            raise LogMQError("unknown partition", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        return await list_offset(self.remote, plog, ts, committed)

    def _remote_read(self, r: _RemoteRead, committed: bool) -> asyncio.Future[Any]:
        """The read of ``r``'s offset: the one a previous fetch left going, or a new one."""
        key = (*r.key, committed)
        task = self._remote_reads.get(key)
        if task is None:
            remote = self.remote
            assert remote is not None
            task = asyncio.ensure_future(
                remote.read(r.plog, r.offset, r.max_bytes, r.upper, committed)
            )
            self._remote_reads[key] = task
            task.add_done_callback(_drop_result)
            task.add_done_callback(lambda t, k=key: self._forget_later(k, t))
        return task

    def _forget_later(self, key: _RemoteKey, task: asyncio.Future[Any]) -> None:
        def forget() -> None:
            if self._remote_reads.get(key) is task:
                del self._remote_reads[key]

        asyncio.get_running_loop().call_later(REMOTE_RESULT_KEEP_S, forget)

    async def _read_remote(
        self,
        pending: list[_RemoteRead],
        committed: bool,
        local_bytes: int,
        local: list[TopicPartition],
        deadline: float,
    ) -> bool:
        """Fill in the partitions whose records are in the remote tier (concurrently).

        With local records in hand (``local_bytes`` beyond the remote reads' reserved
        budget) only reads already done are taken; otherwise the store gets up to
        remote.fetch.max.wait.ms (until ``deadline``, once per fetch), cut short by an
        append to a ``local`` partition.
        False when that append came first: the caller reads again (the remote reads go
        on, and its next round takes them). A read not done is answered empty."""
        reads = {self._remote_read(r, committed): r for r in pending}
        reserved = sum(r.max_bytes for r in pending)
        if local_bytes <= reserved:
            loop = asyncio.get_running_loop()
            appended = asyncio.ensure_future(
                self.waiters.wait(local, deadline - loop.time())
            ) if local else None  # fmt: skip
            try:
                waiting = set(reads)
                while waiting and (remaining := deadline - loop.time()) > 0:
                    watch = waiting if appended is None else waiting | {appended}
                    done, _ = await asyncio.wait(
                        watch, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                    )
                    if appended is not None and appended in done:
                        if appended.result():
                            return False
                        appended = None  # timed out or shut down: wait on the reads alone
                    waiting -= done
            finally:
                if appended is not None and not appended.done():
                    appended.cancel()
        for task, r in reads.items():
            if not task.done():
                continue  # answered empty; the next fetch of this offset takes it
            if self._remote_reads.get((*r.key, committed)) is task:
                del self._remote_reads[(*r.key, committed)]
            exc = task.exception()
            if exc is None:
                r.read.records, r.read.aborted = task.result()
            else:
                code = exc.code if isinstance(exc, LogMQError) else ErrorCode.STORAGE_ERROR
                r.read.error, r.read.message = code, str(exc)
        return True

    @gc_paused()  # an entry and a region per partition: logmq/gcpause.py
    def _read_for_consumer(
        self,
        wanted,
        max_bytes: int,
        *,
        partial: bool = False,
        committed: bool = False,
        pending: list[_RemoteRead] | None = None,
    ) -> tuple[list[TopicRead], int, bool]:
        """Read ``wanted`` below each HW, within ``max_bytes``. ``partial`` (an
        incremental session answer) stops at the partition that finds the budget
        spent: the rest stay ready in the session for the next fetch, so a consumer
        catching up on 10,000 partitions pays per fetch for what fits, not for all.
        ``committed`` (read_committed): below each LSO instead, with the aborted
        transactions of the records read. ``pending`` collects the reads the remote tier
        answers (below a tiered partition's local log start), each with its budget
        reserved; without it (no remote tier) every read is local."""
        remote = self.remote if pending is not None else None
        topics: list[TopicRead] = []
        total = 0
        any_error = False
        budget = max_bytes
        for name, parts in wanted:
            results = []
            for partition, offset, pmax, epoch in parts:
                if partial and budget == 0 and total:
                    break
                try:
                    plog = self.replicas.leader_log(name, partition, epoch)
                    hw = plog.high_watermark
                    start = plog.log_start_offset
                    tiered = remote is not None and plog.remote_managed
                    if tiered:
                        start = remote.log_start_offset(plog)
                    # Valid up to the log end (as Kafka does): a new leader's HW may lag
                    # what its predecessor exposed, and a consumer there must wait, not
                    # reset. It reads only below the HW.
                    if not start <= offset <= plog.log_end_offset:
                        raise LogMQError(
                            f"offset {offset} is outside [{start}, {plog.log_end_offset}] "
                            f"of {name}-{partition}",
                            ErrorCode.OFFSET_OUT_OF_RANGE,
                        )
                    region = None
                    limit = min(pmax, budget)
                    lso = plog.last_stable_offset
                    upper = lso if committed else hw
                    if tiered and offset < upper and offset < plog.log_start_offset:
                        if limit > 0 or total == 0:
                            pr = PartitionRead(partition, NO_ERROR, hw, start, None, None, lso)
                            pending.append(_RemoteRead(pr, plog, offset, max(limit, 1), upper))
                            results.append(pr)
                            total += max(limit, 1)  # reserved: its size is known once read
                            budget = max(0, budget - limit)
                            continue
                    elif offset < upper and (limit > 0 or total == 0):
                        region = plog.read(offset, max(limit, 1), max_offset=upper)
                        if region is not None and total and region.length > limit:
                            # A read's first batch comes whole even when too big, which
                            # only the answer's first records may be (Kafka's rule: a
                            # client sizes its buffer by max_bytes); this one waits for
                            # a fetch where it comes first.
                            if region.length > budget:
                                budget = 0  # spent: the rest go to later fetches
                            region = None
                        if region is not None:
                            if region.length > 0:
                                total += region.length
                                budget = max(0, budget - region.length)
                            else:
                                region = None
                    aborted = None
                    if committed and region is not None:
                        aborted = plog.aborted_transactions(offset, region.end_offset) or None
                    results.append(
                        PartitionRead(partition, NO_ERROR, hw, start, region, None, lso, aborted)
                    )
                except LogMQError as e:
                    any_error = True
                    results.append(failed(partition, e.code, str(e)))
            if results or not partial:
                topics.append((name, results))
            if partial and budget == 0 and total:
                break
        return topics, total, any_error
