"""The produce path both front doors share, from a partition's batches to the log.

A client's records for one partition: refused on internal topics (only the broker
writes ``__consumer_offsets``), held while their topic is being auto-created (in arrival
order, so pipelined produces keep their order: topic_creation.PendingTopics), then
appended by the replica manager as the partition's leader (validation and stamping by
the storage, min.insync.replicas, the HW, acks=all). The native handler (data_api.py)
and the Kafka one (kafka/apis.py) only translate requests and answers around it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from logmq.broker.metadata.topic_creation import PendingTopics
from logmq.cluster.topic_names import is_internal
from logmq.errors import ErrorCode, InvalidRecordError, LogMQError, Outcome

if TYPE_CHECKING:
    from logmq.broker.metadata.image_topics import TopicInfo
    from logmq.broker.replica.leader_appends import LeaderAppends
    from logmq.broker.replica.replica_manager import ReplicaManager
    from logmq.cluster.metadata_image import MetadataImage
    from logmq.storage.partition_log import PartitionLog
    from logmq.storage.stamping import AppendInfo


log = logging.getLogger("logmq.broker")


@dataclass(slots=True)
class ProduceResult(Outcome):
    """One partition's answer to a produce, as both doors answer it.

    ``log_append_time`` is the batch's stamp for a LogAppendTime topic, else -1;
    ``record_errors`` the records a refused batch names, ``(index, message)`` (KIP-467:
    a keyless record in a compacted topic)."""

    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    record_errors: tuple[tuple[int, str | None], ...] = ()


def appended(info: AppendInfo, plog: PartitionLog) -> ProduceResult:
    """The answer of a partition whose append succeeded."""
    append_time = (
        info.max_timestamp if plog.config.message_timestamp_type == "LogAppendTime" else -1
    )
    return ProduceResult(
        ErrorCode.NONE, None, info.first_offset, append_time, plog.log_start_offset
    )


def refused(topic: str, partition: int, exc: BaseException) -> ProduceResult:
    """The answer of a partition whose append raised: a LogMQError's code and message; a
    fault of the broker's own (any other exception) is logged and answered
    UNKNOWN_SERVER_ERROR with its message."""
    if isinstance(exc, InvalidRecordError):
        return ProduceResult(exc.code, str(exc), record_errors=exc.record_errors)
    if isinstance(exc, LogMQError):
        return ProduceResult(exc.code, str(exc))
    log.error("append to %s-%d failed", topic, partition, exc_info=exc)
    return ProduceResult(ErrorCode.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}")


class AutoCreator(Protocol):
    def maybe_auto_create(self, topic: str) -> TopicInfo | None: ...

    async def auto_create(self, topic: str) -> TopicInfo | None: ...


class ProducePath:
    def __init__(
        self,
        replicas: ReplicaManager,
        appends: LeaderAppends,
        image: Callable[[], MetadataImage],
        topic_creator: AutoCreator,
    ) -> None:
        self.replicas = replicas  # which partitions this broker leads, at which epoch
        self.appends = appends
        self.image = image
        # Produces to topics being auto-created wait here, in arrival order.
        self.pending_topics = PendingTopics(topic_creator.auto_create)

    def stop(self) -> None:
        """Cancel auto-creations still running (the broker is shutting down)."""
        self.pending_topics.stop()

    async def before_appends(self, keys: Iterable[tuple[str, int]]) -> None:
        """Once per produce request, before its appends start (in arrival order):
        waits while the logs of newly created partitions are still being made."""
        await self.replicas.new_logs_made(keys)

    async def append_all(
        self,
        entries: Sequence[tuple[str, int, Any]],
        acks: int,
        timeout_ms: int,
        guard: Callable[[str, int], None] | None = None,
    ) -> list[ProduceResult]:
        """Every ``(topic, partition, data)`` append of one produce request: one result
        per partition, in request order.

        Pipelined requests run concurrently but must write in the order they arrived.
        Each append is written at once, in order, in the handler's first step, with no
        task per partition (at 10,000 one-batch partitions a request, a task for each
        and gathering them cost about a third of the broker's produce CPU). What waits
        after the write (an fsync a topic's policy asks for, acks=all replication) is
        awaited all together. An append to a topic being auto-created runs as a task
        made in that same step, which queues in PendingTopics in arrival order; a later
        append to that topic queues behind it, since the topic stays pending until every
        waiter has taken the step that writes its append.

        ``guard``: run in the same step as each append, just before it (a transactional
        produce's KIP-890 guard, txn_verification.append_guard); what it raises is
        that partition's answer.
        """
        await self.before_appends((topic, partition) for topic, partition, _ in entries)
        out: list[ProduceResult | None] = [None] * len(entries)
        waits: list[tuple[int, Awaitable[ProduceResult]]] = []
        for i, (topic, partition, data) in enumerate(entries):
            try:
                if guard is not None:
                    guard(topic, partition)
                now = self.append_now(topic, partition, data, acks, timeout_ms)
            except Exception as e:  # the client gets it in its answer
                out[i] = refused(topic, partition, e)
                continue
            if now is None:
                task = asyncio.ensure_future(
                    self._append_later(topic, partition, data, acks, timeout_ms)
                )
                waits.append((i, task))
                continue
            info, plog, rest = now
            if rest is None:
                out[i] = appended(info, plog)
            else:
                waits.append((i, self._finish(info, plog, rest)))
        if waits:
            done = await asyncio.gather(*(w for _, w in waits), return_exceptions=True)
            for (i, _), result in zip(waits, done, strict=True):
                if isinstance(result, ProduceResult):
                    out[i] = result
                elif isinstance(result, Exception):
                    topic, partition, _ = entries[i]
                    out[i] = refused(topic, partition, result)
                else:
                    raise result  # cancelled, or the loop is going down
        return out  # type: ignore[return-value]  # every slot is filled

    @staticmethod
    async def _finish(
        info: AppendInfo, plog: PartitionLog, rest: Coroutine[Any, Any, None]
    ) -> ProduceResult:
        await rest
        return appended(info, plog)

    async def _append_later(
        self, topic: str, partition: int, data: Any, acks: int, timeout_ms: int
    ) -> ProduceResult:
        """An append to a topic being auto-created: after it exists, in arrival order."""
        await self.pending_topics.wait(topic)  # auto-create runs on the controller
        info, plog, rest = self._write(topic, partition, data, acks, timeout_ms)
        if rest is not None:
            await rest
        return appended(info, plog)

    def append_now(
        self, topic: str, partition: int, data: Any, acks: int, timeout_ms: int
    ) -> tuple[AppendInfo, PartitionLog, Coroutine[Any, Any, None] | None] | None:
        """Write one partition's batches at once, and what its answer still waits for
        (ReplicaManager.append_now); None if the topic is being auto-created (only a task
        can wait for that). LogMQError with the code the client gets."""
        if is_internal(topic):
            raise LogMQError(
                f"{topic!r} is an internal topic: clients cannot produce to it",
                ErrorCode.INVALID_TOPIC_EXCEPTION,
            )
        if topic not in self.image().topics or self.pending_topics.waiting(topic):
            return None
        return self._write(topic, partition, data, acks, timeout_ms)

    def _write(
        self, topic: str, partition: int, data: Any, acks: int, timeout_ms: int
    ) -> tuple[AppendInfo, PartitionLog, Coroutine[Any, Any, None] | None]:
        plog = self.replicas.leader_log(topic, partition)
        if not data:
            raise LogMQError("empty record set", ErrorCode.CORRUPT_MESSAGE)
        info, rest = self.appends.append_now((topic, partition), plog, data, acks, timeout_ms)
        return info, plog, rest
