"""The broker: wires storage, the metadata quorum, the API handlers and the server.

``Broker`` owns every long-lived piece and their order of start and stop. Topic metadata
comes from the metadata image (broker/controller_service.py), in a cluster and on a
single node alike (a quorum of one); changes that concern this broker's partitions reach
it through the MetadataPublisher (logs created and deleted here, then the group
coordinator). Requests that change metadata run on the controller: a broker that is not
the controller forwards them and answers once its own image has caught up.

Stop is the orderly shutdown SIGTERM asks for: stop accepting, wake parked fetches, let
every connection answer what it already read, stop the group coordinator, leave the
quorum, then flush the logs and write the clean-shutdown marker (LogManager.stop).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from logmq.broker.admin_api import AdminApi
from logmq.broker.cluster_api import ClusterApi, alter_partition_response
from logmq.broker.config import BrokerConfig
from logmq.broker.controller_service import (
    MetadataQuorum,
    parse_node_addresses,
    parse_voters,
)
from logmq.broker.data_api import DataApi
from logmq.broker.fetch_waiter import FetchWaiters
from logmq.broker.group_api import GroupApi
from logmq.broker.group_coordinator import GroupCoordinatorService
from logmq.broker.metadata_publisher import MetadataPublisher, PartitionChanges
from logmq.broker.metadata_store import (
    TOPICS_FILE,
    ImageTopics,
    TopicInfo,
    TopicStore,
    check_node_id,
    topic_name_error,
)
from logmq.broker.metrics import BrokerMetrics, MetricsServer
from logmq.broker.producer_ids import ProducerIdManager, legacy_next_id
from logmq.broker.reassignment_api import ReassignmentApi
from logmq.broker.replica_manager import ReplicaManager, ReplicationConfig
from logmq.cluster.controller import Controller
from logmq.cluster.controller_api import (
    AlterPartitionRequest,
    AlterPartitionResponse,
    ControllerConfig,
)
from logmq.cluster.metadata_image import MetadataImage
from logmq.cluster.metadata_records import (
    ConfigRecord,
    PartitionRecord,
    ProducerIdsBlock,
    Record,
    TopicRecord,
)
from logmq.errors import ErrorCode, LogMQError
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
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (0, 0),
    ApiKey.DESCRIBE_CLUSTER: (0, 0),
    ApiKey.DESCRIBE_QUORUM: (0, 0),
    ApiKey.BROKER_REGISTRATION: (0, 0),
    ApiKey.BROKER_HEARTBEAT: (0, 0),
    ApiKey.ALLOCATE_PRODUCER_IDS: (0, 0),
    ApiKey.ALTER_PARTITION: (0, 0),
    ApiKey.DESCRIBE_LOG_DIRS: (0, 0),
    ApiKey.ELECT_LEADERS: (0, 0),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: (0, 0),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: (0, 0),
}

# metadata changes: run by the controller; other brokers forward them to it
CONTROLLER_APIS = frozenset(
    {
        ApiKey.CREATE_TOPICS,
        ApiKey.DELETE_TOPICS,
        ApiKey.ALTER_CONFIGS,
        ApiKey.CREATE_PARTITIONS,
        ApiKey.ELECT_LEADERS,
        ApiKey.ALTER_PARTITION_REASSIGNMENTS,
    }
)
FORWARD_TIMEOUT_S = 15.0
# group requests need __consumer_offsets: the first one creates it
GROUP_APIS = frozenset(
    {
        ApiKey.FIND_COORDINATOR,
        ApiKey.CONSUMER_GROUP_HEARTBEAT,
        ApiKey.OFFSET_COMMIT,
        ApiKey.OFFSET_FETCH,
        ApiKey.LIST_GROUPS,
        ApiKey.CONSUMER_GROUP_DESCRIBE,
        ApiKey.DELETE_GROUPS,
        ApiKey.OFFSET_DELETE,
    }
)

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
        ApiKey.DESCRIBE_CLUSTER,
        ApiKey.DESCRIBE_QUORUM,
        ApiKey.DESCRIBE_LOG_DIRS,
        ApiKey.LIST_PARTITION_REASSIGNMENTS,
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


class _RemovedLogs:
    """The last metadata listener: deletes the logs of partitions no longer here."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    def on_partitions_changed(self, image: MetadataImage, changes: PartitionChanges) -> None:
        self._broker.drop_removed_logs(changes)


