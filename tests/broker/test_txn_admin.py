"""The transaction operations tools' server side and admin client: the native
DescribeTransactions, ListTransactions and DescribeProducers handlers (with per-id
ACLs), the Kafka door's DescribeProducers, the hanging-transaction rule, and the
AsyncAdmin calls against a real broker holding a confluent-kafka transaction open."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest

from logmq.client import AsyncAdmin
from logmq.client.txn_admin import (
    HangingTransaction,
    ProducerState,
    TransactionDescription,
    hanging_of,
)
from logmq.errors import ErrorCode, LogMQError
from logmq.kafka.producers import KafkaProducerApis
from logmq.native.authorization import NativeAuthorization
from logmq.native.registry import NATIVE_APIS
from logmq.native.txn_api import TxnApi
from logmq.net.codec import ApiKey, Request
from logmq.security.acl import ResourceType
from logmq.security.authorization import CLUSTER
from logmq.storage.producer_state import BatchMetadata, ProducerEntry, ProducerStateManager
from logmq.txn import ListTransactionsResult
from logmq.txn import TransactionDescription as ServerDescription
from logmq.txn.model import TransactionListing as ServerListing
from tests.harness import inprocess_broker

ck = pytest.importorskip("confluent_kafka")

TIMEOUT = 30


# -- fakes ----------------------------------------------------------------------------------


def request(api_key: int, body: Any) -> Request:
    context = SimpleNamespace(principal="User:test")
    return Request(api_key, 0, 1, "test", body, memoryview(b""), context=context)


class Authz:
    """Allows every name but those in ``denied`` (checked names are recorded)."""

    enabled = True

    def __init__(self, *denied: str) -> None:
        self.denied = set(denied)
        self.checked: list[tuple[Any, ResourceType, str]] = []

    def allowed(self, context, op, rtype, name, *, log_denial=True) -> bool:
        self.checked.append((op, rtype, name))
        return name not in self.denied

    def describable(self, context, rtype, names) -> list[str]:
        return [n for n in names if self.allowed(context, None, rtype, n)]


def plog(producers: dict[int, tuple[int, int, int]], ongoing: dict[int, int]) -> Any:
    """A partition log with producers ``{pid: (epoch, last_seq, last_ts)}``."""
    state = ProducerStateManager()
    for pid, (epoch, last_seq, ts) in producers.items():
        entry = ProducerEntry(pid, epoch, last_timestamp=ts)
        if last_seq >= 0:
            entry.batches.append(BatchMetadata(0, last_seq, 0, last_seq))
        state.producers[pid] = entry
    state.txn.ongoing.update(ongoing)
    return SimpleNamespace(producer_state=state)


class Txns:
    """The coordinator service's two read calls."""

    def __init__(self) -> None:
        self.described: list[list[str]] = []

    async def describe_transactions(self, ids):
        ids = list(ids)
        self.described.append(ids)
        return [
            ServerDescription(t, ErrorCode.NONE, "Ongoing", 7, 1, 60_000, 1000, (("t", 0),))
            if t != "other"
            else ServerDescription(t, ErrorCode.NOT_COORDINATOR)
            for t in ids
        ]

    async def list_transactions(self, states, pids, duration):
        listed = [ServerListing("a", 7, "Ongoing"), ServerListing("secret", 8, "Empty")]
        return ListTransactionsResult(listed, [s for s in states if s == "Bogus"])


class Replicas:
    def __init__(self, logs: dict[tuple[str, int], Any]) -> None:
        self.logs = logs

    def leader_log(self, topic: str, partition: int) -> Any:
        if (topic, partition) not in self.logs:
            raise LogMQError("not here", ErrorCode.NOT_LEADER_OR_FOLLOWER)
        return self.logs[(topic, partition)]


# -- the native handlers --------------------------------------------------------------------


