"""The ACL rules a Kafka API's registry entry names (kafka/registry.py), as KafkaApis asks.

Each rule says what the pipeline's authorization step (kafka/authorization.py) checks for
a whole request before the handler runs; ``InHandler`` marks what Kafka decides entity by
entity inside a request (Produce's topics, Metadata's, a batched OffsetFetch's groups),
which the handler checks through the same ``Authorization`` and answers per entity.
``needs`` lists (operation, resource type, name) for one request; one denial answers it.
"""

from __future__ import annotations

from dataclasses import dataclass

from logmq.net.codec import Request
from logmq.security.acl import AclOperation as Op
from logmq.security.acl import ResourceType
from logmq.security.authorization import CLUSTER

Needed = list[tuple[Op, ResourceType, str]]


@dataclass(frozen=True, slots=True)
class OnCluster:
    op: Op

    def needs(self, req: Request) -> Needed:
        return [(self.op, ResourceType.CLUSTER, CLUSTER)]

    def describe(self) -> str:
        return f"{self.op.name} on the cluster"


@dataclass(frozen=True, slots=True)
class OnGroup:
    """The one group a request names; from version ``batched_from`` the request names
    several (OffsetFetch v8, FindCoordinator v4), each checked by the handler."""

    op: Op
    batched_from: int | None = None

    def needs(self, req: Request) -> Needed:
        if self.batched_from is not None and req.api_version >= self.batched_from:
            return []
        body = req.body
        if req.api_key == 10:  # FindCoordinator v0-3: groups only (key type 0)
            if getattr(body, "key_type", 0) != 0:
                return []
            return [(self.op, ResourceType.GROUP, body.key)]
        return [(self.op, ResourceType.GROUP, body.group_id)]

    def describe(self) -> str:
        batched = (
            f" (v{self.batched_from}+: each group, in the handler)" if self.batched_from else ""
        )
        return f"{self.op.name} on the group{batched}"


@dataclass(frozen=True, slots=True)
class OnTopics:
    """Every topic the request names (clients send one resource set per request)."""

    op: Op
    field: str = "name"

    def needs(self, req: Request) -> Needed:
        topics = req.body.topics or ()
        return [(self.op, ResourceType.TOPIC, getattr(t, self.field)) for t in topics]

    def describe(self) -> str:
        return f"{self.op.name} on each topic"


@dataclass(frozen=True, slots=True)
class OnConfigResources:
    """Describe/Alter(Incremental)Configs: topics (type 2) by name; the broker (type 4)
    and other resource types (broker loggers) as the cluster."""

    op: Op

    def needs(self, req: Request) -> Needed:
        out: Needed = []
        for r in req.body.resources:
            if r.resource_type == 2:
                out.append((self.op, ResourceType.TOPIC, r.resource_name))
            else:
                out.append((self.op, ResourceType.CLUSTER, CLUSTER))
        return out

    def describe(self) -> str:
        return f"{self.op.name} on each topic, or on the cluster for a broker"


@dataclass(frozen=True, slots=True)
class AllOf:
    rules: tuple

    def needs(self, req: Request) -> Needed:
        return [need for rule in self.rules for need in rule.needs(req)]

    def describe(self) -> str:
        return "; ".join(rule.describe() for rule in self.rules)


@dataclass(frozen=True, slots=True)
class InHandler:
    """Decided per entity by the handler, which answers each denied one with its code."""

    what: str

    def needs(self, req: Request) -> Needed:
        return []

    def describe(self) -> str:
        return f"{self.what} (per entry, by the handler)"


@dataclass(frozen=True, slots=True)
class Unchecked:
    """No ACL, as in Kafka (ApiVersions, the SASL exchange itself)."""

    why: str

    def needs(self, req: Request) -> Needed:
        return []

    def describe(self) -> str:
        return f"none: {self.why}"
