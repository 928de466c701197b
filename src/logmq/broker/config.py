"""Broker (server-wide) settings.

One frozen dataclass so every component reads the same validated values; the CLI fills
it from flags, ``LOGMQ_*`` environment variables and an optional TOML file (in that
order of precedence). docs/configuration.md lists every option.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from logmq.net.codec import DEFAULT_MAX_FRAME_SIZE
from logmq.security.scram import AddScramUser, ScramCredential, parse_add_scram_user

# An offset commit's records go into one batch of __consumer_offsets, whose
# max.message.bytes (group_coordinator.OFFSETS_TOPIC_CONFIGS) leaves room for more.
OFFSETS_MAX_COMMIT_LIMIT = 8 << 20


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    data_dir: Path = Path("./logmq-data")
    host: str = "127.0.0.1"
    port: int = 9192  # the native protocol: logmq clients, the CLI, replication
    # the Kafka listener (docs/kafka-compatibility.md); None = none. logmq-server's
    # default is 9092, Kafka's conventional port.
    kafka_port: int | None = None
    kafka_host: str | None = None  # defaults to host
    advertised_kafka_host: str | None = None  # what Kafka clients are told; default kafka_host
    advertised_kafka_port: int | None = None  # default: the port the listener got
    node_id: int = 1
    # None = no metrics endpoint; 0 = let the OS pick a port (logged at start).
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    advertised_host: str | None = None  # what Metadata tells clients; defaults to host
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_connections: int = 1000
    idle_timeout_ms: int = 600_000
    max_in_flight_per_connection: int = 64
    socket_buffer_bytes: int = 4 * 1024 * 1024
    auto_create_topics: bool = False
    default_partitions: int = 1
    zero_copy: bool = True  # os.sendfile for fetch tails; False = read + transport.write
    max_fetch_wait_ms: int = 30_000  # cap on a client's max_wait_ms
    shutdown_grace_ms: int = 10_000  # how long in-flight requests get on SIGTERM
    producer_id_block_size: int = 1000
    topic_defaults: dict[str, str] = field(default_factory=dict)  # broker-wide LogConfig
    # Kafka's broker properties by their names (listeners, ssl.*, sasl.*, super.users,
    # authorizer.class.name, ...): --override KEY=VALUE and the TOML file (security/)
    properties: dict[str, str] = field(default_factory=dict)
    # consumer groups (docs/consumer-groups.md)
    offsets_topic_partitions: int = 50  # partitions of __consumer_offsets when created
    # transactions (docs/transactions.md), Kafka's transaction.state.log.num.partitions,
    # transaction.max.timeout.ms and transactional.id.expiration.ms
    transaction_state_partitions: int = 50
    transaction_max_timeout_ms: int = 900_000
    transactional_id_expiration_ms: int = 604_800_000
    group_session_timeout_ms: int = 45_000  # for members that do not ask for their own
    group_min_session_timeout_ms: int = 6_000
    group_max_session_timeout_ms: int = 300_000
    group_heartbeat_interval_ms: int = 5_000
    group_rebalance_timeout_ms: int = 300_000  # for members that do not send their own
    group_initial_rebalance_delay_ms: int = 3_000  # classic groups: the first rebalance waits
    offset_metadata_max_bytes: int = 4096
    offset_commit_max_bytes: int = 1 << 20  # records of one OffsetCommit
    # a group write (commit, join, ...) is answered once replicated to the ISR of its
    # __consumer_offsets partition, or fails with a retriable error after this long
    offsets_commit_timeout_ms: int = 5_000
    # metadata quorum and controller (docs/replication.md); None = a quorum of one
    quorum_voters: str | None = None  # "1@host:raftport,2@host:raftport,..."
    default_replication_factor: int = 1
    # The controller fences a silent broker after this: most of a leader failover's
    # unavailability. 8 heartbeats per session ride out ~1.7 s pauses (GC, a loaded host);
    # a broker fenced by a longer one is unfenced by its next heartbeat.
    broker_session_timeout_ms: int = 2_000
    broker_heartbeat_interval_ms: int = 250
    # "2@host:port,...": where this broker dials a peer's client port (replica fetching,
    # the controller); a peer not listed is dialled at the address it registered
    peer_addresses: str | None = None
    # replication (broker/replica/replica_manager.py): a follower not caught up this long
    # leaves the ISR
    replica_lag_time_max_ms: int = 30_000
    # below this many free bytes in the data dir, produce is refused (storage/disk_space.py);
    # None = the smaller of 1 GiB and 5% of the disk
    min_free_bytes: int | None = None
    # ``--add-scram`` values ("SCRAM-SHA-512=[name=admin,password=...]", as kafka-storage
    # format takes them): SCRAM credentials the cluster's first controller writes with the
    # cluster id; on a cluster that exists, the broker creates those it lacks once ready
    # (broker/metadata/security_admin.py). Kept out of repr (passwords).
    bootstrap_scram: tuple[str, ...] = field(default=(), repr=False, metadata={"sensitive": True})

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        object.__setattr__(self, "bootstrap_scram", tuple(self.bootstrap_scram))
        self.bootstrap_scram_users()  # ValueError says which value is wrong
        checks = {
            "port": 0 <= self.port <= 65535,
            "node_id": self.node_id >= 0,
            "max_frame_size": 1024 <= self.max_frame_size <= 0xFFFFFFFF,
            "max_connections": self.max_connections >= 1,
            "idle_timeout_ms": self.idle_timeout_ms >= 1,
            "max_in_flight_per_connection": self.max_in_flight_per_connection >= 1,
            "socket_buffer_bytes": self.socket_buffer_bytes >= 0,
            "default_partitions": self.default_partitions >= 1,
            "max_fetch_wait_ms": self.max_fetch_wait_ms >= 0,
            "shutdown_grace_ms": self.shutdown_grace_ms >= 0,
            "producer_id_block_size": self.producer_id_block_size >= 1,
            "offsets_topic_partitions": 1 <= self.offsets_topic_partitions <= 10_000,
            "transaction_state_partitions": 1 <= self.transaction_state_partitions <= 10_000,
            "transaction_max_timeout_ms": self.transaction_max_timeout_ms >= 1,
            "transactional_id_expiration_ms": self.transactional_id_expiration_ms >= 1,
            "group_min_session_timeout_ms": self.group_min_session_timeout_ms >= 1,
            "group_max_session_timeout_ms": (
                self.group_max_session_timeout_ms >= self.group_min_session_timeout_ms
            ),
            "group_session_timeout_ms": (
                self.group_min_session_timeout_ms
                <= self.group_session_timeout_ms
                <= self.group_max_session_timeout_ms
            ),
            "group_heartbeat_interval_ms": (
                1 <= self.group_heartbeat_interval_ms < self.group_session_timeout_ms
            ),
            "group_rebalance_timeout_ms": self.group_rebalance_timeout_ms >= 1,
            "group_initial_rebalance_delay_ms": self.group_initial_rebalance_delay_ms >= 0,
            "offsets_commit_timeout_ms": self.offsets_commit_timeout_ms >= 1,
            "offset_metadata_max_bytes": self.offset_metadata_max_bytes >= 0,
            "default_replication_factor": self.default_replication_factor >= 1,
            "broker_session_timeout_ms": self.broker_session_timeout_ms >= 1,
            "replica_lag_time_max_ms": self.replica_lag_time_max_ms > 500,
            "broker_heartbeat_interval_ms": (
                1 <= self.broker_heartbeat_interval_ms < self.broker_session_timeout_ms
            ),
            "offset_commit_max_bytes": (
                4096 <= self.offset_commit_max_bytes <= OFFSETS_MAX_COMMIT_LIMIT
            ),
        }
        if self.metrics_port is not None:
            checks["metrics_port"] = 0 <= self.metrics_port <= 65535
        if self.kafka_port is not None:
            checks["kafka_port"] = 0 <= self.kafka_port <= 65535
        if self.advertised_kafka_port is not None:
            checks["advertised_kafka_port"] = 1 <= self.advertised_kafka_port <= 65535
        if self.min_free_bytes is not None:
            checks["min_free_bytes"] = self.min_free_bytes >= 0
        if self.quorum_voters:
            from logmq.cluster.node_addresses import parse_voters

            parse_voters(self.quorum_voters)  # ValueError says what is wrong
        if self.peer_addresses:
            from logmq.cluster.node_addresses import parse_node_addresses

            parse_node_addresses(self.peer_addresses, "peer address", "--peer-addresses")
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(
                "invalid broker setting(s): " + ", ".join(f"{n}={getattr(self, n)!r}" for n in bad)
            )

    def bootstrap_scram_users(self) -> list[AddScramUser]:
        """``bootstrap_scram`` parsed and salted (each call salts anew)."""
        out = []
        for spec in self.bootstrap_scram:
            if not isinstance(spec, str):
                raise ValueError(f"bootstrap_scram: expected --add-scram strings, got {spec!r}")
            out.append(parse_add_scram_user(spec))
        return out

    def bootstrap_scram_credentials(self) -> list[tuple[str, ScramCredential]]:
        """``bootstrap_scram`` parsed and salted: (user, credential) pairs."""
        return [(u.name, u.credential) for u in self.bootstrap_scram_users()]

    @property
    def advertised(self) -> str:
        return self.advertised_host or self.host

    def replace(self, **changes: Any) -> BrokerConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def field_names(cls) -> list[str]:
        """The settings (DescribeConfigs shows them): not the sensitive ones (passwords)."""
        return [f.name for f in dataclasses.fields(cls) if not f.metadata.get("sensitive")]
