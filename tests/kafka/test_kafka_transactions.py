"""Kafka transactions with the real clients (issue 29): confluent-kafka's transactional
producer commits and aborts, read_committed consumers see committed records only, a
second producer with the same transactional id fences the first."""

from __future__ import annotations

import time
import uuid

import pytest

from logmq.errors import ErrorCode
from tests.harness import BrokerProcess

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import admin as kadmin  # noqa: E402

TIMEOUT = 30


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(
        tmp_path_factory.mktemp("txn") / "data",
        extra_args=["--transaction-state-partitions", "3", "--offsets-topic-partitions", "3"],
    )
    b.start()
    yield b
    b.stop()


def topic(broker, partitions: int = 2) -> str:
    name = f"txn-{uuid.uuid4().hex[:8]}"
    admin = kadmin.AdminClient({"bootstrap.servers": broker.kafka_bootstrap})
    admin.create_topics([kadmin.NewTopic(name, partitions, 1)])[name].result(timeout=TIMEOUT)
    return name


def producer(broker, txn_id: str):
    p = ck.Producer(
        {
            "bootstrap.servers": broker.kafka_bootstrap,
            "transactional.id": txn_id,
            "transaction.timeout.ms": 60_000,
        }
    )
    p.init_transactions(TIMEOUT)
    return p


