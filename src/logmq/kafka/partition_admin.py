"""Kafka's partition admin APIs: DeleteRecords, DescribeLogDirs, ElectLeaders,
AlterPartitionReassignments, ListPartitionReassignments.

Calls on the services both doors share: the replica manager's ``delete_records``
(leader, ISR low watermark), the partition views (broker/replica/partition_views.py) for what
this broker answers itself, and the controller (``run_on_controller``) for elections and
moves, so both front doors share one set of rules and errors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as KioErrorCode

from logmq.errors import ErrorCode, LogMQError
from logmq.kafka.messages import NO_THROTTLE, build, kio_code, millis, response_module
from logmq.net.codec import ApiKey, Request
from logmq.net.reply import Reply

if TYPE_CHECKING:
    from logmq.broker.metadata.topic_admin import RunOnController
    from logmq.broker.replica.partition_views import PartitionViews
    from logmq.broker.replica.record_deletion import RecordDeletion
    from logmq.cluster.metadata_image import MetadataImage

TopicPartition = tuple[str, int]


def _code(value: Any) -> ErrorCode:
    try:
        return ErrorCode(int(value or 0))
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR


def _per_topic(
    results: Iterable[tuple[TopicPartition, Any]],
    topic: Callable[[str, tuple], Any],
    partition: Callable[[int, Any], Any],
) -> tuple:
    """Kafka's topics-of-partitions answer shape from ``((topic, partition), value)``."""
    by_topic: dict[str, list[Any]] = {}
    for (name, index), value in results:
        by_topic.setdefault(name, []).append(partition(index, value))
    return tuple(topic(name, tuple(parts)) for name, parts in by_topic.items())


