"""A live broker against an in-memory model of its partitions (hypothesis stateful).

Random interleavings of produce (good, corrupt, idempotent retries), fetch from any
offset, list offsets and restarts must agree with a model that is just a list of
values per partition.
"""

from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from logmq.errors import ErrorCode
from logmq.net.codec import ApiKey, encode_request
from logmq.storage import batch as b
from tests.broker.test_fuzz import BlockingClient
from tests.harness import BrokerProcess
from tests.net.raw_client import fetch_body, produce_body

PARTITIONS = 2
_topics = itertools.count()
_broker: BrokerProcess | None = None


@pytest.fixture(scope="module", autouse=True)
def model_broker(tmp_path_factory):
    global _broker
    with BrokerProcess(tmp_path_factory.mktemp("model") / "data") as br:
        _broker = br
        yield br
    _broker = None


class BrokerModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        assert _broker is not None
        self.broker = _broker
        self.topic = f"model-{next(_topics)}"
        self.log: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        self.corr = itertools.count(1)
        self.client = BlockingClient(self.broker.port)
        self.pid = -1
        self.seq = dict.fromkeys(range(PARTITIONS), 0)  # sequences are per partition
        self.last_idempotent: tuple[int, bytes, int, list[bytes]] | None = None

    def call(self, key: int, body: dict, tail: list[bytes] = ()) -> tuple[dict, bytes]:
        corr = next(self.corr)
        self.client.send(b"".join(bytes(p) for p in encode_request(key, 0, corr, "m", body, tail)))
        resp = self.client.recv_frame()
        assert resp is not None and resp.correlation_id == corr
        return resp.body, bytes(resp.tail)

    @initialize()
    def create(self) -> None:
        body, _ = self.call(
            ApiKey.CREATE_TOPICS,
            {
                "topics": [
                    {
                        "topic": self.topic,
                        "partitions": PARTITIONS,
                        "replication_factor": 1,
                        "configs": {"segment.bytes": "4096"},  # many small segments
                    }
                ]
            },
        )
        assert body["topics"][0]["error"] == 0
        body, _ = self.call(ApiKey.INIT_PRODUCER_ID, {"producer_id": -1, "producer_epoch": -1})
        self.pid = body["producer_id"]

    def produce(self, partition: int, data: bytes) -> dict:
        body, _ = self.call(ApiKey.PRODUCE, produce_body(self.topic, {partition: data}), [data])
        return body["topics"][0]["partitions"][0]

    @rule(
        partition=st.integers(0, PARTITIONS - 1),
        values=st.lists(st.binary(min_size=0, max_size=300), min_size=1, max_size=20),
        batches=st.integers(1, 3),
    )
    def produce_values(self, partition, values, batches):
        data = b"".join(b.encode_values(values, timestamp=1000) for _ in range(batches))
        r = self.produce(partition, data)
        assert r["error"] == 0, r
        assert r["base_offset"] == len(self.log[partition])
        self.log[partition].extend(values * batches)

    @rule(
        partition=st.integers(0, PARTITIONS - 1),
        values=st.lists(st.binary(max_size=50), min_size=1, max_size=5),
    )
    def produce_idempotent(self, partition, values):
        data = b.encode_values(
            values,
            timestamp=1,
            producer_id=self.pid,
            producer_epoch=0,
            base_sequence=self.seq[partition],
        )
        r = self.produce(partition, data)
        assert r["error"] == 0, r
        self.last_idempotent = (partition, data, r["base_offset"], values)
        self.seq[partition] += len(values)
        self.log[partition].extend(values)

    @precondition(lambda self: self.last_idempotent is not None)
    @rule()
    def retry_last_idempotent(self):
        partition, data, base, _values = self.last_idempotent
        r = self.produce(partition, data)
        assert (r["error"], r["base_offset"]) == (0, base)  # acknowledged, not appended

    @rule(partition=st.integers(0, PARTITIONS - 1), flip=st.integers(25, 200))
    def produce_corrupt(self, partition, flip):
        data = bytearray(b.encode_values([b"bad" * 80], timestamp=1))
        data[flip % len(data)] ^= 0x5A
        r = self.produce(partition, bytes(data))
        assert r["error"] == ErrorCode.CORRUPT_MESSAGE

    @rule(partition=st.integers(0, PARTITIONS - 1), data=st.data())
    def fetch(self, partition, data):
        end = len(self.log[partition])
        offset = data.draw(st.integers(0, end), label="offset")
        pmax = data.draw(st.integers(1, 5000), label="partition_max_bytes")
        body, tail = self.call(ApiKey.FETCH, fetch_body({self.topic: [(partition, offset, pmax)]}))
        p = body["topics"][0]["partitions"][0]
        assert p["error"] == 0 and p["high_watermark"] == end
        got = [
            (off, val)
            for pos, _h in b.iter_headers(tail)
            for off, _ts, _k, val, _hd in b.decode_records(tail, pos)
            if off >= offset
        ]
        if offset < end:
            assert got, "a fetch below the high watermark always makes progress"
        assert (
            got == [(offset + i, v) for i, v in enumerate(self.log[partition][offset:])][: len(got)]
        )

    @rule(partition=st.integers(0, PARTITIONS - 1))
    def fetch_out_of_range(self, partition):
        end = len(self.log[partition])
        body, _ = self.call(ApiKey.FETCH, fetch_body({self.topic: [(partition, end + 1, 100)]}))
        assert body["topics"][0]["partitions"][0]["error"] == ErrorCode.OFFSET_OUT_OF_RANGE

    @rule()
    def restart(self):
        self.client.close()
        self.broker.restart()
        self.client = BlockingClient(self.broker.port)

    @rule()
    def crash(self):
        # SIGKILL: producer state comes back from the last snapshot plus a header replay
        self.client.close()
        self.broker.kill()
        self.broker.start()
        self.client = BlockingClient(self.broker.port)

    @invariant()
    def latest_offsets_match(self):
        body, _ = self.call(
            ApiKey.LIST_OFFSETS,
            {
                "topics": [
                    {
                        "topic": self.topic,
                        "partitions": [{"partition": p, "timestamp": -1} for p in self.log],
                    }
                ]
            },
        )
        offsets = [p["offset"] for p in body["topics"][0]["partitions"]]
        assert offsets == [len(self.log[p]) for p in self.log]

    def teardown(self):
        self.client.close()


# LOGMQ_MODEL_EXAMPLES / LOGMQ_MODEL_STEPS scale the search up when hunting a bug.
BrokerModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("LOGMQ_MODEL_EXAMPLES", "8")),
    stateful_step_count=int(os.environ.get("LOGMQ_MODEL_STEPS", "20")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
TestBrokerModel = BrokerModel.TestCase
