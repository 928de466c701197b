"""Real clients read a tiered topic whole, from offset 0, across both tiers.

One broker per back end (the directory store, and S3 on the session's moto server),
each started once for the module. The directory broker's topic is produced once with
known timestamps and read by every client (confluent-kafka, kcat, kafka-python in
test_tiered_broker.py; aiokafka, Sarama, logmq's native client, the Spark source and
KafkaJS here); a transactional producer's committed and aborted transactions are read
back at both isolation levels; ListOffsets answers -2, -4, -5 and a timestamp that only
the remote tier holds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import shutil
import socket
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from logmq.storage.remote.chunk_cache import ChunkCache, IndexCache
from logmq.storage.remote.directory_store import DirectoryStore
from logmq.storage.remote.reader import RemoteReader
from logmq.storage.remote.segment_files import Manifest, manifest_checksum
from logmq.storage.remote.segment_metadata import RemoteSegment, SegmentState
from logmq.testing.s3 import ACCESS_KEY_ID, SECRET_ACCESS_KEY
from tests.harness import BrokerProcess
from tests.kafka.test_kafka_sarama import sarama_client  # noqa: F401 (the session's build)
from tests.storage.remote.test_tiered_broker import (
    TIER_ARGS,
    consume_confluent,
    consume_kcat,
    create_tiered_topic,
    local_log_files,
    produce,
    spark_session,
    start_tiered_broker,
    tier_args,
    wait_for,
)

confluent_kafka = pytest.importorskip("confluent_kafka")

S3_RSM = "io.aiven.kafka.tieredstorage.storage.s3.S3Storage"
COUNT = 20_000
EARLIEST, EARLIEST_LOCAL, LATEST_TIERED = -2, -4, -5
KAFKAJS_VERSION = "2.2.4"


# -- brokers, one per back end -----------------------------------------------------------


@pytest.fixture(scope="module")
def dir_broker(tmp_path_factory):
    broker = start_tiered_broker(tmp_path_factory.mktemp("tclients"))
    yield broker
    broker.stop()


def s3_args(endpoint_url: str, bucket: str) -> list[str]:
    kvs = [kv for kv in TIER_ARGS if not kv.startswith("rsm.config.storage.backend.class=")]
    kvs += [
        f"rsm.config.storage.backend.class={S3_RSM}",
        f"rsm.config.storage.s3.bucket.name={bucket}",
        f"rsm.config.storage.s3.endpoint.url={endpoint_url}",
        "rsm.config.storage.s3.region=us-east-1",
        "rsm.config.storage.s3.path.style.access.enabled=true",
        f"rsm.config.storage.aws.access.key.id={ACCESS_KEY_ID}",
        f"rsm.config.storage.aws.secret.access.key={SECRET_ACCESS_KEY}",
    ]
    out: list[str] = []
    for kv in kvs:
        out += ["--override", kv]
    return out


@pytest.fixture(scope="module")
def s3_broker(tmp_path_factory, moto_server):
    bucket = moto_server.create_bucket(f"tc-{uuid.uuid4().hex[:12]}")
    base = tmp_path_factory.mktemp("tclients-s3")
    broker = BrokerProcess(base / "data", extra_args=s3_args(moto_server.endpoint_url, bucket))
    broker.start()
    broker.bucket = bucket  # type: ignore[attr-defined]
    broker.endpoint_url = moto_server.endpoint_url  # type: ignore[attr-defined]
    yield broker
    broker.stop()


# -- the shared topic: produced once, with timestamps ------------------------------------


@dataclasses.dataclass
class Tiered:
    topic: str
    values: list[bytes]
    timestamps: list[int]
    first_local: int  # the local log start once copied segments left
    highest_copied: int


def produce_timed(broker: BrokerProcess, topic: str, count: int, t0: int) -> list[bytes]:
    """Record i has CreateTime ``t0 + 2 * i`` (batches of many records, each its own)."""
    p = confluent_kafka.Producer(
        {
            "bootstrap.servers": broker.kafka_bootstrap,
            "linger.ms": 5,
            "acks": "all",
            "batch.size": 16384,
        }
    )
    values = [b"%08d" % i + b"y" * 92 for i in range(count)]
    for i, v in enumerate(values):
        while True:
            try:
                p.produce(topic, v, partition=0, timestamp=t0 + 2 * i)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    return values


def kafka_list_offsets(broker: BrokerProcess, topic: str, timestamps: list[int], version: int = 9):
    """One raw ListOffsets request (Kafka door) per timestamp: [(offset, timestamp)]."""
    from kio.serial import entity_reader, entity_writer

    from logmq.kafka.codec import _request_class, response_class

    cls = _request_class(2, version)
    m = sys.modules[cls.__module__]
    out = []
    with socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=20) as s:
        for corr, ts in enumerate(timestamps):
            body = cls(
                replica_id=-1,
                isolation_level=0,
                topics=(
                    m.ListOffsetsTopic(
                        name=topic,
                        partitions=(m.ListOffsetsPartition(partition_index=0, timestamp=ts),),
                    ),
                ),
            )
            header = cls.__header_schema__(
                request_api_key=2, request_api_version=version, correlation_id=corr, client_id="t"
            )
            buf = io.BytesIO()
            entity_writer(type(header))(buf, header)
            entity_writer(cls)(buf, body)
            s.sendall(struct.pack(">i", buf.tell()) + buf.getvalue())
            (size,) = struct.unpack(">i", _read_exactly(s, 4))
            frame = _read_exactly(s, size)
            resp = response_class(2, version)
            _, pos = entity_reader(resp.__header_schema__)(frame, 0)
            answer, _ = entity_reader(resp)(frame, pos)
            [part] = answer.topics[0].partitions
            assert int(part.error_code) == 0, part
            out.append((part.offset, part.timestamp))
    return out


def _read_exactly(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, "the broker closed the connection"
        buf += chunk
    return buf


def settled(broker: BrokerProcess, topic: str, min_local_start: int) -> tuple[int, int] | None:
    """(local start, highest copied) once every closed segment is copied and local
    retention let the copied ones below ``min_local_start`` go."""
    files = local_log_files(broker, topic)
    if not files or files[0] < min_local_start:
        return None
    (local, _), (copied, _) = kafka_list_offsets(broker, topic, [EARLIEST_LOCAL, LATEST_TIERED])
    if local != files[0] or copied != files[-1] - 1:
        return None
    return local, copied


@pytest.fixture(scope="module")
def tiered(dir_broker) -> Tiered:
    topic = "tc-all"
    create_tiered_topic(dir_broker, topic)
    t0 = int(time.time() * 1000) - 3_600_000
    values = produce_timed(dir_broker, topic, COUNT, t0)
    local, copied = wait_for(
        lambda: settled(dir_broker, topic, COUNT // 2), what="copied segments to leave the disk"
    )
    return Tiered(topic, values, [t0 + 2 * i for i in range(COUNT)], local, copied)


# -- 1. the S3 back end end to end --------------------------------------------------------


def s3_keys(broker: BrokerProcess) -> list[str]:
    boto3 = pytest.importorskip("boto3")
    s3 = boto3.client(
        "s3",
        endpoint_url=broker.endpoint_url,  # type: ignore[attr-defined]
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY_ID,
        aws_secret_access_key=SECRET_ACCESS_KEY,
    )
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=broker.bucket):  # type: ignore[attr-defined]
        keys += [o["Key"] for o in page.get("Contents", ())]
    return keys


def test_s3_back_end_serves_every_client_from_zero(s3_broker):
    topic = "tc-s3"
    create_tiered_topic(s3_broker, topic)
    values = produce(s3_broker, topic, COUNT)
    local, copied = wait_for(
        lambda: settled(s3_broker, topic, COUNT // 2), what="copied segments to leave the disk"
    )
    manifests = sorted(k for k in s3_keys(s3_broker) if k.endswith(".manifest"))
    assert len(manifests) >= 10
    assert manifests[0].rsplit("/", 1)[1].startswith(f"{0:020d}-")  # offset 0 is in S3
    assert 0 < local <= copied + 1
    assert kafka_list_offsets(s3_broker, topic, [EARLIEST])[0][0] == 0
    assert consume_confluent(s3_broker, topic, len(values), "read_committed") == values
    assert consume_confluent(s3_broker, topic, len(values), "read_uncommitted") == values
    assert consume_kcat(s3_broker, topic) == values


def test_s3_back_end_starts_without_a_call_timeout(moto_server):
    from logmq.storage.remote.config import RemoteStorageSettings
    from logmq.storage.remote.stores import build_store

    props = dict(kv.split("=", 1) for kv in s3_args(moto_server.endpoint_url, "bucket")[1::2])
    assert "rsm.config.storage.s3.api.call.timeout" not in props
    settings = RemoteStorageSettings.from_properties(props)

    async def build() -> float:
        store = build_store(settings)
        try:
            return store._timeout_s  # type: ignore[attr-defined]
        finally:
            await store.close()

    assert asyncio.run(build()) > 0


# -- 2. transactions across tiers ---------------------------------------------------------


@dataclasses.dataclass
class TxnTopic:
    topic: str
    committed: list[bytes]
    everything: list[bytes]
    aborted_first_offsets: list[int]  # the first offset of each aborted transaction
    first_local: int


@pytest.fixture(scope="module")
def txn_topic(dir_broker) -> TxnTopic:
    """Committed and aborted transactions of several batches each (a flush per batch),
    so segment boundaries fall inside aborted transactions: data in one segment, the
    ABORT marker in the next."""
    topic = "tc-txn"
    create_tiered_topic(
        dir_broker, topic, **{"segment.bytes": "32768", "local.retention.bytes": "65536"}
    )
    p = confluent_kafka.Producer(
        {
            "bootstrap.servers": dir_broker.kafka_bootstrap,
            "transactional.id": "tc-txn-producer",
            "linger.ms": 0,
        }
    )
    p.init_transactions(30)
    committed: list[bytes] = []
    everything: list[bytes] = []
    aborted_first: list[int] = []
    first_offset: list[int] = []

    def on_delivery(err, msg):
        assert err is None, err
        if not first_offset:
            first_offset.append(msg.offset())

    n_txns, batches, per_batch = 61, 4, 5  # the last one committed
    for t in range(n_txns):
        abort = t % 2 == 1
        first_offset.clear()
        p.begin_transaction()
        mine = []
        for bi in range(batches):
            for r in range(per_batch):
                v = b"%s-%04d-%d-%d-" % (b"A" if abort else b"C", t, bi, r) + b"z" * 300
                mine.append(v)
                p.produce(topic, v, partition=0, on_delivery=on_delivery)
            p.flush(30)  # each batch on its own, and in the log before an abort
        everything += mine
        if abort:
            aborted_first.append(first_offset[0])
            p.abort_transaction(30)
        else:
            committed += mine
            p.commit_transaction(30)
    p.flush(30)
    # every closed segment copied, and at least half of the topic's segments off the disk
    local, _ = wait_for(
        lambda: settled(dir_broker, topic, len(everything) // 2),
        what="copied transactional segments to leave the disk",
    )
    return TxnTopic(topic, committed, everything, aborted_first, local)


def remote_segments_on_disk(root: Path, topic: str) -> list[RemoteSegment]:
    """The topic's copied segments, described from their manifests (for a reader of our own)."""
    out = []
    for path in sorted(root.glob(f"{topic}-*/0/*.manifest")):
        data = path.read_bytes()
        m = Manifest.from_bytes(data)
        topic_id = path.parent.parent.name[len(topic) + 1 :]
        out.append(
            RemoteSegment(
                topic_id=topic_id,
                partition=0,
                segment_id=m.segment_id,
                base_offset=m.base_offset,
                end_offset=m.end_offset,
                max_timestamp=0,
                size_bytes=m.log_size,
                leader_epochs=(),
                copier_epoch=0,
                broker_id=1,
                state=SegmentState.COPY_FINISHED,
                checksum=manifest_checksum(data),
                topic=topic,
            )
        )
    return sorted(out, key=lambda s: s.base_offset)


