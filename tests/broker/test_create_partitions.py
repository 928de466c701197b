"""CreatePartitions (api 37) over the raw protocol, against real ``logmq-server`` processes."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator

import pytest

from logmq.errors import ErrorCode
from logmq.net.codec import ApiKey
from logmq.storage import batch as b
from tests.harness import BrokerProcess, inprocess_broker
from tests.net.raw_client import RawClient

E = ErrorCode


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[BrokerProcess]:
    """One broker for the tests that use their own topics (restarts get their own)."""
    proc = BrokerProcess(
        tmp_path_factory.mktemp("create-partitions") / "data",
        extra_args=["--offsets-topic-partitions", "2"],
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


def body(counts: dict[str, object] | list[tuple[str, object]], validate_only: bool = False):
    items = counts.items() if isinstance(counts, dict) else counts
    return {
        "topics": [{"topic": t, "count": n} for t, n in items],
        "timeout_ms": 5000,
        "validate_only": validate_only,
    }


async def grow(c: RawClient, counts, validate_only: bool = False) -> list[dict]:
    resp = await c.call(ApiKey.CREATE_PARTITIONS, body(counts, validate_only))
    return resp.body["topics"]


async def partition_count(c: RawClient, topic: str) -> int:
    resp = await c.call(ApiKey.METADATA, {"topics": [topic], "allow_auto_create": False})
    entry = resp.body["topics"][0]
    assert entry["error"] == 0, entry
    return len(entry["partitions"])


def values_batch(n: int, tag: bytes) -> bytes:
    return b.encode_values([tag + b"%d" % i for i in range(n)], timestamp=1_000)


def fetched_values(data: bytes) -> list[bytes]:
    return [rec[3] for pos, _h in b.iter_headers(data) for rec in b.decode_records(data, pos)]


async def test_api_versions_lists_create_partitions(client):
    resp = await client.call(ApiKey.API_VERSIONS, {})
    assert [ApiKey.CREATE_PARTITIONS, 0, 0] in resp.body["apis"]


async def test_grow_then_produce_and_fetch_on_a_new_partition(client):
    assert (await client.create_topic("grow", 2))["error"] == 0
    assert (await client.produce("grow", 1, values_batch(3, b"old")))["error"] == 0

    assert await grow(client, {"grow": 5}) == [{"topic": "grow", "error": 0, "message": None}]
    resp = await client.call(ApiKey.METADATA, {"topics": ["grow"], "allow_auto_create": False})
    parts = resp.body["topics"][0]["partitions"]
    assert [p["partition"] for p in parts] == [0, 1, 2, 3, 4]
    assert all(p["error"] == 0 and p["leader"] == 1 for p in parts)

    for p in (2, 4):
        result = await client.produce("grow", p, values_batch(4, b"new%d-" % p))
        assert (result["error"], result["base_offset"]) == (0, 0)
        meta, tail = await client.fetch("grow", p, 0)
        assert meta["error"] == 0 and meta["high_watermark"] == 4
        assert fetched_values(tail) == [b"new%d-%d" % (p, i) for i in range(4)]
    # the old partitions are untouched
    meta, tail = await client.fetch("grow", 1, 0)
    assert fetched_values(tail) == [b"old0", b"old1", b"old2"]
    assert (await client.list_offset("grow", 3, -1))["offset"] == 0


async def test_new_partitions_get_the_topic_configs(client):
    configs = {"cleanup.policy": "compact", "max.message.bytes": "4096"}
    assert (await client.create_topic("compacted", 1, configs))["error"] == 0
    assert (await grow(client, {"compacted": 3}))[0]["error"] == 0
    keyless = values_batch(2, b"v")  # a compacted topic refuses records without a key
    assert (await client.produce("compacted", 2, keyless))["error"] == E.INVALID_RECORD
    big = b.encode_values([b"x" * 5000], keys=[b"k"], timestamp=1_000)
    assert (await client.produce("compacted", 1, big))["error"] == E.MESSAGE_TOO_LARGE
    keyed = b.encode_values([b"v"], keys=[b"k"], timestamp=1_000)
    assert (await client.produce("compacted", 2, keyed))["error"] == 0


async def test_refusals_change_nothing(client):
    assert (await client.create_topic("fixed", 3))["error"] == 0
    cases = [
        ("fixed", 3, E.INVALID_PARTITIONS),  # not larger
        ("fixed", 2, E.INVALID_PARTITIONS),  # partitions are never removed
        ("fixed", 0, E.INVALID_PARTITIONS),
        ("fixed", 10_001, E.INVALID_PARTITIONS),  # over the per-topic limit
        ("fixed", "5", E.INVALID_REQUEST),
        ("no-such-topic", 4, E.UNKNOWN_TOPIC_OR_PARTITION),
        ("bad name!", 4, E.INVALID_TOPIC_EXCEPTION),
    ]
    for topic, count, code in cases:
        [entry] = await grow(client, [(topic, count)])
        assert (entry["topic"], entry["error"]) == (topic, code), entry
        assert entry["message"], entry
    [entry] = await grow(client, {"fixed": 3})
    assert "has 3 partition(s)" in entry["message"]
    assert await partition_count(client, "fixed") == 3

    # one request, one entry per topic: the good one is applied, the others are not
    assert (await client.create_topic("other", 1))["error"] == 0
    entries = await grow(client, [("other", 2), ("fixed", 1), ("other", 4)])
    assert [(e["topic"], e["error"]) for e in entries] == [
        ("other", 0),
        ("fixed", E.INVALID_PARTITIONS),
        ("other", E.INVALID_REQUEST),  # a topic twice: the second entry fails
    ]
    assert await partition_count(client, "other") == 2


async def test_validate_only_changes_nothing(client):
    assert (await client.create_topic("dry", 1))["error"] == 0
    assert await grow(client, {"dry": 4}, validate_only=True) == [
        {"topic": "dry", "error": 0, "message": None}
    ]
    assert await partition_count(client, "dry") == 1
    # a dry run reports the same errors as a real one
    [entry] = await grow(client, {"dry": 1}, validate_only=True)
    assert entry["error"] == E.INVALID_PARTITIONS
    result = await client.produce("dry", 1, values_batch(1, b"v"))
    assert result["error"] == E.UNKNOWN_TOPIC_OR_PARTITION


async def test_the_offsets_topic_cannot_grow(client):
    resp = await client.call(ApiKey.FIND_COORDINATOR, {"key_type": 0, "keys": ["g"]})
    assert resp.body["coordinators"][0]["error"] == 0  # creates __consumer_offsets
    [entry] = await grow(client, {"__consumer_offsets": 3})
    assert entry["error"] == E.INVALID_TOPIC_EXCEPTION
    assert "internal topic" in entry["message"]
    assert await partition_count(client, "__consumer_offsets") == 2


async def test_malformed_requests_get_invalid_request(client):
    for bad in [
        {"topics": "t"},
        {"timeout_ms": 5},
        {"topics": [], "validate_only": "yes"},
        {"topics": [], "timeout_ms": "soon"},
    ]:
        resp = await client.call(ApiKey.CREATE_PARTITIONS, bad)
        assert resp.body["error"] == E.INVALID_REQUEST and resp.body["message"], bad
    resp = await client.call(ApiKey.CREATE_PARTITIONS, {"topics": [5, {"count": 2}]})
    assert [e["error"] for e in resp.body["topics"]] == [E.INVALID_REQUEST] * 2
    assert (await client.call(ApiKey.API_VERSIONS, {})).body["error"] == 0  # still serving


async def test_a_restart_keeps_the_count_and_the_records(broker):
    async with await RawClient.connect(broker.port) as c:
        assert (await c.create_topic("durable", 1, {"retention.ms": "3600000"}))["error"] == 0
        assert (await grow(c, {"durable": 3}))[0]["error"] == 0
        assert (await c.produce("durable", 2, values_batch(5, b"r")))["error"] == 0

    broker.restart()
    async with await RawClient.connect(broker.port) as c:
        assert await partition_count(c, "durable") == 3
        meta, tail = await c.fetch("durable", 2, 0)
        assert meta["high_watermark"] == 5
        assert fetched_values(tail) == [b"r%d" % i for i in range(5)]
        assert (await grow(c, {"durable": 4}))[0]["error"] == 0
    broker.kill()  # no clean shutdown: the count was on disk before the answer
    broker.start()
    async with await RawClient.connect(broker.port) as c:
        assert await partition_count(c, "durable") == 4
        assert (await c.produce("durable", 3, values_batch(1, b"x")))["error"] == 0


async def test_a_log_missing_on_disk_is_recreated_from_the_image(tmp_path):
    data = tmp_path / "data"
    async with inprocess_broker(data) as br, await RawClient.connect(br.port) as c:
        assert (await c.create_topic("t", 1, {"retention.ms": "60000"}))["error"] == 0
    # a log lost on disk (or a crash before it was created): the image still has it
    shutil.rmtree(data / "t-0")
    async with inprocess_broker(data) as br, await RawClient.connect(br.port) as c:
        assert (await grow(c, {"t": 3}))[0]["error"] == 0
    async with inprocess_broker(data) as br:
        for p in range(3):
            assert br.logs.get_log("t", p).config.retention_ms == 60000


async def test_assignments_place_new_partitions_and_a_malformed_list_is_refused(client):
    """The native door's ``assignments``: one replica list per new partition (the
    controller's checks are tests/cluster/test_controller.py's)."""
    assert (await client.create_topic("placed", 1))["error"] == 0

    async def call(assignments, count=3, validate_only=False) -> dict:
        req = body({"placed": count}, validate_only)
        req["topics"][0]["assignments"] = assignments
        resp = await client.call(ApiKey.CREATE_PARTITIONS, req)
        return resp.body

    for malformed in ([1, 2], [["1"]], [[True]], "1:2"):
        answer = await call(malformed)
        assert answer["topics"][0]["error"] == E.INVALID_REQUEST, (malformed, answer)
    [entry] = (await call([[1], [2]]))["topics"]
    assert entry["error"] == E.INVALID_REPLICA_ASSIGNMENT
    assert "broker 2, which is not registered" in entry["message"]
    assert (await call([[1], [1]], validate_only=True))["topics"][0]["error"] == 0
    assert await partition_count(client, "placed") == 1
    assert (await call([[1], [1]]))["topics"][0]["error"] == 0
    assert await partition_count(client, "placed") == 3
    assert (await call(None, count=4))["topics"][0]["error"] == 0  # null: placed
    assert await partition_count(client, "placed") == 4
