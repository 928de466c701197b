"""Prometheus metrics of one broker, in a registry of its own.

A dedicated CollectorRegistry per broker keeps several in-process brokers (tests) from
colliding. Per-partition gauges are computed at scrape time from the live logs, so the
produce path pays nothing for them. The endpoint is a tiny asyncio HTTP responder with
an owner (start/stop), not prometheus_client's background thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from logmq.net.codec import ApiKey
from logmq.replication.throttle import ReassignmentQuota
from logmq.storage.disk_space import DiskSpace


class SessionCounts(Protocol):
    """What the metrics read of a door's fetch-session cache (broker/replica/)."""

    @property
    def partitions(self) -> int: ...

    def __len__(self) -> int: ...


log = logging.getLogger("logmq.metrics")

_LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


def _api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name.lower()
    except ValueError:
        return "unknown"


PartitionStats = Callable[[], Iterable[tuple[str, int, int, int]]]  # topic, p, leo, size


class _PartitionCollector:
    def __init__(self, stats: PartitionStats):
        self._stats = stats

    def collect(self):
        leo = GaugeMetricFamily(
            "logmq_log_end_offset", "Log end offset per partition", labels=["topic", "partition"]
        )
        size = GaugeMetricFamily(
            "logmq_log_size_bytes", "Bytes on disk per partition", labels=["topic", "partition"]
        )
        count = 0
        for topic, partition, end_offset, nbytes in self._stats():
            leo.add_metric([topic, str(partition)], end_offset)
            size.add_metric([topic, str(partition)], nbytes)
            count += 1
        yield GaugeMetricFamily("logmq_partitions", "Partitions hosted by this broker", count)
        yield leo
        yield size


class _RemoteTierCollector:
    """The remote tier's counters and gauges, read at scrape time from its
    ``metric_samples()``: (name, help, "counter" | "gauge", [(labels, value), ...])."""

    def __init__(self, tier: Any):
        self._tier = tier

    def collect(self):
        for name, help_text, kind, samples in self._tier.metric_samples():
            labels = sorted({k for lab, _ in samples for k in lab})
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                name, help_text, labels=labels
            )
            for lab, value in samples:
                family.add_metric([lab.get(k, "") for k in labels], value)
            yield family


class _ReassignmentThrottleCollector:
    """Reads the reassignment quotas' counters at scrape time (they count, not us)."""

    def __init__(self, quotas: dict[str, ReassignmentQuota]):
        self._quotas = quotas

    def collect(self):
        moved = CounterMetricFamily(
            "logmq_reassignment_throttled_bytes",
            "Reassignment bytes moved under the throttle, per direction",
            labels=["direction"],
        )
        delays = CounterMetricFamily(
            "logmq_reassignment_throttle_delays",
            "Partition fetches held back because the reassignment throttle was in debt",
            labels=["direction"],
        )
        rate = GaugeMetricFamily(
            "logmq_reassignment_throttle_rate_bytes",
            "Reassignment throttle in bytes/s per direction (0: none)",
            labels=["direction"],
        )
        for direction, quota in self._quotas.items():
            moved.add_metric([direction], quota.bytes)
            delays.add_metric([direction], quota.delays)
            rate.add_metric([direction], quota.rate or 0)
        yield moved
        yield delays
        yield rate


class _FetchSessionCollector:
    """Open fetch sessions and the partitions they hold, per front door (at scrape time)."""

    def __init__(self) -> None:
        self.caches: dict[str, SessionCounts] = {}

    def collect(self):
        sessions = GaugeMetricFamily(
            "logmq_fetch_sessions", "Open fetch sessions (KIP-227), per door", labels=["door"]
        )
        partitions = GaugeMetricFamily(
            "logmq_fetch_session_partitions",
            "Partitions held by the open fetch sessions, per door",
            labels=["door"],
        )
        for door, cache in self.caches.items():
            sessions.add_metric([door], len(cache))
            partitions.add_metric([door], cache.partitions)
        yield sessions
        yield partitions


# (replication factor, ISR size, min.insync.replicas) of each partition led here
LedPartitions = Callable[[], Iterable[tuple[int, int, int]]]
# (group, topic, partition, committed offset) of each group coordinated here
CommittedOffsets = Callable[[], Iterable[tuple[str, str, int, int]]]
# a partition's high watermark on this broker (None: no replica here)
HighWatermark = Callable[[str, int], int | None]


class _ReplicationCollector:
    """Kafka's ReplicaManager gauges, counted over the partitions led here at scrape
    time: UnderReplicatedPartitions, UnderMinIsrPartitionCount, AtMinIsrPartitionCount."""

    def __init__(self, led: LedPartitions):
        self._led = led

    def collect(self):
        under = under_min = at_min = 0
        for replication_factor, isr, min_isr in self._led():
            under += isr < replication_factor
            under_min += isr < min_isr
            at_min += isr == min_isr
        yield GaugeMetricFamily(
            "logmq_under_replicated_partitions",
            "Partitions led here whose ISR is smaller than their replica set",
            under,
        )
        yield GaugeMetricFamily(
            "logmq_under_min_isr_partitions",
            "Partitions led here whose ISR is smaller than min.insync.replicas "
            "(acks=all produce is refused)",
            under_min,
        )
        yield GaugeMetricFamily(
            "logmq_at_min_isr_partitions",
            "Partitions led here whose ISR is exactly min.insync.replicas (one more loss "
            "refuses acks=all)",
            at_min,
        )


