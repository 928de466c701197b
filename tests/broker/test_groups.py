"""Consumer group APIs end to end: raw protocol against real ``logmq-server`` processes.

Join/heartbeat/revocation, commits and their fencing, zombies after session expiry,
static members, admin commits and deletions, the internal offsets topic, bad input, and
a broker restart (clean and SIGKILL) that rebuilds groups and offsets from the log.
Nothing sleeps to synchronise: waits are conditions with deadlines.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logmq.errors import ErrorCode
from logmq.net.codec import ApiKey
from logmq.storage import batch as b
from tests.harness import BrokerProcess
from tests.net.raw_client import RawClient

GROUP_ARGS = [
    "--offsets-topic-partitions",
    "3",
    "--group-min-session-timeout-ms",
    "100",
]
GROUP_APIS = {8, 9, 10, 16, 42, 47, 68, 69}
DEADLINE_S = 20.0


@pytest.fixture(scope="module")
def group_broker(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("groups") / "data", extra_args=GROUP_ARGS)
    broker.start()
    yield broker
    broker.close()


@pytest.fixture
async def client(group_broker):
    c = await RawClient.connect(group_broker.port)
    yield c
    await c.close()


# -- protocol helpers -------------------------------------------------------------------
async def ready_call(c: RawClient, key: int, body: dict[str, Any]) -> dict[str, Any]:
    """Call, retrying while the coordinator is still loading its partition."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        resp = (await c.call(key, body)).body
        if resp.get("error") != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            return resp
        assert time.monotonic() < deadline, f"coordinator never loaded: {resp}"
        await asyncio.sleep(0.01)


def heartbeat_body(group: str, member_id: str = "", epoch: int = 0, **fields: Any) -> dict:
    body = {
        "group_id": group,
        "member_id": member_id,
        "member_epoch": epoch,
        "instance_id": None,
        "rebalance_timeout_ms": 10_000,
        "session_timeout_ms": None,
        "subscribed_topics": None,
        "server_assignor": None,
        "owned_partitions": None,
    }
    body.update(fields)
    return body


def tps(tp_list: list[dict] | None) -> set[tuple[str, int]]:
    return {(e["topic"], p) for e in tp_list or () for p in e["partitions"]}


def tp_list(owned: set[tuple[str, int]]) -> list[dict]:
    by_topic: dict[str, list[int]] = {}
    for t, p in sorted(owned):
        by_topic.setdefault(t, []).append(p)
    return [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]


def commit_body(group: str, member_id: str | None, epoch: int, offsets: dict) -> dict:
    by_topic: dict[str, list[dict]] = {}
    for (t, p), (offset, metadata) in offsets.items():
        by_topic.setdefault(t, []).append({"partition": p, "offset": offset, "metadata": metadata})
    return {
        "group_id": group,
        "member_id": member_id,
        "member_epoch": epoch,
        "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
    }


def commit_errors(resp: dict) -> dict[tuple[str, int], int]:
    return {
        (t["topic"], p["partition"]): p["error"] for t in resp["topics"] for p in t["partitions"]
    }


async def fetch_offsets(c: RawClient, group: str, topics=None) -> dict[tuple[str, int], int]:
    resp = await ready_call(c, ApiKey.OFFSET_FETCH, {"group_id": group, "topics": topics})
    assert resp["error"] == 0, resp
    return {
        (t["topic"], p["partition"]): p["offset"] for t in resp["topics"] for p in t["partitions"]
    }


