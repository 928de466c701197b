"""Which ACLs each native request needs: the same decisions as the Kafka door's.

One pipeline step (``guard``) for the whole native door: every resource a request names
must be allowed, else the request is answered with the resource type's
*_AUTHORIZATION_FAILED (native clients take errors per request). The listings and the
requests that name many resources at once (Metadata, DescribeConfigs, ListGroups,
ConsumerGroupDescribe, OffsetFetch's topics, ListTransactions, DescribeTransactions'
partitions) are decided per entry by their handlers, with the Kafka door's rules
(security/authorization.py): what the principal may not describe is left out of a
listing, and a named one it may not see answers alone, alike whether it exists or not.
The inter-broker APIs (a follower's fetch, ISR changes, registration and heartbeats,
producer id blocks, transaction markers, AddPartitionsToTxn with ``verify_only``, a
request another broker forwards to the controller) need CLUSTER_ACTION on the cluster:
brokers' principals, never a client's. A transactional producer's requests need WRITE on
its transactional id (its transactional produce is checked by the produce handler, as on
the Kafka door).
Bodies are untrusted: an entry of the wrong shape names nothing here, and its handler
refuses it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from logmq.errors import ErrorCode
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


BROKER_ONLY = frozenset(
    {
        ApiKey.BROKER_REGISTRATION,
        ApiKey.BROKER_HEARTBEAT,
        ApiKey.ALLOCATE_PRODUCER_IDS,
        ApiKey.ALTER_PARTITION,
        ApiKey.WRITE_TXN_MARKERS,
    }
)

NEEDS: dict[int, Callable[[Any], list[Need]]] = {
    ApiKey.PRODUCE: _topics(Op.WRITE),
    ApiKey.FETCH: _topics(Op.READ),
    ApiKey.LIST_OFFSETS: _topics(Op.DESCRIBE),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: _topics(Op.DESCRIBE),
    ApiKey.DELETE_RECORDS: _topics(Op.DELETE),
    # per entry in the handlers, as Kafka answers them (native/admin_api.py,
    # native/group_api.py): a listing shows what the principal may DESCRIBE
    # (security/authorization.py's ``describable``), a named resource it may not is
    # answered *_AUTHORIZATION_FAILED in its own entry, the others normally
    ApiKey.METADATA: lambda b: [],
    ApiKey.CREATE_TOPICS: _topics(Op.CREATE),
    ApiKey.CREATE_PARTITIONS: _topics(Op.ALTER),
    ApiKey.DELETE_TOPICS: lambda b: [(Op.DELETE, RT.TOPIC, n) for n in _names(b, "topics", "")],
    ApiKey.DESCRIBE_CONFIGS: lambda b: [],  # per resource (native/admin_api.py)
    ApiKey.ALTER_CONFIGS: _configs(Op.ALTER_CONFIGS),
    ApiKey.FIND_COORDINATOR: _find_coordinator,
    ApiKey.CONSUMER_GROUP_HEARTBEAT: _group(Op.READ),
    ApiKey.OFFSET_COMMIT: _offset_commit,
    ApiKey.OFFSET_FETCH: _group(Op.DESCRIBE),
    ApiKey.LIST_GROUPS: lambda b: [],  # the groups it may DESCRIBE (native/group_api.py)
    ApiKey.CONSUMER_GROUP_DESCRIBE: lambda b: [],  # per group (native/group_api.py)
    ApiKey.DELETE_GROUPS: _group(Op.DELETE),
    ApiKey.OFFSET_DELETE: _group(Op.DELETE),
    ApiKey.DESCRIBE_CLUSTER: lambda b: [],
    ApiKey.DESCRIBE_QUORUM: _cluster(Op.DESCRIBE),
    ApiKey.DESCRIBE_LOG_DIRS: _cluster(Op.DESCRIBE),
    ApiKey.ELECT_LEADERS: _cluster(Op.ALTER),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: _cluster(Op.ALTER),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: _cluster(Op.DESCRIBE),
    ApiKey.DESCRIBE_ACLS: _cluster(Op.DESCRIBE),
    ApiKey.CREATE_ACLS: _cluster(Op.ALTER),
    ApiKey.DELETE_ACLS: _cluster(Op.ALTER),
    ApiKey.DESCRIBE_CLIENT_QUOTAS: _cluster(Op.DESCRIBE_CONFIGS),
    ApiKey.ALTER_CLIENT_QUOTAS: _cluster(Op.ALTER_CONFIGS),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: _cluster(Op.DESCRIBE),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: _cluster(Op.ALTER),
    ApiKey.DESCRIBE_PRODUCERS: _topics(Op.READ),
    ApiKey.ADD_PARTITIONS_TO_TXN: _add_partitions,  # a producer's (verify_only: brokers')
    ApiKey.ADD_OFFSETS_TO_TXN: _add_offsets,
    ApiKey.END_TXN: _txn_id,
    ApiKey.TXN_OFFSET_COMMIT: _txn_offset_commit,
    # per transactional id in the handler (native/txn_api.py), as Kafka: DESCRIBE on each
    # id; a denied id gets TRANSACTIONAL_ID_AUTHORIZATION_FAILED, ListTransactions leaves
    # the ids out
    ApiKey.DESCRIBE_TRANSACTIONS: lambda b: [],
    ApiKey.LIST_TRANSACTIONS: lambda b: [],
}


def from_broker(req: Request) -> bool:
    """Is this a request only brokers send: an inter-broker API, a request forwarded to
    the controller, a follower's fetch? (CLUSTER_ACTION; exempt from client quotas.)"""
    body = req.body
    if req.api_key in BROKER_ONLY:
        return True
    if not isinstance(body, dict):
        return False
    if body.get("forwarded_by") is not None:
        return True
    if req.api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
        return body.get("verify_only") is True  # a partition leader's check (KIP-890)
    return req.api_key == ApiKey.FETCH and body.get("replica_id", -1) != -1


class NativeAuthorization:
    def __init__(self, authorization: Authorization) -> None:
        self.authz = authorization

    def _cluster_action(self, req: Request) -> bool:
        return self.authz.allowed(req.context, Op.CLUSTER_ACTION, RT.CLUSTER, CLUSTER)

    async def guard(self, req: Request) -> Reply | None:
        authz = self.authz
        if not authz.enabled:
            return None
        body = req.body
        key = req.api_key
        if from_broker(req):
            # brokers only: the forwarding broker checked its client's ACLs already
            if self._cluster_action(req):
                return None
            return _denied(req, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "act as a broker")
        if key == ApiKey.INIT_PRODUCER_ID:
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
        needs = NEEDS.get(key)
        if needs is None:
            return None  # ApiVersions, the SASL exchange
        for op, rtype, name in needs(body):
            if (
                rtype is RT.TOPIC
                and op is Op.CREATE
                and authz.allowed(req.context, Op.CREATE, RT.CLUSTER, CLUSTER, log_denial=False)
            ):
                continue  # CREATE on the cluster covers every new topic, as in Kafka
            if key == ApiKey.OFFSET_FOR_LEADER_EPOCH and self._cluster_action(req):
                continue  # followers ask it too
            if not authz.allowed(req.context, op, rtype, name):
                return _denied(req, DENIED_CODES[rtype], f"{op.name} {rtype.name.lower()} {name!r}")
        return None


def _denied(req: Request, code: ErrorCode, what: str) -> Reply:
    principal = req.context.principal if req.context is not None else "?"
    return Reply({"error": int(code), "message": f"{principal} may not {what}"})
