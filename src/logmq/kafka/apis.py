"""The Kafka front door's handlers: Kafka requests in, calls on the broker's services,
Kafka answers out (the role of Kafka's ``KafkaApis``).

They hold no state and no logic of their own beyond translation: produce goes through
the produce path the native protocol uses (broker/replica/produce_path.py), reads
through the replica manager's consumer reads (leader and epoch checks, below the HW,
long poll), metadata from the image.
The one state kept here is this door's cache of fetch sessions (KIP-227), whose rules
(the same for both doors) live in broker/replica/fetch_sessions.py.
Record batches pass through untouched both ways: a produce's ``records`` bytes are the
batches the storage validates and stamps, and a fetch answers with the segment file's
regions, sent with sendfile (fetch_response.py).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import struct
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as KioErrorCode

from logmq.broker.coordinator.txn_verification import Guards, append_guard
from logmq.broker.replica.fetch_results import PartitionRead, TopicRead, failed
from logmq.broker.replica.fetch_sessions import FINAL_EPOCH, FetchSessionCache, FetchSessionError
from logmq.broker.replica.produce_path import ProduceResult
from logmq.cluster.topic_names import is_internal, topic_name_error
from logmq.errors import ErrorCode, LogMQError
from logmq.kafka.codec import error_entity, response_class
from logmq.kafka.fetch_response import encode_fetch_response
from logmq.kafka.messages import (
    NO_THROTTLE,
    UNKNOWN_OPERATIONS,
    build,
    kio_code,
    response_module,
    throttle_time,
)
from logmq.kafka.versions import api_versions_response
from logmq.net.codec import Request
from logmq.net.reply import Reply
from logmq.security.acl import AclOperation as Op
from logmq.security.acl import ResourceType
from logmq.security.authorization import CLUSTER, Authorization
from logmq.security.quota_enforcer import QuotaEnforcer

if TYPE_CHECKING:
    from logmq.broker.coordinator.txn_verification import TransactionalProduceCheck
    from logmq.broker.metadata.producer_ids import ProducerIdManager
    from logmq.broker.replica.consumer_reads import ConsumerReads
    from logmq.broker.replica.produce_path import ProducePath
    from logmq.broker.replica.replica_manager import ReplicaManager
    from logmq.cluster.metadata_image import MetadataImage
    from logmq.kafka.transactions import KafkaTransactionApis

log = logging.getLogger("logmq.kafka")

MAX_PRODUCER_EPOCH = 32767
ZERO_UUID = uuid.UUID(int=0)  # Kafka's topic id of a topic it does not know
CONSUMER = -1  # the replica id of a consumer's fetch session (followers use the native door)


def kafka_error_reply(req: Request, code: ErrorCode, message: str) -> Reply:
    """The request's own response type with every field empty, ``code`` in every error
    field and ``message`` where it has one (the pipeline's answer to a refused or failed
    request)."""
    cls = response_class(req.api_key, req.api_version)
    entity = error_entity(cls, code)
    if "error_message" in cls.__dataclass_fields__:
        entity = dataclasses.replace(entity, error_message=message)
    return Reply(entity)


_THROTTLE = struct.Struct(">i")


def throttled_reply(reply: Reply, throttle_ms: int) -> Reply:
    """``reply`` carrying ``throttle_ms`` in its throttle_time and muting its connection
    (the request-time quota's step: security/quota_enforcer.RequestTimeQuota)."""
    reply.throttle_ms = throttle_ms
    body: Any = reply.body
    if isinstance(body, (bytes, bytearray)):  # a Fetch answer: throttle_time_ms first
        reply.body = _THROTTLE.pack(throttle_ms) + bytes(body[4:])  # type: ignore[assignment]
    elif "throttle_time" in getattr(body, "__dataclass_fields__", ()):
        reply.body = dataclasses.replace(body, throttle_time=throttle_time(throttle_ms))
    return reply


def _denied_topic(topic: str) -> ProduceResult:
    return ProduceResult(
        ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"not authorized to write to {topic!r}"
    )


def _by_topic_id(
    answer: list[TopicRead],
    ids: Mapping[str, uuid.UUID],
    unknown: list[tuple[uuid.UUID, list[int]]],
) -> list[tuple[uuid.UUID, list[PartitionRead]]]:
    """A Fetch v13+ answer: topics by id, then the ids nobody has (UNKNOWN_TOPIC_ID)."""
    out = [(ids.get(name) or ZERO_UUID, parts) for name, parts in answer]
    code = ErrorCode.UNKNOWN_TOPIC_ID
    for topic_id, partitions in unknown:
        parts = [failed(p, code) for p in partitions]
        out.append((topic_id or ZERO_UUID, parts))  # kio reads the zero id as None
    return out


class KafkaApis:
    """Handlers by API key, over the broker's services (each given explicitly)."""

    def __init__(
        self,
        *,
        node_id: int,
        image: Callable[[], MetadataImage],
        controller_id: Callable[[], int | None],
        kafka_endpoint: Callable[[int, str | None], tuple[str, int] | None],
        replicas: ReplicaManager,
        reads: ConsumerReads,
        produce_path: ProducePath,
        producer_ids: ProducerIdManager,
        auto_create: Callable[[str], Awaitable[Any]],
        max_fetch_wait_ms: int,
        advertised: Mapping[int, tuple[int, int]],
        authz: Authorization | None = None,
        quotas: QuotaEnforcer | None = None,
        transactions: KafkaTransactionApis | None = None,
        txn_produce: TransactionalProduceCheck | None = None,
    ) -> None:
        self.node_id = node_id
        self.image = image
        self.controller_id = controller_id
        self.kafka_endpoint = kafka_endpoint
        self.replicas = replicas
        self.reads = reads
        self.produce_path = produce_path
        self.producer_ids = producer_ids
        self.auto_create = auto_create
        self.max_fetch_wait_ms = max_fetch_wait_ms
        self.advertised = advertised  # what ApiVersions lists (kafka/registry.py)
        self.authz = authz  # ACLs per topic (kafka/authorization.py decides per request)
        self.quotas = quotas  # client quotas of Produce and Fetch (KIP-219 throttling)
        # InitProducerId with a transactional id goes through the transaction APIs
        # (kafka/transactions.py), a transactional Produce through txn_produce's checks
        self.transactions = transactions
        self.txn_produce = txn_produce
        # Fetch sessions of this door's consumers (the native door keeps its own).
        self.sessions = FetchSessionCache.watched_by(replicas.waiters)

    # -- ApiVersions -------------------------------------------------------------------
    async def api_versions(self, req: Request) -> Reply:
        return Reply(api_versions_response(req.api_version, self.advertised))

    # -- Metadata ----------------------------------------------------------------------
    async def metadata(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        image = self.image()
        wanted = body.topics
        unknown_ids: list[uuid.UUID] = []
        failed: dict[str, ErrorCode] = {}  # auto-creations the controller refused
        authz = self.authz if self.authz is not None and self.authz.enabled else None
        context = req.context
        if wanted is None or (req.api_version == 0 and not wanted):
            names = sorted(n for n in image.topics)
            if authz is not None:  # a topic it may not describe is not there
                names = authz.describable(context, ResourceType.TOPIC, names)
        elif req.api_version < 12 and any(t.name is None for t in wanted):
            # As Kafka: v10 and v11 carry a topic id field but answer names only.
            raise LogMQError(
                f"a topic name cannot be null in Metadata v{req.api_version}",
                ErrorCode.INVALID_REQUEST,
            )
        else:
            # v10+ may name a topic by its id alone (KIP-848 consumers resolve their
            # assignments so); an id nobody has is UNKNOWN_TOPIC_ID, never auto-created.
            by_id = {}
            if req.api_version >= 10:
                by_id = image.topics_by_uuid
            names = []
            for t in wanted:
                if t.name is not None:
                    names.append(t.name)
                elif (name := by_id.get(t.topic_id)) is not None:
                    names.append(name)
                else:
                    unknown_ids.append(t.topic_id)
            # a topic named twice (or by name and id) is answered once, as Kafka does
            names = list(dict.fromkeys(names))
            unknown_ids = list(dict.fromkeys(unknown_ids))
            allow = getattr(body, "allow_auto_topic_creation", True)
            for t in wanted:
                name = t.name
                if name is None or name in failed:
                    continue
                if name not in image.topics and allow and not topic_name_error(name):
                    if authz is not None and not self._may_create(context, name):
                        failed[name] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                        continue
                    try:
                        await self.auto_create(name)
                    except LogMQError as e:  # this topic's answer, not the request's
                        failed[name] = e.code
            image = self.image()
        brokers = [
            build(m.MetadataResponseBroker, node_id=n, host=h, port=p, rack=r)
            for n, h, p, r in self._live_brokers(image, req.context)
        ]
        if authz is not None and wanted is not None:
            for name in names:
                if name not in failed and not authz.may_describe(context, name):
                    failed[name] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        topics = [self._topic_metadata(m, image, name, failed.get(name)) for name in names]
        if unknown_ids:
            topics += [
                build(
                    m.MetadataResponseTopic,
                    error_code=kio_code(ErrorCode.UNKNOWN_TOPIC_ID),
                    name=None,
                    topic_id=topic_id,
                    is_internal=False,
                    partitions=(),
                    topic_authorized_operations=UNKNOWN_OPERATIONS,
                )
                for topic_id in unknown_ids
            ]
        fields = {"brokers": tuple(brokers), "topics": tuple(topics)}
        if req.api_version >= 1:
            controller = self.controller_id()
            fields["controller_id"] = controller if controller is not None else -1
        if req.api_version >= 2:
            fields["cluster_id"] = image.cluster_id
        if req.api_version >= 3:
            fields["throttle_time"] = NO_THROTTLE
        if 8 <= req.api_version <= 10:
            fields["cluster_authorized_operations"] = UNKNOWN_OPERATIONS
        return Reply(build(m.MetadataResponse, error_code=KioErrorCode.none, **fields))  # v13+

    def _topic_metadata(
        self,
        m: Any,
        image: MetadataImage,
        name: str,
        failed: ErrorCode | None = None,
    ) -> Any:
        """One topic's entry. A topic that does not exist (or could not
        be auto-created) or whose name is invalid is answered in its own entry, with the
        zero topic id Kafka uses and no partitions, beside the request's other topics."""
        topic = image.topics.get(name)
        if failed is ErrorCode.TOPIC_AUTHORIZATION_FAILED:
            topic = None  # not even whether it exists
        if topic is None:
            if failed is ErrorCode.TOPIC_AUTHORIZATION_FAILED:
                code = failed
            elif topic_name_error(name):
                code = ErrorCode.INVALID_TOPIC_EXCEPTION
            else:
                code = failed or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            return build(
                m.MetadataResponseTopic,
                error_code=kio_code(code),
                name=name,
                topic_id=ZERO_UUID,
                is_internal=False,
                partitions=(),
                topic_authorized_operations=UNKNOWN_OPERATIONS,
            )
        parts = []
        for p in sorted(topic.partitions):
            reg = topic.partitions[p]
            parts.append(
                build(
                    m.MetadataResponsePartition,
                    error_code=KioErrorCode.none
                    if reg.leader >= 0
                    else KioErrorCode.leader_not_available,
                    partition_index=p,
                    leader_id=reg.leader,
                    leader_epoch=reg.leader_epoch,
                    replica_nodes=tuple(reg.replicas),
                    isr_nodes=tuple(reg.isr),
                    offline_replicas=(),
                )
            )
        return build(
            m.MetadataResponseTopic,
            error_code=KioErrorCode.none,
            name=name,
            topic_id=image.topic_uuids.get(name, ZERO_UUID),
            is_internal=is_internal(name),
            partitions=tuple(parts),
            topic_authorized_operations=UNKNOWN_OPERATIONS,
        )

    def _live_brokers(
        self, image: MetadataImage, context: Any
    ) -> list[tuple[int, str, int, str | None]]:
        """(id, host, port, rack) of the unfenced brokers on the client's listener."""
        listener = context.listener if context is not None else None
        out = []
        for node_id in sorted(image.brokers):
            reg = image.brokers[node_id]
            endpoint = self.kafka_endpoint(node_id, listener)
            if not reg.fenced and endpoint is not None:
                out.append((node_id, endpoint[0], endpoint[1], reg.rack))
        return out

    def _may_create(self, context: Any, name: str) -> bool:
        """Kafka's rule for a new topic: CREATE on the cluster, or on the topic."""
        authz = self.authz
        return authz is None or authz.may_create_topic(context, name)

    # -- DescribeCluster ---------------------------------------------------------------
    async def describe_cluster(self, req: Request) -> Reply:
        m = response_module(req.body)
        image = self.image()
        if getattr(req.body, "endpoint_type", 1) != 1:  # 1: brokers; 2: controllers
            return Reply(
                build(
                    m.DescribeClusterResponse,
                    throttle_time=NO_THROTTLE,
                    error_code=KioErrorCode.unsupported_endpoint_type,
                    error_message="only the brokers' endpoints are described",
                    endpoint_type=req.body.endpoint_type,
                    cluster_id=image.cluster_id or "",
                    controller_id=-1,
                    brokers=(),
                    cluster_authorized_operations=UNKNOWN_OPERATIONS,
                )
            )
        controller = self.controller_id()
        brokers = tuple(
            m.DescribeClusterBroker(broker_id=n, host=h, port=p, rack=r)
            for n, h, p, r in self._live_brokers(image, req.context)
        )
        return Reply(
            build(
                m.DescribeClusterResponse,
                throttle_time=NO_THROTTLE,
                error_code=KioErrorCode.none,
                error_message=None,
                endpoint_type=1,
                cluster_id=image.cluster_id or "",
                controller_id=controller if controller is not None else -1,
                brokers=brokers,
                cluster_authorized_operations=UNKNOWN_OPERATIONS,
            )
        )

    # -- Produce -----------------------------------------------------------------------
    async def produce(self, req: Request) -> Reply | None:
        body = req.body
        m = response_module(body)
        acks = body.acks
        timeout_ms = int(body.timeout.total_seconds() * 1000)
        if body.transactional_id is not None and self.txn_produce is None:
            code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            return self._produce_errors(m, req, code, "transactions are not enabled")
        if acks not in (0, 1, -1):
            return self._produce_errors(m, req, ErrorCode.INVALID_REQUIRED_ACKS, "acks")
        denied: set[str] = set()
        if self.authz is not None and self.authz.enabled:
            denied = self.authz.denied_topics(
                req.context, Op.WRITE, (t.name for t in body.topic_data)
            )
        refused: dict[tuple[str, int], ProduceResult] = {}
        guard = None
        if body.transactional_id is not None:
            assert self.txn_produce is not None
            guards: Guards = {}
            refused = await self.txn_produce.check(
                req.context,
                body.transactional_id,
                [
                    (t.name, p.index, p.records or b"")
                    for t in body.topic_data
                    if t.name not in denied
                    for p in t.partition_data
                ],
                guards,
            )
            guard = append_guard(guards)
        entries = [
            (t.name, p.index, p.records or b"")
            for t in body.topic_data
            if t.name not in denied
            for p in t.partition_data
            if (t.name, p.index) not in refused
        ]
        outcomes = iter(await self.produce_path.append_all(entries, acks, timeout_ms, guard))
        responses = []
        for t in body.topic_data:
            parts = []
            for p in t.partition_data:
                if t.name in denied:
                    result = _denied_topic(t.name)
                elif (t.name, p.index) in refused:
                    result = refused[(t.name, p.index)]
                else:
                    result = next(outcomes)
                parts.append(self._partition_response(m, req.api_version, p.index, result))
            responses.append(m.TopicProduceResponse(name=t.name, partition_responses=tuple(parts)))
        throttle = 0
        if self.quotas is not None and self.quotas.active():
            size = sum(len(p.records or b"") for t in body.topic_data for p in t.partition_data)
            throttle = self.quotas.produce(req.context, req.client_id, size)
        if acks == 0:
            # No answer; as Kafka, a failed partition closes the connection (the client
            # learns of it only so, and refreshes its metadata), and a client over its
            # byte rate is muted all the same.
            failed = any(p.error_code for r in responses for p in r.partition_responses)
            if failed or throttle:
                return Reply(None, silent=True, close=failed, throttle_ms=throttle)  # type: ignore[arg-type]
            return None
        if not throttle:
            return Reply(m.ProduceResponse(responses=tuple(responses), throttle_time=NO_THROTTLE))
        return Reply(
            m.ProduceResponse(responses=tuple(responses), throttle_time=throttle_time(throttle)),
            throttle_ms=throttle,
        )

    def _partition_response(
        self,
        m: Any,
        version: int,
        index: int,
        result: ProduceResult,
    ) -> Any:
        """One partition's answer; from v8 the records a refused batch names (KIP-467)."""
        append_time = result.log_append_time
        fields: dict[str, Any] = {
            "index": index,
            "error_code": kio_code(result.error),
            "base_offset": result.base_offset,
        }
        if version >= 2:
            fields["log_append_time"] = (
                datetime.datetime.fromtimestamp(append_time / 1000, datetime.UTC)
                if append_time >= 0
                else None
            )
        if version >= 5:
            fields["log_start_offset"] = result.log_start_offset
        if version >= 8:
            fields["record_errors"] = tuple(
                m.BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=why)
                for i, why in result.record_errors
            )
            fields["error_message"] = result.message
        return m.PartitionProduceResponse(**fields)

    def _produce_errors(self, m: Any, req: Request, code: ErrorCode, message: str) -> Reply:
        refused = ProduceResult(code, message)
        if req.body.acks == 0:  # no answer is read: the closed connection is the error
            return Reply(None, silent=True, close=True)  # type: ignore[arg-type]
        responses = tuple(
            m.TopicProduceResponse(
                name=t.name,
                partition_responses=tuple(
                    self._partition_response(m, req.api_version, p.index, refused)
                    for p in t.partition_data
                ),
            )
            for t in req.body.topic_data
        )
        return Reply(m.ProduceResponse(responses=responses, throttle_time=NO_THROTTLE))

    # -- Fetch -------------------------------------------------------------------------
    async def fetch(self, req: Request) -> Reply:
        """Fetch, with fetch sessions from v7 (KIP-227): the session rules are the
        cache's, the same on both doors (``FetchSessionCache.new_context``). An unknown
        session or a wrong epoch is a top-level error with no partitions."""
        body = req.body
        version = req.api_version
        # v13+ names topics by id (KIP-516); ids no topic has are answered UNKNOWN_TOPIC_ID
        image = self.image()
        ids = image.topics_by_uuid if version >= 13 else None

        def name_of(t: Any) -> str | None:
            return t.topic if ids is None else ids.get(t.topic_id)

        unknown = [
            (t.topic_id, [p.partition for p in t.partitions])
            for t in body.topics
            if name_of(t) is None
        ]
        denied: set[str] = set()
        if self.authz is not None and self.authz.enabled:
            denied = self.authz.denied_topics(
                req.context, Op.READ, (n for t in body.topics if (n := name_of(t)) is not None)
            )
        named = [
            (
                name_of(t),
                [
                    (
                        p.partition,
                        p.fetch_offset,
                        p.partition_max_bytes,
                        getattr(p, "current_leader_epoch", -1),
                        -1,  # a follower's log start: consumers only here
                    )
                    for p in t.partitions
                ],
            )
            for t in body.topics
            if name_of(t) is not None and name_of(t) not in denied
        ]
        max_wait_ms = max(0, min(int(body.max_wait.total_seconds() * 1000), self.max_fetch_wait_ms))
        max_bytes = body.max_bytes if version >= 3 else 0x7FFFFFFF
        gate = self.quotas.fetch_gate(req.context, req.client_id) if self.quotas else None
        if gate is not None:
            max_bytes = self.quotas.fetch_max_bytes(req.context, req.client_id, max_bytes)
        min_bytes = min(body.min_bytes, max_bytes)
        # read_committed (v4+; librdkafka's default): below the LSO, aborts listed
        committed = version >= 4 and body.isolation_level == 1
        session_id = getattr(body, "session_id", 0) if version >= 7 else 0
        epoch = getattr(body, "session_epoch", FINAL_EPOCH) if version >= 7 else FINAL_EPOCH
        forgotten = (
            (name, p)
            for t in getattr(body, "forgotten_topics_data", ())
            if (name := name_of(t)) is not None
            for p in t.partitions
        )
        try:
            context = self.sessions.new_context(
                session_id, epoch, CONSUMER, self.replicas.clock(), named, forgotten
            )
        except FetchSessionError as e:
            head, rest = encode_fetch_response(version, [], error=int(e.code))
            return Reply(head, rest)
        session_id = context.session_id
        if context.session is not None:
            read = await self.reads.fetch_session_for_consumer(
                context.session,
                context.full,
                max_wait_ms,
                min_bytes,
                max_bytes,
                gate,
                committed=committed,
            )
            if read is None:  # throttled: as Kafka, empty and no session opened
                assert gate is not None
                head, rest = encode_fetch_response(
                    version,
                    [],
                    session_id=self.sessions.throttled(context),
                    throttle_ms=gate.throttle_ms,
                )
                return Reply(head, rest, throttle_ms=gate.throttle_ms)
            answer: list = read
        else:
            wanted = [(topic, [p[:4] for p in parts]) for topic, parts in named]
            answer = await self.reads.fetch_for_consumer(
                wanted, max_wait_ms, min_bytes, max_bytes, committed=committed
            )
            if gate is not None and not gate(answer):
                head, rest = encode_fetch_response(version, [], throttle_ms=gate.throttle_ms)
                return Reply(head, rest, throttle_ms=gate.throttle_ms)
        if denied:  # answered every time they are named, never read
            code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            answer = answer + [
                (name, [failed(p.partition, code) for p in t.partitions])
                for t in body.topics
                if (name := name_of(t)) in denied
            ]
        if ids is not None:
            answer = _by_topic_id(answer, image.topic_uuids, unknown)
        head, rest = encode_fetch_response(version, answer, session_id=session_id)
        return Reply(head, rest)

    # -- ListOffsets -------------------------------------------------------------------
    async def list_offsets(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        # v2+: read_committed's "latest" is the LSO, and searches stop there too
        committed = req.api_version >= 2 and body.isolation_level == 1
        denied: set[str] = set()
        if self.authz is not None and self.authz.enabled:
            denied = self.authz.denied_topics(
                req.context, Op.DESCRIBE, (t.name for t in body.topics)
            )
        topics = []
        for t in body.topics:
            parts = []
            for p in t.partitions:
                ts = p.timestamp
                epoch = getattr(p, "current_leader_epoch", -1)
                try:
                    if t.name in denied:
                        raise _denied_topic(t.name)
                    plog = self.replicas.leader_log(t.name, p.partition_index, epoch)
                    # over both tiers: v8's earliest local (KIP-405), v9's latest tiered
                    # (KIP-1005) and timestamps searched in the remote tier too
                    offset, found = await self.reads.list_offset(plog, ts, committed)
                    code = ErrorCode.NONE
                    leader_epoch = plog.leader_epochs.latest_epoch if offset >= 0 else -1
                except LogMQError as e:
                    code, offset, found, leader_epoch = e.code, -1, -1, -1
                pf: dict[str, Any] = {
                    "partition_index": p.partition_index,
                    "error_code": kio_code(code),
                    "timestamp": found,
                    "offset": offset,
                }
                if req.api_version >= 4:
                    pf["leader_epoch"] = max(leader_epoch, -1)
                if req.api_version == 0:  # a list (the one offset v1+ answers), as Kafka's
                    pf["old_style_offsets"] = (offset,) if offset >= 0 else ()
                parts.append(build(m.ListOffsetsPartitionResponse, **pf))
            topics.append(m.ListOffsetsTopicResponse(name=t.name, partitions=tuple(parts)))
        fields: dict[str, Any] = {"topics": tuple(topics)}
        if req.api_version >= 2:
            fields["throttle_time"] = NO_THROTTLE
        return Reply(m.ListOffsetsResponse(**fields))

    # -- OffsetForLeaderEpoch -----------------------------------------------------------
    async def offset_for_leader_epoch(self, req: Request) -> Reply:
        """Where a leader epoch ends (consumers validate their position after a leader
        change, KIP-320), answered as for followers by the replica manager."""
        body = req.body
        m = response_module(body)
        topics = []
        for t in body.topics:
            parts = []
            for p in t.partitions:
                found = self.replicas.epoch_end_offset(
                    t.topic, p.partition, getattr(p, "current_leader_epoch", -1), p.leader_epoch
                )
                parts.append(
                    build(
                        m.EpochEndOffset,
                        error_code=kio_code(found.error),
                        partition=p.partition,
                        leader_epoch=found.leader_epoch,
                        end_offset=found.end_offset,
                    )
                )
            topics.append(m.OffsetForLeaderTopicResult(topic=t.topic, partitions=tuple(parts)))
        return Reply(
            build(m.OffsetForLeaderEpochResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))
        )

    # -- InitProducerId ----------------------------------------------------------------
    async def init_producer_id(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        fields: dict[str, Any] = {"throttle_time": NO_THROTTLE}
        if body.transactional_id is not None:
            if self.transactions is None:
                fields.update(
                    error_code=KioErrorCode.transactional_id_authorization_failed,
                    producer_id=-1,
                    producer_epoch=-1,
                )
                return Reply(m.InitProducerIdResponse(**fields))
            return await self.transactions.init_producer_id(req)
        authz = self.authz
        if (
            authz is not None
            and authz.enabled
            and not authz.allowed(
                req.context, Op.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER, log_denial=False
            )
            and not authz.allowed_on_some(req.context, Op.WRITE, ResourceType.TOPIC)
        ):
            # KIP-679: an idempotent producer needs WRITE on some topic (or the old
            # IDEMPOTENT_WRITE on the cluster)
            fields.update(
                error_code=KioErrorCode.cluster_authorization_failed,
                producer_id=-1,
                producer_epoch=-1,
            )
            return Reply(m.InitProducerIdResponse(**fields))
        pid = getattr(body, "producer_id", -1)
        epoch = getattr(body, "producer_epoch", -1)
        ids = self.producer_ids
        try:
            if pid >= 0 and 0 <= epoch < MAX_PRODUCER_EPOCH and ids.was_issued(pid):
                new_pid, new_epoch = pid, epoch + 1
            else:
                new_pid, new_epoch = await ids.next_id(), 0
            fields.update(
                error_code=KioErrorCode.none, producer_id=new_pid, producer_epoch=new_epoch
            )
        except LogMQError as e:
            fields.update(error_code=kio_code(e.code), producer_id=-1, producer_epoch=-1)
        return Reply(m.InitProducerIdResponse(**fields))