async def test_describe_transactions_checks_describe_per_id():
    authz = Authz("secret")
    txns = Txns()
    api = TxnApi(None, txns, authz=authz)  # type: ignore[arg-type]
    body = {"transactional_ids": ["a", "secret", "other"]}
    answer = (await api.describe_transactions(request(ApiKey.DESCRIBE_TRANSACTIONS, body))).body
    by_id = {t["transactional_id"]: t for t in answer["transactions"]}
    assert [t["transactional_id"] for t in answer["transactions"]] == ["a", "secret", "other"]
    assert by_id["a"] == {
        "transactional_id": "a",
        "error": 0,
        "state": "Ongoing",
        "producer_id": 7,
        "producer_epoch": 1,
        "timeout_ms": 60_000,
        "start_ms": 1000,
        "partitions": [{"topic": "t", "partition": 0}],
    }
    assert by_id["secret"]["error"] == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert by_id["other"]["error"] == ErrorCode.NOT_COORDINATOR
    assert txns.described == [["a", "other"]]  # the denied id never reached the service
    assert {(r, n) for _, r, n in authz.checked} == {
        (ResourceType.TRANSACTIONAL_ID, n) for n in ("a", "secret", "other")
    } | {(ResourceType.TOPIC, "t")}  # the partitions' topics too, as Kafka


async def test_describe_transactions_leaves_out_topics_the_principal_may_not_describe():
    api = TxnApi(None, Txns(), authz=Authz("t"))  # type: ignore[arg-type]
    body = {"transactional_ids": ["a"]}
    answer = (await api.describe_transactions(request(ApiKey.DESCRIBE_TRANSACTIONS, body))).body
    (described,) = answer["transactions"]
    assert described["error"] == 0 and described["partitions"] == []


async def test_list_transactions_leaves_out_ids_the_principal_may_not_describe():
    api = TxnApi(None, Txns(), authz=Authz("secret"))  # type: ignore[arg-type]
    body = {"states": ["Ongoing", "Bogus"], "producer_ids": [7], "duration_ms": None}
    answer = (await api.list_transactions(request(ApiKey.LIST_TRANSACTIONS, body))).body
    assert answer == {
        "error": 0,
        "unknown_state_filters": ["Bogus"],
        "transactions": [{"transactional_id": "a", "producer_id": 7, "state": "Ongoing"}],
    }


async def test_describe_producers_from_the_leader_only():
    logs = {("t", 0): plog({5: (2, 9, 1234), 6: (0, -1, -1)}, {5: 40})}
    api = TxnApi(None, Txns(), Replicas(logs))  # type: ignore[arg-type]
    body = {"topics": [{"topic": "t", "partitions": [0, 1]}]}
    answer = (await api.describe_producers(request(ApiKey.DESCRIBE_PRODUCERS, body))).body
    (topic,) = answer["topics"]
    p0, p1 = topic["partitions"]
    assert p0 == {
        "partition": 0,
        "error": 0,
        "producers": [
            {
                "producer_id": 5,
                "producer_epoch": 2,
                "last_sequence": 9,
                "last_timestamp": 1234,
                "current_txn_start_offset": 40,
                "coordinator_epoch": -1,
            },
            {
                "producer_id": 6,
                "producer_epoch": 0,
                "last_sequence": -1,
                "last_timestamp": -1,
                "current_txn_start_offset": -1,
                "coordinator_epoch": -1,
            },
        ],
    }
    assert p1["partition"] == 1 and p1["error"] == ErrorCode.NOT_LEADER_OR_FOLLOWER


async def test_describe_producers_unwired_is_an_error():
    api = TxnApi(None, Txns())  # type: ignore[arg-type]
    body = {"topics": [{"topic": "t", "partitions": [0]}]}
    with pytest.raises(LogMQError) as e:
        await api.describe_producers(request(ApiKey.DESCRIBE_PRODUCERS, body))
    assert e.value.code is ErrorCode.UNKNOWN_API


