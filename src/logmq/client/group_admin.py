"""Consumer-group administration: listing, describing (with lag), deleting, offsets.

The functions take the admin's ClusterClient; AsyncAdmin exposes them as methods. A
group description joins three answers: ConsumerGroupDescribe (members, assignments),
OffsetFetch (committed offsets) and ListOffsets (log end offsets), so the lag of each
partition is ``log end offset - committed offset``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from logmq.client.cluster import ClusterClient, TopicPartition
from logmq.client.group_membership import parse_tp_list, tp_list
from logmq.client.group_offsets import (
    OffsetAndMetadata,
    fetch_committed,
    normalize_offsets,
    standalone_commit,
)
from logmq.errors import ConnectionError_, ErrorCode, error_for
from logmq.net.codec import ApiKey

_LIST_AGAIN = frozenset(
    {ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE}
)


@dataclass(slots=True, frozen=True)
class GroupListing:
    group_id: str
    state: str  # empty, reconciling or stable; classic groups: Kafka's states, snake_case
    members: int
    type: str = "consumer"  # "consumer" (KIP-848: native and Kafka clients) or "classic"


@dataclass(slots=True, frozen=True)
class GroupMember:
    member_id: str
    instance_id: str | None
    member_epoch: int
    state: str
    left_temporarily: bool
    client_id: str
    client_host: str
    subscribed_topics: list[str]
    assignment: list[TopicPartition]  # what it owns now
    pending_revocation: list[TopicPartition]  # told to give up, not yet confirmed
    target: list[TopicPartition]  # what it will own when the group is stable


@dataclass(slots=True, frozen=True)
class GroupPartition:
    """One partition a group owns or has a committed offset for."""

    topic: str
    partition: int
    member_id: str | None  # its current owner, if any
    committed_offset: int | None  # None: nothing committed
    log_end_offset: int | None  # None: the partition no longer exists
    lag: int | None  # records between the committed offset and the log end
    metadata: str = ""


@dataclass(slots=True, frozen=True)
class GroupDescription:
    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: list[GroupMember]
    partitions: list[GroupPartition]


def _code(value: Any) -> ErrorCode:
    try:
        return ErrorCode(value)
    except (ValueError, TypeError):
        return ErrorCode.UNKNOWN_SERVER_ERROR


def _first_group_error(body: dict[str, Any]) -> int:
    groups = body.get("groups") or [{}]
    return groups[0].get("error", 0)


async def list_groups(
    cluster: ClusterClient, states: Iterable[str] | None = None
) -> list[GroupListing]:
    """Every group of the cluster (ListGroups goes to every broker).

    A broker that cannot be reached is asked again until the cluster drops it from its
    metadata (it died, and its groups moved to the others, which are then asked again)
    or until the request timeout.
    """
    body = {"states": None if states is None else list(states)}
    deadline = time.monotonic() + cluster.request_timeout

    async def ask(node: int) -> dict[str, Any] | None:
        """``node``'s answer, or None once ``node`` has left the cluster."""
        delay = 0.02
        while True:
            try:
                if node < 0:
                    answer = (await cluster.request_any(ApiKey.LIST_GROUPS, body)).body
                else:
                    answer = (await cluster.request_node(node, ApiKey.LIST_GROUPS, body)).body
            except ConnectionError_:
                if time.monotonic() >= deadline:
                    raise
                answer = None
            else:
                # A broker still loading some offsets partitions answers
                # COORDINATOR_LOAD_IN_PROGRESS (with the groups it has so far), a new
                # cluster COORDINATOR_NOT_AVAILABLE while it creates the offsets topic:
                # retry a while so the listing is complete.
                code = _code(answer.get("error", 0))
                if code not in _LIST_AGAIN or time.monotonic() >= deadline:
                    return answer
            await asyncio.sleep(delay)  # backoff before asking the broker again
            delay = min(delay * 2, 0.5)
            if answer is None:
                await cluster.refresh_metadata()
                if node not in cluster.metadata.brokers:
                    return None

    while True:
        await cluster.refresh_metadata()
        nodes = list(cluster.metadata.brokers) or [-1]
        answers = await asyncio.gather(*(ask(n) for n in nodes))
        found: dict[str, GroupListing] = {}
        for answer in answers:
            if answer is None:
                continue
            code = _code(answer.get("error", 0))
            if code is not ErrorCode.NONE:
                raise error_for(code, answer.get("message") or f"ListGroups: {code.name}")
            for g in answer.get("groups") or ():
                found[g["group_id"]] = GroupListing(
                    g["group_id"], g["state"], g.get("members", 0), g.get("type", "consumer")
                )
        if all(answer is not None for answer in answers):
            return sorted(found.values(), key=lambda g: g.group_id)


