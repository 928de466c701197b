"""Kafka fetch sessions (KIP-227) on the Kafka listener, with real clients.

kafka-python fetches in incremental sessions by default; a spy on its fetch-response
callback records what each response carried as the client received it (its session id,
error and partitions) and the session metadata the client had sent with the request.
The refusals (unknown session, wrong epoch) and the session-id rules are checked on a
raw socket with kio-encoded Fetch requests, as the other listener tests do.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader

from logmq.client import Admin, Producer
from logmq.errors import ErrorCode
from tests.harness import BrokerProcess
from tests.kafka.test_kafka_listener import connect, read_frame, request

kafka = pytest.importorskip("kafka")
from kafka.consumer.fetcher import FetchMetadata  # noqa: E402

DEADLINE_S = 60.0


def create(broker: BrokerProcess, topic: str, partitions: int) -> None:
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(topic, partitions)


def produce(broker: BrokerProcess, topic: str, records: list[tuple[int, str]]) -> None:
    """(partition, value) pairs, in order, through the native producer."""
    with Producer(broker.bootstrap) as p:
        for partition, value in records:
            p.send(topic, value, partition=partition)
        p.flush()


@dataclass(frozen=True)
class Seen:
    """One Fetch response as kafka-python received it, with the request's session."""

    sent_id: int
    sent_epoch: int
    error: int
    session_id: int
    partitions: frozenset[tuple[str, int]]
    # the client's view of its session when it sent the request: (topic, partition, offset)
    sent: frozenset[tuple[str, int, int]]


class FetchSpy:
    """Records every Fetch response the consumer's fetcher handles, then hands it on."""

    def __init__(self, consumer) -> None:
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        fetcher = consumer._fetcher
        self.fetcher = fetcher
        original = fetcher._handle_fetch_response

        def spy(node_id, fetch_offsets, send_time, response):
            handler = fetcher._session_handlers.get(node_id)
            meta = handler.next_metadata if handler is not None else FetchMetadata.LEGACY
            sent = handler.session_partitions if handler is not None else {}
            seen = Seen(
                meta.session_id,
                meta.epoch,
                response.error_code,
                response.session_id,
                frozenset(
                    (t.topic, p.partition_index) for t in response.responses for p in t.partitions
                ),
                frozenset((tp.topic, tp.partition, v.fetch_offset) for tp, v in sent.items()),
            )
            with self._lock:
                self.seen.append(seen)
            return original(node_id, fetch_offsets, send_time, response)

        fetcher._handle_fetch_response = spy

    def since(self, mark: int) -> list[Seen]:
        with self._lock:
            return self.seen[mark:]

    def mark(self) -> int:
        with self._lock:
            return len(self.seen)

    def handler(self):
        [handler] = self.fetcher._session_handlers.values()
        return handler


def consumer_of(broker: BrokerProcess, topic: str, partitions: range):
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=broker.kafka_bootstrap,
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
    )
    assert consumer.config["enable_incremental_fetch_sessions"]
    spy = FetchSpy(consumer)
    tps = [kafka.TopicPartition(topic, p) for p in partitions]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    return consumer, spy


def settle(consumer, spy: FetchSpy, sent: set[tuple[str, int, int]]) -> None:
    """Poll until a response comes back to a request sent with exactly ``sent`` as the
    client's session: the broker's session then holds the same, every partition's HW
    told (the partitions the client forgot while it held their records are back)."""
    deadline = time.monotonic() + DEADLINE_S
    while not any(s.sent == sent for s in spy.since(0)):
        assert time.monotonic() < deadline, "the client's session never settled"
        assert consumer.poll(timeout_ms=100) == {}


def read(consumer, count: int) -> list:
    got: list = []
    deadline = time.monotonic() + DEADLINE_S
    while len(got) < count:
        assert time.monotonic() < deadline, f"read {len(got)} of {count}"
        for records in consumer.poll(timeout_ms=1000).values():
            got += records
    return got