class KafkaPartitionAdminApis:
    def __init__(
        self,
        deletions: RecordDeletion,
        views: PartitionViews,
        run_on_controller: RunOnController,
        image: Callable[[], MetadataImage],
    ) -> None:
        self.deletions = deletions
        self.views = views
        self.run_on_controller = run_on_controller
        self.image = image

    # -- DeleteRecords (sent to each partition's leader) ----------------------------------
    async def delete_records(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        offsets = {
            (t.name, p.partition_index): int(p.offset) for t in body.topics for p in t.partitions
        }
        timeout_ms = millis(getattr(body, "timeout", None), 30_000)
        results = await self.deletions.delete_records(offsets, timeout_ms)
        topics = _per_topic(
            results.items(),
            lambda name, parts: m.DeleteRecordsTopicResult(name=name, partitions=parts),
            lambda index, r: m.DeleteRecordsPartitionResult(
                partition_index=index, low_watermark=r.low_watermark, error_code=kio_code(r.error)
            ),
        )
        return Reply(m.DeleteRecordsResponse(throttle_time=NO_THROTTLE, topics=topics))

    # -- DescribeLogDirs (this broker's own copies) ------------------------------------------
    async def describe_log_dirs(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        wanted = None
        if body.topics is not None:
            wanted = [(t.topic, p) for t in body.topics for p in t.partitions]
        report = self.views.log_dirs(wanted)
        by_topic: dict[str, list[Any]] = {}
        for c in report.copies:
            lag = max(c.high_watermark - c.log_end_offset, 0)  # Kafka: HW - LEO, >= 0
            by_topic.setdefault(c.topic, []).append(
                m.DescribeLogDirsPartition(
                    partition_index=c.partition,
                    partition_size=c.size,
                    offset_lag=lag,
                    is_future_key=False,
                )
            )
        result = build(
            m.DescribeLogDirsResult,
            error_code=KioErrorCode.none,
            log_dir=report.log_dir,
            topics=tuple(
                m.DescribeLogDirsTopic(name=name, partitions=tuple(parts))
                for name, parts in sorted(by_topic.items())
            ),
            total_bytes=report.total_bytes,
            usable_bytes=report.usable_bytes,
        )
        return Reply(
            build(
                m.DescribeLogDirsResponse,
                throttle_time=NO_THROTTLE,
                error_code=KioErrorCode.none,
                results=(result,),
            )
        )

    # -- ElectLeaders (on the controller) -------------------------------------------------
    async def elect_leaders(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        everything = body.topic_partitions is None
        partitions = None
        if not everything:
            partitions = [
                {"topic": t.topic, "partition": p}
                for t in body.topic_partitions
                for p in t.partitions
            ]
        native = {"partitions": partitions, "election_type": int(getattr(body, "election_type", 0))}
        try:
            answer = await self.run_on_controller(ApiKey.ELECT_LEADERS, native)
        except LogMQError as e:
            return Reply(self._elect_response(m, e.code, []))
        results = []
        for entry in answer.get("partitions", []):
            code = _code(entry.get("error"))
            if everything and code is ErrorCode.ELECTION_NOT_NEEDED:
                continue  # Kafka lists only the partitions an all-partitions election moved
            results.append(((entry["topic"], entry["partition"]), (code, entry.get("message"))))
        return Reply(self._elect_response(m, ErrorCode.NONE, results))

    def _elect_response(self, m: Any, error: ErrorCode, results: list) -> Any:
        topics = _per_topic(
            results,
            lambda name, parts: m.ReplicaElectionResult(topic=name, partition_result=parts),
            lambda index, r: m.PartitionResult(
                partition_id=index, error_code=kio_code(r[0]), error_message=r[1]
            ),
        )
        return build(
            m.ElectLeadersResponse,
            throttle_time=NO_THROTTLE,
            error_code=kio_code(error),
            replica_election_results=topics,
        )

    # -- AlterPartitionReassignments (on the controller) -----------------------------------
    async def alter_partition_reassignments(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        allow_rf_change = getattr(body, "allow_replication_factor_change", True)
        image = self.image()
        moves: list[dict[str, Any]] = []
        refused: dict[TopicPartition, tuple[ErrorCode, str]] = {}
        for t in body.topics:
            for p in t.partitions:
                key = (t.name, p.partition_index)
                replicas = None if p.replicas is None else [int(r) for r in p.replicas]
                part = image.partition(*key)
                if (
                    not allow_rf_change
                    and replicas is not None
                    and part is not None
                    and len(replicas) != len(part.replicas)
                ):
                    refused[key] = (
                        ErrorCode.INVALID_REPLICATION_FACTOR,
                        f"the move changes the replication factor of {key[0]}-{key[1]} "
                        f"from {len(part.replicas)} to {len(replicas)}, and the request "
                        "does not allow that",
                    )
                moves.append({"topic": key[0], "partition": key[1], "replicas": replicas})
        error, message = ErrorCode.NONE, None
        results: dict[TopicPartition, tuple[ErrorCode, str | None]] = {}
        if refused:
            # All or nothing, as the controller treats the request.
            error = ErrorCode.INVALID_REPLICATION_FACTOR
            message = "; ".join(text for _, text in refused.values()) + " (nothing was started)"
            results = {(mv["topic"], mv["partition"]): (ErrorCode.NONE, None) for mv in moves}
            results.update(refused)
        elif moves:
            try:
                answer = await self.run_on_controller(
                    ApiKey.ALTER_PARTITION_REASSIGNMENTS, {"partitions": moves}
                )
            except LogMQError as e:
                answer = {"error": int(e.code), "message": str(e), "partitions": []}
            error, message = _code(answer.get("error")), answer.get("message")
            for entry in answer.get("partitions", []):
                key = (entry.get("topic", ""), entry.get("partition", -1))
                results[key] = (_code(entry.get("error")), entry.get("message"))
        keys = [(mv["topic"], mv["partition"]) for mv in moves]
        ordered = [(key, results.get(key, (error, message))) for key in keys]
        responses = _per_topic(
            ordered,
            lambda name, parts: m.ReassignableTopicResponse(name=name, partitions=parts),
            lambda index, r: m.ReassignablePartitionResponse(
                partition_index=index, error_code=kio_code(r[0]), error_message=r[1]
            ),
        )
        return Reply(
            build(
                m.AlterPartitionReassignmentsResponse,
                throttle_time=NO_THROTTLE,
                allow_replication_factor_change=allow_rf_change,
                error_code=kio_code(error),
                error_message=message,
                responses=responses,
            )
        )

    # -- ListPartitionReassignments (from this broker's image) ----------------------------
    async def list_partition_reassignments(self, req: Request) -> Reply:
        body = req.body
        m = response_module(body)
        wanted = None
        if body.topics is not None:
            wanted = [(t.name, p) for t in body.topics for p in t.partition_indexes]
        by_topic: dict[str, list[Any]] = {}
        for p in self.views.reassignments(wanted).moving:
            by_topic.setdefault(p.topic, []).append(
                m.OngoingPartitionReassignment(
                    partition_index=p.partition,
                    replicas=tuple(p.replicas),
                    adding_replicas=tuple(p.adding_replicas),
                    removing_replicas=tuple(p.removing_replicas),
                )
            )
        return Reply(
            m.ListPartitionReassignmentsResponse(
                throttle_time=NO_THROTTLE,
                error_code=KioErrorCode.none,
                error_message=None,
                topics=tuple(
                    m.OngoingTopicReassignment(name=name, partitions=tuple(parts))
                    for name, parts in sorted(by_topic.items())
                ),
            )
        )
