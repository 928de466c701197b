"""What the driver asks the brokers: which partitions exist, and where their logs start and end.

One ``ClusterView`` lives in the driver-side reader for the whole life of a streaming
query (Spark keeps that Python process), holding one blocking ``Admin`` client, opened
on first use. It is never pickled into tasks: readers drop it in ``__getstate__``.

A read_committed view (the default) reports a partition's end as its last stable offset
(LSO), from ListOffsets with isolation level 1 (a read_committed consumer's
``end_offsets``), so no planned range reaches into a
transaction that is still open: a task would otherwise wait for records the broker may
never make visible to it (and an aborted transaction's would never be).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from logmq.client.sync import Admin, Consumer
from logmq.errors import LogMQError, UnknownTopicOrPartitionError
from logmq_spark.offsets import TP
from logmq_spark.options import Subscription

log = logging.getLogger("logmq_spark")


@dataclass(frozen=True, slots=True)
class LogBounds:
    """A partition's log start offset and the end a reader may go to: the high watermark,
    or for read_committed the LSO (``high_watermark`` then holds the HW)."""

    start: int
    end: int
    high_watermark: int | None = None


class ClusterView:
    def __init__(self, bootstrap: str, *, read_committed: bool = False) -> None:
        self.bootstrap = bootstrap
        self.read_committed = read_committed
        self._admin: Admin | None = None
        self._committed: Consumer | None = None  # asks for LSOs (its end_offsets)

    def admin(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(self.bootstrap)
        return self._admin

    def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            admin.close()
        consumer, self._committed = self._committed, None
        if consumer is not None:
            consumer.close()

    def topics(self, subscription: Subscription, *, must_exist: bool) -> list[str]:
        """The subscribed topics that exist now (a missing named topic raises if must_exist)."""
        existing = set(self.admin().list_topics())
        if subscription.pattern is not None:
            return sorted(t for t in existing if subscription.matches(t))
        missing = [t for t in subscription.topics if t not in existing]
        if missing and must_exist:
            raise UnknownTopicOrPartitionError(f"topic {missing[0]!r} does not exist")
        return [t for t in subscription.topics if t in existing]

    def bounds(self, subscription: Subscription, *, must_exist: bool) -> dict[TP, LogBounds]:
        """Start and end offsets of every partition of the subscribed topics.

        A topic deleted between listing and describing is retried once, then left out
        (a streaming query sees it as gone; failOnDataLoss decides what that means).
        """
        for attempt in range(2):
            topics = self.topics(subscription, must_exist=must_exist)
            if not topics:
                return {}
            try:
                described = self.admin().describe_topics(topics)
            except UnknownTopicOrPartitionError:
                if attempt == 1 or must_exist:
                    raise
                continue
            bounds = {
                (name, p.partition): LogBounds(p.log_start_offset, p.log_end_offset)
                for name, desc in described.items()
                for p in desc.partitions
            }
            if self.read_committed and bounds:
                stable = self.stable_offsets(list(bounds))
                bounds = {
                    tp: LogBounds(b.start, stable.get(tp, b.end), b.end) for tp, b in bounds.items()
                }
            return bounds
        return {}

    def stable_offsets(self, tps: list[TP]) -> dict[TP, int]:
        """Each partition's last stable offset (ListOffsets latest, read_committed)."""
        if self._committed is None:
            self._committed = Consumer(
                self.bootstrap, isolation_level="read_committed", client_id="logmq-spark"
            )
        return dict(self._committed.end_offsets(tps))

    def offsets_for_time(self, tps: list[TP], timestamp_ms: int) -> dict[TP, int | None]:
        """The first offset at or after ``timestamp_ms`` per partition (None: none so late)."""
        if not tps:
            return {}
        with Consumer(self.bootstrap) as consumer:
            found = consumer.offsets_for_times(dict.fromkeys(tps, timestamp_ms))
        return {tp: (hit[0] if hit is not None else None) for tp, hit in found.items()}

    def commit_group_offsets(self, group_id: str, offsets: Mapping[TP, int]) -> bool:
        """Record a query's progress in a consumer group (so ``logmq group describe`` shows
        its lag). Failures are logged, not raised: Spark's checkpoint is the source of
        truth, and a commit refused (a live group using the same id) or lost (coordinator
        moving) must not stop the query; the next batch commits again. Returns whether
        the commit was accepted."""
        try:
            self.admin().commit_group_offsets(group_id, dict(offsets))
        except LogMQError as e:
            log.warning("could not commit offsets of group %r: %s", group_id, e)
            return False
        return True