def by_partition(records) -> dict[int, list[tuple[int, bytes]]]:
    out: dict[int, list[tuple[int, bytes]]] = {}
    for r in records:
        out.setdefault(r.partition, []).append((r.offset, r.value))
    return out


def assert_one_session(seen: list[Seen], partitions: set[tuple[str, int]] | None = None) -> int:
    """The first response opened a session in full; every later one continued it."""
    first, *rest = seen
    assert first.sent_epoch == 0  # kafka-python asked to open one
    assert first.error == 0 and first.session_id != 0
    # a full answer names every partition of the request
    assert first.partitions == {(t, p) for t, p, _ in first.sent}
    if partitions is not None:
        assert first.partitions == partitions
    sid = first.session_id
    assert rest, "no incremental fetch"
    for epoch, s in enumerate(rest, start=1):
        assert (s.sent_id, s.sent_epoch, s.error, s.session_id) == (sid, epoch, 0, sid), s
    return sid


# -- kafka-python ----------------------------------------------------------------------
def test_kafka_python_reads_200_partitions_exactly_in_one_session(kbroker):
    topic, n, per = "fs-many", 200, 5
    create(kbroker, topic, n)
    produce(kbroker, topic, [(p, f"{p}-{i}") for i in range(per) for p in range(n)])
    consumer, spy = consumer_of(kbroker, topic, range(n))
    try:
        got = read(consumer, n * per)
        assert by_partition(got) == {
            p: [(i, f"{p}-{i}".encode()) for i in range(per)] for p in range(n)
        }
        # Idle partitions are not sent again: after one append to partition 7, the
        # responses carry partition 7 (records, a new HW) and nothing else.
        settle(consumer, spy, {(topic, p, per) for p in range(n)})
        mark = spy.mark()
        produce(kbroker, topic, [(7, "late-0"), (7, "late-1")])
        late = read(consumer, 2)
        assert [(r.partition, r.offset, r.value) for r in late] == [
            (7, per, b"late-0"),
            (7, per + 1, b"late-1"),
        ]
        after = spy.since(mark)
        assert any(s.partitions == {(topic, 7)} for s in after)
        assert all(s.partitions <= {(topic, 7)} for s in after), after
        # Long polls with nothing new answer with no partition at all.
        mark = spy.mark()
        assert consumer.poll(timeout_ms=500) == {}
        assert all(not s.partitions for s in spy.since(mark))
        assert spy.seen[0].sent_id == 0
        assert_one_session(spy.since(0), {(topic, p) for p in range(n)})
    finally:
        consumer.close()


def test_kafka_python_forgotten_partitions_are_no_longer_sent(kbroker):
    topic, n = "fs-forget", 20
    create(kbroker, topic, n)
    produce(kbroker, topic, [(p, f"{p}-0") for p in range(n)])
    consumer, spy = consumer_of(kbroker, topic, range(n))
    try:
        assert len(read(consumer, n)) == n
        # Keep the first five: the next incremental fetch forgets the other fifteen.
        kept = [kafka.TopicPartition(topic, p) for p in range(5)]
        consumer.assign(kept)
        settle(consumer, spy, {(topic, p, 1) for p in range(5)})
        mark = spy.mark()
        # An append to a forgotten partition before one to a kept one: were partition
        # 15 still in the session, some response by the time partition 3's record
        # arrives would carry it.
        produce(kbroker, topic, [(15, "forgotten"), (3, "kept")])
        [got] = read(consumer, 1)
        assert (got.partition, got.offset, got.value) == (3, 1, b"kept")
        after = spy.since(mark)
        assert all(s.partitions <= {(topic, p) for p in range(5)} for s in after), after
        assert all(s.error == 0 and s.session_id == after[0].session_id for s in after)
        # Assigned again, partition 15 is read from where the consumer left it.
        consumer.assign([*kept, kafka.TopicPartition(topic, 15)])
        consumer.seek(kafka.TopicPartition(topic, 15), 1)
        [again] = read(consumer, 1)
        assert (again.partition, again.offset, again.value) == (15, 1, b"forgotten")
        assert_one_session(spy.since(0), {(topic, p) for p in range(n)})
    finally:
        consumer.close()


