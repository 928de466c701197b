"""The admin client's reassignment calls: alter/cancel moves, the throttle, listings,
DescribeLogDirs and leader elections, async and blocking.

Against one real broker (a quorum of one) for the calls and refusals, and one small
cluster where a move cannot finish (its new replica is down) so that a move in
progress can be looked at, refused a second time and cancelled. Moves that complete
under load are in tests/cluster/test_reassignment_e2e.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from logmq import Admin, AsyncAdmin, AsyncProducer
from logmq.client import reassignment_admin as ra
from logmq.errors import ErrorCode, LogMQError, ReassignmentError
from logmq.net.codec import ApiKey
from tests.harness import BrokerCluster
from tests.net.raw_client import RawClient

E = ErrorCode
DEADLINE_S = 30.0


# -- request bodies and answers (no broker) ------------------------------------------------


def test_alter_body_normalises_moves_and_throttle():
    body = ra.alter_body({("t", 0): (3, 1), ("u", 2): None}, 1024)
    assert body == {
        "partitions": [
            {"topic": "t", "partition": 0, "replicas": [3, 1]},
            {"topic": "u", "partition": 2, "replicas": None},
        ],
        "throttle_bytes_per_sec": 1024,
    }
    assert ra.alter_body({}, None) == {"partitions": [], "throttle_bytes_per_sec": None}
    assert ra.partitions_filter(None) is None
    assert ra.partitions_filter([("t", 1)]) == [{"topic": "t", "partition": 1}]


def test_check_alter_response_names_every_refused_partition():
    ra.check_alter_response({"error": 0, "message": None, "partitions": []})
    ok = {"topic": "t", "partition": 0, "error": 0, "message": None}
    with pytest.raises(ReassignmentError) as err:
        ra.check_alter_response(
            {
                "error": int(E.BROKER_NOT_AVAILABLE),
                "message": "t-1: unknown broker(s) [9]; no partition u-0 (nothing was started)",
                "partitions": [
                    ok,
                    {"topic": "t", "partition": 1, "error": 8, "message": "t-1: unknown [9]"},
                    {"topic": "u", "partition": 0, "error": 3, "message": None},
                    {"topic": "v", "partition": 0, "error": 99999, "message": "odd"},
                ],
            }
        )
    e = err.value
    assert e.code is E.BROKER_NOT_AVAILABLE
    assert e.partitions == {
        ("t", 1): (E.BROKER_NOT_AVAILABLE, "t-1: unknown [9]"),
        ("u", 0): (E.UNKNOWN_TOPIC_OR_PARTITION, "u-0: UNKNOWN_TOPIC_OR_PARTITION"),
        ("v", 0): (E.UNKNOWN_SERVER_ERROR, "odd"),
    }
    assert "t-1: unknown [9]" in str(e) and "u-0" in str(e) and "odd" in str(e)
    # a request-level refusal with no partition named (a bad throttle)
    with pytest.raises(ReassignmentError) as err:
        ra.check_alter_response({"error": 42, "message": "bad throttle", "partitions": []})
    assert (err.value.code, err.value.partitions) == (E.INVALID_REQUEST, {})
    assert "bad throttle" in str(err.value)
    # a refused partition without an overall code still raises, with that code
    with pytest.raises(ReassignmentError) as err:
        ra.check_alter_response({"error": 0, "partitions": [{**ok, "error": 60}]})
    assert err.value.code is E.REASSIGNMENT_IN_PROGRESS


def test_listing_log_dirs_and_elections_are_parsed():
    listing = ra.parse_listing(
        {
            "error": 0,
            "throttle_bytes_per_sec": 5000,
            "partitions": [
                {
                    "topic": "t",
                    "partition": 0,
                    "replicas": [1, 2, 3, 4],
                    "isr": [1, 2, 3],
                    "leader": 1,
                    "adding_replicas": [4],
                    "removing_replicas": [1],
                    "target_replicas": [2, 3, 4],
                }
            ],
        }
    )
    assert listing.throttle_bytes_per_sec == 5000
    moving = listing.partitions[("t", 0)]
    assert (moving.adding_replicas, moving.removing_replicas) == ([4], [1])
    assert moving.target_replicas == [2, 3, 4] and moving.replicas == [1, 2, 3, 4]
    dirs = ra.parse_log_dirs(
        {
            "broker_id": 2,
            "partitions": [
                {
                    "topic": "t",
                    "partition": 0,
                    "size": 10,
                    "log_start_offset": 0,
                    "log_end_offset": 4,
                }
            ],
        }
    )
    assert dirs == {("t", 0): ra.LogDirPartition("t", 0, 10, 0, 4)}
    elections = ra.parse_elections(
        {"partitions": [{"topic": "t", "partition": 1, "error": 84, "message": None}]}
    )
    assert elections == {("t", 1): (E.ELECTION_NOT_NEEDED, "")}


# -- one broker ----------------------------------------------------------------------------


async def test_refusals_raise_reassignment_error_and_start_nothing(shared_broker, topic_name):
    async with AsyncAdmin(shared_broker.bootstrap) as admin:
        await admin.create_topic(topic_name, 2)
        await admin.alter_partition_reassignments({(topic_name, 0): [1], (topic_name, 1): [1]})

        with pytest.raises(ReassignmentError) as err:
            await admin.alter_partition_reassignments(
                {
                    (topic_name, 0): [1],
                    (topic_name, 1): [1, 1],
                    (topic_name, 7): [1],
                    ("missing-topic", 0): [2],
                }
            )
        e = err.value
        assert e.code is E.INVALID_REPLICA_ASSIGNMENT  # the first refusal
        assert set(e.partitions) == {(topic_name, 1), (topic_name, 7), ("missing-topic", 0)}
        assert e.partitions[(topic_name, 7)][0] is E.UNKNOWN_TOPIC_OR_PARTITION
        for t, p in e.partitions:
            assert f"{t}-{p}" in str(e)

        with pytest.raises(ReassignmentError) as err:
            await admin.alter_partition_reassignments({(topic_name, 0): None})  # not moving
        assert err.value.code is E.NO_REASSIGNMENT_IN_PROGRESS
        with pytest.raises(ReassignmentError) as err:
            await admin.alter_partition_reassignments({(topic_name, 0): [1, 5]})
        assert err.value.code is E.INVALID_REPLICA_ASSIGNMENT
        with pytest.raises(ReassignmentError) as err:
            await admin.set_reassignment_throttle(-5)
        assert err.value.code is E.INVALID_REQUEST

        # nothing moves, and a throttle with nothing moving is dropped at once
        await admin.set_reassignment_throttle(10_000)
        listing = await admin.list_partition_reassignments()
        assert (listing.throttle_bytes_per_sec, listing.partitions) == (None, {})
        listing = await admin.list_partition_reassignments([(topic_name, 0)])
        assert listing.partitions == {}
        desc = (await admin.describe_topics([topic_name]))[topic_name]
        assert all(
            (p.replicas, p.adding_replicas, p.removing_replicas) == ([1], [], [])
            for p in desc.partitions
        )


async def test_describe_log_dirs_and_elect_leaders(shared_broker, topic_name):
    async with AsyncAdmin(shared_broker.bootstrap) as admin:
        await admin.create_topic(topic_name, 2)
        async with AsyncProducer(shared_broker.bootstrap) as producer:
            await producer.send_batch(topic_name, [b"x" * 100] * 40, partition=1)
        dirs = await admin.describe_log_dirs(1, [(topic_name, 0), (topic_name, 1)])
        assert dirs[(topic_name, 0)] == ra.LogDirPartition(topic_name, 0, 0, 0, 0)
        one = dirs[(topic_name, 1)]
        assert (one.log_start_offset, one.log_end_offset) == (0, 40) and one.size > 4000
        everything = await admin.describe_log_dirs(1)
        assert everything[(topic_name, 1)] == one
        assert await admin.describe_log_dirs(1, [("no-such-topic", 0)]) == {}
        with pytest.raises(LogMQError) as err:
            await admin.describe_log_dirs(42)
        assert err.value.code is E.BROKER_NOT_AVAILABLE

        wanted = [(topic_name, 0), (topic_name, 1), (topic_name, 9)]
        for unclean in (False, True):
            results = await admin.elect_leaders(wanted, unclean=unclean)
            assert {tp: code for tp, (code, _msg) in results.items()} == {
                (topic_name, 0): E.ELECTION_NOT_NEEDED,
                (topic_name, 1): E.ELECTION_NOT_NEEDED,
                (topic_name, 9): E.UNKNOWN_TOPIC_OR_PARTITION,
            }
        assert await admin.elect_leaders() == {}


def test_blocking_admin_has_the_same_calls(shared_broker, topic_name):
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic(topic_name, 1)
        admin.alter_partition_reassignments({(topic_name, 0): [1]}, throttle_bytes_per_sec=0)
        with pytest.raises(ReassignmentError) as err:
            admin.alter_partition_reassignments({(topic_name, 0): [3]})
        assert err.value.partitions[(topic_name, 0)][0] is E.INVALID_REPLICA_ASSIGNMENT
        admin.set_reassignment_throttle(0)
        assert admin.list_partition_reassignments().partitions == {}
        assert admin.list_partition_reassignments([(topic_name, 0)]).throttle_bytes_per_sec is None
        assert admin.describe_log_dirs(1, [(topic_name, 0)])[(topic_name, 0)].log_end_offset == 0
        results = admin.elect_leaders([(topic_name, 0)])
        assert results[(topic_name, 0)][0] is E.ELECTION_NOT_NEEDED


# -- a move in progress (three brokers, the new replica down) ------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[BrokerCluster]:
    c = BrokerCluster(
        3, base_dir=tmp_path_factory.mktemp("reassign-client"), log_level="warning"
    ).start()
    try:
        yield c
    finally:
        c.close()


async def until(probe: Callable[[], Awaitable[Any]], done: Callable[[Any], bool], what: str):
    """Re-run ``probe`` until ``done`` holds for its answer (a deadline, no fixed sleeps)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while True:
        try:
            last = await probe()
            if done(last):
                return last
        except LogMQError as e:  # a cluster settling after a broker went away
            if not e.retriable:
                raise
            last = e
        assert loop.time() < deadline, f"timed out waiting for {what}; last: {last!r}"
        await asyncio.sleep(0.05)


