"""Sequence bookkeeping and retry order, against a simulated deduplicating broker."""

from __future__ import annotations

import collections

from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.client.accumulator import ProducerBatch
from logmq.client.inflight import DeliveryTracker, Outcome
from logmq.errors import ErrorCode
from logmq.storage.batch import read_header

TP = ("t", 0)


def batch(n: int, tag: int) -> ProducerBatch:
    b = ProducerBatch("t", 0, created=0)
    b.records = [(i, 0, None, b"%d-%d" % (tag, i), None) for i in range(n)]
    return b


def test_sequences_are_consecutive_and_survive_retries():
    tr = DeliveryTracker(idempotent=True, max_in_flight=5, retry_backoff_ms=10)
    tr.set_producer(7, 0)
    bs = [batch(n, i) for i, n in enumerate((3, 1, 4))]
    payloads = [tr.prepare(b, 0) for b in bs]
    assert [read_header(p).base_sequence for p in payloads] == [0, 3, 4]
    assert all(read_header(p).producer_id == 7 for p in payloads)
    for b in bs:
        tr.sent(b)
    assert tr.room(TP) == 2
    # the first fails retriably; the others come back as gaps behind it: all retried
    assert tr.on_result(bs[0], ErrorCode.NOT_LEADER_OR_FOLLOWER, now=0) is Outcome.RETRY
    assert tr.on_result(bs[1], ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, now=0) is Outcome.RETRY
    assert tr.take_retries(TP, now=5) == []  # something still in flight, and backoff
    assert tr.on_result(bs[2], ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, now=0) is Outcome.RETRY
    assert tr.take_retries(TP, now=5) == []  # backoff not over
    again = tr.take_retries(TP, now=10)
    assert again == bs  # in sequence order
    assert [tr.prepare(b, 0) for b in again] == payloads  # the very same bytes


def test_real_gap_is_fatal_and_asks_for_new_producer_id():
    tr = DeliveryTracker(idempotent=True)
    tr.set_producer(1, 0)
    b = batch(1, 0)
    tr.prepare(b, 0)
    tr.sent(b)
    assert tr.on_result(b, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, now=0) is Outcome.FATAL
    assert tr.needs_new_producer_id
    tr.set_producer(2, 0)
    nb = batch(1, 1)
    assert read_header(tr.prepare(nb, 0)).base_sequence == 0


def test_non_retriable_and_exhausted_retries_fail():
    tr = DeliveryTracker(idempotent=False, retries=1)
    b = batch(1, 0)
    tr.prepare(b, 0)
    tr.sent(b)
    assert tr.on_result(b, ErrorCode.MESSAGE_TOO_LARGE, now=0) is Outcome.FAIL
    b = batch(1, 1)
    tr.sent(b)
    assert tr.on_result(b, ErrorCode.NETWORK_EXCEPTION, now=0) is Outcome.RETRY
    tr.take_retries(TP, now=1000)
    tr.sent(b)
    assert tr.on_result(b, ErrorCode.NETWORK_EXCEPTION, now=0) is Outcome.FAIL
    b = batch(1, 2)
    b.deadline = 50
    tr.sent(b)
    assert tr.on_result(b, ErrorCode.NETWORK_EXCEPTION, now=60) is Outcome.FAIL  # timed out


class DedupBroker:
    """The broker's idempotence rule for one partition and one producer id."""

    def __init__(self):
        self.next_seq = 0
        self.log: list[bytes] = []
        self.offsets: dict[int, int] = {}

    def produce(self, payload: bytes) -> tuple[int, int]:
        h = read_header(payload)
        if h.base_sequence == self.next_seq:
            self.offsets[h.base_sequence] = len(self.log)
            self.log.extend(b"%d" % (h.base_sequence + i) for i in range(h.record_count))
            self.next_seq += h.record_count
            return ErrorCode.NONE, self.offsets[h.base_sequence]
        if h.base_sequence in self.offsets:
            return ErrorCode.DUPLICATE_SEQUENCE_NUMBER, self.offsets[h.base_sequence]
        return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1


