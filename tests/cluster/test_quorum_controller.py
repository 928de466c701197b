"""The pieces together: a controller on the ready quorum leader, images on every member.

Three RaftServices (in-process network) apply record batches to MetadataLoaders. Whoever
is the ready leader builds a Controller from its committed image, and each decision is
proposed as one entry. After the leader stops, the next one starts over from its own
committed image and carries on: nothing the first controller committed is lost, and all
members end with the same image.
"""

from __future__ import annotations

from logmq.cluster.controller import Controller
from logmq.cluster.controller_api import ControllerConfig, NewTopic
from logmq.cluster.metadata_loader import MetadataLoader
from logmq.cluster.metadata_records import encode_records
from logmq.errors import ErrorCode
from logmq.replication.raft_service import RaftService
from tests.harness import wait_until
from tests.replication.test_raft_service import FAST, MemoryNetwork

CONFIG = ControllerConfig(session_timeout_ms=1_000, auto_leader_rebalance=False)


async def ready_leader(services: dict[int, RaftService]) -> int:
    def find() -> int | None:
        for node_id, s in services.items():
            if s.running and s.leadership.is_ready_leader:
                return node_id
        return None

    await wait_until(lambda: find() is not None, 10, "a ready quorum leader")
    node_id = find()
    assert node_id is not None
    return node_id


async def commit(service: RaftService, result) -> object:
    if result.records:
        await service.propose(encode_records(result.records))
    return result.response


async def test_controller_decisions_survive_a_quorum_leader_change(tmp_path):
    net = MemoryNetwork()
    loaders = {i: MetadataLoader() for i in (1, 2, 3)}
    services = {
        i: RaftService(i, [1, 2, 3], tmp_path / str(i), net.transport(i), loaders[i], config=FAST)
        for i in (1, 2, 3)
    }
    try:
        for s in services.values():
            await s.start()
        first = await ready_leader(services)
        controller = Controller(loaders[first].image, 0, CONFIG)
        cluster_id = await commit(services[first], controller.bootstrap("cluster-x"))
        assert cluster_id == "cluster-x"
        for b in (1, 2, 3):
            reg = await commit(
                services[first], controller.register_broker(b, f"i{b}", "127.0.0.1", b, 0)
            )
            await commit(
                services[first], controller.heartbeat(b, reg.broker_epoch, 0, caught_up=True)
            )
        created = await commit(services[first], controller.create_topics([NewTopic("t", 3, 3)]))
        assert created["t"].error is ErrorCode.NONE
        await wait_until(
            lambda: all("t" in loader.image.topics for loader in loaders.values()), 10, "images"
        )
        # The quorum leader goes away; the next controller starts from what committed.
        await services[first].stop()
        second = await ready_leader(services)
        assert second != first
        successor = Controller(loaders[second].image, 10_000, CONFIG)
        assert successor.bootstrap().response == "cluster-x"  # chosen once
        for b in (1, 2, 3):
            if b != first:
                await commit(
                    services[second],
                    successor.heartbeat(b, loaders[second].image.brokers[b].broker_epoch, 10_500),
                )
        await commit(services[second], successor.tick(11_001))  # broker `first` expired
        image = loaders[second].image
        assert not image.is_active(first)
        for p in range(3):
            part = image.partition("t", p)
            assert part.leader != first and first not in part.isr
        await services[first].start()  # the old leader rejoins and catches up
        await wait_until(
            lambda: loaders[first].image == loaders[second].image, 10, "identical images"
        )
    finally:
        for s in services.values():
            await s.stop(transfer_leadership=False)
