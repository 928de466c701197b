"""Handlers of the APIs that move partitions and their leaders between brokers.

AlterPartitionReassignments (45) and ElectLeaders (43) change metadata: they run on the
controller (Broker forwards them there) and answer once the change is committed.
ListPartitionReassignments (46) answers from this broker's metadata image (clients ask
the controller, whose image is the newest). DescribeLogDirs (35) is answered by each
broker about its own copies; it is how tools measure the progress of a move.

Request shapes are checked here, so the controller only ever sees well-typed moves; a
malformed entry fails the whole AlterPartitionReassignments request (it is all or
nothing) with INVALID_REQUEST. Body schemas are in docs/protocol.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from logmq.cluster.controller_api import ApiResult
from logmq.cluster.metadata_image import PartitionRegistration
from logmq.errors import ErrorCode, LogMQError
from logmq.native.request_fields import (
    InvalidRequestError,
    req_field,
    req_int,
    req_list,
    req_str,
)
from logmq.net.codec import Request
from logmq.net.reply import Reply

if TYPE_CHECKING:
    from logmq.broker.metadata.quorum_service import MetadataQuorum
    from logmq.broker.metrics import BrokerMetrics
    from logmq.broker.replica.partition_views import LocalCopy, PartitionViews

TopicPartition = tuple[str, int]
PREFERRED, UNCLEAN = 0, 1  # ElectLeaders election types, as in Kafka


def _partition_key(entry: Any) -> TopicPartition:
    return (req_str(entry, "topic"), req_int(entry, "partition"))


def _partition_keys(body: dict[str, Any]) -> list[TopicPartition] | None:
    """The optional ``partitions: [{"topic", "partition"}]`` filter; None means all."""
    entries = req_field(body, "partitions", list, None)
    if entries is None:
        return None
    return [_partition_key(e) for e in entries]


def _replica_list(entry: Any) -> tuple[int, ...] | None:
    replicas = req_field(entry, "replicas", list, None)
    if replicas is None:
        return None
    if any(type(r) is not int for r in replicas):
        raise InvalidRequestError(f"'replicas' must list broker ids (ints), got {replicas!r}")
    return tuple(replicas)


def _result_entry(key: TopicPartition, result: ApiResult) -> dict[str, Any]:
    return {
        "topic": key[0],
        "partition": key[1],
        "error": int(result.error),
        "message": result.message or None,
    }


def _reassignment_entry(part: PartitionRegistration) -> dict[str, Any]:
    return {
        "topic": part.topic,
        "partition": part.partition,
        "replicas": list(part.replicas),
        "isr": list(part.isr),
        "leader": part.leader,
        "adding_replicas": list(part.adding_replicas),
        "removing_replicas": list(part.removing_replicas),
        "target_replicas": list(part.target_replicas),
    }


def _log_dir_entry(c: LocalCopy) -> dict[str, Any]:
    return {
        "topic": c.topic,
        "partition": c.partition,
        "size": c.size,
        "log_start_offset": c.log_start_offset,
        "log_end_offset": c.log_end_offset,
        "high_watermark": c.high_watermark,
    }


class ReassignmentApi:
    """Reassignment, leader election and log-dir APIs."""

    def __init__(
        self, quorum: MetadataQuorum, views: PartitionViews, metrics: BrokerMetrics
    ) -> None:
        self.quorum = quorum
        self.views = views
        self.metrics = metrics

    def _done(self, req: Request, body: dict[str, Any]) -> Reply:
        """A controller answer; a forwarding broker also gets the metadata offset to await."""
        if req.body.get("forwarded_by") is not None:
            body["metadata_offset"] = self.quorum.image.offset
        return Reply(body)

    # -- AlterPartitionReassignments (on the controller) --------------------------------
    async def alter_partition_reassignments(self, req: Request) -> Reply:
        try:
            entries = req_list(req.body, "partitions")
            throttle = req_field(req.body, "throttle_bytes_per_sec", int, None)
            if throttle is not None and throttle < 0:
                raise InvalidRequestError(
                    f"throttle_bytes_per_sec must be >= 0 (0 removes the throttle), got {throttle}"
                )
        except InvalidRequestError as e:  # answered in the usual shape: one kind of refusal
            self.metrics.error(req.api_key, e.code)
            return Reply({"error": int(e.code), "message": str(e), "partitions": []})
        moves: dict[TopicPartition, tuple[int, ...] | None] = {}
        checked: list[tuple[TopicPartition, ApiResult]] = []  # in request order
        refused: list[ApiResult] = []
        for i, entry in enumerate(entries):
            key: TopicPartition = ("", -1)  # until the entry names a partition
            name = f"partitions[{i}]"
            try:
                key = _partition_key(entry)
                name = f"{key[0]}-{key[1]}"
                if key in moves:
                    raise InvalidRequestError("named twice in the request")
                moves[key] = _replica_list(entry)
                checked.append((key, ApiResult()))
            except LogMQError as e:
                refused.append(ApiResult(e.code, f"{name}: {e}"))
                checked.append((key, refused[-1]))
        if refused:
            self.metrics.error(req.api_key, ErrorCode.INVALID_REQUEST)
            out = [_result_entry(k, r) for k, r in checked]
            message = "; ".join(r.message for r in refused) + " (nothing was started)"
            body = {"error": int(ErrorCode.INVALID_REQUEST), "message": message, "partitions": out}
            return self._done(req, body)
        result = await self.quorum.submit(lambda c: c.alter_reassignments(moves, throttle=throttle))
        if result.error is not ErrorCode.NONE:
            self.metrics.error(req.api_key, result.error)
        return self._done(
            req,
            {
                "error": int(result.error),
                "message": result.message or None,
                "partitions": [_result_entry(k, r) for k, r in result.partitions.items()],
            },
        )

    # -- ListPartitionReassignments -------------------------------------------------------
    async def list_partition_reassignments(self, req: Request) -> Reply:
        found = self.views.reassignments(_partition_keys(req.body))
        return Reply(
            {
                "error": 0,
                "throttle_bytes_per_sec": found.throttle_bytes_per_sec,
                "partitions": [_reassignment_entry(p) for p in found.moving],
            }
        )

    # -- DescribeLogDirs (this broker's own logs) -------------------------------------------
    async def describe_log_dirs(self, req: Request) -> Reply:
        report = self.views.log_dirs(_partition_keys(req.body))
        return Reply(
            {
                "broker_id": report.broker_id,
                "log_dir": report.log_dir,
                "total_bytes": report.total_bytes,
                "usable_bytes": report.usable_bytes,
                "partitions": [_log_dir_entry(c) for c in report.copies],
            }
        )

    # -- ElectLeaders (on the controller) ---------------------------------------------------
    async def elect_leaders(self, req: Request) -> Reply:
        keys = _partition_keys(req.body)
        election = req_int(req.body, "election_type", PREFERRED)
        if election not in (PREFERRED, UNCLEAN):
            raise InvalidRequestError(
                f"election_type must be {PREFERRED} (preferred) or {UNCLEAN} (unclean), "
                f"got {election}"
            )
        seen: set[TopicPartition] = set()
        for key in keys or ():
            if key in seen:
                raise InvalidRequestError(f"{key[0]}-{key[1]} appears twice in the request")
            seen.add(key)
        results = await self.quorum.submit(
            lambda c: c.elect_leaders(keys, unclean=election == UNCLEAN)
        )
        for r in results.values():
            if not r.ok and r.error is not ErrorCode.ELECTION_NOT_NEEDED:
                self.metrics.error(req.api_key, r.error)
        return self._done(
            req, {"partitions": [_result_entry(k, r) for k, r in sorted(results.items())]}
        )
