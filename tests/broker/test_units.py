"""Pure pieces of the broker: fetch parking, producer ids, metadata files, settings."""

from __future__ import annotations

import asyncio

import pytest

from logmq.broker.config import BrokerConfig
from logmq.broker.metadata.producer_ids import ProducerIdManager
from logmq.broker.replica.fetch_waiter import FetchWaiters
from logmq.cluster.meta_properties import (
    MetaProperties,
    NodeIdMismatchError,
    check_meta_properties,
    check_node_id,
    parse_properties,
)
from logmq.cluster.topic_names import topic_name_error
from tests.harness import wait_until


async def test_waiter_woken_by_notify_on_any_partition():
    w = FetchWaiters()
    task = asyncio.ensure_future(w.wait([("a", 0), ("b", 1)], 30))
    await wait_until(lambda: w.parked == 1, what="parked")
    w.notify(("b", 1))
    assert await task is True
    assert w.parked == 0


async def test_waiter_times_out_and_cleans_up():
    w = FetchWaiters()
    assert await w.wait([("a", 0)], 0.01) is False
    assert w.parked == 0
    assert await w.wait([("a", 0)], 0) is False


async def test_wake_all_releases_and_never_parks_again():
    w = FetchWaiters()
    task = asyncio.ensure_future(w.wait([("a", 0)], 30))
    await wait_until(lambda: w.parked == 1, what="parked")
    w.wake_all()
    assert await task is False  # shut down: answer now
    assert await w.wait([("a", 0)], 30) is False  # returns at once, no busy re-park
    assert w.closed


async def test_producer_ids_come_in_allocated_blocks():
    allocated = [0]  # what the metadata log says is taken

    async def allocate(count: int) -> int:
        start = allocated[0]
        allocated[0] += count
        return start

    ids = ProducerIdManager(allocate, lambda: allocated[0], block_size=3)
    first = [await ids.next_id() for _ in range(4)]
    assert first == [0, 1, 2, 3] and allocated[0] == 6
    again = ProducerIdManager(allocate, lambda: allocated[0], block_size=3)  # a restart
    assert await again.next_id() == 6  # the rest of the old block is skipped, never reused
    assert again.was_issued(5) and not again.was_issued(9)


def test_meta_properties(tmp_path):
    check_node_id(tmp_path, 3)  # nothing recorded yet
    meta = check_meta_properties(tmp_path, 3, "cluster-a")
    assert meta == MetaProperties(3, "cluster-a")
    assert check_meta_properties(tmp_path, 3, "cluster-a") == meta
    assert parse_properties(meta.encode().decode()) == {
        "node.id": "3",
        "cluster.id": "cluster-a",
        "format.version": "1",
    }
    check_node_id(tmp_path, 3)
    with pytest.raises(NodeIdMismatchError, match=r"node\.id=3"):
        check_node_id(tmp_path, 4)
    (tmp_path / "meta.properties").write_text("node.id=3\nformat.version=9\n")
    with pytest.raises(NodeIdMismatchError, match=r"format\.version=9"):
        check_node_id(tmp_path, 3)


@pytest.mark.parametrize("name", ["", ".", "..", "a b", "x" * 250, "é", "a/b", None])
def test_bad_topic_names(name):
    assert topic_name_error(name)


@pytest.mark.parametrize("name", ["a", "A.b_c-9", "x" * 249, "__consumer_offsets"])
def test_good_topic_names(name):
    assert topic_name_error(name) is None


def test_config_validation():
    with pytest.raises(ValueError, match="port"):
        BrokerConfig(port=70000)
    with pytest.raises(ValueError, match="max_in_flight"):
        BrokerConfig(max_in_flight_per_connection=0)
    assert BrokerConfig(advertised_host=None, host="0.0.0.0").advertised == "0.0.0.0"


def test_configuration_doc_covers_every_option_and_topic_config():
    from pathlib import Path

    from logmq.storage.config import STORED_CONFIG_KEYS, TOPIC_CONFIG_KEYS
    from logmq_cli.server import main

    doc = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    for key in TOPIC_CONFIG_KEYS:
        assert f"`{key.name}`" in doc, key.name
    stored = doc[doc.index("#### Kafka topic configs stored with no effect") :]
    for kept in STORED_CONFIG_KEYS:  # each in the table of configs logmq does not act on
        assert f"| `{kept.name}` |" in stored, kept.name
        assert f"`{kept.default}`" in stored or not kept.default, kept.name
    for param in main.params:
        assert f"`{param.opts[0]}" in doc, param.opts[0]