@pytest.mark.parametrize(
    ("tamper", "code"),
    [
        ("epoch", ErrorCode.INVALID_FETCH_SESSION_EPOCH),
        ("session", ErrorCode.FETCH_SESSION_ID_NOT_FOUND),
    ],
)
def test_kafka_python_is_refused_a_wrong_session_and_opens_a_new_one(kbroker, tamper, code):
    """A lost response (the client's epoch runs ahead) or a session the broker evicted:
    the broker refuses the fetch with Kafka's error, the client opens a new session
    with a full fetch, and reads on exactly."""
    topic, n = f"fs-{tamper}", 10
    create(kbroker, topic, n)
    produce(kbroker, topic, [(p, f"{p}-0") for p in range(n)])
    consumer, spy = consumer_of(kbroker, topic, range(n))
    try:
        first = read(consumer, n)
        settle(consumer, spy, {(topic, p, 1) for p in range(n)})
        handler = spy.handler()
        old = handler.next_metadata
        assert old.session_id != 0 and old.epoch >= 1
        if tamper == "epoch":
            handler.next_metadata = FetchMetadata(old.session_id, old.epoch + 5)
        else:
            handler.next_metadata = FetchMetadata(old.session_id ^ 0x5A5A5A5, old.epoch)
        mark = spy.mark()
        produce(kbroker, topic, [(p, f"{p}-1") for p in range(n)])
        second = read(consumer, n)
        assert by_partition(first + second) == {
            p: [(0, f"{p}-0".encode()), (1, f"{p}-1".encode())] for p in range(n)
        }
        after = spy.since(mark)
        refused = [i for i, s in enumerate(after) if s.error]
        assert refused, after
        i = refused[0]
        assert (after[i].error, after[i].session_id, after[i].partitions) == (code, 0, frozenset())
        reopened = after[i + 1]
        # After a wrong epoch kafka-python names its session with epoch 0 (close it,
        # open another); after an unknown one it asks with id 0: a new session either way.
        assert reopened.sent_epoch == 0
        assert reopened.error == 0 and reopened.session_id not in (0, old.session_id)
        assert reopened.partitions == {(t, p) for t, p, _ in reopened.sent} != set()
        # The new session carries on incrementally.
        produce(kbroker, topic, [(p, f"{p}-2") for p in range(n)])
        third = read(consumer, n)
        assert sorted((r.partition, r.offset) for r in third) == [(p, 2) for p in range(n)]
        assert_one_session(spy.since(mark)[i + 1 :])
    finally:
        consumer.close()


# -- the protocol on a raw socket ------------------------------------------------------
class RawFetcher:
    """Fetch requests built with kio, one connection, answers decoded with kio."""

    def __init__(self, broker: BrokerProcess, version: int) -> None:
        self.version = version
        self.cls = load_request_schema(1, version)
        self.mod = __import__(self.cls.__module__, fromlist=["FetchTopic"])
        self.resp = load_response_schema(1, version)
        self.sock = connect(broker)
        self.corr = 0

    def close(self) -> None:
        self.sock.close()

    def fetch(self, session_id, epoch, parts=(), forgotten=(), wait_ms=0):
        """``parts``: (topic, partition, offset); ``forgotten``: (topic, partition)."""
        self.send(session_id, epoch, parts, forgotten, wait_ms)
        return self.receive()

    def send(self, session_id, epoch, parts=(), forgotten=(), wait_ms=0) -> None:
        import datetime

        m = self.mod
        topics: dict[str, list] = {}
        for topic, partition, offset in parts:
            topics.setdefault(topic, []).append(
                m.FetchPartition(
                    partition=partition, fetch_offset=offset, partition_max_bytes=1 << 20
                )
            )
        gone: dict[str, list[int]] = {}
        for topic, partition in forgotten:
            gone.setdefault(topic, []).append(partition)
        body = self.cls(
            max_wait=datetime.timedelta(milliseconds=wait_ms),
            min_bytes=1,
            session_id=session_id,
            session_epoch=epoch,
            topics=tuple(m.FetchTopic(topic=t, partitions=tuple(ps)) for t, ps in topics.items()),
            forgotten_topics_data=tuple(
                m.ForgottenTopic(topic=t, partitions=tuple(ps)) for t, ps in gone.items()
            ),
        )
        self.corr += 1
        self.sock.sendall(request(1, self.version, body, self.corr))

    def receive(self):
        frame = read_frame(self.sock)
        header, pos = entity_reader(self.resp.__header_schema__)(frame, 0)
        assert header.correlation_id == self.corr
        answer, _ = entity_reader(self.resp)(frame, pos)
        return answer


