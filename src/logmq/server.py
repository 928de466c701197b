"""The broker: wires storage, the metadata quorum, the API handlers and the server.

``Broker`` owns every long-lived piece and their order of start and stop, and dispatches
each request to its handler (api_table.py). Topic metadata comes from the metadata image
(broker/controller_service.py), in a cluster and on a single node alike (a quorum of one);
changes that concern this broker's partitions reach it through the MetadataPublisher
(logs created and deleted by local_logs.py, then the group coordinator). Requests that
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from logmq.broker.broker_clients import BrokerClients
from logmq.broker.config import BrokerConfig
from logmq.broker.controller_service import (
    MetadataQuorum,
    parse_node_addresses,
    parse_voters,
)
from logmq.broker.fetch_waiter import FetchWaiters
from logmq.broker.group_coordinator import GroupCoordinatorService
from logmq.broker.local_logs import LocalLogs, RemovedLogs
from logmq.broker.metadata_publisher import MetadataPublisher
from logmq.broker.metadata_store import ImageTopics
from logmq.broker.metrics import BrokerMetrics, MetricsServer
from logmq.broker.partition_views import PartitionViews
from logmq.broker.produce_path import ProducePath
from logmq.broker.producer_ids import ProducerIdManager
from logmq.broker.replica_fetcher import FetcherConfig
from logmq.broker.replica_manager import ReplicaManager, ReplicationConfig
from logmq.broker.security_admin import SecurityAdmin
from logmq.broker.topic_admin import TopicAdmin
from logmq.broker.topic_creation import TopicCreator
from logmq.broker.txn_coordinator import TransactionCoordinatorService
from logmq.broker.txn_markers import MarkerSender, MarkerWriter
from logmq.broker.txn_verification import TxnVerifier
from logmq.client.security import ClientSecurity
from logmq.cluster.controller_api import ControllerConfig
from logmq.cluster.meta_properties import check_node_id
from logmq.cluster.metadata_image import MetadataImage
from logmq.errors import ErrorCode, InvalidConfigError
from logmq.group import OFFSETS_TOPIC
from logmq.kafka.apis import (
    KAFKA_CONCURRENT_APIS,
    KAFKA_GROUP_APIS,
    KAFKA_READ_ONLY_APIS,
    KafkaApis,
    kafka_error_reply,
    throttled_reply,
)
from logmq.kafka.authorization import KafkaAuthorization
from logmq.kafka.codec import KafkaWire
from logmq.kafka.configs import KafkaConfigApis
from logmq.kafka.consumer_groups import KafkaConsumerGroupApis
from logmq.kafka.group_membership import KafkaGroupMembershipApis
from logmq.kafka.groups import KafkaGroupApis
from logmq.kafka.offsets import KafkaOffsetApis
from logmq.kafka.partition_admin import KafkaPartitionAdminApis
from logmq.kafka.producers import KafkaProducerApis
from logmq.kafka.sasl import SASL_AUTHENTICATE, SASL_HANDSHAKE, KafkaSaslApis
from logmq.kafka.security_admin import KafkaSecurityAdminApis
from logmq.kafka.topics import KafkaTopicApis
from logmq.kafka.transactions import KafkaTransactionApis
from logmq.kafka.versions import SUPPORTED as KAFKA_SUPPORTED
from logmq.kafka.versions import kafka_api_name
from logmq.native.admin_api import AdminApi
from logmq.native.api_table import (
    CONCURRENT_APIS,
    CONTROLLER_APIS,
    GROUP_APIS,
    READ_ONLY_APIS,
    SUPPORTED_APIS,
    Handler,
    handler_table,
)
from logmq.native.authorization import NativeAuthorization, from_broker
from logmq.native.cluster_api import ClusterApi
from logmq.native.controller_forwarding import ControllerForwarder
from logmq.native.data_api import DataApi
from logmq.native.group_api import GroupApi
from logmq.native.reassignment_api import ReassignmentApi
from logmq.native.sasl_api import NativeSaslApi
from logmq.native.throttling import throttled
from logmq.native.txn_api import TxnApi
from logmq.net.codec import ApiKey, Request
from logmq.net.pipeline import FrontDoor, RequestPipeline
from logmq.net.reply import Reply
from logmq.net.server import ServerOptions, TcpServer
from logmq.security.authentication import Authenticator
from logmq.security.authorization import Authorization
from logmq.security.listeners import listener_setting, registered_endpoints
from logmq.security.quota_enforcer import QuotaEnforcer, RequestTimeQuota
from logmq.security.settings import (
    CLIENT_MECHANISMS,
    SecuritySettings,
    jaas_options,
    raft_tls,
)
from logmq.storage.config import LogConfig
from logmq.storage.dir_lock import DataDirLock
from logmq.storage.log_manager import LogManager
from logmq.txn import TxnConfig

log = logging.getLogger("logmq.broker")


def native_api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name.lower()
    except ValueError:
        return str(api_key)


def native_error_reply(api_list: Callable[[], Any]) -> Callable[[Request, ErrorCode, str], Reply]:
    """The native door's error answer; an unserved ApiVersions also lists what is served."""

    def reply(request: Request, code: ErrorCode, message: str) -> Reply:
        body: dict[str, Any] = {"error": int(code), "message": message}
        if request.api_key == ApiKey.API_VERSIONS and code == ErrorCode.UNSUPPORTED_VERSION:
            body["apis"] = api_list()
        return Reply(body)

    return reply