def test_the_remote_txn_indexes_hold_every_aborted_transaction(dir_broker, txn_topic):
    root: Path = dir_broker.remote_root  # type: ignore[attr-defined]
    segs = remote_segments_on_disk(root, txn_topic.topic)
    assert len(segs) >= 6 and segs[0].base_offset == 0
    assert len(list(root.glob(f"{txn_topic.topic}-*/0/*.txnindex"))) >= 3

    async def check() -> tuple[list[int], int]:
        store = DirectoryStore(root)
        reader = RemoteReader(
            store, chunk_cache=ChunkCache(1 << 24), index_cache=IndexCache(1 << 24)
        )
        try:
            upper = segs[-1].end_offset + 1
            found, passed = await reader.collect_aborted(txn_topic.topic, segs, 0, upper)
            assert passed or found  # the last marker's LSO may lie past the copied part
            spanning = 0
            for seg in segs:  # segment by segment: what one fetch's segment alone knows
                own = await reader.aborted_transactions(
                    txn_topic.topic, seg, seg.base_offset, seg.end_offset + 1
                )
                wanted = {
                    f for f, e in zip(aborted_first, aborted_end, strict=True)
                    if f <= seg.end_offset and e >= seg.base_offset
                }  # fmt: skip
                spanning += len(wanted - {f for _, f in own})
            return sorted(f for _, f in found), spanning
        finally:
            await reader.close()
            await store.close()

    highest = segs[-1].end_offset
    aborted_first = txn_topic.aborted_first_offsets
    # a transaction of 4 batches of 5 records ends with its marker 20 offsets on
    aborted_end = [f + 20 for f in aborted_first]
    found, spanning = asyncio.run(check())
    # every aborted transaction whose marker was copied (a later one's is not yet)
    assert found == [f for f, e in zip(aborted_first, aborted_end, strict=True) if e <= highest]
    # some aborted transactions start in a segment whose own txn index cannot list them
    assert spanning > 0


