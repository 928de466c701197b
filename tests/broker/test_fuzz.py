"""Fuzzing a live broker process: random, hypothesis-built and mutated frames, at its
native port and at its Raft (metadata quorum) port.

The broker must answer or close, never crash or hang, and keep serving everyone else;
afterwards it serves a round trip, its quorum still commits, its log holds no traceback
and its memory is bounded. Bounded for CI; ``LOGMQ_FUZZ_EXAMPLES=N`` runs N examples per
hypothesis test instead.
"""

from __future__ import annotations

import os
import random
import socket
import struct

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logmq.errors import ErrorCode
from logmq.net.codec import REQUEST_HEADER, SIZE, ApiKey, decode_response, encode_request
from logmq.replication import raft_codec as rc
from logmq.replication import raft_messages as rm
from logmq.replication.raft_transport import MAGIC, VERSION
from logmq.storage import batch as b
from tests.harness import BrokerProcess, free_port
from tests.net.raw_client import fetch_body, produce_body

TIMEOUT = 20
FUZZ_EXAMPLES = int(os.environ.get("LOGMQ_FUZZ_EXAMPLES", "0"))


def examples(ci: int) -> int:
    """``ci`` examples in the suite, or LOGMQ_FUZZ_EXAMPLES for a longer run."""
    return FUZZ_EXAMPLES or ci


class BlockingClient:
    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_exact(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def recv_frame(self):
        head = self.recv_exact(4)
        if head is None:
            return None
        (size,) = SIZE.unpack(head)
        frame = self.recv_exact(size)
        return None if frame is None else decode_response(frame)

    def at_eof(self) -> bool:
        return self.sock.recv(1 << 16) == b""


def assert_healthy(broker: BrokerProcess) -> None:
    assert broker.running, broker.log_tail()
    c = BlockingClient(broker.port)
    try:
        c.send(b"".join(encode_request(ApiKey.API_VERSIONS, 0, 42, "canary", {})))
        resp = c.recv_frame()
        assert resp is not None and resp.correlation_id == 42 and resp.body["error"] == 0
    finally:
        c.close()


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field}")


def assert_no_traceback(broker: BrokerProcess) -> None:
    text = broker.log_path.read_text(errors="replace")
    assert "Traceback" not in text, text[text.index("Traceback") - 2000 :][:6000]


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory):
    raft_port = free_port()
    bp = BrokerProcess(
        tmp_path_factory.mktemp("fuzz") / "data",
        extra_args=[
            "--max-fetch-wait-ms",
            "50",
            "--max-frame-size",
            str(1 << 20),
            "--auto-create-topics",
            "--quorum-voters",
            f"1@127.0.0.1:{raft_port}",
        ],
    )
    bp.raft_port = raft_port
    with bp:
        create_topic(bp, "fz")
        yield bp


def create_topic(broker: BrokerProcess, name: str) -> None:
    """A metadata write: proves the broker's quorum still commits."""
    c = BlockingClient(broker.port)
    try:
        body = {
            "topics": [{"topic": name, "partitions": 2, "replication_factor": 1, "configs": {}}]
        }
        c.send(b"".join(encode_request(ApiKey.CREATE_TOPICS, 0, 1, "setup", body)))
        resp = c.recv_frame()
        assert resp.body.get("topics", [{}])[0].get("error") == 0, (resp.body, broker.log_tail())
    finally:
        c.close()


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.sampled_from([0, 1, -1, -2]),
    st.text(max_size=12),
    st.sampled_from(["fz", "topic", "nope", ""]),
    st.binary(max_size=16),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.sampled_from(
                [
                    "topic",
                    "topics",
                    "partitions",
                    "partition",
                    "size",
                    "acks",
                    "fetch_offset",
                    "max_wait_ms",
                    "min_bytes",
                    "max_bytes",
                    "partition_max_bytes",
                    "timestamp",
                    "resources",
                    "type",
                    "name",
                    "set",
                    "delete",
                    "configs",
                    "producer_id",
                    "transactional_id",
                    "replication_factor",
                    "allow_auto_create",
                    "x",
                ]
            ),
            inner,
            max_size=5,
        ),
    ),
    max_leaves=20,
)
api_keys = st.one_of(st.sampled_from([int(k) for k in ApiKey]), st.integers(0, 65535))


