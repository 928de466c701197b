"""Kafka's classic group protocol: JoinGroup, SyncGroup, Heartbeat, LeaveGroup.

Translations onto the group shards' classic groups (group/classic_group.py): a JoinGroup
or SyncGroup that has to wait is parked in the core and answered when the rebalance
completes it, once the records it depends on are durable (``submit_parked``).
Protocol metadata and assignments pass through as the clients' own bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from logmq.errors import ErrorCode, LogMQError
from logmq.group import JoinAnswer, LeaveAnswer, SyncAnswer
from logmq.kafka.messages import NO_THROTTLE, build, kio_code, millis, response_module
from logmq.net.codec import Request
from logmq.net.reply import Reply

if TYPE_CHECKING:
    from logmq.broker.coordinator.group_service import GroupCoordinatorService
    from logmq.group import GroupCoordinator


class KafkaGroupMembershipApis:
    def __init__(self, groups: GroupCoordinatorService) -> None:
        self.groups = groups

    # -- JoinGroup ---------------------------------------------------------------------
    async def join_group(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        session = millis(body.session_timeout)
        rebalance = millis(getattr(body, "rebalance_timeout", None)) or session
        protocols = tuple((p.name, bytes(p.metadata)) for p in body.protocols)
        instance_id = getattr(body, "group_instance_id", None)

        def join(core: GroupCoordinator, now_ms: int, ticket: int) -> Any:
            return core.join_group(
                ticket,
                body.group_id,
                body.member_id,
                instance_id,
                body.protocol_type,
                protocols,
                session,
                rebalance,
                req.client_id,
                req.client_host,
                req.api_version >= 4,  # KIP-394: a first join gets its member id back
                now_ms,
            )

        try:
            answer = await self.groups.submit_parked(body.group_id, join)
        except LogMQError as e:
            answer = JoinAnswer(e.code, body.member_id)
        members = tuple(
            build(m.JoinGroupResponseMember, member_id=mid, group_instance_id=iid, metadata=meta)
            for mid, iid, meta in answer.members
        )
        protocol_name = answer.protocol_name
        if protocol_name is None and req.api_version < 7:
            protocol_name = ""  # not nullable before v7
        return Reply(
            build(
                m.JoinGroupResponse,
                throttle_time=NO_THROTTLE,
                error_code=kio_code(answer.error),
                generation_id=answer.generation,
                protocol_type=answer.protocol_type,
                protocol_name=protocol_name,
                leader=answer.leader,
                skip_assignment=answer.skip_assignment,
                member_id=answer.member_id,
                members=members,
            )
        )

    # -- SyncGroup ---------------------------------------------------------------------
    async def sync_group(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        assignments = {a.member_id: bytes(a.assignment) for a in body.assignments}

        def sync(core: GroupCoordinator, now_ms: int, ticket: int) -> Any:
            return core.sync_group(
                ticket,
                body.group_id,
                body.member_id,
                getattr(body, "group_instance_id", None),
                body.generation_id,
                getattr(body, "protocol_type", None),
                getattr(body, "protocol_name", None),
                assignments,
                now_ms,
            )

        try:
            answer = await self.groups.submit_parked(body.group_id, sync)
        except LogMQError as e:
            answer = SyncAnswer(e.code)
        return Reply(
            build(
                m.SyncGroupResponse,
                throttle_time=NO_THROTTLE,
                error_code=kio_code(answer.error),
                protocol_type=answer.protocol_type,
                protocol_name=answer.protocol_name,
                assignment=answer.assignment,
            )
        )

    # -- Heartbeat ---------------------------------------------------------------------
    async def heartbeat(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        instance_id = getattr(body, "group_instance_id", None)

        def beat(core: GroupCoordinator, now_ms: int) -> ErrorCode:
            return core.classic_heartbeat(
                body.group_id, body.member_id, instance_id, body.generation_id, now_ms
            )

        try:
            code = await self.groups.submit(body.group_id, beat)
        except LogMQError as e:
            code = e.code
        response = build(m.HeartbeatResponse, throttle_time=NO_THROTTLE, error_code=kio_code(code))
        return Reply(response)

    # -- LeaveGroup --------------------------------------------------------------------
    async def leave_group(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        batch = req.api_version >= 3
        if batch:
            leaving = [(x.member_id, x.group_instance_id) for x in body.members]
        else:
            leaving = [(body.member_id, None)]

        def leave(core: GroupCoordinator, now_ms: int) -> LeaveAnswer:
            return core.leave_group(body.group_id, leaving, now_ms)

        try:
            answer = await self.groups.submit(body.group_id, leave)
            top, errors = answer.error, list(answer.members)
        except LogMQError as e:
            top, errors = e.code, [e.code] * len(leaving)
        if not batch:
            code = top if top is not ErrorCode.NONE else (errors or [ErrorCode.NONE])[0]
            return Reply(
                build(m.LeaveGroupResponse, throttle_time=NO_THROTTLE, error_code=kio_code(code))
            )
        members = tuple(
            m.MemberResponse(
                member_id=member_id, group_instance_id=instance_id, error_code=kio_code(error)
            )
            for (member_id, instance_id), error in zip(leaving, errors, strict=False)
        )
        return Reply(
            build(
                m.LeaveGroupResponse,
                throttle_time=NO_THROTTLE,
                error_code=kio_code(top),
                members=members if top is ErrorCode.NONE else (),
            )
        )