def inter_broker_security(
    settings: SecuritySettings, props: dict[str, str], *, replicated: bool = True
) -> ClientSecurity | None:
    """What this broker presents on the inter-broker listener, as Kafka configures it: the
    listener's truststore to check the others, its own keystore as a client certificate,
    and for SASL ``sasl.mechanism.inter.broker.protocol`` with the ``username`` and
    ``password`` options of that mechanism's JAAS config on that listener.

    A broker alone (no ``--quorum-voters``) dials no other: without a login of its own
    it needs none. In a cluster a login or truststore that cannot work stops the start
    with the setting to give, instead of brokers that never reach each other."""
    sec = settings.of(settings.inter_broker_listener)
    listener = sec.listener
    if listener.protocol == "PLAINTEXT":
        return None
    source = (
        f" (its {listener.protocol} and settings are Kafka listener "
        f"{listener.inherited_from}'s; listener.name.{listener.inherited_from.lower()}.* "
        "settings count for it too)"
        if listener.inherited_from
        else ""
    )
    client: dict[str, str] = {"security.protocol": listener.protocol}
    if listener.tls and sec.tls is not None:
        tls = sec.tls.settings
        if tls.truststore_location:
            client["ssl.ca.location"] = tls.truststore_location
        elif replicated and not tls.truststore_certificates:
            raise InvalidConfigError(
                f"brokers connect to each other on listener {listener}{source} and check "
                "each other's certificates against ssl.truststore.location: set it to the "
                "CA that signed the brokers' certificates"
            )
        if tls.keystore_location:
            client["ssl.certificate.location"] = tls.keystore_location
            client["ssl.key.location"] = tls.keystore_location
        if tls.key_password:
            client["ssl.key.password"] = tls.key_password
        client["ssl.endpoint.identification.algorithm"] = tls.endpoint_identification_algorithm
    if listener.sasl:
        mechanism = (
            listener_setting(props, listener, "sasl.mechanism.inter.broker.protocol") or "PLAIN"
        ).upper()
        options = jaas_options(props, listener, mechanism)
        if not options.get("username") and not replicated:
            return None
        if replicated and (mechanism not in sec.mechanisms or not options.get("username")):
            usable = [m for m in sec.mechanisms if m in CLIENT_MECHANISMS]
            mech = mechanism if mechanism in sec.mechanisms or not usable else usable[0]
            prefix = (
                f"listener.name.{listener.inherited_from.lower()}."
                if listener.inherited_from
                else listener.prefix
            )
            problem = (
                f"sasl.mechanism.inter.broker.protocol {mechanism} is not enabled there "
                f"(it offers {', '.join(sec.mechanisms) or 'none'})"
                if mechanism not in sec.mechanisms
                else f"no username is set for {mechanism}"
            )
            raise InvalidConfigError(
                f"brokers log in to each other on listener {listener}{source}, and "
                f"{problem}: set sasl.mechanism.inter.broker.protocol={mech} and the "
                f"broker's username and password in {prefix}{mech.lower()}.sasl.jaas.config "
                '(... required username="broker" password="...";)'
            )
        client.update(
            {
                "sasl.mechanism": mechanism,
                "sasl.username": options["username"],
                "sasl.password": options.get("password", ""),
            }
        )
    try:
        return ClientSecurity.from_properties(client)
    except (ValueError, OSError) as e:
        raise InvalidConfigError(f"inter-broker listener {listener.name}: {e}") from None


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
        # how this broker reaches the others' native listener (replication, the controller)
        self.inter_broker_security = inter_broker_security(
            self.security, self.security.properties, replicated=self.replicated
        )
        self.quorum = MetadataQuorum(
            config.node_id,
            self.data_dir,
            parse_voters(config.quorum_voters) if config.quorum_voters else None,
            self._advertised_address,
            kafka_advertised=self._kafka_advertised_address,
            kafka_listeners=self._kafka_listeners,
            controller_config=ControllerConfig(
                session_timeout_ms=config.broker_session_timeout_ms,
                default_partitions=config.default_partitions,
                default_replication_factor=config.default_replication_factor,
                topic_defaults=dict(config.topic_defaults),
            ),
            heartbeat_ms=config.broker_heartbeat_interval_ms,
            bootstrap_scram=config.bootstrap_scram_credentials(),
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
        self.metrics = BrokerMetrics(self._partition_stats, lambda: self.waiters.parked)
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
        # start() fills once the services exist.
        self._handlers: dict[int, Handler] = {}  # the forwarder shares it
        self.native_pipeline = RequestPipeline(
            FrontDoor(
                "native",
                self._handlers,
                SUPPORTED_APIS,
                native_error_reply(lambda: self.admin.api_list()),
                api_name=native_api_name,
                unknown_api=ErrorCode.UNKNOWN_API,
            ),
            self.metrics,
        )
        native = self.security.native
        self.native_sasl = NativeSaslApi(self.authenticator)
        # authentication first on this door too (security/authentication.py)
        self.native_pipeline.add_guard(self.native_sasl.guard)
        self.server = TcpServer(
            self.native_pipeline,
            options,
            self.metrics,
            is_concurrent=lambda req: req.api_key in CONCURRENT_APIS,
            is_read_only=lambda req: req.api_key in READ_ONLY_APIS,
            name="native",
            **self._listener_security(native.name),
        )
        self.kafka_pipeline = RequestPipeline(
            FrontDoor("kafka", {}, KAFKA_SUPPORTED, kafka_error_reply, api_name=kafka_api_name),
            self.metrics,
        )
        # one server per Kafka listener, all in front of the one Kafka pipeline
        self.kafka_servers = [
            TcpServer(
                self.kafka_pipeline,
                options,
                self.metrics,
                is_concurrent=lambda req: req.api_key in KAFKA_CONCURRENT_APIS,
                is_read_only=lambda req: req.api_key in KAFKA_READ_ONLY_APIS,
                wire=KafkaWire(),
                name="kafka",
                **self._listener_security(listener.name),
            )
            for listener in self.security.kafka
        ]
        self.kafka_server: TcpServer | None = self.kafka_servers[0] if self.kafka_servers else None
        self.kafka_sasl = KafkaSaslApis(self.authenticator)
        # authentication first: nothing else runs for a connection that has not logged in
        self.kafka_pipeline.add_guard(self.kafka_sasl.guard)
        # then the ACLs a request needs as a whole (its topics are the handlers' to check)
        self.authorization = Authorization(self.security, lambda: self.quorum.image)
        self.kafka_authz = KafkaAuthorization(self.authorization)
        self.kafka_pipeline.add_guard(self.kafka_authz.guard, self.kafka_authz.api_keys)
        # and the native door's, after its own authentication guard
        self.native_pipeline.add_guard(NativeAuthorization(self.authorization).guard)
        self.metrics.register_listener("native", native_api_name)
        self.metrics.register_listener("kafka", kafka_api_name)
        self.kafka: KafkaApis | None = None
        self.metrics_server: MetricsServer | None = None
        self.forwarder = ControllerForwarder(config.node_id, self.quorum, self._handlers)
        # Steps before the handlers, for every request of the APIs named: the offsets
        # topic before the first group request (either door), and metadata changes run
        # on the controller (the native door; the Kafka door's handlers ask the
        # controller through the forwarder themselves).
        self.native_pipeline.add_guard(self._ensure_offsets_topic, GROUP_APIS)
        self.native_pipeline.add_guard(self._forward_to_controller, CONTROLLER_APIS)
        self.kafka_pipeline.add_guard(self._ensure_offsets_topic, KAFKA_GROUP_APIS)
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

    def _advertised_address(self) -> tuple[str, int] | None:
        """Where clients (and other brokers) reach us; None until we listen."""
        if not self.server.port:
            return None
        native = self.security.native
        advertised = self.security.advertised.get(native.name)
        if advertised is not None and advertised[0]:  # advertised.listeners=NATIVE://...
            return (advertised[0], advertised[1] or self.server.port)
        bound = native.host if native.host not in ("", "0.0.0.0", "::") else None
        return (self.config.advertised_host or bound or self.config.host, self.server.port)

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

    def _kafka_advertised_address(self, listener: str | None = None) -> tuple[str, int] | None:
        """Where Kafka clients of ``listener`` (default: the first) reach us; the first
        is registered with the controller for the other brokers' Metadata."""
        servers = [s for s in self.kafka_servers if listener is None or s.listener == listener]
        if not servers or not servers[0].port:
            return None
        server = servers[0]
        advertised = self.security.advertised.get(server.listener)
        if advertised is not None and advertised[0]:
            return (advertised[0], advertised[1] or server.port)
        cfg = self.config
        if server is self.kafka_servers[0]:
            host = cfg.advertised_kafka_host or cfg.kafka_host or cfg.advertised
            return (host, cfg.advertised_kafka_port or server.port)
        listener_host = self.security.of(server.listener).listener.host
        return (listener_host or cfg.advertised, server.port)

    def _kafka_listeners(self) -> str | None:
        """Every Kafka listener as clients reach it (registered: see _kafka_endpoint)."""
        out = []
        for server in self.kafka_servers:
            address = self._kafka_advertised_address(server.listener)
            if address is None:
                return None  # not all listening yet
            host = f"[{address[0]}]" if ":" in address[0] else address[0]
            out.append(f"{server.listener}://{host}:{address[1]}")
        return ",".join(out) or None

    def _kafka_endpoint(self, node_id: int, listener: str | None = None) -> tuple[str, int] | None:
        """A broker's Kafka address on ``listener`` (others: as they registered it)."""
        if node_id == self.config.node_id:
            return self._kafka_advertised_address(listener)
        reg = self.quorum.image.brokers.get(node_id)
        if reg is not None and listener is not None and reg.kafka_listeners:
            endpoint = registered_endpoints(reg.kafka_listeners).get(listener)
            if endpoint is not None:
                return endpoint
            return None  # that broker has no such listener: clients there cannot reach it
        if reg is None or reg.kafka_host is None:
            return None
        return (reg.kafka_host, reg.kafka_port)

    async def _ensure_offsets_topic(self, request: Request) -> None:
        """__consumer_offsets is made by the first group request that needs it."""
        if not self.groups.partition_count:
            await self.groups.create_offsets_topic()

    async def _forward_to_controller(self, request: Request) -> Reply | None:
        """Metadata changes run on the controller: another broker forwards them."""
        if self.quorum.is_controller:
            return None
        return await self.forwarder.controller_request(request)

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # before anything else reads or writes the data dir: a second process on it
        # would otherwise recover, append to and mark clean the live broker's files
        self.dir_lock.acquire()
        try:
            await self._start_locked()
        except BaseException:
            self.dir_lock.release()
            raise

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
                await server.start(listener.host, listener.port)
            for warning in self.security.warnings():
                log.warning("%s", warning)
            log.info("%s", self.security.native_summary())
            await self.quorum.start()
            await self.server.start(self.security.native.host, self.security.native.port)
            await self.quorum.wait_ready()
            self.groups.start()  # caught up: load the shards of what we lead now
            self.txns.start()
            self._after_ready()
            if any(sec.tls is not None for sec in self.security.per_listener.values()):
                self._tls_reload_task = asyncio.get_running_loop().create_task(
                    self._reload_certificates(), name="logmq-tls-reload"
                )
            if cfg.metrics_port is not None:
                self.metrics_server = MetricsServer(self.metrics)
                await self.metrics_server.start(cfg.metrics_host, cfg.metrics_port)
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
        self.replicas = self._replica_manager()
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
        # transactions: the coordinator of the __transaction_state partitions led here,
        # the markers it sends (to this broker's partitions directly, to others' over
        # their native ports) and KIP-890's check of transactional produces
        self.broker_clients = BrokerClients(
            cfg.node_id, self.quorum.broker_address, security=self.inter_broker_security
        )
        # a marker on __consumer_offsets settles the transaction's offsets (TxnOffsetCommit)
        self.marker_writer = MarkerWriter(
            self.replicas,
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
        txn_verifier = TxnVerifier(
            cfg.node_id, self.txns, self.broker_clients, self.local_logs.local_log
        )
        self.produce_path = ProducePath(
            self.replicas, lambda: self.quorum.image, self.topic_creator
        )
        # one set of client quota sensors for both doors: a client is one client
        # whichever door it comes through
        quotas = QuotaEnforcer(
            lambda: self.quorum.image,
            window_num=self.security.quota_window_num,
            window_seconds=self.security.quota_window_seconds,
        )
        self.data = DataApi(
            produce_path=self.produce_path,
            replicas=self.replicas,
            metrics=self.metrics,
            max_fetch_wait_ms=cfg.max_fetch_wait_ms,
            quotas=quotas,
            # a transactional produce passes the Kafka door's checks (kafka/transactions.py)
            transactions=KafkaTransactionApis(self.txns, txn_verifier, self.authorization),
        )
        self.admin = AdminApi(
            cfg,
            self.quorum,
            self.topics,
            self.topic_creator,
            self.producer_ids,
            self.metrics,
            quotas=quotas,
            txns=self.txns,
            authz=self.authorization,
        )
        self.group_api = GroupApi(self.groups, self.metrics, self.txns, self.authorization)
        views = PartitionViews(cfg.node_id, lambda: self.quorum.image, logs)
        self.reassignment_api = ReassignmentApi(self.quorum, views, self.metrics)
        self.kafka = KafkaApis(
            node_id=cfg.node_id,
            image=lambda: self.quorum.image,
            controller_id=lambda: self.quorum.controller_id,
            kafka_endpoint=self._kafka_endpoint,
            replicas=self.replicas,
            produce_path=self.produce_path,
            producer_ids=self.producer_ids,
            auto_create=self.topic_creator.auto_create,
            offsets=KafkaOffsetApis(
                self.groups, self._kafka_endpoint, self.authorization, txns=self.txns
            ),
            topics=KafkaTopicApis(
                TopicAdmin(self.forwarder.run_on_controller),
                lambda: self.quorum.image,
                cfg.topic_defaults,
                self.authorization,
            ),
            groups=KafkaGroupApis(self.groups, self.authorization),
            membership=KafkaGroupMembershipApis(self.groups),
            consumer_groups=KafkaConsumerGroupApis(
                self.groups, lambda: self.quorum.image, self.authorization
            ),
            configs=KafkaConfigApis(
                cfg,
                lambda: self.quorum.image,
                self.forwarder.run_on_controller,
                self.authorization,
            ),
            partitions=KafkaPartitionAdminApis(
                self.replicas,
                views,
                self.forwarder.run_on_controller,
                lambda: self.quorum.image,
            ),
            max_fetch_wait_ms=cfg.max_fetch_wait_ms,
            authz=self.authorization,
            quotas=quotas,
            transactions=KafkaTransactionApis(self.txns, txn_verifier, self.authorization),
        )
        self.kafka_pipeline.door.handlers.update(self.kafka.table())
        self.kafka_pipeline.door.handlers.update(
            KafkaProducerApis(
                self.replicas.leader_log, self.authorization, self.marker_writer
            ).table()
        )
        self.kafka_pipeline.door.after = RequestTimeQuota(quotas, throttled_reply)
        self.native_pipeline.door.after = RequestTimeQuota(quotas, throttled, from_broker)
        security_admin = KafkaSecurityAdminApis(
            SecurityAdmin(self.forwarder.run_on_controller, lambda: self.quorum.image)
        )
        self.kafka_pipeline.door.handlers.update(
            {
                SASL_HANDSHAKE: self.kafka_sasl.sasl_handshake,
                SASL_AUTHENTICATE: self.kafka_sasl.sasl_authenticate,
                29: security_admin.describe_acls,
                30: security_admin.create_acls,
                31: security_admin.delete_acls,
                48: security_admin.describe_client_quotas,
                49: security_admin.alter_client_quotas,
                50: security_admin.describe_user_scram_credentials,
                51: security_admin.alter_user_scram_credentials,
            }
        )
        self.metrics.register_fetch_sessions("native", self.data.sessions)
        self.metrics.register_fetch_sessions("kafka", self.kafka.sessions)
        self._handlers.update(
            handler_table(
                self.admin, self.data, self.group_api, self.cluster_api, self.reassignment_api
            )
        )
        txn_api = TxnApi(self.marker_writer, self.txns, self.replicas, self.authorization)
        self._handlers[ApiKey.WRITE_TXN_MARKERS] = txn_api.write_txn_markers
        self._handlers[ApiKey.ADD_PARTITIONS_TO_TXN] = txn_api.add_partitions_to_txn
        self._handlers[ApiKey.ADD_OFFSETS_TO_TXN] = txn_api.add_offsets_to_txn
        self._handlers[ApiKey.END_TXN] = txn_api.end_txn
        self._handlers[ApiKey.DESCRIBE_TRANSACTIONS] = txn_api.describe_transactions
        self._handlers[ApiKey.LIST_TRANSACTIONS] = txn_api.list_transactions
        self._handlers[ApiKey.DESCRIBE_PRODUCERS] = txn_api.describe_producers
        self._handlers[ApiKey.SASL_HANDSHAKE] = self.native_sasl.sasl_handshake
        self._handlers[ApiKey.SASL_AUTHENTICATE] = self.native_sasl.sasl_authenticate

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
            config=ReplicationConfig(
                replica_lag_time_max_ms=self.config.replica_lag_time_max_ms,
                fetcher=FetcherConfig(security=self.inter_broker_security),
            ),
        )
        if self.replicated:
            self.metrics.register_reassignment_throttle(rm.inbound_throttle, rm.outbound_throttle)
        return rm

    def _partition_stats(self):
        if not self._started:
            return []
        return [
            (plog.topic, plog.partition, plog.log_end_offset, plog.size_bytes())
            for plog in list(self.logs.logs())
        ]

    # -- dispatch ---------------------------------------------------------------------


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
