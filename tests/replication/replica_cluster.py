"""In-process brokers with replica managers and a static controller (no Raft).

Each ``Node`` is a small broker (storage, DataApi, TcpServer) on a loopback port plus
a ``ReplicaManager`` whose fetchers connect to the other nodes over real sockets.
``StaticController`` plays the controller's part for a fixed assignment: it applies
AlterPartition with the epoch checks the real controller makes, elects leaders on
demand, and publishes every change to the live nodes, so replication is tested
without the metadata quorum.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from logmq.broker.config import BrokerConfig
from logmq.broker.metrics import BrokerMetrics
from logmq.broker.replica.consumer_reads import ConsumerReads
from logmq.broker.replica.fetch_waiter import FetchWaiters
from logmq.broker.replica.fetcher import FetcherConfig
from logmq.broker.replica.follower_reads import FollowerReads
from logmq.broker.replica.leader_appends import LeaderAppends
from logmq.broker.replica.produce_path import ProducePath
from logmq.broker.replica.record_deletion import RecordDeletion
from logmq.broker.replica.replica_manager import PartitionChange, ReplicaManager, ReplicationConfig
from logmq.client.connection import BrokerConnection
from logmq.cluster.controller_api import AlterPartitionRequest, AlterPartitionResponse
from logmq.errors import ErrorCode, LogMQError
from logmq.native.data_api import DataApi
from logmq.net.codec import ApiKey, Request
from logmq.net.reply import Reply
from logmq.net.server import ServerOptions, TcpServer
from logmq.storage import batch as b
from logmq.storage.log_manager import LogManager

TOPIC = "t"
Key = tuple[str, int]


class MiniBroker:
    """DataApi over real logs, waiters and a server, without the metadata quorum.

    It is also DataApi's leader-log lookup (every local log leads) and its topic creator
    (which creates nothing).
    """

    def __init__(self, node_id: int, data_dir: Path, configs: dict[str, str]) -> None:
        self.config = BrokerConfig(data_dir=data_dir, port=0, node_id=node_id)
        self.topic_configs = configs
        self.logs = LogManager(data_dir)
        self.waiters = FetchWaiters()
        self.metrics = BrokerMetrics()
        self.server = TcpServer(
            self.handle,
            ServerOptions(max_frame_size=self.config.max_frame_size),
            self.metrics,
            is_concurrent=lambda req: req.api_key == ApiKey.PRODUCE,
        )
        self._handlers: dict[int, Any] = {}

    @property
    def port(self) -> int:
        return self.server.port

    async def start(
        self,
        keys: list[Key],
        make_replicas: Callable[[LogManager, FetchWaiters], ReplicaManager],
        port: int = 0,
    ) -> None:
        self.image = SimpleNamespace(topics={topic for topic, _ in keys})  # no auto-create
        await self.logs.start()
        for topic, partition in keys:
            self.logs.create_log(topic, partition, dict(self.topic_configs))
        self.replicas = make_replicas(self.logs, self.waiters)
        appends = LeaderAppends(self.replicas)
        produce_path = ProducePath(
            self.replicas,
            appends,
            lambda: self.image,  # type: ignore[arg-type,return-value]
            self,
        )
        self.data = DataApi(
            produce_path=produce_path,
            replicas=self.replicas,
            reads=ConsumerReads(self.replicas),
            follower_reads=FollowerReads(self.replicas),
            deletions=RecordDeletion(self.replicas),
            metrics=self.metrics,
            max_fetch_wait_ms=self.config.max_fetch_wait_ms,
        )
        self._handlers = {
            ApiKey.PRODUCE: self.data.produce,
            ApiKey.FETCH: self.data.fetch,
            ApiKey.LIST_OFFSETS: self.data.list_offsets,
            ApiKey.OFFSET_FOR_LEADER_EPOCH: self.data.offsets_for_leader_epoch,
        }
        await self.server.start("127.0.0.1", port)

    async def stop(self) -> None:
        await self.server.stop(1.0, self.waiters.wake_all)
        await self.logs.stop()

    def leader_log(self, topic: str, partition: int):
        return self.logs.get_log(topic, partition)

    def local_log(self, topic: str, partition: int):
        return self.logs.get_log(topic, partition)

    def maybe_auto_create(self, topic: str) -> None:
        return None

    async def auto_create(self, topic: str) -> None:
        return None

    async def handle(self, request: Request) -> Reply | None:
        try:
            return await self._handlers[request.api_key](request)
        except LogMQError as e:
            return Reply({"error": int(e.code), "message": str(e)})


class Node:
    def __init__(self, cluster: ReplicaCluster, node_id: int, data_dir: Path) -> None:
        self.cluster = cluster
        self.id = node_id
        self.data_dir = data_dir
        self.broker: MiniBroker | None = None
        self.rm: ReplicaManager | None = None

    @property
    def alive(self) -> bool:
        return self.broker is not None

    async def start(self) -> None:
        state = self.cluster.controller.state
        self.broker = broker = MiniBroker(self.id, self.data_dir, self.cluster.configs)
        await broker.start(
            list(state),
            lambda logs, waiters: ReplicaManager(
                self.id,
                logs,
                waiters,
                alter_partitions=self.cluster.controller.alter_partitions,
                broker_address=self.cluster.address,
                leader_logs=broker,
                metadata=lambda: broker.image,  # type: ignore[return-value]
                config=self.cluster.replication,
            ),
        )
        self.rm = self.broker.replicas
        await self.rm.start()
        await self.rm.apply_changes(
            self.cluster.controller.change_for(self.id, s) for s in state.values()
        )

    async def stop(self) -> None:
        """A crash as far as replication goes: nothing is handed over."""
        if self.rm is not None and not self.rm.stopped:
            await self.rm.stop()
        if self.broker is not None:
            await self.broker.stop()
        self.rm = self.broker = None

    def log(self, key: Key = (TOPIC, 0)):
        assert self.broker is not None
        return self.broker.local_log(*key)

    def log_bytes(self, key: Key = (TOPIC, 0), start: int | None = None) -> bytes:
        plog = self.log(key)
        region = plog.read(plog.log_start_offset if start is None else start, 1 << 30)
        return b"" if region is None else bytes(region.read())


@dataclasses.dataclass
class StaticController:
    state: dict[Key, PartitionChange] = dataclasses.field(default_factory=dict)
    nodes: dict[int, Node] = dataclasses.field(default_factory=dict)
    alter_requests: int = 0

    @staticmethod
    def change_for(node_id: int, s: PartitionChange) -> PartitionChange:
        role = "leader" if s.leader == node_id else "follower"
        return dataclasses.replace(s, role=role)

    async def publish(self, key: Key) -> None:
        s = self.state[key]
        for node in list(self.nodes.values()):
            if node.rm is not None and node.id in s.replicas:
                await node.rm.apply_changes([self.change_for(node.id, s)])

    async def alter_partitions(
        self, reqs: list[AlterPartitionRequest]
    ) -> list[AlterPartitionResponse]:
        return [await self.alter_partition(r) for r in reqs]

    async def alter_partition(self, req: AlterPartitionRequest) -> AlterPartitionResponse:
        self.alter_requests += 1
        key = (req.topic, req.partition)
        s = self.state[key]
        if req.broker_id != s.leader or req.leader_epoch != s.leader_epoch:
            return AlterPartitionResponse(ErrorCode.FENCED_LEADER_EPOCH)
        if req.partition_epoch != s.partition_epoch:
            return AlterPartitionResponse(ErrorCode.INVALID_UPDATE_VERSION)
        if s.leader not in req.new_isr or not set(req.new_isr) <= set(s.replicas):
            return AlterPartitionResponse(ErrorCode.INELIGIBLE_REPLICA)
        new = dataclasses.replace(s, isr=tuple(req.new_isr), partition_epoch=s.partition_epoch + 1)
        self.state[key] = new
        await self.publish(key)
        return AlterPartitionResponse(ErrorCode.NONE, partition=new)  # type: ignore[arg-type]

    async def fence(self, node_id: int, key: Key = (TOPIC, 0)) -> None:
        """A broker died: out of the ISR (unless last), its leadership moves in the ISR."""
        s = self.state[key]
        isr = tuple(r for r in s.isr if r != node_id) or s.isr
        leader, epoch = s.leader, s.leader_epoch
        if leader in (node_id, -1):
            alive = [r for r in isr if r != node_id and self.nodes[r].alive]
            leader, epoch = (alive[0] if alive else -1), epoch + 1
        self.state[key] = dataclasses.replace(
            s, leader=leader, leader_epoch=epoch, partition_epoch=s.partition_epoch + 1, isr=isr
        )
        await self.publish(key)

    async def unfence(self, node_id: int, key: Key = (TOPIC, 0)) -> None:
        """A broker is back: it leads an offline partition whose last ISR it was in."""
        s = self.state[key]
        if s.leader == -1 and node_id in s.isr:
            self.state[key] = dataclasses.replace(
                s,
                leader=node_id,
                leader_epoch=s.leader_epoch + 1,
                partition_epoch=s.partition_epoch + 1,
            )
            await self.publish(key)

    async def elect(self, key: Key, leader: int, isr: tuple[int, ...] | None = None) -> None:
        s = self.state[key]
        isr = isr if isr is not None else tuple(r for r in s.isr if r != s.leader) or (leader,)
        assert leader in isr
        self.state[key] = dataclasses.replace(
            s,
            leader=leader,
            leader_epoch=s.leader_epoch + 1,
            partition_epoch=s.partition_epoch + 1,
            isr=isr,
        )
        await self.publish(key)


class ReplicaCluster:
    def __init__(
        self,
        tmp: Path,
        n: int = 3,
        *,
        configs: dict[str, str] | None = None,
        lag_ms: int = 30_000,
    ) -> None:
        self.configs = configs or {"min.insync.replicas": "2"}
        # Fetch long polls well below the lag time, as in production (500 ms vs 30 s).
        self.replication = ReplicationConfig(
            replica_lag_time_max_ms=lag_ms,
            tick_ms=20,
            fetcher=FetcherConfig(max_wait_ms=min(500, lag_ms // 5)),
        )
        self.controller = StaticController()
        self.nodes = {i: Node(self, i, tmp / f"node{i}") for i in range(1, n + 1)}
        self.controller.nodes = self.nodes
        replicas = tuple(self.nodes)
        self.controller.state[(TOPIC, 0)] = PartitionChange(
            TOPIC, 0, "leader", leader=1, leader_epoch=0, partition_epoch=0,
            replicas=replicas, isr=replicas,
        )  # fmt: skip

    def address(self, node_id: int) -> tuple[str, int] | None:
        node = self.nodes.get(node_id)
        if node is None or node.broker is None:
            return None
        return ("127.0.0.1", node.broker.port)

    @property
    def partition(self) -> PartitionChange:
        return self.controller.state[(TOPIC, 0)]

    async def start(self) -> None:
        for node in self.nodes.values():
            await node.start()

    async def stop(self) -> None:
        for node in self.nodes.values():  # fetchers first: no server waits on them
            if node.rm is not None:
                await node.rm.stop()
        for node in self.nodes.values():
            await node.stop()

    async def connect(self, node_id: int) -> BrokerConnection:
        address = self.address(node_id)
        assert address is not None
        return await BrokerConnection.open(*address)


async def produce(
    conn: BrokerConnection, values: list[bytes], *, acks: int = -1, timeout_ms: int = 10_000
) -> tuple[ErrorCode, int]:
    batch = b.encode_batch([(1, None, v, None) for v in values])
    body = {
        "acks": acks,
        "timeout_ms": timeout_ms,
        "topics": [{"topic": TOPIC, "partitions": [{"partition": 0, "size": len(batch)}]}],
    }
    resp = await conn.request(ApiKey.PRODUCE, body, [batch], timeout=timeout_ms / 1000 + 10)
    r = resp.body["topics"][0]["partitions"][0]
    return ErrorCode(r["error"]), r["base_offset"]


def values_of(data: bytes) -> list[bytes]:
    out = []
    for pos, _ in b.iter_headers(data):
        out += [rec[3] for rec in b.decode_records(data, pos)]
    return out