async def test_a_move_in_progress_is_listed_refused_again_and_cancelled(cluster):
    topic = "moving"
    async with AsyncAdmin(cluster.bootstrap) as admin:
        controller = (await admin.describe_cluster())["controller_id"]
        await admin.create_topic(topic, 1, replication_factor=1)
        [part] = (await admin.describe_topics([topic]))[topic].partitions
        source = part.leader
        # the new replica: a broker that is neither the controller nor the source, and
        # is down, so the move cannot finish
        down = next(n for n in cluster.nodes if n not in (controller, source))
        cluster.nodes[down].kill()
        async with AsyncProducer(cluster.bootstrap) as producer:
            await producer.send_batch(topic, [b"r"] * 25, partition=0)

        tp = (topic, 0)
        await admin.alter_partition_reassignments({tp: [down]}, throttle_bytes_per_sec=4096)
        listing = await admin.list_partition_reassignments()
        assert listing.throttle_bytes_per_sec == 4096
        moving = listing.partitions[tp]
        assert moving.replicas == [source, down] and moving.target_replicas == [down]
        assert (moving.adding_replicas, moving.removing_replicas) == ([down], [source])
        assert moving.leader == source and down not in moving.isr
        assert (await admin.list_partition_reassignments([tp])).partitions == {tp: moving}

        [desc] = (await admin.describe_topics([topic]))[topic].partitions
        assert (desc.adding_replicas, desc.removing_replicas) == ([down], [source])
        assert desc.log_end_offset == 25

        # any broker takes controller requests: a non-controller forwards them
        other = next(n for n in cluster.nodes if n not in (controller, down))
        async with await RawClient.connect(cluster.nodes[other].port) as raw:
            again = {"partitions": [{"topic": topic, "partition": 0, "replicas": [source]}]}
            out = (await raw.call(ApiKey.ALTER_PARTITION_REASSIGNMENTS, again)).body
            assert out["error"] == E.REASSIGNMENT_IN_PROGRESS, out
            listed = (await raw.call(ApiKey.LIST_PARTITION_REASSIGNMENTS, {})).body
            assert [(p["topic"], p["partition"]) for p in listed["partitions"]] == [tp]
        with pytest.raises(ReassignmentError) as err:
            await admin.alter_partition_reassignments({tp: [source, down]})
        assert err.value.code is E.REASSIGNMENT_IN_PROGRESS

        await admin.set_reassignment_throttle(8192)  # adjusted while the move runs
        assert (await admin.list_partition_reassignments()).throttle_bytes_per_sec == 8192

        # cancel: back to the original replica, and the throttle goes with the last move
        await admin.alter_partition_reassignments({tp: None})
        listing = await until(
            admin.list_partition_reassignments,
            lambda r: not r.partitions and r.throttle_bytes_per_sec is None,
            "the cancelled move and its throttle to be gone",
        )
        [desc] = (await admin.describe_topics([topic]))[topic].partitions
        assert (desc.replicas, desc.leader, desc.adding_replicas) == ([source], source, [])
        assert desc.log_end_offset == 25
        assert (await admin.describe_log_dirs(source, [tp]))[tp].log_end_offset == 25
