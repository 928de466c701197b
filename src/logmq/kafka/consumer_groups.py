"""Kafka's consumer group protocol (KIP-848): ConsumerGroupHeartbeat and
ConsumerGroupDescribe, on the same groups native consumers use.

logmq's own protocol is KIP-848's, so a Kafka consumer with ``group.protocol=consumer``
and a native consumer can even share a group. This door only translates: Kafka names
topics by id in assignments (the metadata image's topic ids), calls the server-side
assignors ``uniform`` and ``range`` (``uniform`` is logmq's sticky assignor), and sends
an empty regex with a plain subscription.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as KioErrorCode
from kio.static.primitive import i32Timedelta

from logmq.errors import ErrorCode, LogMQError
from logmq.group import JOIN_EPOCH, TEMPORARY_LEAVE_EPOCH, MemberOptions, group_id_error
from logmq.group.assignors import ASSIGNORS
from logmq.kafka.groups import per_allowed_group
from logmq.kafka.messages import (
    NO_THROTTLE,
    UNKNOWN_OPERATIONS,
    build,
    kio_code,
    millis,
    response_module,
)
from logmq.net.codec import Request
from logmq.net.reply import Reply
from logmq.security.acl import AclOperation as Op
from logmq.security.authorization import Authorization

if TYPE_CHECKING:
    from logmq.broker.coordinator.group_service import GroupCoordinatorService
    from logmq.cluster.metadata_image import MetadataImage
    from logmq.group import GroupCoordinator

# Kafka's server-side assignor names -> logmq's (logmq's own names are accepted too)
_ASSIGNORS = {"uniform": "sticky", "range": "range"}
_STATES = {"empty": "Empty", "reconciling": "Reconciling", "stable": "Stable"}
_CONSUMER_MEMBER = 1  # ConsumerGroupDescribe v1 member_type: a consumer-protocol member


def _uuid(topic_id: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(topic_id)
    except (ValueError, TypeError):
        return None


class KafkaConsumerGroupApis:
    def __init__(
        self,
        groups: GroupCoordinatorService,
        image: Callable[[], MetadataImage],
        authz: Authorization | None = None,
    ) -> None:
        self.groups = groups
        self.image = image
        self.authz = authz  # ConsumerGroupDescribe answers a denied group in its entry

    def _ids(self) -> tuple[dict[str, uuid.UUID | None], dict[uuid.UUID | None, str]]:
        image = self.image()
        by_name = {name: _uuid(t.topic_id) for name, t in image.topics.items()}
        return by_name, {tid: name for name, tid in by_name.items()}

    @staticmethod
    def _by_topic(cls: Any, partitions: Iterable[tuple[str, int]], ids: dict) -> tuple:
        """Kafka's topic-id-keyed partition lists (``cls``: that version's TopicPartitions)."""
        grouped: dict[str, list[int]] = {}
        for topic, partition in sorted(partitions):
            grouped.setdefault(topic, []).append(partition)
        return tuple(
            build(cls, topic_id=ids[t], topic_name=t, partitions=tuple(ps))
            for t, ps in grouped.items()
            if ids.get(t) is not None  # a topic deleted meanwhile: nothing to read there
        )

    # -- ConsumerGroupHeartbeat ----------------------------------------------------------
    async def heartbeat(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        group_id, member_id, epoch = body.group_id, body.member_id, body.member_epoch

        def answer(code: ErrorCode, message: str | None = None) -> Reply:
            return Reply(
                build(
                    m.ConsumerGroupHeartbeatResponse,
                    throttle_time=NO_THROTTLE,
                    error_code=kio_code(code),
                    error_message=message,
                    member_id=member_id or None,
                    member_epoch=epoch,
                    heartbeat_interval=NO_THROTTLE,
                    assignment=None,
                )
            )

        problem = group_id_error(group_id)
        if problem:
            return answer(ErrorCode.INVALID_REQUEST, problem)
        invalid = _heartbeat_problem(body, req.api_version)
        if invalid:
            return answer(ErrorCode.INVALID_REQUEST, invalid)
        assignor = body.server_assignor
        if assignor is not None:
            assignor = _ASSIGNORS.get(assignor, assignor)
            if assignor not in ASSIGNORS:
                return answer(
                    ErrorCode.UNSUPPORTED_ASSIGNOR,
                    f"unknown server assignor {body.server_assignor!r}: use uniform or range",
                )
        by_name, by_id = self._ids()
        owned = None
        if body.topic_partitions is not None:
            owned = frozenset(
                (by_id[tp.topic_id], p)
                for tp in body.topic_partitions
                if tp.topic_id in by_id
                for p in tp.partitions
            )
        rebalance = millis(body.rebalance_timeout)
        options = MemberOptions(
            rebalance_timeout_ms=None if rebalance < 0 else rebalance,
            server_assignor=assignor,
            client_id=req.client_id,
            client_host=req.client_host,
        )
        topics = body.subscribed_topic_names

        def beat(core: GroupCoordinator, now_ms: int):
            return core.heartbeat(
                group_id, member_id, epoch, body.instance_id, topics, owned, now_ms, options
            )

        try:
            result = await self.groups.submit(group_id, beat)
        except LogMQError as exc:
            return answer(exc.code, str(exc))
        if result.error is not ErrorCode.NONE:
            message = None
            if result.error is ErrorCode.GROUP_ID_NOT_FOUND:
                message = f"Group {group_id} is not a consumer group."
            return answer(result.error, message)
        assignment = None
        if result.assigned_partitions is not None:
            assignment = m.Assignment(
                topic_partitions=self._by_topic(
                    m.TopicPartitions, result.assigned_partitions, by_name
                )
            )
        return Reply(
            build(
                m.ConsumerGroupHeartbeatResponse,
                throttle_time=NO_THROTTLE,
                error_code=KioErrorCode.none,
                error_message=None,
                member_id=result.member_id,
                member_epoch=result.member_epoch,
                heartbeat_interval=_interval(result.heartbeat_interval_ms),
                assignment=assignment,
            )
        )

    # -- ConsumerGroupDescribe ------------------------------------------------------------
    async def describe(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        by_name, _ = self._ids()

        def describe(group_id: str):
            return lambda core, now_ms: core.describe(group_id)

        results = await per_allowed_group(
            self.groups, self.authz, req, Op.DESCRIBE, body.group_ids, describe
        )
        out = []
        for group_id, result in zip(body.group_ids, results, strict=True):
            if result.ok:
                code, d = result.answer.error, result.answer.description
            else:
                code, d = result.error, None
            message = None
            if d is not None and d.classic is not None:
                code, d = ErrorCode.GROUP_ID_NOT_FOUND, None
                message = f"Group {group_id} is not a consumer group."
            elif d is None and code is ErrorCode.GROUP_ID_NOT_FOUND:
                message = f"Group {group_id} not found."
            if d is None:
                out.append(
                    build(
                        m.DescribedGroup,
                        error_code=kio_code(code),
                        error_message=message,
                        group_id=group_id,
                        group_state="Dead",
                        group_epoch=-1,
                        assignment_epoch=-1,
                        assignor_name="",
                        members=(),
                        authorized_operations=UNKNOWN_OPERATIONS,
                    )
                )
                continue

            def assignment(parts: Iterable[tuple[str, int]]) -> Any:
                return m.Assignment(
                    topic_partitions=self._by_topic(m.TopicPartitions, parts, by_name)
                )

            members = tuple(
                build(
                    m.Member,
                    member_id=mem.member_id,
                    instance_id=mem.instance_id,
                    rack_id=None,
                    member_epoch=mem.member_epoch,
                    client_id=mem.client_id,
                    client_host=mem.client_host,
                    subscribed_topic_names=tuple(mem.subscribed_topics),
                    subscribed_topic_regex=None,
                    assignment=assignment(mem.assigned),
                    target_assignment=assignment(mem.target),
                    member_type=_CONSUMER_MEMBER,
                )
                for mem in d.members
            )
            out.append(
                build(
                    m.DescribedGroup,
                    error_code=KioErrorCode.none,
                    error_message=None,
                    group_id=group_id,
                    group_state=_STATES.get(d.state.value, d.state.value),
                    group_epoch=d.group_epoch,
                    assignment_epoch=d.assignment_epoch,
                    assignor_name=d.assignor,
                    members=members,
                    authorized_operations=UNKNOWN_OPERATIONS,
                )
            )
        return Reply(
            build(m.ConsumerGroupDescribeResponse, throttle_time=NO_THROTTLE, groups=tuple(out))
        )


def _interval(ms: int) -> Any:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=ms))


def _heartbeat_problem(body: Any, version: int) -> str | None:
    """Kafka's rules for a well-formed ConsumerGroupHeartbeat (INVALID_REQUEST otherwise)."""
    epoch = body.member_epoch
    if version >= 1 and not body.member_id:
        return "MemberId can't be empty."  # KIP-1082: the client makes its own id
    if epoch < TEMPORARY_LEAVE_EPOCH:
        return f"MemberEpoch {epoch} is invalid."
    if body.instance_id is not None and not body.instance_id:
        return "InstanceId can't be empty."
    if epoch == TEMPORARY_LEAVE_EPOCH and body.instance_id is None:
        return "InstanceId can't be null when leaving temporarily (MemberEpoch -2)."
    if body.rack_id is not None and not body.rack_id:
        return "RackId can't be empty."
    regex = getattr(body, "subscribed_topic_regex", None)
    if regex:
        return "SubscribedTopicRegex is not supported by logmq yet: subscribe by name."
    if epoch == JOIN_EPOCH:
        if body.subscribed_topic_names is None:
            return "SubscribedTopicNames must be set in first request."
        if millis(body.rebalance_timeout) == -1:
            return "RebalanceTimeoutMs must be provided in first request."
        if body.topic_partitions:
            return "TopicPartitions must be empty when (re-)joining."
    return None
