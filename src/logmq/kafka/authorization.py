"""The Kafka door's authorization step, and its denials in each request's own shape.

What a request needs is its registry entry's rule (kafka/registry.py, kafka/access.py):
the cluster APIs (CLUSTER_AUTHORIZATION_FAILED), the group a group request names
(GROUP_AUTHORIZATION_FAILED), the resources some requests name. What is decided per
entity inside a request (Produce: WRITE, Fetch: READ, Metadata and ListOffsets:
DESCRIBE, CreateTopics: CREATE, DeleteTopics: DELETE, ...) is answered per entity by the
handlers, through the same ``Authorization`` and the same cache.
"""

from __future__ import annotations

from logmq.errors import ErrorCode
from logmq.kafka.apis import kafka_error_reply
from logmq.kafka.messages import (
    NO_THROTTLE,
    build,
    kio_code,
    response_module,
)
from logmq.net.api_registry import ApiRegistry
from logmq.net.codec import Request
from logmq.net.reply import Reply
from logmq.security.acl import ResourceType
from logmq.security.authorization import DENIED_CODES, Authorization


class KafkaAuthorization:
    """The pipeline step: each request's registry entry names its rule (kafka/access.py)."""

    def __init__(self, authorization: Authorization, registry: ApiRegistry) -> None:
        self.authz = authorization
        self.registry = registry

    async def guard(self, req: Request) -> Reply | None:
        authz = self.authz
        if not authz.enabled:
            return None
        spec = self.registry.get(req.api_key)
        if spec is None:
            return None
        context = req.context
        for op, rtype, name in spec.access.needs(req):  # type: ignore[attr-defined]
            if not authz.allowed(context, op, rtype, name):
                if rtype is ResourceType.CLUSTER:
                    what = f"{op.name} on the cluster"
                else:
                    what = f"{op.name} on {rtype.name.lower()} {name!r}"
                return _denied(req, DENIED_CODES[rtype], what)
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
