"""Scenarios of the consumer group state machine, its records and the coordinator."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.errors import ErrorCode
from logmq.group import (
    GroupConfig,
    GroupCoordinator,
    GroupRecord,
    GroupState,
    MemberState,
    OffsetStore,
    RangeAssignor,
    coordinator_partition,
)
from logmq.group.codec import (
    RecordKey,
    RecordType,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from logmq.group.consumer_group import ConsumerGroup

CONFIG = GroupConfig(session_timeout_ms=1000, heartbeat_interval_ms=100, rebalance_timeout_ms=5000)


def new_group(**kw) -> ConsumerGroup:
    ids = (f"gen-{i}" for i in itertools.count())
    return ConsumerGroup(
        "g",
        config=CONFIG,
        topic_partitions={"t": 4, "u": 2},
        **kw,
        member_id_factory=lambda: next(ids),
    )


def replayed(group: ConsumerGroup, records: list[GroupRecord]) -> ConsumerGroup:
    copy = ConsumerGroup("g", group.assignor, CONFIG, topic_partitions={"t": 4, "u": 2})
    copy.replay(records)
    return copy


def compacted(records: list[GroupRecord]) -> list[GroupRecord]:
    newest = {r.key: r for r in records}
    return [r for r in newest.values() if r.value is not None]


class Client:
    """A well-behaved consumer: owns exactly what the last response gave it."""

    def __init__(self, group, member_id, instance_id=None, topics=("t",)):
        self.group, self.member_id, self.instance_id = group, member_id, instance_id
        self.topics, self.epoch, self.owned = set(topics), 0, frozenset()

    def beat(self, now_ms=0):
        result = self.group.heartbeat(
            self.member_id,
            self.epoch,
            self.instance_id,
            self.topics if self.epoch == 0 else None,
            self.owned,
            now_ms,
        )
        if result.error is ErrorCode.NONE and result.assigned_partitions is not None:
            self.member_id, self.epoch = result.member_id, result.member_epoch
            self.owned = result.assigned_partitions
        return result


def settle(group, clients, now_ms=0, rounds=10):
    for _ in range(rounds):
        for client in clients:
            assert client.beat(now_ms).error is ErrorCode.NONE
        if group.describe().state is GroupState.STABLE:
            return
    raise AssertionError(f"group did not settle: {group.describe()}")


def test_join_gets_everything_then_second_member_takes_half_after_revocation():
    group = new_group()
    a, b = Client(group, "a"), Client(group, "b")
    assert a.beat().assigned_partitions == {("t", p) for p in range(4)}
    b.beat()
    assert b.owned == frozenset(), "nothing handed over before a revokes"
    revoke = a.beat()
    assert len(revoke.assigned_partitions) == 2 and revoke.member_epoch == 1
    assert group.member("a").state is MemberState.UNREVOKED_PARTITIONS
    b.beat()
    assert b.owned == frozenset(), "a has not confirmed the revocation yet"
    assert a.beat().member_epoch == 2  # a now reports only two: revocation done
    assert len(b.beat().assigned_partitions) == 2
    assert a.owned.isdisjoint(b.owned)
    assert group.describe().state is GroupState.STABLE


def test_members_whose_partitions_do_not_move_keep_them_throughout():
    group = new_group()
    a, b = Client(group, "a"), Client(group, "b")
    settle(group, [a, b])
    kept = dict(a=a.owned, b=b.owned)
    c = Client(group, "c")
    c.beat()
    for _ in range(4):
        for client in (a, b, c):
            client.beat()
            if client is not c:
                # they only ever shrink towards their new target, never lose the rest
                assert client.owned <= kept[client.member_id]
                assert len(client.owned) >= 1
    settle(group, [a, b, c])
    assert sorted(len(x.owned) for x in (a, b, c)) == [1, 1, 2]


def test_lost_response_accepted_with_previous_epoch():
    group = new_group()
    a = Client(group, "a")
    a.beat()
    b = Client(group, "b")
    b.beat()
    a.beat()  # revocation step
    old_epoch = a.epoch
    lost = group.heartbeat("a", a.epoch, owned_partitions=a.owned)  # response lost
    assert lost.member_epoch == old_epoch + 1
    again = group.heartbeat("a", old_epoch, owned_partitions=a.owned)
    assert again.error is ErrorCode.NONE and again.member_epoch == old_epoch + 1
    # a previous epoch claiming more than it was given is fenced
    bogus = group.heartbeat("a", old_epoch, owned_partitions={("t", p) for p in range(4)})
    assert bogus.error is ErrorCode.FENCED_MEMBER_EPOCH


def test_unknown_member_and_bad_epochs():
    group = new_group()
    assert group.heartbeat("ghost", 3).error is ErrorCode.UNKNOWN_MEMBER_ID
    a = Client(group, "a")
    a.beat()
    assert group.heartbeat("a", 7, owned_partitions=set()).error is ErrorCode.FENCED_MEMBER_EPOCH
    assert group.heartbeat("a", -5).error is ErrorCode.INVALID_REQUEST
    assert group.heartbeat("b", 0).error is ErrorCode.INVALID_REQUEST  # join must subscribe
    assert group.heartbeat("a", 1, instance_id="other").error is ErrorCode.UNKNOWN_MEMBER_ID
    assert group.take_records() != []  # only a's join wrote anything
    before = group.describe()
    group.heartbeat("a", 9, owned_partitions=set())
    assert group.describe() == before and group.take_records() == []


def test_generated_member_id_when_client_sends_none():
    group = new_group()
    result = group.heartbeat("", 0, subscribed_topics={"t"})
    assert result.member_id == "gen-0" and group.member("gen-0") is not None


def test_session_expiry_frees_partitions_for_others():
    group = new_group()
    a, b = Client(group, "a"), Client(group, "b")
    settle(group, [a, b])
    assert group.next_deadline_ms() == CONFIG.session_timeout_ms
    b.beat(now_ms=900)
    assert group.tick(999) == []
    assert group.tick(1000) == ["a"]
    b.beat(now_ms=1000)
    assert b.owned == {("t", p) for p in range(4)}
    assert group.commit_offsets("a", a.epoch, {("t", 0): (1, "")}) == {
        ("t", 0): ErrorCode.UNKNOWN_MEMBER_ID
    }


def test_member_that_never_revokes_is_fenced_after_rebalance_timeout():
    group = new_group()
    a = Client(group, "a")
    a.beat()
    b = Client(group, "b")
    b.beat()
    a.beat()  # told to revoke
    for now in range(0, 5001, 500):
        group.heartbeat("a", a.epoch, owned_partitions={("t", p) for p in range(4)}, now_ms=now)
        b.beat(now)
    assert group.tick(5000) == ["a"]
    b.beat(5000)
    assert b.owned == {("t", p) for p in range(4)}


def test_static_member_temporary_leave_and_rejoin_keeps_assignment():
    group = new_group()
    a, b = Client(group, "a", "inst-a"), Client(group, "b", "inst-b")
    settle(group, [a, b])
    epoch, owned = group.group_epoch, a.owned
    left = group.heartbeat("a", -2, "inst-a", now_ms=100)
    assert left.member_epoch == -2
    b.beat(200)
    assert b.owned.isdisjoint(owned), "a's partitions stay reserved"
    assert group.tick(1099) == []
    restarted = Client(group, "a2", "inst-a")
    restarted.beat(1099)
    assert restarted.owned == owned
    assert group.group_epoch == epoch, "no reassignment"
    assert group.member("a") is None
    assert group.heartbeat("a", a.epoch).error is ErrorCode.UNKNOWN_MEMBER_ID


def test_static_member_expires_after_session_timeout_when_it_does_not_return():
    group = new_group()
    a, b = Client(group, "a", "inst-a"), Client(group, "b", "inst-b")
    settle(group, [a, b])
    group.heartbeat("a", -2, "inst-a", now_ms=0)
    b.beat(900)
    assert group.tick(1000) == ["a"]
    settle(group, [b], now_ms=1000)
    assert b.owned == {("t", p) for p in range(4)}


def test_static_member_restart_after_crash_gets_partitions_back():
    group = new_group()
    a, b = Client(group, "a", "inst-a"), Client(group, "b", "inst-b")
    settle(group, [a, b])
    owned, epoch = a.owned, group.group_epoch
    restarted = Client(group, "a-new", "inst-a")  # crashed: never said goodbye
    restarted.beat(10)
    assert restarted.owned == owned and group.group_epoch == epoch


def test_leave_reassigns_and_rejoin_with_epoch_zero_resets():
    group = new_group()
    a, b = Client(group, "a"), Client(group, "b")
    settle(group, [a, b])
    assert group.heartbeat("b", -1).member_epoch == -1
    settle(group, [a])
    assert a.owned == {("t", p) for p in range(4)}
    fenced_again = group.heartbeat("a", 0, subscribed_topics={"t"})
    assert fenced_again.assigned_partitions == a.owned


def test_subscription_change_and_metadata_change_bump_epoch():
    group = new_group()
    a = Client(group, "a")
    a.beat()
    epoch = group.group_epoch
    group.heartbeat("a", a.epoch, subscribed_topics={"t", "u"}, owned_partitions=a.owned)
    assert group.group_epoch == epoch + 1
    group.update_metadata({"t": 4, "u": 3})
    assert group.group_epoch == epoch + 2
    group.update_metadata({"t": 4, "u": 3, "other": 9})
    assert group.group_epoch == epoch + 2, "unsubscribed topics do not matter"
    result = group.heartbeat("a", a.epoch, owned_partitions=a.owned)
    assert len(result.assigned_partitions) == 7


def test_commit_errors_leave_state_untouched():
    group = new_group()
    a = Client(group, "a")
    a.beat()
    group.take_records()
    good = {("t", 0): (10, "m")}
    assert group.commit_offsets("a", a.epoch, good) == {("t", 0): ErrorCode.NONE}
    bad = {
        "zombie": group.commit_offsets("zz", 1, good),
        "stale": group.commit_offsets("a", a.epoch - 1, good),
        "fenced": group.commit_offsets("a", a.epoch + 1, good),
        "anonymous": group.commit_offsets("", -1, good),
        "metadata": group.commit_offsets("a", a.epoch, {("t", 0): (11, "x" * 4097)}),
        "unknown": group.commit_offsets("a", a.epoch, {("t", 4): (1, ""), ("v", 0): (1, "")}),
        "negative": group.commit_offsets("a", a.epoch, {("t", 0): (-3, "")}),
    }
    assert bad["zombie"][("t", 0)] is ErrorCode.UNKNOWN_MEMBER_ID
    assert bad["stale"][("t", 0)] is ErrorCode.STALE_MEMBER_EPOCH
    assert bad["fenced"][("t", 0)] is ErrorCode.FENCED_MEMBER_EPOCH
    assert bad["anonymous"][("t", 0)] is ErrorCode.UNKNOWN_MEMBER_ID
    assert bad["metadata"][("t", 0)] is ErrorCode.OFFSET_METADATA_TOO_LARGE
    assert set(bad["unknown"].values()) == {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    assert bad["negative"][("t", 0)] is ErrorCode.INVALID_REQUEST
    assert group.fetch_offsets([("t", 0)])[("t", 0)].offset == 10
    assert len(group.take_records()) == 1, "only the good commit was written"


def test_reset_rejected_while_members_live_then_allowed_when_empty():
    group = new_group()
    a = Client(group, "a")
    a.beat()
    assert group.alter_offsets({("t", 1): (0, "")}) == {("t", 1): ErrorCode.NON_EMPTY_GROUP}
    assert group.delete_offsets([("t", 1)]) is ErrorCode.NON_EMPTY_GROUP
    group.heartbeat("a", -1)
    assert group.alter_offsets({("t", 1): (5, "")}, now_ms=7) == {("t", 1): ErrorCode.NONE}
    assert group.commit_offsets("", -1, {("t", 2): (3, "")}) == {("t", 2): ErrorCode.NONE}
    assert group.delete_offsets([("t", 1)]) is ErrorCode.NONE
    assert group.fetch_offsets() == {("t", 2): group.offsets.get(("t", 2))}


def test_replay_reproduces_describe_from_full_and_compacted_log():
    group = new_group(assignor=RangeAssignor())
    a, b = Client(group, "a", "inst-a"), Client(group, "b")
    records = []
    a.beat()
    b.beat()
    a.beat()  # a mid-revocation
    group.commit_offsets("a", a.epoch, {("t", 0): (4, "meta")}, now_ms=5)
    records += group.take_records()
    for source in (records, compacted(records)):
        copy = replayed(group, source)
        assert copy.describe() == group.describe()
        assert copy.member("a").state is MemberState.UNREVOKED_PARTITIONS
    settle(group, [a, b])
    group.heartbeat("a", -2, "inst-a", now_ms=1)
    group.heartbeat("b", -1)
    records += group.take_records()
    for source in (records, compacted(records)):
        assert replayed(group, source).describe() == group.describe()


def test_replayed_group_continues_where_the_old_coordinator_stopped():
    group = new_group()
    a, b = Client(group, "a"), Client(group, "b")
    settle(group, [a, b])
    copy = replayed(group, group.take_records())
    a.group = b.group = copy
    assert a.beat().error is ErrorCode.NONE and b.beat().error is ErrorCode.NONE
    assert a.owned.isdisjoint(b.owned) and len(a.owned | b.owned) == 4


def test_codec_keys_round_trip_and_reject_garbage():
    for key in (
        RecordKey(RecordType.OFFSET_COMMIT, "g", topic="t", partition=3),
        RecordKey(RecordType.GROUP_METADATA, "g"),
        RecordKey(RecordType.CURRENT_ASSIGNMENT, "g", member_id="m"),
    ):
        assert decode_key(encode_key(key)) == key
    for garbage in (b"", b"\xc1", b"\x92\x09\xa1g", b"\x92\x00\x01"):
        with pytest.raises(ValueError):
            decode_key(garbage)


def test_offset_store_replay():
    store = OffsetStore("g")
    from logmq.group import CommittedOffset

    records = [store.commit(("t", 1), CommittedOffset(5, "x", 9))]
    records += store.delete([("t", 1), ("t", 2)])
    records.append(store.commit(("t", 2), CommittedOffset(7)))
    copy = OffsetStore("g")
    copy.replay(records)
    assert copy.fetch() == store.fetch() == {("t", 2): CommittedOffset(7)}


def test_coordinator_validates_group_ids_and_routes():
    coordinator = GroupCoordinator(
        partition=coordinator_partition("orders", 4),
        partition_count=4,
        config=CONFIG,
        topic_partitions={"t": 2},
    )
    assert coordinator.heartbeat("", "m", 0, subscribed_topics={"t"}).error is (
        ErrorCode.INVALID_GROUP_ID
    )
    other = next(
        g
        for g in (f"g{i}" for i in range(100))
        if coordinator.check_group_id(g) is ErrorCode.NOT_COORDINATOR
    )
    assert coordinator.heartbeat(other, "m", 0, subscribed_topics={"t"}).error is (
        ErrorCode.NOT_COORDINATOR
    )
    assert coordinator.commit_offsets("", "", -1, {("t", 0): (1, "")}) == {
        ("t", 0): ErrorCode.INVALID_GROUP_ID
    }
    assert coordinator.heartbeat("orders", "m", 4).error is ErrorCode.UNKNOWN_MEMBER_ID
    assert coordinator.group_ids() == []
    joined = coordinator.heartbeat("orders", "m", 0, subscribed_topics={"t"})
    assert joined.assigned_partitions == {("t", 0), ("t", 1)}
    assert coordinator.commit_offsets("orders", "m", joined.member_epoch, {("t", 0): (3, "")})
    assert coordinator.describe("nope").error in (
        ErrorCode.GROUP_ID_NOT_FOUND,
        ErrorCode.NOT_COORDINATOR,
    )
    assert coordinator.tick(CONFIG.session_timeout_ms) == {"orders": ["m"]}
    records = coordinator.take_records()
    fresh = GroupCoordinator(
        partition=coordinator.partition,
        partition_count=4,
        config=CONFIG,
        topic_partitions={"t": 2},
    )
    fresh.replay(records)
    assert fresh.describe("orders") == coordinator.describe("orders")
    assert fresh.fetch_offsets("orders", [("t", 0)]).offsets[("t", 0)].offset == 3


def test_partitions_moving_away_from_a_temporarily_left_member_are_released_at_once():
    group = new_group()
    a, b = Client(group, "a", "inst-a"), Client(group, "b", "inst-b")
    settle(group, [a, b])
    group.heartbeat("a", -2, "inst-a", now_ms=0)
    c = Client(group, "c")
    settle(group, [b, c])  # no session timeout needed for what moved to c
    assert c.owned and c.owned.isdisjoint(b.owned)
    kept = group.member("a").assigned
    assert kept and kept.isdisjoint(c.owned | b.owned)
    back = Client(group, "a2", "inst-a")
    back.beat(10)
    assert back.owned == kept


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=40))
def test_codec_rejects_any_garbage_with_value_error_only(raw):
    for decode in (decode_key, decode_value):
        try:
            decode(raw)
        except ValueError:
            pass


def test_heartbeat_accepts_wire_shaped_lists():
    group = new_group()
    joined = group.heartbeat("a", 0, None, ["t"], [], 0)
    owned = [[t, p] for t, p in joined.assigned_partitions]
    assert group.heartbeat("a", joined.member_epoch, None, None, owned, 1).error is (ErrorCode.NONE)


def test_replay_of_a_corrupt_record_is_a_value_error():
    key = encode_key(RecordKey(RecordType.GROUP_METADATA, "g"))
    with pytest.raises(ValueError, match="corrupt"):
        new_group().replay([GroupRecord(key, encode_value({"epoch": "x"}))])
    offset_key = encode_key(RecordKey(RecordType.OFFSET_COMMIT, "g", topic="t", partition=0))
    with pytest.raises(ValueError, match="corrupt"):
        new_group().replay([GroupRecord(offset_key, encode_value({}))])


def test_revocation_is_cancelled_when_the_target_gives_the_partition_back():
    group = new_group()
    a, b = Client(group, "a"), Client(group, "b")
    settle(group, [a, b])
    Client(group, "c").beat()
    (donor,) = [x for x in (a, b) if len(group.describe().members[(a, b).index(x)].target) < 2]
    before = donor.owned
    told = group.heartbeat(donor.member_id, donor.epoch, owned_partitions=before)
    assert len(told.assigned_partitions) == 1, "told to revoke one partition"
    group.heartbeat("c", -1)  # the newcomer leaves before the donor confirmed
    result = group.heartbeat(donor.member_id, donor.epoch, owned_partitions=before)
    assert result.assigned_partitions == before, "nothing given up after all"
    assert group.member(donor.member_id).pending_revocation == frozenset()
    assert group.member(donor.member_id).state is MemberState.STABLE
