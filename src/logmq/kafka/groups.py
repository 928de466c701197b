"""Kafka's group admin APIs: ListGroups, DescribeGroups, DeleteGroups, OffsetDelete.

They read and change the same group shards the native protocol does, so Kafka's
tools list, describe and delete groups made by native consumers too. Classic groups
(Kafka clients' JoinGroup/SyncGroup) are described as Kafka does, with their members'
own protocol bytes. Consumer-protocol groups (native clients, KIP-848: broker-side
assignment) are described with protocol type ``consumer``, the assignor's name as the
protocol, and each member's assignment encoded as Kafka's ConsumerProtocol assignment
(version 0), which is what admin clients decode.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as KioErrorCode

from logmq.broker.coordinator.group_service import GroupAnswer
from logmq.errors import ErrorCode, LogMQError
from logmq.group.consumer_protocol import encode_assignment
from logmq.kafka.messages import NO_THROTTLE, UNKNOWN_OPERATIONS, build, kio_code, response_module
from logmq.net.codec import Request
from logmq.net.reply import Reply
from logmq.security.acl import AclOperation as Op
from logmq.security.acl import ResourceType
from logmq.security.authorization import Authorization

if TYPE_CHECKING:
    from logmq.broker.coordinator.group_service import GroupCoordinatorService
    from logmq.group import GroupCoordinator

# group states as Kafka names them (consumer-protocol groups, then classic ones)
_STATES = {
    "empty": "Empty",
    "reconciling": "Reconciling",
    "stable": "Stable",
    "preparing_rebalance": "PreparingRebalance",
    "completing_rebalance": "CompletingRebalance",
}


async def per_allowed_group(
    groups: GroupCoordinatorService,
    authz: Authorization | None,
    req: Request,
    op: Op,
    group_ids: Sequence[str],
    make: Any,
) -> list[GroupAnswer]:
    """``submit_each`` over the groups the principal may ``op``; the others answer
    GROUP_AUTHORIZATION_FAILED in their own entries, as Kafka answers them."""
    denied: set[str] = set()
    if authz is not None and authz.enabled:
        denied = {g for g in group_ids if not authz.allowed(req.context, op, ResourceType.GROUP, g)}
    allowed = [g for g in group_ids if g not in denied]
    done = iter(await groups.submit_each(allowed, make))
    refused = GroupAnswer(ErrorCode.GROUP_AUTHORIZATION_FAILED, f"not authorized to {op.name}")
    return [refused if g in denied else next(done) for g in group_ids]


class KafkaGroupApis:
    def __init__(self, groups: GroupCoordinatorService, authz: Authorization | None = None) -> None:
        self.groups = groups
        self.authz = authz  # ListGroups lists what the principal may describe

    # -- ListGroups --------------------------------------------------------------------
    async def list_groups(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        wanted = {s.lower() for s in getattr(body, "states_filter", ()) or ()}
        types = {t.lower() for t in getattr(body, "types_filter", ()) or ()}
        code = ErrorCode.NONE
        listings: list[Any] = []
        try:
            # No offsets topic yet means no groups (Kafka does not create it for a read).
            shards = self.groups.shards() if self.groups.partition_count else []
        except LogMQError as e:
            shards, code = [], e.code
        results = await asyncio.gather(
            *(self._list(shard) for shard in shards), return_exceptions=True
        )
        for result in results:
            if isinstance(result, LogMQError):
                code = code if code is not ErrorCode.NONE else result.code
            elif isinstance(result, BaseException):
                raise result
            else:
                listings += result
        if self.authz is not None:  # Kafka's ListGroups: what the principal may describe
            shown = set(
                self.authz.describable(
                    req.context, ResourceType.GROUP, (g.group_id for g in listings)
                )
            )
            listings = [g for g in listings if g.group_id in shown]
        groups = tuple(
            build(
                m.ListedGroup,
                group_id=g.group_id,
                protocol_type=g.protocol_type,
                group_state=_STATES.get(g.state.value, g.state.value),
                group_type=g.type,
            )
            for g in listings
            if (not wanted or _STATES.get(g.state.value, "").lower() in wanted)
            and (not types or g.type in types)
        )
        return Reply(
            build(
                m.ListGroupsResponse,
                throttle_time=NO_THROTTLE,
                error_code=kio_code(code),
                groups=groups,
            )
        )

    async def _list(self, shard: Any) -> list[Any]:
        return await shard.submit(lambda core, now_ms: core.list_groups())

    # -- DescribeGroups ----------------------------------------------------------------
    async def describe_groups(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)

        def describe(group_id: str):
            return lambda core, now_ms: core.describe(group_id)

        results = await per_allowed_group(
            self.groups, self.authz, req, Op.DESCRIBE, body.groups, describe
        )
        out = []
        for group_id, result in zip(body.groups, results, strict=True):
            if result.ok:
                code, d = result.answer.error, result.answer.description
            else:
                code, d = result.error, None
            if d is None:
                # Kafka describes an unknown group as Dead with no error
                dead = code in (ErrorCode.GROUP_ID_NOT_FOUND, ErrorCode.NONE)
                out.append(
                    build(
                        m.DescribedGroup,
                        error_code=KioErrorCode.none if dead else kio_code(code),
                        group_id=group_id,
                        group_state="Dead",
                        protocol_type="",
                        protocol_data="",
                        members=(),
                        authorized_operations=UNKNOWN_OPERATIONS,
                    )
                )
                continue
            # a classic group's members carry their own bytes; a consumer-protocol
            # group's assignment is encoded as the ConsumerProtocol admin clients read
            raw = {x.member_id: x for x in d.classic.members} if d.classic else {}
            members = tuple(
                build(
                    m.DescribedGroupMember,
                    member_id=mem.member_id,
                    group_instance_id=mem.instance_id,
                    client_id=mem.client_id,
                    client_host=mem.client_host,
                    member_metadata=raw[mem.member_id].metadata if raw else b"",
                    member_assignment=raw[mem.member_id].assignment
                    if raw
                    else encode_assignment(mem.assigned),
                )
                for mem in d.members
            )
            out.append(
                build(
                    m.DescribedGroup,
                    error_code=KioErrorCode.none,
                    group_id=group_id,
                    group_state=_STATES.get(d.state.value, d.state.value),
                    protocol_type=d.classic.protocol_type if d.classic else "consumer",
                    protocol_data=d.assignor,
                    members=members,
                    authorized_operations=UNKNOWN_OPERATIONS,
                )
            )
        return Reply(build(m.DescribeGroupsResponse, throttle_time=NO_THROTTLE, groups=tuple(out)))

    # -- DeleteGroups ------------------------------------------------------------------
    async def delete_groups(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)

        def delete(group_id: str):
            return lambda core, now_ms: core.delete_group(group_id)

        results = await per_allowed_group(
            self.groups, self.authz, req, Op.DELETE, body.groups_names, delete
        )
        out = []
        for group_id, result in zip(body.groups_names, results, strict=True):
            code = result.answer if result.ok else result.error
            out.append(m.DeletableGroupResult(group_id=group_id, error_code=kio_code(code)))
        return Reply(m.DeleteGroupsResponse(throttle_time=NO_THROTTLE, results=tuple(out)))

    # -- OffsetDelete ------------------------------------------------------------------
    async def offset_delete(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        group_id = body.group_id
        tps = [(t.name, p.partition_index) for t in body.topics for p in t.partitions]

        def delete(core: GroupCoordinator, now_ms: int):
            return core.delete_offsets(group_id, tps)

        try:
            code = await self.groups.submit(group_id, delete)
        except LogMQError as e:
            code = e.code
        # Kafka puts a group-wide refusal (the group still consumes them) on the group
        # and per partition
        topics = tuple(
            m.OffsetDeleteResponseTopic(
                name=t.name,
                partitions=tuple(
                    m.OffsetDeleteResponsePartition(
                        partition_index=p.partition_index, error_code=kio_code(code)
                    )
                    for p in t.partitions
                ),
            )
            for t in body.topics
        )
        return Reply(
            m.OffsetDeleteResponse(
                error_code=kio_code(code), throttle_time=NO_THROTTLE, topics=topics
            )
        )