def partitions_of(answer) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(topic, partition) -> (error, high watermark, bytes of records)."""
    return {
        (t.topic, p.partition_index): (
            int(p.error_code),
            p.high_watermark,
            len(p.records or b""),
        )
        for t in answer.responses
        for p in t.partitions
    }


@pytest.mark.parametrize("version", [7, 12])
def test_session_ids_epochs_and_refusals_on_the_wire(kbroker, version):
    topic = f"fs-raw-{version}"
    create(kbroker, topic, 3)
    produce(kbroker, topic, [(0, "a"), (1, "b")])
    raw = RawFetcher(kbroker, version)
    try:
        everything = [(topic, p, 0) for p in range(3)]
        # Sessionless (epoch -1): session id 0, every partition answered.
        legacy = raw.fetch(0, -1, everything)
        assert (int(legacy.error_code), legacy.session_id) == (0, 0)
        assert set(partitions_of(legacy)) == {(topic, p) for p in range(3)}
        # Open (id 0, epoch 0): a full answer with the new session's id.
        opened = raw.fetch(0, 0, everything)
        sid = opened.session_id
        assert int(opened.error_code) == 0 and sid != 0
        got = partitions_of(opened)
        assert {tp: (error, hw) for tp, (error, hw, _) in got.items()} == {
            (topic, 0): (0, 1),
            (topic, 1): (0, 1),
            (topic, 2): (0, 0),
        }
        assert got[(topic, 0)][2] > 0 and got[(topic, 1)][2] > 0 and got[(topic, 2)][2] == 0
        # Epoch 1 names nothing: partitions 0 and 1 still have records at their session
        # position, partition 2 is idle and its HW known: it is not sent.
        again = raw.fetch(sid, 1)
        assert again.session_id == sid and set(partitions_of(again)) == {(topic, 0), (topic, 1)}
        # Epoch 2 moves partitions 0 and 1 past their records: nothing to send.
        caught_up = raw.fetch(sid, 2, [(topic, 0, 1), (topic, 1, 1)])
        assert (caught_up.session_id, partitions_of(caught_up)) == (sid, {})
        # An append to partition 2 shows up in the next incremental answer, alone.
        produce(kbroker, topic, [(2, "c")])
        news = raw.fetch(sid, 3, wait_ms=5000)
        assert set(partitions_of(news)) == {(topic, 2)}
        assert partitions_of(news)[(topic, 2)][:2] == (0, 1)
        # A wrong epoch: INVALID_FETCH_SESSION_EPOCH, session id 0, no partitions.
        wrong = raw.fetch(sid, 9)
        assert int(wrong.error_code) == ErrorCode.INVALID_FETCH_SESSION_EPOCH
        assert (wrong.session_id, wrong.responses) == (0, ())
        # The refusal does not end the session: the right epoch still works.
        assert raw.fetch(sid, 4).session_id == sid
        # An unknown session: FETCH_SESSION_ID_NOT_FOUND.
        unknown = raw.fetch(sid ^ 0x1234567, 1)
        assert int(unknown.error_code) == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
        assert (unknown.session_id, unknown.responses) == (0, ())
        # Forgetting a partition: an append to it is no longer news.
        raw.fetch(sid, 5, [(topic, 2, 1)], forgotten=[(topic, 0)])
        produce(kbroker, topic, [(0, "d"), (2, "e")])
        forgot = raw.fetch(sid, 6, wait_ms=5000)
        assert set(partitions_of(forgot)) == {(topic, 2)}
        # Epoch 0 naming the session closes it and opens another, in full.
        reopened = raw.fetch(sid, 0, [(topic, 1, 1)])
        assert reopened.session_id not in (0, sid)
        assert set(partitions_of(reopened)) == {(topic, 1)}
        gone = raw.fetch(sid, 7)
        assert int(gone.error_code) == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
        # Epoch -1 naming a session closes it too.
        closed = raw.fetch(reopened.session_id, -1, [(topic, 1, 1)])
        assert (int(closed.error_code), closed.session_id) == (0, 0)
        after = raw.fetch(reopened.session_id, 1)
        assert int(after.error_code) == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    finally:
        raw.close()


def test_a_parked_incremental_fetch_wakes_on_an_append(kbroker):
    """An incremental fetch with nothing new waits; an append to one of its partitions
    answers it with that partition alone (a fetch never woken would answer empty, or
    not before the socket's timeout)."""
    topic = "fs-raw-park"
    create(kbroker, topic, 50)
    raw = RawFetcher(kbroker, 12)
    try:
        opened = raw.fetch(0, 0, [(topic, p, 0) for p in range(50)])
        sid = opened.session_id
        assert sid != 0 and len(partitions_of(opened)) == 50
        raw.send(sid, 1, wait_ms=60_000)
        produce(kbroker, topic, [(33, "wake")])
        woken = raw.receive()
        assert woken.session_id == sid
        assert {tp: (e, hw) for tp, (e, hw, _) in partitions_of(woken).items()} == {
            (topic, 33): (0, 1)
        }
        assert partitions_of(woken)[(topic, 33)][2] > 0
    finally:
        raw.close()


def test_versions_before_7_stay_sessionless(kbroker):
    topic = "fs-raw-v4"
    create(kbroker, topic, 2)
    produce(kbroker, topic, [(0, "a")])
    raw = RawFetcher(kbroker, 4)
    try:
        m = raw.mod
        import datetime

        body = raw.cls(
            replica_id=-1,
            max_wait=datetime.timedelta(0),
            min_bytes=1,
            max_bytes=1 << 20,
            isolation_level=0,
            topics=(
                m.FetchTopic(
                    topic=topic,
                    partitions=tuple(
                        m.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=1 << 20)
                        for p in range(2)
                    ),
                ),
            ),
        )
        raw.sock.sendall(request(1, 4, body, 1))
        frame = read_frame(raw.sock)
        _, pos = entity_reader(raw.resp.__header_schema__)(frame, 0)
        answer, _ = entity_reader(raw.resp)(frame, pos)
        assert set(partitions_of(answer)) == {(topic, 0), (topic, 1)}
    finally:
        raw.close()


# -- the gauges ------------------------------------------------------------------------
def test_fetch_session_gauges_count_sessions_and_partitions_per_door():
    from logmq.broker.metrics import BrokerMetrics
    from logmq.broker.replica.fetch_sessions import FetchSessionCache

    metrics = BrokerMetrics()
    kafka_cache, native_cache = FetchSessionCache(), FetchSessionCache()
    metrics.register_fetch_sessions("kafka", kafka_cache)
    metrics.register_fetch_sessions("native", native_cache)
    session = kafka_cache.open(-1, 0)
    kafka_cache.update(session, [("t", [(p, 0, 1024, -1, -1) for p in range(3)])], [])
    kafka_cache.open(-1, 0)
    text = metrics.render().decode()
    assert 'logmq_fetch_sessions{door="kafka"} 2.0' in text
    assert 'logmq_fetch_session_partitions{door="kafka"} 3.0' in text
    assert 'logmq_fetch_sessions{door="native"} 0.0' in text
    kafka_cache.close(session.id)
    assert 'logmq_fetch_session_partitions{door="kafka"} 0.0' in metrics.render().decode()
