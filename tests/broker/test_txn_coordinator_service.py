"""TransactionCoordinatorService over a fake metadata image and real logs (no network).

Creating ``__transaction_state`` on first use, routing ids to the partitions this broker
leads, following leadership (epochs), the transaction APIs end to end with a scripted
MarkerSender (retries of failed partitions, a deleted topic counting as done, a fenced
marker abandoning the job), and ListTransactions/DescribeTransactions.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from logmq.broker.config import BrokerConfig
from logmq.broker.coordinator.group_service import OFFSETS_TOPIC_CONFIGS
from logmq.broker.coordinator.shard_runtime import CoordinatorError, ShardState
from logmq.broker.coordinator.txn_service import TransactionCoordinatorService
from logmq.cluster.metadata_image import (
    BrokerRegistration,
    LocalReplicaChanges,
    PartitionRegistration,
)
from logmq.errors import ErrorCode, LogMQError, Outcome
from logmq.storage.log_manager import LogManager
from logmq.txn import TXN_STATE_TOPIC, MarkerJob, TxnConfig, coordinator_partition
from tests.harness import wait_until

OURS, THEIRS = "tx", "b"  # partitions 0 (led here) and 1 (led by broker 2)
assert coordinator_partition(OURS, 2) == 0 and coordinator_partition(THEIRS, 2) == 1


def registration(topic: str, partition: int, leader: int = 1, epoch: int = 1):
    return PartitionRegistration(topic, partition, (1, 2), (1, 2), leader, epoch, epoch)


class Image:
    """The parts of a MetadataImage the service reads."""

    def __init__(self) -> None:
        self.parts: dict[tuple[str, int], PartitionRegistration] = {}
        self.brokers = {
            n: BrokerRegistration(n, 1, "x", f"host{n}", 9000 + n, fenced=False) for n in (1, 2)
        }
        self.topics: dict[str, SimpleNamespace] = {}

    def add(self, reg: PartitionRegistration) -> None:
        self.parts[reg.key] = reg
        self._refresh()

    def drop_topic(self, topic: str) -> None:
        self.parts = {k: v for k, v in self.parts.items() if k[0] != topic}
        self._refresh()

    def _refresh(self) -> None:
        topics: dict[str, dict[int, PartitionRegistration]] = {}
        for (topic, p), reg in self.parts.items():
            topics.setdefault(topic, {})[p] = reg
        self.topics = {t: SimpleNamespace(partitions=ps) for t, ps in topics.items()}

    def partitions(self):
        return list(self.parts.values())

    def partition(self, topic: str, partition: int):
        return self.parts.get((topic, partition))

    def active_brokers(self):
        return sorted(self.brokers)


class Creator:
    def __init__(self) -> None:
        self.internal: list[tuple] = []
        self.bodies: list[dict] = []

    def create_internal_topic_soon(self, name, partitions, configs=None) -> None:
        self.internal.append((name, partitions, dict(configs or {})))

    def create_topic_soon(self, name, body) -> None:
        self.bodies.append(body)


class Sender:
    """A MarkerSender whose answers the test scripts per partition (default NONE)."""

    def __init__(self) -> None:
        self.sent: list[MarkerJob] = []
        self.script: dict[tuple[str, int], list[ErrorCode]] = {}

    async def send(self, job: MarkerJob) -> dict[tuple[str, int], Outcome]:
        self.sent.append(job)
        return {
            tp: Outcome((self.script.get(tp) or [ErrorCode.NONE]).pop(0)) for tp in job.partitions
        }


class Fake:
    def __init__(self, logs: LogManager) -> None:
        from logmq.broker.replica.fetch_waiter import FetchWaiters
        from logmq.broker.replica.replica_manager import ReplicaManager

        self.logs = logs
        self.image = Image()
        self.creator = Creator()
        self.sender = Sender()
        self.next_pid = 1000
        self.allocations = 0
        self.replicas = ReplicaManager(
            1,
            logs,
            FetchWaiters(),
            alter_partitions=None,  # type: ignore[arg-type]
            broker_address=lambda node: None,
            leader_logs=self,  # type: ignore[arg-type]
            metadata=lambda: self.image,  # type: ignore[arg-type,return-value]
            replicated=False,
        )

    def local_log(self, topic: str, partition: int):
        return self.logs.get_log(topic, partition)

    async def allocate(self) -> int:
        self.allocations += 1
        self.next_pid += 1
        return self.next_pid

    def service(self, **kw) -> TransactionCoordinatorService:
        cfg = BrokerConfig(node_id=1, data_dir=self.logs.data_dir)
        return TransactionCoordinatorService(
            cfg,
            self,  # type: ignore[arg-type]  (the quorum: ``image``)
            self.logs,
            self,  # type: ignore[arg-type]  (the local logs)
            self.replicas,
            self.creator,  # type: ignore[arg-type]
            self.allocate,
            self.sender,
            config=TxnConfig(abort_check_interval_ms=60_000),
            **kw,
        )


@pytest.fixture
async def fake(tmp_path):
    manager = LogManager(tmp_path / "data")
    await manager.start()
    for p in (0, 1):
        manager.create_log(TXN_STATE_TOPIC, p, dict(OFFSETS_TOPIC_CONFIGS))
    yield Fake(manager)
    await manager.stop()


def changes(leaders=(), followers=()):
    return LocalReplicaChanges({p.key: p for p in leaders}, {p.key: p for p in followers}, set())


def with_topic(fake: Fake, epoch: int = 1) -> PartitionRegistration:
    """``__transaction_state`` with two partitions (0 led here), and topics t, u."""
    ours = registration(TXN_STATE_TOPIC, 0, epoch=epoch)
    fake.image.add(ours)
    fake.image.add(registration(TXN_STATE_TOPIC, 1, leader=2))
    for topic in ("t", "u"):
        for p in (0, 1):
            fake.image.add(registration(topic, p))
    return ours


def leading(fake: Fake) -> TransactionCoordinatorService:
    """A started service told that this broker leads partition 0 (its shard loading)."""
    ours = with_topic(fake)
    service = fake.service()
    service.start()
    service.on_partitions_changed(fake.image, changes(leaders=[ours]))
    return service


async def begun(service: TransactionCoordinatorService, partitions=(("t", 0),)) -> int:
    """The producer id of OURS, now in a transaction on ``partitions`` (epoch 0)."""
    pid = (await service.init_producer_id(OURS, 10_000)).producer_id
    await service.add_partitions_to_txn(OURS, pid, 0, partitions)
    return pid


async def active(service: TransactionCoordinatorService, txn: str = OURS):
    def ready() -> bool:
        try:
            return service.shard_for(txn).state is ShardState.ACTIVE
        except CoordinatorError:
            return False

    await wait_until(ready, what="shard active")
    return service.shard_for(txn)


async def describe(service, txn: str = OURS):
    return (await service.describe_transactions([txn]))[0]


async def committed(service, txn: str = OURS) -> None:
    while (await describe(service, txn)).state != "CompleteCommit":
        await asyncio.sleep(0.01)


async def test_the_topic_is_created_on_first_use(fake):
    service = fake.service()
    service.start()
    with pytest.raises(CoordinatorError) as err:
        service.coordinator_for(OURS)
    assert err.value.code is ErrorCode.COORDINATOR_NOT_AVAILABLE
    [(name, partitions, configs)] = fake.creator.internal
    assert (name, partitions) == (TXN_STATE_TOPIC, 50)
    assert configs["cleanup.policy"] == "compact" and configs["retention.ms"] == "-1"
    assert (await service.list_transactions()).transactions == []  # does not create
    explicit = fake.service(partitions=7, replication_factor=2)
    explicit.start()
    with pytest.raises(CoordinatorError):
        explicit.shard_for(OURS)
    [body] = fake.creator.bodies
    assert (body["partitions"], body["replication_factor"], body["internal"]) == (7, 2, True)
    await service.stop()
    await explicit.stop()


async def test_routing_and_a_commit_through_the_service(fake):
    service = leading(fake)
    assert service.coordinator_for(OURS) == (1, "host1", 9001)
    assert service.coordinator_for(THEIRS) == (2, "host2", 9002)
    with pytest.raises(CoordinatorError) as loading:
        await service.end_txn(OURS, 1, 0, True)
    assert loading.value.code is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    await active(service)
    with pytest.raises(CoordinatorError) as elsewhere:
        await service.init_producer_id(THEIRS, 10_000)
    assert elsewhere.value.code is ErrorCode.NOT_COORDINATOR
    assert (await service.init_producer_id("", 10_000)).error is ErrorCode.INVALID_REQUEST

    init = await service.init_producer_id(OURS, 10_000)
    assert (init.error, init.producer_id, init.producer_epoch) == (ErrorCode.NONE, 1001, 0)
    assert fake.allocations == 1
    pid, epoch = init.producer_id, init.producer_epoch
    parts = [("t", 0), ("t", 1), ("u", 0)]
    await service.add_partitions_to_txn(OURS, pid, epoch, parts)
    await service.add_offsets_to_txn(OURS, pid, epoch, "g")
    with pytest.raises(LogMQError) as refused:
        await service.add_offsets_to_txn(OURS, pid, epoch, "")
    assert refused.value.code is ErrorCode.INVALID_GROUP_ID
    verified = await service.verify_partitions(OURS, pid, epoch, [("t", 1), ("v", 0)])
    assert verified == {("t", 1): ErrorCode.NONE, ("v", 0): ErrorCode.INVALID_TXN_STATE}
    offsets = ("__consumer_offsets", service.offsets_partition_for("g"))
    # t-1's leader is moving: it refuses twice, then takes the marker; u is deleted
    # meanwhile (its leader no longer knows it): done without a marker
    fake.sender.script[("t", 1)] = [ErrorCode.NOT_LEADER_OR_FOLLOWER] * 2
    fake.sender.script[("u", 0)] = [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION] * 100
    await service.end_txn(OURS, pid, epoch, commit=True)
    await wait_until(lambda: fake.sender.sent, what="markers sent")
    fake.image.drop_topic("u")
    service.on_partitions_changed(fake.image, changes())  # wakes the retry early
    await committed(service)
    first, *retries = fake.sender.sent
    assert set(first.partitions) == {("t", 0), ("t", 1), ("u", 0), offsets}
    assert len(retries) == 2 and all(("t", 1) in r.partitions for r in retries)
    assert retries[-1].partitions == (("t", 1),)
    assert {j.job_id for j in fake.sender.sent} == {first.job_id}

    # a restarted producer: the same id, the next epoch, no new producer id
    again = await service.init_producer_id(OURS, 10_000)
    assert (again.producer_id, again.producer_epoch, fake.allocations) == (pid, 1, 1)
    listed = await service.list_transactions(["CompleteCommit", "Bogus"])
    assert listed.unknown_state_filters == ["Bogus"]
    assert listed.transactions == []  # the bump made it Empty
    described = await service.describe_transactions([OURS, THEIRS, "nobody-d"])
    assert [d.error for d in described] == [
        ErrorCode.NONE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.TRANSACTIONAL_ID_NOT_FOUND,
    ]
    assert coordinator_partition("nobody-d", 2) == 0
    assert described[0].state == "Empty" and described[0].producer_epoch == 1
    assert service.stats() == 1
    await service.stop()


async def test_a_fenced_marker_abandons_the_job(fake):
    service = leading(fake)
    await active(service)
    pid = await begun(service)
    fake.sender.script[("t", 0)] = [ErrorCode.TRANSACTION_COORDINATOR_FENCED]
    await service.end_txn(OURS, pid, 0, commit=False)
    await wait_until(lambda: fake.sender.sent, what="markers sent")
    await asyncio.sleep(0.3)
    assert len(fake.sender.sent) == 1  # not retried
    assert (await describe(service)).state == "PrepareAbort"  # someone else's to finish
    await service.stop()


async def test_leadership_lost_then_regained_at_a_newer_epoch_finishes_the_commit(fake):
    service = leading(fake)
    await active(service)
    pid = await begun(service)
    never = asyncio.Event()
    real_send = fake.sender.send

    async def stuck(job):
        fake.sender.sent.append(job)
        await never.wait()
        return {}

    fake.sender.send = stuck  # type: ignore[method-assign]
    await service.end_txn(OURS, pid, 0, commit=True)
    await wait_until(lambda: fake.sender.sent, what="markers started")
    # another broker leads for a while; this one follows
    service.on_partitions_changed(
        fake.image, changes(followers=[registration(TXN_STATE_TOPIC, 0, leader=2, epoch=2)])
    )
    with pytest.raises(CoordinatorError) as moved:
        await service.end_txn(OURS, pid, 0, commit=True)
    assert moved.value.code is ErrorCode.NOT_COORDINATOR
    fake.sender.send = real_send  # type: ignore[method-assign]
    regained = registration(TXN_STATE_TOPIC, 0, epoch=3)
    fake.image.add(regained)
    service.on_partitions_changed(fake.image, changes(leaders=[regained]))
    shard = await active(service)
    assert shard.leader_epoch == 3
    await committed(service)
    assert fake.sender.sent[-1].coordinator_epoch == 3
    await service.end_txn(OURS, pid, 0, commit=True)
    await service.stop()
