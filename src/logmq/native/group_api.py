"""Handlers of the consumer group APIs (docs/protocol.md, "Consumer group APIs").

FindCoordinator (key type 0: a group; 1: a transactional id), ConsumerGroupHeartbeat,
OffsetCommit, TxnOffsetCommit, OffsetFetch, ListGroups, ConsumerGroupDescribe,
DeleteGroups and OffsetDelete. A handler checks the body, turns the request into an
operation on the group's shard (broker/coordinator/group_shard.py) and shapes the
answer; the deterministic rules are the group core's (logmq.group). A body the broker
cannot read gets the generic ``{"error": INVALID_REQUEST, "message"}``; a readable
request that breaks a rule gets its API's response with the error code in it.

Every handler enqueues its operation before its first ``await``, so pipelined requests
of one connection reach the coordinator in the order they were sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from logmq.broker.coordinator.group_shard import CoordinatorError
from logmq.cluster.topic_names import topic_name_error
from logmq.errors import ErrorCode, LogMQError
from logmq.group import (
    JOIN_EPOCH,
    MAX_ID_BYTES,
    TEMPORARY_LEAVE_EPOCH,
    GroupCoordinator,
    GroupDescription,
    GroupState,
    MemberOptions,
    NewOffset,
    TopicPartition,
    group_id_error,
)
from logmq.group.assignors import ASSIGNORS
from logmq.native.request_fields import (
    InvalidRequestError,
    req_field,
    req_int,
    req_list,
    req_str,
)
from logmq.net.codec import Request
from logmq.net.reply import Reply
from logmq.security.acl import AclOperation as Op
from logmq.security.acl import ResourceType

if TYPE_CHECKING:
    from logmq.broker.coordinator.group_service import GroupCoordinatorService
    from logmq.broker.coordinator.txn_service import TransactionCoordinatorService
    from logmq.broker.metrics import BrokerMetrics
    from logmq.security.authorization import Authorization

KEY_GROUP, KEY_TRANSACTION = 0, 1  # FindCoordinator's key types

MAX_SUBSCRIBED_TOPICS = 10_000
NO_REBALANCE_TIMEOUT = -1  # "unchanged" in a heartbeat
# Commit errors that concern the whole request: they also go in the top-level "error".
_REQUEST_WIDE = frozenset(
    {
        ErrorCode.INVALID_GROUP_ID,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.UNKNOWN_MEMBER_ID,
        ErrorCode.STALE_MEMBER_EPOCH,
        ErrorCode.FENCED_MEMBER_EPOCH,
        ErrorCode.NON_EMPTY_GROUP,
        ErrorCode.GROUP_ID_NOT_FOUND,
        ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
        ErrorCode.UNKNOWN_SERVER_ERROR,
    }
)
_MESSAGES = {
    ErrorCode.UNKNOWN_MEMBER_ID: "unknown member id: rejoin with epoch 0",
    ErrorCode.FENCED_MEMBER_EPOCH: "member epoch fenced: drop your partitions, rejoin with epoch 0",
    ErrorCode.STALE_MEMBER_EPOCH: "stale member epoch: heartbeat, then commit again",
    ErrorCode.NON_EMPTY_GROUP: "the group has members",
    ErrorCode.GROUP_ID_NOT_FOUND: "unknown group",
    ErrorCode.INVALID_SESSION_TIMEOUT: "session_timeout_ms outside the broker's limits",
    ErrorCode.INVALID_COMMIT_OFFSET_SIZE: "the commit is too large to write as one batch",
}


def tp_list(partitions: Iterable[TopicPartition]) -> list[dict[str, Any]]:
    """``{(topic, p)}`` -> the wire's ``[{"topic", "partitions": [p, ...]}]``, sorted."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]


