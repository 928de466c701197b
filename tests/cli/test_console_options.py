"""``logmq produce`` headers, tombstones and codecs; ``logmq consume`` from a time or the
last N; ``logmq topic list`` with partitions and replicas (issue 35, item 10). Real
``logmq`` subprocesses against a real broker; kcat (a Kafka client of its own) reads back
what logmq produced."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from logmq.client import Admin, Producer
from logmq.storage.batch import iter_headers
from logmq.storage.compression import Compression
from tests.cli.test_cli_e2e import run, run_json
from tests.harness import BrokerProcess

DEADLINE = 120


def consumed(broker, topic: str, *args: str) -> list[dict]:
    out = run(broker, "consume", topic, "--format", "json", "--timeout", "2", *args)
    return [json.loads(line) for line in out.stdout.decode().splitlines()]


def kcat(broker, *args: str) -> str:
    proc = subprocess.run(
        ["kcat", "-b", broker.kafka_bootstrap, *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    """One broker for the module: every test uses topics of its own."""
    with BrokerProcess(tmp_path_factory.mktemp("console") / "data") as b:
        yield b


needs_kcat = pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")


# -- produce ---------------------------------------------------------------------------


def test_headers_on_every_record_in_order_and_repeatable(broker):
    run(broker, "topic", "create", "h")
    run(
        broker, "produce", "h", "-H", "trace=abc", "--header", "trace=def", "-H", "eq=a=b",
        "-H", "empty=", stdin=b"one\ntwo\n",
    )  # fmt: skip
    records = consumed(broker, "h", "--from-beginning")
    want = [["trace", "abc"], ["trace", "def"], ["eq", "a=b"], ["empty", ""]]
    assert [(r["value"], r["headers"]) for r in records] == [("one", want), ("two", want)]


@needs_kcat
def test_kcat_reads_the_headers(broker):
    run(broker, "topic", "create", "hk")
    run(broker, "produce", "hk", "-H", "a=1", "-H", "b=2", stdin=b"v\n")
    assert kcat(broker, "-C", "-t", "hk", "-e", "-f", "%h|%s\n") == "a=1,b=2|v\n"


def test_a_bad_header_is_a_usage_error(broker):
    run(broker, "topic", "create", "hb")
    for bad in ("novalue", "=value"):
        proc = run(broker, "produce", "hb", "-H", bad, stdin=b"x\n", check=False)
        assert proc.returncode == 2
        assert f"expected NAME=VALUE, got {bad!r}".encode() in proc.stderr
    assert consumed(broker, "hb", "--from-beginning") == []  # nothing was sent


def test_tombstones_for_empty_values(broker):
    run(broker, "topic", "create", "tomb")
    stdin = b"k1:v1\nk2:\n:\n"
    run(broker, "produce", "tomb", "--key-separator", ":", "--tombstone", stdin=stdin)
    run(broker, "produce", "tomb", "--key-separator", ":", stdin=b"k3:\n")  # not asked: b""
    run(broker, "produce", "tomb", "-Z", stdin=b"\nkept\n")  # without keys too
    records = consumed(broker, "tomb", "--from-beginning")
    assert [(r["key"], r["value"]) for r in records] == [
        ("k1", "v1"),
        ("k2", None),
        ("", None),
        ("k3", ""),
        (None, None),
        (None, "kept"),
    ]


@needs_kcat
def test_kcat_sees_null_values(broker):
    run(broker, "topic", "create", "tk")
    run(broker, "produce", "tk", "--key-separator", ":", "-Z", stdin=b"gone:\nhere:x\n")
    # %S: the value's length, -1 for NULL
    assert kcat(broker, "-C", "-t", "tk", "-e", "-f", "%k %S\n") == "gone -1\nhere 1\n"


def batch_codecs(broker, topic: str) -> set[int]:
    codecs = set()
    for segment in (broker.data_dir / f"{topic}-0").glob("*.log"):
        data = segment.read_bytes()
        codecs |= {h.attributes & Compression.MASK for _pos, h in iter_headers(data)}
    return codecs


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_every_codec_is_written_and_read_back(broker, codec):
    topic = f"c-{codec}"
    run(broker, "topic", "create", topic)
    values = [f"record {i} " * 20 for i in range(50)]
    run(broker, "produce", topic, "--compression", codec, stdin="\n".join(values).encode())
    assert batch_codecs(broker, topic) == {Compression.NAMES[codec]}
    assert [r["value"] for r in consumed(broker, topic, "--from-beginning")] == values
    if shutil.which("kcat"):
        assert kcat(broker, "-C", "-t", topic, "-e", "-f", "%s\n").splitlines() == values


def test_an_unknown_codec_is_a_usage_error(broker):
    proc = run(broker, "produce", "x", "--compression", "brotli", stdin=b"", check=False)
    assert proc.returncode == 2
    assert b"'brotli' is not one of 'none', 'gzip', 'snappy', 'lz4', 'zstd'" in proc.stderr


# -- consume ---------------------------------------------------------------------------


def produce_at(broker, topic: str, partition: int, stamped: list[tuple[int, str]]) -> None:
    with Producer(broker.bootstrap) as producer:
        futs = [producer.send(topic, v, partition=partition, timestamp=ts) for ts, v in stamped]
        for f in futs:
            f.result(timeout=30)


def test_from_timestamp_in_milliseconds_or_iso_8601(broker):
    run(broker, "topic", "create", "times", "--partitions", "2")
    base = 1_700_000_000_000  # 2023-11-14T22:13:20Z
    produce_at(broker, "times", 0, [(base + i * 1000, f"p0-{i}") for i in range(5)])
    produce_at(broker, "times", 1, [(base + i * 1000, f"p1-{i}") for i in range(2)])

    def values(*args: str) -> list[str]:
        return sorted(r["value"] for r in consumed(broker, "times", *args))

    # p1 has nothing that recent: it starts at its end
    assert values("--from-timestamp", str(base + 2500)) == ["p0-3", "p0-4"]
    iso = dt.datetime.fromtimestamp((base + 1000) / 1000, dt.UTC).isoformat()
    assert values("--from-timestamp", iso) == ["p0-1", "p0-2", "p0-3", "p0-4", "p1-1"]
    assert values("--from-timestamp", "2023-11-14T22:13:24Z") == ["p0-4"]
    assert values("--from-timestamp", "0", "--partition", "1") == ["p1-0", "p1-1"]


def test_from_timestamp_past_the_end_starts_at_the_end(broker):
    run(broker, "topic", "create", "later")
    produce_at(broker, "later", 0, [(1000, "old")])
    future = str(int(time.time() * 1000) + 3_600_000)
    assert consumed(broker, "later", "--from-timestamp", future) == []


def test_last_n_per_partition(broker):
    run(broker, "topic", "create", "tail", "--partitions", "2")
    produce_at(broker, "tail", 0, [(1, f"a{i}") for i in range(10)])
    produce_at(broker, "tail", 1, [(1, f"b{i}") for i in range(2)])
    records = consumed(broker, "tail", "--last", "3")
    by_partition = {p: [r["value"] for r in records if r["partition"] == p] for p in (0, 1)}
    assert by_partition == {0: ["a7", "a8", "a9"], 1: ["b0", "b1"]}  # p1 has only 2
    with Admin(broker.bootstrap) as admin:  # never before the log start
        admin.delete_records({("tail", 0): 8})
    assert [r["value"] for r in consumed(broker, "tail", "--last", "5", "-p", "0")] == ["a8", "a9"]


def test_start_options_are_exclusive_and_not_for_groups(broker):
    run(broker, "topic", "create", "ex")
    for args in (
        ["--last", "2", "--from-beginning"],
        ["--from-timestamp", "0", "--offset", "1"],
        ["--last", "1", "--from-timestamp", "0"],
    ):
        proc = run(broker, "consume", "ex", *args, check=False)
        assert proc.returncode == 2 and b"are exclusive" in proc.stderr, proc.stderr
    for args in (["--last", "2"], ["--from-timestamp", "0"]):
        proc = run(broker, "consume", "ex", "--group", "g", *args, check=False)
        assert proc.returncode == 2 and b"--group assigns partitions" in proc.stderr
    proc = run(broker, "consume", "ex", "--from-timestamp", "yesterday", check=False)
    assert proc.returncode == 2
    assert b"neither milliseconds since the epoch nor an ISO 8601 date-time" in proc.stderr


# -- topic list ------------------------------------------------------------------------


def test_topic_list_shows_partitions_and_replicas(broker):
    run(broker, "topic", "create", "wide", "--partitions", "4")
    run(broker, "topic", "create", "narrow")
    listed = run_json(broker, "topic", "list", "--json")
    assert [t["topic"] for t in listed] == sorted(t["topic"] for t in listed)
    assert [t for t in listed if t["topic"] in ("wide", "narrow")] == [
        {"topic": "narrow", "partitions": 1, "replication_factor": 1, "internal": False},
        {"topic": "wide", "partitions": 4, "replication_factor": 1, "internal": False},
    ]
    table = run(broker, "topic", "list").stdout.decode().splitlines()
    cells = [[c.strip() for c in line.replace("┃", "│").split("│")[1:-1]] for line in table]
    assert ["topic", "partitions", "replicas"] in cells
    assert ["wide", "4", "1"] in cells and ["narrow", "1", "1"] in cells

    run(broker, "consume", "wide", "--group", "lister", "--timeout", "0.5")  # makes offsets
    everything = run_json(broker, "topic", "list", "--internal", "--json")
    offsets = next(t for t in everything if t["topic"] == "__consumer_offsets")
    assert offsets["internal"] is True and offsets["partitions"] > 1
    assert "internal" in run(broker, "topic", "list", "--internal").stdout.decode()