@settings(max_examples=examples(150), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    api_keys,
    st.integers(0, 3),
    st.dictionaries(st.text(max_size=20), values, max_size=6),
    st.binary(max_size=200),
)
def test_hypothesis_requests_always_get_an_answer(fuzz_broker, api_key, version, body, tail):
    if api_key == ApiKey.PRODUCE and body.get("acks") == 0:
        body["acks"] = 1  # acks=0 is the one request that legitimately gets no answer
    c = BlockingClient(fuzz_broker.port)
    try:
        c.send(b"".join(encode_request(api_key, version, 7, "fuzz", body, [tail])))
        resp = c.recv_frame()
        assert resp is not None, fuzz_broker.log_tail()
        assert resp.correlation_id == 7
    finally:
        c.close()


@settings(max_examples=examples(100), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(min_size=0, max_size=300))
def test_hypothesis_raw_frames_are_answered_or_closed(fuzz_broker, garbage):
    c = BlockingClient(fuzz_broker.port)
    try:
        # a well-formed size prefix around garbage: the broker must answer or close
        c.send(SIZE.pack(len(garbage)) + garbage)
        c.send(b"".join(encode_request(ApiKey.API_VERSIONS, 0, 99, "after", {})))
        # each read either answers (an error for the garbage, then 99) or sees the close;
        # a hang would hit the socket timeout and fail
        while True:
            resp = c.recv_frame()
            if resp is None or resp.correlation_id == 99:
                break  # closing is allowed when the stream cannot be trusted
            assert resp.body["error"] != 0
    finally:
        c.close()


def test_random_byte_streams_do_not_hurt_other_clients(fuzz_broker):
    rnd = random.Random(20261122)
    for _ in range(60):
        c = BlockingClient(fuzz_broker.port)
        try:
            for _ in range(rnd.randint(1, 4)):
                c.send(rnd.randbytes(rnd.randint(1, 2000)))
        except OSError:
            pass  # the broker already closed on us
        finally:
            c.close()
    assert_healthy(fuzz_broker)


def test_partial_frame_does_not_block_others(fuzz_broker):
    stuck = BlockingClient(fuzz_broker.port)
    try:
        stuck.send(SIZE.pack(5000) + b"\x00" * 100)  # promises more than it sends
        assert_healthy(fuzz_broker)
    finally:
        stuck.close()


def test_four_gib_frame_is_refused_without_allocating(fuzz_broker):
    pid = fuzz_broker.pid
    before = rss_kib(pid)
    c = BlockingClient(fuzz_broker.port)
    try:
        c.send(SIZE.pack(0xFFFFFFFF) + struct.pack(">HHIH", 3, 0, 5, 0) + b"\x00" * 1000)
        resp = c.recv_frame()
        assert resp is not None and resp.body["error"] == ErrorCode.REQUEST_TOO_LARGE
        assert c.at_eof()
    finally:
        c.close()
    assert rss_kib(pid) - before < 20_000  # KiB; 4 GiB was never reserved
    assert_healthy(fuzz_broker)


def test_bad_msgpack_body_keeps_connection(fuzz_broker):
    c = BlockingClient(fuzz_broker.port)
    try:
        body = b"\xc1"  # never-used msgpack byte
        frame = struct.pack(">HHIH", 3, 0, 11, 0) + struct.pack(">I", len(body)) + body
        c.send(SIZE.pack(len(frame)) + frame)
        resp = c.recv_frame()
        assert resp.correlation_id == 11 and resp.body["error"] == ErrorCode.INVALID_FRAME
        c.send(b"".join(encode_request(ApiKey.METADATA, 0, 12, "x", {"topics": None})))
        assert c.recv_frame().correlation_id == 12
        non_map = msgpack.packb([1, 2])
        frame = struct.pack(">HHIH", 3, 0, 13, 0) + struct.pack(">I", len(non_map)) + non_map
        c.send(SIZE.pack(len(frame)) + frame)
        assert c.recv_frame().body["error"] == ErrorCode.INVALID_FRAME
    finally:
        c.close()