def error_body(code: ErrorCode, message: str) -> dict:
    return {"error": int(code), "message": message}


class Broker:
    def __init__(self, config: BrokerConfig):
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.quorum = MetadataQuorum(
            config.node_id,
            self.data_dir,
            parse_voters(config.quorum_voters) if config.quorum_voters else None,
            self._advertised_address,
            controller_config=ControllerConfig(
                session_timeout_ms=config.broker_session_timeout_ms,
                default_partitions=config.default_partitions,
                default_replication_factor=config.default_replication_factor,
            ),
            heartbeat_ms=config.broker_heartbeat_interval_ms,
            observer_host=config.host,
            on_first_controller=self._import_legacy_topics,
            peer_addresses=(
                parse_node_addresses(config.peer_addresses, "peer address", "--peer-addresses")
                if config.peer_addresses
                else None
            ),
        )
        self.publisher = MetadataPublisher(config.node_id)
        self.replicas: ReplicaManager | None = None  # data replication, in a cluster only
        self.topics: ImageTopics | None = None
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
        self.cluster_api = ClusterApi(self)
        self.reassignment_api = ReassignmentApi(self)
        self.metrics.register_group_stats(self.groups.stats)
        self._background: set[asyncio.Task[Any]] = set()
        self._creating: set[str] = set()
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
            ApiKey.OFFSET_FOR_LEADER_EPOCH: self.data.offsets_for_leader_epoch,
            ApiKey.DESCRIBE_CLUSTER: self.cluster_api.describe_cluster,
            ApiKey.DESCRIBE_QUORUM: self.cluster_api.describe_quorum,
            ApiKey.BROKER_REGISTRATION: self.cluster_api.broker_registration,
            ApiKey.BROKER_HEARTBEAT: self.cluster_api.broker_heartbeat,
            ApiKey.ALLOCATE_PRODUCER_IDS: self.cluster_api.allocate_producer_ids,
            ApiKey.ALTER_PARTITION: self.cluster_api.alter_partition,
            ApiKey.DESCRIBE_LOG_DIRS: self.reassignment_api.describe_log_dirs,
            ApiKey.ELECT_LEADERS: self.reassignment_api.elect_leaders,
            ApiKey.ALTER_PARTITION_REASSIGNMENTS: (
                self.reassignment_api.alter_partition_reassignments
            ),
            ApiKey.LIST_PARTITION_REASSIGNMENTS: (
                self.reassignment_api.list_partition_reassignments
            ),
        }
        self._started = False

    # -- lifecycle ---------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self.server.port

    @property
    def image(self) -> MetadataImage:
        """The current metadata image (read-only; replaced on every committed change)."""
        return self.quorum.image

    metadata = image  # the name the replica manager (step B) reads

    @property
    def cluster_id(self) -> str:
        cid = self.image.cluster_id
        assert cid is not None
        return cid

    def _advertised_address(self) -> tuple[str, int] | None:
        """Where clients (and other brokers) reach us; None until we listen."""
        if not self.server.port:
            return None
        return (self.config.advertised, self.server.port)

    async def start(self) -> None:
        cfg = self.config
        self.data_dir.mkdir(parents=True, exist_ok=True)
        check_node_id(self.data_dir, cfg.node_id)
        self.topics = ImageTopics(lambda: self.quorum.image)
        self.producer_ids = ProducerIdManager(
            self.allocate_producer_ids,
            lambda: self.image.next_producer_id,
            cfg.producer_id_block_size,
        )
        default = LogConfig.from_dict(dict(cfg.topic_defaults)) if cfg.topic_defaults else None
        image = lambda: self.quorum.image  # noqa: E731
        # the metadata image is the one home of topic configs; the storage mirrors them
        self.logs = LogManager(
            self.data_dir,
            default,
            topic_overrides=lambda: {
                name: dict(image().topic_config(name)) for name in image().topics
            },
        )
        await self.logs.start()
        self.replicas = self._replica_manager()
        # order matters: logs exist before the replicas use them, and go after they stop
        self.publisher.add_listener(self)
        if self.replicas is not None:
            self.publisher.add_listener(self.replicas)
        self.publisher.add_listener(self.groups)
        self.publisher.add_listener(_RemovedLogs(self))
        self.quorum.loader.add_listener(self.publisher.publish)
        try:
            if self.replicas is not None:
                await self.replicas.start()
            self.groups.start()
            await self.quorum.start()
            await self.server.start(cfg.host, cfg.port)
            await self.quorum.wait_ready()
            self._after_ready()
            if cfg.metrics_port is not None:
                self.metrics_server = MetricsServer(self.metrics)
                await self.metrics_server.start(cfg.metrics_host, cfg.metrics_port)
                log.info(
                    "metrics on http://%s:%d/metrics", cfg.metrics_host, self.metrics_server.port
                )
        except BaseException:
            await self.server.stop(0)
            await self.groups.stop()
            if self.replicas is not None:
                await self.replicas.stop()
            if getattr(self.quorum, "raft", None) is not None:
                await self.quorum.stop()
            await self.logs.stop()
            raise
        self._started = True
        log.info(
            "broker %d (cluster %s) serving %d topics on %s:%d",
            cfg.node_id,
            self.cluster_id,
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
        if self.replicas is not None:
            await self.replicas.stop()
        for task in list(self._background):
            task.cancel()
        await self.quorum.stop()
        assert self.logs is not None
        await self.logs.stop()
        log.info("broker stopped cleanly")

    def _after_ready(self) -> None:
        """Registered and caught up: drop stray logs, retire an imported topics.json."""
        assert self.logs is not None
        mine = self.publisher.local
        for plog in list(self.logs.logs()):
            if (plog.topic, plog.partition) not in mine:
                log.warning("deleting stray log %s-%d", plog.topic, plog.partition)
                self.logs.delete_log(plog.topic, plog.partition)
        legacy = self.data_dir / TOPICS_FILE
        if legacy.exists():
            names = {info.name for info in TopicStore(self.data_dir).all()}
            if names <= set(self.image.topics):
                legacy.replace(legacy.with_name(TOPICS_FILE + ".imported"))
                log.info("topics.json imported into the metadata log")
            else:
                log.warning(
                    "%s holds topics the metadata log does not: it is imported only when "
                    "this node is the first controller of a new quorum",
                    legacy,
                )

    def _import_legacy_topics(self, controller: Controller) -> list[Record]:
        """A single-node data dir's topics.json (and producer ids), as records, once."""
        legacy = self.data_dir / TOPICS_FILE
        me = self.config.node_id
        records: list[Record] = []
        next_pid = legacy_next_id(self.data_dir)
        if next_pid > controller.image.next_producer_id:
            records += controller._commit([ProducerIdsBlock(me, next_pid)])
        if controller.image.topics or not legacy.exists():
            return records
        imported = len(records)
        for info in TopicStore(self.data_dir).all():
            records.append(TopicRecord(info.name, info.topic_id))
            for p in range(info.partitions):
                records.append(PartitionRecord(info.name, p, (me,), (me,), me, 0, 0))
            records += [ConfigRecord("topic", info.name, k, v) for k, v in info.configs.items()]
        log.info("importing %s into the metadata log", legacy)
        controller._commit(records[imported:])
        return records

    # -- following the metadata image ------------------------------------------------------
    def _replica_manager(self) -> ReplicaManager | None:
        """Data replication (broker/replica_manager.py) in a cluster (``--quorum-voters``).

        A quorum of one keeps the single-node data path: every partition has one replica.
        """
        if self.config.quorum_voters is None:
            return None
        assert self.logs is not None

        rm = ReplicaManager(
            self.config.node_id,
            self.logs,
            self.waiters,
            alter_partition=self.alter_partition,
            broker_address=self.quorum.broker_address,
            broker_epoch=lambda: self.quorum.broker_epoch,
            config=ReplicationConfig(replica_lag_time_max_ms=self.config.replica_lag_time_max_ms),
        )
        self.data.replicas = rm
        self.metrics.register_reassignment_throttle(rm.inbound_throttle, rm.outbound_throttle)
        return rm

    def on_partitions_changed(self, image: MetadataImage, changes: PartitionChanges) -> None:
        """Create logs for partitions assigned here and mirror topic configs.

        Logs of removed partitions go last (``_RemovedLogs``), once the replica manager
        and the group coordinator have let go of them.
        """
        logs = self.logs
        assert logs is not None
        for part in (*changes.leaders.values(), *changes.followers.values()):
            plog = self._find_log(part.topic, part.partition)
            if plog is None:
                plog = logs.create_log(
                    part.topic, part.partition, dict(image.topic_config(part.topic))
                )
            if part.replicas == (self.config.node_id,):
                plog.high_watermark = plog.log_end_offset  # the only replica: HW = LEO
        for name in image.topics:
            wanted = dict(image.topic_config(name))
            if wanted != dict(logs.topic_overrides(name)):
                logs.set_topic_config(name, wanted)
        if changes:
            for key in changes.leaders.keys() | changes.followers.keys():
                self.waiters.notify(key)

    def drop_removed_logs(self, changes: PartitionChanges) -> None:
        assert self.logs is not None
        for key in changes.deleted:
            if self._find_log(*key) is not None:
                self.logs.delete_log(*key)
            self.waiters.notify(key)

    # -- shared helpers for the API handlers -------------------------------------------
    def _find_log(self, topic: str, partition: int) -> PartitionLog | None:
        assert self.logs is not None
        try:
            return self.logs.get_log(topic, partition)
        except (KeyError, LogMQError):
            return None

    def local_log(self, topic: str, partition: int) -> PartitionLog | None:
        """This broker's replica of a partition, whatever its role."""
        if self.image.partition(topic, partition) is None:
            return None
        return self._find_log(topic, partition)

    def get_log(self, topic: str, partition: int) -> PartitionLog | None:
        """The log of a partition this broker leads; None if unknown.

        NOT_LEADER_OR_FOLLOWER (retriable: clients refresh metadata) when another broker
        leads it or it has no leader.
        """
        part = self.image.partition(topic, partition)
        if part is None:
            return None
        if part.leader != self.config.node_id:
            raise LogMQError(
                f"broker {self.config.node_id} does not lead {topic}-{partition} "
                f"(leader: {part.leader})",
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
            )
        return self._find_log(topic, partition)

    def check_leader_epoch(self, topic: str, partition: int, leader_epoch: int) -> None:
        """FENCED_LEADER_EPOCH for a client behind us, UNKNOWN_LEADER_EPOCH if ahead."""
        part = self.image.partition(topic, partition)
        if part is None or leader_epoch < 0:
            return
        if leader_epoch < part.leader_epoch:
            raise LogMQError(
                f"leader epoch {leader_epoch} of {topic}-{partition} is stale "
                f"(current {part.leader_epoch})",
                ErrorCode.FENCED_LEADER_EPOCH,
            )
        if leader_epoch > part.leader_epoch:
            raise LogMQError(
                f"leader epoch {leader_epoch} of {topic}-{partition} is not known here yet",
                ErrorCode.UNKNOWN_LEADER_EPOCH,
            )

    async def allocate_producer_ids(self, count: int) -> int:
        """A fresh block of ``count`` producer ids from the controller; its first id."""
        body = {
            "broker_id": self.config.node_id,
            "broker_epoch": self.quorum.broker_epoch,
            "count": count,
        }
        out = await self.run_on_controller(ApiKey.ALLOCATE_PRODUCER_IDS, body)
        if out.get("error", 0) != 0:
            raise LogMQError(out.get("message") or "no producer ids", ErrorCode(out["error"]))
        return int(out["start"])

    async def alter_partition(self, request: AlterPartitionRequest) -> AlterPartitionResponse:
        """Ask the controller for an ISR change (for the replica manager)."""
        body = {
            "broker_id": request.broker_id,
            "broker_epoch": request.broker_epoch,
            "topic": request.topic,
            "partition": request.partition,
            "leader_epoch": request.leader_epoch,
            "partition_epoch": request.partition_epoch,
            "new_isr": list(request.new_isr),
        }
        return alter_partition_response(await self.run_on_controller(ApiKey.ALTER_PARTITION, body))

    async def run_on_controller(self, api_key: int, body: dict[str, Any]) -> dict[str, Any]:
        """Run a metadata-changing request on the controller, here or forwarded.

        Retries while the quorum has no ready leader; the answer comes once this broker's
        own image holds the change, so a client that reads metadata next sees it.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FORWARD_TIMEOUT_S
        while True:
            try:
                if self.quorum.is_controller:
                    handler = self._handlers[api_key]
                    req = Request(api_key, 0, 0, "forwarded", body, memoryview(b""))
                    reply = await handler(req)
                    assert reply is not None
                    return dict(reply.body)
                if self.quorum.controller_address() is None:
                    raise LogMQError("no controller yet", ErrorCode.NOT_CONTROLLER)
                forwarded = {**body, "forwarded_by": self.config.node_id}
                out = await self.quorum.call_controller(
                    api_key, forwarded, timeout=FORWARD_TIMEOUT_S
                )
            except LogMQError as e:
                if not e.code.retriable and e.code is not ErrorCode.NETWORK_EXCEPTION:
                    raise
                if loop.time() >= deadline:
                    raise LogMQError(
                        f"no controller answered within {FORWARD_TIMEOUT_S:.0f}s: {e}",
                        ErrorCode.NOT_CONTROLLER,
                    ) from None
                await self.quorum.wait_for(lambda _img: False, 0.2)  # until a change, or soon
                continue
            offset = out.pop("metadata_offset", None)
            if isinstance(offset, int):
                try:
                    await self.quorum.wait_for_offset(offset, FORWARD_TIMEOUT_S)
                except TimeoutError:
                    log.warning("metadata offset %d not applied here in time", offset)
            return out

    async def _controller_request(self, request: Request) -> Reply:
        if self.quorum.is_controller:
            handler = self._handlers[request.api_key]
            reply = await handler(request)
            assert reply is not None
            return reply
        return Reply(await self.run_on_controller(request.api_key, request.body))

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def create_topic_soon(self, name: str, body: dict[str, Any]) -> None:
        """Ask the controller for a topic in the background (from synchronous paths)."""
        if name in self._creating:
            return
        self._creating.add(name)

        async def create() -> None:
            try:
                out = await self.run_on_controller(ApiKey.CREATE_TOPICS, {"topics": [body]})
                for entry in out.get("topics", []):
                    if entry.get("error") not in (0, int(ErrorCode.TOPIC_ALREADY_EXISTS)):
                        log.warning("cannot create topic %s: %s", name, entry.get("message"))
            except LogMQError as e:
                log.warning("cannot create topic %s: %s", name, e)
            finally:
                self._creating.discard(name)

        self._spawn(create(), f"create-{name}")

    def create_internal_topic_soon(
        self, name: str, partitions: int, configs: dict[str, str] | None = None
    ) -> None:
        """For broker subsystems (group coordinator): create a ``__`` topic if missing."""
        problem = topic_name_error(name)
        if problem:
            raise LogMQError(problem, ErrorCode.INVALID_TOPIC_EXCEPTION)
        cfg = dict(configs or {})
        LogConfig.from_dict(cfg)
        rf = max(1, min(3, len(self.image.active_brokers())))
        body = {
            "topic": name,
            "partitions": partitions,
            "replication_factor": rf,
            "configs": cfg,
            "internal": True,
        }
        self.create_topic_soon(name, body)

    def maybe_auto_create(self, topic: str) -> TopicInfo | None:
        """Start auto-creating ``topic`` when allowed; None: it does not exist yet."""
        if not self.config.auto_create_topics or topic_name_error(topic):
            return None
        if topic.startswith("__"):
            return None
        log.info("auto-creating topic %s", topic)
        self.create_topic_soon(topic, {"topic": topic, "partitions": -1})
        return None

    async def auto_create(self, topic: str) -> TopicInfo | None:
        """Auto-create ``topic`` (Metadata with allow_auto_create) and wait for it."""
        assert self.topics is not None
        if not self.config.auto_create_topics or topic_name_error(topic):
            return None
        if topic.startswith("__"):
            return None
        log.info("auto-creating topic %s", topic)
        await self.run_on_controller(ApiKey.CREATE_TOPICS, {"topics": [{"topic": topic}]})
        return self.topics.get(topic)

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
            if key in GROUP_APIS and not self.groups.partition_count:
                await self.groups.create_offsets_topic()  # first use: create it
            if key in CONTROLLER_APIS and not self.quorum.is_controller:
                return await self._controller_request(request)
            return await handler(request)
        except LogMQError as e:
            self.metrics.error(key, e.code)
            return Reply(error_body(e.code, str(e)))
        except Exception as e:
            log.exception("%s request from %r failed", ApiKey(key).name, request.client_id)
            return Reply(error_body(ErrorCode.UNKNOWN_SERVER_ERROR, f"{type(e).__name__}: {e}"))
