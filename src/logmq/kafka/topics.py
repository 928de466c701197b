"""Kafka's topic admin APIs: CreateTopics, DeleteTopics, CreatePartitions.

Each maps Kafka's request onto the typed topic admin service (broker/metadata/topic_admin.py),
which runs it on the controller, and its outcomes onto Kafka's answer, so topic rules,
validation and internal-topic protection are the same for both front doors.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from logmq.broker.config_view import topic_configs
from logmq.broker.metadata.topic_admin import PartitionsSpec, TopicAdmin, TopicOutcome, TopicSpec
from logmq.errors import ErrorCode
from logmq.kafka.messages import NO_THROTTLE, build, kio_code, response_module, throttle_time
from logmq.net.codec import Request
from logmq.net.reply import Reply
from logmq.security.acl import AclOperation as Op
from logmq.security.acl import ResourceType
from logmq.security.authorization import CLUSTER, Authorization
from logmq.security.quota_enforcer import quota_caller

if TYPE_CHECKING:
    from logmq.cluster.metadata_image import MetadataImage

ZERO_UUID = uuid.UUID(int=0)
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5  # config_source values


class KafkaTopicApis:
    def __init__(
        self,
        admin: TopicAdmin,
        image: Callable[[], MetadataImage] | None = None,
        topic_defaults: Mapping[str, str] | None = None,
        authz: Authorization | None = None,
    ) -> None:
        self.admin = admin
        self.authz = authz
        self.image = image  # DeleteTopics v6 names topics by id
        self.topic_defaults = dict(topic_defaults or {})  # CreateTopics v5+ answers configs

    def _denied(
        self, req: Request, op: Op, names: list[str], *, cluster_too: bool = False
    ) -> set[str]:
        """The topics this request may not ``op`` (CreateTopics: unless it may CREATE on
        the cluster, as Kafka allows)."""
        authz = self.authz
        if authz is None or not authz.enabled:
            return set()
        if cluster_too and authz.allowed(
            req.context, op, ResourceType.CLUSTER, CLUSTER, log_denial=False
        ):
            return set()
        return authz.denied_topics(req.context, op, names)

    # -- CreateTopics ------------------------------------------------------------------
    async def create_topics(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        specs = [
            TopicSpec(
                t.name,
                t.num_partitions,
                t.replication_factor,
                {c.name: c.value for c in t.configs if c.value is not None},
                # the first broker of each list is the preferred leader
                [(a.partition_index, tuple(a.broker_ids)) for a in t.assignments] or None,
            )
            for t in body.topics
        ]
        validate_only = bool(getattr(body, "validate_only", False))  # v1+
        denied = self._denied(req, Op.CREATE, [s.name for s in specs], cluster_too=True)
        allowed = [s for s in specs if s.name not in denied]
        # KIP-599: v6+ clients know THROTTLING_QUOTA_EXCEEDED; older ones are throttled
        caller = quota_caller(req.context, req.client_id, req.api_version >= 6)
        done = await self.admin.create_topics(allowed, validate_only=validate_only, caller=caller)
        created = iter(done)
        outcomes = [
            _refused(s.name, "CREATE") if s.name in denied else next(created) for s in specs
        ]
        topics = []
        for t, r in zip(body.topics, outcomes, strict=True):
            topics.append(
                build(
                    m.CreatableTopicResult,
                    name=t.name,
                    topic_id=r.topic_id or ZERO_UUID,
                    error_code=kio_code(r.error),
                    error_message=r.message,
                    num_partitions=r.partitions or t.num_partitions,
                    replication_factor=r.replication_factor or t.replication_factor,
                    configs=self._configs(m, r.error, t) if req.api_version >= 5 else (),
                )
            )
        return _throttled(
            build(m.CreateTopicsResponse, throttle_time=NO_THROTTLE, topics=tuple(topics)),
            done.throttle_ms,
        )

    def _configs(self, m: Any, code: ErrorCode, t: Any) -> tuple[Any, ...] | None:
        """The new topic's effective configs (v5+, KIP-525), as DescribeConfigs has them."""
        if code is not ErrorCode.NONE:
            return None
        given = {c.name: c.value for c in t.configs if c.value is not None}
        return tuple(
            m.CreatableTopicConfigs(
                name=v.name,
                value=v.value,
                read_only=v.read_only,
                config_source=DEFAULT_CONFIG if v.default else DYNAMIC_TOPIC_CONFIG,
                is_sensitive=False,
            )
            for v in topic_configs(self.topic_defaults, given)
        )

    # -- DeleteTopics ------------------------------------------------------------------
    async def delete_topics(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        # v6 names each topic by name or by id (null name); an unknown id is UNKNOWN_TOPIC_ID
        wanted: list[tuple[str | None, uuid.UUID | None]]
        if req.api_version >= 6:
            ids = self.image().topics_by_uuid if self.image is not None else {}
            wanted = [
                (t.name if t.name is not None else ids.get(t.topic_id), t.topic_id)
                for t in body.topics
            ]
        else:
            wanted = [(name, None) for name in body.topic_names]
        names = [name for name, _ in wanted if name is not None]
        denied = self._denied(req, Op.DELETE, names)
        deleted = await self.admin.delete_topics(
            [n for n in names if n not in denied],
            caller=quota_caller(req.context, req.client_id, req.api_version >= 5),
        )
        results = {r.name: r for r in deleted}
        results.update({n: _refused(n, "DELETE") for n in denied})
        unknown_id = TopicOutcome("", ErrorCode.UNKNOWN_TOPIC_ID, "no topic has this id")
        responses = tuple(
            build(
                m.DeletableTopicResult,
                name=name,
                topic_id=topic_id or ZERO_UUID,
                error_code=kio_code((r := results[name] if name else unknown_id).error),
                error_message=r.message,
            )
            for name, topic_id in wanted
        )
        return _throttled(
            build(m.DeleteTopicsResponse, throttle_time=NO_THROTTLE, responses=responses),
            deleted.throttle_ms,
        )

    # -- CreatePartitions --------------------------------------------------------------
    async def create_partitions(self, req: Request) -> Reply:
        """Grow topics, placed by the controller or on the request's ``assignments``
        (null: placed; a list: one replica list per new partition, checked by the
        controller against the brokers and the topic's replication factor)."""
        body = req.body
        m = response_module(body)
        names = [t.name for t in body.topics]
        denied = self._denied(req, Op.ALTER, names)
        # a topic named twice: neither entry is run, both are INVALID_REQUEST (Kafka's rule)
        twice = {n for n, k in Counter(names).items() if k > 1} - denied
        specs = [
            PartitionsSpec(
                t.name,
                t.count,
                None if t.assignments is None else [tuple(a.broker_ids) for a in t.assignments],
            )
            for t in body.topics
            if t.name not in denied and t.name not in twice
        ]
        grown = await self.admin.create_partitions(
            specs,
            validate_only=bool(body.validate_only),
            caller=quota_caller(req.context, req.client_id, req.api_version >= 3),
        )
        results = {r.name: r for r in grown}
        results.update({n: _refused(n, "ALTER") for n in denied})
        results.update(
            {
                n: TopicOutcome(n, ErrorCode.INVALID_REQUEST, f"topic {n!r} named more than once")
                for n in twice
            }
        )
        out = tuple(
            m.CreatePartitionsTopicResult(
                name=t.name,
                error_code=kio_code((r := results[t.name]).error),
                error_message=r.message,
            )
            for t in body.topics
        )
        return _throttled(
            m.CreatePartitionsResponse(throttle_time=NO_THROTTLE, results=out), grown.throttle_ms
        )


def _throttled(answer: Any, throttle_ms: int) -> Reply:
    """The answer with the controller's mutation-quota throttle, the client muted that long."""
    if not throttle_ms:
        return Reply(answer)
    answer = dataclasses.replace(answer, throttle_time=throttle_time(throttle_ms))
    return Reply(answer, throttle_ms=throttle_ms)


def _refused(name: str, what: str) -> TopicOutcome:
    return TopicOutcome(
        name, ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"not authorized to {what} topic {name!r}"
    )