class _GroupLagCollector:
    """Consumer lag of the groups coordinated here, at scrape time: a partition's high
    watermark on this broker minus the group's committed offset (never below 0), and
    each group's largest and total lag (Redpanda's kafka_consumer_group_lag_max/sum).
    Partitions without a replica here have a committed offset but no lag."""

    def __init__(self, committed: CommittedOffsets, high_watermark: HighWatermark):
        self._committed = committed
        self._high_watermark = high_watermark

    def collect(self):
        per_partition = ["group", "topic", "partition"]
        offset = GaugeMetricFamily(
            "logmq_consumer_group_committed_offset",
            "Offset committed by a consumer group coordinated here",
            labels=per_partition,
        )
        lag = GaugeMetricFamily(
            "logmq_consumer_group_lag",
            "High watermark minus committed offset, per group and partition",
            labels=per_partition,
        )
        lag_max = GaugeMetricFamily(
            "logmq_consumer_group_lag_max",
            "Largest partition lag of a consumer group",
            labels=["group"],
        )
        lag_sum = GaugeMetricFamily(
            "logmq_consumer_group_lag_sum",
            "Total lag of a consumer group over its partitions",
            labels=["group"],
        )
        totals: dict[str, list[int]] = {}
        for group, topic, partition, committed in self._committed():
            labels = [group, topic, str(partition)]
            offset.add_metric(labels, committed)
            end = self._high_watermark(topic, partition)
            if end is None:
                continue
            behind = max(0, end - committed)
            lag.add_metric(labels, behind)
            total = totals.setdefault(group, [0, 0])
            total[0] = max(total[0], behind)
            total[1] += behind
        for group, (largest, summed) in totals.items():
            lag_max.add_metric([group], largest)
            lag_sum.add_metric([group], summed)
        yield offset
        yield lag
        yield lag_max
        yield lag_sum


