"""Kafka's config APIs: DescribeConfigs, AlterConfigs, IncrementalAlterConfigs.

Topic configs live in the metadata image (the controller changes them); both front doors
describe them through broker/config_view.py and change them through the native
controller request, which takes the keys to set and the keys to delete. Kafka's
AlterConfigs *replaces* a topic's overrides: every override it does not name is
deleted. IncrementalAlterConfigs changes only what it names (SET, DELETE, and APPEND or
SUBTRACT on list values such as ``cleanup.policy``). Every Kafka topic config name is
accepted (storage/config.py keeps the ones logmq does not act on); any other name is
INVALID_CONFIG, as on Kafka. Broker settings are static (command line or file) and
described read-only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from logmq.broker.config_view import ConfigView, broker_configs, topic_configs
from logmq.broker.metadata.topic_admin import RunOnController
from logmq.errors import ErrorCode, LogMQError
from logmq.kafka.messages import NO_THROTTLE, build, kio_code, response_module
from logmq.net.codec import ApiKey, Request
from logmq.net.reply import Reply
from logmq.security.acl import AclOperation as Op
from logmq.security.acl import ResourceType
from logmq.security.authorization import CLUSTER, Authorization
from logmq.storage.config import is_list_config

if TYPE_CHECKING:
    from logmq.broker.config import BrokerConfig
    from logmq.cluster.metadata_image import MetadataImage

TOPIC, BROKER = 2, 4  # Kafka's resource types
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3  # IncrementalAlterConfigs operations
# config_source values
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5


class KafkaConfigApis:
    def __init__(
        self,
        config: BrokerConfig,
        image: Callable[[], MetadataImage],
        run_on_controller: RunOnController,
        authz: Authorization | None = None,
    ) -> None:
        self.config = config
        self.image = image
        self.run_on_controller = run_on_controller
        # DescribeConfigs answers a denied resource in its own entry, as Kafka
        self.authz = authz

    # -- DescribeConfigs ---------------------------------------------------------------
    async def describe_configs(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        results = []
        for res in body.resources:
            denied = self._denied(req, res.resource_type, res.resource_name)
            if denied is not None:
                code, message, views, source = denied, "not authorized to DESCRIBE_CONFIGS", [], 0
            else:
                code, message, views, source = self._describe(res.resource_type, res.resource_name)
            keys = res.configuration_keys
            configs = tuple(
                build(
                    m.DescribeConfigsResourceResult,
                    name=v.name,
                    value=v.value,
                    read_only=v.read_only,
                    config_source=DEFAULT_CONFIG if v.default else source,
                    is_default=v.default,
                    is_sensitive=False,
                    synonyms=(),
                    config_type=0,
                    documentation=None,
                )
                for v in views
                if keys is None or v.name in keys
            )
            results.append(
                m.DescribeConfigsResult(
                    error_code=kio_code(code),
                    error_message=message,
                    resource_type=res.resource_type,
                    resource_name=res.resource_name,
                    configs=configs,
                )
            )
        return Reply(m.DescribeConfigsResponse(throttle_time=NO_THROTTLE, results=tuple(results)))

    def _denied(self, req: Request, rtype: int, name: str) -> ErrorCode | None:
        """DESCRIBE_CONFIGS on the topic, or on the cluster for the broker (and any
        other resource type), answered per resource before anything is looked up: a
        denied topic answers alike whether it exists or not."""
        if self.authz is None:
            return None
        if rtype == TOPIC:
            return self.authz.denial(req.context, Op.DESCRIBE_CONFIGS, ResourceType.TOPIC, name)
        return self.authz.denial(req.context, Op.DESCRIBE_CONFIGS, ResourceType.CLUSTER, CLUSTER)

    def _describe(
        self, rtype: int, name: str
    ) -> tuple[ErrorCode, str | None, list[ConfigView], int]:
        if rtype == TOPIC:
            image = self.image()
            if name not in image.topics:
                return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}", [], 0
            views = topic_configs(self.config.topic_defaults, dict(image.topic_config(name)))
            return ErrorCode.NONE, None, views, DYNAMIC_TOPIC_CONFIG
        if rtype == BROKER:
            if name not in ("", str(self.config.node_id)):
                message = f"this is broker {self.config.node_id}, not {name!r}"
                return ErrorCode.INVALID_REQUEST, message, [], 0
            return ErrorCode.NONE, None, broker_configs(self.config), STATIC_BROKER_CONFIG
        return ErrorCode.INVALID_REQUEST, f"resource type {rtype} is not supported", [], 0

    # -- AlterConfigs / IncrementalAlterConfigs ----------------------------------------
    async def alter_configs(self, req: Request) -> Reply:
        """Replace each topic's overrides with the ones given."""
        body = req.body

        def changes(name: str, res: Any) -> dict[str, str | None]:
            given = {c.name: c.value for c in res.configs}
            current = dict(self.image().topic_config(name))
            return {**dict.fromkeys(current), **given}

        return await self._alter(body, response_module(body), changes)

    async def incremental_alter_configs(self, req: Request) -> Reply:
        """Change only the configs named, by operation."""
        body = req.body

        def changes(name: str, res: Any) -> dict[str, str | None]:
            out: dict[str, str | None] = {}
            effective = {
                v.name: v.value
                for v in topic_configs(
                    self.config.topic_defaults, dict(self.image().topic_config(name))
                )
            }
            for c in res.configs:
                op = c.config_operation
                if op == SET:
                    out[c.name] = c.value
                elif op == DELETE:
                    out[c.name] = None
                elif op in (APPEND, SUBTRACT):
                    if not is_list_config(c.name):  # Kafka: only LIST-typed configs
                        verb = "APPEND to" if op == APPEND else "SUBTRACT from"
                        raise LogMQError(
                            f"cannot {verb} {c.name!r}: it is not a list config",
                            ErrorCode.INVALID_CONFIG,
                        )
                    now = [x for x in (effective.get(c.name) or "").split(",") if x]
                    items = [x for x in (c.value or "").split(",") if x]
                    if op == APPEND:
                        now += [x for x in items if x not in now]
                    else:
                        now = [x for x in now if x not in items]
                    out[c.name] = ",".join(now)
                else:
                    raise LogMQError(f"unknown config operation {op}", ErrorCode.INVALID_REQUEST)
            return out

        return await self._alter(body, response_module(body), changes)

    async def _alter(self, body: Any, m: Any, changes: Any) -> Reply:
        responses = []
        for res in body.resources:
            code, message = ErrorCode.NONE, None
            try:
                if res.resource_type != TOPIC:
                    raise LogMQError(
                        "only topic configs can be altered: broker settings are static",
                        ErrorCode.INVALID_REQUEST,
                    )
                name = res.resource_name
                if name not in self.image().topics:
                    raise LogMQError(
                        f"unknown topic {name!r}", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    )
                change = changes(name, res)
                native = {
                    "type": "topic",
                    "name": name,
                    "set": {k: v for k, v in change.items() if v is not None},
                    "delete": [k for k, v in change.items() if v is None],
                }
                answer = await self.run_on_controller(
                    ApiKey.ALTER_CONFIGS,
                    {"resources": [native], "validate_only": bool(body.validate_only)},
                )
                entry = (answer.get("resources") or [{}])[0]
                code = ErrorCode(entry.get("error", 0))
                message = entry.get("message")
            except LogMQError as e:
                code, message = e.code, str(e)
            except ValueError:
                code, message = ErrorCode.UNKNOWN_SERVER_ERROR, "unknown error code"
            responses.append(
                m.AlterConfigsResourceResponse(
                    error_code=kio_code(code),
                    error_message=message,
                    resource_type=res.resource_type,
                    resource_name=res.resource_name,
                )
            )
        cls = getattr(m, "AlterConfigsResponse", None) or m.IncrementalAlterConfigsResponse
        return Reply(cls(throttle_time=NO_THROTTLE, responses=tuple(responses)))
