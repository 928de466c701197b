"""What the Kafka request pre-check (logmq/kafka/frame_check.py) costs per request.

Times, for a few typical requests, the pre-check alone and kio's decode alone (both
in-process, best of five rounds), so the check's cost reads as a share of the decode
it guards. ``python benchmarks/bench_frame_check.py``.
"""

from __future__ import annotations

import pathlib
import sys
import time
import uuid

from kio.index import load_request_schema
from kio.serial import entity_reader

from logmq.kafka.frame_check import check_request

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.kafka.kafka_frames import encode_frame, produce_v9  # noqa: E402


def _fetch(version: int, partitions: int):
    cls = load_request_schema(1, version)
    mod = __import__(cls.__module__, fromlist=["x"])
    parts = tuple(
        mod.FetchPartition(
            partition=i,
            current_leader_epoch=0,
            fetch_offset=100,
            last_fetched_epoch=-1,
            log_start_offset=-1,
            partition_max_bytes=1 << 20,
        )
        for i in range(partitions)
    )
    topic = {"topic": "t"} if version < 13 else {"topic_id": uuid.uuid4()}
    return cls(
        replica_id=-1,
        max_wait=mod.FetchRequest.__dataclass_fields__["max_wait"].type.parse(
            __import__("datetime").timedelta(milliseconds=500)
        ),
        min_bytes=1,
        max_bytes=50 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(mod.FetchTopic(partitions=parts, **topic),),
        forgotten_topics_data=(),
        rack_id="",
    )


def _metadata():
    cls = load_request_schema(3, 12)
    mod = __import__(cls.__module__, fromlist=["x"])
    topics = tuple(mod.MetadataRequestTopic(topic_id=None, name=f"topic-{i}") for i in range(3))
    return cls(
        topics=topics, allow_auto_topic_creation=True, include_topic_authorized_operations=False
    )


def _best(fn, n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n)
    return best


def main() -> None:
    cases = [
        ("Produce v9, 1 partition, 16 KB batch", 0, 9, produce_v9("t", b"\x00" * 16384, acks=1)),
        ("Fetch v12, 1 partition", 1, 12, _fetch(12, 1)),
        ("Fetch v12, 100 partitions", 1, 12, _fetch(12, 100)),
        ("Fetch v12, 10,000 partitions", 1, 12, _fetch(12, 10_000)),
        ("Metadata v12, 3 topics", 3, 12, _metadata()),
    ]
    print(f"{'request':40} {'check':>10} {'kio decode':>11} {'check/decode':>13}")
    for name, api_key, version, body in cases:
        frame = memoryview(encode_frame(api_key, version, body)).toreadonly()
        cls = load_request_schema(api_key, version)
        hcls = cls.__header_schema__
        end = len(frame)
        hr, br = entity_reader(hcls), entity_reader(cls)
        n = 20 if "10,000" in name else 20_000

        def check(cls=cls, hcls=hcls, frame=frame, end=end):
            check_request(cls, frame, check_request(hcls, frame, 0, end), end)

        def decode(br=br, hr=hr, frame=frame):
            br(frame, hr(frame, 0)[1])

        c, d = _best(check, n), _best(decode, n)
        print(f"{name:40} {c * 1e6:8.2f}us {d * 1e6:9.2f}us {c / d:12.0%}")


if __name__ == "__main__":
    main()
