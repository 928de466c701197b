"""The group coordinator's shard runtime against a real LogManager (no network).

Loading, batching of operations into appends, answers only after fsync, reload after a
failed append or fsync, timers, and unloading. Time-dependent checks wait for a
condition with a deadline.
"""

from __future__ import annotations

import asyncio

import pytest

from logmq.broker.coordinator.group_shard import CoordinatorError, GroupShard, ShardState
from logmq.errors import ErrorCode, StorageError
from logmq.group import OFFSETS_TOPIC, GroupConfig, GroupCoordinator, GroupState
from logmq.storage.log_manager import LogManager
from tests.harness import wait_until

CONFIG = GroupConfig(
    session_timeout_ms=10_000,
    heartbeat_interval_ms=1_000,
    min_session_timeout_ms=50,
    max_session_timeout_ms=60_000,
    initial_rebalance_delay_ms=0,
)
TOPICS = {"t": 8}


class SingleReplica:
    """The offsets partition has no other replica: what is appended is committed."""

    def check(self) -> int:
        return 0

    def appended(self, plog) -> None:
        plog.high_watermark = plog.log_end_offset

    async def replicated(self, offset: int, timeout_ms: int) -> None:
        return None


def make_shard(logs: LogManager, topics=lambda: TOPICS) -> GroupShard:
    get_log = lambda: logs.get_log(OFFSETS_TOPIC, 0)  # noqa: E731
    return GroupShard(0, 1, logs, get_log, CONFIG, topics, replication=SingleReplica())


async def loaded(logs: LogManager) -> GroupShard:
    shard = make_shard(logs)
    shard.load()
    await wait_until(lambda: shard.state is ShardState.ACTIVE, what="shard loaded")
    return shard


def join(member_id: str, topics=("t",), session_timeout_ms=None):
    from logmq.group import MemberOptions

    options = MemberOptions(session_timeout_ms=session_timeout_ms)

    def op(core: GroupCoordinator, now_ms: int):
        return core.heartbeat("g", member_id, 0, None, topics, None, now_ms, options)

    return op


def commit(member_id: str, epoch: int, partition: int, offset: int):
    def op(core: GroupCoordinator, now_ms: int):
        return core.commit_offsets("g", member_id, epoch, {("t", partition): (offset, "")}, now_ms)

    return op


def fetch(core: GroupCoordinator, now_ms: int):
    return core.fetch_offsets("g").offsets


async def test_requests_wait_for_the_load_then_go_through(logs):
    shard = make_shard(logs)
    with pytest.raises(CoordinatorError) as unloaded:
        shard.submit(fetch)
    assert unloaded.value.code is ErrorCode.NOT_COORDINATOR
    shard.load()
    with pytest.raises(CoordinatorError) as loading:
        shard.submit(fetch)
    assert loading.value.code is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    await wait_until(lambda: shard.state is ShardState.ACTIVE)
    assert await shard.submit(fetch) == {}
    await shard.unload()


async def test_operations_queued_together_share_one_append_and_one_fsync(logs, monkeypatch):
    shard = await loaded(logs)
    joined = await shard.submit(join("a"))
    plog = logs.get_log(OFFSETS_TOPIC, 0)
    appends = syncs = 0
    real_append, real_sync = plog.append, logs.sync

    def counting_append(data, **kw):
        nonlocal appends
        appends += 1
        return real_append(data, **kw)

    async def counting_sync(p):
        nonlocal syncs
        syncs += 1
        await real_sync(p)

    monkeypatch.setattr(plog, "append", counting_append)
    monkeypatch.setattr(logs, "sync", counting_sync)
    futures = [
        shard.submit(commit("a", joined.member_epoch, i % 8, i)) for i in range(200)
    ]  # all queued before the worker runs: one round
    results = await asyncio.gather(*futures)
    assert all(r == {("t", i % 8): ErrorCode.NONE} for i, r in enumerate(results))
    assert (appends, syncs) == (1, 1)
    offsets = await shard.submit(fetch)
    assert {tp: c.offset for tp, c in offsets.items()} == {("t", p): 192 + p for p in range(8)}
    await shard.unload()
    again = await loaded(logs)  # the same state from the log
    assert (await again.submit(fetch)) == offsets
    await again.unload()


async def test_an_answer_waits_for_the_fsync(logs, monkeypatch):
    shard = await loaded(logs)
    gate = asyncio.Event()
    real_sync = logs.sync

    async def gated_sync(p):
        await gate.wait()
        await real_sync(p)

    monkeypatch.setattr(logs, "sync", gated_sync)
    joined = shard.submit(join("a"))
    read = shard.submit(fetch)  # saw the join: waits for it too
    await wait_until(lambda: logs.get_log(OFFSETS_TOPIC, 0).log_end_offset > 0)
    for _ in range(20):
        await asyncio.sleep(0)
    assert not joined.done() and not read.done()
    gate.set()
    assert (await joined).error is ErrorCode.NONE
    assert await read == {}
    await shard.unload()