def parse_tp_list(body: Any, key: str) -> list[tuple[str, list[int]]] | None:
    """A TP list field (``None`` when null or absent), checked for shape and types."""
    entries = req_field(body, key, list, None)
    if entries is None:
        return None
    out = []
    for entry in entries:
        topic = req_str(entry, "topic")
        partitions = req_list(entry, "partitions")
        if not all(type(p) is int for p in partitions):
            raise InvalidRequestError(f"{key!r}: partitions of {topic!r} must be integers")
        out.append((topic, partitions))
    return out


def _message(code: ErrorCode, fallback: str | None = None) -> str | None:
    if code is ErrorCode.NONE:
        return None
    return _MESSAGES.get(code, fallback or code.name)


def _new_offset(p: Any) -> NewOffset:
    """A partition of OffsetCommit or TxnOffsetCommit: ``offset``, ``metadata`` and the
    optional ``leader_epoch`` of the last record consumed (-1 or absent: unknown)."""
    epoch = req_int(p, "leader_epoch", -1)
    return NewOffset(
        req_int(p, "offset"), req_field(p, "metadata", str, None) or "", max(epoch, -1)
    )


class GroupApi:
    """The native group APIs: thin translations onto the group coordinator service."""

    def __init__(
        self,
        groups: GroupCoordinatorService,
        metrics: BrokerMetrics,
        txns: TransactionCoordinatorService | None = None,
        authz: Authorization | None = None,
    ) -> None:
        """``txns`` answers FindCoordinator for transactional ids (key type 1);
        ``authz`` the per-entry rules of the listings (ListGroups, OffsetFetch of every
        topic) and of ConsumerGroupDescribe, as on the Kafka door."""
        self.groups = groups
        self.metrics = metrics
        self.txns = txns
        self.authz = authz

    def _describable(self, req: Request, rtype: ResourceType, names: Iterable[str]) -> list[str]:
        authz = self.authz
        return list(names) if authz is None else authz.describable(req.context, rtype, names)

    # -- FindCoordinator ----------------------------------------------------------------
    async def find_coordinator(self, req: Request) -> Reply:
        key_type = req_int(req.body, "key_type", 0)
        keys = req_list(req.body, "keys")
        if not all(isinstance(k, str) for k in keys):
            raise InvalidRequestError("'keys' must be group ids (strings)")
        out = []
        for key in keys:
            entry: dict[str, Any] = {
                "key": key,
                "node_id": -1,
                "host": "",
                "port": -1,
                "error": 0,
                "message": None,
            }
            try:
                if key_type == KEY_TRANSACTION and self.txns is not None:
                    if not key:
                        raise LogMQError("empty transactional id", ErrorCode.INVALID_REQUEST)
                    node, host, port = await self.txns.find_coordinator(key)
                elif key_type != KEY_GROUP:
                    raise LogMQError(
                        f"key_type {key_type} is not supported: 0 (consumer groups) or "
                        "1 (transactional ids)",
                        ErrorCode.INVALID_REQUEST,
                    )
                else:
                    problem = group_id_error(key)
                    if problem:
                        raise LogMQError(problem, ErrorCode.INVALID_GROUP_ID)
                    node, host, port = await self.groups.find_coordinator(key)
                entry.update(node_id=node, host=host, port=port)
            except LogMQError as exc:
                self.metrics.error(req.api_key, exc.code)
                entry.update(error=int(exc.code), message=str(exc))
            out.append(entry)
        return Reply({"coordinators": out})

    # -- ConsumerGroupHeartbeat ---------------------------------------------------------
    async def consumer_group_heartbeat(self, req: Request) -> Reply:
        body = req.body
        group_id = req_str(body, "group_id")
        member_id = req_field(body, "member_id", str, "")
        epoch = req_int(body, "member_epoch")
        instance_id = req_field(body, "instance_id", str, None)
        rebalance_timeout = req_int(body, "rebalance_timeout_ms", NO_REBALANCE_TIMEOUT)
        session_timeout = req_field(body, "session_timeout_ms", int, None)
        topics = req_field(body, "subscribed_topics", list, None)
        assignor = req_field(body, "server_assignor", str, None)
        owned_list = parse_tp_list(body, "owned_partitions")

        def answer(code: ErrorCode, message: str | None = None) -> Reply:
            self.metrics.error(req.api_key, code)
            return Reply(
                {
                    "error": int(code),
                    "message": message or _message(code),
                    "member_id": member_id,
                    "member_epoch": epoch,
                    "heartbeat_interval_ms": 0,
                    "assignment": None,
                }
            )

        problem = group_id_error(group_id)
        if problem:
            return answer(ErrorCode.INVALID_GROUP_ID, problem)
        invalid = self._heartbeat_problem(
            member_id, epoch, instance_id, rebalance_timeout, topics, assignor
        )
        if invalid:
            return answer(ErrorCode.INVALID_REQUEST, invalid)
        owned = None
        if owned_list is not None:
            owned = frozenset((t, p) for t, ps in owned_list for p in ps)
        options = MemberOptions(
            session_timeout_ms=session_timeout,
            rebalance_timeout_ms=None
            if rebalance_timeout == NO_REBALANCE_TIMEOUT
            else (rebalance_timeout),
            server_assignor=assignor,
            client_id=req.client_id,
            client_host=req.client_host,
        )

        def heartbeat(core: GroupCoordinator, now_ms: int):
            return core.heartbeat(
                group_id, member_id, epoch, instance_id, topics, owned, now_ms, options
            )

        try:
            future = self.groups.shard_for(group_id).submit(heartbeat)
            result = await future
        except LogMQError as exc:
            return answer(exc.code, str(exc))
        if result.error is not ErrorCode.NONE:
            message = _message(result.error)
            if result.error is ErrorCode.INVALID_REQUEST and assignor is not None:
                message = f"server_assignor {assignor!r} differs from the group's assignor"
            return answer(result.error, message)
        assignment = result.assigned_partitions
        return Reply(
            {
                "error": 0,
                "message": None,
                "member_id": result.member_id,
                "member_epoch": result.member_epoch,
                "heartbeat_interval_ms": result.heartbeat_interval_ms,
                "assignment": None if assignment is None else tp_list(assignment),
            }
        )

    @staticmethod
    def _heartbeat_problem(
        member_id: str,
        epoch: int,
        instance_id: str | None,
        rebalance_timeout: int,
        topics: list | None,
        assignor: str | None,
    ) -> str | None:
        """What makes a heartbeat invalid before the group is even looked at, or None."""
        if len(member_id.encode()) > MAX_ID_BYTES:
            return f"member_id is longer than {MAX_ID_BYTES} bytes"
        if instance_id is not None and not instance_id:
            return "instance_id must be null or non-empty"
        if instance_id is not None and len(instance_id.encode()) > MAX_ID_BYTES:
            return f"instance_id is longer than {MAX_ID_BYTES} bytes"
        if epoch < TEMPORARY_LEAVE_EPOCH:
            return f"member_epoch {epoch} is invalid: use 0 (join), -1, -2 or your epoch"
        if rebalance_timeout != NO_REBALANCE_TIMEOUT and rebalance_timeout <= 0:
            return f"rebalance_timeout_ms must be positive (or -1), got {rebalance_timeout}"
        if epoch == JOIN_EPOCH and topics is None:
            return "subscribed_topics is required when joining (member_epoch 0)"
        if topics is not None:
            if len(topics) > MAX_SUBSCRIBED_TOPICS:
                return f"more than {MAX_SUBSCRIBED_TOPICS} subscribed topics"
            for topic in topics:
                problem = topic_name_error(topic)
                if problem:
                    return f"subscribed topic {topic!r}: {problem}"
        if assignor is not None and assignor not in ASSIGNORS:
            return f"unknown server_assignor {assignor!r}: use one of {sorted(ASSIGNORS)}"
        return None

    # -- OffsetCommit -------------------------------------------------------------------
    async def offset_commit(self, req: Request) -> Reply:
        body = req.body
        group_id = req_str(body, "group_id")
        member_id = req_field(body, "member_id", str, None)
        epoch = req_int(body, "member_epoch", -1)
        entries: list[tuple[str, list[int]]] = []
        offsets: dict[TopicPartition, NewOffset] = {}
        for t in req_list(body, "topics"):
            topic = req_str(t, "topic")
            parts = []
            for p in req_list(t, "partitions"):
                partition = req_int(p, "partition")
                offsets[(topic, partition)] = _new_offset(p)
                parts.append(partition)
            entries.append((topic, parts))

        def answer(codes: dict[TopicPartition, ErrorCode], top: ErrorCode, message: str | None):
            if top is not ErrorCode.NONE:
                self.metrics.error(req.api_key, top)
            return Reply(
                {
                    "error": int(top),
                    "message": message,
                    "topics": [
                        {
                            "topic": t,
                            "partitions": [
                                {"partition": p, "error": int(codes.get((t, p), top))}
                                for p in parts
                            ],
                        }
                        for t, parts in entries
                    ],
                }
            )

        problem = group_id_error(group_id)
        if problem:
            return answer({}, ErrorCode.INVALID_GROUP_ID, problem)
        if member_id is None:  # administrative or standalone: only while nobody consumes

            def commit(core: GroupCoordinator, now_ms: int):
                return core.alter_offsets(group_id, offsets, now_ms)
        else:

            def commit(core: GroupCoordinator, now_ms: int):
                return core.commit_offsets(group_id, member_id, epoch, offsets, now_ms)

        try:
            codes = await self.groups.shard_for(group_id).submit(commit)
        except LogMQError as exc:
            return answer({}, exc.code, str(exc))
        committed = sum(1 for code in codes.values() if code is ErrorCode.NONE)
        if committed:
            self.metrics.offsets_committed(committed)
        top = ErrorCode.NONE
        distinct = set(codes.values())
        if len(distinct) == 1 and (only := distinct.pop()) in _REQUEST_WIDE:
            top = only
        return answer(codes, top, _message(top))

    # -- TxnOffsetCommit -----------------------------------------------------------------
    async def txn_offset_commit(self, req: Request) -> Reply:
        """A transaction's offsets: pending in the group's shard until the producer's
        marker reaches the group's offsets partition (committed) or drops them (aborted).
        Generation and member are checked as for OffsetCommit when given."""
        body = req.body
        req_str(body, "transactional_id")  # named for the ACL check (the guard)
        group_id = req_str(body, "group_id")
        producer_id = req_int(body, "producer_id")
        producer_epoch = req_int(body, "producer_epoch")
        generation = req_int(body, "generation_id", -1)
        member_id = req_field(body, "member_id", str, "")
        instance_id = req_field(body, "group_instance_id", str, None)
        entries: list[tuple[str, list[int]]] = []
        offsets: dict[TopicPartition, NewOffset] = {}
        for t in req_list(body, "topics"):
            topic = req_str(t, "topic")
            parts = []
            for p in req_list(t, "partitions"):
                partition = req_int(p, "partition")
                offsets[(topic, partition)] = _new_offset(p)
                parts.append(partition)
            entries.append((topic, parts))
        top, message = ErrorCode.NONE, None
        codes: dict[TopicPartition, ErrorCode] = {}
        try:
            codes = await self.groups.txn_offset_commit(
                group_id, producer_id, producer_epoch, offsets, member_id, generation, instance_id
            )
        except LogMQError as exc:
            top, message = exc.code, str(exc)
        if top is ErrorCode.NONE:
            distinct = set(codes.values())
            if len(distinct) == 1 and (only := distinct.pop()) is not ErrorCode.NONE:
                top, message = only, _message(only)
        if top is not ErrorCode.NONE:
            self.metrics.error(req.api_key, top)
        return Reply(
            {
                "error": int(top),
                "message": message,
                "topics": [
                    {
                        "topic": t,
                        "partitions": [
                            {"partition": p, "error": int(codes.get((t, p), top))} for p in ps
                        ],
                    }
                    for t, ps in entries
                ],
            }
        )

    # -- OffsetFetch --------------------------------------------------------------------
    async def offset_fetch(self, req: Request) -> Reply:
        body = req.body
        group_id = req_str(body, "group_id")
        wanted = parse_tp_list(body, "topics")

        def answer(top: ErrorCode, message: str | None, topics: list) -> Reply:
            if top is not ErrorCode.NONE:
                self.metrics.error(req.api_key, top)
            return Reply({"error": int(top), "message": message, "topics": topics})

        def entries(found: dict) -> list:
            named = {t for t, _ in found} if wanted is None else {t for t, _ in wanted}
            # topics it may not describe: left out of an all-topics answer, else denied
            hidden = named - set(self._describable(req, ResourceType.TOPIC, sorted(named)))
            if wanted is None:
                order: dict[str, list[int]] = {}
                for t, p in found:
                    if t not in hidden:
                        order.setdefault(t, []).append(p)
                shape = list(order.items())
            else:
                shape = wanted
            denied = int(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            out = []
            for topic, partitions in shape:
                rows = []
                for p in partitions:
                    c = None if topic in hidden else found.get((topic, p))
                    rows.append(
                        {
                            "partition": p,
                            "offset": -1 if c is None else c.offset,
                            "metadata": None if c is None else c.metadata,
                            "commit_timestamp": -1 if c is None else c.commit_timestamp_ms,
                            "leader_epoch": -1 if c is None else c.leader_epoch,
                            "error": denied if topic in hidden else 0,
                        }
                    )
                out.append({"topic": topic, "partitions": rows})
            return out

        problem = group_id_error(group_id)
        if problem:
            return answer(ErrorCode.INVALID_GROUP_ID, problem, [])
        tps = None if wanted is None else [(t, p) for t, ps in wanted for p in ps]

        def fetch(core: GroupCoordinator, now_ms: int):
            return core.fetch_offsets(group_id, tps)

        try:
            fetched = await self.groups.shard_for(group_id).submit(fetch)
        except LogMQError as exc:
            return answer(exc.code, str(exc), [])
        if fetched.error is not ErrorCode.NONE:
            return answer(fetched.error, _message(fetched.error), [])
        return answer(ErrorCode.NONE, None, entries(fetched.offsets))

    # -- ListGroups ---------------------------------------------------------------------
    async def list_groups(self, req: Request) -> Reply:
        states = req_field(req.body, "states", list, None)
        valid = {s.value for s in GroupState}
        wanted = None
        if states is not None:
            if not all(isinstance(s, str) and s.lower() in valid for s in states):
                raise InvalidRequestError(f"'states' may only hold {sorted(valid)}")
            wanted = {s.lower() for s in states}
        try:
            shards = self.groups.shards()
        except LogMQError as exc:
            return Reply({"error": int(exc.code), "message": str(exc), "groups": []})
        futures = []
        error: LogMQError | None = None
        for shard in shards:
            try:
                futures.append(shard.submit(lambda core, now_ms: core.list_groups()))
            except CoordinatorError as exc:
                error = error or exc
        groups = []
        for result in await asyncio.gather(*futures, return_exceptions=True):
            if isinstance(result, BaseException):
                if not isinstance(result, LogMQError):
                    raise result
                error = error or result
                continue
            # as Kafka's ListGroups: the groups the principal may describe
            shown = set(self._describable(req, ResourceType.GROUP, (g.group_id for g in result)))
            groups += [
                {
                    "group_id": g.group_id,
                    "state": g.state.value,
                    "members": g.members,
                    "type": g.type,
                    "protocol_type": g.protocol_type,
                }
                for g in result
                if (wanted is None or g.state.value in wanted) and g.group_id in shown
            ]
        code = ErrorCode.NONE if error is None else error.code
        return Reply(
            {"error": int(code), "message": None if error is None else str(error), "groups": groups}
        )

    # -- ConsumerGroupDescribe ----------------------------------------------------------
    async def consumer_group_describe(self, req: Request) -> Reply:
        group_ids = self._group_ids(req.body)
        denied = self._denied_groups(req, Op.DESCRIBE, group_ids)

        def describe(group_id: str):
            return lambda core, now_ms: core.describe(group_id)

        allowed = [g for g in group_ids if g not in denied]
        results = iter(await self.groups.submit_each(allowed, describe))
        out = []
        for group_id in group_ids:
            if group_id in denied:
                code = ErrorCode.GROUP_AUTHORIZATION_FAILED
                out.append(_described(group_id, code, "not authorized to DESCRIBE", None))
                continue
            result = next(results)
            if not result.ok:
                out.append(_described(group_id, result.error, result.message, None))
            else:
                code = result.answer.error
                out.append(_described(group_id, code, _message(code), result.answer.description))
        return Reply({"groups": out})

    # -- DeleteGroups -------------------------------------------------------------------
    async def delete_groups(self, req: Request) -> Reply:
        group_ids = self._group_ids(req.body)

        def delete(group_id: str):
            return lambda core, now_ms: core.delete_group(group_id)

        out = []
        results = await self.groups.submit_each(group_ids, delete)
        for group_id, result in zip(group_ids, results, strict=True):
            if result.ok:
                code, message = result.answer, _message(result.answer)
            else:
                code, message = result.error, result.message
            out.append({"group_id": group_id, "error": int(code), "message": message})
        return Reply({"groups": out})

    # -- OffsetDelete -------------------------------------------------------------------
    async def offset_delete(self, req: Request) -> Reply:
        group_id = req_str(req.body, "group_id")
        topics = parse_tp_list(req.body, "topics")
        if topics is None:
            raise InvalidRequestError("missing field 'topics'")
        tps = [(t, p) for t, ps in topics for p in ps]

        def answer(code: ErrorCode, message: str | None) -> Reply:
            if code is not ErrorCode.NONE:
                self.metrics.error(req.api_key, code)
            rows = [
                {"topic": t, "partitions": [{"partition": p, "error": int(code)} for p in ps]}
                for t, ps in topics
            ]
            return Reply({"error": int(code), "message": message, "topics": rows})

        def delete(core: GroupCoordinator, now_ms: int):
            return core.delete_offsets(group_id, tps)

        try:
            code = await self.groups.submit(group_id, delete)
        except LogMQError as exc:
            return answer(exc.code, str(exc))
        return answer(code, _message(code))

    # -- helpers ------------------------------------------------------------------------
    @staticmethod
    def _group_ids(body: Any) -> list[str]:
        group_ids = req_list(body, "group_ids")
        if not all(isinstance(g, str) for g in group_ids):
            raise InvalidRequestError("'group_ids' must be strings")
        return group_ids

    def _denied_groups(self, req: Request, op: Op, group_ids: list[str]) -> set[str]:
        """The groups a many-group request may not ``op``: each answers in its own entry."""
        authz = self.authz
        if authz is None or not authz.enabled:
            return set()
        return {g for g in group_ids if not authz.allowed(req.context, op, ResourceType.GROUP, g)}


def _described(
    group_id: str, code: ErrorCode, message: str | None, d: GroupDescription | None
) -> dict[str, Any]:
    if d is None:
        return {
            "group_id": group_id,
            "error": int(code),
            "message": message,
            "state": "dead",
            "group_epoch": -1,
            "assignment_epoch": -1,
            "assignor": "",
            "members": [],
        }
    return {
        "group_id": group_id,
        "error": 0,
        "message": None,
        "state": d.state.value,
        "group_epoch": d.group_epoch,
        "assignment_epoch": d.assignment_epoch,
        "assignor": d.assignor,
        "members": [
            {
                "member_id": m.member_id,
                "instance_id": m.instance_id,
                "member_epoch": m.member_epoch,
                "state": m.state.value,
                "left_temporarily": m.left_temporarily,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "subscribed_topics": list(m.subscribed_topics),
                "assignment": tp_list(m.assigned),
                "pending_revocation": tp_list(m.pending_revocation),
                "target": tp_list(m.target),
            }
            for m in d.members
        ],
    }
