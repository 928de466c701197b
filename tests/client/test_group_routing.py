"""Coordinator routing of group requests (ClusterClient.group_request), with a fake
connection: coordinator moves and lost connections are retried after looking the
coordinator up again; other answers come back as they are."""

from __future__ import annotations

import pytest

from logmq.client.cluster import BrokerInfo, ClusterClient
from logmq.errors import ConnectionError_, ErrorCode, RequestTimedOutError
from logmq.net.codec import ApiKey, Response


class FakeConnection:
    def __init__(self, answers: list) -> None:
        self.answers = answers
        self.sent: list = []

    async def request(self, api_key, body, timeout=None):
        self.sent.append((api_key, body))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return Response(0, answer, memoryview(b""))


def client_with(conn: FakeConnection, monkeypatch) -> tuple[ClusterClient, list]:
    cluster = ClusterClient("127.0.0.1:1", retry_backoff_ms=1)
    lookups: list[str] = []

    async def coordinator_connection(group_id):
        if group_id not in cluster._coordinators:
            lookups.append(group_id)
            cluster._coordinators[group_id] = BrokerInfo(1, "127.0.0.1", 1)
        return conn

    monkeypatch.setattr(cluster, "coordinator_connection", coordinator_connection)
    return cluster, lookups


@pytest.mark.parametrize(
    "moved",
    [
        {"error": int(ErrorCode.NOT_COORDINATOR)},
        {"error": int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)},
        ConnectionError_("lost"),
    ],
)
async def test_coordinator_moves_are_retried_after_a_new_lookup(monkeypatch, moved):
    conn = FakeConnection([moved, moved, {"error": 0, "ok": True}])
    cluster, lookups = client_with(conn, monkeypatch)
    resp = await cluster.group_request("g", ApiKey.OFFSET_FETCH, {"group_id": "g"}, timeout=5)
    assert resp.body["ok"] is True
    assert lookups == ["g", "g", "g"]  # looked up again after each move
    assert len(conn.sent) == 3


async def test_other_answers_are_returned_as_they_are(monkeypatch):
    conn = FakeConnection([{"error": int(ErrorCode.NON_EMPTY_GROUP)}])
    cluster, _ = client_with(conn, monkeypatch)
    resp = await cluster.group_request("g", ApiKey.OFFSET_COMMIT, {}, timeout=5)
    assert resp.body["error"] == ErrorCode.NON_EMPTY_GROUP


async def test_group_level_error_reader(monkeypatch):
    moved = {"groups": [{"error": int(ErrorCode.NOT_COORDINATOR)}]}
    conn = FakeConnection([moved, {"groups": [{"error": 0}]}])
    cluster, lookups = client_with(conn, monkeypatch)
    resp = await cluster.group_request(
        "g",
        ApiKey.DELETE_GROUPS,
        {},
        error_of=lambda b: b["groups"][0]["error"],
        timeout=5,
    )
    assert resp.body["groups"][0]["error"] == 0
    assert lookups == ["g", "g"]


async def test_gives_up_at_the_deadline(monkeypatch):
    conn = FakeConnection([{"error": int(ErrorCode.NOT_COORDINATOR)}] * 1000)
    cluster, _ = client_with(conn, monkeypatch)
    with pytest.raises(RequestTimedOutError, match="NOT_COORDINATOR"):
        await cluster.group_request("g", ApiKey.OFFSET_FETCH, {}, timeout=0.2)
