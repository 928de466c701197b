"""Kafka's offset APIs without a group protocol: FindCoordinator, OffsetCommit, OffsetFetch,
and the transactional TxnOffsetCommit (KIP-98).

For clients that ``assign()`` partitions and commit (kafka-python, aiokafka,
confluent-kafka): a commit with no member id and generation -1 is Kafka's "simple"
commit, taken while the group has no members, as the native protocol's administrative
commit is; a commit from a member is checked against its generation (the group
protocols come with issue 15). The offsets live in the same ``__consumer_offsets``
partitions and shards as native groups', so each protocol sees the other's commits and
``logmq group describe`` shows both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as KioErrorCode

from logmq.errors import ErrorCode, LogMQError
from logmq.group import NewOffset, group_id_error
from logmq.kafka.messages import NO_THROTTLE, build, kio_code, response_module
from logmq.net.codec import Request
from logmq.net.reply import Reply
from logmq.security.acl import AclOperation as Op
from logmq.security.acl import ResourceType
from logmq.security.authorization import Authorization

if TYPE_CHECKING:
    from logmq.broker.coordinator.group_service import GroupCoordinatorService
    from logmq.broker.coordinator.txn_service import TransactionCoordinatorService
    from logmq.group import GroupCoordinator

# Errors that concern the whole group rather than a partition (Kafka puts them
# on every partition, and v2+ OffsetFetch at the top too).
_COORDINATOR_ERRORS = {
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.NOT_COORDINATOR,
}


class KafkaOffsetApis:
    def __init__(
        self,
        groups: GroupCoordinatorService,
        kafka_endpoint: Callable[[int, str | None], tuple[str, int] | None],
        authz: Authorization | None = None,
        txns: TransactionCoordinatorService | None = None,
    ) -> None:
        self.groups = groups
        self.txns = txns  # FindCoordinator with key type 1
        self.kafka_endpoint = kafka_endpoint
        # per group of the batched versions, per topic of OffsetFetch (the pipeline
        # decides the single-group versions: kafka/authorization.py)
        self.authz = authz

    def _denied(self, req: Request, op: Op, rtype: ResourceType, name: str) -> bool:
        authz = self.authz
        return (
            authz is not None
            and authz.enabled
            and not authz.allowed(
                req.context, op, rtype, name, log_denial=rtype is not ResourceType.TOPIC
            )
        )

    # -- FindCoordinator ---------------------------------------------------------------
    async def find_coordinator(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        key_type = getattr(body, "key_type", 0)
        if req.api_version >= 4:
            refused = (
                KioErrorCode.group_authorization_failed,
                "not authorized to DESCRIBE the group",
                -1,
                "",
                -1,
            )
            found = [
                refused
                if key_type == 0 and self._denied(req, Op.DESCRIBE, ResourceType.GROUP, key)
                else await self._coordinator(key, key_type, req)
                for key in body.coordinator_keys
            ]
            coordinators = tuple(
                m.Coordinator(
                    key=key, node_id=node, host=host, port=port, error_code=code, error_message=msg
                )
                for key, (code, msg, node, host, port) in zip(
                    body.coordinator_keys, found, strict=True
                )
            )
            return Reply(
                m.FindCoordinatorResponse(throttle_time=NO_THROTTLE, coordinators=coordinators)
            )
        code, msg, node, host, port = await self._coordinator(body.key, key_type, req)
        return Reply(
            build(
                m.FindCoordinatorResponse,
                throttle_time=NO_THROTTLE,
                error_code=code,
                error_message=msg,
                node_id=node,
                host=host,
                port=port,
            )
        )

    async def _coordinator(
        self, key: str, key_type: int, req: Request
    ) -> tuple[KioErrorCode, str | None, int, str, int]:
        try:
            if key_type == 1:  # a transactional id (KIP-98)
                if self.txns is None:
                    raise LogMQError("transactions are not enabled", ErrorCode.INVALID_REQUEST)
                if not key:
                    raise LogMQError("empty transactional id", ErrorCode.INVALID_REQUEST)
                if self._denied(req, Op.DESCRIBE, ResourceType.TRANSACTIONAL_ID, key):
                    raise LogMQError(
                        "not authorized to DESCRIBE the transactional id",
                        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                    )
                node, _, _ = await self.txns.find_coordinator(key)
            elif key_type != 0:
                raise LogMQError(
                    f"key type {key_type} is not supported: 0 (groups) or 1 (transactions)",
                    ErrorCode.INVALID_REQUEST,
                )
            else:
                problem = group_id_error(key)
                if problem:
                    raise LogMQError(problem, ErrorCode.INVALID_GROUP_ID)
                node, _, _ = await self.groups.find_coordinator(key)
            listener = req.context.listener if req.context is not None else None
            endpoint = self.kafka_endpoint(node, listener)
            if endpoint is None:
                raise LogMQError(
                    f"the coordinator, broker {node}, has no Kafka listener",
                    ErrorCode.COORDINATOR_NOT_AVAILABLE,
                )
        except LogMQError as e:
            return kio_code(e.code), str(e), -1, "", -1
        return KioErrorCode.none, None, node, endpoint[0], endpoint[1]

    # -- OffsetCommit ------------------------------------------------------------------
    async def offset_commit(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        group_id = body.group_id
        # v0 has no membership (a simple commit); v1's per-partition commit_timestamp is
        # ignored: the broker times every commit (Sarama sends -1, "now", anyway).
        member_id = getattr(body, "member_id", "") or None
        generation = getattr(body, "generation_id_or_member_epoch", -1)
        offsets = {
            (t.name, p.partition_index): _new_offset(p) for t in body.topics for p in t.partitions
        }
        codes: dict[tuple[str, int], ErrorCode] = {}
        top = ErrorCode.NONE
        problem = group_id_error(group_id)
        if problem:
            top = ErrorCode.INVALID_GROUP_ID
        else:
            if member_id is None and generation < 0:  # a simple commit: assign(), no group

                def commit(core: GroupCoordinator, now_ms: int):
                    return core.alter_offsets(group_id, offsets, now_ms)
            else:

                def commit(core: GroupCoordinator, now_ms: int):
                    return core.commit_offsets(group_id, member_id, generation, offsets, now_ms)

            try:
                codes = await self.groups.shard_for(group_id).submit(commit)
            except LogMQError as e:
                top = e.code
        topics = tuple(
            m.OffsetCommitResponseTopic(
                name=t.name,
                partitions=tuple(
                    m.OffsetCommitResponsePartition(
                        partition_index=p.partition_index,
                        error_code=kio_code(codes.get((t.name, p.partition_index), top)),
                    )
                    for p in t.partitions
                ),
            )
            for t in body.topics
        )
        return Reply(build(m.OffsetCommitResponse, throttle_time=NO_THROTTLE, topics=topics))

    # -- TxnOffsetCommit ---------------------------------------------------------------
    async def txn_offset_commit(self, req: Request) -> Reply:
        """Offsets of a transaction: pending until the producer's marker reaches the
        group's offsets partition (v3 adds the member checks; v4+, KIP-890's, is not
        served). ACLs as Kafka asks: READ on the group, READ on each topic."""
        body = req.body
        m = response_module(body)
        group_id = body.group_id
        top = ErrorCode.NONE
        if self._denied(req, Op.READ, ResourceType.GROUP, group_id):
            top = ErrorCode.GROUP_AUTHORIZATION_FAILED
        denied = {
            t.name for t in body.topics if self._denied(req, Op.READ, ResourceType.TOPIC, t.name)
        }
        offsets = {
            (t.name, p.partition_index): _new_offset(p)
            for t in body.topics
            if t.name not in denied
            for p in t.partitions
        }
        codes: dict[tuple[str, int], ErrorCode] = {}
        if top is ErrorCode.NONE and offsets:
            try:
                codes = await self.groups.txn_offset_commit(
                    group_id,
                    body.producer_id,
                    body.producer_epoch,
                    offsets,
                    getattr(body, "member_id", ""),
                    getattr(body, "generation_id", -1),
                    getattr(body, "group_instance_id", None),
                )
            except LogMQError as e:
                top = e.code

        def code(topic: str, partition: int) -> ErrorCode:
            if top is not ErrorCode.NONE:
                return top
            if topic in denied:
                return ErrorCode.TOPIC_AUTHORIZATION_FAILED
            return codes.get((topic, partition), ErrorCode.NONE)

        topics = tuple(
            m.TxnOffsetCommitResponseTopic(
                name=t.name,
                partitions=tuple(
                    m.TxnOffsetCommitResponsePartition(
                        partition_index=p.partition_index,
                        error_code=kio_code(code(t.name, p.partition_index)),
                    )
                    for p in t.partitions
                ),
            )
            for t in body.topics
        )
        return Reply(build(m.TxnOffsetCommitResponse, throttle_time=NO_THROTTLE, topics=topics))

    # -- OffsetFetch -------------------------------------------------------------------
    async def offset_fetch(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        # v7+: offsets a transaction holds are answered UNSTABLE_OFFSET_COMMIT (KIP-447)
        stable = bool(getattr(body, "require_stable", False))
        if req.api_version >= 8:
            groups = []
            for g in body.groups:
                if self._denied(req, Op.DESCRIBE, ResourceType.GROUP, g.group_id):
                    groups.append(
                        m.OffsetFetchResponseGroup(
                            group_id=g.group_id,
                            topics=(),
                            error_code=kio_code(ErrorCode.GROUP_AUTHORIZATION_FAILED),
                        )
                    )
                    continue
                code, topics = await self._fetch(
                    m, req.api_version, g.group_id, g.topics, req, stable
                )
                groups.append(
                    m.OffsetFetchResponseGroup(
                        group_id=g.group_id, topics=topics, error_code=kio_code(code)
                    )
                )
            return Reply(m.OffsetFetchResponse(throttle_time=NO_THROTTLE, groups=tuple(groups)))
        code, topics = await self._fetch(
            m, req.api_version, body.group_id, body.topics, req, stable
        )
        return Reply(
            build(
                m.OffsetFetchResponse,
                throttle_time=NO_THROTTLE,
                topics=topics,
                error_code=kio_code(code),
            )
        )

    async def _fetch(
        self,
        m: Any,
        version: int,
        group_id: str,
        wanted: Any,
        req: Request,
        require_stable: bool = False,
    ) -> tuple[ErrorCode, tuple[Any, ...]]:
        topic_cls = getattr(m, "OffsetFetchResponseTopics", None) or m.OffsetFetchResponseTopic
        part_cls = getattr(m, "OffsetFetchResponsePartitions", None) or (
            m.OffsetFetchResponsePartition
        )
        tps = None if wanted is None else [(t.name, p) for t in wanted for p in t.partition_indexes]
        problem = group_id_error(group_id)
        code = ErrorCode.INVALID_GROUP_ID if problem else ErrorCode.NONE
        found: dict = {}
        unstable: set = set()
        if not problem:

            def fetch(core: GroupCoordinator, now_ms: int):
                fetched = core.fetch_offsets(group_id, tps)
                pending = core.pending_offsets(group_id, tps) if require_stable else set()
                return fetched.error, fetched.offsets, pending

            try:
                code, found, unstable = await self.groups.shard_for(group_id).submit(fetch)
            except LogMQError as e:
                code = e.code
        hidden = {
            name
            for name in {t for t, _ in found} | {t.name for t in wanted or ()}
            if self._denied(req, Op.DESCRIBE, ResourceType.TOPIC, name)
        }
        if wanted is None:
            shape: dict[str, list[int]] = {}
            for t, p in found:
                if t not in hidden:  # all topics: those it may not describe are left out
                    shape.setdefault(t, []).append(p)
            wanted_pairs = list(shape.items())
        else:
            wanted_pairs = [(t.name, list(t.partition_indexes)) for t in wanted]
        # Before v2 there is no top-level error: the group's error goes on every partition.
        part_code = code if version < 2 or code in _COORDINATOR_ERRORS else ErrorCode.NONE
        topics = tuple(
            topic_cls(
                name=name,
                partitions=tuple(
                    build(
                        part_cls,
                        partition_index=p,
                        committed_offset=-1
                        if (c := _visible(name, p, found, hidden, unstable)) is None
                        else c.offset,
                        committed_leader_epoch=-1 if c is None else c.leader_epoch,
                        metadata=None if c is None else c.metadata,
                        error_code=kio_code(
                            ErrorCode.TOPIC_AUTHORIZATION_FAILED
                            if name in hidden
                            else ErrorCode.UNSTABLE_OFFSET_COMMIT
                            if (name, p) in unstable
                            else part_code
                        ),
                    )
                    for p in parts
                ),
            )
            for name, parts in wanted_pairs
        )
        return code, topics


def _new_offset(p: Any) -> NewOffset:
    """A partition of OffsetCommit or TxnOffsetCommit: its leader epoch from OffsetCommit
    v6 and TxnOffsetCommit v2 on (KIP-320), unknown before."""
    epoch = getattr(p, "committed_leader_epoch", -1)
    return NewOffset(p.committed_offset, p.committed_metadata or "", epoch if epoch >= 0 else -1)


def _visible(name: str, partition: int, found: dict, hidden: set, unstable: set) -> Any:
    """The committed offset to show: none for a hidden topic or an unstable partition."""
    if name in hidden or (name, partition) in unstable:
        return None
    return found.get((name, partition))
