"""A consumer group's membership state as ``__consumer_offsets`` records, and back.

Per group: one GROUP_METADATA record (group epoch, assignor and the partition counts
the target was computed on) and one TARGET_ASSIGNMENT_METADATA record (assignment
epoch); per member: MEMBER_METADATA (instance id, subscription, timeouts, client id and
host), TARGET_ASSIGNMENT (its target) and CURRENT_ASSIGNMENT (epochs, reconciliation
state, what it holds). Sessions are not persisted; the loader leaves deadlines for the
group to set. Fields added after the first release are optional, so older records load.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .assignors import TopicPartition
from .codec import (
    RecordKey,
    RecordType,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    pack_partitions,
    unpack_partitions,
)
from .model import Member, MemberState

_MEMBER_KINDS = (
    RecordType.MEMBER_METADATA,
    RecordType.TARGET_ASSIGNMENT,
    RecordType.CURRENT_ASSIGNMENT,
)


@dataclass(slots=True)
class GroupSnapshot:
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor: str | None = None  # None: no GROUP_METADATA record (or an old one)
    assigned_metadata: dict[str, int] = field(default_factory=dict)
    members: dict[str, Member] = field(default_factory=dict)
    target: dict[str, frozenset[TopicPartition]] = field(default_factory=dict)


def group_records(
    group_id: str,
    group_epoch: int,
    assigned_metadata: Mapping[str, int],
    assignment_epoch: int,
    assignor: str,
) -> dict[bytes, bytes]:
    """Key -> value of the group-wide records."""
    return {
        encode_key(RecordKey(RecordType.GROUP_METADATA, group_id)): encode_value(
            {"epoch": group_epoch, "assignor": assignor, "metadata": dict(assigned_metadata)}
        ),
        encode_key(RecordKey(RecordType.TARGET_ASSIGNMENT_METADATA, group_id)): encode_value(
            {"epoch": assignment_epoch}
        ),
    }


def member_keys(group_id: str, member_id: str) -> list[bytes]:
    """The keys of a member's records (tombstone them all when it goes)."""
    return [encode_key(RecordKey(kind, group_id, member_id=member_id)) for kind in _MEMBER_KINDS]


def member_records(
    group_id: str, member: Member, target: frozenset[TopicPartition]
) -> dict[bytes, bytes]:
    metadata_key, target_key, current_key = member_keys(group_id, member.member_id)
    return {
        metadata_key: encode_value(
            {
                "instance": member.instance_id,
                "topics": sorted(member.subscribed_topics),
                "session_timeout": member.session_timeout_ms,
                "rebalance_timeout": member.rebalance_timeout_ms,
                "client_id": member.client_id,
                "client_host": member.client_host,
            }
        ),
        target_key: encode_value({"partitions": pack_partitions(target)}),
        current_key: encode_value(
            {
                "epoch": member.member_epoch,
                "previous_epoch": member.previous_member_epoch,
                "state": member.state.value,
                "assigned": pack_partitions(member.assigned),
                "pending": pack_partitions(member.pending_revocation),
                "left": member.left_temporarily,
            }
        ),
    }


def load_snapshot(written: Mapping[bytes, bytes]) -> GroupSnapshot:
    """Rebuild one group's membership from the newest value of each of its keys.

    Target or current-assignment records of a member without metadata (it was deleted)
    are ignored; a member without a current assignment starts at epoch 0.
    """
    try:
        return _load(written)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"corrupt consumer group state record: {exc!r}") from exc


def _load(written: Mapping[bytes, bytes]) -> GroupSnapshot:
    snapshot = GroupSnapshot()
    current: dict[str, dict] = {}
    for raw_key, raw_value in written.items():
        key, value = decode_key(raw_key), decode_value(raw_value)
        if key.type is RecordType.GROUP_METADATA:
            snapshot.group_epoch = int(value["epoch"])
            assignor = value.get("assignor")
            snapshot.assignor = None if assignor is None else str(assignor)
            snapshot.assigned_metadata = {str(t): int(n) for t, n in value["metadata"].items()}
        elif key.type is RecordType.TARGET_ASSIGNMENT_METADATA:
            snapshot.assignment_epoch = int(value["epoch"])
        elif key.type is RecordType.MEMBER_METADATA:
            snapshot.members[key.member_id] = Member(
                key.member_id,
                value["instance"],
                frozenset(value["topics"]),
                session_timeout_ms=_optional_int(value.get("session_timeout")),
                rebalance_timeout_ms=_optional_int(value.get("rebalance_timeout")),
                client_id=str(value.get("client_id", "")),
                client_host=str(value.get("client_host", "")),
            )
        elif key.type is RecordType.TARGET_ASSIGNMENT:
            snapshot.target[key.member_id] = frozenset(unpack_partitions(value["partitions"]))
        elif key.type is RecordType.CURRENT_ASSIGNMENT:
            current[key.member_id] = value
    snapshot.target = {
        member_id: snapshot.target.get(member_id, frozenset()) for member_id in snapshot.members
    }
    for member_id, member in snapshot.members.items():
        value = current.get(member_id)
        if value is not None:
            member.member_epoch = int(value["epoch"])
            member.previous_member_epoch = int(value["previous_epoch"])
            member.state = MemberState(value["state"])
            member.left_temporarily = bool(value["left"])
            member.assigned = frozenset(unpack_partitions(value["assigned"]))
            member.pending_revocation = frozenset(unpack_partitions(value["pending"]))
    return snapshot


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)
