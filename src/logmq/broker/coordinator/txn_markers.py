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

A coordinator resends a job's markers until each partition answers, so a partition may
get one marker twice: a retry after a lost answer, or the first request arriving late
(KAFKA-17754's delayed marker). After the transaction completed, the producer may have
begun its next one on that partition, with the same producer id and epoch; a late copy
would end it. Markers of logmq's coordinators name their job (coordinator epoch and a
job id unique to one transaction's ending), and the leader remembers the last jobs it
wrote for each producer on each partition: a copy of one is answered NONE, not written
again. The memory is the leader's only (a new leader starts empty); markers without a
job (Kafka's WriteTxnMarkers, an admin's abort) are always written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, defaultdict, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from logmq.errors import OK, ErrorCode, LogMQError, Outcome
from logmq.net.codec import ApiKey
from logmq.storage.txn_state import CONTROL_ABORT, CONTROL_COMMIT, encode_control_batch
from logmq.txn import MarkerJob

if TYPE_CHECKING:
    from logmq.broker.coordinator.peers import BrokerClients
    from logmq.broker.replica.leader_appends import LeaderAppends
    from logmq.broker.replica.replica_manager import ReplicaManager
    from logmq.cluster.metadata_image import MetadataImage

log = logging.getLogger("logmq.txn")

TopicPartition = tuple[str, int]
MARKER_TIMEOUT_MS = 30_000
JOBS_KEPT = 8  # jobs remembered per producer and partition
PRODUCERS_KEPT = 100_000  # (partition, producer) pairs remembered, least recent dropped
JobKey = tuple[int, int]  # (coordinator epoch, job id)
# on __consumer_offsets-<partition>: (partition, producer id, commit)
OffsetsMarker = Callable[[int, int, bool], Awaitable[None]]


class MarkerWriter:
    """Appends markers to partitions this broker leads."""

    def __init__(
        self,
        replicas: ReplicaManager,
        appends: LeaderAppends,
        *,
        offsets_topic: str = "__consumer_offsets",
        on_offsets_marker: OffsetsMarker | None = None,
        timeout_ms: int = MARKER_TIMEOUT_MS,
    ) -> None:
        self.replicas = replicas
        self.appends = appends
        self.offsets_topic = offsets_topic
        self.on_offsets_marker = on_offsets_marker
        self.timeout_ms = timeout_ms
        # (partition, producer id) -> the jobs whose marker this leader wrote there
        self._written: OrderedDict[tuple[TopicPartition, int], deque[JobKey]] = OrderedDict()

    async def write(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
        partitions: Iterable[TopicPartition],
        job_id: int | None = None,
    ) -> dict[TopicPartition, Outcome]:
        """Append one marker to each partition (concurrently); an outcome per partition.
        ``job_id``: the coordinator's job; a partition that has its marker already
        answers NONE without a second one."""
        tps = list(dict.fromkeys(partitions))
        data = encode_control_batch(
            CONTROL_COMMIT if commit else CONTROL_ABORT,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            coordinator_epoch=coordinator_epoch,
            timestamp=int(time.time() * 1000),
        )
        job = None if job_id is None else (coordinator_epoch, job_id)
        outcomes = await asyncio.gather(
            *(self._write_one(tp, data, producer_id, commit, job) for tp in tps)
        )
        return dict(zip(tps, outcomes, strict=True))

    async def _write_one(
        self,
        tp: TopicPartition,
        data: bytes,
        producer_id: int,
        commit: bool,
        job: JobKey | None = None,
    ) -> Outcome:
        try:
            plog = self.replicas.leader_log(*tp)
            if job is not None and job in self._written.get((tp, producer_id), ()):
                log.debug("marker of job %s for %s-%d written already", job, *tp)
                return OK
            await self.appends.append(tp, plog, data, -1, self.timeout_ms, control=True)
        except LogMQError as e:
            return Outcome.failed(e)
        except Exception as e:
            log.exception("writing a transaction marker to %s-%d failed", *tp)
            return Outcome(ErrorCode.UNKNOWN_SERVER_ERROR, f"{type(e).__name__}: {e}")
        if job is not None:
            # only once replicated: a copy answered NONE must find the marker durable
            self._remember((tp, producer_id), job)
        if tp[0] == self.offsets_topic and self.on_offsets_marker is not None:
            await self.on_offsets_marker(tp[1], producer_id, commit)
        return OK

    def _remember(self, key: tuple[TopicPartition, int], job: JobKey) -> None:
        written = self._written
        jobs = written.get(key)
        if jobs is None:
            jobs = written[key] = deque(maxlen=JOBS_KEPT)
            if len(written) > PRODUCERS_KEPT:
                written.popitem(last=False)
        else:
            written.move_to_end(key)
        jobs.append(job)


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

    async def send(self, job: MarkerJob) -> dict[TopicPartition, Outcome]:
        """Each partition's marker, from its leader: an outcome per partition."""
        image = self.image()
        by_leader: dict[int, list[TopicPartition]] = defaultdict(list)
        out: dict[TopicPartition, Outcome] = {}
        for tp in job.partitions:
            part = image.partition(*tp)
            if part is None:
                out[tp] = Outcome(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "not in the metadata")
            elif not part.has_leader:
                out[tp] = Outcome(ErrorCode.LEADER_NOT_AVAILABLE, "no leader")
            else:
                by_leader[part.leader].append(tp)
        results = await asyncio.gather(
            *(self._send_to(leader, job, tps) for leader, tps in by_leader.items())
        )
        for outcomes in results:
            out.update(outcomes)
        return out

    async def _send_to(
        self, leader: int, job: MarkerJob, tps: list[TopicPartition]
    ) -> Mapping[TopicPartition, Outcome]:
        if leader == self.node_id:
            return await self.writer.write(
                job.producer_id,
                job.producer_epoch,
                job.coordinator_epoch,
                job.commit,
                tps,
                job.job_id,
            )
        body = {"markers": [marker_body(job, tps)]}
        try:
            answer = await self.clients.call(leader, ApiKey.WRITE_TXN_MARKERS, body)
        except LogMQError as e:
            return dict.fromkeys(tps, Outcome.failed(e))
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
        "job_id": job.job_id,
        "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
    }


def parse_marker_answer(
    answer: Mapping[str, Any], tps: list[TopicPartition]
) -> dict[TopicPartition, Outcome]:
    """Per partition from a WriteTxnMarkers answer; a partition it leaves out failed."""
    out = dict.fromkeys(tps, Outcome(ErrorCode.UNKNOWN_SERVER_ERROR, "not in the answer"))
    for marker in answer.get("markers") or ():
        for t in marker.get("topics") or ():
            for p in t.get("partitions") or ():
                tp = (t.get("topic"), p.get("partition"))
                if tp in out:
                    try:
                        code = ErrorCode(p.get("error", -1))
                    except ValueError:
                        code = ErrorCode.UNKNOWN_SERVER_ERROR
                    out[tp] = OK if code is ErrorCode.NONE else Outcome(code)
    return out
