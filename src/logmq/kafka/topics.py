"""Kafka's topic admin APIs: CreateTopics, DeleteTopics, CreatePartitions.

Each is a translation onto the controller request the native protocol already has
(``run_on_controller``: run here when this broker is the controller, forwarded to it
otherwise, answered once this broker's metadata holds the change), so topic rules,
validation and internal-topic protection are the same for both front doors.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from logmq.errors import ErrorCode, LogMQError
from logmq.kafka.messages import NO_THROTTLE, build, kio_code, response_module
from logmq.net.codec import ApiKey, Request
from logmq.net.reply import Reply

RunOnController = Callable[[int, dict[str, Any]], Awaitable[dict[str, Any]]]


class KafkaTopicApis:
    def __init__(self, run_on_controller: RunOnController) -> None:
        self.run_on_controller = run_on_controller

    async def _controller(
        self, api_key: int, body: dict[str, Any], names: list[str]
    ) -> dict[str, tuple[ErrorCode, str | None]]:
        """Per topic (error, message) of a native controller request."""
        try:
            answer = await self.run_on_controller(api_key, body)
        except LogMQError as e:
            return {name: (e.code, str(e)) for name in names}
        out: dict[str, tuple[ErrorCode, str | None]] = {}
        for entry in answer.get("topics", []):
            try:
                code = ErrorCode(entry.get("error", 0))
            except ValueError:
                code = ErrorCode.UNKNOWN_SERVER_ERROR
            out[entry.get("topic", "")] = (code, entry.get("message"))
        return out

    # -- CreateTopics ------------------------------------------------------------------
    async def create_topics(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        specs = []
        refused: dict[str, tuple[ErrorCode, str | None]] = {}
        for t in body.topics:
            if t.assignments:
                refused[t.name] = (
                    ErrorCode.INVALID_REQUEST,
                    "manual replica assignments are not supported: give a partition count "
                    "and replication factor (or reassign afterwards)",
                )
                continue
            specs.append(
                {
                    "topic": t.name,
                    "partitions": t.num_partitions,
                    "replication_factor": t.replication_factor,
                    "configs": {c.name: c.value for c in t.configs if c.value is not None},
                }
            )
        results = dict(refused)
        if specs:
            native = {"topics": specs, "validate_only": bool(body.validate_only)}
            names = [s["topic"] for s in specs]
            results.update(await self._controller(ApiKey.CREATE_TOPICS, native, names))
        topics = tuple(
            build(
                m.CreatableTopicResult,
                name=t.name,
                error_code=kio_code(results.get(t.name, (ErrorCode.UNKNOWN_SERVER_ERROR, ""))[0]),
                error_message=results.get(t.name, (None, None))[1],
                num_partitions=t.num_partitions,
                replication_factor=t.replication_factor,
                configs=(),
            )
            for t in body.topics
        )
        return Reply(build(m.CreateTopicsResponse, throttle_time=NO_THROTTLE, topics=topics))

    # -- DeleteTopics ------------------------------------------------------------------
    async def delete_topics(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        names = list(body.topic_names)
        results = await self._controller(ApiKey.DELETE_TOPICS, {"topics": names}, names)
        responses = tuple(
            build(
                m.DeletableTopicResult,
                name=name,
                error_code=kio_code(results.get(name, (ErrorCode.UNKNOWN_SERVER_ERROR, ""))[0]),
                error_message=results.get(name, (None, None))[1],
            )
            for name in names
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
