"""The single-node broker: wires storage, topic metadata, the API handlers and the server.

``Broker`` owns every long-lived piece and their order of start and stop. Stop is the
orderly shutdown SIGTERM asks for: stop accepting, wake parked fetches, let every
connection answer what it already read, stop the group coordinator, then flush the logs
and write the clean-shutdown marker (LogManager.stop).
"""

from __future__ import annotations

import logging
from pathlib import Path

from logmq.broker.admin_api import AdminApi
from logmq.broker.config import BrokerConfig
from logmq.broker.data_api import DataApi
from logmq.broker.fetch_waiter import FetchWaiters
from logmq.broker.group_api import GroupApi
from logmq.broker.group_coordinator import GroupCoordinatorService
from logmq.broker.metadata_store import (
    MetaProperties,
    TopicInfo,
    TopicStore,
    load_or_create_meta,
    topic_name_error,
)
from logmq.broker.metrics import BrokerMetrics, MetricsServer
from logmq.broker.producer_ids import ProducerIdManager
from logmq.broker.request_fields import InvalidRequestError
from logmq.errors import ErrorCode, LogMQError, StorageError
from logmq.net.codec import ApiKey, Request
from logmq.net.server import Reply, ServerOptions, TcpServer
from logmq.storage.config import LogConfig
from logmq.storage.log_manager import LogManager
from logmq.storage.partition_log import PartitionLog

log = logging.getLogger("logmq.broker")

# api key -> (min version, max version)
SUPPORTED_APIS: dict[int, tuple[int, int]] = {
    ApiKey.PRODUCE: (0, 0),
    ApiKey.FETCH: (0, 0),
    ApiKey.LIST_OFFSETS: (0, 0),
    ApiKey.METADATA: (0, 0),
    ApiKey.API_VERSIONS: (0, 0),
    ApiKey.CREATE_TOPICS: (0, 0),
    ApiKey.DELETE_TOPICS: (0, 0),
    ApiKey.INIT_PRODUCER_ID: (0, 0),
    ApiKey.DESCRIBE_CONFIGS: (0, 0),
    ApiKey.ALTER_CONFIGS: (0, 0),
    ApiKey.CREATE_PARTITIONS: (0, 0),
    ApiKey.FIND_COORDINATOR: (0, 0),
    ApiKey.CONSUMER_GROUP_HEARTBEAT: (0, 0),
    ApiKey.OFFSET_COMMIT: (0, 0),
    ApiKey.OFFSET_FETCH: (0, 0),
    ApiKey.LIST_GROUPS: (0, 0),
    ApiKey.CONSUMER_GROUP_DESCRIBE: (0, 0),
    ApiKey.DELETE_GROUPS: (0, 0),
    ApiKey.OFFSET_DELETE: (0, 0),
}

# requests without side effects: skipped when their client has already gone away
# (not Metadata: it may auto-create topics)
READ_ONLY_APIS = frozenset(
    {
        ApiKey.FETCH,
        ApiKey.LIST_OFFSETS,
        ApiKey.API_VERSIONS,
        ApiKey.DESCRIBE_CONFIGS,
        ApiKey.OFFSET_FETCH,
        ApiKey.LIST_GROUPS,
        ApiKey.CONSUMER_GROUP_DESCRIBE,
    }
)

# requests that may start while earlier ones of their connection still run: they wait
# on durability (fsync), and each enqueues its work before its first await, so they
# still take effect in arrival order (see DataApi.produce and group_api)
CONCURRENT_APIS = frozenset(
    {
        ApiKey.PRODUCE,
        ApiKey.OFFSET_COMMIT,
        ApiKey.OFFSET_FETCH,
        ApiKey.CONSUMER_GROUP_HEARTBEAT,
    }
)


def error_body(code: ErrorCode, message: str) -> dict:
    return {"error": int(code), "message": message}


