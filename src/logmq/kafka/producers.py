"""A partition leader's side of producers on the Kafka door: DescribeProducers (61)
and WriteTxnMarkers (27).

DescribeProducers (KIP-664): kafka-transactions.sh reads it to find hanging
transactions: a producer whose ``current_txn_start_offset`` is set holds the partition's
last stable offset back until its transaction ends. The answer comes from the leader's
producer state (one entry per producer id, its last sequence and timestamp, the
coordinator epoch of its last marker) and its open transactions. READ on the topic, as
Kafka; a denied topic answers TOPIC_AUTHORIZATION_FAILED for each partition.

WriteTxnMarkers (v1-2; v0 went in Kafka 4.0, KIP-896): logmq's coordinators send their
markers over the native door, so on this door it is the admin's abort of a hanging
transaction (Java's ``Admin.abortTransaction``, ``kafka-transactions.sh abort``), with
the producer id, epoch and coordinator epoch DescribeProducers answered. CLUSTER_ACTION
on the cluster, as Kafka asks; the markers are written acks=all like a coordinator's,
and one from an older coordinator epoch than the partition's last is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from logmq.errors import ErrorCode, LogMQError
from logmq.kafka.messages import NO_THROTTLE, kio_code, response_module
from logmq.net.codec import Request
from logmq.net.reply import Reply
from logmq.security.acl import AclOperation as Op
from logmq.security.acl import ResourceType as RT
from logmq.security.authorization import CLUSTER

if TYPE_CHECKING:
    from logmq.broker.coordinator.txn_markers import MarkerWriter
    from logmq.security.authorization import Authorization
    from logmq.storage.partition_log import PartitionLog

DESCRIBE_PRODUCERS, WRITE_TXN_MARKERS = 61, 27
# (topic, partition) -> the log this broker leads; raises LogMQError otherwise
# (NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION), as ReplicaManager.leader_log
LeaderLog = Callable[[str, int], "PartitionLog"]


class KafkaProducerApis:
    def __init__(
        self,
        leader_log: LeaderLog,
        authz: Authorization | None = None,
        markers: MarkerWriter | None = None,
    ) -> None:
        self.leader_log = leader_log
        self.authz = authz
        self.markers = markers

    def table(self) -> dict[int, Callable[[Request], Any]]:
        out: dict[int, Callable[[Request], Any]] = {DESCRIBE_PRODUCERS: self.describe_producers}
        if self.markers is not None:
            out[WRITE_TXN_MARKERS] = self.write_txn_markers
        return out

    async def write_txn_markers(self, req: Request) -> Reply:
        m = response_module(req.body)
        authz = self.authz
        allowed = (
            authz is None
            or not authz.enabled
            or authz.allowed(req.context, Op.CLUSTER_ACTION, RT.CLUSTER, CLUSTER)
        )
        assert self.markers is not None
        results = []
        for marker in req.body.markers:
            tps = [(t.name, p) for t in marker.topics for p in t.partition_indexes]
            if allowed:
                outcomes = await self.markers.write(
                    marker.producer_id,
                    marker.producer_epoch,
                    marker.coordinator_epoch,
                    marker.transaction_result,
                    tps,
                )
                codes = {tp: outcome.error for tp, outcome in outcomes.items()}
            else:
                codes = dict.fromkeys(tps, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
            by_topic: dict[str, list[Any]] = {}
            for (topic, partition), code in codes.items():
                by_topic.setdefault(topic, []).append(
                    m.WritableTxnMarkerPartitionResult(
                        partition_index=partition, error_code=kio_code(code)
                    )
                )
            results.append(
                m.WritableTxnMarkerResult(
                    producer_id=marker.producer_id,
                    topics=tuple(
                        m.WritableTxnMarkerTopicResult(name=t, partitions=tuple(ps))
                        for t, ps in by_topic.items()
                    ),
                )
            )
        return Reply(m.WriteTxnMarkersResponse(markers=tuple(results)))

    def _allowed(self, req: Request, topic: str) -> bool:
        authz = self.authz
        return (
            authz is None
            or not authz.enabled
            or authz.allowed(req.context, Op.READ, RT.TOPIC, topic)
        )

    async def describe_producers(self, req: Request) -> Reply:
        m = response_module(req.body)
        topics = []
        for t in req.body.topics:
            allowed = self._allowed(req, t.name)
            partitions = []
            for index in t.partition_indexes:
                if not allowed:
                    partitions.append(_failed(m, index, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                    continue
                try:
                    plog = self.leader_log(t.name, index)
                    if plog is None:  # a lookup that answers None for an unknown partition
                        raise LogMQError("unknown partition", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                except LogMQError as e:
                    partitions.append(_failed(m, index, e.code, str(e)))
                    continue
                partitions.append(
                    m.PartitionResponse(
                        partition_index=index,
                        error_code=kio_code(ErrorCode.NONE),
                        error_message=None,
                        active_producers=_producers(m, plog),
                    )
                )
            topics.append(m.TopicResponse(name=t.name, partitions=tuple(partitions)))
        return Reply(m.DescribeProducersResponse(throttle_time=NO_THROTTLE, topics=tuple(topics)))


def _producers(m: Any, plog: PartitionLog) -> tuple[Any, ...]:
    state = plog.producer_state
    ongoing = state.txn.ongoing
    return tuple(
        m.ProducerState(
            producer_id=pid,
            producer_epoch=entry.epoch,
            last_sequence=entry.batches[-1].last_seq if entry.batches else -1,
            last_timestamp=entry.last_timestamp,
            coordinator_epoch=entry.coordinator_epoch,
            current_txn_start_offset=ongoing.get(pid, -1),
        )
        for pid, entry in sorted(state.producers.items())
    )


def _failed(m: Any, index: int, code: ErrorCode, message: str | None = None) -> Any:
    return m.PartitionResponse(
        partition_index=index,
        error_code=kio_code(code),
        error_message=message or code.name,
        active_producers=(),
    )
