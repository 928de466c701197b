"""Client quotas on the native door, shared with the Kafka door's: a producer or consumer
over its byte rate, or a client over its request percentage, gets ``throttle_ms`` in its
answer and its connection muted (KIP-219); a throttled fetch is answered empty and leaves
its session as it was, as Kafka's is. Windows of one second (quota.window.num 2) keep the
throttles short."""

from __future__ import annotations

import pytest

from logmq.client.security_admin import QuotaAlteration, quota_entry_body
from logmq.net.codec import ApiKey
from logmq.storage import batch as b
from tests.harness import inprocess_broker
from tests.net.raw_client import RawClient, fetch_body

QUOTA = 100_000  # bytes per second
CHUNK = 60_000


@pytest.fixture
async def broker(tmp_path):
    props = {"quota.window.num": "2"}  # rates over one second
    async with inprocess_broker(tmp_path / "data", properties=props) as broker:
        yield broker


async def set_quota(port: int, client_id: str, key: str, value: float) -> None:
    async with await RawClient.connect(port) as admin:
        entry = quota_entry_body(QuotaAlteration({"client-id": client_id}, {key: value}))
        resp = await admin.call(
            ApiKey.ALTER_CLIENT_QUOTAS, {"entries": [entry], "validate_only": False}
        )
        assert [e["error"] for e in resp.body["entries"]] == [0], resp.body


def chunk(i: int) -> bytes:
    return b.encode_values([bytes([i]) * CHUNK], timestamp=1_000)


async def test_a_producer_over_its_byte_rate_is_throttled_and_others_are_not(broker):
    await set_quota(broker.port, "slow", "producer_byte_rate", QUOTA)
    async with (
        await RawClient.connect(broker.port, client_id="slow") as slow,
        await RawClient.connect(broker.port, client_id="other") as other,
    ):
        assert (await slow.create_topic("pq"))["error"] == 0
        first = await slow.call(ApiKey.PRODUCE, *produce(chunk(1)))
        assert "throttle_ms" not in first.body  # 60 KB of 100 KB/s
        second = await slow.call(ApiKey.PRODUCE, *produce(chunk(2)))
        # 120 KB over one second: 0.2 s of quiet brings it back to 100 KB/s
        assert second.body["throttle_ms"] == pytest.approx(200, abs=20)
        assert second.body["topics"][0]["partitions"][0]["error"] == 0  # appended all the same
        for i in range(3):  # another client id is not metered at all
            resp = await other.call(ApiKey.PRODUCE, *produce(chunk(3 + i)))
            assert "throttle_ms" not in resp.body
        # acks=0: no answer, but the bytes count (the connection is muted, not answered)
        slow.send(ApiKey.PRODUCE, produce(chunk(9), acks=0)[0], [chunk(9)])
        third = await slow.call(ApiKey.PRODUCE, *produce(chunk(10)))
        assert third.body["throttle_ms"] > second.body["throttle_ms"]


def produce(data: bytes, acks: int = 1) -> tuple[dict, list[bytes]]:
    body = {
        "acks": acks,
        "timeout_ms": 5000,
        "topics": [{"topic": "pq", "partitions": [{"partition": 0, "size": len(data)}]}],
    }
    return body, [data]


@pytest.mark.parametrize("sessions", [False, True])
async def test_a_consumer_over_its_byte_rate_gets_an_empty_answer_then_its_records(
    broker, sessions
):
    async with await RawClient.connect(broker.port, client_id="reader") as reader:
        assert (await reader.create_topic("fq"))["error"] == 0
        for i in range(3):
            assert (await reader.produce("fq", 0, chunk(i)))["error"] == 0
        await set_quota(broker.port, "reader", "consumer_byte_rate", QUOTA)
        session_id, epoch = 0, (0 if sessions else -1)

        async def fetch(offset: int):
            nonlocal session_id, epoch
            body = fetch_body({"fq": [(0, offset, 10 << 20)]}, max_bytes=10 << 20)
            body.update(session_id=session_id, session_epoch=epoch)
            resp = await reader.call(ApiKey.FETCH, body)
            if sessions:
                session_id = resp.body["session_id"] or session_id
                epoch = epoch + 1 if resp.body["session_id"] else 0
            return resp

        # the budget is capped at what the quota allows in its windows (100 KB): one
        # batch a fetch; the first is within the rate
        resp = await fetch(0)
        assert len(resp.tail) == len(chunk(0)) and "throttle_ms" not in resp.body
        # the next would make 120 KB in a second: answered empty, throttled, not counted
        resp = await fetch(1)
        assert resp.body["topics"] == [] and len(resp.tail) == 0
        assert resp.body["throttle_ms"] > 0
        # answered after the mute: the same partition, from where it was
        resp = await fetch(1)
        assert len(resp.tail) == len(chunk(1))
        [(offset, _, _, value, _)] = b.decode_records(bytes(resp.tail))
        assert offset == 1 and value == bytes([1]) * CHUNK


async def test_a_client_over_its_request_percentage_is_throttled(broker):
    await set_quota(broker.port, "busy", "request_percentage", 0.0001)
    async with await RawClient.connect(broker.port, client_id="busy") as busy:
        resp = await busy.call(ApiKey.METADATA, {"topics": None})
        # capped at one window, as Kafka caps request-time throttles
        assert 0 < resp.body["throttle_ms"] <= 1000


async def test_topic_mutations_over_the_controller_mutation_rate_are_refused(broker):
    """KIP-599 on the native door (always strict): 2 partitions a second, a bucket of two
    seconds' credit here; a topic arriving with the bucket overdrawn is refused."""
    await set_quota(broker.port, "mutator", "controller_mutation_rate", 2.0)
    async with await RawClient.connect(broker.port, client_id="mutator") as admin:
        assert (await admin.create_topic("m1", 3))["error"] == 0  # 4 credits: 1 left
        assert (await admin.create_topic("m2", 3))["error"] == 0  # taken whole: -2
        resp = await admin.call(
            ApiKey.CREATE_TOPICS,
            {"topics": [{"topic": "m3", "partitions": 1}], "timeout_ms": 5000},
        )
        [entry] = resp.body["topics"]
        assert entry["error"] == 89 and "controller_mutation_rate" in entry["message"]
        assert 500 <= resp.body["throttle_ms"] <= 1000  # two credits at two a second
        # answered after the mute, when the bucket is back at zero; deletions draw on it too
        resp = await admin.call(ApiKey.DELETE_TOPICS, {"topics": ["m1", "m2"]})
        assert [t["error"] for t in resp.body["topics"]] == [0, 89]