def consume_aiokafka(broker: BrokerProcess, topic: str, count: int, isolation: str) -> list[bytes]:
    aiokafka = pytest.importorskip("aiokafka")

    async def run() -> list[bytes]:
        c = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=broker.kafka_bootstrap,
            enable_auto_commit=False,
            isolation_level=isolation,
            auto_offset_reset="earliest",
        )
        await c.start()
        out: list[bytes] = []
        try:
            tp = aiokafka.TopicPartition(topic, 0)
            c.assign([tp])
            await c.seek_to_beginning(tp)
            deadline = time.monotonic() + 60
            while len(out) < count and time.monotonic() < deadline:
                batches = await c.getmany(tp, timeout_ms=1000, max_records=5000)
                for records in batches.values():
                    out += [r.value for r in records]
        finally:
            await c.stop()
        return out

    return asyncio.run(run())


def test_read_uncommitted_gets_every_record_of_both_tiers(txn_topic, dir_broker):
    n = len(txn_topic.everything)
    assert consume_confluent(dir_broker, txn_topic.topic, n, "read_uncommitted") == (
        txn_topic.everything
    )


def test_read_committed_gets_exactly_the_committed_records(txn_topic, dir_broker):
    n = len(txn_topic.committed)
    got = consume_confluent(dir_broker, txn_topic.topic, n, "read_committed")
    assert got == txn_topic.committed  # no aborted record, no control record
    assert consume_kcat(dir_broker, txn_topic.topic) == txn_topic.committed  # librdkafka's default
    assert consume_aiokafka(dir_broker, txn_topic.topic, n, "read_committed") == txn_topic.committed


