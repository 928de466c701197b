"""Handlers of the metadata and administration APIs (everything but the data path).

ApiVersions, Metadata, CreateTopics, CreatePartitions, DeleteTopics, DescribeConfigs,
AlterConfigs and InitProducerId. Body schemas are in docs/protocol.md; per-entry
failures are answered per entry so one bad topic never fails its neighbours.

Metadata is answered from this broker's metadata image. The handlers that change it
(CreateTopics, CreatePartitions, DeleteTopics, AlterConfigs) run on the controller
(Broker forwards them there) and answer once the change is committed, with the metadata
offset a forwarding broker waits for before it answers its client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from logmq.broker.config_view import ConfigView, broker_configs, topic_configs
from logmq.broker.coordinator.group_service import PROTECTED_OFFSETS_CONFIGS
from logmq.broker.metadata.image_topics import TopicInfo
from logmq.cluster.controller_api import NewTopic
from logmq.cluster.topic_names import MAX_PARTITIONS_PER_TOPIC, is_internal, topic_name_error
from logmq.errors import ErrorCode, InvalidConfigError, LogMQError
from logmq.group import OFFSETS_TOPIC
from logmq.native.request_fields import (
    InvalidRequestError,
    req_field,
    req_int,
    req_list,
    req_str,
    req_str_map,
)
from logmq.net.codec import Request
from logmq.net.reply import Reply
from logmq.security.acl import AclOperation as Op
from logmq.security.acl import ResourceType
from logmq.security.authorization import CLUSTER
from logmq.storage.config import LogConfig

if TYPE_CHECKING:
    from logmq.broker.config import BrokerConfig
    from logmq.broker.coordinator.txn_service import TransactionCoordinatorService
    from logmq.broker.metadata.image_topics import ImageTopics
    from logmq.broker.metadata.producer_ids import ProducerIdManager
    from logmq.broker.metadata.quorum_service import MetadataQuorum
    from logmq.broker.metadata.topic_creation import TopicCreator
    from logmq.broker.metrics import BrokerMetrics
    from logmq.cluster.metadata_image import MetadataImage
    from logmq.security.authorization import Authorization
    from logmq.security.quota_enforcer import MutationQuota, QuotaEnforcer

MAX_PRODUCER_EPOCH = 32767


def _config_entry(v: ConfigView) -> dict:
    return {"name": v.name, "value": v.value, "default": v.default, "read_only": v.read_only}


def _entry(name: str, code: ErrorCode = ErrorCode.NONE, message: str | None = None) -> dict:
    return {"topic": name, "error": int(code), "message": message}


def _throttled(name: str, quota: MutationQuota) -> dict:
    return _entry(
        name,
        ErrorCode.THROTTLING_QUOTA_EXCEEDED,
        f"controller_mutation_rate quota exceeded: retry in {quota.throttle_ms} ms",
    )


class AdminApi:
    """Metadata, topic, config and producer-id APIs over the metadata quorum."""

    def __init__(
        self,
        config: BrokerConfig,
        quorum: MetadataQuorum,
        topics: ImageTopics,
        topic_creator: TopicCreator,
        producer_ids: ProducerIdManager,
        metrics: BrokerMetrics,
        advertised: Mapping[int, tuple[int, int]],
        quotas: QuotaEnforcer | None = None,
        txns: TransactionCoordinatorService | None = None,
        authz: Authorization | None = None,
    ) -> None:
        """``txns`` serves InitProducerId with a transactional id (None: refused);
        ``advertised`` is what ApiVersions lists (native/registry.py); ``authz`` the
        per-entry rules of Metadata and DescribeConfigs (a listing shows what the
        principal may describe, a denied entry answers alone, as on the Kafka door)."""
        self.config = config
        self.advertised = advertised
        self.authz = authz
        self.txns = txns
        self.quotas = quotas  # controller_mutation_rate, metered here on the controller
        self.quorum = quorum
        self.topics = topics
        self.topic_creator = topic_creator
        self.producer_ids = producer_ids
        self.metrics = metrics
        # (image, topic -> Metadata entry) for the image the entries were built from
        self._metadata_built: tuple[object, dict[str, dict[str, Any]]] = (None, {})

    def api_list(self) -> list[list[int]]:
        return [[int(k), lo, hi] for k, (lo, hi) in sorted(self.advertised.items())]

    async def api_versions(self, req: Request) -> Reply:
        return Reply({"error": 0, "apis": self.api_list()})

    # -- Metadata ---------------------------------------------------------------------
    def _topic_metadata(self, name: str) -> dict[str, Any]:
        """A topic's Metadata entry, built once per metadata image: the image never
        changes, and a topic of 10,000 partitions costs tens of ms to describe, which
        every client of it asks for on start and on every leadership change. The
        entries are shared by answers, never changed once built."""
        image = self.quorum.image
        built = self._metadata_built
        if built[0] is not image:
            built = self._metadata_built = (image, {})
        entry = built[1].get(name)
        if entry is None:
            entry = built[1][name] = self._build_topic_metadata(image, name)
        return entry

    def _build_topic_metadata(self, image: MetadataImage, name: str) -> dict[str, Any]:
        t = image.topics[name]
        partitions = []
        for p in sorted(t.partitions):
            part = t.partitions[p]
            code = ErrorCode.NONE if part.has_leader else ErrorCode.LEADER_NOT_AVAILABLE
            entry = {
                "partition": p,
                "error": int(code),
                "leader": part.leader,
                "leader_epoch": part.leader_epoch,
                "replicas": list(part.replicas),
                "isr": list(part.isr),
            }
            if part.reassigning:  # only while moving: keeps the common answer small
                entry["adding_replicas"] = list(part.adding_replicas)
                entry["removing_replicas"] = list(part.removing_replicas)
            partitions.append(entry)
        return {"topic": name, "error": 0, "internal": is_internal(name), "partitions": partitions}

    def live_brokers(self) -> list[dict[str, Any]]:
        """Registered, unfenced brokers as clients reach them."""
        return [
            {"node_id": reg.broker_id, "host": reg.host, "port": reg.port}
            for _, reg in sorted(self.quorum.image.brokers.items())
            if not reg.fenced
        ]

    async def metadata(self, req: Request) -> Reply:
        names = req_field(req.body, "topics", list, None)
        auto = req_field(req.body, "allow_auto_create", bool, False)
        authz = self.authz if self.authz is not None and self.authz.enabled else None
        context = req.context
        topics = []
        if names is None:
            listed = sorted(self.quorum.image.topics)
            if authz is not None:  # a topic it may not describe is not there
                listed = authz.describable(context, ResourceType.TOPIC, listed)
            topics = [self._topic_metadata(n) for n in listed]
        else:
            if not all(isinstance(name, str) for name in names):
                raise InvalidRequestError("topic names must be strings")
            for name in names:
                if authz is not None and (
                    not authz.allowed(context, Op.DESCRIBE, ResourceType.TOPIC, name)
                    or (
                        auto
                        and name not in self.quorum.image.topics
                        and not authz.may_create_topic(context, name)
                    )
                ):
                    # alike whether it exists or not: the name tells nothing
                    code = int(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                    topics.append(
                        {"topic": name, "error": code, "internal": False, "partitions": []}
                    )
                    continue
                if name not in self.quorum.image.topics and auto:
                    await self.topic_creator.auto_create(name)
                if name not in self.quorum.image.topics:
                    code = (
                        ErrorCode.INVALID_TOPIC_EXCEPTION
                        if topic_name_error(name)
                        else (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                    )
                    topics.append(
                        {"topic": name, "error": int(code), "internal": False, "partitions": []}
                    )
                else:
                    topics.append(self._topic_metadata(name))
        controller = self.quorum.controller_id
        return Reply(
            {
                "cluster_id": self.quorum.image.cluster_id,
                "controller_id": controller if controller is not None else -1,
                "brokers": self.live_brokers(),
                "topics": topics,
            }
        )

    def _done(
        self, req: Request, body: dict[str, Any], quota: MutationQuota | None = None
    ) -> Reply:
        """A controller answer; a forwarding broker also gets the metadata offset to await.

        A throttle of the mutation quota goes in the answer; the connection is muted only
        when it is the client's own (a forwarding broker mutes its client's instead)."""
        forwarded = req.body.get("forwarded_by") is not None
        if forwarded:
            body["metadata_offset"] = self.quorum.image.offset
        throttle = quota.throttle_ms if quota is not None else 0
        if not throttle:
            return Reply(body)
        body["throttle_ms"] = throttle
        return Reply(body, throttle_ms=0 if forwarded or req.context is None else throttle)

    def _mutation_quota(self, req: Request) -> MutationQuota | None:
        """The request's controller_mutation_rate metering, or None when unmetered.

        The caller is the client: the connection's own, or for a request a broker runs
        here or forwards (auth'd as a broker: CLUSTER_ACTION), the ``quota`` identity the
        broker sends along. A broker's own topic requests (auto-creation, internal
        topics) name none and are not metered."""
        quotas = self.quotas
        if quotas is None or not quotas.active():
            return None
        body = req.body
        from_broker = req.context is None or body.get("forwarded_by") is not None
        caller = body.get("quota") if from_broker else None
        if isinstance(caller, dict):
            user, client_id = caller.get("user"), caller.get("client_id")
            if not isinstance(user, str) or not isinstance(client_id, str):
                raise InvalidRequestError("quota names a user and a client id")
            return quotas.mutation_quota(user, client_id, strict=caller.get("strict") is not False)
        if from_broker:
            return None
        user, client_id = quotas.identity(req.context, req.client_id)
        return quotas.mutation_quota(user, client_id, strict=True)

    # -- CreateTopics / DeleteTopics (on the controller) ------------------------------
    def _new_topic(self, spec: Any) -> NewTopic:
        name = req_str(spec, "topic")
        problem = topic_name_error(name)
        if problem:
            raise LogMQError(problem, ErrorCode.INVALID_TOPIC_EXCEPTION)
        if is_internal(name) and not (req_field(spec, "internal", bool, False)):
            raise LogMQError(
                f"names starting with '__' are reserved for internal topics: {name!r}",
                ErrorCode.INVALID_TOPIC_EXCEPTION,
            )
        partitions = req_int(spec, "partitions", -1)
        rf = req_int(spec, "replication_factor", -1)
        configs = req_str_map(spec, "configs")
        assignments = _assignments(req_list(spec, "assignments", []))
        if assignments:
            # the controller checks the lists against the brokers (Kafka's order and codes)
            LogConfig.from_dict(dict(configs))
            return NewTopic(name, partitions, rf, assignments, dict(configs))
        if partitions != -1 and not 1 <= partitions <= MAX_PARTITIONS_PER_TOPIC:
            raise LogMQError(
                f"partitions must be 1..{MAX_PARTITIONS_PER_TOPIC}, got {partitions}",
                ErrorCode.INVALID_PARTITIONS,
            )
        if rf != -1 and rf < 1:
            raise LogMQError(
                f"replication factor must be >= 1 (or -1 for the default), got {rf}",
                ErrorCode.INVALID_REPLICATION_FACTOR,
            )
        LogConfig.from_dict(dict(configs))  # raises InvalidConfigError naming the key
        return NewTopic(name, partitions, rf, None, dict(configs))

    async def create_topics(self, req: Request) -> Reply:
        specs = req_list(req.body, "topics")
        validate_only = req_field(req.body, "validate_only", bool, False)
        results: dict[int, dict] = {}
        wanted: list[tuple[int, NewTopic]] = []
        seen: set[str] = set()
        for i, spec in enumerate(specs):
            name = spec.get("topic") if isinstance(spec, dict) else None
            name = name if isinstance(name, str) else ""
            try:
                if name in seen:
                    raise InvalidRequestError(f"topic {name!r} appears twice in the request")
                seen.add(name)
                wanted.append((i, self._new_topic(spec)))
            except LogMQError as e:
                self.metrics.error(req.api_key, e.code)
                results[i] = _entry(name, e.code, str(e))
        quota = self._mutation_quota(req)
        counted: dict[str, int] = {}
        if quota is not None and not validate_only:
            admitted = []
            for i, t in wanted:
                n = t.num_partitions if t.num_partitions > 0 else self.config.default_partitions
                n = len(t.assignments) if t.assignments else n
                if quota.admit(n):
                    admitted.append((i, t))
                    counted[t.name] = n
                else:
                    results[i] = _throttled(t.name, quota)
            wanted = admitted
        if wanted:
            topics = [t for _, t in wanted]
            created = await self.quorum.submit(
                lambda c: c.create_topics(topics, validate_only=validate_only)
            )
            for i, t in wanted:
                r = created[t.name]
                if r.error is not ErrorCode.NONE:
                    self.metrics.error(req.api_key, r.error)
                    if quota is not None:
                        quota.give_back(counted.get(t.name, 0))
                results[i] = _entry(t.name, r.error, r.message or None)
                if r.topic_id:
                    results[i]["topic_id"] = r.topic_id
                if r.partitions:  # what the defaults or an assignment came to
                    results[i]["partitions"] = len(r.partitions)
                    results[i]["replication_factor"] = len(r.partitions[0].replicas)
        return self._done(req, {"topics": [results[i] for i in sorted(results)]}, quota)

    # -- CreatePartitions -------------------------------------------------------------
    async def create_partitions(self, req: Request) -> Reply:
        specs = req_list(req.body, "topics")
        req_int(req.body, "timeout_ms", 0)  # answered once committed
        validate_only = req_field(req.body, "validate_only", bool, False)
        quota = None if validate_only else self._mutation_quota(req)
        out = []
        seen: set[str] = set()
        for spec in specs:
            name = spec.get("topic") if isinstance(spec, dict) else None
            name = name if isinstance(name, str) else ""
            try:
                if name and name in seen:
                    raise InvalidRequestError(f"topic {name!r} appears twice in the request")
                seen.add(name)
                name = req_str(spec, "topic")
                count = req_int(spec, "count")
                lists = _new_partition_assignments(req_field(spec, "assignments", list, None))
                if name not in self.quorum.image.topics:
                    problem = topic_name_error(name)
                    if problem:
                        raise LogMQError(problem, ErrorCode.INVALID_TOPIC_EXCEPTION)
                elif is_internal(name):
                    # the coordinator of a group is xxh32(group) % partitions: another
                    # count would move every group away from the partition holding it
                    raise LogMQError(
                        f"{name!r} is an internal topic: its partition count cannot be changed",
                        ErrorCode.INVALID_TOPIC_EXCEPTION,
                    )
                if count > MAX_PARTITIONS_PER_TOPIC:
                    raise LogMQError(
                        f"a topic may have at most {MAX_PARTITIONS_PER_TOPIC} partitions, "
                        f"got {count}",
                        ErrorCode.INVALID_PARTITIONS,
                    )
                info = self.quorum.image.topics.get(name)
                added = count - len(info.partitions) if info is not None else 0
                if quota is not None and not quota.admit(added):
                    out.append(_throttled(name, quota))
                    continue
                result = await self.quorum.submit(
                    lambda c, n=name, k=count, a=lists: c.create_partitions(
                        n, k, assignments=a, validate_only=validate_only
                    )
                )
                if not result.ok:
                    if quota is not None:
                        quota.give_back(added)
                    raise LogMQError(result.message, result.error)
                out.append(_entry(name))
            except LogMQError as e:
                self.metrics.error(req.api_key, e.code)
                out.append(_entry(name, e.code, str(e)))
        return self._done(req, {"topics": out}, quota)

    async def delete_topics(self, req: Request) -> Reply:
        names = req_list(req.body, "topics")
        quota = self._mutation_quota(req)
        out = []
        for name in names:
            if not isinstance(name, str):
                raise InvalidRequestError("topic names must be strings")
            if name not in self.quorum.image.topics:
                out.append(
                    _entry(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
                )
                continue
            if is_internal(name):
                message = f"{name!r} is an internal topic and cannot be deleted"
                out.append(_entry(name, ErrorCode.INVALID_TOPIC_EXCEPTION, message))
                continue
            partitions = len(self.quorum.image.topics[name].partitions)
            if quota is not None and not quota.admit(partitions):
                out.append(_throttled(name, quota))
                continue
            results = await self.quorum.submit(lambda c, n=name: c.delete_topics([n]))
            r = results[name]
            if r.error is not ErrorCode.NONE and quota is not None:
                quota.give_back(partitions)
            out.append(_entry(name, r.error, r.message or None))
        return self._done(req, {"topics": out}, quota)

    # -- Configs ----------------------------------------------------------------------
    def _topic_configs(self, info: TopicInfo) -> list[dict]:
        views = topic_configs(self.config.topic_defaults, info.configs)
        return [_config_entry(v) for v in views]

    def _broker_configs(self) -> list[dict]:
        return [_config_entry(v) for v in broker_configs(self.config)]

    def _config_denial(self, req: Request, rtype: str, name: str) -> ErrorCode | None:
        """DESCRIBE_CONFIGS on the topic, or on the cluster for the broker, decided per
        resource before anything is looked up (a denied topic answers alike whether it
        exists or not)."""
        if self.authz is None:
            return None
        if rtype == "topic":
            return self.authz.denial(req.context, Op.DESCRIBE_CONFIGS, ResourceType.TOPIC, name)
        return self.authz.denial(req.context, Op.DESCRIBE_CONFIGS, ResourceType.CLUSTER, CLUSTER)

    async def describe_configs(self, req: Request) -> Reply:
        resources = req_list(req.body, "resources")
        store = self.topics
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
            denied = self._config_denial(req, rtype, name)
            if denied is not None:
                entry["error"] = int(denied)
                entry["message"] = f"not authorized to DESCRIBE_CONFIGS {rtype} {name!r}"
            elif rtype == "topic":
                info = store.get(name)
                if info is None:
                    entry["error"] = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                    entry["message"] = f"unknown topic {name!r}"
                else:
                    entry["configs"] = self._topic_configs(info)
            elif rtype == "broker":
                if name not in ("", str(self.config.node_id)):
                    entry["error"] = int(ErrorCode.INVALID_REQUEST)
                    entry["message"] = f"this is broker {self.config.node_id}, not {name!r}"
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
        store = self.topics
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
                changes: dict[str, str | None] = dict(req_str_map(res, "set"))
                for key in req_list(res, "delete", []):
                    if not isinstance(key, str):
                        raise InvalidRequestError("'delete' must list config names")
                    changes[key] = None
                new = {k: v for k, v in {**info.configs, **changes}.items() if v is not None}
                LogConfig.from_dict(dict(new))
                if name == OFFSETS_TOPIC:
                    _check_offsets_configs(info.configs, new)
                result = await self.quorum.submit(
                    lambda c, n=name, ch=changes: c.alter_configs(
                        n, ch, validate_only=validate_only
                    )
                )
                if not result.ok:
                    raise LogMQError(result.message, result.error)
            except LogMQError as e:
                entry["error"], entry["message"] = int(e.code), str(e)
            out.append(entry)
        return self._done(req, {"resources": out})

    # -- InitProducerId ---------------------------------------------------------------
    async def init_producer_id(self, req: Request) -> Reply:
        """An idempotent producer's id, or a transactional producer's from its
        coordinator (which fences older epochs of the id and aborts what they left
        open). ``{"transactional_id"?, "transaction_timeout_ms"?, "producer_id"?,
        "producer_epoch"?}`` -> ``{"error", "message"?, "producer_id", "producer_epoch"}``."""
        body = req.body
        txn_id = req_field(body, "transactional_id", str, None)
        pid = req_int(body, "producer_id", -1)
        epoch = req_int(body, "producer_epoch", -1)
        if txn_id is not None:
            return await self._init_transactional(
                txn_id, req_int(body, "transaction_timeout_ms", 60_000), pid, epoch
            )
        ids = self.producer_ids
        if pid >= 0 and 0 <= epoch < MAX_PRODUCER_EPOCH and ids.was_issued(pid):
            return Reply({"error": 0, "producer_id": pid, "producer_epoch": epoch + 1})
        return Reply({"error": 0, "producer_id": await ids.next_id(), "producer_epoch": 0})

    async def _init_transactional(
        self, txn_id: str, timeout_ms: int, producer_id: int, epoch: int
    ) -> Reply:
        def refused(code: ErrorCode, message: str) -> Reply:
            return Reply(
                {"error": int(code), "message": message, "producer_id": -1, "producer_epoch": -1}
            )

        if self.txns is None:
            return refused(ErrorCode.INVALID_REQUEST, "transactions are not served here")
        try:
            result = await self.txns.init_producer_id(txn_id, timeout_ms, producer_id, epoch)
        except LogMQError as e:
            return refused(e.code, str(e))
        if result.error is not ErrorCode.NONE:
            return refused(result.error, result.error.name)
        return Reply(
            {"error": 0, "producer_id": result.producer_id, "producer_epoch": result.producer_epoch}
        )


def _assignments(entries: list) -> dict[int, tuple[int, ...]]:
    """CreateTopics' manual assignment, ``[{"partition": p, "replicas": [broker]}]``, as
    partition -> replicas in request order; a partition named twice is refused here."""
    if len(entries) > MAX_PARTITIONS_PER_TOPIC:
        raise LogMQError(
            f"a topic may have at most {MAX_PARTITIONS_PER_TOPIC} partitions, "
            f"got {len(entries)} assignments",
            ErrorCode.INVALID_PARTITIONS,
        )
    out: dict[int, tuple[int, ...]] = {}
    for entry in entries:
        p = req_int(entry, "partition")
        replicas = req_list(entry, "replicas")
        if not all(isinstance(b, int) and not isinstance(b, bool) for b in replicas):
            raise InvalidRequestError("'replicas' must list broker ids")
        if p in out:
            raise LogMQError(
                f"partition {p} is assigned more than once", ErrorCode.INVALID_REPLICA_ASSIGNMENT
            )
        out[p] = tuple(replicas)
    return out


def _new_partition_assignments(entries: list | None) -> list[tuple[int, ...]] | None:
    """CreatePartitions' manual assignment, ``[[broker, ...], ...]``: one replica list per
    new partition in order (None: the controller places them). Only the shape is checked
    here; the controller checks the lists against the brokers and the topic."""
    if entries is None:
        return None
    if len(entries) > MAX_PARTITIONS_PER_TOPIC:
        raise LogMQError(
            f"a topic may have at most {MAX_PARTITIONS_PER_TOPIC} partitions, "
            f"got {len(entries)} assignments",
            ErrorCode.INVALID_PARTITIONS,
        )
    out = []
    for replicas in entries:
        if not isinstance(replicas, list) or not all(
            isinstance(b, int) and not isinstance(b, bool) for b in replicas
        ):
            raise InvalidRequestError("'assignments' must be lists of broker ids")
        out.append(tuple(replicas))
    return out


def _check_offsets_configs(old: dict[str, str], new: dict[str, str]) -> None:
    """Retention must never delete the newest value of a key of the offsets topic."""
    for key in PROTECTED_OFFSETS_CONFIGS:
        if new.get(key) != old.get(key):
            raise InvalidConfigError(
                f"{key} of {OFFSETS_TOPIC} cannot be changed: the topic must stay compacted "
                "and never lose a key's newest value"
            )
