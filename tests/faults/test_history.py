"""The history checker: valid histories pass, and every kind of violation is caught.

Histories are generated from a small model of what a correct broker does (append-only
partition logs; an ack names the offset written; consumers read prefixes of the logs;
retention may delete a prefix), then one mutation breaks exactly one promise.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.faults.history import History, Kind, Status

TOPIC = "t"
WRITTEN = ("acked", "unknown_written")
KINDS = ("acked", "acked", "acked", "unknown_written", "unknown_lost", "failed", "pending")


@dataclass
class Send:
    client: str
    partition: int
    value: bytes
    kind: str  # one of KINDS
    ack_offset: int | None = None


@dataclass
class Model:
    partitions: int
    sends: list[Send] = field(default_factory=list)
    logs: dict[int, list[bytes]] = field(default_factory=dict)
    starts: dict[int, int] = field(default_factory=dict)
    reads: list[tuple[str, int, int, bytes]] = field(default_factory=list)

    def build(self) -> History:
        h = History()
        for n, s in enumerate(self.sends):
            h.attempt(s.client, TOPIC, s.partition, s.value, n)
        for i, s in enumerate(self.sends):
            if s.kind == "acked":
                h.acked(i, s.ack_offset, 1000 + i)
            elif s.kind == "failed":
                h.failed(i, "INVALID_RECORD", 1000 + i)
            elif s.kind != "pending":
                h.unknown(i, "REQUEST_TIMED_OUT", 1000 + i)
        for n, (reader, p, offset, value) in enumerate(self.reads):
            h.read(reader, TOPIC, p, offset, value, 500 + n)
        for p, log in self.logs.items():
            start = self.starts.get(p, 0)
            records = [(o, v) for o, v in enumerate(log) if o >= start]
            h.final_read(TOPIC, p, records, start_offset=start, end_offset=len(log))
        return h

    def offset_of(self, s: Send) -> int | None:
        log = self.logs[s.partition]
        return log.index(s.value) if s.value in log else None

    def retained(self, s: Send) -> bool:
        o = self.offset_of(s)
        return o is not None and o >= self.starts.get(s.partition, 0)


@st.composite
def valid_models(draw: st.DrawFn) -> Model:
    """Sends and reads interleaved as a correct single-copy log would produce them."""
    partitions = draw(st.integers(1, 3))
    clients = [f"p{i}" for i in range(draw(st.integers(1, 3)))]
    m = Model(partitions, logs={p: [] for p in range(partitions)})
    steps = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("send"), st.sampled_from(clients), st.sampled_from(KINDS)),
                st.tuples(st.just("read"), st.sampled_from(["c0", "c1"]), st.just("")),
            ),
            min_size=1,
            max_size=60,
        )
    )
    positions = {(r, p): 0 for r in ("c0", "c1") for p in range(partitions)}
    for n, (what, who, kind) in enumerate(steps):
        p = draw(st.integers(0, partitions - 1))
        if what == "send":
            s = Send(who, p, f"{who}-{n}".encode(), kind)
            if kind in WRITTEN:
                m.logs[p].append(s.value)
                if kind == "acked":
                    s.ack_offset = len(m.logs[p]) - 1
            m.sends.append(s)
        else:  # a consumer reads what is there now (all of it is below the HW)
            log = m.logs[p]
            upto = draw(st.integers(positions[(who, p)], len(log)))
            m.reads.extend((who, p, o, log[o]) for o in range(positions[(who, p)], upto))
            positions[(who, p)] = upto
    for p, log in m.logs.items():  # retention may have deleted a prefix
        m.starts[p] = draw(st.integers(0, len(log) // 2))
    return m


def _pick(data: st.DataObject, items: list, label: str):
    if not items:
        return None
    return data.draw(st.sampled_from(items), label=label)


# -- mutations: each breaks one promise and names the violation it must cause ----------
def lose_acked(m: Model, data: st.DataObject) -> Kind | None:
    s = _pick(data, [s for s in m.sends if s.kind == "acked" and m.retained(s)], "lost")
    if s is None:
        return None
    o = m.offset_of(s)
    if data.draw(st.booleans(), label="truncate tail"):
        del m.logs[s.partition][o:]  # e.g. a follower truncated to a stale HW and won
    else:
        m.logs[s.partition][o] = b"hole-" + s.value  # overwritten by another leader
        m.sends.append(Send("intruder", s.partition, b"hole-" + s.value, "unknown_written"))
    return Kind.LOST


def duplicate(m: Model, data: st.DataObject) -> Kind | None:
    s = _pick(data, [s for s in m.sends if m.retained(s)], "duplicated")
    if s is None:
        return None
    m.logs[s.partition].append(s.value)  # a retry appended twice
    return Kind.DUPLICATE


def reorder(m: Model, data: st.DataObject) -> Kind | None:
    lanes: dict[tuple[str, int], list[Send]] = {}
    for s in m.sends:
        if s.kind == "acked" and m.retained(s):
            lanes.setdefault((s.client, s.partition), []).append(s)
    pairs = [(a, b) for lane in lanes.values() for a, b in itertools.pairwise(lane)]
    pair = _pick(data, pairs, "swapped")
    if pair is None:
        return None
    a, b = pair
    log = m.logs[a.partition]
    oa, ob = log.index(a.value), log.index(b.value)
    log[oa], log[ob] = b.value, a.value
    a.ack_offset, b.ack_offset = ob, oa  # the acks agree with the log: only order is wrong
    m.reads = [r for r in m.reads if not (r[1] == a.partition and r[2] in (oa, ob))]
    return Kind.ORDER


def wrong_ack_offset(m: Model, data: st.DataObject) -> Kind | None:
    s = _pick(data, [s for s in m.sends if s.kind == "acked" and m.retained(s)], "acked")
    if s is None:
        return None
    start = m.starts.get(s.partition, 0)
    s.ack_offset = data.draw(
        st.integers(start, start + 100).filter(lambda o: o != s.ack_offset), label="offset"
    )
    return Kind.OFFSET_MISMATCH


def divergent_read(m: Model, data: st.DataObject) -> Kind | None:
    reads = [i for i, r in enumerate(m.reads) if r[2] >= m.starts.get(r[1], 0)]
    if data.draw(st.booleans(), label="read beyond the end") or not reads:
        p = data.draw(st.integers(0, m.partitions - 1), label="partition")
        s = Send("ghost", p, b"truncated-later", "unknown_lost")
        m.sends.append(s)  # read, then truncated away: it never reaches the final log
        m.reads.append(("c9", p, len(m.logs[p]) + data.draw(st.integers(0, 3)), s.value))
        return Kind.DIVERGENT_READ
    i = data.draw(st.sampled_from(reads), label="read")
    reader, p, offset, _ = m.reads[i]
    s = Send("other", p, b"other-leader-value", "unknown_lost")
    m.sends.append(s)  # a deposed leader served it, then lost it
    m.reads[i] = (reader, p, offset, s.value)
    return Kind.DIVERGENT_READ


def phantom(m: Model, data: st.DataObject) -> Kind | None:
    p = data.draw(st.integers(0, m.partitions - 1), label="partition")
    m.logs[p].append(b"nobody-sent-this")
    return Kind.UNEXPECTED


def failed_present(m: Model, data: st.DataObject) -> Kind | None:
    s = _pick(data, [s for s in m.sends if s.kind in ("failed", "unknown_written")], "failed")
    if s is None:
        return None
    if s.kind == "failed":
        m.logs[s.partition].append(s.value)
    else:
        if not m.retained(s):
            return None
        s.kind = "failed"
    return Kind.FAILED_PRESENT


def misplaced(m: Model, data: st.DataObject) -> Kind | None:
    if m.partitions < 2:
        return None
    s = _pick(data, m.sends, "copied")
    if s is None:
        return None
    if s.kind == "failed":
        s.kind = "unknown_lost"
    other = (s.partition + 1) % m.partitions
    m.logs[other].append(s.value)
    return Kind.MISPLACED


MUTATIONS = [
    lose_acked,
    duplicate,
    reorder,
    wrong_ack_offset,
    divergent_read,
    phantom,
    failed_present,
    misplaced,
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_models())
def test_valid_histories_pass(m: Model) -> None:
    result = m.build().check()
    assert result.ok, result.report()
    assert result.stats["attempts"] == len(m.sends)
    assert result.stats["reads"] == len(m.reads)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda f: f.__name__)
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)
@given(m=valid_models(), data=st.data())
def test_each_violation_is_detected(mutation, m: Model, data: st.DataObject) -> None:
    expected = mutation(m, data)
    if expected is None:
        return  # this history lacks what the mutation needs (e.g. no acked send)
    result = m.build().check()
    assert expected in result.kinds(), result.report()
    assert expected.value in result.report()


# -- examples ------------------------------------------------------------------------
def _history(*sends: tuple[str, int, bytes]) -> History:
    h = History()
    for client, p, v in sends:
        h.attempt(client, TOPIC, p, v, 0)
    return h


def test_values_must_be_unique_and_outcomes_final() -> None:
    h = _history(("p", 0, b"a"))
    with pytest.raises(ValueError, match="already sent"):
        h.attempt("q", TOPIC, 0, b"a", 1)
    h.acked(0, 0, 2)
    with pytest.raises(ValueError, match="already has outcome"):
        h.unknown(0, "timeout", 3)


def test_report_names_the_record_and_the_evidence() -> None:
    h = _history(("p", 0, b"a"), ("p", 0, b"b"))
    h.acked(0, 0, 5)
    h.acked(1, 1, 6)
    h.read("c", TOPIC, 0, 1, b"b", 7)
    h.final_read(TOPIC, 0, [(0, b"a")])
    result = h.check()
    assert result.kinds() == {Kind.LOST, Kind.DIVERGENT_READ}
    report = result.report()
    assert "lost: t-0@1 'b': acked at 1 to p at 6 ms, missing from the final log" in report
    assert "c read 'b' at 7 ms; the final log has nothing there" in report
    with pytest.raises(AssertionError, match="2 violation"):
        result.assert_ok()


def test_unknown_outcomes_may_go_either_way() -> None:
    h = _history(("p", 0, b"a"), ("p", 0, b"b"), ("p", 0, b"c"))
    h.unknown(0, "timeout", 1)
    h.unknown(1, "timeout", 1)  # 2 is still pending when the run ends
    h.final_read(TOPIC, 0, [(0, b"b"), (1, b"c")])
    result = h.check()
    assert result.ok, result.report()
    assert result.stats["unknown"] == 3
    assert result.stats["unknown_written"] == 1
    assert [a.value for a in h.outstanding()] == [b"c"]
    assert h.attempts[0].status is Status.UNKNOWN


def test_acks_without_offsets_are_checked_for_presence_only() -> None:
    h = _history(("p", 0, b"a"), ("p", 0, b"b"))
    h.acked(0, None, 1)  # acks=0 gives no offset
    h.acked(1, -1, 1)
    h.final_read(TOPIC, 0, [(3, b"a")], start_offset=3)
    result = h.check()
    assert result.kinds() == {Kind.LOST}
    assert result.of_kind(Kind.LOST)[0].value == b"b"


def test_reads_below_the_log_start_only_need_to_agree_with_each_other() -> None:
    h = _history(("p", 0, b"a"), ("p", 0, b"b"))
    h.acked(0, 0, 1)
    h.read("c1", TOPIC, 0, 0, b"a", 2)
    h.final_read(TOPIC, 0, [], start_offset=1, end_offset=1)
    assert h.check().ok
    h.read("c2", TOPIC, 0, 0, b"b", 3)
    assert h.check().kinds() == {Kind.DIVERGENT_READ}


def test_a_final_read_that_contradicts_itself_is_reported() -> None:
    h = _history(("p", 0, b"a"), ("p", 0, b"b"))
    h.final_read(TOPIC, 0, [(0, b"a"), (0, b"b")])
    result = h.check()
    assert [v.kind for v in result.violations] == [Kind.UNEXPECTED]
    assert "two records" in result.report()


def test_a_partition_never_read_loses_its_acked_records() -> None:
    h = _history(("p", 1, b"a"))
    h.acked(0, 0, 1)
    h.final_read(TOPIC, 0, [])
    assert h.check().kinds() == {Kind.LOST}