@pytest.mark.parametrize("failing", ["append", "sync"])
async def test_a_failed_write_reloads_from_the_log(logs, monkeypatch, failing):
    shard = await loaded(logs)
    joined = await shard.submit(join("a"))
    await shard.submit(commit("a", joined.member_epoch, 0, 5))
    plog = logs.get_log(OFFSETS_TOPIC, 0)
    if failing == "append":
        real = plog.append

        def broken(data, **kw):
            monkeypatch.setattr(plog, "append", real)
            raise StorageError("disk on fire")

        monkeypatch.setattr(plog, "append", broken)
    else:
        real_sync = logs.sync

        async def broken_sync(p):
            monkeypatch.setattr(logs, "sync", real_sync)
            raise StorageError("fsync failed")

        monkeypatch.setattr(logs, "sync", broken_sync)
    with pytest.raises(CoordinatorError) as failed:
        await shard.submit(commit("a", joined.member_epoch, 0, 9))
    assert failed.value.code is ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert shard.state is ShardState.LOADING
    await wait_until(lambda: shard.state is ShardState.ACTIVE, what="reloaded")
    offsets = await shard.submit(fetch)
    # a failed append wrote nothing; a failed fsync leaves what reached the file
    assert offsets[("t", 0)].offset == (5 if failing == "append" else 9)
    assert (await shard.submit(commit("a", joined.member_epoch, 0, 11))) == {
        ("t", 0): ErrorCode.NONE
    }
    await shard.unload()


async def test_timer_expires_a_silent_member_and_persists_it(logs):
    shard = await loaded(logs)
    await shard.submit(join("quiet", session_timeout_ms=100))
    steady = await shard.submit(join("steady"))

    def members(core: GroupCoordinator, now_ms: int):
        return [m.member_id for m in core.describe("g").description.members]

    async def quiet_gone() -> bool:
        return await shard.submit(members) == ["steady"]

    for _ in range(400):
        if await quiet_gone():
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the quiet member never expired")
    assert steady.error is ErrorCode.NONE
    await shard.unload()
    again = await loaded(logs)
    assert await again.submit(members) == ["steady"], "the expiry was written to the log"
    await again.unload()


async def test_unload_fails_pending_operations_with_not_coordinator(logs, monkeypatch):
    shard = await loaded(logs)
    never = asyncio.Event()

    async def stuck_sync(p):
        await never.wait()

    monkeypatch.setattr(logs, "sync", stuck_sync)
    pending = shard.submit(join("a"))
    queued = [shard.submit(fetch) for _ in range(3)]
    await wait_until(lambda: logs.get_log(OFFSETS_TOPIC, 0).log_end_offset > 0)
    await shard.unload()
    for future in [pending, *queued]:
        with pytest.raises(CoordinatorError) as gone:
            await future
        assert gone.value.code is ErrorCode.NOT_COORDINATOR
    assert shard.state is ShardState.UNLOADED


async def test_metadata_changes_reach_the_groups(logs):
    topics = {"t": 2}
    shard = make_shard(logs, lambda: dict(topics))
    shard.load()
    await wait_until(lambda: shard.state is ShardState.ACTIVE)
    first = await shard.submit(join("a", topics=("t", "new")))
    assert first.assigned_partitions == {("t", 0), ("t", 1)}
    topics["new"] = 3
    shard.metadata_changed()
    again = await shard.submit(
        lambda core, now: core.heartbeat("g", "a", first.member_epoch, None, None, [], now)
    )
    assert ("new", 2) in again.assigned_partitions
    shard.metadata_changed(deleted_topics=["t"])

    def state(core: GroupCoordinator, now_ms: int):
        return core.describe("g").description.state

    assert await shard.submit(state) in (GroupState.RECONCILING, GroupState.STABLE)
    await shard.unload()


def classic_join(member_id: str, session_timeout_ms: int = 10_000, rebalance_ms: int = 200):
    protocols = (("range", b"meta"),)

    def op(core: GroupCoordinator, now_ms: int, ticket: int):
        return core.join_group(
            ticket, "c", member_id, None, "consumer", protocols, session_timeout_ms,
            rebalance_ms, "client", "host", False, now_ms,
        )  # fmt: skip

    return op


async def test_a_parked_join_is_answered_by_a_later_request_or_by_the_timer(logs):
    shard = await loaded(logs)
    first = await shard.submit_parked(classic_join(""))  # alone: completes at once
    assert first.error is ErrorCode.NONE and first.generation == 1
    # a second member parks; the first heartbeats into the rebalance and never rejoins:
    # the timer ends the join phase after the rebalance timeout and answers the second
    second = shard.submit_parked(classic_join(""))
    beat = await shard.submit(
        lambda core, now: core.classic_heartbeat("c", first.member_id, None, 1, now)
    )
    assert beat is ErrorCode.REBALANCE_IN_PROGRESS and not second.done()
    answer = await asyncio.wait_for(second, 10)
    assert answer.error is ErrorCode.NONE and answer.generation == 2
    assert [m[0] for m in answer.members] == [answer.member_id]  # the first was dropped
    await shard.unload()


async def test_unload_fails_parked_requests_with_not_coordinator(logs):
    shard = await loaded(logs)
    first = await shard.submit_parked(classic_join("", rebalance_ms=60_000))
    parked = shard.submit_parked(classic_join("", rebalance_ms=60_000))
    await shard.submit(lambda core, now: core.classic_heartbeat("c", first.member_id, None, 1, now))
    assert not parked.done()
    await shard.unload()
    with pytest.raises(CoordinatorError) as err:
        await parked
    assert err.value.code is ErrorCode.NOT_COORDINATOR
