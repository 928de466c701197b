"""One internal-topic partition's coordinator at run time (a *shard*), for any pure core.

A deterministic core (consumer groups, transactions) decides; this shell feeds it and
makes what it decides durable before anybody hears about it:

* **Load.** On becoming leader of the partition (at one leader epoch: a new epoch means a
  new shard) the shard reads the partition's records (newest value per key) and hands
  them to a *loader* that builds a fresh core. Until then requests get
  COORDINATOR_LOAD_IN_PROGRESS; while loading keeps failing, COORDINATOR_NOT_AVAILABLE.
* **One operation at a time, written in batches.** Every request is an operation on the
  core. One worker runs them in arrival order, so the order of records is the order of
  states. It runs all the operations waiting at that moment, appends their records with
  one append (an operation's records never straddle two batches, so each operation is
  atomic on disk), stamped with the replica's current leader epoch.
* **Answered once replicated.** A round is answered only once an fsync covers its append
  *and* the partition's high watermark has passed it: the records are on the disk of
  every in-sync replica, with min.insync.replicas honoured, exactly as for an acks=all
  produce (``ShardReplication``; a single node is its own ISR). Read-only operations are
  answered once everything they could have seen is that durable, so nobody is ever told
  of a state that a failover could roll back. While one round waits, the worker already
  applies and appends the next ones; their fsync is shared (the log manager's group
  commit) and so is the replication round trip.
* **Side effects after durability.** What a core wants done outside itself (send
  transaction markers) it hands out through ``take_effects``; the shard passes them to
  ``on_effects`` only after the round that produced them is answered, so nothing acts
  on a decision a failover could undo. Effects of a round that was appended but not
  replicated in time wait for the next round that is.
* **Failure.** If a round cannot be appended (no longer leader, too few in-sync replicas,
  a storage error) memory is ahead of the log: its operations fail with that retriable
  error, everything pending fails, the core is dropped and the partition is loaded again
  from the log. If a round was appended but not replicated in time, its operations fail
  (REQUEST_TIMED_OUT: the outcome is unknown, as for a produce) and the shard goes on;
  later rounds wait for the same high watermark.
* **Transactional records.** A core may mark records with a producer id and epoch
  (transactional offset commits): they are appended as that producer's transactional
  batch, so the partition's transaction state covers them and the COMMIT or ABORT
  marker the transaction's coordinator has written here ends them. Loading honours the
  markers in log order: a committed record counts unless a later write of its key came
  first, an aborted one never; records still without a marker go to the subclass's
  ``_replay_open`` after the loader, in log order.
* **Time.** One timer task sleeps until the core's next deadline and runs ``tick`` as an
  ordinary operation. Any change of state may bring a deadline forward, so the worker
  pokes the timer after every round; the timer then looks again, at most every
  ``TIMER_RESOLUTION_S``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Generic, Protocol, Required, TypedDict, TypeVar

from logmq.errors import ErrorCode, LogMQError, StorageError
from logmq.storage import batch as b
from logmq.storage import records_codec
from logmq.storage.log_manager import LogManager
from logmq.storage.partition_log import PartitionLog
from logmq.storage.txn_state import CONTROL_COMMIT, control_record

if TYPE_CHECKING:
    from logmq.broker.replica.replica_manager import ReplicaManager

log = logging.getLogger("logmq.coordinator")

T = TypeVar("T")

MAX_OPS_PER_ROUND = 2000  # bounds the time one round keeps the event loop
MAX_ROUNDS_IN_FLIGHT = 16  # appended rounds waiting for their fsync
BATCH_TARGET_BYTES = 1 << 20  # start a new batch once one holds this much
LOAD_CHUNK_BYTES = 4 << 20
TIMER_RESOLUTION_S = 0.05
LOAD_RETRY_MAX_S = 10.0
HELD_EFFECTS_RETRY_S = 0.1  # after a round with effects was not replicated in time

# The default ``parked_marker``: a core that never parks requests never returns it.
_NEVER_PARKED: Any = object()


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class ShardState(StrEnum):
    LOADING = "loading"
    ACTIVE = "active"
    FAILED = "failed"  # loading failed; retrying with backoff
    UNLOADED = "unloaded"


_UNAVAILABLE = {
    ShardState.LOADING: ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ShardState.FAILED: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ShardState.UNLOADED: ErrorCode.NOT_COORDINATOR,
}


class CoordinatorError(LogMQError):
    """The shard could not carry out an operation; the code says why (mostly retriable)."""


class ShardRecord(Protocol):
    """A record a core asks to append: a key and a value (None: a tombstone)."""

    @property
    def key(self) -> bytes: ...

    @property
    def value(self) -> bytes | None: ...


@dataclass(slots=True, frozen=True)
class OpenTxnRecord:
    """A record of a transactional batch whose producer has no marker in the log yet."""

    offset: int
    producer_id: int
    producer_epoch: int
    key: bytes
    value: bytes | None
    superseded: bool  # a later write of the key is in the log: it wins even on COMMIT


class ShardCore(Protocol):
    """What the shard needs of a core; requests reach the rest of it through operations.

    Not a Ready/Advance pair: a core's changes count at once and leave records, parked
    answers and effects in an outbox that the shard takes after every operation; there
    is nothing to advance, because a round that fails drops the core (docs/design.md,
    "Why sans-IO"). The group and transaction cores implement it.
    """

    def take_records(self) -> Sequence[ShardRecord]:
        """The records of the state changes since the last call (appended in one batch)."""
        ...

    def take_completions(self) -> list[tuple[int, Any]]:
        """(ticket, answer) of parked requests completed since the last call."""
        ...

    def take_effects(self) -> list[Any]:
        """Work to start outside the core once the changes so far are durable."""
        ...

    def next_deadline_ms(self) -> int | None:
        """When ``tick`` should run next (None: nothing is due)."""
        ...

    def tick(self, now_ms: int) -> Any:
        """Act on the deadlines that have passed (as an ordinary operation)."""
        ...


C = TypeVar("C", bound=ShardCore)
# (newest live value of every key, now_ms) -> a loaded core
Loader = Callable[[dict[bytes, bytes], int], C]
Operation = Callable[[C, int], T]  # (core, now_ms) -> answer


class ShardReplication(Protocol):
    """How a shard's appends become durable beyond this broker's disk."""

    def check(self) -> int:
        """Before appending: the leader epoch to stamp, or LogMQError, as for an acks=all
        produce."""
        ...

    def appended(self, plog: PartitionLog) -> None:
        """The shard appended to ``plog`` (the HW may move, reads wake)."""
        ...

    async def replicated(self, offset: int, timeout_ms: int) -> None:
        """Wait until the high watermark reaches ``offset``; LogMQError if it will not."""
        ...


class LeaderReplication:
    """A shard's writes follow the acks=all produce path of the replica manager."""

    def __init__(
        self,
        replicas: ReplicaManager,
        topic: str,
        partition: int,
        get_log: Callable[[], PartitionLog | None],
    ) -> None:
        self._replicas = replicas
        self._key = (topic, partition)
        self._get_log = get_log

    def check(self) -> int:
        plog = self._get_log()
        if plog is None:
            raise LogMQError(
                f"{self._key[0]}-{self._key[1]} is not here", ErrorCode.NOT_LEADER_OR_FOLLOWER
            )
        return self._replicas.check_append(self._key, -1, plog.config.min_insync_replicas)

    def appended(self, plog: PartitionLog) -> None:
        self._replicas.on_append(self._key, plog)

    async def replicated(self, offset: int, timeout_ms: int) -> None:
        await self._replicas.wait_replicated(self._key, offset, timeout_ms)


