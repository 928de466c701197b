"""Write the checked-in seed corpus of each target under fuzz/corpus/.

    python -m fuzz.make_corpus [TARGET...]   (default: every target)

codec: valid batches of each compression and a few-batch log (flags byte 2: the CRC is
recomputed after a mutation), plus the regression inputs. kafka: request frames of
every API the Kafka door serves at its lowest and highest version, bodies built by
hypothesis from kio's types with a fixed seed, plus the regression inputs. native:
request and response frames of the native door as its client and broker encode them,
plus its regression inputs. Inputs over 4096 bytes stay out (the tests replay the big
regression inputs straight from fuzz/regressions.py).
Files are named by content; the folders are emptied first.
"""

from __future__ import annotations

import hashlib
import io
import random
import warnings
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"


def _write(target: str, data: bytes) -> None:
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / hashlib.sha1(data).hexdigest()[:16]).write_bytes(data)


def codec_seeds() -> list[bytes]:
    from fuzz import codec_inputs, regressions

    rnd = random.Random(27)
    out = [b"\x02" + codec_inputs.batch(rnd, codec) for codec in codec_inputs.CODECS]
    out += [b"\x02" + codec_inputs.log(rnd) for _ in range(2)]
    out += [b"\x00" + data for data in regressions.CODEC.values()]
    return out


def _examples(cls: type, key: int) -> list:
    """Twenty hypothesis-built bodies of a kio request type, the same every time."""
    from hypothesis import HealthCheck, given, seed, settings
    from hypothesis import strategies as st

    bodies: list = []

    @seed(key)
    @settings(max_examples=20, database=None, suppress_health_check=list(HealthCheck))
    @given(st.from_type(cls))
    def collect(body):
        bodies.append(body)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collect()
    return bodies


def kafka_seeds() -> list[bytes]:
    from hypothesis import strategies as st
    from kio.index import KioIndexError, load_request_schema
    from kio.serial import entity_writer
    from kio.static.primitive import Records

    from fuzz import codec_inputs, regressions
    from logmq.kafka.registry import SERVED

    rnd = random.Random(9092)
    st.register_type_strategy(Records, st.builds(lambda: codec_inputs.batch(rnd, 0)))
    out: list[bytes] = []
    for api_key, (low, high) in sorted(SERVED.items()):
        for version in sorted({low, high}):
            try:
                cls = load_request_schema(api_key, version)
            except KioIndexError:  # a version kio does not know (so the door neither)
                continue
            bodies = _examples(cls, api_key * 100 + version)
            header = cls.__header_schema__(
                request_api_key=api_key,
                request_api_version=version,
                correlation_id=7,
                client_id="fuzz",
            )
            frames = []
            for body in bodies:
                buf = io.BytesIO()
                entity_writer(type(header))(buf, header)
                entity_writer(cls)(buf, body)
                frames.append(buf.getvalue())
            frames.sort(key=len)  # the smallest and a mid-sized one: small and varied
            out += [frames[0], frames[len(frames) // 2]] if len(frames) > 1 else frames
    out += regressions.KAFKA.values()
    return [f for f in out if len(f) <= 4096]


def native_seeds() -> list[bytes]:
    from fuzz import codec_inputs, regressions
    from logmq.net import codec

    rnd = random.Random(1)
    one = codec_inputs.batch(rnd, 0)
    produce = {
        "acks": -1,
        "timeout_ms": 30000,
        "topics": [{"topic": "t", "partitions": [{"partition": 0, "size": len(one)}]}],
    }
    fetch = {
        "max_wait_ms": 500,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "topics": [{"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 0,
                                                   "partition_max_bytes": 1 << 20}]}],
    }  # fmt: skip
    requests = [
        (codec.ApiKey.PRODUCE, produce, [one]),
        (codec.ApiKey.FETCH, fetch, []),
        (codec.ApiKey.METADATA, {"topics": ["t", "u"], "allow_auto_create": False}, []),
        (codec.ApiKey.API_VERSIONS, {}, []),
        (codec.ApiKey.OFFSET_COMMIT, {"group_id": "g", "topics": [{"topic": "t",
                                      "partitions": [{"partition": 0, "offset": 5}]}]}, []),
    ]  # fmt: skip
    out = [b"".join(codec.encode_request(k, 0, 3, "fuzz", body, tail))[4:]
           for k, body, tail in requests]  # fmt: skip
    fetched = {
        "topics": [
            {
                "topic": "t",
                "partitions": [{"partition": 0, "error": 0, "high_watermark": 1, "size": len(one)}],
            }
        ]
    }
    out.append(b"".join(codec.encode_response(3, fetched, [one]))[4:])
    out.append(b"".join(codec.encode_response(4, {"error": 3, "message": "no"}))[4:])
    out += regressions.NATIVE.values()
    return [f for f in out if len(f) <= 4096]


