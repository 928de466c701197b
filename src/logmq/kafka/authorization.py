"""Which ACL each Kafka request needs, as Kafka's KafkaApis asks for it.

The pipeline step (``guard``) decides what is decided per request: the cluster APIs
(CLUSTER_AUTHORIZATION_FAILED) and the group a group request names
(GROUP_AUTHORIZATION_FAILED), answered in the request's own response type. What is
decided per topic inside a request (Produce: WRITE, Fetch: READ, Metadata and
ListOffsets: DESCRIBE, CreateTopics: CREATE, DeleteTopics: DELETE, ...) is answered
per topic by the handlers, through the same ``Authorization`` and the same cache.
"""

from __future__ import annotations

from collections.abc import Callable

from logmq.errors import ErrorCode
from logmq.kafka.apis import kafka_error_reply
from logmq.kafka.messages import (
    NO_THROTTLE,
    build,
    kio_code,
    response_module,
)
from logmq.net.codec import Request
from logmq.net.reply import Reply
from logmq.security.acl import AclOperation as Op
from logmq.security.acl import ResourceType
from logmq.security.authorization import CLUSTER, DENIED_CODES, Authorization

# api key -> the operation on the cluster it needs
CLUSTER_APIS: dict[int, Op] = {
    29: Op.DESCRIBE,  # DescribeAcls
    30: Op.ALTER,  # CreateAcls
    31: Op.ALTER,  # DeleteAcls
    35: Op.DESCRIBE,  # DescribeLogDirs
    43: Op.ALTER,  # ElectLeaders
    45: Op.ALTER,  # AlterPartitionReassignments
    46: Op.DESCRIBE,  # ListPartitionReassignments
    48: Op.DESCRIBE_CONFIGS,  # DescribeClientQuotas
    49: Op.ALTER_CONFIGS,  # AlterClientQuotas
    50: Op.DESCRIBE,  # DescribeUserScramCredentials
    51: Op.ALTER,  # AlterUserScramCredentials
}


def _group_ids(req: Request) -> list[str]:
    """The group a single-group request names (the batched ones are the handlers')."""
    body = req.body
    key = req.api_key
    if key == 10:  # FindCoordinator v0-3: groups only (key type 0)
        return [body.key] if getattr(body, "key_type", 0) == 0 else []
    return [body.group_id]


# api key -> the operation on the named group(s) it needs
GROUP_APIS: dict[int, Op] = {
    8: Op.READ,  # OffsetCommit
    9: Op.DESCRIBE,  # OffsetFetch
    10: Op.DESCRIBE,  # FindCoordinator
    11: Op.READ,  # JoinGroup
    12: Op.READ,  # Heartbeat
    13: Op.READ,  # LeaveGroup
    14: Op.READ,  # SyncGroup
    47: Op.DELETE,  # OffsetDelete
    68: Op.READ,  # ConsumerGroupHeartbeat
}


Needed = list[tuple[Op, ResourceType, str]]


def _config_resources(op: Op) -> Callable[[Request], Needed]:
    """Describe/Alter(Incremental)Configs: topics (2) by name, the broker (4) as the
    cluster; other resource types (broker loggers) as the cluster too."""

    def needed(req: Request) -> Needed:
        out: Needed = []
        for r in req.body.resources:
            if r.resource_type == 2:
                out.append((op, ResourceType.TOPIC, r.resource_name))
            else:
                out.append((op, ResourceType.CLUSTER, CLUSTER))
        return out

    return needed


def _topics(op: Op, field: str = "name") -> Callable[[Request], Needed]:
    def needed(req: Request) -> Needed:
        return [(op, ResourceType.TOPIC, getattr(t, field)) for t in req.body.topics or ()]

    return needed


# api key -> the resources a request names (all must be allowed; one denial answers the
# request, every entry with its code: clients send one resource per request for these).
# DescribeConfigs, which clients send for many topics at once, answers each resource in
# its own entry (kafka/configs.py), as Kafka does.
RESOURCE_APIS: dict[int, Callable[[Request], Needed]] = {
    8: _topics(Op.READ),  # OffsetCommit: READ on each topic too
    21: _topics(Op.DELETE),  # DeleteRecords
    23: _topics(Op.DESCRIBE, "topic"),  # OffsetForLeaderEpoch
    33: _config_resources(Op.ALTER_CONFIGS),  # AlterConfigs
    44: _config_resources(Op.ALTER_CONFIGS),  # IncrementalAlterConfigs
}


