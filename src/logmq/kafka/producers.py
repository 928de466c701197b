"""Kafka's DescribeProducers (API 61, KIP-664): a partition leader's active producers.

kafka-transactions.sh reads it to find hanging transactions: a producer whose
``current_txn_start_offset`` is set holds the partition's last stable offset back until
its transaction ends. The answer comes from the leader's producer state (one entry per
producer id, its last sequence and timestamp) and its open transactions. READ on the
topic, as Kafka; a denied topic answers TOPIC_AUTHORIZATION_FAILED for each partition.
The producer state keeps no coordinator epoch per producer, so that field is -1.
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

if TYPE_CHECKING:
    from logmq.security.authorization import Authorization
    from logmq.storage.partition_log import PartitionLog

DESCRIBE_PRODUCERS = 61
# (topic, partition) -> the log this broker leads; raises LogMQError otherwise
# (NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION), as ReplicaManager.leader_log
LeaderLog = Callable[[str, int], "PartitionLog"]


class KafkaProducerApis:
    def __init__(self, leader_log: LeaderLog, authz: Authorization | None = None) -> None:
        self.leader_log = leader_log
        self.authz = authz

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
            coordinator_epoch=-1,
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
