"""Which ACLs each native request needs: the same decisions as the Kafka door's.

Each API's registry entry (native/registry.py) names one of the rules below. One
pipeline step (``guard``) for the whole native door: every resource a request names
must be allowed, else the request is answered with the resource type's
*_AUTHORIZATION_FAILED (native clients take errors per request). The listings and the
requests that name many resources at once (Metadata, DescribeConfigs, ListGroups,
ConsumerGroupDescribe, OffsetFetch's topics, ListTransactions, DescribeTransactions'
partitions) are decided per entry by their handlers (``InHandler``), with the Kafka
door's rules (security/authorization.py): what the principal may not describe is left
out of a listing, and a named one it may not see answers alone, alike whether it exists
or not. The inter-broker APIs (a follower's fetch, ISR changes, registration and
heartbeats, producer id blocks, transaction markers, AddPartitionsToTxn with
``verify_only``, a request another broker forwards to the controller) need
CLUSTER_ACTION on the cluster: brokers' principals, never a client's. A transactional
producer's requests need WRITE on its transactional id (its transactional produce is
checked by the produce handler, as on the Kafka door).
Bodies are untrusted: an entry of the wrong shape names nothing here, and its handler
refuses it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from logmq.errors import ErrorCode
from logmq.net.api_registry import ApiRegistry
from logmq.net.codec import ApiKey, Request
from logmq.net.reply import Reply
from logmq.security.acl import AclOperation as Op
from logmq.security.acl import ResourceType as RT
from logmq.security.authorization import CLUSTER, DENIED_CODES, Authorization

Need = tuple[Op, RT, str]


def _list(body: Any, key: str) -> list:
    value = body.get(key) if isinstance(body, dict) else None
    return value if isinstance(value, list) else []


def _names(body: Any, key: str = "topics", field: str = "topic") -> Iterator[str]:
    for entry in _list(body, key):
        name = entry.get(field) if isinstance(entry, dict) else entry
        if isinstance(name, str):
            yield name


def _topics(op: Op, key: str = "topics", field: str = "topic") -> Callable[[Any], list[Need]]:
    return lambda body: [(op, RT.TOPIC, n) for n in _names(body, key, field)]


def _group(op: Op) -> Callable[[Any], list[Need]]:
    def needs(body: Any) -> list[Need]:
        group = body.get("group_id") if isinstance(body, dict) else None
        out = [(op, RT.GROUP, group)] if isinstance(group, str) else []
        out += [(op, RT.GROUP, g) for g in _list(body, "group_ids") if isinstance(g, str)]
        return out

    return needs


def _configs(op: Op) -> Callable[[Any], list[Need]]:
    def needs(body: Any) -> list[Need]:
        out: list[Need] = []
        for r in _list(body, "resources"):
            if not isinstance(r, dict):
                continue
            if r.get("type") == "topic" and isinstance(r.get("name"), str):
                out.append((op, RT.TOPIC, r["name"]))
            else:
                out.append((op, RT.CLUSTER, CLUSTER))
        return out

    return needs


def _cluster(op: Op) -> Callable[[Any], list[Need]]:
    return lambda body: [(op, RT.CLUSTER, CLUSTER)]


def _offset_commit(body: Any) -> list[Need]:
    return _group(Op.READ)(body) + _topics(Op.READ)(body)


def _find_coordinator(body: Any) -> list[Need]:
    key_type = body.get("key_type", 0) if isinstance(body, dict) else 0
    if key_type == 1:
        rtype = RT.TRANSACTIONAL_ID
    elif key_type == 0:
        rtype = RT.GROUP
    else:
        return []  # refused by the handler
    return [(Op.DESCRIBE, rtype, k) for k in _list(body, "keys") if isinstance(k, str)]


def _txn_id(body: Any) -> list[Need]:
    txn_id = body.get("transactional_id") if isinstance(body, dict) else None
    return [(Op.WRITE, RT.TRANSACTIONAL_ID, txn_id)] if isinstance(txn_id, str) else []


def _add_partitions(body: Any) -> list[Need]:
    return _txn_id(body) + _topics(Op.WRITE)(body)


def _add_offsets(body: Any) -> list[Need]:
    return _txn_id(body) + _group(Op.READ)(body)


def _txn_offset_commit(body: Any) -> list[Need]:
    return _txn_id(body) + _group(Op.READ)(body) + _topics(Op.READ)(body)


@dataclass(frozen=True, slots=True)
class Needs:
    """Every resource ``of(body)`` names must be allowed (the native door's usual rule)."""

    of: Callable[[Any], list[Need]]
    text: str
    # CreateTopics: CREATE on the cluster covers every new topic, as in Kafka
    create_on_cluster: bool = False
    # OffsetForLeaderEpoch: followers ask it too, as brokers (CLUSTER_ACTION)
    brokers_too: bool = False

    def describe(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class BrokersOnly:
    """An inter-broker API: CLUSTER_ACTION on the cluster, brokers' principals only."""

    def describe(self) -> str:
        return "CLUSTER_ACTION on the cluster (brokers only)"


@dataclass(frozen=True, slots=True)
class ProducerIdAccess:
    """InitProducerId: WRITE on a transactional id, else (idempotence, KIP-679)
    IDEMPOTENT_WRITE on the cluster or WRITE on some topic."""

    def describe(self) -> str:
        return "WRITE on the transactional id, else IDEMPOTENT_WRITE or WRITE on a topic"


@dataclass(frozen=True, slots=True)
class InHandler:
    """Decided per entry by the handler (DESCRIBE on each transactional id, ...)."""

    what: str

    def describe(self) -> str:
        return f"{self.what} (per entry, by the handler)"


@dataclass(frozen=True, slots=True)
class Unchecked:
    why: str

    def describe(self) -> str:
        return f"none: {self.why}"


def topics(op: Op, key: str = "topics", field: str = "topic", **flags: bool) -> Needs:
    return Needs(_topics(op, key, field), f"{op.name} on each topic", **flags)


def group(op: Op) -> Needs:
    return Needs(_group(op), f"{op.name} on the group")


def cluster(op: Op) -> Needs:
    return Needs(_cluster(op), f"{op.name} on the cluster")


def configs(op: Op) -> Needs:
    return Needs(_configs(op), f"{op.name} on each topic, or on the cluster for a broker")


OFFSET_COMMIT = Needs(_offset_commit, "READ on the group and on each topic")
FIND_COORDINATOR = Needs(_find_coordinator, "DESCRIBE on each group or transactional id")
ADD_PARTITIONS = Needs(_add_partitions, "WRITE on the transactional id and on each topic")
ADD_OFFSETS = Needs(_add_offsets, "WRITE on the transactional id, READ on the group")
END_TXN = Needs(_txn_id, "WRITE on the transactional id")
TXN_OFFSET_COMMIT = Needs(
    _txn_offset_commit, "WRITE on the transactional id, READ on the group and each topic"
)
DELETE_TOPICS = Needs(
    lambda b: [(Op.DELETE, RT.TOPIC, n) for n in _names(b, "topics", "")], "DELETE on each topic"
)


class NativeAuthorization:
    """The native door's authorization step: each request's registry entry names its
    rule (native/registry.py)."""

    def __init__(self, authorization: Authorization, registry: ApiRegistry) -> None:
        self.authz = authorization
        self.registry = registry

    def from_broker(self, req: Request) -> bool:
        """Is this a request only brokers send: an inter-broker API, a request forwarded
        to the controller, a follower's fetch? (CLUSTER_ACTION; exempt from client
        quotas.)"""
        spec = self.registry.get(req.api_key)
        if spec is not None and isinstance(spec.access, BrokersOnly):
            return True
        body = req.body
        if not isinstance(body, dict):
            return False
        if body.get("forwarded_by") is not None:
            return True
        if req.api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
            return body.get("verify_only") is True  # a partition leader's check (KIP-890)
        return req.api_key == ApiKey.FETCH and body.get("replica_id", -1) != -1

    def _cluster_action(self, req: Request) -> bool:
        return self.authz.allowed(req.context, Op.CLUSTER_ACTION, RT.CLUSTER, CLUSTER)

    async def guard(self, req: Request) -> Reply | None:
        authz = self.authz
        if not authz.enabled:
            return None
        if self.from_broker(req):
            # brokers only: the forwarding broker checked its client's ACLs already
            if self._cluster_action(req):
                return None
            return _denied(req, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "act as a broker")
        spec = self.registry.get(req.api_key)
        rule = spec.access if spec is not None else None
        if isinstance(rule, ProducerIdAccess):
            return self._init_producer_id(req)
        if not isinstance(rule, Needs):
            return None  # ApiVersions, the SASL exchange, the handlers' own checks
        for op, rtype, name in rule.of(req.body):
            if rule.create_on_cluster and authz.allowed(
                req.context, Op.CREATE, RT.CLUSTER, CLUSTER, log_denial=False
            ):
                continue
            if rule.brokers_too and self._cluster_action(req):
                continue
            if not authz.allowed(req.context, op, rtype, name):
                return _denied(req, DENIED_CODES[rtype], f"{op.name} {rtype.name.lower()} {name!r}")
        return None

    def _init_producer_id(self, req: Request) -> Reply | None:
        authz = self.authz
        body = req.body
        txn_id = body.get("transactional_id") if isinstance(body, dict) else None
        if txn_id is not None:
            if isinstance(txn_id, str) and not authz.allowed(
                req.context, Op.WRITE, RT.TRANSACTIONAL_ID, txn_id
            ):
                return _denied(
                    req,
                    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                    f"WRITE transactional_id {txn_id!r}",
                )
            return None  # not a str: the handler refuses it
        if authz.allowed(
            req.context, Op.IDEMPOTENT_WRITE, RT.CLUSTER, CLUSTER, log_denial=False
        ) or authz.allowed_on_some(req.context, Op.WRITE, RT.TOPIC):
            return None  # KIP-679, as on the Kafka door
        return _denied(req, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "write to any topic")


def _denied(req: Request, code: ErrorCode, what: str) -> Reply:
    principal = req.context.principal if req.context is not None else "?"
    return Reply({"error": int(code), "message": f"{principal} may not {what}"})
