"""One ``__consumer_offsets`` partition's group coordinator at run time (a *shard*).

The deterministic :class:`~logmq.group.GroupCoordinator` decides; the generic shard
machinery (:mod:`logmq.broker.coordinator.shard_runtime`: load, ordered rounds, one append per
round, answers once fsynced and replicated, reload on a failed append, the timer,
parked requests) makes what it decides durable before anybody hears about it.

What is particular to groups: the core is built with the cluster's topic partition
counts and replays its records group by group (a group that cannot be read is logged
and left out, the others load); topics created, deleted or grown reach the groups as
an ordinary operation (``metadata_changed``), and a newly loaded core runs one first,
since counts may have changed while no coordinator ran; JoinGroup and SyncGroup may
park (``submit_parked``); groups have no side effects beyond their records.

Transactional offsets: the core marks their records with the producer id and epoch,
so the shard appends them as that producer's transactional batch; a reload restores
those whose marker is not in the log yet (``_replay_open``), and the partition's
marker, once appended, reaches the core as ``complete_txn`` (:meth:`complete_txn`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, Unpack

from logmq.broker.coordinator.shard_runtime import (
    APPEND_ERRORS,
    CoordinatorError,
    CoordinatorShard,
    OpenTxnRecord,
    ShardOptions,
    ShardReplication,
    ShardState,
    encode_records,
    encode_shard_batches,
    wall_clock_ms,
)
from logmq.group import OFFSETS_TOPIC, PARKED, GroupConfig, GroupCoordinator, GroupRecord
from logmq.group.offsets import OpenTxnOffset
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
        self._early_markers: list[tuple[int, bool]] = []  # arrived while loading

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

    # -- transactions -------------------------------------------------------------------
    def producer_epoch(self, producer_id: int) -> int:
        """The producer's epoch as this partition's log last saw it (-1: unknown).

        Read inside an operation, it is exact for that round's append: the worker
        applies and appends a round without yielding, so no marker lands in between.
        """
        run = self._run
        if run is None:
            return -1
        entry = run.plog.producer_state.producers.get(producer_id)
        return -1 if entry is None else entry.epoch

    def complete_txn(self, producer_id: int, commit: bool) -> asyncio.Future[list[str]] | None:
        """The producer's marker is in this partition: settle its pending offsets.

        While the shard loads, the load may or may not have read the marker: it is kept
        and applied right after loading (settling twice is harmless: the second finds
        nothing pending). None then, and when unloaded (the next leader's load reads it).
        """
        if self.state in (ShardState.LOADING, ShardState.FAILED):
            self._early_markers.append((producer_id, commit))
            return None
        if self.state is not ShardState.ACTIVE:
            return None
        return self.submit(_complete_op(producer_id, commit))

    def stats(self) -> tuple[int, int]:
        """(groups, members) of a loaded shard, for the metrics."""
        run = self._run
        if run is None or self.state is not ShardState.ACTIVE:
            return 0, 0
        return len(run.core.group_ids()), run.core.member_count()

    def committed_offsets(self) -> Iterable[tuple[str, str, int, int]]:
        """(group, topic, partition, committed offset) of a loaded shard, for the metrics
        (read at scrape time on the event loop; transactional offsets count once
        committed)."""
        run = self._run
        if run is None or self.state is not ShardState.ACTIVE:
            return
        core = run.core
        for group_id in core.group_ids():
            for (topic, partition), committed in core.fetch_offsets(group_id).offsets.items():
                if committed is not None:
                    yield group_id, topic, partition, committed.offset

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

    def _replay_open(self, core: _GroupCore, records: list[OpenTxnRecord]) -> None:
        open_offsets = [
            OpenTxnOffset(
                GroupRecord(r.key, r.value, r.producer_id, r.producer_epoch),
                r.offset,
                r.superseded,
            )
            for r in records
        ]
        for group_id, reason in core.replay_pending(open_offsets).items():
            log.error("%s: group %r: transactional offset skipped: %s", self.name, group_id, reason)

    def _after_load(self, core: _GroupCore) -> Operation[None]:
        # Partition counts may have changed while no coordinator ran (docs: Persistence).
        deleted, self._deleted_topics = self._deleted_topics, set()
        markers, self._early_markers = self._early_markers, []
        metadata = self._metadata_op(deleted)

        def first(core: GroupCoordinator, now_ms: int) -> None:
            for producer_id, commit in markers:
                core.complete_txn(producer_id, commit)
            metadata(core, now_ms)

        return first

    def _loaded(self, core: _GroupCore) -> None:
        self._log_loaded(len(core.group_ids()), "groups")

    def _ticked(self, result: Any) -> None:
        for group_id, members in result.items():
            if members:
                log.info("group %r: session or revocation timeout expired %s", group_id, members)


def _complete_op(producer_id: int, commit: bool) -> Operation[list[str]]:
    def complete(core: GroupCoordinator, now_ms: int) -> list[str]:
        return core.complete_txn(producer_id, commit)

    return complete


def _encode(records: list[GroupRecord], now_ms: int) -> bytes:
    """One batch of group records (kept for callers that write offsets records);
    transactional ones in their producers' batches (sequences from 0)."""
    if any(r.producer_id >= 0 for r in records):
        return encode_shard_batches(records, now_ms)
    return encode_records(records, now_ms)
