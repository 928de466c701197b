"""One ``__consumer_offsets`` partition's group coordinator at run time (a *shard*).

The deterministic :class:`~logmq.group.GroupCoordinator` decides; the generic shard
machinery (:mod:`logmq.broker.coordinator_shard`: load, ordered rounds, one append per
round, answers once fsynced and replicated, reload on a failed append, the timer,
parked requests) makes what it decides durable before anybody hears about it.

What is particular to groups: the core is built with the cluster's topic partition
counts and replays its records group by group (a group that cannot be read is logged
and left out, the others load); topics created, deleted or grown reach the groups as
an ordinary operation (``metadata_changed``), and a newly loaded core runs one first,
since counts may have changed while no coordinator ran; JoinGroup and SyncGroup may
park (``submit_parked``); groups have no side effects beyond their records.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, Unpack

from logmq.broker.coordinator_shard import (
    APPEND_ERRORS,
    CoordinatorError,
    CoordinatorShard,
    ShardOptions,
    ShardReplication,
    ShardState,
    encode_records,
    wall_clock_ms,
)
from logmq.group import OFFSETS_TOPIC, PARKED, GroupConfig, GroupCoordinator, GroupRecord
from logmq.storage.log_manager import LogManager
from logmq.storage.partition_log import PartitionLog

__all__ = [
    "CoordinatorError",
    "GroupShard",
    "Operation",
    "ShardReplication",
    "ShardState",
    "wall_clock_ms",
]

log = logging.getLogger("logmq.group")

T = TypeVar("T")
Operation = Callable[[GroupCoordinator, int], T]  # (core, now_ms) -> answer


class _GroupCore(GroupCoordinator):
    """The group core as the shard drives it: it has no side effects to hand out."""

    def take_effects(self) -> list[Any]:
        return []


class GroupShard(CoordinatorShard[_GroupCore]):
    """The coordinator of the groups that live in one offsets partition."""

    def __init__(
        self,
        partition: int,
        partition_count: int,
        logs: LogManager,
        get_log: Callable[[], PartitionLog | None],
        config: GroupConfig,
        topic_partitions: Callable[[], Mapping[str, int]],
        **options: Unpack[ShardOptions],
    ) -> None:
        super().__init__(
            OFFSETS_TOPIC,
            partition,
            logs,
            get_log,
            self._build_core,
            error_map=APPEND_ERRORS,
            parked_marker=PARKED,
            kind="group",
            logger=log,
            **options,
        )
        self.partition_count = partition_count
        self._config = config
        self._topic_partitions = topic_partitions
        self._deleted_topics: set[str] = set()  # deleted while loading: applied after

    # -- topic metadata -----------------------------------------------------------------
    def metadata_changed(self, deleted_topics: Iterable[str] = ()) -> None:
        """Topics were created, deleted or grown: tell the groups (persisted like a request)."""
        deleted = set(deleted_topics)
        if self.state is not ShardState.ACTIVE:
            self._deleted_topics |= deleted  # applied right after loading
            return
        future = self.submit(self._metadata_op(deleted))

        def done(f: asyncio.Future[None]) -> None:
            if not f.cancelled() and f.exception() is not None:
                self._deleted_topics |= deleted  # the reload that follows applies them
                self._log_failure(f, "metadata update")

        future.add_done_callback(done)

    def _metadata_op(self, deleted: set[str]) -> Operation[None]:
        def apply(core: GroupCoordinator, now_ms: int) -> None:
            if deleted:
                core.delete_topic_offsets(deleted)
            core.update_metadata(self._topic_partitions())

        return apply

    def stats(self) -> tuple[int, int]:
        """(groups, members) of a loaded shard, for the metrics."""
        run = self._run
        if run is None or self.state is not ShardState.ACTIVE:
            return 0, 0
        return len(run.core.group_ids()), run.core.member_count()

    # -- the shard's hooks --------------------------------------------------------------
    def _build_core(self, newest: dict[bytes, bytes], now_ms: int) -> _GroupCore:
        core = _GroupCore(
            self.partition,
            self.partition_count,
            self._config,
            topic_partitions=self._topic_partitions(),
        )
        records = [GroupRecord(k, v) for k, v in newest.items()]
        for group_id, reason in core.replay(records, now_ms).items():
            log.error("%s: group %r not loaded: %s", self.name, group_id, reason)
        return core

    def _after_load(self, core: _GroupCore) -> Operation[None]:
        # Partition counts may have changed while no coordinator ran (docs: Persistence).
        deleted, self._deleted_topics = self._deleted_topics, set()
        return self._metadata_op(deleted)

    def _loaded(self, core: _GroupCore) -> None:
        self._log_loaded(len(core.group_ids()), "groups")

    def _ticked(self, result: Any) -> None:
        for group_id, members in result.items():
            if members:
                log.info("group %r: session or revocation timeout expired %s", group_id, members)


def _encode(records: list[GroupRecord], now_ms: int) -> bytes:
    """One batch of group records (kept for callers that write offsets records)."""
    return encode_records(records, now_ms)
