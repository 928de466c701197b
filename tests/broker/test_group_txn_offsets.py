"""Transactional offsets through the group shard and a real ``__consumer_offsets`` log.

The shard appends pending offsets as the producer's transactional batches (so the
partition's transaction state covers them and its marker ends them), a reload between
the commit and the marker keeps them pending, and the marker settles them whether it
lands before or after that reload. Markers are appended as MarkerWriter does, then
handed to the shard as ``on_offsets_marker`` would.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from logmq.broker.coordinator.group_shard import GroupShard, ShardState
from logmq.errors import ErrorCode
from logmq.group import OFFSETS_TOPIC, GroupConfig, GroupCoordinator
from logmq.kafka.offsets import KafkaOffsetApis
from logmq.net.codec import Request
from logmq.storage import batch as b
from logmq.storage.log_manager import LogManager
from logmq.storage.txn_state import CONTROL_ABORT, CONTROL_COMMIT, encode_control_batch
from tests.harness import wait_until

TOPICS = {"t": 4}
TP = ("t", 0)
TP1 = ("t", 1)


class SingleReplica:
    def check(self) -> int:
        return 0

    def appended(self, plog) -> None:
        plog.high_watermark = plog.log_end_offset

    async def replicated(self, offset: int, timeout_ms: int) -> None:
        return None


async def loaded(logs: LogManager) -> GroupShard:
    get_log = lambda: logs.get_log(OFFSETS_TOPIC, 0)  # noqa: E731
    shard = GroupShard(
        0, 1, logs, get_log, GroupConfig(), lambda: TOPICS, replication=SingleReplica()
    )
    shard.load()
    await wait_until(lambda: shard.state is ShardState.ACTIVE, what="shard loaded")
    await shard.submit(lambda core, now: None)  # past the first operation
    return shard


def txn_commit(shard: GroupShard, pid: int, epoch: int, offsets: dict):
    """What GroupCoordinatorService.txn_offset_commit queues."""

    def op(core: GroupCoordinator, now_ms: int):
        known = shard.producer_epoch(pid)
        return core.txn_offset_commit("g", pid, epoch, offsets, now_ms=now_ms, known_epoch=known)

    return shard.submit(op)


def alter(shard: GroupShard, offsets: dict):
    return shard.submit(lambda core, now: core.alter_offsets("g", offsets, now))


def view(core: GroupCoordinator, now_ms: int):
    found = core.fetch_offsets("g").offsets
    return {tp: c.offset for tp, c in found.items()}, core.pending_offsets("g")


def write_marker(logs: LogManager, pid: int, epoch: int, commit: bool) -> None:
    """MarkerWriter's append (the shard is not the only writer of the partition)."""
    data = encode_control_batch(
        CONTROL_COMMIT if commit else CONTROL_ABORT, producer_id=pid, producer_epoch=epoch
    )
    plog = logs.get_log(OFFSETS_TOPIC, 0)
    plog.append(data, leader_epoch=0, control=True)
    plog.high_watermark = plog.log_end_offset


def batches(logs: LogManager) -> list[b.BatchHeader]:
    plog = logs.get_log(OFFSETS_TOPIC, 0)
    data = plog.read(0, 1 << 20, max_offset=plog.log_end_offset).read()
    return [h for _, h in b.iter_headers(data)]


async def test_pending_offsets_are_transactional_batches_and_survive_a_reload(logs):
    shard = await loaded(logs)
    assert await alter(shard, {TP: (5, "")}) == {TP: ErrorCode.NONE}
    assert await txn_commit(shard, 7, 2, {TP: (10, ""), TP1: (11, "")}) == {
        TP: ErrorCode.NONE,
        TP1: ErrorCode.NONE,
    }
    # a second commit in the same transaction is written too (its own sequence)
    assert await txn_commit(shard, 7, 2, {TP: (12, "")}) == {TP: ErrorCode.NONE}
    txn = [h for h in batches(logs) if h.producer_id == 7]
    assert [(h.producer_epoch, h.base_sequence, h.record_count) for h in txn] == [
        (2, 0, 2),
        (2, 2, 1),
    ]
    assert all(h.attributes & b.ATTR_TRANSACTIONAL for h in txn)
    plog = logs.get_log(OFFSETS_TOPIC, 0)
    assert plog.last_stable_offset <= txn[0].base_offset  # the partition's open txn
    assert await shard.submit(view) == ({TP: 5}, {TP, TP1})
    await shard.unload()

    shard = await loaded(logs)  # a reload between the pending commit and the marker
    assert await shard.submit(view) == ({TP: 5}, {TP, TP1})
    write_marker(logs, 7, 2, commit=True)
    assert await shard.complete_txn(7, True) == ["g"]
    assert await shard.submit(view) == ({TP: 12, TP1: 11}, set())
    assert plog.last_stable_offset == plog.log_end_offset
    await shard.unload()

    shard = await loaded(logs)  # the marker replayed in log order
    assert await shard.submit(view) == ({TP: 12, TP1: 11}, set())
    # the next transaction of the same producer continues its sequence
    assert await txn_commit(shard, 7, 2, {TP: (20, "")}) == {TP: ErrorCode.NONE}
    assert batches(logs)[-1].base_sequence == 3
    await shard.unload()


