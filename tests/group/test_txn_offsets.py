"""Transactional offsets (TxnOffsetCommit, KIP-98/447) in the group core, sans-IO.

Pending offsets are invisible until the producer's marker (``complete_txn``); COMMIT
makes them committed unless a later write of the partition came first, ABORT drops
them; require_stable sees them; groups holding them cannot be deleted; a reload
(``replay`` + ``replay_pending``) restores exactly what the running core had.
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.errors import ErrorCode as E
from logmq.group import GroupConfig, GroupCoordinator, GroupRecord, JoinAnswer, MemberOptions
from logmq.group.offsets import OpenTxnOffset

TP = ("t", 0)
TP1 = ("t", 1)


def coordinator() -> GroupCoordinator:
    ids = itertools.count()
    return GroupCoordinator(
        config=GroupConfig(initial_rebalance_delay_ms=0),
        topic_partitions={"t": 4},
        member_id_factory=lambda: f"id{next(ids)}",
    )


def committed(core: GroupCoordinator, tp=TP, group: str = "g") -> int | None:
    c = core.fetch_offsets(group, [tp]).offsets[tp]
    return None if c is None else c.offset


def txn(core, pid, offset, tp=TP, epoch=0, group="g", **kw):
    return core.txn_offset_commit(group, pid, epoch, {tp: (offset, "m")}, **kw)


def classic_member(core: GroupCoordinator, instance_id: str | None = None) -> tuple[str, int]:
    """A classic group "g" with one member: (member id, generation)."""
    args = ("consumer", (("range", b""),), 10_000, 30_000, "c", "h", True, 0)
    answer = core.join_group(1, "g", "", instance_id, *args)
    if isinstance(answer, JoinAnswer) and answer.error is E.MEMBER_ID_REQUIRED:
        answer = core.join_group(2, "g", answer.member_id, instance_id, *args)
    if not isinstance(answer, JoinAnswer):  # parked: answered once the join completes
        (_, answer), *_ = core.take_completions()
    assert answer.error is E.NONE
    return answer.member_id, answer.generation


def test_pending_offsets_are_invisible_until_the_commit_marker():
    core = coordinator()
    core.alter_offsets("g", {TP: (5, "")})
    core.take_records()
    assert txn(core, 7, 10, epoch=3) == {TP: E.NONE}
    records = core.take_records()
    assert [(r.producer_id, r.producer_epoch) for r in records] == [(7, 3)]
    assert committed(core) == 5  # the last committed value, not the pending one
    assert core.pending_offsets("g") == {TP}
    assert core.pending_offsets("g", [TP1]) == set()
    assert core.open_transactions() == {7: ["g"]}
    assert core.complete_txn(7, commit=True) == ["g"]
    assert committed(core) == 10
    assert core.pending_offsets("g") == set()
    assert core.open_transactions() == {}
    assert core.take_records() == []  # the marker is the record


def test_the_leader_epoch_a_transaction_committed_is_answered_after_its_marker():
    """KIP-320: the epoch of the last record consumed travels with the offset; a
    transactional commit keeps it as a plain commit does, through a reload too."""
    core = coordinator()
    log: list = []
    core.alter_offsets("g", {TP: (5, "", 2)})
    log += core.take_records()
    assert core.txn_offset_commit("g", 7, 0, {TP: (10, "m", 0), TP1: (20, "", 4)}) == {
        TP: E.NONE,
        TP1: E.NONE,
    }
    log += core.take_records()
    assert state(core) == ({TP: (5, 2)}, {TP, TP1}, {7: ["g"]})
    assert state(reload(log)) == state(core)  # pending, the epoch in the record
    core.complete_txn(7, commit=True)
    log.append(("marker", 7, True))
    assert state(core) == ({TP: (10, 0), TP1: (20, 4)}, set(), {})
    assert state(reload(log)) == state(core)
    c = core.fetch_offsets("g", [TP]).offsets[TP]
    assert (c.offset, c.metadata, c.leader_epoch) == (10, "m", 0)


def test_an_unknown_leader_epoch_is_minus_one_and_left_out_of_the_record():
    core = coordinator()
    core.alter_offsets("g", {TP: (5, ""), TP1: (6, "", -7)})  # no epoch; any negative
    assert state(core)[0] == {TP: (5, -1), TP1: (6, -1)}
    assert all(b"leader_epoch" not in r.value for r in core.take_records())


def test_abort_drops_them_and_a_group_that_only_had_them_goes():
    core = coordinator()
    txn(core, 7, 10, group="h")
    assert core.group_ids() == ["h"]
    assert core.complete_txn(7, commit=False) == []
    assert committed(core, group="h") is None
    assert core.group_ids() == []


def test_a_later_commit_of_the_same_producer_replaces_its_pending_offset():
    core = coordinator()
    txn(core, 7, 10)
    txn(core, 7, 12)
    core.complete_txn(7, commit=True)
    assert committed(core) == 12


def test_a_later_plain_commit_wins_over_an_earlier_transactional_one():
    core = coordinator()
    txn(core, 7, 10)
    core.alter_offsets("g", {TP: (20, "")})
    core.complete_txn(7, commit=True)
    assert committed(core) == 20
    assert core.pending_offsets("g") == set()


def test_between_transactions_the_later_record_wins():
    core = coordinator()
    txn(core, 1, 10)
    txn(core, 2, 20)
    core.complete_txn(2, commit=True)
    core.complete_txn(1, commit=True)  # its record is older: it does not overwrite
    assert committed(core) == 20
    txn(core, 1, 30, epoch=0)
    txn(core, 2, 40)
    core.complete_txn(2, commit=False)
    core.complete_txn(1, commit=True)
    assert committed(core) == 30


def test_require_stable_and_group_deletion_see_pending_offsets():
    core = coordinator()
    txn(core, 7, 10)
    assert core.delete_group("g") is E.NON_EMPTY_GROUP
    core.complete_txn(7, commit=False)
    core.alter_offsets("g", {TP: (1, "")})
    assert core.delete_group("g") is E.NONE


def test_validation_per_partition_and_fencing():
    core = coordinator()
    result = core.txn_offset_commit(
        "g", 7, 2, {TP: (1, ""), ("t", 9): (1, ""), TP1: (1, "x" * 10_000)}
    )
    assert result == {
        TP: E.NONE,
        ("t", 9): E.UNKNOWN_TOPIC_OR_PARTITION,
        TP1: E.OFFSET_METADATA_TOO_LARGE,
    }
    assert txn(core, 7, 2, epoch=1) == {TP: E.INVALID_PRODUCER_EPOCH}  # a zombie
    assert txn(core, 8, 2, epoch=1, known_epoch=2) == {TP: E.INVALID_PRODUCER_EPOCH}
    assert txn(core, 7, 2, epoch=-1) == {TP: E.INVALID_REQUEST}
    assert core.txn_offset_commit("", 7, 2, {TP: (1, "")}) == {TP: E.INVALID_GROUP_ID}
    assert txn(core, 9, 1, group="nobody", member_id="m", generation=1) == {TP: E.UNKNOWN_MEMBER_ID}


def test_classic_group_generation_member_and_instance_checks():
    core = coordinator()
    member_id, generation = classic_member(core, instance_id="i1")
    ok = txn(core, 7, 1, member_id=member_id, generation=generation, instance_id="i1")
    assert ok == {TP: E.NONE}
    assert txn(core, 7, 1, member_id=member_id, generation=generation + 1) == {
        TP: E.ILLEGAL_GENERATION
    }
    assert txn(core, 7, 1, member_id="other", generation=generation) == {TP: E.UNKNOWN_MEMBER_ID}
    assert txn(core, 7, 1, member_id="other", generation=generation, instance_id="i1") == {
        TP: E.FENCED_INSTANCE_ID
    }
    # v0-2 (and v3 without a member): nothing to check, even with members
    assert txn(core, 7, 1) == {TP: E.NONE}


def test_consumer_group_member_epoch_check():
    core = coordinator()
    hb = core.heartbeat("g", "", 0, None, ["t"], None, 0, MemberOptions())
    assert hb.error is E.NONE
    good = txn(core, 7, 1, member_id=hb.member_id, generation=hb.member_epoch)
    assert good == {TP: E.NONE}
    assert txn(core, 7, 1, member_id=hb.member_id, generation=hb.member_epoch - 1) == {
        TP: E.ILLEGAL_GENERATION
    }
    assert txn(core, 7, 1, member_id="ghost", generation=1) == {TP: E.UNKNOWN_MEMBER_ID}


def test_deleted_topics_pending_offsets_wait_for_the_marker_and_then_count_for_nothing():
    core = coordinator()
    txn(core, 7, 10)
    core.delete_topic_offsets({"t"})
    assert core.pending_offsets("g") == {TP}
    core.complete_txn(7, commit=True)
    assert committed(core) is None


# ---- replay ------------------------------------------------------------------------


def reload(log: list, upto: int | None = None) -> GroupCoordinator:
    """What the shard's loader does with a log of (GroupRecord | ("marker", pid, commit))
    entries, one offset each: newest per key, committed transactional records at their
    own position, open ones to replay_pending (a reference implementation in miniature)."""
    newest: dict[bytes, tuple[int, bytes | None]] = {}
    open_txns: dict[int, dict[bytes, tuple[int, GroupRecord]]] = {}
    for at, entry in enumerate(log[:upto]):
        if isinstance(entry, tuple):
            _, pid, commit = entry
            for key, (pos, rec) in open_txns.pop(pid, {}).items():
                if commit and newest.get(key, (-1, None))[0] < pos:
                    newest[key] = (pos, rec.value)
        elif entry.producer_id >= 0:
            by_key = open_txns.setdefault(entry.producer_id, {})
            by_key.pop(entry.key, None)
            by_key[entry.key] = (at, entry)
        else:
            newest[entry.key] = (at, entry.value)
    core = coordinator()
    assert core.replay([GroupRecord(k, v) for k, (_, v) in newest.items() if v is not None]) == {}
    still_open = sorted(
        (pos, rec, newest.get(key, (-1, None))[0] > pos)
        for records in open_txns.values()
        for key, (pos, rec) in records.items()
    )
    failed = core.replay_pending([OpenTxnOffset(r, pos, sup) for pos, r, sup in still_open])
    assert failed == {}
    return core


def state(core: GroupCoordinator) -> tuple:
    offsets = core.fetch_offsets("g").offsets
    return (
        {tp: (c.offset, c.leader_epoch) for tp, c in offsets.items()},
        core.pending_offsets("g"),
        core.open_transactions(),
    )


def test_replay_keeps_offsets_pending_until_the_marker():
    core = coordinator()
    log: list = []
    core.alter_offsets("g", {TP: (5, "")})
    log += core.take_records()
    txn(core, 7, 10, epoch=1)
    log += core.take_records()
    without_marker = reload(log)
    assert state(without_marker) == ({TP: (5, -1)}, {TP}, {7: ["g"]})
    # it fences the producer's older epochs (after the marker, the log's epoch does)
    assert txn(without_marker, 7, 1, epoch=0) == {TP: E.INVALID_PRODUCER_EPOCH}
    # and settles the marker as the running one does
    without_marker.complete_txn(7, commit=True)
    assert committed(without_marker) == 10
    core.complete_txn(7, commit=True)
    log.append(("marker", 7, True))
    assert state(reload(log)) == state(core) == ({TP: (10, -1)}, set(), {})


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("plain"), st.sampled_from([TP, TP1]), st.integers(0, 99)),
        st.tuples(st.just("txn"), st.sampled_from([1, 2]), st.sampled_from([TP, TP1])),
        st.tuples(st.just("marker"), st.sampled_from([1, 2]), st.booleans()),
        st.tuples(st.just("delete"), st.sampled_from([TP, TP1]), st.just(0)),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_a_reload_at_any_point_rebuilds_the_running_state(ops):
    core = coordinator()
    log: list = []
    counter = itertools.count(100)
    for op in ops:
        kind = op[0]
        if kind == "plain":
            core.alter_offsets("g", {op[1]: (op[2], "", op[2] % 3 - 1)})
        elif kind == "txn":
            offset = next(counter)
            core.txn_offset_commit("g", op[1], 0, {op[2]: (offset, "m", offset % 4)})
        elif kind == "delete":
            core.delete_offsets("g", [op[1]])
        elif op[1] in core.open_transactions():  # a marker only ends an open transaction
            core.complete_txn(op[1], op[2])
            log.append(op)
        log += core.take_records()
        assert state(reload(log)) == state(core)
