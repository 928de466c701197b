"""Broker-side pieces of the metadata quorum that need no processes."""

from __future__ import annotations

import pytest

from logmq.broker.config import BrokerConfig
from logmq.broker.metadata.publisher import MetadataPublisher
from logmq.broker.metadata.quorum_service import MetadataQuorum
from logmq.cluster.metadata_image import EMPTY_IMAGE, MetadataDelta
from logmq.cluster.metadata_records import (
    PartitionChange,
    PartitionRecord,
    ProducerIdsBlock,
    RegisterBroker,
    TopicRecord,
)
from logmq.cluster.node_addresses import parse_voters
from logmq.errors import ErrorCode
from logmq.net.codec import ApiKey
from tests.harness import inprocess_broker
from tests.net.raw_client import RawClient


def test_parse_voters():
    assert parse_voters("1@127.0.0.1:9901, 2@localhost:9902") == {
        1: ("127.0.0.1", 9901),
        2: ("localhost", 9902),
    }
    for bad in ["", "1@host", "x@h:1", "1@h:0", "1@h:1,1@h:2", "1:9901", "@h:1"]:
        with pytest.raises(ValueError):
            parse_voters(bad)
    with pytest.raises(ValueError, match="listed twice"):
        BrokerConfig(quorum_voters="1@h:1,1@h:2")


def test_peer_addresses_override_where_a_peer_is_dialled(tmp_path):
    with pytest.raises(ValueError, match="peer address"):
        BrokerConfig(peer_addresses="2@h:1,oops")
    assert BrokerConfig(peer_addresses="2@h:1").peer_addresses == "2@h:1"
    quorum = MetadataQuorum(
        1, tmp_path, None, lambda: None, peer_addresses={2: ("127.0.0.1", 7002)}
    )
    assert quorum.broker_address(2) is None  # not registered: nobody to dial
    delta = MetadataDelta(EMPTY_IMAGE)
    for record in (RegisterBroker(2, 1, "b", "10.0.0.2", 9092), RegisterBroker(3, 1, "c", "h3", 9)):
        delta.replay(record)
    quorum.loader.image = delta.apply(1)
    assert quorum.broker_address(2) == ("127.0.0.1", 7002)  # the override
    assert quorum.broker_address(3) == ("h3", 9)  # unlisted: the registered address


async def test_a_node_elected_but_not_yet_controller_never_calls_itself(tmp_path):
    """Between winning the Raft election and loading as the active controller, the
    controller id is this node's own: a forwarded request sent to its own port was
    forwarded there again and again until the first copy timed out (15 s)."""
    from types import SimpleNamespace

    from logmq.errors import LogMQError

    quorum = MetadataQuorum(1, tmp_path, None, lambda: ("127.0.0.1", 9))
    delta = MetadataDelta(EMPTY_IMAGE)
    delta.replay(RegisterBroker(1, 1, "a", "127.0.0.1", 9))
    quorum.loader.image = delta.apply(1)
    quorum.raft = SimpleNamespace(running=True, leader_id=1)  # elected, not loaded
    assert quorum.controller_id == 1 and not quorum.is_controller
    with pytest.raises(LogMQError) as e:
        await quorum.call_controller(ApiKey.CREATE_TOPICS, {"topic": "t"})
    assert e.value.code is ErrorCode.NOT_CONTROLLER and e.value.retriable


class Recorder:
    def __init__(self):
        self.calls = []

    def on_partitions_changed(self, image, changes):
        self.calls.append(changes)


def test_publisher_turns_deltas_and_restores_into_local_changes():
    pub = MetadataPublisher(2)
    rec = Recorder()
    pub.add_listener(rec)
    records = [
        RegisterBroker(1, 1, "a", "h", 1),
        RegisterBroker(2, 1, "b", "h", 2),
        TopicRecord("t", "id"),
        PartitionRecord("t", 0, (1, 2), (1, 2), 1, 0, 0),
        PartitionRecord("t", 1, (2, 1), (2, 1), 2, 0, 0),
    ]
    delta = MetadataDelta(EMPTY_IMAGE)
    for r in records:
        delta.replay(r)
    image = delta.apply(1)
    pub.publish(image, delta)
    first = rec.calls[-1]
    assert set(first.leaders) == {("t", 1)} and set(first.followers) == {("t", 0)}
    # a new leader for t-0: this broker leads it now, with the bumped epoch
    delta = MetadataDelta(image)
    delta.replay(PartitionChange("t", 0, leader=2, isr=(2,)))
    image = delta.apply(2)
    pub.publish(image, delta)
    assert rec.calls[-1].leaders[("t", 0)].leader_epoch == 1
    # after a snapshot restore there is no delta: the whole image is compared
    pub.local[("gone", 0)] = pub.local[("t", 0)]
    pub.publish(image, None)
    assert rec.calls[-1].deleted == {("gone", 0)}
    assert set(rec.calls[-1].leaders) == {("t", 0), ("t", 1)}


def test_producer_id_blocks_never_go_back():
    image = EMPTY_IMAGE.apply([ProducerIdsBlock(1, 100)])
    assert image.next_producer_id == 100
    assert image.apply([ProducerIdsBlock(2, 200)]).next_producer_id == 200
    assert EMPTY_IMAGE.apply(image.to_records()).next_producer_id == 100  # snapshots
    with pytest.raises(ValueError):
        image.apply([ProducerIdsBlock(2, 50)])


async def test_single_node_is_a_quorum_of_one(tmp_path):
    async with inprocess_broker(tmp_path / "d") as br, await RawClient.connect(br.port) as c:
        assert br.quorum.is_controller and br.quorum.voters is None
        cluster = (await c.call(ApiKey.DESCRIBE_CLUSTER, {})).body
        assert cluster["controller_id"] == 1 and cluster["cluster_id"] == br.cluster_id
        assert [b["node_id"] for b in cluster["brokers"]] == [1]
        quorum = (await c.call(ApiKey.DESCRIBE_QUORUM, {})).body
        assert quorum["leader_id"] == 1 and [v["node_id"] for v in quorum["voters"]] == [1]
        # broker-to-controller APIs check the broker epoch
        r = await c.call(
            ApiKey.ALLOCATE_PRODUCER_IDS, {"broker_id": 1, "broker_epoch": 99, "count": 5}
        )
        assert r.body["error"] == ErrorCode.STALE_BROKER_EPOCH
    cluster_id = br.cluster_id
    async with inprocess_broker(tmp_path / "d") as br:
        assert br.cluster_id == cluster_id  # kept across restarts
        assert "cluster.id=" + cluster_id in (tmp_path / "d" / "meta.properties").read_text()


async def test_the_transport_handshake_tells_where_a_dialer_listens():
    from logmq.replication.raft_transport import TcpTransport
    from tests.harness import wait_until

    heard: dict[int, tuple[str, int]] = {}
    voter = TcpTransport(
        1, ("127.0.0.1", 0), {}, voters=[1], on_peer_hello=lambda n, a: heard.update({n: a})
    )
    await voter.start(lambda data: None)
    assert voter.port is not None
    observer = TcpTransport(2, ("127.0.0.1", 0), {1: ("127.0.0.1", voter.port)}, voters=[1])
    await observer.start(lambda data: None)
    try:
        await wait_until(lambda: 2 in heard, what="the observer's hello")
        assert heard[2] == ("127.0.0.1", observer.port)
    finally:
        await observer.stop()
        await voter.stop()