async def describe_group(cluster: ClusterClient, group_id: str) -> GroupDescription:
    """Members, assignments, committed offsets, log end offsets and lag of one group."""
    resp = await cluster.group_request(
        group_id,
        ApiKey.CONSUMER_GROUP_DESCRIBE,
        {"group_ids": [group_id]},
        error_of=_first_group_error,
    )
    entry = (resp.body.get("groups") or [{}])[0]
    code = _code(entry.get("error", 0))
    if code is not ErrorCode.NONE:
        raise error_for(code, entry.get("message") or f"group {group_id!r}: {code.name}")
    members = [
        GroupMember(
            m["member_id"],
            m.get("instance_id"),
            m.get("member_epoch", -1),
            m.get("state", ""),
            bool(m.get("left_temporarily")),
            m.get("client_id", ""),
            m.get("client_host", ""),
            list(m.get("subscribed_topics") or ()),
            sorted(parse_tp_list(m.get("assignment"))),
            sorted(parse_tp_list(m.get("pending_revocation"))),
            sorted(parse_tp_list(m.get("target"))),
        )
        for m in entry.get("members") or ()
    ]
    owners: dict[TopicPartition, str] = {}
    for m in members:
        for tp in [*m.pending_revocation, *m.assignment]:
            owners[tp] = m.member_id
    committed = {tp: c for tp, c in (await fetch_committed(cluster, group_id, None)).items() if c}
    tps = sorted(set(owners) | set(committed))
    ends = await log_end_offsets(cluster, tps)
    partitions = []
    for tp in tps:
        c = committed.get(tp)
        end = ends.get(tp)
        lag = None if c is None or end is None else max(0, end - c.offset)
        partitions.append(
            GroupPartition(
                tp[0],
                tp[1],
                owners.get(tp),
                None if c is None else c.offset,
                end,
                lag,
                "" if c is None else c.metadata,
            )
        )
    return GroupDescription(
        group_id,
        entry.get("state", ""),
        entry.get("group_epoch", -1),
        entry.get("assignment_epoch", -1),
        entry.get("assignor", ""),
        members,
        partitions,
    )


async def log_end_offsets(
    cluster: ClusterClient, tps: Iterable[TopicPartition]
) -> dict[TopicPartition, int]:
    """High watermarks of the partitions that exist (deleted topics are left out)."""
    tps = list(tps)
    if not tps:
        return {}
    topics = sorted({t for t, _ in tps})
    try:
        await cluster.refresh_metadata(topics)
    except ConnectionError_:
        pass
    known = [tp for tp in tps if cluster.metadata.partition(*tp) is not None]
    if not known:
        return {}
    return {
        tp: off for tp, (off, _) in (await cluster.list_offsets(dict.fromkeys(known, -1))).items()
    }


async def delete_groups(cluster: ClusterClient, group_ids: Iterable[str]) -> None:
    """Delete empty groups and their offsets (NON_EMPTY_GROUP while members are live)."""
    for group_id in group_ids:
        resp = await cluster.group_request(
            group_id,
            ApiKey.DELETE_GROUPS,
            {"group_ids": [group_id]},
            error_of=_first_group_error,
        )
        entry = (resp.body.get("groups") or [{}])[0]
        code = _code(entry.get("error", 0))
        if code is not ErrorCode.NONE:
            raise error_for(code, entry.get("message") or f"delete group {group_id!r}")


async def commit_group_offsets(
    cluster: ClusterClient,
    group_id: str,
    offsets: Mapping[TopicPartition, Any],
    metadata: str | None = None,
) -> None:
    """Set committed offsets without being a member (resets, standalone consumers, the
    Spark source): refused with NON_EMPTY_GROUP while the group has live members."""
    await standalone_commit(cluster, group_id, normalize_offsets(offsets, metadata))


async def group_offsets(
    cluster: ClusterClient, group_id: str, partitions: Iterable[TopicPartition] | None = None
) -> dict[TopicPartition, OffsetAndMetadata]:
    """Committed offsets of the group (only partitions that have one)."""
    found = await fetch_committed(cluster, group_id, partitions)
    return {tp: c for tp, c in found.items() if c is not None}


async def delete_group_offsets(
    cluster: ClusterClient, group_id: str, partitions: Iterable[TopicPartition]
) -> None:
    """Forget committed offsets of an empty group (NON_EMPTY_GROUP otherwise)."""
    parts = [(str(t), int(p)) for t, p in partitions]
    if not parts:
        return
    resp = await cluster.group_request(
        group_id, ApiKey.OFFSET_DELETE, {"group_id": group_id, "topics": tp_list(parts)}
    )
    code = _code(resp.body.get("error", 0))
    if code is not ErrorCode.NONE:
        raise error_for(code, resp.body.get("message") or f"delete offsets of {group_id!r}")
    for t in resp.body.get("topics") or ():
        for p in t.get("partitions") or ():
            perr = _code(p.get("error", 0))
            if perr is not ErrorCode.NONE:
                raise error_for(perr, f"delete offset {t['topic']}-{p['partition']}")


__all__ = [
    "GroupDescription",
    "GroupListing",
    "GroupMember",
    "GroupPartition",
    "commit_group_offsets",
    "delete_group_offsets",
    "delete_groups",
    "describe_group",
    "group_offsets",
    "list_groups",
    "log_end_offsets",
]
