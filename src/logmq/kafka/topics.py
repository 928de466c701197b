"""Kafka's topic admin APIs: CreateTopics, DeleteTopics, CreatePartitions.

Each is a translation onto the controller request the native protocol already has
(``run_on_controller``: run here when this broker is the controller, forwarded to it
otherwise, answered once this broker's metadata holds the change), so topic rules,
validation and internal-topic protection are the same for both front doors.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from logmq.broker.config_view import topic_configs
from logmq.errors import ErrorCode, LogMQError
from logmq.kafka.messages import NO_THROTTLE, build, kio_code, response_module
from logmq.net.codec import ApiKey, Request
from logmq.net.reply import Reply

if TYPE_CHECKING:
    from logmq.cluster.metadata_image import MetadataImage

RunOnController = Callable[[int, dict[str, Any]], Awaitable[dict[str, Any]]]
ZERO_UUID = uuid.UUID(int=0)
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5  # config_source values


class KafkaTopicApis:
    def __init__(
        self,
        run_on_controller: RunOnController,
        image: Callable[[], MetadataImage] | None = None,
        topic_defaults: Mapping[str, str] | None = None,
    ) -> None:
        self.run_on_controller = run_on_controller
        self.image = image  # DeleteTopics v6 names topics by id
        self.topic_defaults = dict(topic_defaults or {})  # CreateTopics v5+ answers configs

    async def _controller_entries(
        self, api_key: int, body: dict[str, Any], names: list[str]
    ) -> dict[str, dict[str, Any]]:
        """Per topic, the answer entry of a native controller request."""
        try:
            answer = await self.run_on_controller(api_key, body)
        except LogMQError as e:
            return {name: {"error": int(e.code), "message": str(e)} for name in names}
        return {entry.get("topic", ""): entry for entry in answer.get("topics", [])}

    async def _controller(
        self, api_key: int, body: dict[str, Any], names: list[str]
    ) -> dict[str, tuple[ErrorCode, str | None]]:
        """Per topic (error, message) of a native controller request."""
        entries = await self._controller_entries(api_key, body, names)
        return {name: (_code(e), e.get("message")) for name, e in entries.items()}

    # -- CreateTopics ------------------------------------------------------------------
    async def create_topics(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        specs = []
        for t in body.topics:
            spec: dict[str, Any] = {
                "topic": t.name,
                "partitions": t.num_partitions,
                "replication_factor": t.replication_factor,
                "configs": {c.name: c.value for c in t.configs if c.value is not None},
            }
            if t.assignments:  # the first broker of each list is the preferred leader
                spec["assignments"] = [
                    {"partition": a.partition_index, "replicas": list(a.broker_ids)}
                    for a in t.assignments
                ]
            specs.append(spec)
        results: dict[str, dict[str, Any]] = {}
        if specs:
            validate_only = bool(getattr(body, "validate_only", False))  # v1+
            native = {"topics": specs, "validate_only": validate_only}
            names = [s["topic"] for s in specs]
            results = await self._controller_entries(ApiKey.CREATE_TOPICS, native, names)
        lost = {"error": int(ErrorCode.UNKNOWN_SERVER_ERROR), "message": None}
        topics = []
        for t in body.topics:
            entry = results.get(t.name, lost)
            code, message = _code(entry), entry.get("message")
            topics.append(
                build(
                    m.CreatableTopicResult,
                    name=t.name,
                    topic_id=_uuid(entry.get("topic_id")),
                    error_code=kio_code(code),
                    error_message=message,
                    num_partitions=entry.get("partitions", t.num_partitions),
                    replication_factor=entry.get("replication_factor", t.replication_factor),
                    configs=self._configs(m, code, t) if req.api_version >= 5 else (),
                )
            )
        return Reply(build(m.CreateTopicsResponse, throttle_time=NO_THROTTLE, topics=tuple(topics)))

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
            ids = {}
            if self.image is not None:
                ids = {_uuid(t.topic_id): n for n, t in self.image().topics.items()}
            wanted = [
                (t.name if t.name is not None else ids.get(t.topic_id), t.topic_id)
                for t in body.topics
            ]
        else:
            wanted = [(name, None) for name in body.topic_names]
        names = [name for name, _ in wanted if name is not None]
        results: dict[str, tuple[ErrorCode, str | None]] = {}
        if names:
            results = await self._controller(ApiKey.DELETE_TOPICS, {"topics": names}, names)
        unknown_id = (ErrorCode.UNKNOWN_TOPIC_ID, "no topic has this id")
        lost = (ErrorCode.UNKNOWN_SERVER_ERROR, None)
        responses = tuple(
            build(
                m.DeletableTopicResult,
                name=name,
                topic_id=topic_id or ZERO_UUID,
                error_code=kio_code(results.get(name, lost)[0] if name else unknown_id[0]),
                error_message=results.get(name, lost)[1] if name else unknown_id[1],
            )
            for name, topic_id in wanted
        )
        return Reply(build(m.DeleteTopicsResponse, throttle_time=NO_THROTTLE, responses=responses))

    # -- CreatePartitions --------------------------------------------------------------
    async def create_partitions(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        results: dict[str, tuple[ErrorCode, str | None]] = {}
        specs = []
        for t in body.topics:
            if t.assignments:
                results[t.name] = (
                    ErrorCode.INVALID_REQUEST,
                    "manual replica assignments are not supported",
                )
            else:
                specs.append({"topic": t.name, "count": t.count})
        if specs:
            native = {"topics": specs, "timeout_ms": 0, "validate_only": bool(body.validate_only)}
            names = [s["topic"] for s in specs]
            results.update(await self._controller(ApiKey.CREATE_PARTITIONS, native, names))
        out = tuple(
            m.CreatePartitionsTopicResult(
                name=t.name,
                error_code=kio_code(results.get(t.name, (ErrorCode.UNKNOWN_SERVER_ERROR, ""))[0]),
                error_message=results.get(t.name, (None, None))[1],
            )
            for t in body.topics
        )
        return Reply(m.CreatePartitionsResponse(throttle_time=NO_THROTTLE, results=out))


def _code(entry: dict[str, Any]) -> ErrorCode:
    try:
        return ErrorCode(entry.get("error", 0))
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR


def _uuid(topic_id: Any) -> uuid.UUID:
    """A topic id as Kafka writes it; all zeros for none (a topic not created)."""
    try:
        return uuid.UUID(topic_id)
    except (ValueError, TypeError, AttributeError):
        return uuid.UUID(int=0)
