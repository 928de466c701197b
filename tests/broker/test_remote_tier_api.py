"""DescribeRemoteTier (1001) on its own: the handler over a fake RemoteLogManager and a
fake metadata image (the real broker's answer is in tests/cli/test_storage_cli.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from logmq.errors import LogMQError
from logmq.native.registry import NATIVE_APIS
from logmq.native.remote_tier_api import ROW_FIELDS, RemoteTierApi
from logmq.net.codec import ApiKey, Request


def status_row(topic: str, partition: int, **over: Any) -> dict[str, Any]:
    row = {
        "topic": topic,
        "partition": partition,
        "tiered": True,
        "log_start_offset": 0,
        "local_log_start_offset": 500,
        "local_bytes": 4096,
        "remote_segments": 5,
        "remote_bytes": 20480,
        "highest_copied_offset": 499,
        "copy_lag_segments": 1,
        "copy_lag_bytes": 1024,
        "pending_deletes": 0,
        "last_error": None,
        "internal_only": "not for the wire",
    }
    row.update(over)
    return row


class FakeRemoteLog:
    node_id = 2

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def status(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.rows]


@dataclass
class FakePartition:
    leader: int


class FakeImage:
    def __init__(self, leaders: dict[tuple[str, int], int]) -> None:
        self.leaders = leaders

    def partition(self, topic: str, partition: int) -> FakePartition | None:
        leader = self.leaders.get((topic, partition))
        return None if leader is None else FakePartition(leader)


def request(body: dict[str, Any]) -> Request:
    return Request(int(ApiKey.DESCRIBE_REMOTE_TIER), 0, 7, "test", body, b"")


def api(rows: list[dict[str, Any]], leaders: dict[tuple[str, int], int]) -> RemoteTierApi:
    image = FakeImage(leaders)
    return RemoteTierApi(FakeRemoteLog(rows), lambda: image)  # type: ignore[arg-type]


def test_the_registry_declares_it_as_a_native_only_read() -> None:
    spec = NATIVE_APIS.get(1001)
    assert spec is not None and spec.key is ApiKey.DESCRIBE_REMOTE_TIER
    assert spec.handler is RemoteTierApi.describe_remote_tier
    assert spec.read_only and not spec.controller
    assert "DESCRIBE on the cluster" in spec.access.describe()


async def test_a_broker_that_does_not_tier_answers_an_empty_list() -> None:
    reply = await RemoteTierApi(None, lambda: None).describe_remote_tier(request({}))  # type: ignore[arg-type]
    assert reply.body == {"error": 0, "tiering": False, "broker_id": None, "partitions": []}


async def test_rows_are_the_status_with_leadership_sorted_and_nothing_more() -> None:
    rows = [status_row("b", 0), status_row("a", 1, last_error="store down"), status_row("a", 0)]
    reply = await api(rows, {("a", 0): 2, ("a", 1): 3, ("b", 0): 2}).describe_remote_tier(
        request({})
    )
    body = reply.body
    assert body["tiering"] is True and body["broker_id"] == 2 and body["error"] == 0
    parts = body["partitions"]
    assert [(p["topic"], p["partition"]) for p in parts] == [("a", 0), ("a", 1), ("b", 0)]
    assert [p["leader"] for p in parts] == [True, False, True]
    assert set(parts[0]) == {*ROW_FIELDS, "leader"}  # internal fields stay home
    assert parts[1]["last_error"] == "store down"
    assert parts[0]["copy_lag_bytes"] == 1024 and parts[0]["remote_bytes"] == 20480


async def test_a_deleted_topic_is_left_out() -> None:
    reply = await api(
        [status_row("gone", 0), status_row("kept", 0)], {("kept", 0): 2}
    ).describe_remote_tier(request({}))
    assert [p["topic"] for p in reply.body["partitions"]] == ["kept"]


async def test_filters_by_partition_and_by_topic() -> None:
    rows = [status_row("a", 0), status_row("a", 1), status_row("b", 0)]
    handler = api(rows, dict.fromkeys([("a", 0), ("a", 1), ("b", 0)], 2))
    one = await handler.describe_remote_tier(
        request({"partitions": [{"topic": "a", "partition": 1}, {"topic": "c", "partition": 0}]})
    )
    assert [(p["topic"], p["partition"]) for p in one.body["partitions"]] == [("a", 1)]
    topic = await handler.describe_remote_tier(request({"topics": ["b"]}))
    assert [(p["topic"], p["partition"]) for p in topic.body["partitions"]] == [("b", 0)]
    everything = await handler.describe_remote_tier(request({"partitions": None, "topics": None}))
    assert len(everything.body["partitions"]) == 3


@pytest.mark.parametrize(
    "body",
    [
        {"partitions": "a"},
        {"partitions": [{"topic": "a"}]},
        {"partitions": [{"topic": 1, "partition": 0}]},
        {"topics": [1]},
        {"topics": "a"},
    ],
)
async def test_a_malformed_filter_is_invalid_request(body: dict[str, Any]) -> None:
    with pytest.raises(LogMQError) as err:
        await api([status_row("a", 0)], {("a", 0): 2}).describe_remote_tier(request(body))
    assert err.value.code.name == "INVALID_REQUEST"