def test_a_body_over_a_million_elements_is_refused_and_the_connection_kept(fuzz_broker):
    """The Kafka door's limit (net/limits.py) on the native door: 1,000,001 nils fit in
    this broker's 1 MiB frames, but no body may make it build a list that long."""
    c = BlockingClient(fuzz_broker.port)
    try:
        many = {"topics": [None] * 1_000_001, "allow_auto_create": False}
        c.send(b"".join(encode_request(ApiKey.METADATA, 0, 21, "x", many)))
        resp = c.recv_frame()
        assert resp.correlation_id == 21 and resp.body["error"] == ErrorCode.INVALID_FRAME
        assert "at most 1,000,000 elements" in resp.body["message"]
        c.send(b"".join(encode_request(ApiKey.METADATA, 0, 22, "x", {"topics": None})))
        assert c.recv_frame().correlation_id == 22
    finally:
        c.close()


# -- mutated frames at the native port ------------------------------------------------------


def _frame(api_key: int, body: dict, tail: bytes = b"", corr: int = 5) -> bytes:
    """A request frame without its size prefix."""
    return b"".join(encode_request(api_key, 0, corr, "fuzz", body, [tail]))[SIZE.size :]


def _raw_body_frame(body: bytes, api_key: int = ApiKey.METADATA, corr: int = 5) -> bytes:
    """A frame whose msgpack body is ``body`` exactly (lying counts, deep nesting)."""
    return struct.pack(">HHIH", api_key, 0, corr, 4) + b"fuzz" + SIZE.pack(len(body)) + body


_BATCH = b.encode_values([b"v%d" % i for i in range(5)], timestamp=1_000, keys=[b"k"] * 5)
CORPUS = [
    _frame(ApiKey.API_VERSIONS, {}),
    _frame(ApiKey.METADATA, {"topics": ["fz", "other"], "allow_auto_create": False}),
    _frame(ApiKey.PRODUCE, produce_body("fz", {0: _BATCH}), _BATCH),
    _frame(ApiKey.FETCH, fetch_body({"fz": [(0, 0, 1 << 16), (1, 0, 1 << 16)]})),
    _frame(
        ApiKey.LIST_OFFSETS,
        {"replica_id": -1, "topics": [{"topic": "fz", "partitions": [{"partition": 0}]}]},
    ),
    _frame(ApiKey.DESCRIBE_CONFIGS, {"resources": [{"type": "topic", "name": "fz"}]}),
    _frame(ApiKey.FIND_COORDINATOR, {"key": "g", "key_type": 0}),
    _frame(ApiKey.OFFSET_FETCH, {"group_id": "g", "topics": None}),
    # msgpack that lies about its counts, or nests past any stack
    _raw_body_frame(b"\x81\xa6topics\xdd\xff\xff\xff\xff"),  # an array of 4G items
    _raw_body_frame(b"\x81\xa6topics\xdf\x7f\xff\xff\xff"),  # a map of 2G pairs
    _raw_body_frame(b"\x81\xa6topics\xdb\xff\xff\xff\xf0abc"),  # a 4 GB string
    _raw_body_frame(b"\x81\xa6topics" + b"\xdd\x00\x0f\xff\xff" * 2000),  # nested claims
    _raw_body_frame(b"\x81\xa6topics" + b"\x91" * 100_000 + b"\xc0"),  # 100,000 deep
    _raw_body_frame(b"\x81\xa6topics" + b"\x81\xa1k" * 30_000 + b"\xc0"),  # deep maps
]
EXTREMES = [0, 1, 0x7F, 0x80, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]

