"""Handlers of the cluster APIs: DescribeCluster, DescribeQuorum, and the broker-to-controller
BrokerRegistration, BrokerHeartbeat, AllocateProducerIds, AlterPartition and
AlterRemoteSegments.

DescribeCluster and DescribeQuorum answer from any broker (its metadata image and its
view of the quorum) for ``logmq cluster describe``. Registration and heartbeats are what
brokers send the controller over its client port (broker/metadata/quorum_service.py); a broker that
is not the controller answers NOT_CONTROLLER and the sender looks for the leader again.
Body schemas are in docs/protocol.md; the broker side of these calls is in
controller_forwarding.py (``allocate_producer_ids``, ``alter_partition``),
native/remote_segment_updates.py and broker/metadata/quorum_service.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from logmq.broker.metadata.quorum_service import now_ms
from logmq.cluster.controller_api import (
    AlterPartitionRequest,
    AlterPartitionResponse,
    RemoteSegmentChange,
)
from logmq.cluster.metadata_image import PartitionRegistration
from logmq.cluster.metadata_records import MAX_PAIRS
from logmq.cluster.remote_segments import MAX_REMOTE_CHANGES
from logmq.errors import ErrorCode, LogMQError, Outcome
from logmq.native.request_fields import (
    InvalidRequestError,
    req_field,
    req_int,
    req_list,
    req_str,
)
from logmq.net.codec import Request
from logmq.net.reply import Reply
from logmq.replication.raft_service import NotLeaderError
from logmq.storage.remote.segment_metadata import RemoteSegment, SegmentState

if TYPE_CHECKING:
    from logmq.broker.metadata.quorum_service import MetadataQuorum


class ClusterApi:
    """Cluster and quorum APIs, answered from this broker's metadata quorum."""

    def __init__(self, node_id: int, quorum: MetadataQuorum) -> None:
        self.node_id = node_id
        self.quorum = quorum

    async def describe_cluster(self, req: Request) -> Reply:
        image = self.quorum.image
        quorum = self.quorum
        controller = quorum.controller_id
        brokers = [
            {
                "node_id": reg.broker_id,
                "host": reg.host,
                "port": reg.port,
                "rack": reg.rack,
                "fenced": reg.fenced,
                "storage_full": reg.storage_full,
                "broker_epoch": reg.broker_epoch,
            }
            for _, reg in sorted(image.brokers.items())
        ]
        under: list[dict[str, Any]] = []
        offline: list[dict[str, Any]] = []
        for part in image.partitions():
            entry = {
                "topic": part.topic,
                "partition": part.partition,
                "leader": part.leader,
                "replicas": list(part.replicas),
                "isr": list(part.isr),
            }
            if not part.has_leader or not image.is_active(part.leader):
                offline.append(entry)
            elif len(part.isr) < len(part.replicas):
                under.append(entry)
        key = lambda e: (e["topic"], e["partition"])  # noqa: E731
        return Reply(
            {
                "error": 0,
                "cluster_id": image.cluster_id,
                "controller_id": controller if controller is not None else -1,
                "brokers": brokers,
                "topics": len(image.topics),
                "partitions": sum(len(t.partitions) for t in image.topics.values()),
                "under_replicated": sorted(under, key=key),
                "offline": sorted(offline, key=key),
                "image_offset": image.offset,
            }
        )

    async def describe_quorum(self, req: Request) -> Reply:
        return Reply({"error": 0, "node_id": self.node_id, **self.quorum.quorum_state()})

    async def broker_registration(self, req: Request) -> Reply:
        body = req.body
        broker_id = req_int(body, "broker_id")
        incarnation = req_str(body, "incarnation_id")
        host = req_str(body, "host")
        port = req_int(body, "port")
        cluster_id = req_field(body, "cluster_id", str, None)
        kafka_host = req_field(body, "kafka_host", str, None)
        kafka = (kafka_host, req_int(body, "kafka_port")) if kafka_host is not None else None
        listeners = req_field(body, "kafka_listeners", str, None)
        quorum = self.quorum
        if not quorum.is_controller:
            raise NotLeaderError(leader_id=quorum.controller_id)
        response = await quorum.submit(
            lambda c: c.register_broker(
                broker_id,
                incarnation,
                host,
                port,
                now_ms(),
                cluster_id=cluster_id,
                kafka=kafka,
                kafka_listeners=listeners,
            )
        )
        return Reply(
            {
                "error": int(response.error),
                "message": response.message or None,
                "broker_epoch": response.broker_epoch,
            }
        )

    async def broker_heartbeat(self, req: Request) -> Reply:
        body = req.body
        broker_id = req_int(body, "broker_id")
        epoch = req_int(body, "broker_epoch")
        caught_up = req_field(body, "caught_up", bool, False)
        want_shutdown = req_field(body, "want_shutdown", bool, False)
        storage_full = req_field(body, "storage_full", bool, None)  # None: not reported
        quorum = self.quorum
        if not quorum.is_controller:
            raise NotLeaderError(leader_id=quorum.controller_id)
        response = await quorum.submit(
            lambda c: c.heartbeat(
                broker_id,
                epoch,
                now_ms(),
                caught_up=caught_up,
                want_shutdown=want_shutdown,
                storage_full=storage_full,
            )
        )
        return Reply(
            {
                "error": int(response.error),
                "message": response.message or None,
                "fenced": response.fenced,
                "should_shutdown": response.should_shutdown,
            }
        )

    async def allocate_producer_ids(self, req: Request) -> Reply:
        body = req.body
        broker_id = req_int(body, "broker_id")
        epoch = req_int(body, "broker_epoch")
        count = req_int(body, "count")
        quorum = self.quorum
        if not quorum.is_controller:
            raise NotLeaderError(leader_id=quorum.controller_id)
        r = await quorum.submit(lambda c: c.allocate_producer_ids(broker_id, epoch, count))
        return Reply(
            {
                "error": int(r.error),
                "message": r.message or None,
                "start": r.start,
                "count": r.count,
            }
        )

    async def alter_partition(self, req: Request) -> Reply:
        """ISR changes: one partition (``topic``, ``partition``, ...) or many
        (``partitions``: a list of those, answered with a list in the same order)."""
        body = req.body
        broker_id = req_int(body, "broker_id")
        broker_epoch = req_int(body, "broker_epoch")
        many = "partitions" in body
        items = req_list(body, "partitions") if many else [body]
        requests = []
        for item in items:
            new_isr = req_field(item, "new_isr", list, [])
            if not all(type(b) is int for b in new_isr):
                raise InvalidRequestError("'new_isr' must list broker ids")
            requests.append(
                AlterPartitionRequest(
                    broker_id,
                    broker_epoch,
                    req_str(item, "topic"),
                    req_int(item, "partition"),
                    req_int(item, "leader_epoch"),
                    req_int(item, "partition_epoch"),
                    tuple(new_isr),
                )
            )
        quorum = self.quorum
        if not quorum.is_controller:
            raise NotLeaderError(leader_id=quorum.controller_id)
        results = await quorum.submit(lambda c: c.alter_partitions(requests))
        if many:
            return Reply({"error": 0, "partitions": [alter_partition_body(r) for r in results]})
        return Reply(alter_partition_body(results[0]))

    async def alter_remote_segments(self, req: Request) -> Reply:
        """Remote-segment changes of a partition leader, answered one result per change
        in request order (cluster/remote_segments.py has the rules)."""
        body = req.body
        broker_id = req_int(body, "broker_id")
        broker_epoch = req_int(body, "broker_epoch")
        items = req_list(body, "changes")
        if len(items) > MAX_REMOTE_CHANGES:
            raise InvalidRequestError(f"at most {MAX_REMOTE_CHANGES} changes per request")
        changes = [remote_segment_change(item) for item in items]
        quorum = self.quorum
        if not quorum.is_controller:
            raise NotLeaderError(leader_id=quorum.controller_id)
        results = await quorum.submit(
            lambda c: c.alter_remote_segments(broker_id, broker_epoch, changes)
        )
        out: dict[str, Any] = {
            "error": 0,
            "changes": [{"error": int(r.error), "message": r.message or None} for r in results],
        }
        if body.get("forwarded_by") is not None:  # the sender waits until it has the change
            out["metadata_offset"] = quorum.image.offset
        return Reply(out)


