"""Handlers of the cluster APIs: DescribeCluster, DescribeQuorum, and the broker-to-controller
BrokerRegistration, BrokerHeartbeat, AllocateProducerIds and AlterPartition.

DescribeCluster and DescribeQuorum answer from any broker (its metadata image and its
view of the quorum) for ``logmq cluster describe``. Registration and heartbeats are what
brokers send the controller over its client port (broker/metadata/quorum_service.py); a broker that
is not the controller answers NOT_CONTROLLER and the sender looks for the leader again.
Body schemas are in docs/protocol.md; the broker side of these calls is in
controller_forwarding.py (``allocate_producer_ids``, ``alter_partition``) and
broker/metadata/quorum_service.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from logmq.broker.metadata.quorum_service import now_ms
from logmq.cluster.controller_api import AlterPartitionRequest, AlterPartitionResponse
from logmq.cluster.metadata_image import PartitionRegistration
from logmq.errors import ErrorCode
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