mutations = st.lists(
    st.one_of(
        st.tuples(st.just("flip"), st.integers(0, 1 << 20), st.integers(0, 7)),
        st.tuples(st.just("truncate"), st.integers(0, 1 << 20)),
        st.tuples(st.just("u32"), st.integers(0, 1 << 20), st.sampled_from(EXTREMES)),
        st.tuples(
            st.just("run"),
            st.integers(0, 1 << 20),
            st.integers(1, 64),
            st.sampled_from([0x00, 0xFF]),
        ),
        st.tuples(st.just("insert"), st.integers(0, 1 << 20), st.binary(max_size=16)),
    ),
    min_size=1,
    max_size=4,
)


def mutate(frame: bytes, ops) -> bytes:
    buf = bytearray(frame)
    for op in ops:
        at = op[1] % (len(buf) + 1)
        if op[0] == "flip" and at < len(buf):
            buf[at] ^= 1 << op[2]
        elif op[0] == "truncate":
            del buf[at:]
        elif op[0] == "u32":
            buf[at : at + 4] = struct.pack(">I", op[2])
        elif op[0] == "run":
            buf[at : at + op[2]] = bytes([op[3]]) * op[2]
        elif op[0] == "insert":
            buf[at:at] = op[2]
    return bytes(buf)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(range(len(CORPUS))), mutations)
def test_mutated_frames_are_answered_and_the_connection_kept(fuzz_broker, seed, ops):
    """The frame's size prefix stays true, so the broker knows where the frame ends: it
    answers it (an error or, if the mutation left it valid, an answer) and then serves
    the next request on the same connection."""
    frame = mutate(CORPUS[seed], ops)
    c = BlockingClient(fuzz_broker.port)
    try:
        c.send(SIZE.pack(len(frame)) + frame)
        c.send(b"".join(encode_request(ApiKey.API_VERSIONS, 0, 99, "after", {})))
        while True:
            resp = c.recv_frame()
            if resp is None and len(frame) < REQUEST_HEADER.size:
                break  # not even a correlation id to answer to: closing is fair
            assert resp is not None, f"closed after {frame[:200]!r}"
            if resp.correlation_id == 99:
                break
    finally:
        c.close()


@settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(range(len(CORPUS))), st.sampled_from(EXTREMES[2:]), st.integers(0, 64))
def test_a_lying_size_prefix_costs_only_what_arrives(fuzz_broker, seed, claimed, keep):
    """A size prefix that claims more than is sent: the broker waits for the rest (or
    refuses the size at once) without reserving the claimed bytes."""
    frame = CORPUS[seed][:keep]
    c = BlockingClient(fuzz_broker.port)
    try:
        c.send(SIZE.pack(claimed) + frame)
    finally:
        c.close()


def test_many_connections_claiming_big_frames_do_not_take_the_memory(tmp_path):
    """Frames announced near the default 100 MB limit but never sent (a slow loris on
    memory): each costs the eager 1 MiB, not the 100 MB it claims."""
    with BrokerProcess(tmp_path / "data") as bp:
        before = rss_kib(bp.pid)
        held = [BlockingClient(bp.port) for _ in range(40)]
        try:
            for c in held:
                c.send(SIZE.pack(100 * 1000 * 1000) + b"\x00" * 70_000)
            assert_healthy(bp)  # every one of the 40 was read by now
            assert rss_kib(bp.pid) - before < 80 * 1024  # KiB; claimed: 4 GB
        finally:
            for c in held:
                c.close()
        assert_no_traceback(bp)


# -- the Raft port ----------------------------------------------------------------------------


def raft_hello(node_id: int = 7) -> bytes:
    body = msgpack.packb(
        {
            "magic": MAGIC,
            "version": VERSION,
            "node_id": node_id,
            "cluster_id": "",
            "voters": [],
            "listen": None,
        }
    )
    return SIZE.pack(len(body)) + body


