"""Transactions through the native door with logmq's own clients (issue 29).

Against one broker: commit and abort over several partitions, what read_committed and
read_uncommitted consumers see, an open transaction holding read_committed back,
fencing, offsets in a transaction, the two-phase prepare + complete_transaction, and
the door's refusals. Without a broker: the consumer's aborted-batch filter (a model
of Kafka's rule, with hypothesis) and the door's ACL decisions for the new requests.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.client import AsyncAdmin, AsyncConsumer, AsyncProducer
from logmq.client.admin import NewTopic
from logmq.client.cluster import ClusterClient
from logmq.client.fetcher import PartitionData, txn_filter
from logmq.client.group_offsets import OffsetAndMetadata
from logmq.client.sync import Admin, Producer
from logmq.client.transactions import complete_transaction
from logmq.errors import ErrorCode, LogMQError, ProducerFencedError, TransactionStateError
from logmq.native.authorization import NativeAuthorization
from logmq.native.registry import NATIVE_APIS
from logmq.net.codec import ApiKey, Request
from logmq.security.acl import AclOperation as Op
from logmq.security.acl import ResourceType as RT
from logmq.security.authorization import CLUSTER
from logmq.storage import batch as b
from logmq.storage.txn_state import CONTROL_ABORT, CONTROL_COMMIT, encode_control_batch
from tests.harness import BrokerProcess

_ids = itertools.count()
TXN_ARGS = ["--transaction-state-partitions", "3", "--offsets-topic-partitions", "3"]


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    proc = BrokerProcess(
        tmp_path_factory.mktemp("native-txn") / "data", extra_args=TXN_ARGS, log_level="warning"
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.close()


def txn_id(name: str) -> str:
    return f"{name}-{next(_ids)}"


async def make_topic(broker: BrokerProcess, name: str, partitions: int = 3) -> str:
    async with AsyncAdmin(broker.bootstrap) as admin:
        await admin.create_topics([NewTopic(name, partitions)])
    return name


async def read_all(
    broker: BrokerProcess, topic: str, partitions: int, level: str, polls: int = 4
) -> dict[int, list[bytes]]:
    """Every record a fresh consumer at ``level`` returns, per partition, in order."""
    async with AsyncConsumer(
        broker.bootstrap, auto_offset_reset="earliest", isolation_level=level
    ) as consumer:
        consumer.assign([(topic, p) for p in range(partitions)])
        got: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
        empty = 0
        while empty < polls:
            records = await consumer.poll(0.25)
            empty = 0 if records else empty + 1
            for r in records:
                got[r.partition].append(r.value)
        return got


# -- against a broker -----------------------------------------------------------------


async def test_commit_and_abort_over_partitions(broker):
    topic = await make_topic(broker, "txn-commit-abort")
    async with AsyncProducer(broker.bootstrap, transactional_id=txn_id("ca")) as p:
        await p.init_transactions()
        tid, pid, epoch = p.transaction_identity
        assert pid >= 0 and epoch >= 0 and tid.startswith("ca-")
        p.begin_transaction()
        handles = [p.send(topic, b"c1-%d" % i, partition=i % 3) for i in range(12)]
        await p.commit_transaction()
        assert all(h.done() for h in handles)
        p.begin_transaction()
        for i in range(9):
            p.send(topic, b"a-%d" % i, partition=i % 3)
        await p.flush()  # on the brokers, then aborted
        await p.abort_transaction()
        p.begin_transaction()
        dropped = p.send(topic, b"never-sent", partition=1)
        await p.abort_transaction()  # unsent records fail, nothing is written
        with pytest.raises(LogMQError):
            await dropped
        p.begin_transaction()
        for i in range(6):
            p.send(topic, b"c2-%d" % i, partition=i % 3)
        await p.commit_transaction()

    committed = await read_all(broker, topic, 3, "read_committed")
    for part in range(3):
        want = [b"c1-%d" % i for i in range(12) if i % 3 == part]
        want += [b"c2-%d" % i for i in range(6) if i % 3 == part]
        assert committed[part] == want
    uncommitted = await read_all(broker, topic, 3, "read_uncommitted")
    for part in range(3):
        want = [b"c1-%d" % i for i in range(12) if i % 3 == part]
        want += [b"a-%d" % i for i in range(9) if i % 3 == part]
        want += [b"c2-%d" % i for i in range(6) if i % 3 == part]
        assert uncommitted[part] == want  # every record, no markers


async def test_open_transaction_holds_read_committed_back(broker):
    topic = await make_topic(broker, "txn-open", 1)
    async with AsyncProducer(broker.bootstrap, acks="all") as plain:
        await plain.send(topic, b"before", partition=0)
    async with AsyncProducer(broker.bootstrap, transactional_id=txn_id("open")) as p:
        await p.init_transactions()
        p.begin_transaction()
        await p.send(topic, b"in-txn", partition=0)
        async with AsyncProducer(broker.bootstrap, acks="all") as plain:
            await plain.send(topic, b"after", partition=0)  # behind the open transaction
        async with AsyncConsumer(
            broker.bootstrap, auto_offset_reset="earliest", isolation_level="read_committed"
        ) as consumer:
            consumer.assign([(topic, 0)])
            seen: list[bytes] = []
            for _ in range(4):
                seen += [r.value for r in await consumer.poll(0.25)]
            assert seen == [b"before"]
            assert await consumer.position(topic, 0) == 1
            # "latest" for read_committed is the last stable offset
            assert (await consumer.end_offsets([(topic, 0)]))[(topic, 0)] == 1
            await p.commit_transaction()
            while len(seen) < 3:
                seen += [r.value for r in await asyncio.wait_for(consumer.poll(1.0), 10)]
            assert seen == [b"before", b"in-txn", b"after"]
            assert await consumer.position(topic, 0) == 4  # past the COMMIT marker


async def test_second_producer_fences_the_first(broker):
    topic = await make_topic(broker, "txn-fence", 1)
    tid = txn_id("fence")
    async with AsyncProducer(broker.bootstrap, transactional_id=tid) as first:
        await first.init_transactions()
        first.begin_transaction()
        await first.send(topic, b"zombie", partition=0)
        async with AsyncProducer(broker.bootstrap, transactional_id=tid) as second:
            await second.init_transactions()  # aborts what the first left open
            assert second.transaction_identity[2] > first.transaction_identity[2]
            with pytest.raises(ProducerFencedError):
                await first.commit_transaction()
            with pytest.raises(ProducerFencedError):  # fatal: stays so
                first.begin_transaction()
            second.begin_transaction()
            await second.send(topic, b"successor", partition=0)
            await second.commit_transaction()
    assert (await read_all(broker, topic, 1, "read_committed"))[0] == [b"successor"]


async def test_send_offsets_commit_only_with_the_transaction(broker):
    source = await make_topic(broker, "txn-offsets-in", 2)
    sink = await make_topic(broker, "txn-offsets-out", 1)
    group = f"ctp-{next(_ids)}"
    offsets = {(source, 0): 7, (source, 1): 3}
    async with (
        AsyncAdmin(broker.bootstrap) as admin,
        AsyncProducer(broker.bootstrap, transactional_id=txn_id("offsets")) as p,
    ):
        await p.init_transactions()
        p.begin_transaction()
        p.send(sink, b"out-1", partition=0)
        await p.send_offsets_to_transaction(offsets, group)
        assert await admin.group_offsets(group) == {}  # pending, not visible
        await p.abort_transaction()
        assert await admin.group_offsets(group) == {}  # aborted: gone

        p.begin_transaction()
        p.send(sink, b"out-2", partition=0)
        await p.send_offsets_to_transaction(offsets, group)
        await p.commit_transaction()

        async def committed() -> dict:
            return {tp: o.offset for tp, o in (await admin.group_offsets(group)).items()}

        for _ in range(100):  # the marker reaches the offsets partition after EndTxn
            if await committed() == offsets:
                break
            await asyncio.sleep(0.05)
        assert await committed() == offsets
    assert (await read_all(broker, sink, 1, "read_committed"))[0] == [b"out-2"]


async def test_send_offsets_keeps_the_leader_epoch(broker):
    """An OffsetAndMetadata's leader epoch is committed with the transaction and read
    back by OffsetFetch on either door (a plain offset's epoch is unknown, -1)."""
    source = await make_topic(broker, "txn-epoch-in", 2)
    group = f"epoch-{next(_ids)}"
    offsets = {(source, 0): OffsetAndMetadata(7, "m", leader_epoch=0), (source, 1): 3}
    want = {(source, 0): (7, "m", 0), (source, 1): (3, "", -1)}
    async with (
        AsyncAdmin(broker.bootstrap) as admin,
        AsyncProducer(broker.bootstrap, transactional_id=txn_id("epoch")) as p,
    ):
        await p.init_transactions()
        p.begin_transaction()
        await p.send_offsets_to_transaction(offsets, group)
        await p.commit_transaction()

        async def committed() -> dict:
            found = await admin.group_offsets(group)
            return {tp: (o.offset, o.metadata, o.leader_epoch) for tp, o in found.items()}

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10  # the marker reaches the offsets partition after EndTxn
        while await committed() != want and loop.time() < deadline:
            await asyncio.sleep(0.05)
        assert await committed() == want
    ck = pytest.importorskip("confluent_kafka")
    c = ck.Consumer({"bootstrap.servers": broker.kafka_bootstrap, "group.id": group})
    try:
        got = await asyncio.to_thread(
            c.committed, [ck.TopicPartition(source, 0), ck.TopicPartition(source, 1)], 10
        )
    finally:
        c.close()
    assert [(t.offset, t.leader_epoch) for t in got] == [(7, 0), (3, None)]


async def test_prepare_then_complete_from_another_client(broker):
    topic = await make_topic(broker, "txn-two-phase", 2)
    async with AsyncProducer(broker.bootstrap, transactional_id=txn_id("2pc")) as p:
        await p.init_transactions()
        p.begin_transaction()
        for i in range(4):
            p.send(topic, b"t-%d" % i, partition=i % 2)
        identity = await p.prepare_transaction()
        assert identity == p.transaction_identity
        with pytest.raises(TransactionStateError):  # prepared: no more records
            p.send(topic, b"late", partition=0)
        assert await read_all(broker, topic, 2, "read_committed", polls=2) == {0: [], 1: []}
        async with AsyncAdmin(broker.bootstrap) as admin:
            await admin.complete_transaction(*identity, commit=True)
            await admin.complete_transaction(*identity, commit=True)  # already: fine
            with pytest.raises(TransactionStateError):
                await admin.complete_transaction(*identity, commit=False)
        got = await read_all(broker, topic, 2, "read_committed")
        assert got == {0: [b"t-0", b"t-2"], 1: [b"t-1", b"t-3"]}
        # the producer carries on with a new transaction once the old one is complete
        p.begin_transaction()
        p.send(topic, b"next", partition=0)
        await p.commit_transaction()
    assert (await read_all(broker, topic, 2, "read_committed"))[0][-1] == b"next"


async def test_complete_transaction_of_an_empty_one_and_a_stranger(broker):
    async with AsyncProducer(broker.bootstrap, transactional_id=txn_id("empty")) as p:
        await p.init_transactions()
        p.begin_transaction()
        identity = await p.prepare_transaction()  # nothing written
    cluster = ClusterClient(broker.bootstrap)
    try:
        await complete_transaction(cluster, *identity, commit=True)  # nothing to end
        tid, pid, epoch = identity
        with pytest.raises(LogMQError) as info:  # a producer id the id never had
            await complete_transaction(cluster, tid, pid + 1000, epoch, commit=True)
        assert info.value.code is ErrorCode.INVALID_PRODUCER_ID_MAPPING
    finally:
        await cluster.close()


async def test_sends_outside_a_transaction_are_refused(broker):
    topic = await make_topic(broker, "txn-misuse", 1)
    async with AsyncProducer(broker.bootstrap, transactional_id=txn_id("misuse")) as p:
        with pytest.raises(TransactionStateError):
            p.begin_transaction()  # before init_transactions
        await p.init_transactions()
        with pytest.raises(TransactionStateError):
            p.send(topic, b"x", partition=0)
        with pytest.raises(TransactionStateError):
            await p.commit_transaction()
        p.begin_transaction()
        with pytest.raises(TransactionStateError):
            p.begin_transaction()
        await p.abort_transaction()  # nothing joined: no request needed
    async with AsyncProducer(broker.bootstrap) as plain:
        with pytest.raises(TransactionStateError):
            plain.begin_transaction()
    with pytest.raises(ValueError):
        AsyncProducer(broker.bootstrap, transactional_id="x", acks=0)


async def test_door_refuses_unknown_partitions_and_unadded_produces(broker):
    topic = await make_topic(broker, "txn-door", 1)
    cluster = ClusterClient(broker.bootstrap)
    try:
        tid = txn_id("door")
        resp = await cluster.request_any(ApiKey.FIND_COORDINATOR, {"key_type": 1, "keys": [tid]})
        (entry,) = resp.body["coordinators"]
        assert entry["error"] == 0
        node = entry["node_id"]
        resp = await cluster.request_node(
            node,
            ApiKey.INIT_PRODUCER_ID,
            {"transactional_id": tid, "transaction_timeout_ms": 10_000},
        )
        assert resp.body["error"] == 0
        pid, epoch = resp.body["producer_id"], resp.body["producer_epoch"]
        ids = {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch}

        # a partition of no topic: nothing is added, the others are not attempted
        resp = await cluster.request_node(
            node,
            ApiKey.ADD_PARTITIONS_TO_TXN,
            {**ids, "topics": [{"topic": "no-such-topic", "partitions": [0]},
                               {"topic": topic, "partitions": [0]}]},
        )  # fmt: skip
        codes = {
            (t["topic"], p["partition"]): p["error"]
            for t in resp.body["topics"]
            for p in t["partitions"]
        }
        assert codes == {
            ("no-such-topic", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            (topic, 0): ErrorCode.OPERATION_NOT_ATTEMPTED,
        }
        assert resp.body["error"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

        # a transactional batch for a partition the transaction does not hold
        batch = b.encode_batch([(0, None, b"sneaky", None)], producer_id=pid,
                               producer_epoch=epoch, base_sequence=0)  # fmt: skip
        txn_batch = bytearray(batch)
        b.HEADER.pack_into(txn_batch, 0, *_with_attributes(batch, b.ATTR_TRANSACTIONAL))
        txn_batch = _recrc(txn_batch)

        async def produce(data: bytes) -> int:
            conn = await cluster.leader_connection(topic, 0)
            body = {
                "acks": -1,
                "timeout_ms": 5000,
                "transactional_id": tid,
                "topics": [{"topic": topic, "partitions": [{"partition": 0, "size": len(data)}]}],
            }
            resp = await conn.request(ApiKey.PRODUCE, body, [data])
            return resp.body["topics"][0]["partitions"][0]["error"]

        assert await produce(txn_batch) == ErrorCode.INVALID_TXN_STATE
        assert await produce(batch) == ErrorCode.INVALID_RECORD  # not marked transactional
        # EndTxn with nothing to end
        with pytest.raises(TransactionStateError):
            await cluster.request_node(node, ApiKey.END_TXN, {**ids, "committed": True})
    finally:
        await cluster.close()
    assert (await read_all(broker, topic, 1, "read_uncommitted", polls=2))[0] == []


def _with_attributes(batch: bytes, extra: int) -> tuple:
    fields = list(b.HEADER.unpack_from(batch, 0))
    fields[5] |= extra  # attributes
    return tuple(fields)


def _recrc(buf: bytearray) -> bytes:
    """The batch with its CRC computed again (after its attributes changed)."""
    struct.pack_into(">I", buf, b.CHECKSUM_POS, b.compute_checksum(buf, 0, len(buf)))
    return bytes(buf)


def test_blocking_producer_and_admin(broker):
    topic = asyncio.run(make_topic(broker, "txn-blocking", 1))
    with Producer(broker.bootstrap, transactional_id=txn_id("sync")) as p:
        p.init_transactions()
        p.begin_transaction()
        p.send(topic, b"one", partition=0)
        identity = p.prepare_transaction()
        with Admin(broker.bootstrap) as admin:
            admin.complete_transaction(*identity, commit=True)
        p.begin_transaction()
        p.send(topic, b"two", partition=0)
        p.abort_transaction()
        p.begin_transaction()
        p.send(topic, b"three", partition=0)
        p.commit_transaction()
    got = asyncio.run(read_all(broker, topic, 1, "read_committed"))
    assert got[0] == [b"one", b"three"]


# -- the consumer's filter, without a broker -------------------------------------------

# A log: each step is (producer, action): "data" (a transactional batch of that
# producer's open transaction), "commit"/"abort" (its marker), or "plain" (a
# non-transactional batch).
steps = st.lists(
    st.tuples(st.integers(0, 2), st.sampled_from(["data", "data", "commit", "abort", "plain"])),
    max_size=30,
)


def build_log(log_steps: list[tuple[int, str]]) -> tuple[bytes, list[list[int]], list[int]]:
    """The batches of ``log_steps`` as a broker stores them, the aborted transactions a
    read_committed fetch from offset 0 lists, and the offsets read_committed keeps
    (only transactions that end in the log; open ones are past the LSO)."""
    out: list[bytes] = []
    aborted: list[list[int]] = []
    txn_start: dict[int, int] = {}
    txn_offsets: dict[int, list[int]] = {}
    kept: list[int] = []
    plain: list[int] = []
    for offset, (producer, action) in enumerate(log_steps):
        pid = 100 + producer
        if action == "plain":
            out.append(b.encode_batch([(0, None, b"p%d" % offset, None)], base_offset=offset))
            plain.append(offset)
        elif action == "data":
            data = bytearray(
                b.encode_batch([(0, None, b"d%d" % offset, None)], base_offset=offset,
                               producer_id=pid, producer_epoch=0, base_sequence=offset)
            )  # fmt: skip
            b.HEADER.pack_into(data, 0, *_with_attributes(data, b.ATTR_TRANSACTIONAL))
            out.append(_recrc(data))
            txn_start.setdefault(pid, offset)
            txn_offsets.setdefault(pid, []).append(offset)
        else:
            kind = CONTROL_COMMIT if action == "commit" else CONTROL_ABORT
            out.append(
                encode_control_batch(kind, producer_id=pid, producer_epoch=0, base_offset=offset)
            )
            if pid in txn_start:
                if action == "abort":
                    aborted.append([pid, txn_start[pid]])
                else:
                    kept += txn_offsets[pid]
                del txn_start[pid]
                txn_offsets.pop(pid, None)
    return b"".join(out), aborted, sorted(kept + plain)


def offsets_of(data: bytes | memoryview) -> list[int]:
    return [h.base_offset for _, h in b.iter_headers(data)]


@settings(max_examples=150, deadline=None)
@given(steps)
def test_filter_drops_aborted_transactions_and_markers(log_steps):
    data, aborted, _ = build_log(log_steps)
    # what a broker returns below the LSO: up to the first still-open transaction
    open_at = _lso(log_steps)
    data = b"".join(
        data[pos : pos + h.size] for pos, h in b.iter_headers(data) if h.base_offset < open_at
    )
    _, _, kept = build_log(log_steps)
    want = [o for o in kept if o < open_at]
    out = txn_filter(memoryview(data), aborted, True)
    assert offsets_of(data if out is None else out) == want
    # read_uncommitted: only the markers go
    out = txn_filter(memoryview(data), None, False)
    markers = {o for o, (_, a) in enumerate(log_steps) if a in ("commit", "abort")}
    assert offsets_of(data if out is None else out) == [
        o for o in offsets_of(data) if o not in markers
    ]


def _lso(log_steps: list[tuple[int, str]]) -> int:
    open_since: dict[int, int] = {}
    for offset, (producer, action) in enumerate(log_steps):
        if action == "data":
            open_since.setdefault(producer, offset)
        elif action in ("commit", "abort"):
            open_since.pop(producer, None)
    return min(open_since.values(), default=len(log_steps))


def test_position_moves_past_dropped_batches_at_the_end():
    log_steps = [(0, "plain"), (1, "data"), (1, "abort")]
    data, aborted, _ = build_log(log_steps)
    pd = PartitionData("t", 0, 0, ErrorCode.NONE, data=memoryview(data))
    pd.drop_txn_batches(aborted, True)
    records = pd.take(100)
    assert [r.value for r in records] == [b"p0"]
    assert pd.position == 3 and pd.exhausted
    pd = PartitionData("t", 0, 1, ErrorCode.NONE, data=memoryview(data))  # nothing to hand out
    pd.drop_txn_batches(aborted, True)
    assert pd.take_batches(100) == [] and pd.position == 3


def test_unmarked_data_is_not_copied():
    data, _, _ = build_log([(0, "plain"), (0, "plain")])
    assert txn_filter(memoryview(data), None, False) is None
    assert txn_filter(memoryview(data), [[5, 0]], True) is None


# -- the native door's ACLs for a producer's transaction requests -----------------------


class FakeAuthz:
    """Allows exactly the (operation, resource type, name) triples it holds."""

    enabled = True

    def __init__(self, *allowed: tuple[Op, RT, str]) -> None:
        self.allowed_set = set(allowed)

    def allowed(self, context: Any, op: Op, rtype: RT, name: str, *, log_denial=True) -> bool:
        return (op, rtype, name) in self.allowed_set

    def allowed_on_some(self, context: Any, op: Op, rtype: RT) -> bool:
        return any(o == op and r == rtype for o, r, _ in self.allowed_set)


def request(api_key: int, body: dict[str, Any]) -> Request:
    return Request(api_key, 0, 1, "test", body, memoryview(b""))


async def guard(authz: FakeAuthz, api_key: int, body: dict[str, Any]) -> int:
    native = NativeAuthorization(authz, NATIVE_APIS)  # type: ignore[arg-type]
    reply = await native.guard(request(api_key, body))
    return 0 if reply is None else reply.body["error"]


ADD = {
    "transactional_id": "tx",
    "producer_id": 1,
    "producer_epoch": 0,
    "topics": [{"topic": "t", "partitions": [0]}],
}
WRITE_ID = (Op.WRITE, RT.TRANSACTIONAL_ID, "tx")
WRITE_T = (Op.WRITE, RT.TOPIC, "t")


async def test_acls_of_a_producers_transaction_requests():
    A = ApiKey
    assert await guard(FakeAuthz(WRITE_ID, WRITE_T), A.ADD_PARTITIONS_TO_TXN, ADD) == 0
    assert (
        await guard(FakeAuthz(WRITE_T), A.ADD_PARTITIONS_TO_TXN, ADD)
        == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    )
    assert (
        await guard(FakeAuthz(WRITE_ID), A.ADD_PARTITIONS_TO_TXN, ADD)
        == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    )
    # the verify_only form stays a broker's request
    verify = {**ADD, "verify_only": True}
    from_broker = NativeAuthorization(FakeAuthz(), NATIVE_APIS).from_broker  # type: ignore[arg-type]
    assert from_broker(request(A.ADD_PARTITIONS_TO_TXN, verify))
    assert not from_broker(request(A.ADD_PARTITIONS_TO_TXN, ADD))
    assert (
        await guard(FakeAuthz(WRITE_ID, WRITE_T), A.ADD_PARTITIONS_TO_TXN, verify)
        == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    )
    assert (
        await guard(
            FakeAuthz((Op.CLUSTER_ACTION, RT.CLUSTER, CLUSTER)), A.ADD_PARTITIONS_TO_TXN, verify
        )
        == 0
    )
    # InitProducerId with an id: WRITE on it (WRITE on a topic is not enough)
    init = {"transactional_id": "tx", "transaction_timeout_ms": 1000}
    assert await guard(FakeAuthz(WRITE_ID), A.INIT_PRODUCER_ID, init) == 0
    assert (
        await guard(FakeAuthz(WRITE_T), A.INIT_PRODUCER_ID, init)
        == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    )
    assert await guard(FakeAuthz(WRITE_T), A.INIT_PRODUCER_ID, {}) == 0  # idempotent only
    # FindCoordinator for an id: DESCRIBE on it
    find = {"key_type": 1, "keys": ["tx"]}
    assert (
        await guard(FakeAuthz((Op.DESCRIBE, RT.TRANSACTIONAL_ID, "tx")), A.FIND_COORDINATOR, find)
        == 0
    )
    assert (
        await guard(FakeAuthz(WRITE_T), A.FIND_COORDINATOR, find)
        == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    )
    # AddOffsetsToTxn: WRITE id + READ group; EndTxn: WRITE id;
    # TxnOffsetCommit: WRITE id, READ group, READ topics
    read_g = (Op.READ, RT.GROUP, "g")
    offsets = {"transactional_id": "tx", "group_id": "g", "producer_id": 1, "producer_epoch": 0}
    assert await guard(FakeAuthz(WRITE_ID, read_g), A.ADD_OFFSETS_TO_TXN, offsets) == 0
    assert (
        await guard(FakeAuthz(WRITE_ID), A.ADD_OFFSETS_TO_TXN, offsets)
        == ErrorCode.GROUP_AUTHORIZATION_FAILED
    )
    assert await guard(FakeAuthz(WRITE_ID), A.END_TXN, {**offsets, "committed": True}) == 0
    assert (
        await guard(FakeAuthz(read_g), A.END_TXN, {**offsets, "committed": True})
        == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    )
    commit = {**offsets, "topics": [{"topic": "t", "partitions": [{"partition": 0, "offset": 1}]}]}
    read_t = (Op.READ, RT.TOPIC, "t")
    assert await guard(FakeAuthz(WRITE_ID, read_g, read_t), A.TXN_OFFSET_COMMIT, commit) == 0
    assert (
        await guard(FakeAuthz(WRITE_ID, read_g), A.TXN_OFFSET_COMMIT, commit)
        == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    )