def consume(broker, name: str, isolation: str, expect: int, *, wait: float = 10.0) -> list[bytes]:
    """Values read from the start of ``name`` until ``expect`` came or ``wait`` passed
    without more."""
    c = ck.Consumer(
        {
            "bootstrap.servers": broker.kafka_bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    c.subscribe([name])
    got: list[bytes] = []
    deadline = time.monotonic() + wait
    try:
        while time.monotonic() < deadline and len(got) < expect:
            msg = c.poll(0.2)
            if msg is None or msg.error():
                continue
            got.append(msg.value())
    finally:
        c.close()
    return got


def end_offset(broker, name: str, isolation: str) -> int:
    """Partition 0's end as librdkafka's ListOffsets sees it at ``isolation``."""
    c = ck.Consumer(
        {
            "bootstrap.servers": broker.kafka_bootstrap,
            "group.id": f"w-{uuid.uuid4().hex[:6]}",
            "isolation.level": isolation,
        }
    )
    try:
        return c.get_watermark_offsets(ck.TopicPartition(name, 0), TIMEOUT, cached=False)[1]
    finally:
        c.close()


def test_committed_records_are_read_by_read_committed_consumers(broker):
    name = topic(broker)
    p = producer(broker, f"tx-{name}")
    p.begin_transaction()
    for i in range(20):
        p.produce(name, b"c%d" % i, partition=i % 2)
    p.commit_transaction(TIMEOUT)
    got = consume(broker, name, "read_committed", 20)
    assert sorted(got) == sorted(b"c%d" % i for i in range(20))


def test_aborted_records_are_hidden_from_read_committed_only(broker):
    name = topic(broker)
    p = producer(broker, f"tx-{name}")
    p.begin_transaction()
    for i in range(10):
        p.produce(name, b"a%d" % i, partition=i % 2)
    p.flush(TIMEOUT)
    p.abort_transaction(TIMEOUT)
    p.begin_transaction()
    for i in range(5):
        p.produce(name, b"k%d" % i, partition=i % 2)
    p.commit_transaction(TIMEOUT)
    committed = consume(broker, name, "read_committed", 5, wait=5)
    assert sorted(committed) == sorted(b"k%d" % i for i in range(5))
    everything = consume(broker, name, "read_uncommitted", 15)
    assert len(everything) == 15  # the aborted ones too; markers are never records


def kcat_values(broker, name: str, *conf: str) -> list[bytes]:
    """What kcat prints reading partition 0 from the start until its end (-e)."""
    import shutil
    import subprocess

    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (.ci/run installs it)")
    proc = subprocess.run(
        ["kcat", "-b", broker.kafka_bootstrap, "-C", "-t", name, "-p", "0", "-o", "beginning",
         "-e", "-q", "-f", "%s\\n", *conf],
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc.stdout.split(b"\n")[:-1]


def test_kcat_reads_committed_by_default_and_everything_when_asked(broker):
    """kcat (librdkafka) consumes read_committed by default: aborted records hidden,
    markers never printed, and with a transaction open it ends at the LSO."""
    name = topic(broker, 1)
    p = producer(broker, f"tx-{name}")
    for tag, commit in ((b"c1", True), (b"ab", False), (b"c2", True)):
        p.begin_transaction()
        for i in range(3):
            p.produce(name, tag + b"-%d" % i, partition=0)
        p.flush(TIMEOUT)
        if commit:
            p.commit_transaction(TIMEOUT)
        else:
            p.abort_transaction(TIMEOUT)
    p.begin_transaction()
    p.produce(name, b"open", partition=0)
    p.flush(TIMEOUT)
    committed = [b"c1-0", b"c1-1", b"c1-2", b"c2-0", b"c2-1", b"c2-2"]
    assert kcat_values(broker, name) == committed
    uncommitted = kcat_values(broker, name, "-X", "isolation.level=read_uncommitted")
    assert uncommitted == [*committed[:3], b"ab-0", b"ab-1", b"ab-2", *committed[3:], b"open"]
    p.commit_transaction(TIMEOUT)
    assert kcat_values(broker, name) == [*committed, b"open"]


def test_an_open_transaction_holds_read_committed_consumers_back(broker):
    name = topic(broker, 1)
    p = producer(broker, f"tx-{name}")
    p.begin_transaction()
    p.produce(name, b"pending")
    p.flush(TIMEOUT)
    assert consume(broker, name, "read_committed", 1, wait=3) == []
    assert consume(broker, name, "read_uncommitted", 1) == [b"pending"]
    # ListOffsets with the consumer's isolation level: read_committed's end is the LSO
    assert end_offset(broker, name, "read_committed") == 0
    assert end_offset(broker, name, "read_uncommitted") == 1
    p.commit_transaction(TIMEOUT)
    assert consume(broker, name, "read_committed", 1) == [b"pending"]
    assert end_offset(broker, name, "read_committed") == 2  # after the commit marker


def test_a_second_producer_with_the_same_id_fences_the_first(broker):
    name = topic(broker, 1)
    txn_id = f"tx-{name}"
    first = producer(broker, txn_id)
    first.begin_transaction()
    first.produce(name, b"zombie")
    first.flush(TIMEOUT)
    second = producer(broker, txn_id)  # aborts the first one's transaction, bumps the epoch
    second.begin_transaction()
    second.produce(name, b"live")
    second.commit_transaction(TIMEOUT)
    with pytest.raises(ck.KafkaException) as raised:
        first.commit_transaction(TIMEOUT)
    assert raised.value.args[0].fatal() or raised.value.args[0].code() in (
        ck.KafkaError._FENCED,
        ck.KafkaError.PRODUCER_FENCED,
        ck.KafkaError.INVALID_PRODUCER_EPOCH,
    )
    assert consume(broker, name, "read_committed", 1) == [b"live"]


def test_transactions_across_a_three_broker_cluster(tmp_path):
    """Markers go to leaders on other brokers (native WriteTxnMarkers) and the leaders
    verify each producer's first batch with a coordinator on another broker (KIP-890)."""
    from tests.harness import BrokerCluster

    args = ["--transaction-state-partitions", "3", "--offsets-topic-partitions", "3"]
    with BrokerCluster(3, base_dir=tmp_path / "cluster", extra_args=args) as cluster:
        first = next(iter(cluster.nodes.values()))
        name = "txn-cluster"
        admin = kadmin.AdminClient({"bootstrap.servers": first.kafka_bootstrap})
        admin.create_topics([kadmin.NewTopic(name, 6, 3)])[name].result(timeout=TIMEOUT)
        cluster.wait_for_topic(name, 6)
        leaders = {
            p.leader for p in admin.list_topics(name, timeout=10).topics[name].partitions.values()
        }
        assert len(leaders) > 1  # the markers cross brokers
        p = producer(first, "tx-cluster")
        p.begin_transaction()
        for i in range(30):
            p.produce(name, b"x%d" % i, partition=i % 6)
        p.flush(TIMEOUT)
        p.abort_transaction(TIMEOUT)
        p.begin_transaction()
        for i in range(30):
            p.produce(name, b"c%d" % i, partition=i % 6)
        p.commit_transaction(TIMEOUT)
        got = consume(first, name, "read_committed", 30)
        assert sorted(got) == sorted(b"c%d" % i for i in range(30))


def test_kafka_python_transactional_producer_and_read_committed_consumer(broker):
    from kafka import KafkaConsumer, KafkaProducer

    name = topic(broker, 1)
    p = KafkaProducer(bootstrap_servers=broker.kafka_bootstrap, transactional_id=f"kp-{name}")
    p.init_transactions()
    p.begin_transaction()
    for i in range(5):
        p.send(name, b"aborted%d" % i)
    p.flush()
    p.abort_transaction()
    p.begin_transaction()
    for i in range(5):
        p.send(name, b"kept%d" % i)
    p.commit_transaction()
    p.close()
    c = KafkaConsumer(
        name,
        bootstrap_servers=broker.kafka_bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
    )
    got = [m.value for m in c]
    c.close()
    assert got == [b"kept%d" % i for i in range(5)]


async def test_aiokafka_transactional_producer_and_read_committed_consumer(broker):
    aiokafka = pytest.importorskip("aiokafka")
    name = topic(broker, 1)
    p = aiokafka.AIOKafkaProducer(
        bootstrap_servers=broker.kafka_bootstrap, transactional_id=f"aio-{name}"
    )
    await p.start()
    try:
        async with p.transaction():
            for i in range(5):
                await p.send(name, b"kept%d" % i)
        with pytest.raises(RuntimeError):
            async with p.transaction():
                await p.send_and_wait(name, b"aborted")
                raise RuntimeError("the application fails: the transaction aborts")
    finally:
        await p.stop()
    c = aiokafka.AIOKafkaConsumer(
        name,
        bootstrap_servers=broker.kafka_bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
    )
    await c.start()
    try:
        got: list[bytes] = []
        deadline = time.monotonic() + 10
        while len(got) < 5 and time.monotonic() < deadline:
            batch = await c.getmany(timeout_ms=500)
            got += [m.value for msgs in batch.values() for m in msgs]
        extra = await c.getmany(timeout_ms=1000)
        got += [m.value for msgs in extra.values() for m in msgs]
    finally:
        await c.stop()
    assert got == [b"kept%d" % i for i in range(5)]


def test_consume_transform_produce_commits_offsets_with_the_transaction(broker):
    """send_offsets_to_transaction: the consumer group's offsets are committed by the
    transaction's commit (TxnOffsetCommit, settled by the marker), dropped by an abort."""
    source, sink = topic(broker, 1), topic(broker, 1)
    feed = ck.Producer({"bootstrap.servers": broker.kafka_bootstrap})
    for i in range(10):
        feed.produce(source, b"in%d" % i)
    assert feed.flush(TIMEOUT) == 0
    group = f"ctp-{source}"
    consumer = ck.Consumer(
        {
            "bootstrap.servers": broker.kafka_bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    p = producer(broker, f"tx-{source}")
    try:
        consumer.subscribe([source])
        got = []
        deadline = time.monotonic() + TIMEOUT
        while len(got) < 10 and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                got.append(msg)
        assert len(got) == 10
        tp = ck.TopicPartition(source, 0)

        def transform(commit: bool, upto: int) -> None:
            p.begin_transaction()
            for m in got[:upto]:
                p.produce(sink, m.value().replace(b"in", b"out"))
            p.send_offsets_to_transaction(
                [ck.TopicPartition(source, 0, upto)], consumer.consumer_group_metadata()
            )
            if commit:
                p.commit_transaction(TIMEOUT)
            else:
                p.abort_transaction(TIMEOUT)

        transform(False, 10)  # aborted: neither the output nor the offsets count
        [committed] = consumer.committed([tp], TIMEOUT)
        assert committed.offset < 0
        transform(True, 6)
        [committed] = consumer.committed([tp], TIMEOUT)
        assert committed.offset == 6
    finally:
        consumer.close()
    assert sorted(consume(broker, sink, "read_committed", 6)) == sorted(
        b"out%d" % i for i in range(6)
    )


def test_transactional_offsets_keep_the_consumers_leader_epoch(tmp_path):
    """KIP-320 through a transaction: the positions a consumer hands to
    send_offsets_to_transaction carry the leader epoch of the last record consumed;
    committed() answers the same epoch, also from the coordinator that reloads the
    offsets topic after a restart, and a new member resumes there (its position
    validated against that epoch)."""
    args = ["--transaction-state-partitions", "1", "--offsets-topic-partitions", "1"]
    with BrokerProcess(tmp_path / "data", extra_args=args) as own:
        source = topic(own, 2)
        feed = ck.Producer({"bootstrap.servers": own.kafka_bootstrap})
        for i in range(10):
            feed.produce(source, b"in%d" % i, partition=i % 2)
        assert feed.flush(TIMEOUT) == 0
        group = f"epoch-{source}"
        conf = {
            "bootstrap.servers": own.kafka_bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
        consumer = ck.Consumer(conf)
        p = producer(own, f"tx-{source}")
        tps = [ck.TopicPartition(source, 0), ck.TopicPartition(source, 1)]
        try:
            consumer.subscribe([source])
            seen = 0
            deadline = time.monotonic() + TIMEOUT
            while seen < 8 and time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is not None and not msg.error():
                    seen += 1
            assert seen == 8
            positions = consumer.position(consumer.assignment())
            assert all(tp.leader_epoch == 0 for tp in positions)  # the records' epoch
            p.begin_transaction()
            p.send_offsets_to_transaction(positions, consumer.consumer_group_metadata())
            p.commit_transaction(TIMEOUT)
            want = {(tp.partition, tp.offset, tp.leader_epoch) for tp in positions}
            got = consumer.committed(tps, TIMEOUT)
            assert {(tp.partition, tp.offset, tp.leader_epoch) for tp in got} == want
        finally:
            consumer.close()
        own.restart()  # the coordinator rebuilds the group from __consumer_offsets
        again = ck.Consumer(conf)
        try:
            deadline = time.monotonic() + TIMEOUT
            while True:
                try:
                    got = again.committed(tps, 5)
                    break
                except ck.KafkaException:  # the coordinator still loading
                    if time.monotonic() > deadline:
                        raise
            assert {(tp.partition, tp.offset, tp.leader_epoch) for tp in got} == want
            again.subscribe([source])
            rest = []
            deadline = time.monotonic() + TIMEOUT
            while len(rest) < 2 and time.monotonic() < deadline:  # 10 records, 8 seen
                msg = again.poll(0.2)
                if msg is not None and not msg.error():
                    rest.append(msg.value())
            # partition p holds in<2k+p> at offset k: what lies past each position
            left = sorted(
                b"in%d" % (2 * k + t.partition) for t in positions for k in range(t.offset, 5)
            )
            assert sorted(rest) == left
        finally:
            again.close()


def test_an_admin_aborts_an_open_transaction_with_write_txn_markers(broker):
    """What Java's ``Admin.abortTransaction`` (kafka-transactions.sh abort) sends: the
    producer's id, epoch and coordinator epoch from DescribeProducers, then an ABORT
    WriteTxnMarkers to the partition's leader. The LSO moves past the transaction; a
    marker from an older coordinator epoch than the partition's last is refused."""
    from tests.kafka.test_kafka_conformance import call, module_of

    name = topic(broker, 1)
    p = producer(broker, f"tx-{name}")
    p.begin_transaction()
    p.produce(name, b"committed")
    p.commit_transaction(TIMEOUT)
    p.begin_transaction()
    p.produce(name, b"left open")
    p.flush(TIMEOUT)
    assert end_offset(broker, name, "read_committed") == 2

    dp = module_of(61, 0)
    described = call(broker, 61, 0, topics=(dp.TopicRequest(name=name, partition_indexes=(0,)),))[0]
    (state,) = described.topics[0].partitions[0].active_producers
    assert state.current_txn_start_offset == 2
    assert state.coordinator_epoch >= 0  # the commit's marker told the partition

    wm = module_of(27, 1)

    def write_marker(coordinator_epoch: int) -> int:
        marker = wm.WritableTxnMarker(
            producer_id=state.producer_id,
            producer_epoch=state.producer_epoch,
            transaction_result=False,
            topics=(wm.WritableTxnMarkerTopic(name=name, partition_indexes=(0,)),),
            coordinator_epoch=coordinator_epoch,
        )
        answer = call(broker, 27, 1, markers=(marker,))[0]
        return answer.markers[0].topics[0].partitions[0].error_code.value

    assert write_marker(state.coordinator_epoch - 1) == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert end_offset(broker, name, "read_committed") == 2
    assert write_marker(state.coordinator_epoch) == ErrorCode.NONE
    assert end_offset(broker, name, "read_committed") == 4  # past the open one and its marker
    assert consume(broker, name, "read_committed", 2, wait=8) == [b"committed"]
