"""Per-member options, assignor choice, deletion, listing and commit limits of the cores."""

from __future__ import annotations

import itertools

from logmq.errors import ErrorCode
from logmq.group import (
    GroupConfig,
    GroupCoordinator,
    GroupListing,
    GroupRecord,
    GroupState,
    MemberOptions,
    coordinator_partition,
)
from logmq.group.codec import RecordKey, RecordType, encode_key, encode_value
from logmq.group.consumer_group import ConsumerGroup

CONFIG = GroupConfig(
    session_timeout_ms=1000,
    heartbeat_interval_ms=100,
    rebalance_timeout_ms=5000,
    min_session_timeout_ms=100,
    max_session_timeout_ms=10_000,
    max_commit_bytes=2000,
)
TOPICS = {"t": 4, "u": 2}


def new_group(**kw) -> ConsumerGroup:
    ids = (f"gen-{i}" for i in itertools.count())
    return ConsumerGroup(
        "g", config=CONFIG, topic_partitions=TOPICS, **kw, member_id_factory=lambda: next(ids)
    )


def coordinator() -> GroupCoordinator:
    return GroupCoordinator(0, 1, CONFIG, topic_partitions=TOPICS)


def replayed(records: list[GroupRecord], compact: bool = False) -> GroupCoordinator:
    if compact:
        newest = {r.key: r for r in records}
        records = [r for r in newest.values() if r.value is not None]
    copy = coordinator()
    copy.replay(records)
    return copy


def join(target, member_id, topics=("t",), now_ms=0, **options):
    if isinstance(target, GroupCoordinator):
        return target.heartbeat(
            "g", member_id, 0, None, topics, None, now_ms, MemberOptions(**options)
        )
    return target.heartbeat(member_id, 0, None, topics, None, now_ms, MemberOptions(**options))


def test_member_session_timeout_is_its_own_and_validated():
    group = new_group()
    assert join(group, "short", session_timeout_ms=200).error is ErrorCode.NONE
    assert join(group, "default").error is ErrorCode.NONE
    before = group.describe()
    for bad in (99, 10_001):
        result = join(group, "x", session_timeout_ms=bad)
        assert result.error is ErrorCode.INVALID_SESSION_TIMEOUT
    assert group.describe() == before and group.member("x") is None
    assert group.tick(199) == []
    assert group.tick(200) == ["short"]
    assert group.tick(999) == [] and group.tick(1000) == ["default"]


def test_heartbeat_interval_never_lets_a_short_session_expire():
    group = new_group()
    assert join(group, "a", session_timeout_ms=150).heartbeat_interval_ms == 50
    assert join(group, "b").heartbeat_interval_ms == CONFIG.heartbeat_interval_ms


def test_member_rebalance_timeout_bounds_its_revocation():
    group = new_group()
    a = join(group, "a", rebalance_timeout_ms=300)
    join(group, "b")
    told = group.heartbeat("a", a.member_epoch, owned_partitions=a.assigned_partitions, now_ms=10)
    assert len(told.assigned_partitions) == 2, "asked to give up two"
    assert group.member("a").revocation_deadline_ms == 310
    assert group.heartbeat(
        "a", 0, None, None, None, 0, MemberOptions(rebalance_timeout_ms=0)
    ).error is (ErrorCode.INVALID_REQUEST)


def test_first_member_picks_the_assignor_and_later_ones_must_agree():
    c = coordinator()
    assert join(c, "a", server_assignor="range").error is ErrorCode.NONE
    assert c.describe("g").description.assignor == "range"
    assert join(c, "b", server_assignor="roundrobin").error is ErrorCode.INVALID_REQUEST
    assert join(c, "b", server_assignor="nonsense").error is ErrorCode.INVALID_REQUEST
    assert join(c, "b").error is ErrorCode.NONE, "null keeps the group's assignor"
    assert join(c, "c", server_assignor="range").error is ErrorCode.NONE
    records = c.take_records()
    assert replayed(records).describe("g") == c.describe("g")
    for member in ("a", "b", "c"):
        c.heartbeat("g", member, -1)
    assert join(c, "d", server_assignor="roundrobin").error is ErrorCode.NONE, "group was empty"
    assert c.describe("g").description.assignor == "roundrobin"
    records += c.take_records()
    for compact in (False, True):
        assert replayed(records, compact).describe("g").description.assignor == "roundrobin"


def test_client_id_and_host_are_described_and_survive_replay():
    c = coordinator()
    join(c, "a", client_id="app-1", client_host="10.0.0.7", session_timeout_ms=500)
    member = c.describe("g").description.members[0]
    assert (member.client_id, member.client_host) == ("app-1", "10.0.0.7")
    copy = replayed(c.take_records())
    assert copy.describe("g") == c.describe("g")
    assert copy.next_deadline_ms() == 500, "the member's own session after a replay"