class Broker:
    def __init__(self, config: BrokerConfig):
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.meta: MetaProperties | None = None
        self.topics: TopicStore | None = None
        self.logs: LogManager | None = None
        self.producer_ids: ProducerIdManager | None = None
        self.waiters = FetchWaiters()
        self.metrics = BrokerMetrics(self._partition_stats, lambda: self.waiters.parked)
        self.server = TcpServer(
            self.handle,
            ServerOptions(
                max_frame_size=config.max_frame_size,
                max_connections=config.max_connections,
                idle_timeout_s=config.idle_timeout_ms / 1000,
                max_in_flight=config.max_in_flight_per_connection,
                socket_buffer_bytes=config.socket_buffer_bytes,
                zero_copy=config.zero_copy,
            ),
            self.metrics,
            is_concurrent=lambda req: req.api_key in CONCURRENT_APIS,
            is_read_only=lambda req: req.api_key in READ_ONLY_APIS,
        )
        self.metrics_server: MetricsServer | None = None
        self.admin = AdminApi(self)
        self.data = DataApi(self)
        self.groups = GroupCoordinatorService(self)
        self.group_api = GroupApi(self)
        self.metrics.register_group_stats(self.groups.stats)
        self._handlers = {
            ApiKey.API_VERSIONS: self.admin.api_versions,
            ApiKey.METADATA: self.admin.metadata,
            ApiKey.CREATE_TOPICS: self.admin.create_topics,
            ApiKey.DELETE_TOPICS: self.admin.delete_topics,
            ApiKey.DESCRIBE_CONFIGS: self.admin.describe_configs,
            ApiKey.ALTER_CONFIGS: self.admin.alter_configs,
            ApiKey.CREATE_PARTITIONS: self.admin.create_partitions,
            ApiKey.INIT_PRODUCER_ID: self.admin.init_producer_id,
            ApiKey.PRODUCE: self.data.produce,
            ApiKey.FETCH: self.data.fetch,
            ApiKey.LIST_OFFSETS: self.data.list_offsets,
            ApiKey.FIND_COORDINATOR: self.group_api.find_coordinator,
            ApiKey.CONSUMER_GROUP_HEARTBEAT: self.group_api.consumer_group_heartbeat,
            ApiKey.OFFSET_COMMIT: self.group_api.offset_commit,
            ApiKey.OFFSET_FETCH: self.group_api.offset_fetch,
            ApiKey.LIST_GROUPS: self.group_api.list_groups,
            ApiKey.CONSUMER_GROUP_DESCRIBE: self.group_api.consumer_group_describe,
            ApiKey.DELETE_GROUPS: self.group_api.delete_groups,
            ApiKey.OFFSET_DELETE: self.group_api.offset_delete,
        }
        self._started = False

    # -- lifecycle ---------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self.server.port

    @property
    def cluster_id(self) -> str:
        assert self.meta is not None
        return self.meta.cluster_id

    async def start(self) -> None:
        cfg = self.config
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.meta = load_or_create_meta(self.data_dir, cfg.node_id)
        self.topics = TopicStore(self.data_dir)
        self.producer_ids = ProducerIdManager(self.data_dir, cfg.producer_id_block_size)
        default = LogConfig.from_dict(dict(cfg.topic_defaults)) if cfg.topic_defaults else None
        topics = self.topics
        # topics.json is the one home of topic configs; the storage only mirrors them.
        self.logs = LogManager(
            self.data_dir,
            default,
            topic_overrides=lambda: {info.name: info.configs for info in topics.all()},
        )
        await self.logs.start()
        try:
            self._reconcile_logs()
            self.groups.start()
            await self.server.start(cfg.host, cfg.port)
            if cfg.metrics_port is not None:
                self.metrics_server = MetricsServer(self.metrics)
                await self.metrics_server.start(cfg.metrics_host, cfg.metrics_port)
                log.info(
                    "metrics on http://%s:%d/metrics", cfg.metrics_host, self.metrics_server.port
                )
        except BaseException:
            await self.server.stop(0)
            await self.groups.stop()
            await self.logs.stop()
            raise
        self._started = True
        log.info(
            "broker %d (cluster %s) serving %d topics on %s:%d",
            cfg.node_id,
            self.meta.cluster_id,
            len(self.topics.names()),
            cfg.host,
            self.port,
        )

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        log.info("broker stopping: draining connections")
        await self.server.stop(self.config.shutdown_grace_ms / 1000, self.waiters.wake_all)
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        await self.groups.stop()  # after the connections: their requests were answered
        assert self.logs is not None
        await self.logs.stop()
        log.info("broker stopped cleanly")

    def _reconcile_logs(self) -> None:
        """Make the logs on disk match topics.json after a crash mid-create/delete."""
        assert self.logs is not None and self.topics is not None
        wanted: set[tuple[str, int]] = set()
        for info in self.topics.all():
            for p in range(info.partitions):
                wanted.add((info.name, p))
                if self._find_log(info.name, p) is None:
                    self.logs.create_log(info.name, p, dict(info.configs))
        for plog in list(self.logs.logs()):
            if (plog.topic, plog.partition) not in wanted:
                log.warning("deleting orphan log %s-%d", plog.topic, plog.partition)
                self.logs.delete_log(plog.topic, plog.partition)
            else:
                plog.high_watermark = plog.log_end_offset  # single node: HW = LEO

    # -- shared helpers for the API handlers -------------------------------------------
    def _find_log(self, topic: str, partition: int) -> PartitionLog | None:
        assert self.logs is not None
        try:
            return self.logs.get_log(topic, partition)
        except (KeyError, LogMQError):
            return None

    def get_log(self, topic: str, partition: int) -> PartitionLog | None:
        """The log of a known topic's partition, or None."""
        assert self.topics is not None
        info = self.topics.get(topic)
        if info is None or not 0 <= partition < info.partitions:
            return None
        return self._find_log(topic, partition)

    def create_topic(self, info: TopicInfo) -> None:
        """Persist the topic, then create its logs (startup reconciles a crash between)."""
        assert self.topics is not None and self.logs is not None
        self.topics.add(info)
        for p in range(info.partitions):
            self.logs.create_log(info.name, p, dict(info.configs))
        self.groups.topics_changed()

    def add_partitions(self, name: str, count: int) -> None:
        """Grow topic ``name`` to ``count`` partitions.

        The count is persisted first, then the new logs are created with the topic's
        configs (a crash in between is completed by ``_reconcile_logs`` at the next
        start); then the group coordinator assigns the new partitions. If a log cannot be
        created the topic goes back to its old count, so the request fails whole.
        """
        assert self.topics is not None and self.logs is not None
        info = self.topics.get(name)
        assert info is not None and count > info.partitions
        old = info.partitions
        self.topics.set_partitions(name, count)
        created: list[int] = []
        try:
            for p in range(old, count):
                self.logs.create_log(name, p, dict(info.configs))
                created.append(p)
        except (OSError, LogMQError) as e:
            self._undo_add_partitions(name, old, created)
            if isinstance(e, LogMQError):
                raise
            raise StorageError(f"cannot create {name}-{old + len(created)}: {e}") from e
        log.info("topic %s grown from %d to %d partitions", name, old, count)
        self.groups.topics_changed()

    def _undo_add_partitions(self, name: str, old: int, created: list[int]) -> None:
        assert self.topics is not None and self.logs is not None
        try:
            self.topics.set_partitions(name, old)
            for p in created:
                self.logs.delete_log(name, p)
        except (OSError, LogMQError):
            # topics.json may keep the new count: the next start creates the missing logs
            log.exception("could not undo adding partitions to %s", name)

    def create_internal_topic(
        self, name: str, partitions: int, configs: dict[str, str] | None = None
    ) -> TopicInfo:
        """For broker subsystems (group coordinator): create a ``__`` topic if missing."""
        assert self.topics is not None
        existing = self.topics.get(name)
        if existing is not None:
            return existing
        problem = topic_name_error(name)
        if problem:
            raise InvalidRequestError(problem)
        cfg = dict(configs or {})
        LogConfig.from_dict(cfg)
        info = TopicInfo(name, partitions, cfg)
        self.create_topic(info)
        return info

    def delete_topic(self, name: str) -> None:
        assert self.topics is not None and self.logs is not None
        info = self.topics.remove(name)
        for p in range(info.partitions):
            if self._find_log(name, p) is not None:
                self.logs.delete_log(name, p)
            self.waiters.notify((name, p))
        self.groups.topics_changed(deleted=(name,))

    def maybe_auto_create(self, topic: str) -> TopicInfo | None:
        """Auto-create ``topic`` when the broker allows it and the name is valid."""
        assert self.topics is not None
        if not self.config.auto_create_topics or topic_name_error(topic):
            return None
        if topic.startswith("__"):
            return None
        info = TopicInfo(topic, self.config.default_partitions, {})
        log.info("auto-creating topic %s with %d partitions", topic, info.partitions)
        self.create_topic(info)
        return info

    def _partition_stats(self):
        if self.logs is None:
            return []
        return [
            (plog.topic, plog.partition, plog.log_end_offset, plog.size_bytes())
            for plog in list(self.logs.logs())
        ]

    # -- dispatch ---------------------------------------------------------------------
    async def handle(self, request: Request) -> Reply | None:
        key = request.api_key
        handler = self._handlers.get(key)
        if handler is None:
            self.metrics.error(key, ErrorCode.UNKNOWN_API)
            return Reply(error_body(ErrorCode.UNKNOWN_API, f"unknown api key {key}"))
        lo, hi = SUPPORTED_APIS[key]
        if not lo <= request.api_version <= hi:
            body = error_body(
                ErrorCode.UNSUPPORTED_VERSION,
                f"{ApiKey(key).name} version {request.api_version} not in [{lo}, {hi}]",
            )
            if key == ApiKey.API_VERSIONS:
                body["apis"] = self.admin.api_list()
            return Reply(body)
        try:
            return await handler(request)
        except LogMQError as e:
            self.metrics.error(key, e.code)
            return Reply(error_body(e.code, str(e)))
        except Exception as e:
            log.exception("%s request from %r failed", ApiKey(key).name, request.client_id)
            return Reply(error_body(ErrorCode.UNKNOWN_SERVER_ERROR, f"{type(e).__name__}: {e}"))