async def describe(c: RawClient, group: str) -> dict:
    """The group's description, retrying while its shard loads (a per-group error)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        resp = await ready_call(c, ApiKey.CONSUMER_GROUP_DESCRIBE, {"group_ids": [group]})
        described = resp["groups"][0]
        if described["error"] != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            return described
        assert time.monotonic() < deadline, f"coordinator never loaded: {described}"
        await asyncio.sleep(0.01)


class Member:
    """A well-behaved consumer: owns exactly its last assignment, reports it every beat."""

    def __init__(self, c: RawClient, group: str, topics=("t",), **fields: Any):
        self.c, self.group, self.topics, self.fields = c, group, list(topics), fields
        self.member_id, self.epoch, self.owned = "", 0, set()

    async def beat(self) -> dict:
        joining = self.epoch == 0
        body = heartbeat_body(
            self.group,
            self.member_id,
            self.epoch,
            subscribed_topics=self.topics if joining else None,
            owned_partitions=None if joining else tp_list(self.owned),
            **self.fields,
        )
        resp = await ready_call(self.c, ApiKey.CONSUMER_GROUP_HEARTBEAT, body)
        if resp["error"] == 0 and resp["assignment"] is not None:
            self.member_id, self.epoch = resp["member_id"], resp["member_epoch"]
            self.owned = tps(resp["assignment"])
        return resp

    async def commit(self, offsets: dict) -> dict:
        body = commit_body(self.group, self.member_id, self.epoch, offsets)
        return await ready_call(self.c, ApiKey.OFFSET_COMMIT, body)


async def settle(c: RawClient, members: list[Member], group: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        for m in members:
            assert (await m.beat())["error"] == 0
        if (await describe(c, group))["state"] == "stable":
            return
        assert time.monotonic() < deadline, await describe(c, group)


async def ensure_topic(c: RawClient, name: str, partitions: int) -> None:
    entry = await c.create_topic(name, partitions)
    assert entry["error"] in (0, ErrorCode.TOPIC_ALREADY_EXISTS), entry


# -- tests ------------------------------------------------------------------------------
async def test_apis_listed_and_offsets_topic_created_on_first_use(broker_factory):
    broker = broker_factory(extra_args=GROUP_ARGS)
    async with await RawClient.connect(broker.port) as c:
        apis = {k for k, _, _ in (await c.call(ApiKey.API_VERSIONS, {})).body["apis"]}
        assert apis >= GROUP_APIS
        topics = (await c.call(ApiKey.METADATA, {"topics": None})).body["topics"]
        assert "__consumer_offsets" not in {t["topic"] for t in topics}
        found = (await c.call(ApiKey.FIND_COORDINATOR, {"key_type": 0, "keys": ["g", ""]})).body
        good, empty = found["coordinators"]
        assert (good["error"], good["node_id"], good["port"]) == (0, 1, broker.port)
        assert good["host"] == "127.0.0.1"
        assert empty["error"] == ErrorCode.INVALID_GROUP_ID and empty["message"]
        # key type 1 (transactional ids) is served too; others are not
        other = await c.call(ApiKey.FIND_COORDINATOR, {"key_type": 2, "keys": ["tx"]})
        assert other.body["coordinators"][0]["error"] == ErrorCode.INVALID_REQUEST
        meta = await c.call(ApiKey.METADATA, {"topics": ["__consumer_offsets"]})
        (offsets_topic,) = meta.body["topics"]
        assert offsets_topic["internal"] is True and len(offsets_topic["partitions"]) == 3
        configs = await c.call(
            ApiKey.DESCRIBE_CONFIGS,
            {"resources": [{"type": "topic", "name": "__consumer_offsets"}]},
        )
        values = {e["name"]: e["value"] for e in configs.body["resources"][0]["configs"]}
        assert values["cleanup.policy"] == "compact" and values["retention.ms"] == "-1"


async def test_join_heartbeat_revocation_and_describe(client):
    await ensure_topic(client, "t", 4)
    a, b = Member(client, "g-join"), Member(client, "g-join")
    assert (await a.beat())["error"] == 0 and a.owned == {("t", p) for p in range(4)}
    first = await b.beat()
    assert first["error"] == 0 and b.owned == set(), "nothing moves before a revokes"
    assert first["heartbeat_interval_ms"] > 0
    await settle(client, [a, b], "g-join")
    assert a.owned.isdisjoint(b.owned) and len(a.owned | b.owned) == 4
    group = await describe(client, "g-join")
    assert group["error"] == 0 and group["assignor"] == "sticky"
    assert group["group_epoch"] == group["assignment_epoch"] == 2
    for m in group["members"]:
        assert (m["client_id"], m["client_host"]) == ("raw-test", "127.0.0.1")
        assert m["subscribed_topics"] == ["t"] and m["state"] == "stable"
        assert tps(m["assignment"]) == tps(m["target"]) and m["pending_revocation"] == []
    left = await ready_call(
        client, ApiKey.CONSUMER_GROUP_HEARTBEAT, heartbeat_body("g-join", b.member_id, -1)
    )
    assert (left["error"], left["member_epoch"], left["assignment"]) == (0, -1, None)
    await settle(client, [a], "g-join")
    assert a.owned == {("t", p) for p in range(4)}


async def test_commits_are_fenced_and_validated_per_partition(client):
    await ensure_topic(client, "t", 4)
    a = Member(client, "g-commit")
    await a.beat()
    ok = await a.commit({("t", 0): (10, "m"), ("t", 1): (3, None)})
    assert ok["error"] == 0 and set(commit_errors(ok).values()) == {0}
    assert await fetch_offsets(client, "g-commit") == {("t", 0): 10, ("t", 1): 3}
    body = commit_body("g-commit", a.member_id, a.epoch, {("t", 0): (99, "")})
    for member_id, epoch, code in [
        ("ghost", a.epoch, ErrorCode.UNKNOWN_MEMBER_ID),
        (a.member_id, a.epoch - 1, ErrorCode.STALE_MEMBER_EPOCH),
        (a.member_id, a.epoch + 1, ErrorCode.FENCED_MEMBER_EPOCH),
        (None, -1, ErrorCode.NON_EMPTY_GROUP),
    ]:
        resp = await ready_call(
            client, ApiKey.OFFSET_COMMIT, {**body, "member_id": member_id, "member_epoch": epoch}
        )
        assert resp["error"] == code and set(commit_errors(resp).values()) == {code}, resp
    mixed = await a.commit(
        {
            ("t", 2): (5, ""),
            ("t", 9): (1, ""),
            ("nope", 0): (1, ""),
            ("t", 3): (-4, ""),
            ("t", 0): (11, "x" * 4097),
        }
    )
    assert mixed["error"] == 0
    assert commit_errors(mixed) == {
        ("t", 2): 0,
        ("t", 9): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ("nope", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ("t", 3): ErrorCode.INVALID_REQUEST,
        ("t", 0): ErrorCode.OFFSET_METADATA_TOO_LARGE,
    }
    assert await fetch_offsets(client, "g-commit") == {("t", 0): 10, ("t", 1): 3, ("t", 2): 5}
    fetched = await ready_call(
        client,
        ApiKey.OFFSET_FETCH,
        {"group_id": "g-commit", "topics": [{"topic": "t", "partitions": [0, 3]}]},
    )
    row0, row3 = fetched["topics"][0]["partitions"]
    assert (row0["offset"], row0["metadata"], row0["error"]) == (10, "m", 0)
    assert row0["commit_timestamp"] > 0
    assert (row3["offset"], row3["metadata"], row3["commit_timestamp"]) == (-1, None, -1)
    unknown = await fetch_offsets(client, "never-seen", [{"topic": "t", "partitions": [0]}])
    assert unknown == {("t", 0): -1}


async def test_zombie_commits_after_session_expiry_are_rejected(client):
    await ensure_topic(client, "t", 4)
    zombie = Member(client, "g-zombie", session_timeout_ms=200)
    live = Member(client, "g-zombie")
    await settle(client, [zombie, live], "g-zombie")
    deadline = time.monotonic() + DEADLINE_S
    while live.owned != {("t", p) for p in range(4)}:  # only the live member heartbeats
        assert (await live.beat())["error"] == 0
        assert time.monotonic() < deadline, "the silent member never expired"
        await asyncio.sleep(0.02)
    resp = await zombie.commit({("t", 0): (77, "")})
    assert resp["error"] == ErrorCode.UNKNOWN_MEMBER_ID
    beat = await zombie.beat()
    assert beat["error"] == ErrorCode.UNKNOWN_MEMBER_ID and beat["assignment"] is None
    assert (await fetch_offsets(client, "g-zombie")).get(("t", 0)) is None


async def test_static_member_rejoins_with_its_partitions(client):
    await ensure_topic(client, "t", 4)
    a = Member(client, "g-static", instance_id="host-a")
    b = Member(client, "g-static", instance_id="host-b")
    await settle(client, [a, b], "g-static")
    epoch, kept = (await describe(client, "g-static"))["group_epoch"], set(a.owned)
    left = await ready_call(
        client,
        ApiKey.CONSUMER_GROUP_HEARTBEAT,
        heartbeat_body("g-static", a.member_id, -2, instance_id="host-a"),
    )
    assert (left["error"], left["member_epoch"]) == (0, -2)
    away = [m for m in (await describe(client, "g-static"))["members"] if m["left_temporarily"]]
    assert [m["instance_id"] for m in away] == ["host-a"]
    await b.beat()
    assert b.owned.isdisjoint(kept), "the absent member's partitions stay reserved"
    again = Member(client, "g-static", instance_id="host-a")
    assert (await again.beat())["error"] == 0
    assert again.owned == kept and again.member_id != a.member_id
    assert (await describe(client, "g-static"))["group_epoch"] == epoch, "no rebalance"
    assert (await a.commit({("t", 0): (1, "")}))["error"] == ErrorCode.UNKNOWN_MEMBER_ID


async def test_assignor_choice_and_bad_heartbeats(client):
    await ensure_topic(client, "t", 4)
    first = Member(client, "g-assignor", server_assignor="range")
    assert (await first.beat())["error"] == 0
    assert (await describe(client, "g-assignor"))["assignor"] == "range"
    cases = [
        (dict(server_assignor="roundrobin", subscribed_topics=["t"]), ErrorCode.INVALID_REQUEST),
        (dict(server_assignor="fancy", subscribed_topics=["t"]), ErrorCode.INVALID_REQUEST),
        (dict(session_timeout_ms=50, subscribed_topics=["t"]), ErrorCode.INVALID_SESSION_TIMEOUT),
        (
            dict(session_timeout_ms=10**9, subscribed_topics=["t"]),
            ErrorCode.INVALID_SESSION_TIMEOUT,
        ),
        (dict(subscribed_topics=None), ErrorCode.INVALID_REQUEST),
        (dict(subscribed_topics=["bad topic!"]), ErrorCode.INVALID_REQUEST),
        (dict(instance_id="", subscribed_topics=["t"]), ErrorCode.INVALID_REQUEST),
        (dict(rebalance_timeout_ms=0, subscribed_topics=["t"]), ErrorCode.INVALID_REQUEST),
        (dict(member_epoch=-7, subscribed_topics=["t"]), ErrorCode.INVALID_REQUEST),
        (dict(member_epoch=3, member_id="ghost"), ErrorCode.UNKNOWN_MEMBER_ID),
        (
            dict(member_epoch=first.epoch + 5, member_id=first.member_id),
            ErrorCode.FENCED_MEMBER_EPOCH,
        ),
        (dict(group_id="", subscribed_topics=["t"]), ErrorCode.INVALID_GROUP_ID),
        (dict(group_id="x" * 2000, subscribed_topics=["t"]), ErrorCode.INVALID_GROUP_ID),
    ]
    before = await describe(client, "g-assignor")
    for fields, code in cases:
        body = heartbeat_body("g-assignor", **fields)
        resp = await ready_call(client, ApiKey.CONSUMER_GROUP_HEARTBEAT, body)
        assert resp["error"] == code, (fields, resp)
        assert resp["message"] and resp["assignment"] is None
    assert await describe(client, "g-assignor") == before, "errors change nothing"


async def test_malformed_bodies_get_invalid_request_and_the_connection_stays(client):
    cases = [
        (ApiKey.FIND_COORDINATOR, {"keys": "g"}),
        (ApiKey.FIND_COORDINATOR, {"keys": [1]}),
        (ApiKey.CONSUMER_GROUP_HEARTBEAT, {"group_id": "g", "member_epoch": "0"}),
        (ApiKey.CONSUMER_GROUP_HEARTBEAT, heartbeat_body("g", owned_partitions=[{"topic": 1}])),
        (ApiKey.CONSUMER_GROUP_HEARTBEAT, heartbeat_body("g", subscribed_topics="t")),
        (ApiKey.OFFSET_COMMIT, {"group_id": "g", "topics": [{"topic": "t", "partitions": [{}]}]}),
        (ApiKey.OFFSET_COMMIT, {"group_id": 5, "topics": []}),
        (ApiKey.OFFSET_FETCH, {"group_id": "g", "topics": [{"topic": "t", "partitions": ["0"]}]}),
        (ApiKey.LIST_GROUPS, {"states": ["sleeping"]}),
        (ApiKey.CONSUMER_GROUP_DESCRIBE, {"group_ids": [None]}),
        (ApiKey.DELETE_GROUPS, {}),
        (ApiKey.OFFSET_DELETE, {"group_id": "g"}),
    ]
    for key, body in cases:
        resp = (await client.call(key, body)).body
        assert resp["error"] == ErrorCode.INVALID_REQUEST and resp["message"], (key, body, resp)
    assert (await client.call(ApiKey.API_VERSIONS, {})).body["error"] == 0


async def test_admin_commits_offset_delete_and_delete_groups(client):
    await ensure_topic(client, "t", 4)
    admin = commit_body("g-admin", None, -1, {("t", 0): (4, "reset")})
    assert (await ready_call(client, ApiKey.OFFSET_COMMIT, admin))["error"] == 0
    assert await fetch_offsets(client, "g-admin") == {("t", 0): 4}
    listed = await ready_call(client, ApiKey.LIST_GROUPS, {"states": ["EMPTY"]})
    assert {
        "group_id": "g-admin",
        "state": "empty",
        "members": 0,
        "type": "consumer",
        "protocol_type": "consumer",
    } in listed["groups"]
    a = Member(client, "g-admin")
    await a.beat()
    assert (await ready_call(client, ApiKey.OFFSET_COMMIT, admin))["error"] == (
        ErrorCode.NON_EMPTY_GROUP
    )
    delete_body = {"group_id": "g-admin", "topics": [{"topic": "t", "partitions": [0]}]}
    refused = await ready_call(client, ApiKey.OFFSET_DELETE, delete_body)
    assert refused["error"] == ErrorCode.NON_EMPTY_GROUP
    assert refused["topics"][0]["partitions"][0]["error"] == ErrorCode.NON_EMPTY_GROUP
    deleted = await ready_call(client, ApiKey.DELETE_GROUPS, {"group_ids": ["g-admin", "nope", ""]})
    assert [g["error"] for g in deleted["groups"]] == [
        ErrorCode.NON_EMPTY_GROUP,
        ErrorCode.GROUP_ID_NOT_FOUND,
        ErrorCode.INVALID_GROUP_ID,
    ]
    await ready_call(
        client, ApiKey.CONSUMER_GROUP_HEARTBEAT, heartbeat_body("g-admin", a.member_id, -1)
    )
    assert (await ready_call(client, ApiKey.OFFSET_DELETE, delete_body))["error"] == 0
    assert await fetch_offsets(client, "g-admin") == {}
    deleted = await ready_call(client, ApiKey.DELETE_GROUPS, {"group_ids": ["g-admin"]})
    assert deleted["groups"][0]["error"] == 0
    assert (await describe(client, "g-admin"))["error"] == ErrorCode.GROUP_ID_NOT_FOUND
    listed = await ready_call(client, ApiKey.LIST_GROUPS, {"states": None})
    assert "g-admin" not in {g["group_id"] for g in listed["groups"]}


async def test_the_offsets_topic_is_protected(client):
    await ready_call(client, ApiKey.FIND_COORDINATOR, {"key_type": 0, "keys": ["g"]})
    data = b.encode_values([b"x"], timestamp=1)
    produced = await client.produce("__consumer_offsets", 0, data)
    assert produced["error"] == ErrorCode.INVALID_TOPIC_EXCEPTION and produced["message"]
    created = await client.create_topic("__consumer_offsets", 3)
    assert created["error"] == ErrorCode.INVALID_TOPIC_EXCEPTION
    deleted = await client.call(ApiKey.DELETE_TOPICS, {"topics": ["__consumer_offsets"]})
    assert deleted.body["topics"][0]["error"] == ErrorCode.INVALID_TOPIC_EXCEPTION
    for key, value in [("retention.ms", "1000"), ("cleanup.policy", "delete")]:
        altered = await client.call(
            ApiKey.ALTER_CONFIGS,
            {"resources": [{"type": "topic", "name": "__consumer_offsets", "set": {key: value}}]},
        )
        assert altered.body["resources"][0]["error"] == ErrorCode.INVALID_CONFIG


async def test_topics_created_and_deleted_reach_the_groups(client):
    a = Member(client, "g-meta", topics=("late",))
    assert (await a.beat())["error"] == 0 and a.owned == set()
    await ensure_topic(client, "late", 2)
    deadline = time.monotonic() + DEADLINE_S
    while a.owned != {("late", 0), ("late", 1)}:
        assert (await a.beat())["error"] == 0
        assert time.monotonic() < deadline
    assert (await a.commit({("late", 1): (8, "")}))["error"] == 0
    deleted = await client.call(ApiKey.DELETE_TOPICS, {"topics": ["late"]})
    assert deleted.body["topics"][0]["error"] == 0
    deadline = time.monotonic() + DEADLINE_S
    while await fetch_offsets(client, "g-meta"):  # the deletion reaches the group
        assert time.monotonic() < deadline, "offsets of a deleted topic stayed"
        await asyncio.sleep(0.01)
    while a.owned:
        assert (await a.beat())["error"] == 0
        assert time.monotonic() < deadline


async def test_pipelined_commits_are_answered_in_order(client):
    await ensure_topic(client, "t", 4)
    a = Member(client, "g-pipe")
    await a.beat()
    sent = [
        client.send(
            ApiKey.OFFSET_COMMIT, commit_body("g-pipe", a.member_id, a.epoch, {("t", 0): (i, "")})
        )
        for i in range(200)
    ]
    answers = [await client.recv() for _ in sent]
    assert [r.correlation_id for r in answers] == sent
    assert all(r.body["error"] == 0 for r in answers)
    assert await fetch_offsets(client, "g-pipe") == {("t", 0): 199}


@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_restart_rebuilds_groups_and_offsets_from_the_log(broker_factory, how):
    broker = broker_factory(extra_args=GROUP_ARGS)
    async with await RawClient.connect(broker.port) as c:
        await ensure_topic(c, "t", 6)
        members = [Member(c, "g-restart"), Member(c, "g-restart", instance_id="s1")]
        await settle(c, members, "g-restart")
        for i, m in enumerate(members):
            assert (await m.commit({tp: (100 + i, "meta") for tp in m.owned}))["error"] == 0
        admin = commit_body("g-solo", None, -1, {("t", 5): (55, "")})
        assert (await ready_call(c, ApiKey.OFFSET_COMMIT, admin))["error"] == 0
        before = await describe(c, "g-restart")
        offsets = await fetch_offsets(c, "g-restart")
    assert broker.stop() == 0 if how == "stop" else broker.kill() is not None
    broker.start()
    async with await RawClient.connect(broker.port) as c:
        assert await describe(c, "g-restart") == before
        assert await fetch_offsets(c, "g-restart") == offsets
        assert await fetch_offsets(c, "g-solo") == {("t", 5): 55}
        for m in members:  # the members carry on with the epochs they had
            m.c = c
            resp = await m.beat()
            assert resp["error"] == 0 and tps(resp["assignment"]) == m.owned


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    key=st.sampled_from(sorted(GROUP_APIS)),
    body=st.dictionaries(
        st.sampled_from(
            [
                "group_id",
                "member_id",
                "member_epoch",
                "topics",
                "group_ids",
                "keys",
                "subscribed_topics",
                "owned_partitions",
                "states",
                "session_timeout_ms",
                "instance_id",
                "server_assignor",
                "rebalance_timeout_ms",
                "key_type",
            ]
        ),
        st.recursive(
            st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(
                    st.sampled_from(["topic", "partitions", "partition", "offset"]),
                    inner,
                    max_size=3,
                )
            ),
            max_leaves=8,
        ),
        max_size=6,
    ),
)
def test_fuzzed_group_requests_always_get_an_answer(group_broker, key, body):
    async def run() -> None:
        async with await RawClient.connect(group_broker.port) as c:
            resp = await c.call(key, body)
            assert isinstance(resp.body.get("error", 0), int) or "groups" in resp.body
            assert resp.body.get("error") != ErrorCode.UNKNOWN_SERVER_ERROR, resp.body

    asyncio.run(run())
    assert group_broker.running