class KafkaAuthorization:
    def __init__(self, authorization: Authorization) -> None:
        self.authz = authorization

    @property
    def api_keys(self) -> frozenset[int]:
        return frozenset(CLUSTER_APIS) | frozenset(GROUP_APIS) | frozenset(RESOURCE_APIS)

    async def guard(self, req: Request) -> Reply | None:
        authz = self.authz
        if not authz.enabled:
            return None
        context = req.context
        op = CLUSTER_APIS.get(req.api_key)
        if op is not None:
            if authz.allowed(context, op, ResourceType.CLUSTER, CLUSTER):
                return None
            return _denied(req, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, f"{op.name} on the cluster")
        op = GROUP_APIS.get(req.api_key)
        batched = (req.api_key == 9 and req.api_version >= 8) or (
            req.api_key == 10 and req.api_version >= 4
        )
        if op is not None and not batched:  # batched ones: per group, in the handler
            groups = _group_ids(req)
            for group in groups:
                if not authz.allowed(context, op, ResourceType.GROUP, group):
                    return _denied(
                        req, ErrorCode.GROUP_AUTHORIZATION_FAILED, f"{op.name} on group {group!r}"
                    )
        resources = RESOURCE_APIS.get(req.api_key)
        if resources is not None:
            for op, rtype, name in resources(req):
                if not authz.allowed(context, op, rtype, name):
                    code = DENIED_CODES[rtype]
                    what = f"{op.name} on {rtype.name.lower()} {name!r}"
                    return _denied(req, code, what)
        return None


def _denied(req: Request, code: ErrorCode, what: str) -> Reply:
    """The denial in the request's response type, per entry where it has entries."""
    principal = req.context.principal if req.context is not None else "?"
    message = f"{principal} is not authorized to {what}"
    m = response_module(req.body)
    kio = kio_code(code)
    body = req.body
    key = req.api_key
    if key == 8:  # OffsetCommit: every partition
        topics = tuple(
            m.OffsetCommitResponseTopic(
                name=t.name,
                partitions=tuple(
                    m.OffsetCommitResponsePartition(
                        partition_index=p.partition_index, error_code=kio
                    )
                    for p in t.partitions
                ),
            )
            for t in body.topics or ()
        )
        return Reply(build(m.OffsetCommitResponse, throttle_time=NO_THROTTLE, topics=topics))
    if key == 30:  # CreateAcls: every creation
        results = tuple(
            m.AclCreationResult(error_code=kio, error_message=message) for _ in body.creations
        )
        return Reply(m.CreateAclsResponse(throttle_time=NO_THROTTLE, results=results))
    if key == 31:  # DeleteAcls: every filter
        results = tuple(
            m.DeleteAclsFilterResult(error_code=kio, error_message=message, matching_acls=())
            for _ in body.filters
        )
        return Reply(m.DeleteAclsResponse(throttle_time=NO_THROTTLE, filter_results=results))
    if key == 51:  # AlterUserScramCredentials: every user
        users = dict.fromkeys([d.name for d in body.deletions] + [u.name for u in body.upsertions])
        results = tuple(
            m.AlterUserScramCredentialsResult(user=u, error_code=kio, error_message=message)
            for u in users
        )
        return Reply(
            m.AlterUserScramCredentialsResponse(throttle_time=NO_THROTTLE, results=results)
        )
    if key == 21:  # DeleteRecords: every partition
        topics = tuple(
            m.DeleteRecordsTopicResult(
                name=t.name,
                partitions=tuple(
                    m.DeleteRecordsPartitionResult(
                        partition_index=p.partition_index, low_watermark=-1, error_code=kio
                    )
                    for p in t.partitions
                ),
            )
            for t in body.topics
        )
        return Reply(m.DeleteRecordsResponse(throttle_time=NO_THROTTLE, topics=topics))
    if key == 23:  # OffsetForLeaderEpoch: every partition
        topics = tuple(
            m.OffsetForLeaderTopicResult(
                topic=t.topic,
                partitions=tuple(
                    build(
                        m.EpochEndOffset,
                        error_code=kio,
                        partition=p.partition,
                        leader_epoch=-1,
                        end_offset=-1,
                    )
                    for p in t.partitions
                ),
            )
            for t in body.topics
        )
        return Reply(
            build(m.OffsetForLeaderEpochResponse, throttle_time=NO_THROTTLE, topics=topics)
        )
    if key == 32:  # DescribeConfigs: every resource
        results = tuple(
            m.DescribeConfigsResult(
                error_code=kio,
                error_message=message,
                resource_type=r.resource_type,
                resource_name=r.resource_name,
                configs=(),
            )
            for r in body.resources
        )
        return Reply(m.DescribeConfigsResponse(throttle_time=NO_THROTTLE, results=results))
    if key in (33, 44):  # AlterConfigs, IncrementalAlterConfigs: every resource
        cls = m.AlterConfigsResponse if key == 33 else m.IncrementalAlterConfigsResponse
        responses = tuple(
            m.AlterConfigsResourceResponse(
                error_code=kio,
                error_message=message,
                resource_type=r.resource_type,
                resource_name=r.resource_name,
            )
            for r in body.resources
        )
        return Reply(cls(throttle_time=NO_THROTTLE, responses=responses))
    return kafka_error_reply(req, code, message)