def _every_record() -> list:
    """One valid record of each type, in an order an empty image accepts (a snapshot's)."""
    from logmq.cluster import metadata_records as mr
    from logmq.cluster.security_image import acl_record, scram_record
    from logmq.security.acl import (
        AccessControlEntry,
        AclBinding,
        AclOperation,
        AclPermissionType,
        PatternType,
        ResourcePattern,
        ResourceType,
    )
    from logmq.security.scram import ScramCredential

    tid, sid = "b3c0ffee00000000000000000000beef", "5e9" * 10 + "ab"
    cred = ScramCredential.from_password("SCRAM-SHA-256", "pw", 4096, salt=b"salt")
    binding = AclBinding(
        ResourcePattern(ResourceType.TOPIC, "t", PatternType.LITERAL),
        AccessControlEntry("User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW),
    )
    out = [
        mr.ClusterIdRecord("c1"),
        mr.RegisterBroker(1, 3, "inc", "127.0.0.1", 9093, "rack-a", "h", 9092,
                          "PLAINTEXT://h:9092"),
        mr.RegisterBroker(2, 1, "inc2", "h2", 9093),
        mr.BrokerUnfenced(1, 3),
        mr.BrokerFenced(1, 3),
        mr.BrokerUnfenced(1, 3),
        mr.BrokerStorageFull(2, 1, 1),
        mr.TopicRecord("t", tid),
        mr.PartitionRecord("t", 0, (1, 2), (1, 2), 1, 4, 7),
        mr.PartitionRecord("t", 1, (2, 1, 3), (2, 1), 2, 0, 0, (3,), (1,), (2, 3)),
        mr.PartitionChange("t", 0, leader=2, isr=(2,)),
        mr.ConfigRecord("topic", "t", "remote.storage.enable", "true"),
        mr.ConfigRecord("broker", "", "reassignment.throttled.rate", "1000"),
        mr.ConfigRecord("topic", "t", "retention.ms", None),
        mr.TopicRecord("gone", "0" * 32),
        mr.RemoveTopic("gone", "0" * 32),
        mr.ProducerIdsBlock(1, 2000),
        scram_record("alice", cred),
        scram_record("bob", cred),
        mr.RemoveUserScramCredential("bob", "SCRAM-SHA-256"),
        acl_record("1" * 32, binding),
        acl_record("2" * 32, binding),
        mr.RemoveAccessControlEntry("2" * 32),
        mr.ClientQuotaRecord((("client-id", None), ("user", "alice")), "producer_byte_rate",
                             1024.0),
        mr.RemoteSegmentRecord(tid, 0, sid, 0, 99, 5000, 1 << 20, ((3, 0), (4, 50)), 4, 1,
                               0, "", 1700000000000, "t"),
        mr.RemoteSegmentStateChange(tid, 0, sid, 1, "0123456789abcdef", 1700000000001),
        mr.RemoteSegmentRecord(tid, 0, "f" * 32, 100, 199, 6000, 4096, ((4, 100),), 4, 1),
        mr.RemoteSegmentStateChange(tid, 0, "f" * 32, 2, "", 1700000000002),
        mr.RemoteSegmentStateChange(tid, 0, "f" * 32, 3),
    ]  # fmt: skip
    assert {type(r) for r in out} == set(mr._TYPES.values()), "a record type has no seed"
    return out


def _copied_segment() -> dict[str, bytes]:
    """The objects ``copy_segment`` writes for a real rolled segment (DirectoryStore)."""
    import asyncio
    import tempfile

    from logmq.storage import batch as b
    from logmq.storage.config import LogConfig
    from logmq.storage.partition_log import PartitionLog
    from logmq.storage.producer_state import snapshot_path
    from logmq.storage.remote.directory_store import DirectoryStore
    from logmq.storage.remote.segment_files import (
        SUFFIXES,
        copy_segment,
        local_segment_files,
        object_key,
    )
    from logmq.storage.remote.segment_metadata import RemoteSegment

    rnd = random.Random(17)
    with tempfile.TemporaryDirectory(prefix="logmq-corpus-") as tmp:
        log = PartitionLog(Path(tmp, "t-0"), LogConfig(index_interval_bytes=200))
        for i in range(12):
            values = [bytes([rnd.randrange(256)]) * rnd.randint(1, 90) for _ in range(3)]
            log.append(b.encode_values(values, timestamp=1000 + 10 * i), leader_epoch=i // 5)
        log.roll()
        seg = log.segments[-2]
        snap = snapshot_path(log.dir, seg.next_offset)
        epochs = tuple(log.leader_epochs.entries())
        meta = RemoteSegment("b3c0ffee00000000000000000000beef", 0, "5e9" * 10 + "ab",
                             seg.base_offset, seg.next_offset - 1, seg.max_timestamp, seg.size,
                             epochs, 2, 1, topic="t")  # fmt: skip
        files = local_segment_files(
            log.dir,
            seg.base_offset,
            producer_snapshot=snap.read_bytes() if snap.exists() else None,
            leader_epochs=epochs,
        )
        Path(tmp, "store").mkdir()
        store = DirectoryStore(Path(tmp, "store"))

        async def copy() -> None:
            try:
                await copy_segment(store, "t", meta, files, chunk_size=256)
            finally:
                await store.close()

        asyncio.run(copy())
        log.close()
        out = {}
        for suffix in SUFFIXES:
            path = Path(tmp, "store", object_key("t", meta, suffix))
            if path.exists():
                out[suffix] = path.read_bytes()
    return out


def remote_seeds() -> list[bytes]:
    import struct

    from fuzz import regressions
    from fuzz.remote_inputs import SELECTOR
    from logmq.cluster import metadata_records as mr
    from logmq.cluster.controller_api import RemoteSegmentChange
    from logmq.cluster.metadata_image import EMPTY_IMAGE
    from logmq.cluster.remote_image import from_record
    from logmq.native.cluster_api import remote_segment_change_body
    from logmq.net.codec import pack_body
    from logmq.storage.remote.segment_metadata import SegmentState
    from logmq.storage.txn_index import AbortedTxn, encode_entries

    def seed(parser: str, data: bytes) -> bytes:
        return bytes([SELECTOR[parser]]) + data

    every = _every_record()
    out = [seed("records", mr.encode_records([r])) for r in every]
    out.append(seed("records", mr.encode_records(every)))
    out.append(seed("snapshot", EMPTY_IMAGE.apply(every).to_bytes()))
    out.append(seed("snapshot", mr.encode_records(every)))  # state changes and removals too
    objects = _copied_segment()
    out.append(seed("manifest", objects["manifest"]))
    out.append(seed("epochs", objects["epochs"]))
    head = struct.pack(">QI", 0, len(objects["log"]))
    out.append(seed("indexes", b"\x00" + head + objects["index"]))
    out.append(seed("indexes", b"\x01" + head + objects["timeindex"]))
    txns = [AbortedTxn(7, 0, 3, 4), AbortedTxn(9, 2, 8, 9)]
    out.append(seed("indexes", b"\x02" + head + encode_entries(txns)))
    segment = from_record(next(r for r in every if isinstance(r, mr.RemoteSegmentRecord)))
    changes = [
        RemoteSegmentChange.copy_started(segment, 4),
        RemoteSegmentChange.state_change(segment.topic_id, 0, segment.segment_id,
                                         SegmentState.COPY_FINISHED, 4,
                                         checksum="0123456789abcdef", event_ms=1700000000001),
    ]  # fmt: skip
    sent = {"broker_id": 1, "broker_epoch": 3,
            "changes": [remote_segment_change_body(c) for c in changes]}  # fmt: skip
    out.append(seed("alter_request", pack_body(sent)))
    out.append(seed("alter_request", pack_body({**sent, "forwarded_by": 2})))
    answer = {"error": 0, "changes": [{"error": 0, "message": None},
                                      {"error": 42, "message": "no such transition"}]}  # fmt: skip
    out.append(seed("alter_answer", b"\x02" + pack_body(answer)))
    out.append(seed("alter_answer", b"\x01" + pack_body({"error": 41, "message": "no"})))
    some = [{"topic": "t", "partition": 0}, {"topic": "u", "partition": 0}]
    for body in ({"topics": None}, {"topics": ["t"]}, {"partitions": some}):
        out.append(seed("describe_request", pack_body(body)))
    out += regressions.REMOTE.values()
    return [f for f in out if len(f) <= 4096]


TARGETS = {"codec": codec_seeds, "kafka": kafka_seeds, "native": native_seeds,
           "remote": remote_seeds}  # fmt: skip


def main(argv: list[str]) -> None:
    for target in argv or TARGETS:
        seeds = TARGETS[target]
        for old in (CORPUS / target).glob("*"):
            old.unlink()
        for data in seeds():
            _write(target, data)
        print(target, len(list((CORPUS / target).iterdir())), "files")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
