"""The composition root: builds each service once, both front doors, and the servers.

``Broker`` owns every long-lived piece and their order of start and stop; it decides
nothing about requests. Each door's registry (native/registry.py, kafka/registry.py)
binds its handlers and tells the pipeline which steps apply. Topic metadata comes from
the metadata image (broker/metadata/quorum_service.py), in a cluster and on a single node
alike (a quorum of one); changes that concern this broker's partitions reach it through
the MetadataPublisher (logs created and deleted by broker/replica/local_logs.py, then the group
coordinator). Requests that
change metadata run on the controller: a broker that is not the controller forwards them
and answers once its own image has caught up (controller_forwarding.py).

Stop is the orderly shutdown SIGTERM asks for: stop accepting, wake parked fetches, let
every connection answer what it already read, stop the group coordinator, leave the
quorum, then flush the logs and write the clean-shutdown marker (LogManager.stop), and
last release the data dir's lock, which start() takes before it reads anything there
(storage/dir_lock.py: one broker process per data dir).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from logmq.broker.config import BrokerConfig
from logmq.broker.coordinator.group_service import GroupCoordinatorService
from logmq.broker.coordinator.peers import BrokerClients
from logmq.broker.coordinator.txn_markers import MarkerSender, MarkerWriter
from logmq.broker.coordinator.txn_service import TransactionCoordinatorService
from logmq.broker.coordinator.txn_verification import TransactionalProduceCheck, TxnVerifier
from logmq.broker.metadata.add_scram import apply_add_scram
from logmq.broker.metadata.endpoints import Endpoints, listen_plan, planned
from logmq.broker.metadata.image_topics import ImageTopics
from logmq.broker.metadata.producer_ids import ProducerIdManager
from logmq.broker.metadata.publisher import MetadataPublisher
from logmq.broker.metadata.quorum_service import MetadataQuorum
from logmq.broker.metadata.security_admin import SecurityAdmin
from logmq.broker.metadata.security_changes import SecurityChanges
from logmq.broker.metadata.topic_admin import TopicAdmin
from logmq.broker.metadata.topic_creation import TopicCreator
from logmq.broker.metrics import BrokerMetrics, MetricsServer
from logmq.broker.replica.consumer_reads import ConsumerReads
from logmq.broker.replica.fetch_waiter import FetchWaiters
from logmq.broker.replica.fetcher import FetcherConfig
from logmq.broker.replica.follower_reads import FollowerReads
from logmq.broker.replica.leader_appends import LeaderAppends
from logmq.broker.replica.local_logs import LocalLogs, RemovedLogs
from logmq.broker.replica.partition_views import PartitionViews
from logmq.broker.replica.produce_path import ProducePath
from logmq.broker.replica.record_deletion import RecordDeletion
from logmq.broker.replica.remote_log import RemoteLogManager, build_remote_log
from logmq.broker.replica.remote_reads import RemoteReads
from logmq.broker.replica.remote_status import RemoteTierStatus
from logmq.broker.replica.replica_manager import ReplicaManager, ReplicationConfig
from logmq.client.security import ClientSecurity
from logmq.cluster.controller_api import ControllerConfig
from logmq.cluster.meta_properties import check_node_id
from logmq.cluster.metadata_image import MetadataImage
from logmq.cluster.node_addresses import parse_node_addresses, parse_voters
from logmq.errors import ErrorCode, InvalidConfigError
from logmq.group import OFFSETS_TOPIC
from logmq.kafka.apis import KafkaApis, kafka_error_reply, throttled_reply
from logmq.kafka.authorization import KafkaAuthorization
from logmq.kafka.configs import KafkaConfigApis
from logmq.kafka.consumer_groups import KafkaConsumerGroupApis
from logmq.kafka.group_membership import KafkaGroupMembershipApis
from logmq.kafka.groups import KafkaGroupApis
from logmq.kafka.offsets import KafkaOffsetApis
from logmq.kafka.partition_admin import KafkaPartitionAdminApis
from logmq.kafka.producers import KafkaProducerApis
from logmq.kafka.registry import KAFKA_APIS, kafka_wire
from logmq.kafka.sasl import KafkaSaslApis
from logmq.kafka.security_admin import KafkaSecurityAdminApis
from logmq.kafka.topics import KafkaTopicApis
from logmq.kafka.transactions import KafkaTransactionApis
from logmq.kafka.versions import kafka_api_name
from logmq.native.admin_api import AdminApi
from logmq.native.authorization import NativeAuthorization
from logmq.native.cluster_api import ClusterApi
from logmq.native.controller_forwarding import ControllerForwarder
from logmq.native.data_api import DataApi
from logmq.native.errors import native_api_name, native_error_reply
from logmq.native.group_api import GroupApi
from logmq.native.reassignment_api import ReassignmentApi
from logmq.native.registry import NATIVE_APIS
from logmq.native.remote_segment_updates import RemoteSegmentUpdates
from logmq.native.remote_tier_api import RemoteTierApi
from logmq.native.sasl_api import NativeSaslApi
from logmq.native.security_api import SecurityApi
from logmq.native.throttling import throttled
from logmq.native.txn_api import TxnApi
from logmq.net.api_registry import ApiRegistry
from logmq.net.bind_check import PlannedListener, check_listeners, unavailable
from logmq.net.codec import Request
from logmq.net.pipeline import FrontDoor, RequestPipeline
from logmq.net.reply import Reply
from logmq.net.server import ServerOptions, TcpServer
from logmq.security.authentication import Authenticator
from logmq.security.authorization import Authorization
from logmq.security.inter_broker import inter_broker_client_properties
from logmq.security.quota_enforcer import QuotaEnforcer, RequestTimeQuota
from logmq.security.settings import (
    SecuritySettings,
    raft_tls,
)
from logmq.storage.config import LogConfig
from logmq.storage.dir_lock import DataDirLock
from logmq.storage.log_manager import LogManager
from logmq.storage.remote.config import RemoteStorageSettings
from logmq.txn import TxnConfig

log = logging.getLogger("logmq.broker")


def _inter_broker_security(security: SecuritySettings, replicated: bool) -> ClientSecurity | None:
    """How this broker reaches the others' native listener (replication, the controller)."""
    props = inter_broker_client_properties(security, security.properties, replicated=replicated)
    if props is None:
        return None
    try:
        return ClientSecurity.from_properties(props)
    except (ValueError, OSError) as e:
        raise InvalidConfigError(
            f"inter-broker listener {security.inter_broker_listener}: {e}"
        ) from None


