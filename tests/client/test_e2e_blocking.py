"""Blocking Producer/Consumer/Admin (a loop thread under the hood), from several threads."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest

from logmq import Admin, Consumer, Producer, RecordMetadata
from logmq.client.sync import LoopThread
from logmq.errors import UnknownTopicOrPartitionError


def consume(consumer, n, timeout=20.0):
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out.extend(consumer.poll(timeout=1.0))
    return out


def test_blocking_round_trip_from_many_threads(shared_broker, topic_name):
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)
    with Producer(shared_broker.bootstrap, linger_ms=1) as producer:

        def work(t):
            futs = [producer.send(topic_name, b"%d-%d" % (t, i), key=b"%d" % t) for i in range(200)]
            return [f.result(timeout=20) for f in futs]

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(work, range(4)))
        bulk = producer.send_batch(topic_name, [b"bulk"] * 10, partition=0).result(20)
        producer.flush()
    assert all(isinstance(m, RecordMetadata) for r in results for m in r)
    for r in results:  # one key per thread: one partition, increasing offsets
        assert len({m.partition for m in r}) == 1
        assert [m.offset for m in r] == sorted(m.offset for m in r)
    assert sum(c for _, _, c in bulk) == 10

    with Consumer(shared_broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic_name, 0), (topic_name, 1)])
        records = consume(consumer, 810)
    assert len(records) == 810
    for t in range(4):
        mine = [r.value for r in records if r.key == b"%d" % t]
        assert mine == [b"%d-%d" % (t, i) for i in range(200)]


def test_record_future_works_with_concurrent_wait(shared_broker, topic_name):
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic(topic_name)
    with Producer(shared_broker.bootstrap) as producer:
        futs = [producer.send(topic_name, b"x") for _ in range(10)]
        done, not_done = concurrent.futures.wait(futs, timeout=20)
        assert len(done) == 10 and not not_done
        called = threading.Event()
        futs[0].add_done_callback(lambda f: called.set())
        assert called.wait(5)
        assert [f.result().offset for f in futs] == list(range(10))
        assert all(f.exception() is None for f in futs)


def test_blocking_consumer_seek_and_offsets(shared_broker, topic_name):
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic(topic_name)
    with Producer(shared_broker.bootstrap) as producer:
        producer.send_batch(topic_name, [b"%d" % i for i in range(10)]).result(20)
    tp = (topic_name, 0)
    with Consumer(shared_broker.bootstrap) as consumer:
        consumer.assign([tp])
        assert consumer.assignment() == {tp}
        assert consumer.position(*tp) == 10
        consumer.seek_to_beginning(tp)
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        consumer.seek(topic_name, 0, 8)
        assert [r.value for r in consume(consumer, 2)] == [b"8", b"9"]
        assert consumer.highwater(*tp) == 10
        batches = []
        consumer.seek(topic_name, 0, 0)
        while sum(len(b) for b in batches) < 10:
            batches.extend(consumer.poll_batches(timeout=1.0))
        assert [v for b in batches for v in b.values()] == [b"%d" % i for i in range(10)]


def test_unknown_topic_raises(shared_broker):
    with Producer(shared_broker.bootstrap, max_block_ms=200) as producer:
        fut = producer.send("missing-topic", b"x")
        with pytest.raises(UnknownTopicOrPartitionError):
            fut.result(timeout=20)


def test_unknown_topic_is_logged_once_from_the_loop_thread(shared_broker, topic_name, caplog):
    """The blocking producer waits in its loop thread; the warning comes from there."""
    with Producer(shared_broker.bootstrap, max_block_ms=1500) as producer:
        futs = [producer.send(topic_name, b"x") for _ in range(3)]
        for fut in futs:
            with pytest.raises(UnknownTopicOrPartitionError):
                fut.result(timeout=20)
    warnings = [
        r
        for r in caplog.records
        if r.name == "logmq.client.producer" and repr(topic_name) in r.getMessage()
    ]
    assert [r.levelname for r in warnings] == ["WARNING"]
    assert "UNKNOWN_TOPIC_OR_PARTITION" in warnings[0].getMessage()
    assert "1.5 s (max_block_ms)" in warnings[0].getMessage()


def test_clients_share_one_loop_thread_and_stop_it(shared_broker):
    a = Admin(shared_broker.bootstrap)
    b = Admin(shared_broker.bootstrap)
    assert a._lt is b._lt
    a.close()
    assert a._lt._thread.is_alive()  # still used by b
    b.close()
    assert not b._lt._thread.is_alive()
    own = Admin(shared_broker.bootstrap, own_loop=True)
    assert own._lt is not LoopThread._shared
    own.close()


def test_blocking_admin_and_iteration(shared_broker, topic_name):
    from logmq import LogMQError
    from logmq.errors import ErrorCode

    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic(topic_name, configs={"retention.ms": "100000"})
        with pytest.raises(LogMQError) as e:
            admin.create_topic(topic_name)
        assert e.value.code == ErrorCode.TOPIC_ALREADY_EXISTS
        assert admin.describe_configs([topic_name])[topic_name]["retention.ms"].value == "100000"
        admin.alter_configs(topic_name, set={"retention.ms": "200000"})
        assert admin.describe_topics([topic_name])[topic_name].partitions[0].log_end_offset == 0
    with Producer(shared_broker.bootstrap) as producer:
        producer.send_batch(topic_name, ["a", "b", "c"]).result(20)
    with Consumer(shared_broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic_name, 0)])
        seen = []
        for record in consumer:
            seen.append(record.value)
            if len(seen) == 3:
                break
    assert seen == [b"a", b"b", b"c"]