class ShardOptions(TypedDict, total=False):
    """The keyword arguments a domain's shard (groups, transactions) passes on to
    :class:`CoordinatorShard` unchanged: how it replicates, and the defaults below."""

    replication: Required[ShardReplication]
    leader_epoch: int  # 0
    replication_timeout_ms: int  # 5_000
    clock: Callable[[], int]  # wall_clock_ms


# What an append or replication error means to a coordinator request (all retriable);
# a shard may pass its own mapping.
APPEND_ERRORS: Mapping[ErrorCode, ErrorCode] = {
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.NOT_ENOUGH_REPLICAS,
}


@dataclass(slots=True)
class _Op:
    fn: Operation[Any, Any]
    future: asyncio.Future[Any]


@dataclass(slots=True)
class _Round:
    """Operations applied together, and the log end offset their answers wait for."""

    answers: list[tuple[_Op, Any]]
    end_offset: int  # the log end offset after the round: answers wait for the HW there
    wrote: bool
    deadline: float  # loop time by which the round must be replicated
    completions: list[tuple[int, Any]]  # parked requests this round answered (ticket, answer)
    effects: list[Any]  # to start once the round is durable


@dataclass(slots=True)
class _Run(Generic[C]):
    """Everything that lives as long as one loaded core; replaced on every reload."""

    core: C
    plog: PartitionLog
    queue: collections.deque[_Op] = field(default_factory=collections.deque)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    timer_poke: asyncio.Event = field(default_factory=asyncio.Event)
    rounds: asyncio.Queue[_Round] = field(
        default_factory=lambda: asyncio.Queue(MAX_ROUNDS_IN_FLIGHT)
    )
    syncing: _Round | None = None  # the round the completer waits on
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # requests parked in the core, by ticket
    parked: dict[int, asyncio.Future[Any]] = field(default_factory=dict)
    tickets: Iterator[int] = field(default_factory=itertools.count)
    # effects of rounds appended but not (yet) known to be replicated
    held_effects: list[Any] = field(default_factory=list)
    held_retry: bool = False  # a round to retry them is scheduled
    # tasks started for effects of this core: they end with it
    side_tasks: set[asyncio.Task[Any]] = field(default_factory=set)


