"""Every API end to end against an in-process broker, over real 127.0.0.1 sockets."""

from __future__ import annotations

import asyncio

import pytest

from logmq.errors import ErrorCode
from logmq.net.codec import ApiKey
from logmq.storage import batch as b
from tests.harness import inprocess_broker
from tests.net.raw_client import RawClient, fetch_body, produce_body


@pytest.fixture
async def client(inproc_broker):
    c = await RawClient.connect(inproc_broker.port)
    yield c
    await c.close()


def values_batch(n: int, tag: bytes = b"v", ts: int = 1_000, **kw) -> bytes:
    return b.encode_values([tag + b"%d" % i for i in range(n)], timestamp=ts, **kw)


def decode_all(data: bytes) -> list[tuple[int, bytes]]:
    out = []
    for pos, _h in b.iter_headers(data):
        out.extend((off, val) for off, _ts, _k, val, _hd in b.decode_records(data, pos))
    return out


async def test_api_versions_lists_every_api(client):
    resp = await client.call(ApiKey.API_VERSIONS, {})
    keys = {k for k, _lo, _hi in resp.body["apis"]}
    assert resp.body["error"] == 0
    assert {
        ApiKey.PRODUCE,
        ApiKey.FETCH,
        ApiKey.LIST_OFFSETS,
        ApiKey.METADATA,
        ApiKey.CREATE_TOPICS,
        ApiKey.DELETE_TOPICS,
        ApiKey.DESCRIBE_CONFIGS,
        ApiKey.ALTER_CONFIGS,
        ApiKey.INIT_PRODUCER_ID,
        ApiKey.API_VERSIONS,
    } <= keys


async def test_unknown_api_and_unsupported_version(client):
    resp = await client.call(999, {})
    assert resp.body["error"] == ErrorCode.UNKNOWN_API
    resp = await client.call(ApiKey.METADATA, {"topics": None}, version=7)
    assert resp.body["error"] == ErrorCode.UNSUPPORTED_VERSION
    resp = await client.call(ApiKey.API_VERSIONS, {}, version=9)
    assert resp.body["error"] == ErrorCode.UNSUPPORTED_VERSION and resp.body["apis"]
    assert (await client.call(ApiKey.API_VERSIONS, {})).body["error"] == 0  # still open


async def test_malformed_bodies_get_invalid_request(client):
    for key, body in [
        (ApiKey.PRODUCE, {"acks": "one", "topics": []}),
        (ApiKey.FETCH, {"topics": [{"topic": 5, "partitions": []}]}),
        (ApiKey.CREATE_TOPICS, {"topics": "x"}),
        (ApiKey.LIST_OFFSETS, {"topics": [{"topic": "t", "partitions": [{"partition": "0"}]}]}),
        (ApiKey.DESCRIBE_CONFIGS, {}),
    ]:
        resp = await client.call(key, body)
        assert resp.body["error"] == ErrorCode.INVALID_REQUEST, (key, resp.body)
        assert resp.body["message"]


async def test_create_topics_validation(client, inproc_broker):
    assert (await client.create_topic("orders", 3))["error"] == 0
    assert (await client.create_topic("orders", 3))["error"] == ErrorCode.TOPIC_ALREADY_EXISTS
    cases = {
        "bad name!": ErrorCode.INVALID_TOPIC_EXCEPTION,
        "..": ErrorCode.INVALID_TOPIC_EXCEPTION,
        "x" * 250: ErrorCode.INVALID_TOPIC_EXCEPTION,
        "__internal": ErrorCode.INVALID_TOPIC_EXCEPTION,
    }
    for name, code in cases.items():
        assert (await client.create_topic(name))["error"] == code, name
    assert (await client.create_topic("zero", 0))["error"] == ErrorCode.INVALID_PARTITIONS
    bad_rf = await client.create_topic("rf3", 1, replication_factor=3)
    assert (
        bad_rf["error"] == ErrorCode.INVALID_REPLICATION_FACTOR
        and "available broker" in bad_rf["message"]
    )
    assert (await client.create_topic("rfd", 1, replication_factor=-1))["error"] == 0
    bad_cfg = await client.create_topic("cfg", 1, {"retention.ms": "soon"})
    assert bad_cfg["error"] == ErrorCode.INVALID_CONFIG
    unknown_cfg = await client.create_topic("cfg", 1, {"no.such.key": "1"})
    assert unknown_cfg["error"] == ErrorCode.INVALID_CONFIG
    resp = await client.call(
        ApiKey.CREATE_TOPICS,
        {
            "topics": [{"topic": "dry", "partitions": 1, "replication_factor": 1, "configs": {}}],
            "validate_only": True,
        },
    )
    assert resp.body["topics"][0]["error"] == 0
    assert "dry" not in inproc_broker.topics


