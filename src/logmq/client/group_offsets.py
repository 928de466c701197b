"""Committed offsets on the wire: OffsetCommit and OffsetFetch for consumers and admins.

Body builders and response parsers are plain functions (sans-IO); ``commit_offsets`` and
``fetch_committed`` send them through the cluster client's coordinator routing, which
retries while the coordinator moves or loads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from logmq.client.cluster import ClusterClient, TopicPartition
from logmq.client.group_membership import tp_list
from logmq.errors import ErrorCode, error_for
from logmq.net.codec import ApiKey


@dataclass(slots=True, frozen=True)
class OffsetAndMetadata:
    """A committed position: the offset of the next record the group will read."""

    offset: int
    metadata: str = ""
    commit_timestamp: int = -1  # ms, as stamped by the coordinator (-1 when not known)
    # the leader epoch of the last record consumed (-1: unknown); stored with the offset
    # so a consumer resuming there can tell a truncated log after a leader change (KIP-320)
    leader_epoch: int = -1


OffsetsArg = Mapping[TopicPartition, "int | OffsetAndMetadata | tuple[int, str | None]"]


def normalize_offsets(
    offsets: OffsetsArg, metadata: str | None = None
) -> dict[TopicPartition, OffsetAndMetadata]:
    """``{tp: offset | (offset, metadata) | OffsetAndMetadata}`` -> OffsetAndMetadata each;
    ``metadata`` applies to entries that carry none. Offsets must be >= 0."""
    out: dict[TopicPartition, OffsetAndMetadata] = {}
    for tp, value in offsets.items():
        topic, partition = tp
        if isinstance(value, OffsetAndMetadata):
            entry = value
        elif isinstance(value, tuple):
            entry = OffsetAndMetadata(int(value[0]), value[1] or "")
        else:
            entry = OffsetAndMetadata(int(value), metadata or "")
        if entry.offset < 0:
            raise ValueError(f"offset for {topic}-{partition} must be >= 0, got {entry.offset}")
        out[(str(topic), int(partition))] = entry
    return out


def commit_body(
    group_id: str,
    member_id: str | None,
    member_epoch: int,
    offsets: Mapping[TopicPartition, OffsetAndMetadata],
) -> dict[str, Any]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), entry in sorted(offsets.items()):
        by_topic.setdefault(topic, []).append(partition_entry(partition, entry))
    return {
        "group_id": group_id,
        "member_id": member_id,
        "member_epoch": member_epoch,
        "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
    }


def partition_entry(partition: int, entry: OffsetAndMetadata) -> dict[str, Any]:
    """One partition of OffsetCommit or TxnOffsetCommit (the epoch only when known)."""
    out: dict[str, Any] = {
        "partition": partition,
        "offset": entry.offset,
        "metadata": entry.metadata or None,
    }
    if entry.leader_epoch >= 0:
        out["leader_epoch"] = entry.leader_epoch
    return out


def commit_result(body: dict[str, Any]) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
    """The request-wide error and each partition's error of an OffsetCommit response."""
    per_partition: dict[TopicPartition, ErrorCode] = {}
    for t in body.get("topics") or ():
        for p in t.get("partitions") or ():
            per_partition[(t["topic"], p["partition"])] = _code(p.get("error", 0))
    return _code(body.get("error", 0)), per_partition


def fetch_body(group_id: str, partitions: Iterable[TopicPartition] | None) -> dict[str, Any]:
    return {
        "group_id": group_id,
        "topics": None if partitions is None else tp_list(partitions),
    }


