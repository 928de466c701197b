"""The steps of moving a partition between brokers (KIP-455 semantics), as pure functions.

A move of a partition from its original replicas to a target set is recorded in the
metadata log in steps, so that any controller (a new one after a failover too) can carry
it on from the committed state alone:

1. start: ``replicas`` becomes original + adding (the target replicas not yet holding
   the partition), and the partition records its ``target_replicas``. The adding brokers
   see themselves among the replicas, create the log and fetch from the leader.
2. catch up: the leader adds each adding replica to the ISR once it has caught up, by the
   ordinary AlterPartition path.
3. complete: as soon as every target replica is in the ISR, ``replicas`` becomes the
   target, the ISR drops the removed replicas and leadership moves to the first target
   replica that may lead. The removed brokers are no longer replicas: they stop serving
   and delete their copy.

Cancelling before completion returns to the original replicas (in their original order)
and drops whatever the adding brokers had copied. Nothing here looks at a clock; the
controller calls ``completion`` after every ISR change and on its tick.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from logmq.cluster.controller_api import ApiResult
from logmq.cluster.metadata_image import PartitionRegistration
from logmq.cluster.metadata_records import NO_LEADER, PartitionChange
from logmq.errors import ErrorCode


def check_target(
    part: PartitionRegistration | None,
    key: tuple[str, int],
    target: Sequence[int] | None,
    brokers: Mapping[int, object],
    min_insync_replicas: int,
) -> ApiResult | None:
    """Why ``target`` (None: a cancel) cannot be applied to ``part``; None if it can."""
    name = f"{key[0]}-{key[1]}"
    if part is None:
        return ApiResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {name}")
    if target is None:
        if not part.reassigning:
            return ApiResult(ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, f"{name} is not moving")
        if not set(part.isr) & set(part.original_replicas):
            return ApiResult(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"{name}: no original replica is in sync any more, so the move cannot be "
                f"cancelled (the data is only on {list(part.isr)})",
            )
        return None
    bad = ErrorCode.INVALID_REPLICA_ASSIGNMENT
    if part.reassigning:
        return ApiResult(
            ErrorCode.REASSIGNMENT_IN_PROGRESS,
            f"{name} is already moving to {list(part.target_replicas)}; cancel that first",
        )
    if not target:
        return ApiResult(bad, f"{name}: the replica set is empty")
    if any(type(r) is not int for r in target):
        return ApiResult(bad, f"{name}: replicas must be broker ids, got {list(target)}")
    if len(set(target)) != len(target):
        return ApiResult(bad, f"{name}: a broker appears twice in {list(target)}")
    unknown = [r for r in target if r not in brokers]
    if unknown:
        return ApiResult(bad, f"{name}: unknown broker(s) {unknown}")
    if len(target) < min_insync_replicas:
        return ApiResult(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"{name}: {len(target)} replica(s) is below the topic's min.insync.replicas "
            f"({min_insync_replicas}): acks=all produce would always fail",
        )
    return None


def start(part: PartitionRegistration, target: Sequence[int]) -> PartitionChange | None:
    """Step 1: the partition starts moving to ``target`` (None: it is already there)."""
    target = tuple(target)
    if target == part.replicas:
        return None
    original = part.replicas
    adding = tuple(r for r in target if r not in original)
    return PartitionChange(
        part.topic,
        part.partition,
        replicas=original + adding,
        adding_replicas=adding,
        removing_replicas=tuple(r for r in original if r not in target),
        target_replicas=target,
    )


def completion(
    part: PartitionRegistration, is_active: Callable[[int], bool]
) -> PartitionChange | None:
    """Step 3, once every target replica is in the ISR and one of them may lead."""
    target = part.target_replicas
    if not target or not set(target) <= set(part.isr):
        return None
    isr = tuple(r for r in part.isr if r in target)
    leaders = [r for r in target if is_active(r)]  # target ⊆ ISR: any of them may lead
    if not leaders:
        return None  # nobody to lead the new set yet: the controller tries again later
    leader = leaders[0]
    return PartitionChange(
        part.topic,
        part.partition,
        leader=leader if leader != part.leader else None,
        isr=isr if isr != part.isr else None,
        replicas=target,
        adding_replicas=(),
        removing_replicas=(),
        target_replicas=(),
    )


def cancel(part: PartitionRegistration, is_active: Callable[[int], bool]) -> PartitionChange:
    """Back to the original replicas; ``check_target`` said at least one is in sync."""
    original = part.original_replicas
    isr = tuple(r for r in part.isr if r in original)
    leader = part.leader
    if leader not in original:
        leader = next((r for r in original if r in isr and is_active(r)), NO_LEADER)
    return PartitionChange(
        part.topic,
        part.partition,
        leader=leader if leader != part.leader else None,
        isr=isr if isr != part.isr else None,
        replicas=original,
        adding_replicas=(),
        removing_replicas=(),
        target_replicas=(),
    )