def remote_segment_change_body(c: RemoteSegmentChange) -> dict[str, Any]:
    """One change of an AlterRemoteSegments request (docs/protocol.md)."""
    s = c.segment
    return {
        "topic_id": c.topic_id,
        "partition": c.partition,
        "leader_epoch": c.leader_epoch,
        "segment_id": c.segment_id,
        "state": int(c.state),
        "checksum": c.checksum,
        "event_ms": c.event_ms,
        "corrupt": c.corrupt,
        "segment": None
        if s is None
        else {
            "base_offset": s.base_offset,
            "end_offset": s.end_offset,
            "max_timestamp": s.max_timestamp,
            "size_bytes": s.size_bytes,
            "leader_epochs": [list(e) for e in s.leader_epochs],
            "copier_epoch": s.copier_epoch,
            "broker_id": s.broker_id,
            "topic": s.topic,
        },
    }


def remote_segment_change(item: Any) -> RemoteSegmentChange:
    """The inverse of ``remote_segment_change_body``, every field checked."""
    topic_id = req_str(item, "topic_id")
    partition = req_int(item, "partition")
    segment_id = req_str(item, "segment_id")
    try:
        state = SegmentState(req_int(item, "state"))
    except ValueError:
        raise InvalidRequestError(f"unknown remote segment state {item['state']}") from None
    checksum = req_str(item, "checksum", "")
    event_ms = req_int(item, "event_ms", 0)
    raw = req_field(item, "segment", dict, None)
    segment = None
    if raw is not None:
        epochs = req_list(raw, "leader_epochs")
        if len(epochs) > MAX_PAIRS or not all(
            isinstance(e, list) and len(e) == 2 and all(type(x) is int for x in e) for e in epochs
        ):
            raise InvalidRequestError(
                f"'leader_epochs' must list at most {MAX_PAIRS} [epoch, start offset] pairs"
            )
        segment = RemoteSegment(
            topic_id,
            partition,
            segment_id,
            req_int(raw, "base_offset"),
            req_int(raw, "end_offset"),
            req_int(raw, "max_timestamp"),
            req_int(raw, "size_bytes"),
            tuple((e[0], e[1]) for e in epochs),
            req_int(raw, "copier_epoch"),
            req_int(raw, "broker_id"),
            state,
            checksum,
            event_ms,
            req_str(raw, "topic", ""),
        )
    return RemoteSegmentChange(
        topic_id,
        partition,
        req_int(item, "leader_epoch"),
        segment_id,
        state,
        segment,
        checksum,
        event_ms,
        req_field(item, "corrupt", bool, False),
    )


