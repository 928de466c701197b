"""What a client knows about the cluster, and the connections it keeps to it.

``ClusterMetadata`` is an immutable snapshot parsed from a Metadata response (sans-IO,
so another thread may read the current snapshot without a lock: refreshes replace it
whole). ``ClusterClient`` owns one ``BrokerConnection`` per broker, routes requests to
partition leaders and refreshes metadata when a leader is unknown or has moved, and in
any case once it is ``metadata_max_age_ms`` old (Kafka's default: 5 min), so partitions
added to a topic reach producers and consumers even when nothing fails.

Group requests go to the group's coordinator (found with FindCoordinator and cached)
over a connection of their own: the broker answers a connection's requests in order,
and a heartbeat must not queue behind a fetch that long-polls for half a second.
"""

from __future__ import annotations

import asyncio
import collections
import random
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from logmq.client.connection import BrokerConnection, HandshakeError
from logmq.client.fetcher import first_at_or_after, parse_fetch_response
from logmq.client.kafka_probe import ListenerMismatchError, diagnose
from logmq.client.security import ClientSecurity
from logmq.errors import (
    BootstrapError,
    ConnectionError_,
    ErrorCode,
    LogMQError,
    RequestTimedOutError,
    error_for,
)
from logmq.gcpause import gc_paused
from logmq.net.codec import ApiKey, Response
from logmq.net.fetch_message import fetch_request

T = TypeVar("T")
TopicPartition = tuple[str, int]
Address = tuple[str, int]
# While one address is silent, the next is tried too after this long (RFC 8305's
# staggered start): a dead broker costs nothing, an unreachable one this much.
CONNECT_STAGGER = 0.25
_COORDINATOR_MOVED = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
    }
)


@dataclass(slots=True, frozen=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int


@dataclass(slots=True)
class PartitionInfo:
    """One partition in a metadata snapshot; read-only by convention (snapshots are
    shared). Not a frozen dataclass: a 10,000-partition answer builds 10,000 of these,
    and a frozen one's ``__init__`` costs three times as much."""

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    error: ErrorCode = ErrorCode.NONE
    adding_replicas: list[int] = field(default_factory=list)  # non-empty while moving
    removing_replicas: list[int] = field(default_factory=list)


@dataclass(slots=True, frozen=True)
class TopicInfo:
    name: str
    partitions: list[PartitionInfo]
    internal: bool = False
    error: ErrorCode = ErrorCode.NONE


@dataclass(slots=True, frozen=True)
class ClusterMetadata:
    cluster_id: str | None = None
    controller_id: int = -1
    brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    topics: dict[str, TopicInfo] = field(default_factory=dict)
    # partition count of each healthy topic: the producer's per-record lookup
    counts: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        counts = {
            name: len(t.partitions)
            for name, t in self.topics.items()
            if t.error == ErrorCode.NONE and t.partitions
        }
        object.__setattr__(self, "counts", counts)

    @classmethod
    def from_response(cls, body: dict[str, Any]) -> ClusterMetadata:
        brokers = {
            b["node_id"]: BrokerInfo(b["node_id"], b["host"], b["port"])
            for b in body.get("brokers") or []
        }
        topics: dict[str, TopicInfo] = {}
        for t in body.get("topics") or []:
            parts = [
                PartitionInfo(
                    t["topic"],
                    p["partition"],
                    p.get("leader", -1),
                    p.get("leader_epoch", -1),
                    list(p.get("replicas") or []),
                    list(p.get("isr") or []),
                    _code(p.get("error", 0)),
                    list(p.get("adding_replicas") or []),
                    list(p.get("removing_replicas") or []),
                )
                for p in t.get("partitions") or []
            ]
            parts.sort(key=lambda p: p.partition)
            topics[t["topic"]] = TopicInfo(
                t["topic"], parts, bool(t.get("internal", False)), _code(t.get("error", 0))
            )
        return cls(body.get("cluster_id"), body.get("controller_id", -1), brokers, topics)

    def merged(self, newer: ClusterMetadata, refreshed: Iterable[str] | None) -> ClusterMetadata:
        """This snapshot updated by a response for ``refreshed`` topics (None = all)."""
        if refreshed is None:
            return newer
        topics = dict(self.topics)
        for name in refreshed:
            topics.pop(name, None)
        for name, info in newer.topics.items():
            if info.error == ErrorCode.NONE:
                topics[name] = info
        brokers = newer.brokers or self.brokers
        return ClusterMetadata(newer.cluster_id, newer.controller_id, brokers, topics)

    def partition_count(self, topic: str) -> int:
        """Number of partitions of a known, healthy topic, else 0."""
        return self.counts.get(topic, 0)

    def leader_for(self, topic: str, partition: int) -> int:
        info = self.topics.get(topic)
        if info is None or not 0 <= partition < len(info.partitions):
            return -1
        p = info.partitions[partition]
        return p.leader if p.partition == partition else -1

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        info = self.topics.get(topic)
        if info is None:
            return None
        parts = info.partitions  # sorted by partition: usually partition i at index i
        if 0 <= partition < len(parts) and parts[partition].partition == partition:
            return parts[partition]
        for p in parts:  # a response that left some out
            if p.partition == partition:
                return p
        return None


def _code(value: int) -> ErrorCode:
    if value == 0:  # nearly always: no enum lookup
        return ErrorCode.NONE
    try:
        return ErrorCode(value)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR


def parse_bootstrap(bootstrap: str | Iterable[str]) -> list[tuple[str, int]]:
    """``"host:port[,host:port]"`` into address pairs."""
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    out = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"bootstrap address {item!r} is not host:port")
        out.append((host.strip("[]") or "127.0.0.1", int(port)))
    if not out:
        raise ValueError("bootstrap names no broker")
    return out