ints = st.one_of(
    st.sampled_from([0, 1, 2, 7, 2**31, 2**62, 2**63 - 1]),
    st.integers(0, 2**64 - 1),
    st.integers(-(2**63), -1),
)
entries = st.lists(
    st.builds(rm.Entry, ints, ints, st.binary(max_size=32), st.sampled_from(list(rm.EntryKind))),
    max_size=3,
)
raft_messages = st.one_of(
    st.builds(rm.VoteRequest, ints, st.just(1), ints, ints, ints, st.booleans(), st.booleans()),
    st.builds(rm.VoteResponse, ints, st.just(1), ints, st.booleans(), st.booleans()),
    st.builds(rm.AppendRequest, ints, st.just(1), ints, ints, ints, entries.map(tuple), ints),
    st.builds(rm.AppendResponse, ints, st.just(1), ints, st.booleans(), ints, ints, ints),
    st.builds(rm.HeartbeatRequest, ints, st.just(1), ints, ints),
    st.builds(rm.HeartbeatResponse, ints, st.just(1), ints),
    st.builds(
        rm.SnapshotRequest, ints, st.just(1), ints, st.builds(rm.Snapshot, ints, ints, st.binary())
    ),
    st.builds(rm.TimeoutNow, ints, st.just(1), ints),
)


def _encoded(msg) -> bytes:
    try:
        return rc.encode_message(msg)
    except (OverflowError, ValueError, TypeError):  # ints msgpack cannot hold
        return msgpack.packb([3, 1, 1, 1, 0, 0, [], 0])


raft_payloads = st.one_of(
    st.binary(max_size=300),
    raft_messages.map(_encoded),
    st.tuples(raft_messages.map(_encoded), mutations).map(lambda t: mutate(t[0], t[1])),
    st.sampled_from([b"\x91" * 50_000, b"\xdd\xff\xff\xff\xff", b"\x94\x03\x07\x01"]),
)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(raft_payloads, min_size=1, max_size=5), st.booleans())
def test_raft_port_takes_hostile_frames(fuzz_broker, payloads, with_hello):
    """Garbage before a hello is refused; after one (as a non-voter, which may not lead),
    malformed or hostile messages are dropped. The quorum goes on either way."""
    s = socket.create_connection(("127.0.0.1", fuzz_broker.raft_port), timeout=TIMEOUT)
    try:
        if with_hello:
            s.sendall(raft_hello())
        for p in payloads:
            s.sendall(SIZE.pack(len(p)) + p)
    except OSError:
        pass  # refused and closed: fine
    finally:
        s.close()


def test_raft_port_refuses_oversized_and_lying_frames(fuzz_broker):
    before = rss_kib(fuzz_broker.pid)
    for claim in (0xFFFFFFFF, 64 << 20, (64 << 20) + 1, 1 << 16, (1 << 16) + 1):
        for hello in (False, True):
            s = socket.create_connection(("127.0.0.1", fuzz_broker.raft_port), timeout=TIMEOUT)
            try:
                if hello:
                    s.sendall(raft_hello())
                s.sendall(SIZE.pack(claim) + b"\x00" * 1000)
            except OSError:
                pass
            finally:
                s.close()
    assert rss_kib(fuzz_broker.pid) - before < 20 * 1024


def test_zz_after_all_the_fuzzing_the_broker_is_whole(fuzz_broker):
    """Runs last in this module (name order within the file is definition order)."""
    assert_healthy(fuzz_broker)
    create_topic(fuzz_broker, "after-fuzz")  # the quorum still commits
    c = BlockingClient(fuzz_broker.port)
    try:
        batch = b.encode_values([b"ok"], timestamp=1_000)
        c.send(
            b"".join(
                encode_request(
                    ApiKey.PRODUCE, 0, 3, "rt", produce_body("after-fuzz", {0: batch}), [batch]
                )
            )
        )
        resp = c.recv_frame()
        assert resp.body["topics"][0]["partitions"][0]["error"] == 0
        body = fetch_body({"after-fuzz": [(0, 0, 1 << 16)]})
        c.send(b"".join(encode_request(ApiKey.FETCH, 0, 4, "rt", body)))
        resp = c.recv_frame()
        got = [r[3] for r in b.decode_records(bytes(resp.tail))]
        assert got == [b"ok"]
    finally:
        c.close()
    assert rss_kib(fuzz_broker.pid, "VmHWM") < 600 * 1024, "peak RSS over 600 MiB"
    assert_no_traceback(fuzz_broker)
