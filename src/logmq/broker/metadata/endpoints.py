"""Where this broker listens and is reached, listener by listener, and where the others are.

Kafka's rule for each listener: ``advertised.listeners`` names the address clients are
told; else the listener's own host (the first Kafka listener also has logmq's
``--advertised-kafka-host``/``--advertised-kafka-port``, the native one
``--advertised-host``); a listener bound to every interface advertises the broker's
advertised host. The first Kafka listener is what the broker registers as its Kafka
endpoint, every Kafka listener as its ``kafka_listeners`` (the other brokers' Metadata
answers from them, per listener). ``listen_plan`` is every address the broker will bind,
each with the option that moves it, for the check before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from logmq.net.bind_check import PlannedListener
from logmq.security.listeners import registered_endpoints

if TYPE_CHECKING:
    from logmq.broker.config import BrokerConfig
    from logmq.cluster.metadata_image import MetadataImage
    from logmq.security.settings import SecuritySettings

Address = tuple[str, int]
ANY_HOST = ("", "0.0.0.0", "::")


class Listening(Protocol):
    """A listener's server: its name, and its port once bound (0 before)."""

    listener: str
    port: int


class Endpoints:
    """This broker's advertised addresses, and the other brokers' as they registered."""

    def __init__(
        self,
        config: BrokerConfig,
        security: SecuritySettings,
        native: Listening,
        kafka: Sequence[Listening],
        image: Callable[[], MetadataImage],
    ) -> None:
        self.config = config
        self.security = security
        self.native_server = native
        self.kafka_servers = kafka
        self.image = image

    def native(self) -> Address | None:
        """Where clients (and other brokers) reach our native listener; None until bound."""
        port = self.native_server.port
        if not port:
            return None
        listener = self.security.native
        advertised = self.security.advertised.get(listener.name)
        if advertised is not None and advertised[0]:  # advertised.listeners=NATIVE://...
            return (advertised[0], advertised[1] or port)
        bound = listener.host if listener.host not in ANY_HOST else None
        return (self.config.advertised_host or bound or self.config.host, port)

    def kafka(self, listener: str | None = None) -> Address | None:
        """Where Kafka clients of ``listener`` (default: the first) reach us."""
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

    def kafka_listeners(self) -> str | None:
        """Every Kafka listener as clients reach it, as the broker registers them."""
        out = []
        for server in self.kafka_servers:
            address = self.kafka(server.listener)
            if address is None:
                return None  # not all listening yet
            host = f"[{address[0]}]" if ":" in address[0] else address[0]
            out.append(f"{server.listener}://{host}:{address[1]}")
        return ",".join(out) or None

    def kafka_of(self, node_id: int, listener: str | None = None) -> Address | None:
        """A broker's Kafka address on ``listener`` (others: as they registered it)."""
        if node_id == self.config.node_id:
            return self.kafka(listener)
        reg = self.image().brokers.get(node_id)
        if reg is not None and listener is not None and reg.kafka_listeners:
            endpoint = registered_endpoints(reg.kafka_listeners).get(listener)
            if endpoint is not None:
                return endpoint
            return None  # that broker has no such listener: clients there cannot reach it
        if reg is None or reg.kafka_host is None:
            return None
        return (reg.kafka_host, reg.kafka_port)


def listen_plan(
    config: BrokerConfig, security: SecuritySettings, voters: dict[int, Address] | None
) -> list[PlannedListener]:
    """Every address this broker will listen on, with the option that moves it."""
    named = set(registered_endpoints(config.properties.get("listeners", "")))
    plan = []
    for listener in security.listeners:
        if listener.name in named:
            option = "the listeners property (--override listeners=...)"
        else:
            option = "--port" if listener.native else "--kafka-port"
        kind = "native" if listener.native else "Kafka"
        plan.append(
            PlannedListener(
                f"the {kind} listener {listener.name}", listener.host, listener.port, option
            )
        )
    node = config.node_id
    if voters and node in voters:
        host, port = voters[node]
        plan.append(
            PlannedListener(
                f"the Raft listener of node {node}",
                host,
                port,
                f"--quorum-voters (node {node}'s entry)",
                any_port=False,
            )
        )
    if config.metrics_port is not None:
        plan.append(
            PlannedListener(
                "the metrics endpoint", config.metrics_host, config.metrics_port, "--metrics-port"
            )
        )
    return plan


def planned(plan: list[PlannedListener], listener: str) -> PlannedListener:
    """The entry of ``plan`` for the listener named ``listener``."""
    return next(p for p in plan if p.what.endswith(f" listener {listener}"))