async def test_metadata(client, inproc_broker):
    await client.create_topic("a", 2)
    await client.create_topic("b", 1)
    resp = await client.call(ApiKey.METADATA, {"topics": None})
    body = resp.body
    assert body["cluster_id"] == inproc_broker.cluster_id
    assert body["brokers"] == [{"node_id": 1, "host": "127.0.0.1", "port": inproc_broker.port}]
    by_name = {t["topic"]: t for t in body["topics"]}
    assert set(by_name) == {"a", "b"}
    assert [p["partition"] for p in by_name["a"]["partitions"]] == [0, 1]
    assert by_name["a"]["partitions"][0]["leader"] == 1
    assert by_name["a"]["partitions"][0]["isr"] == [1]
    resp = await client.call(ApiKey.METADATA, {"topics": ["nope"], "allow_auto_create": True})
    (t,) = resp.body["topics"]
    assert t["error"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION  # auto-create is off by default


async def test_auto_create_when_enabled(tmp_path):
    async with (
        inprocess_broker(tmp_path / "d", auto_create_topics=True, default_partitions=2) as br,
        await RawClient.connect(br.port) as c,
    ):
        resp = await c.call(ApiKey.METADATA, {"topics": ["fresh"], "allow_auto_create": True})
        assert len(resp.body["topics"][0]["partitions"]) == 2
        r = await c.produce("other", 1, values_batch(2))
        assert r["error"] == 0 and r["base_offset"] == 0


async def test_produce_fetch_round_trip(client):
    await client.create_topic("t", 2)
    r0 = await client.produce("t", 0, values_batch(5, b"a"))
    r1 = await client.produce("t", 0, values_batch(3, b"b"))
    assert (r0["error"], r0["base_offset"]) == (0, 0)
    assert (r1["error"], r1["base_offset"]) == (0, 5)
    assert r1["log_start_offset"] == 0
    meta, data = await client.fetch("t", 0, 0)
    assert meta["error"] == 0 and meta["high_watermark"] == 8 and meta["size"] == len(data)
    got = decode_all(data)
    assert [o for o, _ in got] == list(range(8))
    assert [v for _, v in got] == [b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(3)]
    # fetching from the middle starts with the batch holding the offset
    meta, data = await client.fetch("t", 0, 6)
    assert [o for o, _ in decode_all(data)] == [5, 6, 7]
    # the other partition is untouched; at the high watermark there is nothing yet
    meta, data = await client.fetch("t", 1, 0)
    assert (meta["error"], meta["high_watermark"], data) == (0, 0, b"")


async def test_produce_several_partitions_in_one_request(client):
    await client.create_topic("multi", 3)
    parts = {0: values_batch(1), 2: values_batch(2) + values_batch(3)}
    resp = await client.call(ApiKey.PRODUCE, produce_body("multi", parts), list(parts.values()))
    res = {p["partition"]: p for p in resp.body["topics"][0]["partitions"]}
    assert res[0]["base_offset"] == 0 and res[2]["base_offset"] == 0
    meta, data = await client.fetch("multi", 2, 0)
    assert meta["high_watermark"] == 5 and len(decode_all(data)) == 5


async def test_produce_errors(client):
    await client.create_topic("t", 1)
    assert (await client.produce("nope", 0, values_batch(1)))["error"] == (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    )
    assert (await client.produce("t", 5, values_batch(1)))["error"] == (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    )
    corrupt = bytearray(values_batch(3))
    corrupt[-1] ^= 0xFF
    r = await client.produce("t", 0, bytes(corrupt))
    assert r["error"] == ErrorCode.CORRUPT_MESSAGE and r["message"]
    truncated = values_batch(3)[:-4]
    assert (await client.produce("t", 0, truncated))["error"] == ErrorCode.CORRUPT_MESSAGE
    assert (await client.produce("t", 0, values_batch(1), acks=2))["error"] == (
        ErrorCode.INVALID_REQUIRED_ACKS
    )
    # sizes that do not match the tail fail the whole request, and nothing was appended
    data = values_batch(1)
    resp = await client.call(ApiKey.PRODUCE, produce_body("t", {0: data + b"x"}), [data])
    assert resp.body["error"] == ErrorCode.INVALID_REQUEST
    meta, _ = await client.fetch("t", 0, 0)
    assert meta["high_watermark"] == 0


async def test_acks_zero_gets_no_response_but_is_appended(client):
    await client.create_topic("t", 1)
    for _ in range(3):
        assert await client.produce("t", 0, values_batch(2), acks=0) is None
    r = await client.produce("t", 0, values_batch(1), acks=-1)  # all = leader-only for now
    assert r["base_offset"] == 6


async def test_fetch_out_of_range_and_unknown(client):
    await client.create_topic("t", 1)
    await client.produce("t", 0, values_batch(2))
    meta, _ = await client.fetch("t", 0, 3)
    assert meta["error"] == ErrorCode.OFFSET_OUT_OF_RANGE
    meta, _ = await client.fetch("t", 0, -1)
    assert meta["error"] == ErrorCode.OFFSET_OUT_OF_RANGE
    meta, _ = await client.fetch("zzz", 0, 0)
    assert meta["error"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_long_poll_is_woken_by_an_append(client, inproc_broker):
    await client.create_topic("t", 1)
    corr = client.send(ApiKey.FETCH, fetch_body({"t": [(0, 0, 1 << 20)]}, max_wait_ms=20_000))
    # the fetch parks (nothing to read), then a produce on another connection wakes it
    await _wait_parked(inproc_broker, 1)
    async with await RawClient.connect(inproc_broker.port) as producer:
        await producer.produce("t", 0, values_batch(4))
    resp = await client.recv(timeout=10)
    assert resp.correlation_id == corr
    assert [o for o, _ in decode_all(bytes(resp.tail))] == [0, 1, 2, 3]


async def test_long_poll_waits_for_min_bytes(client, inproc_broker):
    await client.create_topic("t", 1)
    small = values_batch(1)
    await client.produce("t", 0, small)
    client.send(
        ApiKey.FETCH,
        fetch_body({"t": [(0, 0, 1 << 20)]}, max_wait_ms=20_000, min_bytes=len(small) * 3),
    )
    await _wait_parked(inproc_broker, 1)
    async with await RawClient.connect(inproc_broker.port) as producer:
        await producer.produce("t", 0, small)
        await _wait_parked(inproc_broker, 1)  # woken, re-read, still short: parked again
        await producer.produce("t", 0, small)
    resp = await client.recv(timeout=10)
    assert resp.body["topics"][0]["partitions"][0]["size"] == len(small) * 3


async def test_long_poll_returns_empty_after_max_wait(client):
    await client.create_topic("t", 1)
    loop = asyncio.get_running_loop()
    start = loop.time()
    meta, data = await client.fetch("t", 0, 0, max_wait_ms=200)
    assert loop.time() - start >= 0.19  # it did wait (lower bound only, no speed claim)
    assert meta["error"] == 0 and data == b""


async def test_fetch_respects_max_bytes_but_always_makes_progress(client):
    await client.create_topic("t", 2)
    big = values_batch(200)
    for _ in range(3):
        await client.produce("t", 0, big)
        await client.produce("t", 1, big)
    # partition_max_bytes smaller than one batch: the first batch still comes whole
    meta, data = await client.fetch("t", 0, 0, partition_max_bytes=10)
    assert meta["size"] >= len(big) and len(decode_all(data)) >= 200
    # request max_bytes caps the total across partitions
    resp = await client.call(
        ApiKey.FETCH, fetch_body({"t": [(0, 0, 1 << 20), (1, 0, 1 << 20)]}, max_bytes=len(big) + 10)
    )
    sizes = [p["size"] for p in resp.body["topics"][0]["partitions"]]
    # only the answer's first batch may pass the budget: partition 1's waits (as Kafka)
    assert sizes == [len(big), 0]
    assert len(resp.tail) == sum(sizes)


async def test_list_offsets(client):
    await client.create_topic("t", 1)
    assert (await client.list_offset("t", 0, -1))["offset"] == 0
    await client.produce("t", 0, values_batch(3, ts=1_000))
    await client.produce("t", 0, values_batch(3, ts=5_000))
    assert (await client.list_offset("t", 0, -2))["offset"] == 0
    assert (await client.list_offset("t", 0, -1))["offset"] == 6
    hit = await client.list_offset("t", 0, 2_000)
    assert (hit["offset"], hit["timestamp"]) == (3, 5_000)
    assert (await client.list_offset("t", 0, 9_000))["offset"] == -1
    assert (await client.list_offset("nope", 0, -1))[
        "error"
    ] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_describe_and_alter_configs(client):
    await client.create_topic("t", 1, {"retention.ms": "1000"})
    resp = await client.call(
        ApiKey.DESCRIBE_CONFIGS,
        {
            "resources": [
                {"type": "topic", "name": "t"},
                {"type": "topic", "name": "nope"},
                {"type": "broker", "name": "1"},
            ]
        },
    )
    t, missing, broker = resp.body["resources"]
    cfg = {c["name"]: c for c in t["configs"]}
    assert cfg["retention.ms"]["value"] == "1000" and not cfg["retention.ms"]["default"]
    assert cfg["segment.bytes"]["default"]
    assert missing["error"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert any(c["name"] == "node.id" and c["value"] == "1" for c in broker["configs"])

    resp = await client.call(
        ApiKey.ALTER_CONFIGS,
        {
            "resources": [
                {
                    "type": "topic",
                    "name": "t",
                    "set": {"segment.bytes": "4096"},
                    "delete": ["retention.ms"],
                },
                {"type": "topic", "name": "t", "set": {"segment.bytes": "tiny"}, "delete": []},
                {"type": "topic", "name": "nope", "set": {}, "delete": []},
            ]
        },
    )
    ok, bad, unknown = resp.body["resources"]
    assert ok["error"] == 0
    assert bad["error"] == ErrorCode.INVALID_CONFIG
    assert unknown["error"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    resp = await client.call(
        ApiKey.DESCRIBE_CONFIGS, {"resources": [{"type": "topic", "name": "t"}]}
    )
    cfg = {c["name"]: c for c in resp.body["resources"][0]["configs"]}
    assert cfg["segment.bytes"]["value"] == "4096" and cfg["retention.ms"]["default"]


async def test_delete_topics(client, inproc_broker):
    await client.create_topic("gone", 2)
    await client.produce("gone", 1, values_batch(2))
    resp = await client.call(ApiKey.DELETE_TOPICS, {"topics": ["gone", "never"], "timeout_ms": 1})
    gone, never = resp.body["topics"]
    assert gone["error"] == 0 and never["error"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert not any(
        p.name.startswith("gone-")
        for p in inproc_broker.data_dir.iterdir()
        if p.is_dir() and p.name[-1].isdigit() and not p.name.endswith(".deleted")
    )
    assert (await client.fetch("gone", 0, 0))[0]["error"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert (await client.create_topic("gone", 1))["error"] == 0  # the name is free again
    meta, _ = await client.fetch("gone", 0, 0)
    assert meta["high_watermark"] == 0


async def test_idempotent_producer(client):
    await client.create_topic("t", 1)
    resp = await client.call(
        ApiKey.INIT_PRODUCER_ID, {"transactional_id": None, "producer_id": -1, "producer_epoch": -1}
    )
    pid, epoch = resp.body["producer_id"], resp.body["producer_epoch"]
    other = await client.call(ApiKey.INIT_PRODUCER_ID, {"producer_id": -1, "producer_epoch": -1})
    assert other.body["producer_id"] != pid
    first = values_batch(3, producer_id=pid, producer_epoch=epoch, base_sequence=0)
    second = values_batch(2, producer_id=pid, producer_epoch=epoch, base_sequence=3)
    assert (await client.produce("t", 0, first))["base_offset"] == 0
    assert (await client.produce("t", 0, second))["base_offset"] == 3
    retry = await client.produce("t", 0, first)  # a retried batch: acked, not appended again
    assert (retry["error"], retry["base_offset"]) == (0, 0)
    gap = values_batch(1, producer_id=pid, producer_epoch=epoch, base_sequence=9)
    assert (await client.produce("t", 0, gap))["error"] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    meta, data = await client.fetch("t", 0, 0)
    assert meta["high_watermark"] == 5 and len(decode_all(data)) == 5
    bumped = await client.call(
        ApiKey.INIT_PRODUCER_ID, {"producer_id": pid, "producer_epoch": epoch}
    )
    assert bumped.body["producer_id"] == pid and bumped.body["producer_epoch"] == epoch + 1
    stale = values_batch(1, producer_id=pid, producer_epoch=epoch, base_sequence=5)
    new = values_batch(1, producer_id=pid, producer_epoch=epoch + 1, base_sequence=0)
    assert (await client.produce("t", 0, new))["error"] == 0
    assert (await client.produce("t", 0, stale))["error"] == ErrorCode.INVALID_PRODUCER_EPOCH


async def test_producer_ids_are_never_reused_after_restart(tmp_path):
    seen = set()
    for _ in range(3):
        async with inprocess_broker(tmp_path / "d", producer_id_block_size=5) as br:  # noqa: SIM117
            async with await RawClient.connect(br.port) as c:
                for _ in range(7):
                    r = await c.call(
                        ApiKey.INIT_PRODUCER_ID, {"producer_id": -1, "producer_epoch": -1}
                    )
                    assert r.body["producer_id"] not in seen
                    seen.add(r.body["producer_id"])


async def test_topics_survive_restart(tmp_path):
    async with inprocess_broker(tmp_path / "d") as br, await RawClient.connect(br.port) as c:
        await c.create_topic("keep", 2, {"retention.ms": "60000"})
        await c.produce("keep", 1, values_batch(4))
    async with inprocess_broker(tmp_path / "d") as br, await RawClient.connect(br.port) as c:
        meta, data = await c.fetch("keep", 1, 0)
        assert meta["high_watermark"] == 4 and len(decode_all(data)) == 4
        assert (await c.produce("keep", 1, values_batch(1)))["base_offset"] == 4
        resp = await c.call(
            ApiKey.DESCRIBE_CONFIGS, {"resources": [{"type": "topic", "name": "keep"}]}
        )
        cfg = {x["name"]: x["value"] for x in resp.body["resources"][0]["configs"]}
        assert cfg["retention.ms"] == "60000"


async def test_node_id_mismatch_refuses_to_start(tmp_path):
    from logmq.cluster.meta_properties import NodeIdMismatchError

    async with inprocess_broker(tmp_path / "d", node_id=4):
        pass
    with pytest.raises(NodeIdMismatchError, match=r"node\.id=4"):
        async with inprocess_broker(tmp_path / "d", node_id=5):
            pass
    assert "node.id=4" in (tmp_path / "d" / "meta.properties").read_text()


async def test_many_concurrent_connections(client, inproc_broker):
    await client.create_topic("t", 4)

    async def worker(i: int) -> list[int]:
        async with await RawClient.connect(inproc_broker.port) as c:
            return [(await c.produce("t", i % 4, values_batch(2)))["base_offset"] for _ in range(5)]

    results = await asyncio.gather(*(worker(i) for i in range(16)))
    for p in range(4):
        offs = sorted(o for i, r in enumerate(results) if i % 4 == p for o in r)
        assert offs == list(range(0, 40, 2))  # no offset handed out twice


async def _wait_parked(broker, n: int) -> None:
    from tests.harness import wait_until

    await wait_until(lambda: broker.waiters.parked >= n, what=f"{n} parked fetch(es)")


async def test_pipelined_produces_overlap_durability_but_keep_order(client):
    await client.create_topic("gc", 2, {"group.commit": "true"})
    resp = await client.call(ApiKey.INIT_PRODUCER_ID, {"producer_id": -1, "producer_epoch": -1})
    pid = resp.body["producer_id"]
    corrs = []
    for i in range(40):
        # sequences only fit in this order: a reordered append would be OUT_OF_ORDER
        data = values_batch(2, producer_id=pid, producer_epoch=0, base_sequence=2 * i)
        parts = {0: data} if i % 4 else {0: data, 1: values_batch(1)}
        corrs.append(client.send(ApiKey.PRODUCE, produce_body("gc", parts), list(parts.values())))
    offsets = []
    for corr in corrs:
        r = await client.recv()
        assert r.correlation_id == corr
        p0 = r.body["topics"][0]["partitions"][0]
        assert p0["error"] == 0, p0
        offsets.append(p0["base_offset"])
    assert offsets == list(range(0, 80, 2))


async def test_pipelined_create_then_produce(client):
    create = {
        "topics": [{"topic": "fresh", "partitions": 1, "replication_factor": 1, "configs": {}}]
    }
    client.send(ApiKey.CREATE_TOPICS, create)
    data = values_batch(3)
    client.send(ApiKey.PRODUCE, produce_body("fresh", {0: data}), [data])
    assert (await client.recv()).body["topics"][0]["error"] == 0
    assert (await client.recv()).body["topics"][0]["partitions"][0]["base_offset"] == 0


async def test_closing_a_connection_releases_its_parked_fetch(inproc_broker):
    from tests.harness import wait_until

    async with await RawClient.connect(inproc_broker.port) as c:
        await c.create_topic("t", 1)
        c.send(ApiKey.FETCH, fetch_body({"t": [(0, 0, 1 << 20)]}, max_wait_ms=30_000))
        await _wait_parked(inproc_broker, 1)
    await wait_until(lambda: inproc_broker.waiters.parked == 0, what="fetch released")
    await wait_until(lambda: inproc_broker.server.connection_count == 0, what="conn gone")


async def test_one_request_answers_every_partition_on_its_own(client, inproc_broker, monkeypatch):
    """Appends of one request are written at once, in order, without a task each
    (produce_path.append_all): a partition's failure, even an unexpected one, is that
    partition's answer alone, and the others are written."""
    await client.create_topic("t", 4)
    real = inproc_broker.appends.append_now

    def append_now(key, *args):
        if key == ("t", 2):
            raise RuntimeError("disk on fire")
        return real(key, *args)

    monkeypatch.setattr(inproc_broker.appends, "append_now", append_now)
    good = values_batch(2)
    parts = {0: good, 1: good, 2: good, 3: b"", 7: good}
    body = produce_body("t", parts)
    resp = await client.call(ApiKey.PRODUCE, body, [d for d in parts.values() if d])
    got = {p["partition"]: p for p in resp.body["topics"][0]["partitions"]}
    assert [p["partition"] for p in resp.body["topics"][0]["partitions"]] == [0, 1, 2, 3, 7]
    assert got[0]["error"] == got[1]["error"] == 0
    assert got[0]["base_offset"] == got[1]["base_offset"] == 0
    assert got[2]["error"] == ErrorCode.UNKNOWN_SERVER_ERROR
    assert "disk on fire" in got[2]["message"]
    assert got[3]["error"] == ErrorCode.CORRUPT_MESSAGE
    assert got[7]["error"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    monkeypatch.undo()
    assert (await client.produce("t", 2, good))["base_offset"] == 0  # nothing was written