async def test_native_guard():
    """DescribeProducers needs READ on the topic; the transaction reads pass the guard
    (the handler checks each id); the abort's WriteTxnMarkers stays CLUSTER_ACTION only."""
    guard = NativeAuthorization(Authz("hidden", CLUSTER), NATIVE_APIS).guard  # type: ignore[arg-type]
    body = {"topics": [{"topic": "hidden", "partitions": [0]}]}
    denied = await guard(request(ApiKey.DESCRIBE_PRODUCERS, body))
    assert denied is not None and denied.body["error"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    body = {"topics": [{"topic": "t", "partitions": [0]}]}
    assert await guard(request(ApiKey.DESCRIBE_PRODUCERS, body)) is None
    assert await guard(request(ApiKey.LIST_TRANSACTIONS, {})) is None
    ids = {"transactional_ids": ["hidden"]}
    assert await guard(request(ApiKey.DESCRIBE_TRANSACTIONS, ids)) is None
    denied = await guard(request(ApiKey.WRITE_TXN_MARKERS, {"markers": []}))
    assert denied is not None and denied.body["error"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED


# -- the Kafka door -------------------------------------------------------------------------


async def test_kafka_describe_producers():
    logs = {("t", 0): plog({5: (2, 9, 1234)}, {5: 40})}
    apis = KafkaProducerApis(Replicas(logs).leader_log, Authz("hidden"))  # type: ignore[arg-type]
    body = DescribeProducersRequest(
        topics=(
            TopicRequest(name="t", partition_indexes=(0, 3)),
            TopicRequest(name="hidden", partition_indexes=(0,)),
        )
    )
    answer = (await apis.describe_producers(request(61, body))).body
    t, hidden = answer.topics
    ok, elsewhere = t.partitions
    assert ok.error_code == 0
    (s,) = ok.active_producers
    assert (s.producer_id, s.producer_epoch, s.last_sequence, s.last_timestamp) == (5, 2, 9, 1234)
    assert (s.coordinator_epoch, s.current_txn_start_offset) == (-1, 40)
    assert elsewhere.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert hidden.partitions[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED


# -- the hanging rule -----------------------------------------------------------------------


def desc(txn_id: str, state: str, *tps: tuple[str, int]) -> TransactionDescription:
    return TransactionDescription(txn_id, state, 1, 0, 60_000, 0, list(tps))


def test_hanging_of():
    now = 10_000_000
    recent = now - 1000
    producers = {
        ("t", 0): [
            ProducerState(1, 0, 3, recent, 100),  # live: its coordinator has t-0 open
            ProducerState(2, 0, 3, recent, 110),  # unknown to every coordinator
            ProducerState(3, 0, 3, recent, -1),  # no open transaction here: never hangs
            ProducerState(4, 0, 3, recent, 120),  # its transaction is on another partition
            ProducerState(5, 0, 3, now - 5000, 130),  # open longer than max age
            ProducerState(6, 0, 3, recent, 140),  # listed, but its description ended
        ],
    }
    open_ids = {1: ["a"], 4: ["d"], 5: ["e"], 6: ["f"]}
    descriptions = {
        "a": desc("a", "Ongoing", ("t", 0)),
        "d": desc("d", "Ongoing", ("t", 1)),
        "e": desc("e", "PrepareAbort", ("t", 0)),
        "f": desc("f", "CompleteAbort", ("t", 0)),
    }
    found = hanging_of(producers, open_ids, descriptions, now, max_age_ms=4000)
    assert [(h.producer_id, h.current_txn_start_offset) for h in found] == [
        (2, 110),
        (4, 120),
        (5, 130),
        (6, 140),
    ]
    assert "no coordinator" in found[0].reason and found[0].transactional_ids == []
    assert "does not include" in found[1].reason and found[1].transactional_ids == ["d"]
    assert "longer than 4000" in found[2].reason
    assert isinstance(found[0], HangingTransaction)
    # with a larger max age producer 5 is live again
    assert 5 not in {h.producer_id for h in hanging_of(producers, open_ids, descriptions, now)}


# -- against a real broker ------------------------------------------------------------------


@pytest.fixture
async def txn_broker(tmp_path) -> AsyncIterator[Any]:
    async with inprocess_broker(
        tmp_path / "data",
        kafka_port=0,
        transaction_state_partitions=2,
        offsets_topic_partitions=1,
    ) as b:
        yield b


def open_transaction(kafka_bootstrap: str, txn_id: str, topic: str, values: list[bytes]):
    """A confluent-kafka transactional producer whose transaction is left open."""
    p = ck.Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "transactional.id": txn_id,
            "transaction.timeout.ms": 60_000,
        }
    )
    p.init_transactions(TIMEOUT)
    p.begin_transaction()
    for v in values:
        p.produce(topic, v, partition=0)
    assert p.flush(TIMEOUT) == 0
    return p


def finish(producer: Any) -> None:
    """Abort (again, through the coordinator) and close while the broker still runs."""
    producer.abort_transaction(TIMEOUT)
    producer.close()


def read_committed(kafka_bootstrap: str, topic: str, want: int, wait: float) -> list[bytes]:
    """Values a read_committed consumer gets from partition 0 within ``wait`` seconds."""
    c = ck.Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
        got: list[bytes] = []
        deadline = time.monotonic() + wait
        while len(got) < want and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value())
        return got
    finally:
        c.close()