def remote_segment_results(body: dict[str, Any], count: int) -> list[Outcome]:
    """The per-change results of an AlterRemoteSegments answer (``count`` changes sent)."""
    answers = body.get("changes")
    if not isinstance(answers, list) or len(answers) != count:
        code = _code(body.get("error") or ErrorCode.UNKNOWN_SERVER_ERROR)
        raise LogMQError(str(body.get("message") or "AlterRemoteSegments refused"), code)
    out = []
    for a in answers:
        if not isinstance(a, dict):
            out.append(Outcome(ErrorCode.UNKNOWN_SERVER_ERROR, "a malformed answer"))
            continue
        message = a.get("message")
        out.append(Outcome(_code(a.get("error", 0)), message if isinstance(message, str) else None))
    return out


def _code(value: Any) -> ErrorCode:
    try:
        return ErrorCode(value)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR


def alter_partition_body(r: AlterPartitionResponse) -> dict[str, Any]:
    part = r.partition
    return {
        "error": int(r.error),
        "message": r.message or None,
        "partition": None
        if part is None
        else {
            "topic": part.topic,
            "partition": part.partition,
            "replicas": list(part.replicas),
            "isr": list(part.isr),
            "leader": part.leader,
            "leader_epoch": part.leader_epoch,
            "partition_epoch": part.partition_epoch,
        },
    }


def alter_partition_response(body: dict[str, Any]) -> AlterPartitionResponse:
    raw = body.get("partition")
    part = None
    if isinstance(raw, dict):
        part = PartitionRegistration(
            raw["topic"],
            raw["partition"],
            tuple(raw["replicas"]),
            tuple(raw["isr"]),
            raw["leader"],
            raw["leader_epoch"],
            raw["partition_epoch"],
        )
    return AlterPartitionResponse(ErrorCode(body.get("error", 0)), body.get("message") or "", part)
