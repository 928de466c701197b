"""Group writes are answered only once replicated (issue 12: commits lost on failover).

A shard in a cluster appends to a replicated ``__consumer_offsets`` partition; its answers
must mean what an acks=all produce means: the records are on every in-sync replica. A
scripted ``ShardReplication`` stands in for the replica manager, so each outcome (the HW
passes, never passes, the ISR is too small, leadership is gone) is driven exactly.
"""

from __future__ import annotations

import asyncio

import pytest

from logmq.broker.coordinator.group_shard import CoordinatorError, GroupShard, ShardState
from logmq.errors import ErrorCode, LogMQError
from logmq.group import OFFSETS_TOPIC, GroupCoordinator
from logmq.storage import batch as b
from logmq.storage.log_manager import LogManager
from tests.broker.test_group_shard import CONFIG, TOPICS
from tests.harness import wait_until


class ScriptedReplication:
    """The HW moves only when the test says so; ``check`` answers what the test sets."""

    def __init__(self, epoch: int = 7) -> None:
        self.epoch = epoch
        self.check_error = ErrorCode.NONE
        self.hw = 0
        self.leo = 0
        self.fail_with: ErrorCode | None = None  # answer waits with this at once
        self._moved = asyncio.Event()

    def check(self) -> int:
        if self.check_error is not ErrorCode.NONE:
            raise LogMQError("scripted", self.check_error)
        return self.epoch

    def appended(self, plog) -> None:
        self.leo = plog.log_end_offset

    def advance(self, hw: int | None = None) -> None:
        self.hw = self.leo if hw is None else hw
        self._moved.set()

    async def replicated(self, offset: int, timeout_ms: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while self.hw < offset:
            if self.fail_with is not None:
                raise LogMQError("scripted", self.fail_with)
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise LogMQError("scripted", ErrorCode.REQUEST_TIMED_OUT)
            self._moved.clear()
            try:
                async with asyncio.timeout(remaining):
                    await self._moved.wait()
            except TimeoutError:
                pass


async def loaded(logs: LogManager, repl: ScriptedReplication, timeout_ms: int = 60_000):
    shard = GroupShard(
        0,
        1,
        logs,
        lambda: logs.get_log(OFFSETS_TOPIC, 0),
        CONFIG,
        lambda: TOPICS,
        leader_epoch=3,
        replication=repl,
        replication_timeout_ms=timeout_ms,
    )
    shard.load()
    await wait_until(lambda: shard.state is ShardState.ACTIVE, what="shard loaded")
    return shard


def commit(offset: int, group: str = "g"):
    def op(core: GroupCoordinator, now_ms: int):
        return core.commit_offsets(group, "", -1, {("t", 0): (offset, "")}, now_ms)

    return op


def fetch(core: GroupCoordinator, now_ms: int):
    return core.fetch_offsets("g").offsets


async def test_a_commit_is_answered_only_after_the_high_watermark_passes_it(logs):
    repl = ScriptedReplication()
    shard = await loaded(logs, repl)
    answer = shard.submit(commit(5))
    await wait_until(lambda: repl.leo > 0, what="the commit appended")
    await asyncio.sleep(0)  # let the completer reach the wait: nothing may answer yet
    assert not answer.done()
    reader = shard.submit(fetch)  # a read must not see the unreplicated commit either
    await wait_until(lambda: shard._run is not None and shard._run.rounds.qsize() >= 1)
    assert not reader.done()
    repl.advance()
    await answer
    assert (await reader)[("t", 0)].offset == 5
    await shard.unload()


async def test_records_carry_the_replicas_leader_epoch(logs):
    repl = ScriptedReplication(epoch=9)  # the shard was made at epoch 3
    shard = await loaded(logs, repl)
    repl.advance(10**9)
    await shard.submit(commit(1))
    plog = logs.get_log(OFFSETS_TOPIC, 0)
    data = plog.read(0, 1 << 20).read()
    assert [h.leader_epoch for _, h in b.iter_headers(data)] == [9]
    await shard.unload()


async def test_an_unreplicated_commit_fails_with_a_retriable_timeout(logs):
    repl = ScriptedReplication()
    shard = await loaded(logs, repl, timeout_ms=50)
    with pytest.raises(CoordinatorError) as failed:
        await shard.submit(commit(5))
    assert failed.value.code is ErrorCode.REQUEST_TIMED_OUT
    assert failed.value.retriable
    assert "not replicated" in str(failed.value)
    # The shard goes on: once the followers catch up, the next commit is answered.
    assert shard.state is ShardState.ACTIVE
    repl.advance(10**9)
    await shard.submit(commit(6))
    assert (await shard.submit(fetch))[("t", 0)].offset == 6
    await shard.unload()


async def test_too_few_in_sync_replicas_refuses_the_write_and_forgets_it(logs):
    repl = ScriptedReplication()
    shard = await loaded(logs, repl)
    repl.advance(10**9)
    await shard.submit(commit(5))
    repl.check_error = ErrorCode.NOT_ENOUGH_REPLICAS
    with pytest.raises(CoordinatorError) as failed:
        await shard.submit(commit(6))
    assert failed.value.code is ErrorCode.NOT_ENOUGH_REPLICAS
    # The refused commit was applied to memory first: the shard reloads from the log,
    # so nobody reads the offset that was never written.
    repl.check_error = ErrorCode.NONE
    await wait_until(lambda: shard.state is ShardState.ACTIVE, what="reloaded")
    assert (await shard.submit(fetch))[("t", 0)].offset == 5
    await shard.unload()


async def test_lost_leadership_answers_not_coordinator(logs):
    repl = ScriptedReplication()
    shard = await loaded(logs, repl)
    answer = shard.submit(commit(5))
    await wait_until(lambda: repl.leo > 0, what="the commit appended")
    repl.fail_with = ErrorCode.NOT_LEADER_OR_FOLLOWER
    repl.advance(0)  # wake the wait: it now learns leadership is gone
    with pytest.raises(CoordinatorError) as failed:
        await answer
    assert failed.value.code is ErrorCode.NOT_COORDINATOR
    await shard.unload()


# -- the service: one shard per leader epoch ---------------------------------------------
class FakeBroker:
    """What GroupCoordinatorService reads from the broker, for one offsets partition."""

    def __init__(self, logs: LogManager) -> None:
        from types import SimpleNamespace

        from logmq.broker.config import BrokerConfig
        from logmq.broker.replica.fetch_waiter import FetchWaiters

        self.config = BrokerConfig(node_id=1, data_dir=logs.data_dir)
        self.logs = logs
        self.waiters = FetchWaiters()
        self.part = self.registration(1)
        self.image = SimpleNamespace(
            topics={OFFSETS_TOPIC: SimpleNamespace(partitions={0: None}), "t": _Topic(8)},
            partitions=lambda: [self.part],
        )

    @staticmethod
    def registration(epoch: int, leader: int = 1):
        from logmq.cluster.metadata_image import PartitionRegistration

        return PartitionRegistration(OFFSETS_TOPIC, 0, (1, 2), (1, 2), leader, epoch, epoch)

    def local_log(self, topic: str, partition: int):
        return self.logs.get_log(topic, partition)

    def service(self):
        """The service over this fake: it is the quorum (``image``) and the local logs."""
        from logmq.broker.coordinator.group_service import GroupCoordinatorService

        async def no_controller(api_key: int, body: dict) -> dict:
            raise AssertionError("no controller in this test")

        from logmq.broker.replica.replica_manager import ReplicaManager

        replicas = ReplicaManager(
            1,
            self.logs,
            self.waiters,
            alter_partitions=None,  # type: ignore[arg-type]
            broker_address=lambda node: None,
            leader_logs=self,  # type: ignore[arg-type]
            metadata=lambda: self.image,  # type: ignore[arg-type,return-value]
            replicated=False,  # the offsets partition is this broker's alone
        )
        return GroupCoordinatorService(
            self.config,
            self,  # type: ignore[arg-type]
            self.logs,
            self,  # type: ignore[arg-type]
            replicas,
            None,  # type: ignore[arg-type]
            no_controller,
        )


class _Topic:
    def __init__(self, n: int) -> None:
        self.partitions = dict.fromkeys(range(n))


def changes(leaders=(), followers=()):
    from logmq.cluster.metadata_image import LocalReplicaChanges

    return LocalReplicaChanges({p.key: p for p in leaders}, {p.key: p for p in followers}, set())


async def written_elsewhere(logs: LogManager, offset: int, epoch: int) -> None:
    """Records another leader wrote (and this replica fetched) while we did not lead."""
    from logmq.broker.coordinator.group_shard import _encode

    core = GroupCoordinator(0, 1, CONFIG, topic_partitions=TOPICS)
    core.commit_offsets("g", "", -1, {("t", 0): (offset, "")}, 0)
    plog = logs.get_log(OFFSETS_TOPIC, 0)
    plog.append(_encode(core.take_records(), 0), leader_epoch=epoch)


async def active_shard(service, group: str = "g"):
    await wait_until(
        lambda: group_shard_state(service, group) is ShardState.ACTIVE, what="shard active"
    )
    return service.shard_for(group)


def group_shard_state(service, group: str):
    try:
        return service.shard_for(group).state
    except CoordinatorError:
        return None


async def test_leadership_regained_at_a_newer_epoch_reloads_what_others_wrote(logs):
    broker = FakeBroker(logs)
    service = broker.service()
    service.start()
    service.on_partitions_changed(broker.image, changes(leaders=[broker.part]))  # epoch 1
    shard = await active_shard(service)
    await shard.submit(commit(5))
    # Lost and regained within one metadata change; meanwhile another leader took a commit.
    await written_elsewhere(logs, 9, epoch=2)
    broker.part = FakeBroker.registration(3)
    service.on_partitions_changed(broker.image, changes(leaders=[broker.part]))
    shard = await active_shard(service)
    assert shard.leader_epoch == 3
    assert (await shard.submit(fetch))[("t", 0)].offset == 9  # not the stale 5
    await service.stop()


async def test_resign_then_lead_again_in_one_loop_turn_keeps_a_shard(logs):
    broker = FakeBroker(logs)
    service = broker.service()
    service.start()
    service.on_partitions_changed(broker.image, changes(leaders=[broker.part]))  # epoch 1
    await active_shard(service)
    # Two metadata changes applied back to back (a follower catching up on the log):
    # the unload of the first must not take away the shard of the second.
    service.on_partitions_changed(
        broker.image, changes(followers=[FakeBroker.registration(2, leader=2)])
    )
    service.on_partitions_changed(broker.image, changes(leaders=[FakeBroker.registration(3)]))
    shard = await active_shard(service)
    assert shard.leader_epoch == 3
    await shard.submit(commit(1))
    assert service.shard_for("g") is shard
    await service.stop()