# -- 3. more clients from offset 0 --------------------------------------------------------


def test_aiokafka_reads_from_zero(dir_broker, tiered):
    assert consume_aiokafka(dir_broker, tiered.topic, COUNT, "read_uncommitted") == tiered.values


def test_sarama_reads_from_the_oldest_offset(dir_broker, tiered, sarama_client):  # noqa: F811
    sarama_binary = sarama_client
    proc = subprocess.run(
        [str(sarama_binary), "consume", dir_broker.kafka_bootstrap, tiered.topic, "0", str(COUNT)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert [r["offset"] for r in rows] == list(range(COUNT))
    assert [r["value"].encode() for r in rows] == tiered.values


def test_the_native_client_reads_from_zero(dir_broker, tiered):
    from logmq import Consumer

    tp = (tiered.topic, 0)
    out = []
    with Consumer(dir_broker.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([tp])
        assert c.beginning_offsets([tp]) == {tp: 0}
        c.seek_to_beginning(tp)
        deadline = time.monotonic() + 60
        while len(out) < COUNT and time.monotonic() < deadline:
            out.extend(c.poll(timeout=1.0))
    assert [r.offset for r in out] == list(range(COUNT))
    assert [r.value for r in out] == tiered.values


def test_the_spark_source_reads_the_whole_topic(dir_broker, tiered, tmp_path):
    session, mine = spark_session(tmp_path, "logmq-tiered-clients")
    from pyspark.sql import functions as F

    df = (
        session.read.format("logmq")
        .option("bootstrap", dir_broker.bootstrap)
        .option("topic", tiered.topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    try:
        row = df.agg(
            F.count("*").alias("n"),
            F.countDistinct("value").alias("distinct"),
            F.min("offset").alias("lo"),
            F.max("offset").alias("hi"),
        ).collect()[0]
    finally:
        if mine:
            session.stop()
    assert (row.n, row.distinct, row.lo, row.hi) == (COUNT, COUNT, 0, COUNT - 1)


KAFKAJS_SCRIPT = r"""
const { Kafka, logLevel } = require('kafkajs');
const [broker, topic, want] = process.argv.slice(2);
const kafka = new Kafka({ clientId: 'tc', brokers: [broker], logLevel: logLevel.NOTHING });
const consumer = kafka.consumer({ groupId: 'tc-kafkajs-' + Date.now() });
let got = 0;
const lines = [];
const timer = setTimeout(() => { console.error('only ' + got); process.exit(2); }, 60000);
(async () => {
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  await consumer.run({
    eachBatch: async ({ batch }) => {
      for (const m of batch.messages) {
        if (got < Number(want)) { lines.push(m.offset + ' ' + m.value.toString()); got++; }
      }
      if (got >= Number(want)) {
        clearTimeout(timer);
        process.stdout.write(lines.join('\n') + '\n', async () => {
          await consumer.disconnect();
          process.exit(0);
        });
      }
    },
  });
})().catch((e) => { console.error(e); process.exit(1); });
"""


@pytest.fixture(scope="session")
def kafkajs_dir(tmp_path_factory) -> Path:
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.skip("KafkaJS needs node and npm: neither is on PATH")
    d = tmp_path_factory.mktemp("kafkajs")
    proc = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--silent", f"kafkajs@{KAFKAJS_VERSION}"],
        cwd=d, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if proc.returncode != 0:
        pytest.skip(f"npm could not install kafkajs (no registry?): {proc.stderr[-300:]}")
    (d / "consume.js").write_text(KAFKAJS_SCRIPT)
    return d


def test_kafkajs_reads_from_the_beginning(dir_broker, tiered, kafkajs_dir):
    proc = subprocess.run(
        ["node", "consume.js", dir_broker.kafka_bootstrap, tiered.topic, str(COUNT)],
        cwd=kafkajs_dir, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split(" ", 1) for line in proc.stdout.splitlines() if line]
    assert [int(o) for o, _ in rows] == list(range(COUNT))
    assert [v.encode() for _, v in rows] == tiered.values


# -- 4. ListOffsets over both tiers -------------------------------------------------------


def test_list_offsets_earliest_earliest_local_and_latest_tiered(dir_broker, tiered):
    from logmq import Admin

    found = kafka_list_offsets(dir_broker, tiered.topic, [EARLIEST, EARLIEST_LOCAL, LATEST_TIERED])
    assert [o for o, _ in found] == [0, tiered.first_local, tiered.highest_copied]
    assert 0 < tiered.first_local <= tiered.highest_copied + 1 < COUNT
    copied = remote_segments_on_disk(dir_broker.remote_root, tiered.topic)  # type: ignore[attr-defined]
    assert copied[0].base_offset == 0
    assert max(s.end_offset for s in copied) == tiered.highest_copied
    # v8 knows -4 too; the native door answers the same
    assert kafka_list_offsets(dir_broker, tiered.topic, [EARLIEST_LOCAL], version=8)[0][0] == (
        tiered.first_local
    )
    tp = (tiered.topic, 0)
    with Admin(dir_broker.bootstrap) as admin:
        native = {ts: admin.list_offsets({tp: ts})[tp][0] for ts in (-2, -4, -5)}
    assert native == {-2: 0, -4: tiered.first_local, -5: tiered.highest_copied}


def test_a_timestamp_only_the_remote_tier_holds_finds_its_record(dir_broker, tiered):
    from confluent_kafka import TopicPartition

    assert tiered.first_local > 2000
    targets = [0, 1, 777, 1234, tiered.first_local - 1, tiered.first_local, COUNT - 1]
    c = confluent_kafka.Consumer({"bootstrap.servers": dir_broker.kafka_bootstrap, "group.id": "t"})
    try:
        for k in targets:
            for ts in (tiered.timestamps[k], tiered.timestamps[k] - 1):
                [tp] = c.offsets_for_times([TopicPartition(tiered.topic, 0, ts)], timeout=10)
                assert tp.error is None and tp.offset == k, (k, ts, tp)
    finally:
        c.close()
    # the raw answer carries the record's timestamp
    [(off, ts)] = kafka_list_offsets(dir_broker, tiered.topic, [tiered.timestamps[1234] - 1])
    assert (off, ts) == (1234, tiered.timestamps[1234])


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (
            {"rsm.config.storage.s3.bucket.name": "no-such-bucket"},
            "rsm.config.storage.s3.bucket.name",
        ),
        (
            {"rsm.config.storage.s3.endpoint.url": "http://127.0.0.1:9"},
            "rsm.config.storage.s3.endpoint.url",
        ),
        ({"rsm.config.storage.root": "/nonexistent/remote"}, "rsm.config.storage.root"),
    ],
)
def test_a_broker_with_an_unusable_store_stops_at_start_naming_the_setting(
    tmp_path, moto_server, change, named
):
    """A wrong bucket, an unreachable endpoint or a missing directory: the broker does
    not start, and its error names the setting at fault (as it does for wrong keys, in
    test_stores.py against a moto that checks them)."""
    from tests.harness import BrokerStartError

    if "rsm.config.storage.root" in change:
        args = tier_args(Path(change["rsm.config.storage.root"]))
    else:
        bucket = moto_server.create_bucket(f"exists-{uuid.uuid4().hex[:8]}")
        kvs = dict(kv.split("=", 1) for kv in s3_args(moto_server.endpoint_url, bucket)[1::2])
        kvs["rsm.config.storage.s3.api.call.timeout"] = "2000"
        kvs.update(change)
        args = [a for k, v in kvs.items() for a in ("--override", f"{k}={v}")]
    broker = BrokerProcess(tmp_path / "data", extra_args=args)
    with pytest.raises(BrokerStartError) as failed:
        broker.start(timeout=60)
    broker.close()
    assert named in str(failed.value) + broker.log_tail(80)