def test_delete_group_tombstones_everything_and_stays_deleted_after_replay():
    c = coordinator()
    a = join(c, "a")
    assert c.commit_offsets("g", "a", a.member_epoch, {("t", 0): (3, "")}) == {
        ("t", 0): ErrorCode.NONE
    }
    assert c.delete_group("g") is ErrorCode.NON_EMPTY_GROUP
    c.heartbeat("g", "a", -1)
    records = c.take_records()
    assert c.delete_group("g") is ErrorCode.NONE
    tombstones = c.take_records()
    assert tombstones and all(r.value is None for r in tombstones)
    live_keys = {r.key for r in replayed_keys(records)}
    assert {r.key for r in tombstones} == live_keys, "every key the group still had"
    assert c.describe("g").error is ErrorCode.GROUP_ID_NOT_FOUND
    assert c.delete_group("g") is ErrorCode.GROUP_ID_NOT_FOUND
    for compact in (False, True):
        copy = replayed(records + tombstones, compact)
        assert copy.group_ids() == [] and copy.list_groups() == []
        assert copy.fetch_offsets("g", [("t", 0)]).offsets == {("t", 0): None}


def replayed_keys(records: list[GroupRecord]) -> list[GroupRecord]:
    newest = {r.key: r for r in records}
    return [r for r in newest.values() if r.value is not None]


def test_temporarily_left_static_member_keeps_the_group_non_empty():
    c = coordinator()
    c.heartbeat("g", "a", 0, "inst", ["t"], None, 0)
    c.heartbeat("g", "a", -2, "inst")
    assert c.delete_group("g") is ErrorCode.NON_EMPTY_GROUP
    assert c.alter_offsets("g", {("t", 0): (1, "")}) == {("t", 0): ErrorCode.NON_EMPTY_GROUP}


def test_deleted_topics_lose_their_offsets_even_with_members():
    c = coordinator()
    a = join(c, "a", topics=("t", "u"))
    c.commit_offsets("g", "a", a.member_epoch, {("t", 0): (1, ""), ("u", 1): (2, "")})
    c.take_records()
    c.delete_topic_offsets({"u"})
    records = c.take_records()
    assert [r.value for r in records] == [None]
    one = c.fetch_offsets("g", [("t", 0)]).offsets[("t", 0)]
    assert c.fetch_offsets("g").offsets == {("t", 0): one}


def test_list_groups_reports_state_and_member_count():
    c = coordinator()
    join(c, "a")
    c.alter_offsets("g", {("t", 0): (1, "")})  # refused: g has a member
    other = GroupCoordinator(0, 1, CONFIG, topic_partitions=TOPICS)
    other.alter_offsets("solo", {("t", 0): (1, "")})
    assert c.list_groups() == [GroupListing("g", GroupState.STABLE, 1)]
    assert other.list_groups() == [GroupListing("solo", GroupState.EMPTY, 0)]


def test_failed_first_requests_leave_no_phantom_group():
    c = coordinator()
    assert c.heartbeat("g", "", 0, None, None).error is ErrorCode.INVALID_REQUEST
    assert c.commit_offsets("g", "", -1, {("nope", 0): (1, "")}) == {
        ("nope", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    }
    assert c.alter_offsets("g", {("t", 0): (-1, "")}) == {("t", 0): ErrorCode.INVALID_REQUEST}
    assert c.list_groups() == [] and c.take_records() == []


def test_too_big_a_commit_is_refused_whole():
    c = coordinator()
    a = join(c, "a")
    c.take_records()
    big = {("t", p): (1, "m" * 600) for p in range(4)}
    assert set(c.commit_offsets("g", "a", a.member_epoch, big).values()) == {
        ErrorCode.INVALID_COMMIT_OFFSET_SIZE
    }
    assert c.take_records() == [] and c.fetch_offsets("g").offsets == {}
    small = {("t", p): (1, "m") for p in range(4)}
    assert set(c.commit_offsets("g", "a", a.member_epoch, small).values()) == {ErrorCode.NONE}


def test_a_corrupt_group_does_not_keep_the_others_from_loading():
    c = GroupCoordinator(0, 1, CONFIG, topic_partitions=TOPICS)
    c.alter_offsets("good", {("t", 0): (5, "")})
    records = c.take_records()
    bad_key = encode_key(RecordKey(RecordType.GROUP_METADATA, "bad"))
    records.append(GroupRecord(bad_key, encode_value({"epoch": "x"})))
    records.append(GroupRecord(b"\xc1garbage", b"\x80"))
    copy = coordinator()
    failed = copy.replay(records)
    assert set(failed) == {"bad", ""}
    assert copy.group_ids() == ["good"]
    assert copy.fetch_offsets("good", [("t", 0)]).offsets[("t", 0)].offset == 5


def test_routing_is_stable_for_the_wire_hash():
    assert coordinator_partition("orders", 50) == coordinator_partition("orders", 50)
    assert {coordinator_partition(f"g{i}", 3) for i in range(50)} == {0, 1, 2}