class Broker:
    """One broker: the pieces that need no storage are built here, the services in
    ``start()`` once the logs are open, each with its collaborators passed in."""

    # Built by start(), after storage: every handler's collaborators exist before the
    # first request is read, so nothing below checks for None.
    logs: LogManager
    local_logs: LocalLogs
    replicas: ReplicaManager  # replicates only in a cluster (``replicated``)
    groups: GroupCoordinatorService
    txns: TransactionCoordinatorService
    data: DataApi
    admin: AdminApi
    group_api: GroupApi
    reassignment_api: ReassignmentApi

    def __init__(self, config: BrokerConfig):
        self._started = False
        self.config = config
        # A quorum of one keeps the single-node data path: every partition one replica.
        self.replicated = config.quorum_voters is not None
        self.data_dir = Path(config.data_dir)
        self.dir_lock = DataDirLock(self.data_dir)
        # Kafka's listener model and security settings (security/): every listener, what
        # each requires, and the authenticator that holds connections to it
        self.security = SecuritySettings.from_properties(
            config.properties,
            native=(config.host, config.port),
            kafka=(
                (config.kafka_host or config.host, config.kafka_port)
                if config.kafka_port is not None
                else None
            ),
        )
        # the remote tier's settings (remote.log.*, rsm.config.*): a bad one stops the start
        self.remote_settings = RemoteStorageSettings.from_properties(config.properties)
        for key in self.remote_settings.unrecognised:
            log.warning("unknown tiered storage setting %s (ignored)", key)
        self.remote_log: RemoteLogManager | None = None
        self.remote_status: RemoteTierStatus | None = None
        # how this broker reaches the others' native listener (replication, the controller)
        self.inter_broker_security = _inter_broker_security(self.security, self.replicated)
        # --add-scram: written at format by the first controller, created later if missing
        self._add_scram = config.bootstrap_scram_users()
        self.quorum = MetadataQuorum(
            config.node_id,
            self.data_dir,
            parse_voters(config.quorum_voters) if config.quorum_voters else None,
            lambda: self.endpoints.native(),
            kafka_advertised=lambda listener=None: self.endpoints.kafka(listener),
            kafka_listeners=lambda: self.endpoints.kafka_listeners(),
            controller_config=ControllerConfig(
                session_timeout_ms=config.broker_session_timeout_ms,
                default_partitions=config.default_partitions,
                default_replication_factor=config.default_replication_factor,
                topic_defaults=dict(config.topic_defaults),
                remote_storage_enabled=self.remote_settings.enabled,
            ),
            heartbeat_ms=config.broker_heartbeat_interval_ms,
            bootstrap_scram=[(u.name, u.credential) for u in self._add_scram],
            client_security=self.inter_broker_security,
            raft_tls=raft_tls(self.security.properties, self.security),
            observer_host=config.host,
            peer_addresses=(
                parse_node_addresses(config.peer_addresses, "peer address", "--peer-addresses")
                if config.peer_addresses
                else None
            ),
        )
        self.publisher = MetadataPublisher(config.node_id)
        self.waiters = FetchWaiters()
        self.metrics = BrokerMetrics(lambda: self.waiters.parked)
        self._tls_reload_task: asyncio.Task | None = None
        self.authenticator = Authenticator(self.security, self._scram_credential, self.metrics)
        options = ServerOptions(
            max_frame_size=config.max_frame_size,
            max_connections=config.max_connections,
            idle_timeout_s=config.idle_timeout_ms / 1000,
            max_in_flight=config.max_in_flight_per_connection,
            socket_buffer_bytes=config.socket_buffer_bytes,
            zero_copy=config.zero_copy,
        )
        # Both front doors: one server shell each, with the door's codec, and one request
        # pipeline (net/pipeline.py) in front of each door's handler table, which
        # start() binds from the door's registry once the services exist. The
        # registries (native/registry.py, kafka/registry.py) say what each step applies to.
        self.native_pipeline = self._pipeline(
            NATIVE_APIS,
            native_error_reply(lambda: self.admin.api_list()),
            native_api_name,
            unknown_api=ErrorCode.UNKNOWN_API,
        )
        self.kafka_pipeline = self._pipeline(KAFKA_APIS, kafka_error_reply, kafka_api_name)
        native = self.security.native
        self.server = TcpServer(
            self.native_pipeline,
            options,
            self.metrics,
            is_concurrent=NATIVE_APIS.predicate("concurrent"),
            is_read_only=NATIVE_APIS.predicate("read_only"),
            name="native",
            **self._listener_security(native.name),
        )
        # one server per Kafka listener, all in front of the one Kafka pipeline
        self.kafka_wire = kafka_wire()
        self.kafka_servers = [
            TcpServer(
                self.kafka_pipeline,
                options,
                self.metrics,
                is_concurrent=KAFKA_APIS.predicate("concurrent"),
                is_read_only=KAFKA_APIS.predicate("read_only"),
                wire=self.kafka_wire,
                name="kafka",
                **self._listener_security(listener.name),
            )
            for listener in self.security.kafka
        ]
        self.kafka_server: TcpServer | None = self.kafka_servers[0] if self.kafka_servers else None
        self.endpoints = Endpoints(
            config, self.security, self.server, self.kafka_servers, lambda: self.quorum.image
        )
        # The steps before the handlers, in order. Authentication first: nothing else
        # runs for a connection that has not logged in.
        self.native_sasl = NativeSaslApi(self.authenticator, NATIVE_APIS.keys("before_auth"))
        self.kafka_sasl = KafkaSaslApis(
            self.authenticator, KAFKA_APIS.keys("before_auth"), self.kafka_wire
        )
        self.native_pipeline.add_guard(self.native_sasl.guard)
        self.kafka_pipeline.add_guard(self.kafka_sasl.guard)
        # then the ACLs a request needs as a whole (its entities are the handlers' to check)
        self.authorization = Authorization(self.security, lambda: self.quorum.image)
        self.native_authz = NativeAuthorization(self.authorization, NATIVE_APIS)
        self.native_pipeline.add_guard(self.native_authz.guard)
        self.kafka_pipeline.add_guard(KafkaAuthorization(self.authorization, KAFKA_APIS).guard)
        # then the offsets topic before the first group request (either door), and
        # metadata changes run on the controller (the native door; the Kafka door's
        # handlers ask the controller through the forwarder themselves)
        self.native_pipeline.add_guard(self._offsets_topic_guard, NATIVE_APIS.keys("offsets_topic"))
        self.kafka_pipeline.add_guard(self._offsets_topic_guard, KAFKA_APIS.keys("offsets_topic"))
        self.metrics.register_listener("native", native_api_name)
        self.metrics.register_listener("kafka", kafka_api_name)
        self.kafka: KafkaApis | None = None
        self.metrics_server: MetricsServer | None = None
        # the controller's requests run through the native door's handlers when this
        # broker is the controller
        self.forwarder = ControllerForwarder(
            config.node_id, self.quorum, self.native_pipeline.door.handlers
        )
        self.native_pipeline.add_guard(self.forwarder.forward_guard, NATIVE_APIS.keys("controller"))
        self.topics = ImageTopics(lambda: self.quorum.image)
        self.producer_ids = ProducerIdManager(
            self.forwarder.allocate_producer_ids,
            lambda: self.quorum.image.next_producer_id,
            config.producer_id_block_size,
        )
        self.topic_creator = TopicCreator(
            self.quorum,
            self.topics,
            self.forwarder.run_on_controller,
            auto_create_topics=config.auto_create_topics,
        )
        self.cluster_api = ClusterApi(config.node_id, self.quorum)

    def _pipeline(
        self,
        registry: ApiRegistry,
        error_reply: Callable[[Request, ErrorCode, str], Reply],
        api_name: Callable[[int], str],
        unknown_api: ErrorCode = ErrorCode.UNSUPPORTED_VERSION,
    ) -> RequestPipeline:
        door = FrontDoor(
            registry.door,
            {},
            registry.served_versions(),
            error_reply,
            api_name=api_name,
            unknown_api=unknown_api,
        )
        return RequestPipeline(door, self.metrics)

    # -- lifecycle ---------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self.server.port

    @property
    def image(self) -> MetadataImage:
        """The current metadata image (read-only; replaced on every committed change)."""
        return self.quorum.image

    @property
    def cluster_id(self) -> str:
        cid = self.image.cluster_id
        assert cid is not None
        return cid

    @property
    def kafka_port(self) -> int | None:
        """The first Kafka listener's port; None without one (or before it listens)."""
        return self.kafka_server.port if self.kafka_server is not None else None

    def kafka_ports(self) -> dict[str, int]:
        """Each Kafka listener's port by listener name."""
        return {s.listener: s.port for s in self.kafka_servers}

    def _listener_security(self, name: str) -> dict[str, Any]:
        """What a listener's server needs: its name, TLS context and connection set-up."""
        sec = self.security.of(name)
        return {
            "listener": name,
            "tls": sec.tls.context if sec.tls is not None else None,
            "init_context": self.authenticator.context_initializer(name),
        }

    def _scram_credential(self, name: str, mechanism: str) -> Any:
        """A user's SCRAM credential as the metadata log has it (None: no such user)."""
        security = getattr(self.quorum.image, "security", None)
        if security is None:
            return None
        return security.scram_credential(name, mechanism)

    async def _offsets_topic_guard(self, request: Request) -> None:
        """The group service's step (it exists once storage has started)."""
        await self.groups.offsets_topic_guard(request)

    async def start(self) -> None:
        # every fixed port first: one taken is a one-line error naming its option, with
        # nothing written anywhere yet (net/bind_check.py)
        check_listeners(listen_plan(self.config, self.security, self.quorum.voters))
        created = _first_missing(self.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # before anything else reads or writes the data dir: a second process on it
        # would otherwise recover, append to and mark clean the live broker's files
        self.dir_lock.acquire()
        # A failed first start removes the directory it made, until the node has taken
        # part in a multi-node quorum: a Raft vote it cast there must outlive it.
        self._may_discard_dir = created is not None
        try:
            await self._start_locked()
        except BaseException:
            self.dir_lock.release()
            if created is not None and self._may_discard_dir:
                shutil.rmtree(created, ignore_errors=True)
            raise

    def _planned(self, listener: str) -> PlannedListener:
        return planned(listen_plan(self.config, self.security, self.quorum.voters), listener)

    async def _start_locked(self) -> None:
        cfg = self.config
        check_node_id(self.data_dir, cfg.node_id)
        default = LogConfig.from_dict(dict(cfg.topic_defaults)) if cfg.topic_defaults else None
        image = lambda: self.quorum.image  # noqa: E731
        # the metadata image is the one home of topic configs; the storage mirrors them
        self.logs = LogManager(
            self.data_dir,
            default,
            topic_overrides=lambda: {
                name: dict(image().topic_config(name)) for name in image().topics
            },
            min_free_bytes=cfg.min_free_bytes,
            max_open_segments=open_segment_budget(),
            tiered_storage=self.remote_settings.enabled,
        )
        await self.logs.start()
        self._build_services()
        # order matters: logs exist before the replicas use them, and go after they stop
        self.publisher.add_listener(self.local_logs)
        self.publisher.add_listener(self.replicas)
        self.publisher.add_listener(self.groups)
        self.publisher.add_listener(self.txns)
        self.publisher.add_listener(RemovedLogs(self.local_logs))
        self.quorum.loader.add_listener(self.publisher.publish)
        try:
            await self.replicas.start()
            # the Kafka listeners before the native port: registration (which waits for
            # that) then carries the Kafka endpoint too
            for server, listener in zip(self.kafka_servers, self.security.kafka, strict=True):
                await _listen(server.start, self._planned(listener.name))
            for warning in self.security.warnings():
                log.warning("%s", warning)
            log.info("%s", self.security.native_summary())
            self._may_discard_dir = self._may_discard_dir and not self.replicated
            await self.quorum.start()
            await _listen(self.server.start, self._planned(self.security.native.name))
            await self.quorum.wait_ready()
            if self.remote_log is not None:  # the store checked: a wrong setting is named
                await self.remote_log.start()
            # before the ready line: a client that logs in next finds the users
            await apply_add_scram(self.security_admin, lambda: self.quorum.image, self._add_scram)
            self.groups.start()  # caught up: load the shards of what we lead now
            self.txns.start()
            self._after_ready()
            if any(sec.tls is not None for sec in self.security.per_listener.values()):
                self._tls_reload_task = asyncio.get_running_loop().create_task(
                    self._reload_certificates(), name="logmq-tls-reload"
                )
            if cfg.metrics_port is not None:
                self.metrics_server = MetricsServer(self.metrics)
                await _listen(
                    self.metrics_server.start,
                    PlannedListener(
                        "the metrics endpoint", cfg.metrics_host, cfg.metrics_port, "--metrics-port"
                    ),
                )
                log.info(
                    "metrics on http://%s:%d/metrics", cfg.metrics_host, self.metrics_server.port
                )
        except BaseException:
            for server in self.kafka_servers:
                await server.stop(0)
            await self.server.stop(0)
            await self.txns.stop()
            await self.groups.stop()
            self.broker_clients.close()
            if self.remote_log is not None:
                await self.remote_log.stop()
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
        for server, listener in zip(self.kafka_servers, self.security.kafka, strict=True):
            log.info("Kafka clients on %s://%s:%d", listener.name, listener.host, server.port)

    def _build_services(self) -> None:
        """The services over the open logs, each given exactly what it uses."""
        cfg = self.config
        logs = self.logs
        self.metrics.register_storage(logs.disk)
        self.quorum.storage_full = lambda: logs.disk.full  # carried by heartbeats
        self.local_logs = LocalLogs(cfg.node_id, logs, lambda: self.quorum.image, self.waiters)
        if self.remote_settings.enabled:
            self.remote_log = build_remote_log(
                cfg.node_id,
                self.remote_settings,
                logs,
                lambda: self.quorum.image,
                RemoteSegmentUpdates(
                    self.forwarder.run_on_controller,
                    cfg.node_id,
                    lambda: self.quorum.broker_epoch,
                ),
                lambda: self.quorum.is_controller,
            )
            self.remote_status = RemoteTierStatus(self.remote_log)
            self.metrics.register_remote_tier(self.remote_status)
        self.replicas = self._replica_manager()
        # the data paths over the replicas, each one concept (broker/replica/replica_manager.py)
        self.appends = LeaderAppends(self.replicas)
        self.reads = ConsumerReads(
            self.replicas,
            RemoteReads(self.remote_log) if self.remote_log is not None else None,
            self.remote_settings.remote_fetch_max_wait_ms,
        )
        self.follower_reads = FollowerReads(self.replicas, self.remote_log)
        self.deletions = RecordDeletion(self.replicas, self.remote_log)
        self.groups = GroupCoordinatorService(
            cfg,
            self.quorum,
            logs,
            self.local_logs,
            self.replicas,
            self.topic_creator,
            self.forwarder.run_on_controller,
        )
        self.metrics.register_group_stats(self.groups.stats)
        views = self.views = PartitionViews(cfg.node_id, lambda: self.quorum.image, logs)
        self.metrics.register_partition_stats(views.partition_stats)
        self.metrics.register_group_lag(self.groups.committed_offsets, views.high_watermark)
        self.metrics.register_replication(views.led_partitions)
        # transactions: the coordinator of the __transaction_state partitions led here,
        # the markers it sends (to this broker's partitions directly, to others' over
        # their native ports) and KIP-890's check of transactional produces
        self.broker_clients = BrokerClients(
            cfg.node_id, self.quorum.broker_address, security=self.inter_broker_security
        )
        # a marker on __consumer_offsets settles the transaction's offsets (TxnOffsetCommit)
        self.marker_writer = MarkerWriter(
            self.replicas,
            self.appends,
            offsets_topic=OFFSETS_TOPIC,
            on_offsets_marker=self.groups.complete_transaction,
        )
        self.txns = TransactionCoordinatorService(
            cfg,
            self.quorum,
            logs,
            self.local_logs,
            self.replicas,
            self.topic_creator,
            self.producer_ids.next_id,
            MarkerSender(
                cfg.node_id, lambda: self.quorum.image, self.marker_writer, self.broker_clients
            ),
            partitions=cfg.transaction_state_partitions,
            config=TxnConfig(
                max_timeout_ms=cfg.transaction_max_timeout_ms,
                id_expiration_ms=cfg.transactional_id_expiration_ms,
            ),
        )
        # a transactional produce's checks, the same on both doors (KIP-890 part 1)
        txn_produce = TransactionalProduceCheck(
            TxnVerifier(cfg.node_id, self.txns, self.broker_clients, self.local_logs.local_log),
            self.authorization,
        )
        self.produce_path = ProducePath(
            self.replicas, self.appends, lambda: self.quorum.image, self.topic_creator
        )
        # one set of client quota sensors for both doors: a client is one client
        # whichever door it comes through
        quotas = QuotaEnforcer(
            lambda: self.quorum.image,
            window_num=self.security.quota_window_num,
            window_seconds=self.security.quota_window_seconds,
        )
        self._bind_native_door(quotas, txn_produce, self.views)
        self._bind_kafka_door(quotas, txn_produce, self.views)

    def _bind_native_door(
        self, quotas: QuotaEnforcer, txn_produce: TransactionalProduceCheck, views: PartitionViews
    ) -> None:
        """The native door's handler objects, bound by its registry."""
        cfg = self.config
        self.data = DataApi(
            produce_path=self.produce_path,
            replicas=self.replicas,
            reads=self.reads,
            follower_reads=self.follower_reads,
            deletions=self.deletions,
            metrics=self.metrics,
            max_fetch_wait_ms=cfg.max_fetch_wait_ms,
            quotas=quotas,
            txn_produce=txn_produce,
        )
        self.admin = AdminApi(
            cfg,
            self.quorum,
            self.topics,
            self.topic_creator,
            self.producer_ids,
            self.metrics,
            advertised=NATIVE_APIS.versions(),
            quotas=quotas,
            txns=self.txns,
            authz=self.authorization,
        )
        self.group_api = GroupApi(self.groups, self.metrics, self.txns, self.authorization)
        self.reassignment_api = ReassignmentApi(self.quorum, views, self.metrics)
        door = self.native_pipeline.door
        door.handlers.update(
            NATIVE_APIS.bind(
                self.admin,
                self.data,
                self.group_api,
                self.cluster_api,
                self.reassignment_api,
                RemoteTierApi(self.remote_status, lambda: self.quorum.image),
                SecurityApi(self.quorum, SecurityChanges(self.quorum), self.metrics),
                TxnApi(self.marker_writer, self.txns, self.replicas, self.authorization),
                self.native_sasl,
            )
        )
        door.after = RequestTimeQuota(quotas, throttled, self._native_exempt())
        self.metrics.register_fetch_sessions("native", self.data.sessions)

    def _native_exempt(self) -> Callable[[Request], bool]:
        """Requests the request-time quota does not meter: brokers' own (CLUSTER_ACTION,
        as Kafka exempts them) and what the registry leaves unthrottled."""
        unthrottled = frozenset(NATIVE_APIS.by_key) - NATIVE_APIS.keys("throttled")
        from_broker = self.native_authz.from_broker
        return lambda req: req.api_key in unthrottled or from_broker(req)

    def _bind_kafka_door(
        self, quotas: QuotaEnforcer, txn_produce: TransactionalProduceCheck, views: PartitionViews
    ) -> None:
        """The Kafka door's handler objects, bound by its registry."""
        cfg = self.config
        image = lambda: self.quorum.image  # noqa: E731
        run_on_controller = self.forwarder.run_on_controller
        transactions = KafkaTransactionApis(self.txns, self.authorization)
        self.kafka = KafkaApis(
            node_id=cfg.node_id,
            image=image,
            controller_id=lambda: self.quorum.controller_id,
            kafka_endpoint=self.endpoints.kafka_of,
            replicas=self.replicas,
            reads=self.reads,
            produce_path=self.produce_path,
            producer_ids=self.producer_ids,
            auto_create=self.topic_creator.auto_create,
            max_fetch_wait_ms=cfg.max_fetch_wait_ms,
            advertised=KAFKA_APIS.versions(),
            authz=self.authorization,
            quotas=quotas,
            transactions=transactions,
            txn_produce=txn_produce,
        )
        self.security_admin = SecurityAdmin(run_on_controller, image)
        door = self.kafka_pipeline.door
        door.handlers.update(
            KAFKA_APIS.bind(
                self.kafka,
                KafkaOffsetApis(
                    self.groups, self.endpoints.kafka_of, self.authorization, txns=self.txns
                ),
                KafkaTopicApis(
                    TopicAdmin(run_on_controller), image, cfg.topic_defaults, self.authorization
                ),
                KafkaGroupApis(self.groups, self.authorization),
                KafkaGroupMembershipApis(self.groups),
                KafkaConsumerGroupApis(self.groups, image, self.authorization),
                KafkaConfigApis(cfg, image, run_on_controller, self.authorization),
                KafkaPartitionAdminApis(self.deletions, views, run_on_controller, image),
                KafkaProducerApis(self.replicas.leader_log, self.authorization, self.marker_writer),
                KafkaSecurityAdminApis(self.security_admin),
                transactions,
                self.kafka_sasl,
            )
        )
        unthrottled = frozenset(KAFKA_APIS.by_key) - KAFKA_APIS.keys("throttled")
        door.after = RequestTimeQuota(
            quotas, throttled_reply, lambda req: req.api_key in unthrottled
        )
        self.metrics.register_fetch_sessions("kafka", self.kafka.sessions)

    async def _reload_certificates(self) -> None:
        """New keystores take effect for new connections (see security/settings.py)."""
        while True:
            await asyncio.sleep(self.security.tls_reload_check_s)
            for sec in self.security.per_listener.values():
                if sec.tls is None:
                    continue
                if sec.tls.check() is not None:
                    log.info("listener %s: reloaded its TLS certificates", sec.name)
                elif sec.tls.last_error is not None:
                    log.warning(
                        "listener %s: keeps its TLS certificates, the new files do not load: %s",
                        sec.name,
                        sec.tls.last_error,
                    )
                    sec.tls.last_error = None  # said once per change

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        log.info("broker stopping: draining connections")
        grace = self.config.shutdown_grace_ms / 1000
        if self._tls_reload_task is not None:
            self._tls_reload_task.cancel()
            await asyncio.gather(self._tls_reload_task, return_exceptions=True)
            self._tls_reload_task = None
        await asyncio.gather(
            *(server.stop(grace, self.waiters.wake_all) for server in self.kafka_servers),
            self.server.stop(grace, self.waiters.wake_all),
        )
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        await self.txns.stop()  # after the connections: their requests were answered
        await self.groups.stop()
        self.broker_clients.close()
        if self.remote_log is not None:
            await self.remote_log.stop()
        await self.replicas.stop()
        self.topic_creator.stop()
        self.produce_path.stop()
        await self.quorum.stop()
        await self.logs.stop()
        self.dir_lock.release()  # last: the clean-shutdown marker is written
        log.info("broker stopped cleanly")

    def _after_ready(self) -> None:
        """Registered and caught up: drop logs the metadata no longer places here."""
        self.local_logs.delete_stray_logs(self.publisher.local)

    def _replica_manager(self) -> ReplicaManager:
        """The replica manager: the produce and follower-fetch paths, and in a cluster
        (``--quorum-voters``) the replicas the metadata assigns here."""
        rm = ReplicaManager(
            self.config.node_id,
            self.logs,
            self.waiters,
            alter_partitions=self.forwarder.alter_partitions,
            broker_address=self.quorum.broker_address,
            leader_logs=self.local_logs,
            metadata=lambda: self.quorum.image,
            broker_epoch=lambda: self.quorum.broker_epoch,
            replicated=self.replicated,
            fenced=lambda: self.quorum.image.fenced_brokers(),
            tier_state=self.remote_log.state_at if self.remote_log is not None else None,
            tier_log_start=self.remote_log.follow_log_start if self.remote_log else None,
            tier_log_start_of=self.remote_log.log_start_offset if self.remote_log else None,
            config=ReplicationConfig(
                replica_lag_time_max_ms=self.config.replica_lag_time_max_ms,
                fetcher=FetcherConfig(security=self.inter_broker_security),
            ),
        )
        if self.replicated:
            self.metrics.register_reassignment_throttle(rm.inbound_throttle, rm.outbound_throttle)
        return rm

    # -- dispatch ---------------------------------------------------------------------


async def _listen(start: Callable[[str, int], Any], planned: PlannedListener) -> None:
    """``start(host, port)``, a failed bind worded as the pre-start check words it."""
    try:
        await start(planned.host, planned.port)
    except OSError as err:
        raise unavailable(planned, err) from None


def _first_missing(path: Path) -> Path | None:
    """The outermost directory of ``path`` that does not exist yet (None: it exists)."""
    missing = None
    for candidate in (path, *path.parents):
        if candidate.exists():
            break
        missing = candidate
    return missing


def open_segment_budget(wanted: int = 20_000) -> int:
    """How many segments may hold a descriptor at once (storage/open_files.py).

    Appends to more partitions than this reopen files on every batch (thousands of
    partitions written round-robin: an open and a close per append), so the broker
    raises its soft descriptor limit to the hard one, as Kafka's install guides ask of
    operators, and keeps a quarter of it for connections and everything else.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
        target = hard if hard != resource.RLIM_INFINITY else 1 << 20
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # e.g. above fs.nr_open: keep what we have
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(100, min(wanted, soft * 3 // 4))
