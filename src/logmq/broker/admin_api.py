"""Handlers of the metadata and administration APIs (everything but the data path).

ApiVersions, Metadata, CreateTopics, CreatePartitions, DeleteTopics, DescribeConfigs,
AlterConfigs and InitProducerId. Body schemas are in docs/protocol.md; per-entry
failures are answered per entry so one bad topic never fails its neighbours.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from logmq.broker.group_coordinator import PROTECTED_OFFSETS_CONFIGS
from logmq.broker.metadata_store import (
    MAX_PARTITIONS_PER_TOPIC,
    TopicInfo,
    is_internal,
    topic_name_error,
)
from logmq.broker.request_fields import (
    InvalidRequestError,
    req_field,
    req_int,
    req_list,
    req_str,
    req_str_map,
)
from logmq.errors import ErrorCode, InvalidConfigError, LogMQError
from logmq.group import OFFSETS_TOPIC
from logmq.net.codec import Request
from logmq.net.server import Reply
from logmq.storage.config import LogConfig

if TYPE_CHECKING:
    from logmq.broker.broker import Broker

MAX_PRODUCER_EPOCH = 32767


def _entry(name: str, code: ErrorCode = ErrorCode.NONE, message: str | None = None) -> dict:
    return {"topic": name, "error": int(code), "message": message}


class AdminApi:
    def __init__(self, broker: Broker):
        self.b = broker

    def api_list(self) -> list[list[int]]:
        from logmq.broker.broker import SUPPORTED_APIS

        return [[int(k), lo, hi] for k, (lo, hi) in sorted(SUPPORTED_APIS.items())]

    async def api_versions(self, req: Request) -> Reply:
        return Reply({"error": 0, "apis": self.api_list()})

    # -- Metadata ---------------------------------------------------------------------
    def _topic_metadata(self, info: TopicInfo) -> dict[str, Any]:
        node = self.b.config.node_id
        return {
            "topic": info.name,
            "error": 0,
            "internal": info.internal,
            "partitions": [
                {
                    "partition": p,
                    "error": 0,
                    "leader": node,
                    "leader_epoch": 0,
                    "replicas": [node],
                    "isr": [node],
                }
                for p in range(info.partitions)
            ],
        }

    async def metadata(self, req: Request) -> Reply:
        store = self.b.topics
        assert store is not None
        names = req_field(req.body, "topics", list, None)
        auto = req_field(req.body, "allow_auto_create", bool, False)
        topics = []
        if names is None:
            topics = [self._topic_metadata(t) for t in store.all()]
        else:
            for name in names:
                if not isinstance(name, str):
                    raise InvalidRequestError("topic names must be strings")
                info = store.get(name)
                if info is None and auto:
                    info = self.b.maybe_auto_create(name)
                if info is None:
                    code = (
                        ErrorCode.INVALID_TOPIC_EXCEPTION
                        if topic_name_error(name)
                        else (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                    )
                    topics.append(
                        {"topic": name, "error": int(code), "internal": False, "partitions": []}
                    )
                else:
                    topics.append(self._topic_metadata(info))
        cfg = self.b.config
        return Reply(
            {
                "cluster_id": self.b.cluster_id,
                "controller_id": cfg.node_id,
                "brokers": [{"node_id": cfg.node_id, "host": cfg.advertised, "port": self.b.port}],
                "topics": topics,
            }
        )

    # -- CreateTopics / DeleteTopics --------------------------------------------------
    def _check_new_topic(self, spec: Any) -> TopicInfo:
        name = req_str(spec, "topic")
        problem = topic_name_error(name)
        if problem:
            raise LogMQError(problem, ErrorCode.INVALID_TOPIC_EXCEPTION)
        if is_internal(name):
            raise LogMQError(
                f"names starting with '__' are reserved for internal topics: {name!r}",
                ErrorCode.INVALID_TOPIC_EXCEPTION,
            )
        partitions = req_int(spec, "partitions", -1)
        if partitions == -1:
            partitions = self.b.config.default_partitions
        if not 1 <= partitions <= MAX_PARTITIONS_PER_TOPIC:
            raise LogMQError(
                f"partitions must be 1..{MAX_PARTITIONS_PER_TOPIC}, got {partitions}",
                ErrorCode.INVALID_PARTITIONS,
            )
        rf = req_int(spec, "replication_factor", -1)
        if rf not in (1, -1):
            raise LogMQError(
                f"replication factor {rf} is not possible: this broker runs a single node "
                "(use 1 or -1 for the default)",
                ErrorCode.INVALID_REPLICATION_FACTOR,
            )
        configs = req_str_map(spec, "configs")
        LogConfig.from_dict(dict(configs))  # raises InvalidConfigError naming the key
        assert self.b.topics is not None
        if name in self.b.topics:
            raise LogMQError(f"topic {name!r} already exists", ErrorCode.TOPIC_ALREADY_EXISTS)
        return TopicInfo(name, partitions, dict(configs))

    async def create_topics(self, req: Request) -> Reply:
        specs = req_list(req.body, "topics")
        validate_only = req_field(req.body, "validate_only", bool, False)
        out = []
        seen: set[str] = set()
        for spec in specs:
            name = spec.get("topic") if isinstance(spec, dict) else None
            name = name if isinstance(name, str) else ""
            try:
                if name in seen:
                    raise InvalidRequestError(f"topic {name!r} appears twice in the request")
                seen.add(name)
                info = self._check_new_topic(spec)
                if not validate_only:
                    self.b.create_topic(info)
                out.append(_entry(name))
            except LogMQError as e:
                self.b.metrics.error(req.api_key, e.code)
                out.append(_entry(name, e.code, str(e)))
        return Reply({"topics": out})

    # -- CreatePartitions -------------------------------------------------------------
    def _check_new_count(self, spec: Any) -> tuple[str, int]:
        """The topic and its new total partition count, if the request may grow it."""
        name = req_str(spec, "topic")
        count = req_int(spec, "count")
        assert self.b.topics is not None
        info = self.b.topics.get(name)
        if info is None:
            problem = topic_name_error(name)
            if problem:
                raise LogMQError(problem, ErrorCode.INVALID_TOPIC_EXCEPTION)
            raise LogMQError(f"unknown topic {name!r}", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        if info.internal:
            # the coordinator of a group is xxh32(group) % partitions: another count would
            # move every group away from the partition that holds its state
            raise LogMQError(
                f"{name!r} is an internal topic: its partition count cannot be changed",
                ErrorCode.INVALID_TOPIC_EXCEPTION,
            )
        if count <= info.partitions:
            raise LogMQError(
                f"topic {name!r} has {info.partitions} partition(s); the new count must be "
                f"larger (partitions can be added, never removed), got {count}",
                ErrorCode.INVALID_PARTITIONS,
            )
        if count > MAX_PARTITIONS_PER_TOPIC:
            raise LogMQError(
                f"a topic may have at most {MAX_PARTITIONS_PER_TOPIC} partitions, got {count}",
                ErrorCode.INVALID_PARTITIONS,
            )
        return name, count

    async def create_partitions(self, req: Request) -> Reply:
        specs = req_list(req.body, "topics")
        req_int(req.body, "timeout_ms", 0)  # a single node finishes before it answers
        validate_only = req_field(req.body, "validate_only", bool, False)
        out = []
        seen: set[str] = set()
        for spec in specs:
            name = spec.get("topic") if isinstance(spec, dict) else None
            name = name if isinstance(name, str) else ""
            try:
                if name and name in seen:
                    raise InvalidRequestError(f"topic {name!r} appears twice in the request")
                seen.add(name)
                name, count = self._check_new_count(spec)
                if not validate_only:
                    self.b.add_partitions(name, count)
                out.append(_entry(name))
            except LogMQError as e:
                self.b.metrics.error(req.api_key, e.code)
                out.append(_entry(name, e.code, str(e)))
        return Reply({"topics": out})

    async def delete_topics(self, req: Request) -> Reply:
        names = req_list(req.body, "topics")
        store = self.b.topics
        assert store is not None
        out = []
        for name in names:
            if not isinstance(name, str):
                raise InvalidRequestError("topic names must be strings")
            if name not in store:
                out.append(
                    _entry(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
                )
                continue
            if is_internal(name):
                message = f"{name!r} is an internal topic and cannot be deleted"
                out.append(_entry(name, ErrorCode.INVALID_TOPIC_EXCEPTION, message))
                continue
            self.b.delete_topic(name)
            out.append(_entry(name))
        return Reply({"topics": out})

    # -- Configs ----------------------------------------------------------------------
    def _topic_configs(self, info: TopicInfo) -> list[dict]:
        defaults = self._base_config().to_dict()
        effective = self._base_config().merged(info.configs).to_dict()
        return [
            {
                "name": key,
                "value": None if value is None else str(value),
                "default": key not in info.configs and defaults.get(key) == value,
                "read_only": False,
            }
            for key, value in sorted(effective.items())
        ]

    def _base_config(self) -> LogConfig:
        return LogConfig.from_dict(dict(self.b.config.topic_defaults))

    def _broker_configs(self) -> list[dict]:
        cfg = self.b.config
        out = []
        for name in cfg.field_names():
            value = getattr(cfg, name)
            if name == "topic_defaults":
                continue
            out.append(
                {
                    "name": name.replace("_", "."),
                    "read_only": True,
                    "default": False,
                    "value": None if value is None else str(value),
                }
            )
        return out

    async def describe_configs(self, req: Request) -> Reply:
        resources = req_list(req.body, "resources")
        store = self.b.topics
        assert store is not None
        out = []
        for res in resources:
            rtype = req_str(res, "type")
            name = req_str(res, "name")
            entry: dict[str, Any] = {
                "type": rtype,
                "name": name,
                "error": 0,
                "message": None,
                "configs": [],
            }
            if rtype == "topic":
                info = store.get(name)
                if info is None:
                    entry["error"] = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                    entry["message"] = f"unknown topic {name!r}"
                else:
                    entry["configs"] = self._topic_configs(info)
            elif rtype == "broker":
                if name not in ("", str(self.b.config.node_id)):
                    entry["error"] = int(ErrorCode.INVALID_REQUEST)
                    entry["message"] = f"this is broker {self.b.config.node_id}, not {name!r}"
                else:
                    entry["configs"] = self._broker_configs()
            else:
                entry["error"] = int(ErrorCode.INVALID_REQUEST)
                entry["message"] = f"unknown resource type {rtype!r}"
            out.append(entry)
        return Reply({"resources": out})

    async def alter_configs(self, req: Request) -> Reply:
        resources = req_list(req.body, "resources")
        validate_only = req_field(req.body, "validate_only", bool, False)
        store = self.b.topics
        assert store is not None and self.b.logs is not None
        out = []
        for res in resources:
            rtype = req_str(res, "type")
            name = req_str(res, "name")
            entry: dict[str, Any] = {"type": rtype, "name": name, "error": 0, "message": None}
            try:
                if rtype != "topic":
                    raise InvalidConfigError(f"only topic configs can be altered, not {rtype!r}")
                info = store.get(name)
                if info is None:
                    raise LogMQError(
                        f"unknown topic {name!r}", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    )
                new = dict(info.configs)
                new.update(req_str_map(res, "set"))
                for key in req_list(res, "delete", []):
                    if not isinstance(key, str):
                        raise InvalidRequestError("'delete' must list config names")
                    new.pop(key, None)
                LogConfig.from_dict(dict(new))
                if name == OFFSETS_TOPIC:
                    _check_offsets_configs(info.configs, new)
                if not validate_only:
                    store.set_configs(name, new)
                    self.b.logs.set_topic_config(name, dict(new))
            except LogMQError as e:
                entry["error"], entry["message"] = int(e.code), str(e)
            out.append(entry)
        return Reply({"resources": out})

    # -- InitProducerId ---------------------------------------------------------------
    async def init_producer_id(self, req: Request) -> Reply:
        body = req.body
        if req_field(body, "transactional_id", str, None) is not None:
            raise InvalidRequestError("transactions are not supported yet")
        pid = req_int(body, "producer_id", -1)
        epoch = req_int(body, "producer_epoch", -1)
        ids = self.b.producer_ids
        assert ids is not None
        if pid >= 0 and 0 <= epoch < MAX_PRODUCER_EPOCH and ids.was_issued(pid):
            return Reply({"error": 0, "producer_id": pid, "producer_epoch": epoch + 1})
        return Reply({"error": 0, "producer_id": ids.next_id(), "producer_epoch": 0})


def _check_offsets_configs(old: dict[str, str], new: dict[str, str]) -> None:
    """Retention must never delete the newest value of a key of the offsets topic."""
    for key in PROTECTED_OFFSETS_CONFIGS:
        if new.get(key) != old.get(key):
            raise InvalidConfigError(
                f"{key} of {OFFSETS_TOPIC} cannot be changed: the topic must stay compacted "
                "and never lose a key's newest value"
            )