async def test_a_marker_written_while_no_shard_runs_is_read_by_the_next_load(logs):
    shard = await loaded(logs)
    await alter(shard, {TP: (5, "")})
    await txn_commit(shard, 7, 0, {TP: (10, "")})
    await txn_commit(shard, 8, 0, {TP1: (30, "")})
    await shard.unload()
    assert shard.complete_txn(7, False) is None  # unloaded: quietly ignored
    write_marker(logs, 7, 0, commit=False)
    write_marker(logs, 8, 0, commit=True)
    shard = await loaded(logs)
    assert await shard.submit(view) == ({TP: 5, TP1: 30}, set())
    assert await shard.submit(lambda core, now: core.open_transactions()) == {}
    await shard.unload()


async def test_a_later_plain_commit_wins_after_a_reload_too(logs):
    shard = await loaded(logs)
    await txn_commit(shard, 7, 0, {TP: (10, "")})
    await alter(shard, {TP: (20, "")})
    await shard.unload()
    write_marker(logs, 7, 0, commit=True)
    shard = await loaded(logs)
    assert await shard.submit(view) == ({TP: 20}, set())
    await shard.unload()


async def test_a_marker_arriving_while_the_shard_loads_is_applied_after(logs):
    shard = await loaded(logs)
    await txn_commit(shard, 7, 0, {TP: (10, "")})
    await shard.unload()
    get_log = lambda: logs.get_log(OFFSETS_TOPIC, 0)  # noqa: E731
    shard = GroupShard(
        0, 1, logs, get_log, GroupConfig(), lambda: TOPICS, replication=SingleReplica()
    )
    shard.load()
    assert shard.state is ShardState.LOADING
    write_marker(logs, 7, 0, commit=True)
    assert shard.complete_txn(7, True) is None  # kept for after the load
    await wait_until(lambda: shard.state is ShardState.ACTIVE)
    await wait_until(lambda: not shard._early_markers)
    assert await shard.submit(view) == ({TP: 10}, set())
    await shard.unload()


async def test_a_fenced_epoch_is_refused_without_failing_the_round(logs):
    shard = await loaded(logs)
    await txn_commit(shard, 7, 3, {TP: (10, "")})
    write_marker(logs, 7, 4, commit=False)  # e.g. aborted by a new InitProducerId
    await shard.complete_txn(7, False)
    zombie, fine = await asyncio.gather(
        txn_commit(shard, 7, 3, {TP: (11, "")}), alter(shard, {TP1: (1, "")})
    )
    assert zombie == {TP: ErrorCode.INVALID_PRODUCER_EPOCH}
    assert fine == {TP1: ErrorCode.NONE}
    assert shard.state is ShardState.ACTIVE
    await shard.unload()


# ---- the Kafka door -----------------------------------------------------------------


class FakeGroups:
    """The service as the door sees it, over one loaded shard."""

    def __init__(self, shard: GroupShard) -> None:
        self.shard = shard

    def shard_for(self, group_id: str) -> GroupShard:
        return self.shard

    async def txn_offset_commit(self, group_id, pid, epoch, offsets, member, gen, instance):
        return await txn_commit(self.shard, pid, epoch, offsets)


def request(api_key: int, version: int, body) -> Request:
    return SimpleNamespace(api_key=api_key, api_version=version, body=body, context=None)