def test_retries_with_nowhere_to_go_expire_at_their_deadline():
    """A deleted topic's partition has no leader: its retried batches are never resent,
    so only their deadline can fail them (they used to wait forever)."""
    tr = DeliveryTracker(idempotent=True, retry_backoff_ms=10)
    tr.set_producer(1, 0)
    early, late = batch(1, 0), batch(1, 1)
    early.deadline, late.deadline = 100, 200
    for b in (early, late):
        tr.prepare(b, 0)
        tr.sent(b)
    assert tr.expire_retries(TP, now=150) == []  # in flight: their answers decide
    for b in (early, late):
        assert tr.on_result(b, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, now=0) is Outcome.RETRY
    assert tr.expire_retries(TP, now=99) == []
    assert tr.expire_retries(TP, now=150) == [early]
    assert tr.has_retries(TP) and tr.needs_new_producer_id  # given up: sequences restart
    assert tr.expire_retries(TP, now=200) == [late]
    assert not tr.has_retries(TP) and not tr.busy


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_lossy_network_never_duplicates_or_reorders(data):
    """Requests are lost, answered with retriable errors, or cut off with the connection;
    whatever happens, the log ends up holding every batch once, in sequence order."""
    tr = DeliveryTracker(idempotent=True, max_in_flight=data.draw(st.integers(1, 5)))
    tr.set_producer(1, 0)
    broker = DedupBroker()
    queue = collections.deque(batch(data.draw(st.integers(1, 3)), i) for i in range(12))
    all_batches = list(queue)
    wire: collections.deque[ProducerBatch] = collections.deque()  # requests in order
    now = 0
    for _ in range(400):
        if all(b.done for b in all_batches):
            break
        action = data.draw(st.sampled_from(["send", "deliver", "deliver", "tick"]))
        if action == "send":
            if tr.has_retries(TP):
                taken = tr.take_retries(TP, now)
            else:
                taken = []
                while queue and len(taken) < tr.room(TP):
                    taken.append(queue.popleft())
            for b in taken:
                tr.prepare(b, 0)
                tr.sent(b)
                wire.append(b)
        elif action == "deliver" and wire:
            b = wire.popleft()
            fate = data.draw(st.sampled_from(["ok", "ok", "lost", "busy", "cut"]))
            if fate == "busy":  # rejected before appending, with a retriable error
                code, offset = ErrorCode.NOT_ENOUGH_REPLICAS, -1
            else:
                code, offset = broker.produce(b.payload)
            if fate in ("lost", "cut"):
                code = ErrorCode.NETWORK_EXCEPTION
            outcome = tr.on_result(b, code, now)
            assert outcome is not Outcome.FATAL and outcome is not Outcome.FAIL
            if outcome is Outcome.COMPLETE:
                b.complete(offset)
            if fate == "cut":  # the connection drops: everything after it fails too
                while wire:
                    tr.on_result(wire.popleft(), ErrorCode.NETWORK_EXCEPTION, now)
        else:
            now += data.draw(st.integers(1, 200))
    # heal the network: answer what is on the wire, then send and answer the rest
    while wire:
        b = wire.popleft()
        code, offset = broker.produce(b.payload)
        if tr.on_result(b, code, now) is Outcome.COMPLETE:
            b.complete(offset)
    for _ in range(200):
        if all(b.done for b in all_batches):
            break
        now += 1000
        taken = tr.take_retries(TP, now) if tr.has_retries(TP) else []
        if not taken:
            while queue and len(taken) < tr.room(TP):
                taken.append(queue.popleft())
        for b in taken:
            tr.prepare(b, 0)
            tr.sent(b)
            code, offset = broker.produce(b.payload)
            assert tr.on_result(b, code, now) is Outcome.COMPLETE
            b.complete(offset)
    assert all(b.done and b.error is None for b in all_batches)
    total = sum(b.record_count for b in all_batches)
    assert broker.log == [b"%d" % i for i in range(total)]
    # each batch learnt the offset its records really got
    seq = 0
    for b in all_batches:
        assert b.base_offset == seq
        seq += b.record_count