def fetch_result(body: dict[str, Any]) -> dict[TopicPartition, OffsetAndMetadata | None]:
    """``{tp: OffsetAndMetadata or None (nothing committed)}``; raises a request error."""
    code = _code(body.get("error", 0))
    if code is not ErrorCode.NONE:
        raise error_for(code, body.get("message") or f"OffsetFetch: {code.name}")
    out: dict[TopicPartition, OffsetAndMetadata | None] = {}
    for t in body.get("topics") or ():
        for p in t.get("partitions") or ():
            tp = (t["topic"], p["partition"])
            perr = _code(p.get("error", 0))
            if perr is not ErrorCode.NONE:
                raise error_for(perr, p.get("message") or f"OffsetFetch {tp}: {perr.name}")
            offset = p.get("offset", -1)
            out[tp] = (
                None
                if offset is None or offset < 0
                else OffsetAndMetadata(
                    offset,
                    p.get("metadata") or "",
                    p.get("commit_timestamp", -1),
                    p.get("leader_epoch", -1),
                )
            )
    return out


def _code(value: Any) -> ErrorCode:
    try:
        return ErrorCode(value)
    except (ValueError, TypeError):
        return ErrorCode.UNKNOWN_SERVER_ERROR


async def send_commit(
    cluster: ClusterClient,
    group_id: str,
    member_id: str | None,
    member_epoch: int,
    offsets: Mapping[TopicPartition, OffsetAndMetadata],
    *,
    timeout: float | None = None,
) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode], str]:
    """One OffsetCommit (retried only while the coordinator moves): the errors, and the
    coordinator's explanation of a request-wide one (e.g. why it was not replicated)."""
    resp = await cluster.group_request(
        group_id,
        ApiKey.OFFSET_COMMIT,
        commit_body(group_id, member_id, member_epoch, offsets),
        timeout=timeout,
    )
    top, per_partition = commit_result(resp.body)
    return top, per_partition, str(resp.body.get("message") or "")


def commit_error_text(what: str, top: ErrorCode, message: str) -> str:
    """``what: CODE`` plus the coordinator's reason when it gave one."""
    return f"{what}: {top.name}" + (f" ({message})" if message else "")


def raise_partition_errors(errors: Mapping[TopicPartition, ErrorCode], what: str) -> None:
    """Raise the first per-partition error (in partition order), if any."""
    for tp, code in sorted(errors.items()):
        if code is not ErrorCode.NONE:
            raise error_for(code, f"{what} {tp[0]}-{tp[1]}: {code.name}")


async def standalone_commit(
    cluster: ClusterClient,
    group_id: str,
    offsets: Mapping[TopicPartition, OffsetAndMetadata],
    *,
    timeout: float | None = None,
) -> None:
    """An administrative / standalone commit (no member id): NON_EMPTY_GROUP while the
    group has members; any per-partition error raises after the others are written."""
    if not offsets:
        return
    top, per_partition, message = await send_commit(
        cluster, group_id, None, -1, offsets, timeout=timeout
    )
    if top is not ErrorCode.NONE:
        raise error_for(
            top, commit_error_text(f"commit offsets of group {group_id!r}", top, message)
        )
    raise_partition_errors(per_partition, f"commit offset of group {group_id!r} for")


async def fetch_committed(
    cluster: ClusterClient,
    group_id: str,
    partitions: Iterable[TopicPartition] | None,
    *,
    timeout: float | None = None,
) -> dict[TopicPartition, OffsetAndMetadata | None]:
    """Committed offsets of ``partitions`` (None: every partition with a commit)."""
    parts = None if partitions is None else list(partitions)
    if parts is not None and not parts:
        return {}
    resp = await cluster.group_request(
        group_id, ApiKey.OFFSET_FETCH, fetch_body(group_id, parts), timeout=timeout
    )
    found = fetch_result(resp.body)
    if parts is None:
        return found
    return {tp: found.get(tp) for tp in parts}


__all__ = [
    "OffsetAndMetadata",
    "commit_body",
    "commit_error_text",
    "commit_result",
    "fetch_body",
    "fetch_committed",
    "fetch_result",
    "normalize_offsets",
    "partition_entry",
    "raise_partition_errors",
    "send_commit",
    "standalone_commit",
]