class BrokerMetrics:
    def __init__(self, parked_fetches: Callable[[], int] | None = None):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._bytes_in = Counter("logmq_bytes_in", "Bytes received from clients", registry=r)
        self._bytes_out = Counter("logmq_bytes_out", "Bytes sent to clients", registry=r)
        per_api = ["listener", "api"]
        self._requests = Counter("logmq_requests", "Requests answered", per_api, registry=r)
        self._latency = Histogram(
            "logmq_request_latency_seconds",
            "Time from request read to response written",
            per_api,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._request_bytes_in = Counter(
            "logmq_request_bytes_in", "Request bytes received, per API", per_api, registry=r
        )
        self._request_bytes_out = Counter(
            "logmq_request_bytes_out", "Response bytes sent, per API", per_api, registry=r
        )
        self._connections = Gauge("logmq_connections", "Open client connections", registry=r)
        self._errors = Counter(
            "logmq_request_errors", "Error codes returned", [*per_api, "error"], registry=r
        )
        # How each listener names its API keys (the doors number them differently).
        self._api_names: dict[str, Callable[[int], str]] = {"native": _api_name}
        self._bad_frames = Counter(
            "logmq_bad_requests",
            "Requests refused before a handler saw them (malformed, unsupported version, "
            "too large), per listener and reason",
            ["listener", "reason"],
            registry=r,
        )
        self._handler_failures = Counter(
            "logmq_handler_failures",
            "Requests answered UNKNOWN_SERVER_ERROR because the broker failed handling them",
            ["listener", "api"],
            registry=r,
        )
        self._logins = Counter(
            "logmq_sasl_logins",
            "SASL logins by listener, mechanism and outcome (failed ones per principal and "
            "address are in the broker's log)",
            ["listener", "mechanism", "outcome"],
            registry=r,
        )
        # Child lookups cost a dict access + lock; cache them per listener and api key.
        self._req_children: dict[tuple[str, int], tuple[Any, ...]] = {}
        self._fetch_sessions: _FetchSessionCollector | None = None
        if parked_fetches is not None:
            Gauge(
                "logmq_parked_fetches", "Long-poll fetches waiting for data", registry=r
            ).set_function(parked_fetches)

    def register_partition_stats(self, partition_stats: PartitionStats) -> None:
        """Per-partition log end offsets and sizes, read at scrape time."""
        self.registry.register(_PartitionCollector(partition_stats))

    # -- fetch sessions -----------------------------------------------------------------
    def register_fetch_sessions(self, door: str, cache: SessionCounts) -> None:
        """Gauges of a door's open fetch sessions and the partitions they hold (at scrape
        time), labelled ``door`` ("native", "kafka")."""
        if self._fetch_sessions is None:
            self._fetch_sessions = _FetchSessionCollector()
            self.registry.register(self._fetch_sessions)
        self._fetch_sessions.caches[door] = cache

    # -- consumer groups ----------------------------------------------------------------
    def register_group_stats(self, stats: Callable[[], tuple[int, int]]) -> None:
        """Gauges of the groups and members this broker coordinates (at scrape time)."""
        self._offset_commits = Counter(
            "logmq_offset_commits",
            "Partition offsets committed by consumer groups (rate = commits/s)",
            registry=self.registry,
        )
        Gauge(
            "logmq_consumer_groups",
            "Consumer groups this broker coordinates",
            registry=self.registry,
        ).set_function(lambda: stats()[0])
        Gauge(
            "logmq_consumer_group_members",
            "Members of the consumer groups this broker coordinates",
            registry=self.registry,
        ).set_function(lambda: stats()[1])

    def register_group_lag(
        self, committed: CommittedOffsets, high_watermark: HighWatermark
    ) -> None:
        """Committed offsets and lag of the groups coordinated here (at scrape time)."""
        self.registry.register(_GroupLagCollector(committed, high_watermark))

    # -- replication ----------------------------------------------------------------------
    def register_replication(self, led: LedPartitions) -> None:
        """Under-replicated, under- and at-min-ISR partition counts (at scrape time)."""
        self.registry.register(_ReplicationCollector(led))

    # -- reassignment ---------------------------------------------------------------------
    def register_reassignment_throttle(
        self, inbound: ReassignmentQuota, outbound: ReassignmentQuota
    ) -> None:
        """Counters of the replica manager's reassignment quotas (replication/throttle.py)."""
        self.registry.register(
            _ReassignmentThrottleCollector({"inbound": inbound, "outbound": outbound})
        )

    def register_remote_tier(self, tier: Any) -> None:
        """The remote tier's copies, deletes, fetches, errors and caches (remote_log.py)."""
        self.registry.register(_RemoteTierCollector(tier))

    # -- storage ---------------------------------------------------------------------------
    def register_storage(self, disk: DiskSpace) -> None:
        """Free space of the data dir and the disk-full state (read at scrape time)."""
        r = self.registry
        Gauge(
            "logmq_storage_free_bytes", "Free bytes in the data dir's file system", registry=r
        ).set_function(lambda: disk.free_bytes)
        Gauge(
            "logmq_storage_min_free_bytes",
            "Free-space guard: produce is refused below this (--min-free-bytes)",
            registry=r,
        ).set_function(lambda: disk.min_free_bytes)
        Gauge(
            "logmq_storage_disk_full",
            "1 while produce is refused for lack of disk space, else 0",
            registry=r,
        ).set_function(lambda: int(disk.full))

    def offsets_committed(self, partitions: int) -> None:
        self._offset_commits.inc(partitions)

    def connection_opened(self) -> None:
        self._connections.inc()

    def connection_closed(self) -> None:
        self._connections.dec()

    def bytes_in(self, n: int) -> None:
        self._bytes_in.inc(n)

    def bytes_out(self, n: int) -> None:
        self._bytes_out.inc(n)

    def register_listener(self, listener: str, api_name: Callable[[int], str]) -> None:
        """How ``listener``'s API keys are named in the per-API metrics."""
        self._api_names[listener] = api_name

    def _name(self, listener: str, api_key: int) -> str:
        return self._api_names.get(listener, str)(api_key)

    def request_done(
        self, listener: str, api_key: int, seconds: float, bytes_in: int, bytes_out: int
    ) -> None:
        children = self._req_children.get((listener, api_key))
        if children is None:
            name = self._name(listener, api_key)
            children = tuple(
                m.labels(listener, name)
                for m in (
                    self._requests,
                    self._latency,
                    self._request_bytes_in,
                    self._request_bytes_out,
                )
            )
            self._req_children[(listener, api_key)] = children
        children[0].inc()
        children[1].observe(seconds)
        children[2].inc(bytes_in)
        children[3].inc(bytes_out)

    def bad_frame(self, listener: str, reason: str) -> None:
        self._bad_frames.labels(listener, reason).inc()

    def handler_failed(self, listener: str, api_key: int) -> None:
        self._handler_failures.labels(listener, self._name(listener, api_key)).inc()

    def login(self, listener: str, mechanism: str, ok: bool) -> None:
        self._logins.labels(listener, mechanism, "ok" if ok else "failed").inc()

    def error(self, api_key: int, code: int, listener: str = "native") -> None:
        self._errors.labels(listener, self._name(listener, api_key), str(code)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsServer:
    """Serves ``GET /metrics`` (any path, really) over plain HTTP/1.0."""

    def __init__(self, metrics: BrokerMetrics):
        self._metrics = metrics
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(10):
                await reader.readuntil(b"\r\n\r\n")
                body = self._metrics.render()
                writer.write(
                    b"HTTP/1.0 200 OK\r\nContent-Type: "
                    + CONTENT_TYPE_LATEST.encode()
                    + b"\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            writer.close()