def plain_produce(kafka_bootstrap: str, topic: str, value: bytes) -> None:
    p = ck.Producer({"bootstrap.servers": kafka_bootstrap})
    p.produce(topic, value, partition=0)
    assert p.flush(TIMEOUT) == 0


async def setup_open_txn(b: Any, partitions: int = 2) -> tuple[AsyncAdmin, str, str, Any]:
    topic, txn_id = f"t-{uuid.uuid4().hex[:6]}", f"txn-{uuid.uuid4().hex[:6]}"
    admin = await AsyncAdmin(f"127.0.0.1:{b.port}").start()
    await admin.create_topic(topic, partitions)
    kafka = f"127.0.0.1:{b.kafka_port}"
    producer = await asyncio.to_thread(open_transaction, kafka, txn_id, topic, [b"x", b"y"])
    return admin, topic, txn_id, producer


async def test_admin_sees_an_open_transaction_and_aborts_it(txn_broker):
    b = txn_broker
    kafka = f"127.0.0.1:{b.kafka_port}"
    admin, topic, txn_id, producer = await setup_open_txn(b)
    try:
        listed = await admin.list_transactions()
        (mine,) = [t for t in listed if t.transactional_id == txn_id]
        assert mine.state == "Ongoing" and mine.coordinator_id == 1
        assert [t.transactional_id for t in await admin.list_transactions(["Empty"])] == []
        assert await admin.list_transactions(producer_ids=[mine.producer_id]) == [mine]
        with pytest.raises(LogMQError) as e:
            await admin.list_transactions(["Bogus"])
        assert e.value.code is ErrorCode.INVALID_REQUEST

        (d,) = await admin.describe_transactions([txn_id])
        assert (d.state, d.producer_id, d.timeout_ms) == ("Ongoing", mine.producer_id, 60_000)
        assert d.partitions == [(topic, 0)] and d.start_ms > 0
        with pytest.raises(LogMQError) as e:
            await admin.describe_transactions(["nobody"])
        assert e.value.code is ErrorCode.TRANSACTIONAL_ID_NOT_FOUND

        producers = await admin.describe_producers(topic)
        assert producers[1] == []
        (p,) = producers[0]
        assert (p.producer_id, p.producer_epoch) == (d.producer_id, d.producer_epoch)
        assert (p.current_txn_start_offset, p.last_sequence) == (0, 1)

        # a live transaction does not hang, unless it is older than the max age
        assert await admin.find_hanging([topic]) == []
        assert await admin.find_hanging() == []
        (old,) = await admin.find_hanging([topic], max_age_ms=0)
        assert (old.topic, old.partition, old.producer_id) == (topic, 0, p.producer_id)
        assert old.transactional_ids == [txn_id]

        # the open transaction holds read_committed consumers back ...
        await asyncio.to_thread(plain_produce, kafka, topic, b"after")
        assert await asyncio.to_thread(read_committed, kafka, topic, 1, 1.5) == []
        # ... until an ABORT marker ends it on the partition
        await admin.abort_transaction(topic, 0, p.producer_id, p.producer_epoch)
        (p,) = (await admin.describe_producers(topic, [0]))[0]
        assert p.current_txn_start_offset == -1
        assert await asyncio.to_thread(read_committed, kafka, topic, 1, 10) == [b"after"]
    finally:
        await admin.close()
        await asyncio.to_thread(finish, producer)


async def test_abort_errors_are_raised(txn_broker):
    admin = await AsyncAdmin(f"127.0.0.1:{txn_broker.port}").start()
    try:
        await admin.create_topic("plain", 1)
        with pytest.raises(LogMQError) as e:
            await admin.abort_transaction("missing", 0, 1, 0)
        assert e.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        with pytest.raises(LogMQError) as e:
            await admin.describe_producers("plain", [5])
        assert e.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    finally:
        await admin.close()