class _NoConnection(ConnectionError_):
    """No address accepted; ``answered`` are those that connected and then failed TLS or
    the login (another kind of listener, maybe)."""

    def __init__(self, message: str, answered: list[Address]) -> None:
        super().__init__(message)
        self.answered = answered


class ClusterClient:
    """Connections per broker, metadata and leader routing shared by one client object."""

    def __init__(
        self,
        bootstrap: str | Iterable[str],
        *,
        client_id: str = "logmq-python",
        request_timeout_ms: int = 30000,
        retry_backoff_ms: int = 100,
        connect_timeout_ms: int = 10000,
        allow_auto_create_topics: bool = False,
        metadata_max_age_ms: int = 300_000,
        bootstrap_timeout_ms: int = 2000,
        security: ClientSecurity | None = None,
    ) -> None:
        if metadata_max_age_ms <= 0:
            raise ValueError("metadata_max_age_ms must be positive")
        self.bootstrap = parse_bootstrap(bootstrap)
        self.client_id = client_id
        # TLS and SASL (client/security.py); by default from LOGMQ_SECURITY_PROTOCOL etc.
        self.security = security if security is not None else ClientSecurity.from_env()
        self.request_timeout = request_timeout_ms / 1000
        self.retry_backoff = retry_backoff_ms / 1000
        self.connect_timeout = connect_timeout_ms / 1000
        # until some broker has answered, how long to try the bootstrap list
        self.bootstrap_timeout = min(bootstrap_timeout_ms, connect_timeout_ms) / 1000
        self._reached = False  # a broker has answered: connection failures are transient
        self.allow_auto_create = allow_auto_create_topics
        self.metadata_max_age = metadata_max_age_ms / 1000
        self.metadata = ClusterMetadata()
        self._connections: dict[int, BrokerConnection] = {}
        self._connecting: dict[int, asyncio.Future[BrokerConnection]] = {}
        self._bootstrap_conn: BrokerConnection | None = None
        self._refresh: asyncio.Task[ClusterMetadata] | None = None
        self._wanted: set[str] = set()
        self._refreshed_at = 0.0  # loop time of the last metadata answer
        self._all_topics = False  # someone asked for every topic: age refreshes get all
        self._age_task: asyncio.Task[None] | None = None  # started by the first refresh
        self._coordinators: dict[str, BrokerInfo] = {}  # group id -> its coordinator
        self._coordinator_conns: dict[int, BrokerConnection] = {}
        self._coordinator_lock: asyncio.Lock | None = None
        self._closed = False

    # -- connections --------------------------------------------------------------
    async def _open(self, host: str, port: int, node_id: int) -> BrokerConnection:
        return await BrokerConnection.open(
            host,
            port,
            connect_timeout=self.connect_timeout,
            client_id=self.client_id,
            node_id=node_id,
            security=self.security,
        )

    async def any_connection(self, avoid: Collection[Address] = ()) -> BrokerConnection:
        """A connection to some broker: an open one, else the first known broker or
        bootstrap address that accepts one; addresses in ``avoid`` (they just failed)
        come last.

        Until a broker has answered, nothing says the addresses are right, so when none
        accepts, BootstrapError says so within ``bootstrap_timeout`` instead of the
        request being retried until the request timeout.
        """
        if self._closed:
            raise ConnectionError_("client is closed")
        for conn in (*self._connections.values(), self._bootstrap_conn):
            if conn is not None and conn.is_open and (conn.host, conn.port) not in avoid:
                return conn
        known = [(b.host, b.port) for b in self.metadata.brokers.values()]
        addrs = list(dict.fromkeys(known + self.bootstrap))
        addrs.sort(key=lambda a: a in avoid)  # stable: otherwise in order
        if self._reached:
            self._bootstrap_conn = await self._open_first(addrs, self.connect_timeout)
            return self._bootstrap_conn
        try:
            self._bootstrap_conn = await self._open_first(addrs, self.bootstrap_timeout)
        except _NoConnection as e:
            # an address that answered, then failed TLS or the login: of another kind?
            for found in await asyncio.gather(*(self._diagnose(*a) for a in e.answered)):
                if found is not None:
                    raise found from None
            raise BootstrapError(f"no broker reachable ({e})") from None
        return self._bootstrap_conn

    async def _diagnose(self, host: str, port: int) -> ListenerMismatchError | None:
        protocol = self.security.protocol if self.security is not None else "PLAINTEXT"
        return await diagnose(host, port, protocol)

    async def _open_first(self, addrs: list[Address], timeout: float) -> BrokerConnection:
        """Connect to the first of ``addrs`` that accepts within ``timeout`` seconds.

        Tried in order; the next attempt starts as soon as one fails or after
        CONNECT_STAGGER seconds without an answer. ConnectionError_ names every address
        tried and why it failed.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        todo = collections.deque(addrs)
        attempts: dict[asyncio.Future[BrokerConnection], Address] = {}
        failures: list[str] = []
        answered: list[Address] = []  # connected, then TLS or the login failed
        winner: BrokerConnection | None = None
        try:
            while winner is None and (todo or attempts):
                if todo:
                    host, port = todo.popleft()
                    attempts[asyncio.ensure_future(self._open(host, port, -1))] = (host, port)
                left = deadline - loop.time()
                if left <= 0:
                    break
                done, _ = await asyncio.wait(
                    attempts,
                    timeout=min(left, CONNECT_STAGGER) if todo else left,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for attempt in done:
                    address = attempts.pop(attempt)
                    try:
                        conn = attempt.result()
                    except ConnectionError_ as e:
                        failures.append(str(e))
                        if isinstance(e, HandshakeError):
                            answered.append(address)
                        continue
                    if winner is None:
                        winner = conn
                    else:
                        conn.close()
        finally:
            for attempt in attempts:
                attempt.cancel()
            for result in await asyncio.gather(*attempts, return_exceptions=True):
                if isinstance(result, BrokerConnection):
                    result.close()
        if winner is not None:
            return winner
        failures += [f"cannot connect to {h}:{p}: timed out" for h, p in attempts.values()]
        failures += [f"{h}:{p} not tried in time" for h, p in todo]
        raise _NoConnection("; ".join(failures) or "no broker address to try", answered)

    async def connection(self, node_id: int) -> BrokerConnection:
        """The connection to broker ``node_id``, opened on first use and after a loss."""
        if self._closed:
            raise ConnectionError_("client is closed")
        conn = self._connections.get(node_id)
        if conn is not None and conn.is_open:
            return conn
        pending = self._connecting.get(node_id)
        if pending is None:
            broker = self.metadata.brokers.get(node_id)
            if broker is None:
                await self.refresh_metadata()
                broker = self.metadata.brokers.get(node_id)
                if broker is None:
                    raise error_for(ErrorCode.BROKER_NOT_AVAILABLE, f"unknown broker {node_id}")
            pending = asyncio.ensure_future(self._open(broker.host, broker.port, node_id))
            self._connecting[node_id] = pending
            try:
                conn = await pending
            finally:
                self._connecting.pop(node_id, None)
            self._connections[node_id] = conn
            return conn
        return await asyncio.shield(pending)

    async def leader_connection(self, topic: str, partition: int) -> BrokerConnection:
        leader = self.metadata.leader_for(topic, partition)
        if leader < 0:
            await self.refresh_metadata([topic])
            leader = self.metadata.leader_for(topic, partition)
            if leader < 0:
                raise self.topic_error(topic, partition)
        return await self.connection(leader)

    def topic_error(self, topic: str, partition: int | None = None) -> LogMQError:
        info = self.metadata.topics.get(topic)
        if info is None or info.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            return error_for(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {topic!r}")
        if info.error != ErrorCode.NONE:
            return error_for(info.error, f"topic {topic!r}: {info.error.name}")
        if partition is not None and self.metadata.partition(topic, partition) is None:
            return error_for(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {partition} in {topic!r}"
            )
        return error_for(ErrorCode.LEADER_NOT_AVAILABLE, f"no leader for {topic}-{partition}")

    # -- metadata -----------------------------------------------------------------
    async def refresh_metadata(self, topics: Iterable[str] | None = None) -> ClusterMetadata:
        """Fetch metadata for ``topics`` (plus every topic asked for before; None = all).

        Concurrent callers share one request in flight.
        """
        if topics is not None:
            self._wanted.update(topics)
        if self._refresh is not None and not self._refresh.done():
            return await asyncio.shield(self._refresh)
        self._refresh = asyncio.ensure_future(self._do_refresh(topics is None))
        return await asyncio.shield(self._refresh)

    async def _do_refresh(self, all_topics: bool) -> ClusterMetadata:
        names = None if all_topics else sorted(self._wanted)
        body = {"topics": names, "allow_auto_create": self.allow_auto_create}
        resp = await self.request_any(ApiKey.METADATA, body)
        with gc_paused():  # thousands of partitions' objects, nearly all kept
            newer = ClusterMetadata.from_response(resp.body)
            self.metadata = self.metadata.merged(newer, names)
        if all_topics or not self._all_topics:  # it covered what the age refresh asks
            self._refreshed_at = asyncio.get_running_loop().time()
        self._all_topics |= all_topics
        if (self._age_task is None or self._age_task.done()) and not self._closed:
            self._age_task = asyncio.create_task(self._age_loop(), name="logmq-metadata-age")
        return newer

    async def _age_loop(self) -> None:
        """Refresh the metadata whenever it reaches ``metadata_max_age`` (owned by close())."""
        loop = asyncio.get_running_loop()
        while not self._closed:
            wait = self._refreshed_at + self.metadata_max_age - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)  # the metadata's age, not a sync point
                continue
            try:
                await self.refresh_metadata(None if self._all_topics else ())
            except LogMQError:
                # the brokers are unreachable; other requests notice on their own
                await asyncio.sleep(min(self.metadata_max_age, max(1.0, self.retry_backoff)))

    async def ensure_topic(
        self,
        topic: str,
        timeout: float,
        on_wait: Callable[[ErrorCode | None], None] | None = None,
    ) -> ClusterMetadata:
        """Metadata with ``topic``'s partitions, retrying transient errors until ``timeout``.

        ``on_wait`` is told, once, before the first retry, why the topic is not there yet
        (the metadata's error code; None: no broker answered), so a caller can say why it
        waits instead of staying silent for the whole timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self.metadata.partition_count(topic):
                return self.metadata
            try:
                newer = await self.refresh_metadata([topic])
            except ConnectionError_:
                newer = None
            if self.metadata.partition_count(topic):
                return self.metadata
            info = newer.topics.get(topic) if newer else None
            if info is not None and info.error != ErrorCode.NONE and not info.error.retriable:
                raise error_for(info.error, f"topic {topic!r}: {info.error.name}")
            if loop.time() >= deadline:
                raise error_for(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no metadata for topic {topic!r}"
                )
            if on_wait is not None:
                if info is not None:
                    on_wait(info.error)
                else:  # an answer without the topic is as good as "unknown"
                    on_wait(None if newer is None else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                on_wait = None
            await asyncio.sleep(self._backoff())

    def _backoff(self) -> float:
        return self.retry_backoff * (0.8 + 0.4 * random.random())

    # -- requests -----------------------------------------------------------------
    async def request_any(
        self, api_key: int, body: dict[str, Any], *, timeout: float | None = None
    ) -> Response:
        """A request any broker can answer: on a lost connection it goes to the next
        broker at once, and once every one has failed, again after a backoff until the
        timeout. A client that no broker has answered yet raises BootstrapError instead.
        """
        loop = asyncio.get_running_loop()
        timeout = self.request_timeout if timeout is None else timeout
        deadline = loop.time() + timeout
        failed: set[Address] = set()
        # bootstrap addresses that turned out to be other kinds of listener (Kafka, TLS)
        mismatched: list[ListenerMismatchError] = []
        while True:
            conn = None
            try:
                conn = await self.any_connection(failed)
                resp = await conn.request(api_key, body, timeout=max(0.001, deadline - loop.time()))
                self._reached = True
                return resp
            except ConnectionError_ as e:
                addrs = {(b.host, b.port) for b in self.metadata.brokers.values()}
                addrs.update(self.bootstrap)
                if conn is not None and (conn.host, conn.port) not in failed:
                    failed.add((conn.host, conn.port))
                    # accepted, never answered natively: a Kafka or TLS port by mistake?
                    if not self._reached:
                        found = await self._diagnose(conn.host, conn.port)
                        if found is not None:
                            mismatched.append(found)
                    if not failed >= addrs:
                        continue  # another broker may answer
                if not self._reached:
                    if mismatched:
                        raise mismatched[0] from None
                    raise BootstrapError(f"no broker answered ({e})") from None
                failed.clear()
                if loop.time() + self.retry_backoff >= deadline:
                    raise RequestTimedOutError(f"{ApiKey(api_key).name} failed: {e}") from None
                await asyncio.sleep(self._backoff())

    async def request_node(
        self, node_id: int, api_key: int, body: dict[str, Any], *, timeout: float | None = None
    ) -> Response:
        conn = await self.connection(node_id)
        return await conn.request(
            api_key, body, timeout=self.request_timeout if timeout is None else timeout
        )

    async def list_offsets(
        self,
        requests: dict[TopicPartition, int],
        *,
        retries: int = 5,
        isolation_level: int = 0,
    ) -> dict[TopicPartition, tuple[int, int]]:
        """ListOffsets routed to each partition's leader: ``{tp: (offset, timestamp)}``.

        ``requests`` maps a partition to -2 (earliest), -1 (latest) or a time in ms;
        with ``isolation_level`` 1 (read_committed) "latest" is the last stable offset.
        """
        return await self.to_leaders(
            ApiKey.LIST_OFFSETS,
            {tp: {"timestamp": ts} for tp, ts in requests.items()},
            {"replica_id": -1, "isolation_level": isolation_level},
            lambda p: (p.get("offset", -1), p.get("timestamp", -1)),
            retries=retries,
        )

    @staticmethod
    def _read_answers(
        body: dict[str, Any],
        todo: dict[TopicPartition, Any],
        out: dict[TopicPartition, T],
        read: Callable[[dict[str, Any]], T],
        name: str,
    ) -> LogMQError | None:
        """``to_leaders``: one answer's partitions into ``out`` (done ones leave
        ``todo``); raises a partition's fatal error, returns its last retriable one."""
        retry = None
        for t in body.get("topics") or ():
            for p in t.get("partitions") or ():
                tp = (t["topic"], p["partition"])
                if tp not in todo:
                    continue
                code = p.get("error", 0)
                if code:
                    err = error_for(code, p.get("message") or f"{name} {tp}")
                    if not err.retriable:
                        raise err
                    retry = err
                    continue
                out[tp] = read(p)
                del todo[tp]
        return retry

    async def delete_records(
        self, offsets: dict[TopicPartition, int], timeout_ms: int
    ) -> dict[TopicPartition, int]:
        """DeleteRecords routed to each partition's leader: ``{tp: low watermark}``."""
        return await self.to_leaders(
            ApiKey.DELETE_RECORDS,
            {tp: {"offset": offset} for tp, offset in offsets.items()},
            {"timeout_ms": timeout_ms},
            lambda p: p.get("low_watermark", -1),
            timeout=timeout_ms / 1000 + self.request_timeout,
        )

    async def to_leaders(
        self,
        api_key: int,
        entries: dict[TopicPartition, dict[str, Any]],
        body: dict[str, Any],
        read: Callable[[dict[str, Any]], T],
        *,
        retries: int = 5,
        timeout: float | None = None,
    ) -> dict[TopicPartition, T]:
        """A per-partition request sent to each partition's leader: ``{tp: read(answer)}``.

        ``entries`` holds each partition's fields, ``body`` the request's others; the
        answer lists ``topics[].partitions[]`` with an ``error`` each. Retriable errors
        refresh metadata and retry (``retries`` times); a leader that cannot be reached
        is retried until the request timeout, since a broker that just died stays the
        leader until the cluster fences it. Other errors raise.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.request_timeout
        out: dict[TopicPartition, T] = {}
        todo = dict(entries)
        lost_rounds = 0
        while todo:
            by_node: dict[int, dict[str, list[dict[str, Any]]]] = {}
            for (topic, part), fields in todo.items():
                leader = self.metadata.leader_for(topic, part)
                if leader < 0:
                    await self.refresh_metadata([topic])
                    leader = self.metadata.leader_for(topic, part)
                    if leader < 0:
                        raise self.topic_error(topic, part)
                by_node.setdefault(leader, {}).setdefault(topic, []).append(
                    {"partition": part, **fields}
                )
            retry: LogMQError | None = None
            lost: ConnectionError_ | None = None
            name = ApiKey(api_key).name
            for node, topics in by_node.items():
                request = {
                    **body,
                    "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
                }
                try:
                    resp = await self.request_node(node, api_key, request, timeout=timeout)
                except ConnectionError_ as e:
                    lost = e
                    continue
                with gc_paused():
                    retry = self._read_answers(resp.body, todo, out, read, name) or retry
            if todo:
                if retry is None and lost is None:
                    raise error_for(ErrorCode.UNKNOWN_SERVER_ERROR, f"no {name} for {list(todo)}")
                delay = self._backoff()
                if retry is not None:
                    if retries <= 0:
                        raise retry
                    retries -= 1
                if lost is not None:
                    lost_rounds += 1
                    delay = min(1.0, delay * (1 << min(lost_rounds - 1, 4)))
                if loop.time() + delay >= deadline:
                    raise retry or lost
                await asyncio.sleep(delay)
                await self.refresh_metadata({t for t, _ in todo})
        return out

    async def exact_time_offset(
        self, tp: TopicPartition, offset: int, target: int, max_bytes: int
    ) -> tuple[int, int] | None:
        """The first record at or after ``target`` ms, reading from ``offset`` (the batch
        a time index pointed at): ``(offset, timestamp)`` or None."""
        partition = {
            "partition": tp[1],
            "fetch_offset": offset,
            "partition_max_bytes": max_bytes,
            "current_leader_epoch": -1,
        }
        body = fetch_request({tp[0]: [partition]}, max_wait_ms=0, min_bytes=0, max_bytes=max_bytes)
        conn = await self.leader_connection(*tp)
        resp = await conn.request(ApiKey.FETCH, body, timeout=self.request_timeout)
        for pd in parse_fetch_response(resp.body, resp.tail, {tp: offset}):
            if pd.error == ErrorCode.NONE:
                return first_at_or_after(pd, target)
        return None

    # -- group coordinators ---------------------------------------------------------
    async def find_coordinator(self, group_id: str) -> BrokerInfo:
        """The broker coordinating ``group_id`` (cached until ``forget_coordinator``)."""
        cached = self._coordinators.get(group_id)
        if cached is not None:
            return cached
        resp = await self.request_any(ApiKey.FIND_COORDINATOR, {"key_type": 0, "keys": [group_id]})
        for entry in resp.body.get("coordinators") or ():
            if entry.get("key") != group_id:
                continue
            code = entry.get("error", 0)
            if code:
                raise error_for(code, entry.get("message") or f"FindCoordinator {group_id!r}")
            info = BrokerInfo(entry["node_id"], entry["host"], entry["port"])
            self._coordinators[group_id] = info
            return info
        raise error_for(
            ErrorCode.COORDINATOR_NOT_AVAILABLE, f"no coordinator named for group {group_id!r}"
        )

    def forget_coordinator(self, group_id: str) -> None:
        """The coordinator moved or failed: the next group request looks it up again."""
        info = self._coordinators.pop(group_id, None)
        if info is not None and info not in self._coordinators.values():
            conn = self._coordinator_conns.get(info.node_id)
            if conn is not None and not conn.is_open:
                del self._coordinator_conns[info.node_id]

    async def coordinator_connection(self, group_id: str) -> BrokerConnection:
        """A connection to ``group_id``'s coordinator used only for group requests."""
        if self._closed:
            raise ConnectionError_("client is closed")
        info = await self.find_coordinator(group_id)
        conn = self._coordinator_conns.get(info.node_id)
        if conn is not None and conn.is_open:
            return conn
        if self._coordinator_lock is None:
            self._coordinator_lock = asyncio.Lock()
        async with self._coordinator_lock:
            conn = self._coordinator_conns.get(info.node_id)
            if conn is None or not conn.is_open:
                try:
                    conn = await self._open(info.host, info.port, info.node_id)
                except ConnectionError_:
                    self.forget_coordinator(group_id)
                    raise
                if self._closed:
                    conn.close()
                    raise ConnectionError_("client is closed")
                self._coordinator_conns[info.node_id] = conn
            return conn

    async def group_request(
        self,
        group_id: str,
        api_key: int,
        body: dict[str, Any],
        *,
        error_of: Callable[[dict[str, Any]], int] = lambda b: b.get("error", 0),
        timeout: float | None = None,
    ) -> Response:
        """Send ``body`` to the group's coordinator, finding it again and retrying (with
        backoff, until ``timeout``) on NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
        COORDINATOR_NOT_AVAILABLE and lost connections. ``error_of`` reads the
        response's group-level error code. Any other answer is returned as it is."""
        loop = asyncio.get_running_loop()
        timeout = self.request_timeout if timeout is None else timeout
        deadline = loop.time() + timeout
        attempt = 0
        while True:
            try:
                conn = await self.coordinator_connection(group_id)
                resp = await conn.request(api_key, body, timeout=max(0.001, deadline - loop.time()))
                code = error_of(resp.body)
                if code not in _COORDINATOR_MOVED:
                    return resp
                err: LogMQError = error_for(code, resp.body.get("message") or "")
            except (ConnectionError_, RequestTimedOutError) as e:
                err = e
            except LogMQError as e:
                if e.code not in _COORDINATOR_MOVED:
                    raise
                err = e
            self.forget_coordinator(group_id)
            attempt += 1
            delay = min(1.0, self._backoff() * (1 << min(attempt - 1, 4)))
            if loop.time() + delay >= deadline:
                raise RequestTimedOutError(
                    f"{ApiKey(api_key).name} for group {group_id!r} failed: {err}"
                ) from None
            await asyncio.sleep(delay)

    async def close(self) -> None:
        self._closed = True
        if self._refresh is not None and not self._refresh.done():
            self._refresh.cancel()
        age_task, self._age_task = self._age_task, None
        if age_task is not None and age_task is not asyncio.current_task():
            age_task.cancel()
            await asyncio.gather(age_task, return_exceptions=True)
        conns = list(self._connections.values()) + list(self._coordinator_conns.values())
        self._coordinator_conns.clear()
        if self._bootstrap_conn is not None:
            conns.append(self._bootstrap_conn)
        self._connections.clear()
        self._bootstrap_conn = None
        for conn in conns:
            conn.close()
        for conn in conns:
            await conn.wait_closed()