async def test_door_txn_offset_commit_and_require_stable(logs):
    from kio.schema.offset_fetch.v7 import request as fetch_v7
    from kio.schema.txn_offset_commit.v3 import request as commit_v3

    shard = await loaded(logs)
    await alter(shard, {TP: (5, "")})
    apis = KafkaOffsetApis(FakeGroups(shard), lambda node, listener: None)
    body = commit_v3.TxnOffsetCommitRequest(
        transactional_id="tx",
        group_id="g",
        producer_id=7,
        producer_epoch=0,
        topics=(
            commit_v3.TxnOffsetCommitRequestTopic(
                name="t",
                partitions=(
                    commit_v3.TxnOffsetCommitRequestPartition(
                        partition_index=0, committed_offset=10, committed_metadata=None
                    ),
                ),
            ),
        ),
    )
    reply = await apis.txn_offset_commit(request(28, 3, body))
    assert [p.error_code.value for t in reply.body.topics for p in t.partitions] == [0]

    async def fetch(stable: bool):
        wanted = (fetch_v7.OffsetFetchRequestTopic(name="t", partition_indexes=(0,)),)
        req = fetch_v7.OffsetFetchRequest(group_id="g", topics=wanted, require_stable=stable)
        reply = await apis.offset_fetch(request(9, 7, req))
        (part,) = reply.body.topics[0].partitions
        return part.committed_offset, part.error_code.value

    assert await fetch(False) == (5, 0)
    assert await fetch(True) == (-1, ErrorCode.UNSTABLE_OFFSET_COMMIT)
    write_marker(logs, 7, 0, commit=True)
    await shard.complete_txn(7, True)
    assert await fetch(True) == (10, 0)
    await shard.unload()


async def test_leader_epochs_survive_the_log_a_reload_and_the_marker(logs):
    """The epoch is in the pending record: a new coordinator (a reload) settles the
    marker with it, and reloads after the marker answer it too."""

    def epochs(core: GroupCoordinator, now_ms: int):
        found = core.fetch_offsets("g").offsets
        return {tp: (c.offset, c.leader_epoch) for tp, c in found.items()}

    shard = await loaded(logs)
    await alter(shard, {TP1: (3, "", 1)})
    await txn_commit(shard, 7, 0, {TP: (10, "", 0)})
    await shard.unload()
    shard = await loaded(logs)
    write_marker(logs, 7, 0, commit=True)
    await shard.complete_txn(7, True)
    assert await shard.submit(epochs) == {TP: (10, 0), TP1: (3, 1)}
    await shard.unload()
    shard = await loaded(logs)
    assert await shard.submit(epochs) == {TP: (10, 0), TP1: (3, 1)}
    await shard.unload()


async def test_door_keeps_the_committed_leader_epoch(logs):
    """TxnOffsetCommit v2+ and OffsetCommit v6+ carry committed_leader_epoch; OffsetFetch
    v5+ answers it (-1 where nothing is known)."""
    from kio.schema.offset_commit.v8 import request as commit_v8
    from kio.schema.offset_fetch.v8 import request as fetch_v8
    from kio.schema.txn_offset_commit.v2 import request as txn_v2

    shard = await loaded(logs)
    apis = KafkaOffsetApis(FakeGroups(shard), lambda node, listener: None)
    body = txn_v2.TxnOffsetCommitRequest(
        transactional_id="tx",
        group_id="g",
        producer_id=7,
        producer_epoch=0,
        topics=(
            txn_v2.TxnOffsetCommitRequestTopic(
                name="t",
                partitions=(
                    txn_v2.TxnOffsetCommitRequestPartition(
                        partition_index=0,
                        committed_offset=10,
                        committed_leader_epoch=0,
                        committed_metadata=None,
                    ),
                ),
            ),
        ),
    )
    reply = await apis.txn_offset_commit(request(28, 2, body))
    assert [p.error_code.value for t in reply.body.topics for p in t.partitions] == [0]
    plain = commit_v8.OffsetCommitRequest(
        group_id="g",
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=(
            commit_v8.OffsetCommitRequestTopic(
                name="t",
                partitions=(
                    commit_v8.OffsetCommitRequestPartition(
                        partition_index=1,
                        committed_offset=4,
                        committed_leader_epoch=5,
                        committed_metadata="x",
                    ),
                    commit_v8.OffsetCommitRequestPartition(
                        partition_index=2,
                        committed_offset=6,
                        committed_leader_epoch=-1,
                        committed_metadata=None,
                    ),
                ),
            ),
        ),
    )
    reply = await apis.offset_commit(request(8, 8, plain))
    assert [p.error_code.value for t in reply.body.topics for p in t.partitions] == [0, 0]
    write_marker(logs, 7, 0, commit=True)
    await shard.complete_txn(7, True)

    wanted = (fetch_v8.OffsetFetchRequestTopics(name="t", partition_indexes=(0, 1, 2, 3)),)
    req = fetch_v8.OffsetFetchRequest(
        groups=(fetch_v8.OffsetFetchRequestGroup(group_id="g", topics=wanted),),
        require_stable=True,
    )
    reply = await apis.offset_fetch(request(9, 8, req))
    parts = reply.body.groups[0].topics[0].partitions
    assert [(p.committed_offset, p.committed_leader_epoch) for p in parts] == [
        (10, 0),
        (4, 5),
        (6, -1),
        (-1, -1),
    ]
    await shard.unload()
