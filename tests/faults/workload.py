"""The fault workload: producers, consumers and a nemesis against real brokers.

``Workload.run`` drives a ``Cluster`` (processes.py) for a bounded time: N producer
tasks (AsyncProducer, idempotent, each value unique) record every send and its outcome
into a History; consumer tasks record every record they read; a Nemesis (nemesis.py)
carries out a fault schedule made from a seed. When the time is up the nemesis heals
everything, producers wait (bounded by their delivery timeout) for what they sent, and
a final full read of every partition completes the history for ``History.check()``.
Producers draw their partitions from generators seeded with the same seed.

``Workload.live()`` runs the same producers and readers for as long as a test body
takes instead (the body acts on the cluster itself, e.g. moves partitions); a
``GroupReaders`` is a consumer group reading along into the same History, and
``prefill`` puts recorded data into a partition beforehand.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from logmq import AsyncAdmin, AsyncConsumer, AsyncProducer, GroupDescription
from logmq.errors import ErrorCode, LogMQError
from tests.faults.history import History
from tests.faults.nemesis import Nemesis, Step, wait_until
from tests.faults.processes import Cluster

EARLIEST, LATEST = -2, -1  # ListOffsets' special timestamps

#: Errors after which the record was certainly not written: the broker rejects these
#: batches whole, every time. Anything else (timeouts, lost connections, errors after
#: retries) leaves the outcome unknown.
DEFINITE_FAILURES = frozenset(
    {
        ErrorCode.MESSAGE_TOO_LARGE,
        ErrorCode.RECORD_LIST_TOO_LARGE,
        ErrorCode.INVALID_RECORD,
        ErrorCode.INVALID_TOPIC_EXCEPTION,
        ErrorCode.INVALID_REQUIRED_ACKS,
    }
)


#: The longest a ``Workload.live()`` body may keep the producers going (a safety net:
#: the body's own waits have tighter deadlines).
LIVE_LIMIT_S = 600.0

#: A reader task besides the workload's own consumers (e.g. ``GroupReaders.run``):
#: it reads until the event is set.
ExtraReader = Callable[[asyncio.Event], Awaitable[None]]


class WorkloadError(AssertionError):
    """The run could not complete (e.g. the final read never finished)."""


# -- the workload ----------------------------------------------------------------------
@dataclass
class WorkloadConfig:
    topic: str = "faults"
    partitions: int = 3
    replication_factor: int = 1
    topic_configs: dict[str, str] = field(default_factory=dict)
    producers: int = 3
    consumers: int = 1
    duration_s: float = 10.0  # how long producers send and the nemesis acts
    rate: float = 200.0  # sends per second per producer
    window: int = 64  # sends per producer awaiting their outcome
    acks: int | str = "all"
    linger_ms: float = 2
    request_timeout_ms: int = 3000
    delivery_timeout_ms: int = 20000
    retry_backoff_ms: int = 50
    final_read_timeout_s: float = 30.0
    seed: int = 0


class Workload:
    """One run: call ``await run()`` and then ``history.check()``."""

    def __init__(
        self,
        cluster: Cluster,
        config: WorkloadConfig,
        steps: Sequence[Step] = (),
        history: History | None = None,
    ) -> None:
        self.cluster = cluster
        self.config = config
        self.history = history if history is not None else History()
        self.nemesis = Nemesis(cluster, steps, topic=config.topic, partitions=config.partitions)
        self._t0 = time.monotonic()
        self._deadline = self._t0
        self.errors: dict[str, int] = {}

    def clock(self) -> int:
        return int((time.monotonic() - self._t0) * 1000)

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    @property
    def partitions(self) -> list[tuple[str, int]]:
        return [(self.config.topic, p) for p in range(self.config.partitions)]

    async def run(self) -> History:
        cfg = self.config
        await ensure_topic(
            self.bootstrap, cfg.topic, cfg.partitions, cfg.replication_factor, cfg.topic_configs
        )
        self._t0 = time.monotonic()
        self._deadline = self._t0 + cfg.duration_s
        stop_nemesis = asyncio.Event()
        stop_reading = asyncio.Event()
        try:
            async with asyncio.TaskGroup() as tg:
                readers = [
                    tg.create_task(self._consume(f"consumer-{j}", stop_reading))
                    for j in range(cfg.consumers)
                ]
                nemesis = tg.create_task(self.nemesis.run(self.history, self.clock, stop_nemesis))
                producers = [
                    tg.create_task(self._produce(f"producer-{i}")) for i in range(cfg.producers)
                ]
                await asyncio.sleep(cfg.duration_s)  # the run's length, not a synchronisation
                stop_nemesis.set()
                await nemesis  # everything healed and restarted
                await asyncio.gather(*producers)
                stop_reading.set()
                await asyncio.gather(*readers)
        finally:
            await asyncio.to_thread(self._recover)
        await final_read(
            self.bootstrap, cfg.topic, cfg.partitions, self.history, cfg.final_read_timeout_s
        )
        return self.history

    @contextlib.asynccontextmanager
    async def live(
        self, extra_readers: Sequence[ExtraReader] = ()
    ) -> AsyncIterator[Callable[[], Awaitable[None]]]:
        """Producers and readers run for as long as the body takes, instead of for
        ``duration_s`` with a nemesis schedule: the body acts on the cluster itself
        (e.g. moves partitions) and waits for conditions with deadlines.

        Yields ``stop_producing()``: ends the sends and waits for their outcomes, while
        the readers go on (e.g. until a consumer group has caught up). Leaving the block
        stops producing if the body did not, then stops the readers, leaves every node
        running and every link healed, and does the final read into the history. If the
        body raises, the tasks are cancelled and the error propagates (no final read).
        """
        cfg = self.config
        await ensure_topic(
            self.bootstrap, cfg.topic, cfg.partitions, cfg.replication_factor, cfg.topic_configs
        )
        self._t0 = time.monotonic()
        self._deadline = self._t0 + LIVE_LIMIT_S
        stop_reading = asyncio.Event()
        try:
            async with asyncio.TaskGroup() as tg:
                readers = [
                    tg.create_task(self._consume(f"consumer-{j}", stop_reading))
                    for j in range(cfg.consumers)
                ]
                readers += [tg.create_task(read(stop_reading)) for read in extra_readers]
                producers = [
                    tg.create_task(self._produce(f"producer-{i}")) for i in range(cfg.producers)
                ]

                async def stop_producing() -> None:
                    self._deadline = min(self._deadline, time.monotonic())
                    await asyncio.gather(*producers)

                yield stop_producing
                await stop_producing()
                stop_reading.set()
                await asyncio.gather(*readers)
        finally:
            stop_reading.set()
            self._deadline = min(self._deadline, time.monotonic())
            await asyncio.to_thread(self._recover)
        await final_read(
            self.bootstrap, cfg.topic, cfg.partitions, self.history, cfg.final_read_timeout_s
        )

    def _recover(self) -> None:
        """Whatever happened, leave every node running and every link healed."""
        self.cluster.heal()
        for n in self.cluster.ids:
            if not self.cluster.node(n).running:
                self.cluster.restart(n)

    def describe(self) -> str:
        """The seed, the nemesis' timeline and the clients' errors: for failure reports."""
        events = "\n".join(
            f"  {e.at_ms:>7} ms {e.name}: {e.detail}" for e in self.history.nemesis_events
        )
        return (
            f"seed {self.config.seed}\nnemesis:\n{events or '  (nothing)'}\n"
            f"client errors: {self.errors or 'none'}"
        )

    def _error(self, where: str, e: BaseException) -> None:
        key = f"{where}: {type(e).__name__}"
        self.errors[key] = self.errors.get(key, 0) + 1

    # -- producing --------------------------------------------------------------------
    async def _start_producer(self, client: str) -> AsyncProducer | None:
        cfg = self.config
        while time.monotonic() < self._deadline:
            producer = AsyncProducer(
                self.bootstrap,
                acks=cfg.acks,
                enable_idempotence=True,
                linger_ms=cfg.linger_ms,
                request_timeout_ms=cfg.request_timeout_ms,
                delivery_timeout_ms=cfg.delivery_timeout_ms,
                retry_backoff_ms=cfg.retry_backoff_ms,
                client_id=client,
            )
            try:
                return await producer.start()
            except (LogMQError, OSError) as e:
                self._error(f"{client} start", e)
                await asyncio.sleep(cfg.retry_backoff_ms / 1000)
        return None

    async def _produce(self, client: str) -> None:
        """Send unique values to random partitions at ``rate``, at most ``window`` open."""
        cfg = self.config
        rng = random.Random(f"{cfg.seed}/{client}")
        producer = await self._start_producer(client)
        if producer is None:
            return
        window = asyncio.Semaphore(cfg.window)
        interval = 1.0 / cfg.rate
        try:
            async with asyncio.TaskGroup() as outcomes:
                n = 0
                next_send = time.monotonic()
                while (now := time.monotonic()) < self._deadline:
                    if next_send > now:
                        await asyncio.sleep(next_send - now)  # pacing, not synchronisation
                    next_send += interval
                    try:
                        async with asyncio.timeout(max(0.0, self._deadline - time.monotonic())):
                            await window.acquire()
                    except TimeoutError:
                        break
                    value = f"{client}-{n:08d}".encode()
                    n += 1
                    partition = rng.randrange(cfg.partitions)
                    aid = self.history.attempt(client, cfg.topic, partition, value, self.clock())
                    try:
                        handle = producer.send(cfg.topic, value, partition=partition)
                    except LogMQError as e:  # refused before it was queued
                        self.history.failed(aid, repr(e), self.clock())
                        window.release()
                        continue
                    outcomes.create_task(self._outcome(aid, handle, window))
        finally:
            try:
                await producer.close()  # waits for the rest, bounded by the delivery timeout
            except LogMQError as e:
                self._error(f"{client} close", e)

    async def _outcome(self, aid: int, handle: Any, window: asyncio.Semaphore) -> None:
        try:
            md = await handle
        except LogMQError as e:
            if e.code in DEFINITE_FAILURES:
                self.history.failed(aid, repr(e), self.clock())
            else:
                self.history.unknown(aid, repr(e), self.clock())
        except Exception as e:
            self.history.unknown(aid, repr(e), self.clock())
        else:
            self.history.acked(aid, md.offset, self.clock())
        finally:
            window.release()

    # -- consuming --------------------------------------------------------------------
    async def _consume(self, reader: str, stop: asyncio.Event) -> None:
        """Read every partition from the start, following along; reconnect on errors."""
        positions = dict.fromkeys(self.partitions, 0)
        while not stop.is_set():
            consumer = AsyncConsumer(
                self.bootstrap,
                client_id=reader,
                auto_offset_reset="earliest",
                request_timeout_ms=self.config.request_timeout_ms,
                retry_backoff_ms=self.config.retry_backoff_ms,
                fetch_max_wait_ms=200,
            )
            try:
                await consumer.start()
                consumer.assign(self.partitions)
                for (topic, p), offset in positions.items():
                    consumer.seek(topic, p, offset)
                while not stop.is_set():
                    for b in await consumer.poll_batches(timeout=0.2):
                        self.history.read_many(
                            reader,
                            b.topic,
                            b.partition,
                            zip(b.offsets(), b.values(), strict=True),
                            self.clock(),
                        )
                        positions[(b.topic, b.partition)] = b.next_offset
            except (LogMQError, OSError) as e:
                self._error(reader, e)
                await wait_until(stop, time.monotonic() + self.config.retry_backoff_ms / 1000)
            finally:
                with contextlib.suppress(LogMQError, OSError):
                    await consumer.close()


# -- a consumer group ----------------------------------------------------------------------
class GroupReaders:
    """The members of one consumer group following a topic, as an application would
    run them: subscribe, poll, auto-commit. Every record they read goes into the
    History (reader names ``<group>-<i>``), so the checker also judges what a group saw.

    A member that fails (a lost coordinator, a lost connection) is closed and replaced
    by a new one, which resumes from the group's committed offsets; records read twice
    that way are fine (at-least-once). ``read_until`` holds the furthest position read
    per partition, ``errors`` counts the failures by kind.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        history: History,
        clock: Callable[[], int],
        *,
        group_id: str = "readers",
        members: int = 2,
        commit_interval_ms: int = 200,
        request_timeout_ms: int = 3000,
        retry_backoff_ms: int = 50,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.history = history
        self.clock = clock
        self.group_id = group_id
        self.members = members
        self.commit_interval_ms = commit_interval_ms
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.read_until: dict[tuple[str, int], int] = {}
        self.last_read: dict[tuple[str, int], tuple[str, int]] = {}  # (member, at_ms)
        self.errors: dict[str, int] = {}

    @property
    def names(self) -> list[str]:
        return [f"{self.group_id}-{i}" for i in range(self.members)]

    async def run(self, stop: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as tg:
            for name in self.names:
                tg.create_task(self._member(name, stop))

    async def _member(self, name: str, stop: asyncio.Event) -> None:
        while not stop.is_set():
            consumer = AsyncConsumer(
                self.bootstrap,
                group_id=self.group_id,
                topics=[self.topic],
                client_id=name,
                auto_offset_reset="earliest",
                enable_auto_commit=True,
                auto_commit_interval_ms=self.commit_interval_ms,
                heartbeat_interval_ms=500,
                request_timeout_ms=self.request_timeout_ms,
                retry_backoff_ms=self.retry_backoff_ms,
                fetch_max_wait_ms=200,
            )
            try:
                await consumer.start()
                while not stop.is_set():
                    for b in await consumer.poll_batches(timeout=0.2):
                        self.history.read_many(
                            name,
                            b.topic,
                            b.partition,
                            zip(b.offsets(), b.values(), strict=True),
                            self.clock(),
                        )
                        tp = (b.topic, b.partition)
                        self.read_until[tp] = max(self.read_until.get(tp, 0), b.next_offset)
                        self.last_read[tp] = (name, self.clock())
            except (LogMQError, OSError) as e:
                key = f"{name}: {type(e).__name__}"
                self.errors[key] = self.errors.get(key, 0) + 1
                await wait_until(stop, time.monotonic() + self.retry_backoff_ms / 1000)
            finally:
                with contextlib.suppress(LogMQError, OSError):
                    await consumer.close()  # commits what was polled, leaves the group

    async def _count(self, admin: AsyncAdmin) -> int:
        return len((await admin.describe_topics([self.topic]))[self.topic].partitions)

    def _lag(self, desc: GroupDescription, count: int) -> dict[tuple[str, int], int | None]:
        """The group's lag per partition of the topic (None: nothing committed there)."""
        found = {(p.topic, p.partition): p.lag for p in desc.partitions}
        return {(self.topic, p): found.get((self.topic, p)) for p in range(count)}

    def explain(self, desc: GroupDescription | None = None) -> str:
        """Who owns what and who read what last: for a failure message."""
        owners = (
            "; ".join(
                f"{m.client_id} ({m.state}) owns {m.assignment}, revoking "
                f"{m.pending_revocation}, target {m.target}"
                for m in desc.members
            )
            if desc is not None
            else "unknown"
        )
        return (
            f"state {desc.state if desc is not None else '?'}; members: {owners}; read up to "
            f"{self.read_until}; last reads {self.last_read}; errors {self.errors or 'none'}"
        )

    async def wait_stable(self, timeout_s: float = 30.0) -> None:
        """Until every member has joined and owns its final share of the partitions (a
        group still rebalancing moves partitions between members, which pauses them)."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            try:
                async with AsyncAdmin(self.bootstrap, request_timeout_ms=2000) as admin:
                    desc = await admin.describe_group(self.group_id)
                    count = await self._count(admin)
            except (LogMQError, OSError, TimeoutError) as e:
                last = e
            else:
                last = self.explain(desc)
                owned = sorted(tp for m in desc.members for tp in m.assignment)
                if (
                    desc.state == "stable"
                    and len(desc.members) == self.members
                    and owned == [(self.topic, p) for p in range(count)]
                ):
                    return
            await asyncio.sleep(0.1)
        raise WorkloadError(f"group {self.group_id} not stable after {timeout_s}s: {last}")

    async def wait_caught_up(self, timeout_s: float = 30.0) -> None:
        """Until the group has committed the end of every partition (lag 0 everywhere);
        call after the producers stopped, while the members still run."""
        deadline = time.monotonic() + timeout_s
        lag: dict[tuple[str, int], int | None] | BaseException = {}
        desc: GroupDescription | None = None
        while time.monotonic() < deadline:
            try:
                async with AsyncAdmin(self.bootstrap, request_timeout_ms=2000) as admin:
                    desc = await admin.describe_group(self.group_id)
                    lag = self._lag(desc, await self._count(admin))
            except (LogMQError, OSError, TimeoutError) as e:
                lag = e
            else:
                if lag and all(v == 0 for v in lag.values()):
                    return
            await asyncio.sleep(0.1)
        raise WorkloadError(
            f"group {self.group_id} still lagging after {timeout_s}s: {lag!r}; "
            + self.explain(desc)
        )


# -- setup and the final read ------------------------------------------------------------
async def prefill(
    bootstrap: str,
    topic: str,
    partition: int,
    history: History,
    clock: Callable[[], int],
    *,
    total_bytes: int,
    value_bytes: int = 16 << 10,
    client: str = "prefill",
    seed: int = 0,
) -> int:
    """Fill one partition with about ``total_bytes`` of unique values (acks=all,
    idempotent), recorded in ``history`` like every other send so the checker knows
    them; for tests that need data to move. Returns the bytes acknowledged; raises
    WorkloadError if any send was not acknowledged."""
    rng = random.Random(f"{seed}/{client}")
    count = max(1, total_bytes // value_bytes)
    sent: list[tuple[int, Any]] = []
    async with AsyncProducer(
        bootstrap, acks="all", enable_idempotence=True, linger_ms=5, client_id=client
    ) as producer:
        for i in range(count):
            head = f"{client}-{i:08d}-".encode()
            value = head + rng.randbytes(max(0, value_bytes - len(head)))
            aid = history.attempt(client, topic, partition, value, clock())
            sent.append((aid, producer.send(topic, value, partition=partition)))
            if len(sent) % 256 == 0:  # bounded memory: let the sender catch up
                with contextlib.suppress(LogMQError):
                    await sent[-1][1]  # (its outcome is recorded below)
        failures = []
        for aid, handle in sent:
            try:
                md = await handle
            except LogMQError as e:
                history.unknown(aid, repr(e), clock())
                failures.append(repr(e))
            else:
                history.acked(aid, md.offset, clock())
    if failures:
        raise WorkloadError(
            f"prefill of {topic}-{partition}: {len(failures)} sends failed: {failures[:3]}"
        )
    return count * value_bytes


async def ensure_topic(
    bootstrap: str,
    topic: str,
    partitions: int,
    replication_factor: int = 1,
    configs: dict[str, str] | None = None,
    timeout_s: float = 30.0,
) -> None:
    """Create the topic (fine if it exists) and wait until every partition has a leader."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            async with AsyncAdmin(bootstrap) as admin:
                try:
                    await admin.create_topic(topic, partitions, replication_factor, configs)
                except LogMQError as e:
                    if e.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                        raise
                desc = (await admin.describe_topics([topic]))[topic]
                if len(desc.partitions) == partitions and all(
                    p.leader >= 0 for p in desc.partitions
                ):
                    return
        except (LogMQError, OSError) as e:
            if isinstance(e, LogMQError) and not e.retriable:
                raise
            last = e
        await asyncio.sleep(0.05)
    raise WorkloadError(f"topic {topic} not ready after {timeout_s}s: {last!r}")


async def final_read(
    bootstrap: str, topic: str, partitions: int, history: History, timeout_s: float = 60.0
) -> None:
    """Read every partition from its start to its end offset into ``history``.

    Retries from scratch on errors (the cluster may still be electing leaders after
    the last heal); fails with WorkloadError, saying how far each partition got, when
    it cannot finish in time.
    """
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    tps = [(topic, p) for p in range(partitions)]
    progress: dict[tuple[str, int], str] = {}
    while time.monotonic() < deadline:
        try:
            async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                logs = await _read_all(bootstrap, tps, progress)
        except (LogMQError, OSError, TimeoutError) as e:
            last = e
            await asyncio.sleep(0.1)
            continue
        for (t, p), (start, end, records) in logs.items():
            history.final_read(t, p, records, start_offset=start, end_offset=end)
        return
    where = "; ".join(f"{t}-{p}: {msg}" for (t, p), msg in sorted(progress.items()))
    raise WorkloadError(
        f"final read of {topic} incomplete after {timeout_s}s ({last!r}): {where or 'no progress'}"
    )


async def _read_all(
    bootstrap: str, tps: list[tuple[str, int]], progress: dict[tuple[str, int], str]
) -> dict[tuple[str, int], tuple[int, int, list[tuple[int, bytes]]]]:
    """Read to the end offsets, then again to the new ones until they stop moving (a
    high watermark may still rise after the producers stopped, as followers catch up)."""
    async with AsyncAdmin(bootstrap) as admin:
        starts = await _offsets(admin, tps, EARLIEST)
        ends = await _offsets(admin, tps, LATEST)
        records: dict[tuple[str, int], list[tuple[int, bytes]]] = {tp: [] for tp in tps}
        async with AsyncConsumer(
            bootstrap, auto_offset_reset="none", fetch_max_wait_ms=100
        ) as consumer:
            consumer.assign(tps)
            positions = dict(starts)
            while True:
                for tp in tps:  # the consumer may have fetched past an old end
                    consumer.seek(*tp, positions[tp])
                await _read_to(consumer, positions, ends, records, starts, progress)
                latest = await _offsets(admin, tps, LATEST)
                if latest == ends:
                    break
                ends = latest
    return {tp: (starts[tp], ends[tp], records[tp]) for tp in tps}


async def _offsets(
    admin: AsyncAdmin, tps: list[tuple[str, int]], which: int
) -> dict[tuple[str, int], int]:
    found = await admin.list_offsets(dict.fromkeys(tps, which))
    return {tp: found[tp][0] for tp in tps}


async def _read_to(
    consumer: AsyncConsumer,
    positions: dict[tuple[str, int], int],
    ends: dict[tuple[str, int], int],
    records: dict[tuple[str, int], list[tuple[int, bytes]]],
    starts: dict[tuple[str, int], int],
    progress: dict[tuple[str, int], str],
) -> None:
    todo = {tp for tp in positions if positions[tp] < ends[tp]}
    for tp in positions:
        progress[tp] = f"read up to {positions[tp]} of [{starts[tp]}, {ends[tp]})"
    while todo:
        for b in await consumer.poll_batches(timeout=1.0):
            tp = (b.topic, b.partition)
            end = ends[tp]
            offsets = b.offsets()
            records[tp].extend(
                (o, v) for o, v in zip(offsets, b.values(), strict=True) if positions[tp] <= o < end
            )
            positions[tp] = max(positions[tp], min(b.next_offset, end))
            progress[tp] = f"read up to {b.next_offset} of [{starts[tp]}, {end})"
            if b.next_offset >= end:
                todo.discard(tp)
        for tp in todo:  # what the consumer learns from the broker, for the error
            hw = consumer.highwater(*tp)
            progress[tp] = progress[tp].split(";")[0] + f"; high watermark {hw}"
