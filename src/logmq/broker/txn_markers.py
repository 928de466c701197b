"""Transaction markers: how a coordinator's decision reaches the partitions (KIP-98).

When a transaction commits or aborts, its coordinator has a COMMIT or ABORT marker (a
control batch carrying the producer id, epoch and coordinator epoch) appended to every
partition the transaction touched, on that partition's leader, and replicated as an
acks=all produce is. Only then does it write CompleteCommit/CompleteAbort.

* ``MarkerWriter`` is the partition leader's side: it appends markers to the partitions
  this broker leads (the only appends that may hold control batches) and tells the
  group coordinator of markers on ``__consumer_offsets`` (transactional offset commits
  become visible or are dropped there).
* ``MarkerSender`` is the coordinator's side: it groups a job's partitions by leader,
  writes the local ones directly and sends the rest as WriteTxnMarkers (native API 27)
  to their leaders, and answers an error per partition. The coordinator service
  retries the failed ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from logmq.errors import ErrorCode, LogMQError
from logmq.net.codec import ApiKey
from logmq.storage.txn_state import CONTROL_ABORT, CONTROL_COMMIT, encode_control_batch
from logmq.txn import MarkerJob

if TYPE_CHECKING:
    from logmq.broker.broker_clients import BrokerClients
    from logmq.broker.replica_manager import ReplicaManager
    from logmq.cluster.metadata_image import MetadataImage

log = logging.getLogger("logmq.txn")

TopicPartition = tuple[str, int]
MARKER_TIMEOUT_MS = 30_000
# on __consumer_offsets-<partition>: (partition, producer id, commit)
OffsetsMarker = Callable[[int, int, bool], Awaitable[None]]


class MarkerWriter:
    """Appends markers to partitions this broker leads."""

    def __init__(
        self,
        replicas: ReplicaManager,
        *,
        offsets_topic: str = "__consumer_offsets",
        on_offsets_marker: OffsetsMarker | None = None,
        timeout_ms: int = MARKER_TIMEOUT_MS,
    ) -> None:
        self.replicas = replicas
        self.offsets_topic = offsets_topic
        self.on_offsets_marker = on_offsets_marker
        self.timeout_ms = timeout_ms

    async def write(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        """Append one marker to each partition (concurrently); an error per partition."""
        tps = list(dict.fromkeys(partitions))
        data = encode_control_batch(
            CONTROL_COMMIT if commit else CONTROL_ABORT,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            coordinator_epoch=coordinator_epoch,
            timestamp=int(time.time() * 1000),
        )
        codes = await asyncio.gather(
            *(self._write_one(tp, data, producer_id, commit) for tp in tps)
        )
        return dict(zip(tps, codes, strict=True))

    async def _write_one(
        self, tp: TopicPartition, data: bytes, producer_id: int, commit: bool
    ) -> ErrorCode:
        try:
            plog = self.replicas.leader_log(*tp)
            await self.replicas.append(tp, plog, data, -1, self.timeout_ms, control=True)
        except LogMQError as e:
            return e.code
        except Exception:
            log.exception("writing a transaction marker to %s-%d failed", *tp)
            return ErrorCode.UNKNOWN_SERVER_ERROR
        if tp[0] == self.offsets_topic and self.on_offsets_marker is not None:
            await self.on_offsets_marker(tp[1], producer_id, commit)
        return ErrorCode.NONE


class MarkerSender:
    """The coordinator's side: a job's markers to every leader (``txn_coordinator``)."""

    def __init__(
        self,
        node_id: int,
        image: Callable[[], MetadataImage],
        writer: MarkerWriter,
        clients: BrokerClients,
    ) -> None:
        self.node_id = node_id
        self.image = image
        self.writer = writer
        self.clients = clients

    async def send(self, job: MarkerJob) -> dict[TopicPartition, ErrorCode]:
        image = self.image()
        by_leader: dict[int, list[TopicPartition]] = defaultdict(list)
        out: dict[TopicPartition, ErrorCode] = {}
        for tp in job.partitions:
            part = image.partition(*tp)
            if part is None:
                out[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif not part.has_leader:
                out[tp] = ErrorCode.LEADER_NOT_AVAILABLE
            else:
                by_leader[part.leader].append(tp)
        results = await asyncio.gather(
            *(self._send_to(leader, job, tps) for leader, tps in by_leader.items())
        )
        for codes in results:
            out.update(codes)
        return out

    async def _send_to(
        self, leader: int, job: MarkerJob, tps: list[TopicPartition]
    ) -> Mapping[TopicPartition, ErrorCode]:
        if leader == self.node_id:
            return await self.writer.write(
                job.producer_id, job.producer_epoch, job.coordinator_epoch, job.commit, tps
            )
        body = {"markers": [marker_body(job, tps)]}
        try:
            answer = await self.clients.call(leader, ApiKey.WRITE_TXN_MARKERS, body)
        except LogMQError as e:
            return dict.fromkeys(tps, e.code)
        return parse_marker_answer(answer, tps)


def marker_body(job: MarkerJob, tps: Iterable[TopicPartition]) -> dict[str, Any]:
    """One marker of a native WriteTxnMarkers request."""
    topics: dict[str, list[int]] = defaultdict(list)
    for topic, partition in tps:
        topics[topic].append(partition)
    return {
        "producer_id": job.producer_id,
        "producer_epoch": job.producer_epoch,
        "coordinator_epoch": job.coordinator_epoch,
        "commit": job.commit,
        "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
    }


def parse_marker_answer(
    answer: Mapping[str, Any], tps: list[TopicPartition]
) -> dict[TopicPartition, ErrorCode]:
    """Per partition from a WriteTxnMarkers answer; a partition it leaves out failed."""
    out = dict.fromkeys(tps, ErrorCode.UNKNOWN_SERVER_ERROR)
    for marker in answer.get("markers") or ():
        for t in marker.get("topics") or ():
            for p in t.get("partitions") or ():
                tp = (t.get("topic"), p.get("partition"))
                if tp in out:
                    try:
                        out[tp] = ErrorCode(p.get("error", -1))
                    except ValueError:
                        out[tp] = ErrorCode.UNKNOWN_SERVER_ERROR
    return out