class CoordinatorShard(Generic[C]):
    """The coordinator of what one partition of an internal topic holds.

    ``loader`` builds a core from the partition's newest value per key; ``kind`` names
    the shard in task names and logs ("group", "txn"); ``error_map`` says what an
    append or replication error means to the shard's clients; ``on_effects`` receives
    the core's effects of each round once that round is durable and answered;
    ``parked_marker`` is what an operation of ``submit_parked`` returns for a request
    the core parks (completed later through ``take_completions``).
    """

    def __init__(
        self,
        topic: str,
        partition: int,
        logs: LogManager,
        get_log: Callable[[], PartitionLog | None],
        loader: Loader[C],
        *,
        replication: ShardReplication,
        leader_epoch: int = 0,
        replication_timeout_ms: int = 5_000,
        clock: Callable[[], int] = wall_clock_ms,
        on_effects: Callable[[list[Any]], None] | None = None,
        error_map: Mapping[ErrorCode, ErrorCode] = APPEND_ERRORS,
        parked_marker: Any = _NEVER_PARKED,
        kind: str = "coordinator",
        logger: logging.Logger = log,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.leader_epoch = leader_epoch
        self._replication = replication
        self._replication_timeout_ms = replication_timeout_ms
        self._logs = logs
        self._get_log = get_log
        self._loader = loader
        self._clock = clock
        self._on_effects = on_effects
        self._error_map = error_map
        self._parked_marker = parked_marker
        self._kind = kind
        self._log = logger
        self.state = ShardState.UNLOADED
        self.last_error = ""
        self._run: _Run[C] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def name(self) -> str:
        """The partition, as logs and messages name it."""
        return f"{self.topic}-{self.partition}"

    # -- lifecycle ----------------------------------------------------------------------
    def load(self) -> None:
        """Become the coordinator: replay the partition in an owned task."""
        if self.state is not ShardState.UNLOADED:
            return
        self._start_loading()

    async def unload(self) -> None:
        """Stop coordinating: pending requests get NOT_COORDINATOR, tasks end."""
        run = self._run
        self.state = ShardState.UNLOADED
        if run is not None:
            self._abandon(run, ErrorCode.NOT_COORDINATOR, "the coordinator moved or stopped")
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=f"{name}-{self.partition}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def spawn_side_task(self, coro: Any, name: str) -> asyncio.Task[Any] | None:
        """Run ``coro`` for as long as the current core lives (cancelled when it is
        dropped by a reload or an unload); None, and ``coro`` closed, if none is loaded.

        For effects: their work belongs to the decisions of one core, and a reload's
        core derives from the log whatever work is still owed.
        """
        run = self._run
        if run is None:
            coro.close()
            return None
        task = self._spawn(coro, name)
        run.side_tasks.add(task)
        task.add_done_callback(run.side_tasks.discard)
        return task

    def _start_loading(self) -> None:
        self.state = ShardState.LOADING
        self._spawn(self._load(), f"{self._kind}-load")

    # -- requests -----------------------------------------------------------------------
    def check_available(self) -> None:
        """Raise CoordinatorError with the retriable code of a shard that is not active."""
        if self.state is ShardState.ACTIVE:
            return
        message = f"the coordinator of {self.name} is {self.state}"
        if self.state is ShardState.FAILED:
            message += f" ({self.last_error})"
        raise CoordinatorError(message, _UNAVAILABLE[self.state])

    def submit(self, fn: Operation[C, T]) -> asyncio.Future[T]:
        """Queue ``fn(core, now_ms)``; the future has its answer once it is on disk.

        Synchronous on purpose: requests of one connection enqueue in arrival order
        even when their handlers run concurrently. Raises CoordinatorError
        when the shard is not active; the future fails with it if the shard has to
        reload before the operation is durable.
        """
        self.check_available()
        run = self._run
        assert run is not None
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        run.queue.append(_Op(fn, future))
        run.wakeup.set()
        return future

    def submit_parked(self, fn: Callable[[C, int, int], Any]) -> asyncio.Future[Any]:
        """Queue ``fn(core, now_ms, ticket)`` for a request the core may park.

        The future gets the answer ``fn`` returns, or, if that is the parked marker, the
        answer the core later completes the ticket with (another request or a tick
        does), each only once the round that produced it is durable.
        """
        self.check_available()
        run = self._run
        assert run is not None
        ticket = next(run.tickets)
        result: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        run.parked[ticket] = result
        op = self.submit(lambda core, now_ms: fn(core, now_ms, ticket))
        parked_marker = self._parked_marker

        def settle(f: asyncio.Future[Any]) -> None:
            if f.cancelled():
                run.parked.pop(ticket, None)
                result.cancel()
            elif (exc := f.exception()) is not None:
                run.parked.pop(ticket, None)
                if not result.done():
                    result.set_exception(exc)
            elif f.result() is not parked_marker:
                run.parked.pop(ticket, None)
                if not result.done():
                    result.set_result(f.result())

        op.add_done_callback(settle)
        return result

    def submit_background(self, fn: Operation[C, Any], what: str) -> None:
        """Queue an operation nobody waits for (metadata changes, ticks); log failures."""
        try:
            future = self.submit(fn)
        except CoordinatorError:
            return  # a (re)load applies the current state anyway
        future.add_done_callback(lambda f: self._log_failure(f, what))

    def _log_failure(self, future: asyncio.Future[Any], what: str) -> None:
        if future.cancelled() or (exc := future.exception()) is None:
            return
        # Leadership moving on is no problem: the next coordinator runs the same update
        # after loading. Anything else is worth a warning.
        moved = isinstance(exc, LogMQError) and exc.code is ErrorCode.NOT_COORDINATOR
        self._log.log(
            logging.DEBUG if moved else logging.WARNING,
            "%s on %s failed: %s",
            what,
            self.name,
            exc,
        )

    # -- hooks for subclasses -----------------------------------------------------------
    def _after_load(self, core: C) -> Operation[C, Any]:
        """The first operation of a new core. It also makes effects the loader produced
        wait until everything the load read is replicated (a no-op by default)."""
        return _noop

    def _loaded(self, core: C) -> None:
        """Called once a core is active (for logging)."""

    def _log_loaded(self, count: int, what: str) -> None:
        """For ``_loaded``: how many ``what`` the new core holds (INFO unless none)."""
        level = logging.INFO if count else logging.DEBUG
        self._log.log(level, "loaded %d %s of %s", count, what, self.name)

    def _ticked(self, result: Any) -> None:
        """What ``core.tick`` returned (for logging)."""

    def _replay_open(self, core: C, records: list[OpenTxnRecord]) -> None:
        """Give a freshly loaded core the records of transactions still open in the log
        (a core that never writes transactional records has none)."""
        if records:
            self._log.warning(
                "%s: %d records of open transactions ignored", self.name, len(records)
            )

    # -- loading ------------------------------------------------------------------------
    async def _load(self) -> None:
        delay = 0.1
        while True:
            try:
                plog = self._get_log()
                if plog is None:
                    raise StorageError(f"{self.name} is offline")
                newest, open_records = await self._read_partition(plog)
                core = self._loader(newest, self._clock())
                self._replay_open(core, open_records)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.state = ShardState.FAILED
                self.last_error = f"{type(exc).__name__}: {exc}"
                self._log.error(
                    "cannot load %s (retry in %.1fs): %s", self.name, delay, self.last_error
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, LOAD_RETRY_MAX_S)
                self.state = ShardState.LOADING
        run: _Run[C] = _Run(core, plog)
        self._run = run
        self.state = ShardState.ACTIVE
        self.last_error = ""
        run.tasks = [
            self._spawn(self._work(run), f"{self._kind}-worker"),
            self._spawn(self._complete(run), f"{self._kind}-completer"),
            self._spawn(self._timer(run), f"{self._kind}-timer"),
        ]
        for task in run.tasks:
            task.add_done_callback(lambda t: self._check_task(run, t))
        self.submit_background(self._after_load(core), "first operation after load")
        self._loaded(core)

    async def _read_partition(
        self, plog: PartitionLog
    ) -> tuple[dict[bytes, bytes], list[OpenTxnRecord]]:
        """The newest value of every key (keys whose newest is a tombstone left out), and
        the records of transactions still open.

        Transactional records wait for their producer's marker: COMMIT makes each count
        at its own position (unless a later write of its key was already seen), ABORT
        drops them. Nothing else appends while the shard loads (it is the only writer
        of records and refuses work until loaded; a marker landing meanwhile is
        delivered to the loaded core afterwards), so reading up to the end offset seen
        at the start reads everything. File reads run in a worker thread, chunk by chunk.
        """
        newest: dict[bytes, tuple[int, bytes | None]] = {}  # key -> (offset, value)
        # producer id -> key -> (offset, epoch, value) of its open transaction
        open_txns: dict[int, dict[bytes, tuple[int, int, bytes | None]]] = {}
        offset, end = plog.log_start_offset, plog.log_end_offset
        while offset < end:
            region = plog.read(offset, LOAD_CHUNK_BYTES, max_offset=end)
            if region is None or region.length == 0:
                break
            data = await asyncio.to_thread(region.read)
            next_offset = offset
            for pos, header in b.iter_headers(data):
                b.validate(data, pos, contiguous=False)
                if header.next_offset <= offset:
                    continue  # a batch before the one we asked for
                next_offset = header.next_offset
                pid = header.producer_id
                if header.attributes & b.ATTR_CONTROL:
                    if pid >= 0:
                        ended = open_txns.pop(pid, {})
                        if control_record(data, pos, verify=False).type == CONTROL_COMMIT:
                            for key, (at, _, value) in ended.items():
                                if newest.get(key, (-1, None))[0] < at:
                                    newest[key] = (at, value)
                    continue
                txn = (
                    open_txns.setdefault(pid, {})
                    if header.attributes & b.ATTR_TRANSACTIONAL and pid >= 0
                    else None
                )
                for row in b.decode_rows(data, pos, header):
                    key, at = row[2], header.base_offset + row[0]
                    if not isinstance(key, bytes) or at < offset:
                        continue
                    if txn is None:
                        newest[key] = (at, row[3])
                    else:
                        txn.pop(key, None)  # keep log order: the newest last
                        txn[key] = (at, header.producer_epoch, row[3])
            if next_offset <= offset:
                raise StorageError(f"no progress reading {self.name} at {offset}")
            offset = next_offset
        still_open = sorted(
            (
                OpenTxnRecord(at, pid, epoch, key, value, newest.get(key, (-1, None))[0] > at)
                for pid, records in open_txns.items()
                for key, (at, epoch, value) in records.items()
            ),
            key=lambda r: r.offset,
        )
        live = {k: v for k, (_, v) in newest.items() if v is not None}
        return live, still_open

    # -- the worker ---------------------------------------------------------------------
    async def _work(self, run: _Run[C]) -> None:
        """Apply queued operations in order, append their records, hand rounds on."""
        while True:
            while not run.queue:
                run.wakeup.clear()
                await run.wakeup.wait()
            ops = [run.queue.popleft() for _ in range(min(len(run.queue), MAX_OPS_PER_ROUND))]
            now = self._clock()
            answers: list[tuple[_Op, Any]] = []
            completions: list[tuple[int, Any]] = []
            effects: list[Any] = []
            batches: list[list[ShardRecord]] = [[]]
            size = 0
            for i, op in enumerate(ops):
                try:
                    answer = op.fn(run.core, now)
                except Exception as exc:  # a bug: the core's state is unknown now
                    self._log.exception("%s operation failed on %s", self._kind, self.name)
                    reason = f"{type(exc).__name__}: {exc}"
                    for failed in ops[i:]:
                        _fail(failed.future, ErrorCode.UNKNOWN_SERVER_ERROR, reason)
                    self._reload(run, answers, f"operation failed: {reason}")
                    return
                answers.append((op, answer))
                completions += run.core.take_completions()
                effects += run.core.take_effects()
                records = run.core.take_records()
                if records:
                    if size >= BATCH_TARGET_BYTES:
                        batches.append([])
                        size = 0
                    batches[-1] += records
                    size += sum(len(r.key) + len(r.value or b"") for r in records)
            wrote = bool(batches[0])
            if wrote:
                try:
                    epoch = self._replication.check()
                except LogMQError as exc:
                    # Nothing appended, but the core applied it: rebuild it from the log.
                    code = self._map_error(exc.code)
                    reason = f"{self.name} cannot take writes: {code.name}"
                    self._reload(run, answers, reason, code)
                    return
                try:
                    sequences: dict[int, tuple[int, int]] = {}
                    data = b"".join(
                        encode_shard_batches(batch, now, run.plog, sequences) for batch in batches
                    )
                    run.plog.append(data, leader_epoch=epoch)
                except Exception as exc:
                    self._log.error("append to %s failed, reloading: %s", self.name, exc)
                    self._reload(run, answers, f"append failed: {exc}")
                    return
                self._replication.appended(run.plog)
            # a write, or a request that parks, may have brought a deadline forward
            run.timer_poke.set()
            deadline = asyncio.get_running_loop().time() + self._replication_timeout_ms / 1000
            await run.rounds.put(
                _Round(answers, run.plog.log_end_offset, wrote, deadline, completions, effects)
            )

    async def _complete(self, run: _Run[C]) -> None:
        """Answer rounds in order, each once fsynced and replicated past its records."""
        loop = asyncio.get_running_loop()
        while True:
            round_ = run.syncing = await run.rounds.get()
            if round_.end_offset > run.plog.recovery_point:
                try:
                    await self._logs.sync(run.plog)
                except Exception as exc:
                    self._log.error("fsync of %s failed, reloading: %s", self.name, exc)
                    self._reload(run, [], f"fsync failed: {exc}")
                    return
            error = ErrorCode.NONE
            if round_.wrote or run.plog.high_watermark < round_.end_offset:
                remaining_ms = max(0, int((round_.deadline - loop.time()) * 1000))
                try:
                    await self._replication.replicated(round_.end_offset, remaining_ms)
                except LogMQError as exc:
                    error = exc.code
            run.syncing = None
            if error is not ErrorCode.NONE:
                code = self._map_error(error)
                what = "write" if round_.wrote else "read"
                reason = (
                    f"{self._kind} {what} on {self.name} not replicated to the in-sync "
                    f"replicas up to offset {round_.end_offset}: {error.name}"
                )
                for op, _ in round_.answers:
                    _fail(op.future, code, reason)
                for ticket, _ in round_.completions:
                    if (parked := run.parked.pop(ticket, None)) is not None:
                        _fail(parked, code, reason)
                if round_.effects or run.held_effects:
                    # Appended, maybe durable later: a later round that is replicated
                    # covers these records too, and delivers the effects then.
                    run.held_effects += round_.effects
                    if not run.held_retry:
                        run.held_retry = True
                        loop.call_later(HELD_EFFECTS_RETRY_S, self._retry_held, run)
                continue
            for op, answer in round_.answers:
                if not op.future.done():
                    op.future.set_result(answer)
            for ticket, answer in round_.completions:
                parked = run.parked.pop(ticket, None)
                if parked is not None and not parked.done():
                    parked.set_result(answer)
            effects = run.held_effects + round_.effects
            run.held_effects = []
            if effects and self._on_effects is not None:
                try:
                    self._on_effects(effects)
                except Exception:
                    self._log.exception("effects of %s failed", self.name)

    async def _timer(self, run: _Run[C]) -> None:
        """Run ``tick`` when the core's earliest deadline passes."""
        ticked_at: int | None = None
        while True:
            deadline = run.core.next_deadline_ms()
            now = self._clock()
            if deadline is not None and deadline <= now:
                if deadline == ticked_at:  # the tick did not move it: do not spin
                    await asyncio.sleep(TIMER_RESOLUTION_S)
                ticked_at = deadline
                try:
                    await self.submit(self._tick)
                except CoordinatorError:
                    if self._run is not run:
                        return  # reloading or unloaded: the next run has its own timer
                    await asyncio.sleep(TIMER_RESOLUTION_S)  # not replicated: try again
                continue
            run.timer_poke.clear()
            delay = None if deadline is None else (deadline - now) / 1000
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await run.timer_poke.wait()
            if run.timer_poke.is_set():
                # A request may have brought a deadline forward; looking may cost a pass
                # over the core's state, so look at most this often.
                await asyncio.sleep(TIMER_RESOLUTION_S)

    def _retry_held(self, run: _Run[C]) -> None:
        """A round to learn whether held effects' records got replicated after all."""
        run.held_retry = False
        if self._run is not run or not run.held_effects:
            return
        try:
            future = self.submit(_noop)
        except CoordinatorError:
            return
        # its failure only means "not yet": the completer schedules the next try
        future.add_done_callback(lambda f: f.cancelled() or f.exception())

    def _tick(self, core: C, now_ms: int) -> None:
        self._ticked(core.tick(now_ms))

    # -- failure ------------------------------------------------------------------------
    def _map_error(self, code: ErrorCode) -> ErrorCode:
        return self._error_map.get(code, code)

    def _check_task(self, run: _Run[C], task: asyncio.Task[None]) -> None:
        """A task of the run died of a bug: nobody would answer any more, so reload."""
        if task.cancelled() or task.exception() is None:
            return
        self._log.error(
            "%s died, reloading the coordinator",
            task.get_name(),
            exc_info=task.exception(),
        )
        self._reload(run, [], f"internal error: {task.exception()!r}")

    def _reload(
        self,
        run: _Run[C],
        answers: list[tuple[_Op, Any]],
        reason: str,
        code: ErrorCode = ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ) -> None:
        """Memory may be ahead of the log: fail what is pending, load again."""
        if self._run is not run:
            return
        for op, _ in answers:
            _fail(op.future, code, reason)
        self._abandon(run, ErrorCode.COORDINATOR_NOT_AVAILABLE, reason)
        self.last_error = reason
        if self.state is ShardState.ACTIVE:
            self._start_loading()

    def _abandon(self, run: _Run[C], code: ErrorCode, reason: str) -> None:
        """Fail every operation of ``run`` not answered yet and stop its tasks."""
        if self._run is run:
            self._run = None
        while run.queue:
            _fail(run.queue.popleft().future, code, reason)
        rounds = [run.syncing] if run.syncing is not None else []
        while not run.rounds.empty():
            rounds.append(run.rounds.get_nowait())
        for round_ in rounds:
            for op, _ in round_.answers:
                _fail(op.future, code, reason)
        for parked in run.parked.values():  # the core that would complete them is gone
            _fail(parked, code, reason)
        run.parked.clear()
        run.held_effects.clear()  # a reload derives what is still owed from the log
        current = asyncio.current_task()
        for task in [*run.tasks, *run.side_tasks]:
            if task is not current:
                task.cancel()


def _noop(core: Any, now_ms: int) -> None:
    return None


def _fail(future: asyncio.Future[Any], code: ErrorCode, message: str) -> None:
    if not future.done():
        future.set_exception(CoordinatorError(message, code))


def encode_records(records: Sequence[ShardRecord], now_ms: int) -> bytes:
    """One batch holding ``records`` (offset deltas from 0, timestamps ``now_ms``)."""
    rows = [[i, 0, r.key, r.value, None] for i, r in enumerate(records)]
    return b.encode_rows(rows, first_timestamp=now_ms)


_SEQ_MOD = 1 << 31


def encode_shard_batches(
    records: Sequence[ShardRecord],
    now_ms: int,
    plog: PartitionLog | None = None,
    sequences: dict[int, tuple[int, int]] | None = None,
) -> bytes:
    """``records`` as batches: runs of plain records in one batch each, and each run of
    records a core marked with a producer id (``producer_id``/``producer_epoch``
    attributes) as that producer's transactional batch.

    A transactional batch carries the sequence number the partition expects next from
    its producer (else the partition's idempotence check would take a second batch
    without one for a retry of the first): taken from ``plog``'s producer state, and
    advanced in ``sequences`` (producer id -> (epoch, next sequence)) for the batches of
    one append.
    """
    if all(getattr(r, "producer_id", -1) < 0 for r in records):
        return encode_records(records, now_ms)  # the usual case: one plain batch
    sequences = {} if sequences is None else sequences
    out: list[bytes] = []
    run: list[ShardRecord] = []
    run_key: tuple[int, int] = (-1, -1)
    for record in [*records, None]:
        key = (
            (-1, -1)
            if record is None
            else (getattr(record, "producer_id", -1), getattr(record, "producer_epoch", -1))
        )
        if run and (record is None or key != run_key):
            pid, epoch = run_key
            if pid < 0:
                out.append(encode_records(run, now_ms))
            else:
                seq = _next_sequence(plog, pid, epoch, sequences)
                sequences[pid] = (epoch, (seq + len(run)) % _SEQ_MOD)
                rows = [(i, 0, r.key, r.value, None) for i, r in enumerate(run)]
                out.append(
                    b.assemble(
                        records_codec.encode_rows(rows),
                        count=len(rows),
                        last_offset_delta=len(rows) - 1,
                        first_timestamp=now_ms,
                        max_timestamp=now_ms,
                        attributes=b.ATTR_TRANSACTIONAL,
                        producer_id=pid,
                        producer_epoch=epoch,
                        base_sequence=seq,
                    )
                )
            run = []
        if record is not None:
            run.append(record)
            run_key = key
    return b"".join(out)


def _next_sequence(
    plog: PartitionLog | None, pid: int, epoch: int, sequences: dict[int, tuple[int, int]]
) -> int:
    staged = sequences.get(pid)
    if staged is not None and staged[0] == epoch:
        return staged[1]
    entry = None if plog is None else plog.producer_state.producers.get(pid)
    if entry is None or entry.epoch != epoch or not entry.batches:
        return 0
    last = entry.batches[-1].last_seq
    return 0 if last < 0 else (last + 1) % _SEQ_MOD
