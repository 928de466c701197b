"""AlterPartitionReassignments (45), ListPartitionReassignments (46), DescribeLogDirs (35)
and ElectLeaders (43) over the raw protocol, against one real ``logmq-server``.

A single broker is a quorum of one: moves to the same broker, every refusal, the log
sizes and elections that need no change are all observable there. Moves between brokers
are in the cluster tests.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logmq.errors import ErrorCode
from logmq.net.codec import SIZE, ApiKey, decode_response, encode_request
from logmq.storage import batch as b
from tests.harness import BrokerProcess
from tests.net.raw_client import RawClient

E = ErrorCode
ALTER = ApiKey.ALTER_PARTITION_REASSIGNMENTS
LIST = ApiKey.LIST_PARTITION_REASSIGNMENTS


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(
        tmp_path_factory.mktemp("reassignment-api") / "data",
        extra_args=["--offsets-topic-partitions", "1"],
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.close()


@pytest.fixture
async def client(server) -> AsyncIterator[RawClient]:
    c = await RawClient.connect(server.port)
    yield c
    await c.close()


def move(topic: str, partition: Any, replicas: Any) -> dict[str, Any]:
    return {"topic": topic, "partition": partition, "replicas": replicas}


async def alter(c: RawClient, *entries: Any, throttle: Any = None) -> dict[str, Any]:
    body = {"partitions": list(entries), "throttle_bytes_per_sec": throttle}
    return (await c.call(ALTER, body)).body


async def moving(c: RawClient) -> list[dict]:
    body = (await c.call(LIST, {"partitions": None})).body
    assert body["error"] == 0, body
    return body["partitions"]


async def partition_state(c: RawClient, topic: str) -> list[dict]:
    resp = await c.call(ApiKey.METADATA, {"topics": [topic], "allow_auto_create": False})
    return resp.body["topics"][0]["partitions"]


async def test_api_versions_lists_the_four_apis(client):
    apis = (await client.call(ApiKey.API_VERSIONS, {})).body["apis"]
    for key in (ApiKey.DESCRIBE_LOG_DIRS, ApiKey.ELECT_LEADERS, ALTER, LIST):
        assert [key, 0, 0] in apis


async def test_a_move_to_the_current_replicas_is_accepted_and_changes_nothing(client):
    assert (await client.create_topic("same", 2))["error"] == 0
    before = await partition_state(client, "same")
    out = await alter(client, move("same", 0, [1]), move("same", 1, [1]))
    assert out["error"] == 0, out
    assert [(e["topic"], e["partition"], e["error"]) for e in out["partitions"]] == [
        ("same", 0, 0),
        ("same", 1, 0),
    ]
    assert await moving(client) == []
    assert await partition_state(client, "same") == before
    assert "adding_replicas" not in before[0]  # only while a partition moves


async def test_refusals_are_all_or_nothing_and_name_each_partition(client):
    assert (await client.create_topic("refuse", 2))["error"] == 0
    assert (await client.create_topic("strict", 1, {"min.insync.replicas": "2"}))["error"] == 0
    cases = [
        (move("refuse", 0, [7]), E.INVALID_REPLICA_ASSIGNMENT),
        (move("refuse", 0, [1, 1]), E.INVALID_REPLICA_ASSIGNMENT),
        (move("refuse", 0, []), E.INVALID_REPLICA_ASSIGNMENT),
        (move("refuse", 5, [1]), E.UNKNOWN_TOPIC_OR_PARTITION),
        (move("no-such-topic", 0, [1]), E.UNKNOWN_TOPIC_OR_PARTITION),
        (move("refuse", 1, None), E.NO_REASSIGNMENT_IN_PROGRESS),  # cancel, not moving
        (move("strict", 0, [1]), E.INVALID_REPLICATION_FACTOR),  # below min.insync.replicas
    ]
    for entry, code in cases:
        out = await alter(client, entry)
        assert out["error"] == code, (entry, out)
        [result] = out["partitions"]
        assert (result["topic"], result["partition"], result["error"]) == (
            entry["topic"],
            entry["partition"],
            code,
        )
        assert result["message"] and out["message"], out

    # one bad entry refuses the whole request; the message lists every refusal
    out = await alter(client, move("refuse", 0, [1]), move("refuse", 1, [9]), move("gone", 0, [1]))
    assert out["error"] == E.INVALID_REPLICA_ASSIGNMENT
    codes = {(e["topic"], e["partition"]): e["error"] for e in out["partitions"]}
    assert codes == {
        ("refuse", 0): 0,
        ("refuse", 1): E.INVALID_REPLICA_ASSIGNMENT,
        ("gone", 0): E.UNKNOWN_TOPIC_OR_PARTITION,
    }
    assert "refuse-1" in out["message"] and "gone-0" in out["message"]
    assert await moving(client) == []


@pytest.mark.parametrize(
    "entry",
    [
        "refuse-0",
        {"topic": 5, "partition": 0, "replicas": [1]},
        {"topic": "t", "partition": "0", "replicas": [1]},
        {"topic": "t", "partition": True, "replicas": [1]},
        {"topic": "t", "replicas": [1]},
        {"topic": "t", "partition": 0, "replicas": "1"},
        {"topic": "t", "partition": 0, "replicas": [1, "2"]},
        {"topic": "t", "partition": 0, "replicas": [1, False]},
        {"topic": "t", "partition": 0, "replicas": {"1": 1}},
    ],
)
async def test_malformed_entries_get_invalid_request_and_start_nothing(client, entry):
    assert (await client.create_topic("shapes", 1))["error"] in (0, E.TOPIC_ALREADY_EXISTS)
    out = await alter(client, move("shapes", 0, [1]), entry)
    assert out["error"] == E.INVALID_REQUEST, out
    assert [e["error"] for e in out["partitions"]] == [0, E.INVALID_REQUEST]
    assert "nothing was started" in out["message"]
    assert await moving(client) == []


async def test_malformed_requests_get_invalid_request(client):
    for body in (
        {},
        {"partitions": 3},
        {"partitions": None},
        {"partitions": [], "throttle_bytes_per_sec": "50MB"},
        {"partitions": [], "throttle_bytes_per_sec": -1},
        {"partitions": [], "throttle_bytes_per_sec": 1.5},
    ):
        out = (await client.call(ALTER, body)).body
        assert (out["error"], out["partitions"]) == (E.INVALID_REQUEST, []), (body, out)
        assert out["message"]
    # a partition named twice
    assert (await client.create_topic("twice", 1))["error"] == 0
    out = await alter(client, move("twice", 0, [1]), move("twice", 0, None))
    assert out["error"] == E.INVALID_REQUEST
    assert "twice-0: named twice" in out["message"]
    for body in ({"partitions": 1}, {"partitions": [{"topic": "twice"}]}, {"partitions": ["x"]}):
        out = (await client.call(LIST, body)).body
        assert out["error"] == E.INVALID_REQUEST, out
    assert (await client.call(ApiKey.API_VERSIONS, {})).body["error"] == 0  # still serving


async def test_a_throttle_without_moves_is_dropped_at_once(client):
    out = await alter(client, throttle=1_000_000)
    assert (out["error"], out["partitions"]) == (0, [])
    body = (await client.call(LIST, {})).body
    assert body == {"error": 0, "throttle_bytes_per_sec": None, "partitions": []}


async def test_list_with_a_filter_skips_unknown_and_still_partitions(client):
    assert (await client.create_topic("listed", 2))["error"] == 0
    wanted = [{"topic": "listed", "partition": 1}, {"topic": "nope", "partition": 0}]
    body = (await client.call(LIST, {"partitions": wanted})).body
    assert body["partitions"] == []


def values_batch(n: int, size: int) -> bytes:
    return b.encode_values([b"v" * size for _ in range(n)], timestamp=1_000)


async def test_describe_log_dirs_reports_this_brokers_copies(client, server):
    assert (await client.create_topic("sized", 3))["error"] == 0
    for _ in range(3):
        assert (await client.produce("sized", 0, values_batch(50, 100)))["error"] == 0
    assert (await client.produce("sized", 2, values_batch(7, 10)))["error"] == 0

    body = (await client.call(ApiKey.DESCRIBE_LOG_DIRS, {"partitions": None})).body
    assert body["broker_id"] == 1
    dirs = {(e["topic"], e["partition"]): e for e in body["partitions"]}
    assert {("sized", 0), ("sized", 1), ("sized", 2)} <= dirs.keys()
    for p, records in ((0, 150), (1, 0), (2, 7)):
        entry = dirs[("sized", p)]
        on_disk = sum(f.stat().st_size for f in (server.data_dir / f"sized-{p}").glob("*.log"))
        assert (entry["log_start_offset"], entry["log_end_offset"]) == (0, records)
        assert entry["size"] == on_disk
    assert dirs[("sized", 0)]["size"] > 150 * 100 > dirs[("sized", 2)]["size"] > 0

    wanted = [
        {"topic": "sized", "partition": 2},
        {"topic": "sized", "partition": 9},  # no such partition: left out
        {"topic": "unknown", "partition": 0},
        {"topic": "sized", "partition": 2},  # asked twice, listed once
    ]
    body = (await client.call(ApiKey.DESCRIBE_LOG_DIRS, {"partitions": wanted})).body
    assert [(e["topic"], e["partition"]) for e in body["partitions"]] == [("sized", 2)]

    for bad in ({"partitions": "all"}, {"partitions": [{"topic": "sized", "partition": "0"}]}):
        out = (await client.call(ApiKey.DESCRIBE_LOG_DIRS, bad)).body
        assert out["error"] == E.INVALID_REQUEST and "partition" in out["message"]


async def test_elect_leaders_when_nothing_needs_electing(client):
    assert (await client.create_topic("elect", 2))["error"] == 0
    wanted = [
        {"topic": "elect", "partition": 0},
        {"topic": "elect", "partition": 1},
        {"topic": "elect", "partition": 7},
    ]
    for election in (0, 1):  # preferred, unclean
        body = {"partitions": wanted, "election_type": election}
        out = (await client.call(ApiKey.ELECT_LEADERS, body)).body
        codes = {(e["topic"], e["partition"]): e["error"] for e in out["partitions"]}
        assert codes == {
            ("elect", 0): E.ELECTION_NOT_NEEDED,
            ("elect", 1): E.ELECTION_NOT_NEEDED,
            ("elect", 7): E.UNKNOWN_TOPIC_OR_PARTITION,
        }
    # every partition: only those whose leader changed are listed
    out = (await client.call(ApiKey.ELECT_LEADERS, {"partitions": None})).body
    assert out == {"partitions": []}
    assert all(p["leader"] == 1 for p in await partition_state(client, "elect"))


async def test_elect_leaders_refuses_malformed_requests(client):
    twice = [{"topic": "elect2", "partition": 0}] * 2
    for body in (
        {"partitions": None, "election_type": 2},
        {"partitions": None, "election_type": "preferred"},
        {"partitions": twice},
        {"partitions": [{"topic": "elect2"}]},
        {"partitions": {"elect2": 0}},
    ):
        out = (await client.call(ApiKey.ELECT_LEADERS, body)).body
        assert out["error"] == E.INVALID_REQUEST and out["message"], (body, out)


# -- any body: an answer, never a server error -------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.sampled_from(["shapes", "same", "__consumer_offsets"]),
)
partition_entries = st.fixed_dictionaries(
    {},
    optional={
        "topic": st.one_of(scalars, st.sampled_from(["same", "fuzz-none"])),
        "partition": st.one_of(scalars, st.integers(-2, 3)),
        "replicas": st.one_of(scalars, st.lists(st.one_of(st.integers(-1, 3), scalars))),
    },
)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "partitions": st.one_of(scalars, st.lists(st.one_of(partition_entries, scalars))),
        "throttle_bytes_per_sec": st.one_of(scalars, st.integers(-5, 10**12)),
        "election_type": st.one_of(scalars, st.integers(-1, 3)),
    },
)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from([ALTER, LIST, ApiKey.DESCRIBE_LOG_DIRS, ApiKey.ELECT_LEADERS]), bodies)
def test_hypothesis_any_body_gets_a_clear_answer(server, api_key, body):
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as sock:
        sock.sendall(b"".join(encode_request(api_key, 0, 5, "fuzz", body)))
        resp = decode_response(_read_frame(sock))
    assert resp.correlation_id == 5
    assert resp.body.get("error", 0) != E.UNKNOWN_SERVER_ERROR, (body, resp.body)
    for entry in resp.body.get("partitions") or ():
        if "error" in entry:
            assert entry["error"] != E.UNKNOWN_SERVER_ERROR, (body, resp.body)
    assert server.running, server.log_tail()


def _read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            assert chunk, "the broker closed the connection"
            buf += chunk
        return bytes(buf)

    (size,) = SIZE.unpack(exactly(4))
    return exactly(size)
