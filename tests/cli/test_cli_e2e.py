"""The ``logmq`` CLI as a real subprocess against a real ``logmq-server``."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest

DEADLINE = 120  # seconds; a hung CLI fails the test instead of hanging the suite


def run(broker, *args: str, stdin: bytes | None = None, check: bool = True):
    env = {**os.environ, "LOGMQ_BOOTSTRAP": broker.bootstrap}
    proc = subprocess.run(
        [sys.executable, "-m", "logmq_cli.main", *args],
        input=stdin,
        capture_output=True,
        env=env,
        timeout=DEADLINE,
    )
    if check:
        assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return proc


def run_json(broker, *args: str):
    return json.loads(run(broker, *args).stdout)


def test_topic_lifecycle(broker):
    run(
        broker, "topic", "create", "orders", "--partitions", "3", "--config", "retention.ms=3600000"
    )
    assert {"topic": "orders", "partitions": 3, "replication_factor": 1, "internal": False} in (
        run_json(broker, "topic", "list", "--json")
    )

    doc = run_json(broker, "topic", "describe", "orders", "--json")
    assert doc["topic"] == "orders"
    assert [p["partition"] for p in doc["partitions"]] == [0, 1, 2]
    for p in doc["partitions"]:
        assert set(p) >= {"leader", "replicas", "isr", "log_start_offset", "log_end_offset"}
        assert p["log_start_offset"] == p["log_end_offset"] == 0
    assert doc["configs"]["retention.ms"] == "3600000"

    table = run(broker, "topic", "describe", "orders").stdout.decode()
    assert "log end offset" in table

    run(broker, "topic", "alter-config", "orders", "--set", "retention.ms=60000")
    doc = run_json(broker, "topic", "describe", "orders", "--json")
    assert doc["configs"]["retention.ms"] == "60000"

    again = run(broker, "topic", "create", "orders", check=False)
    assert again.returncode == 1
    assert b"TOPIC_ALREADY_EXISTS" in again.stderr
    run(broker, "topic", "create", "orders", "--if-not-exists")

    run(broker, "topic", "delete", "orders")
    assert "orders" not in [t["topic"] for t in run_json(broker, "topic", "list", "--json")]
    missing = run(broker, "topic", "describe", "orders", check=False)
    assert missing.returncode == 1
    assert b"UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr


def test_produce_then_consume_returns_exactly_what_was_produced(broker):
    run(broker, "topic", "create", "lines", "--partitions", "2")
    pairs = [(f"key{i % 5}", f"value {i} é") for i in range(200)]
    stdin = "".join(f"{k}|{v}\n" for k, v in pairs).encode()
    produced = run(broker, "produce", "lines", "--key-separator", "|", "--acks", "all", stdin=stdin)
    assert b"Produced 200 records" in produced.stderr

    out = run(
        broker, "consume", "lines", "--from-beginning", "--format", "json", "--max-records", "200"
    )
    records = [json.loads(line) for line in out.stdout.decode().splitlines()]
    assert len(records) == 200
    assert sorted((r["key"], r["value"]) for r in records) == sorted(pairs)
    # Each key lives in one partition, and offsets within a partition are dense and ordered.
    by_partition: dict[int, list[dict]] = {}
    for r in records:
        by_partition.setdefault(r["partition"], []).append(r)
    for p, rs in by_partition.items():
        assert [r["offset"] for r in rs] == list(range(len(rs))), p
    assert len({(r["key"], r["partition"]) for r in records}) == 5
    # Order per key is the order of the input lines.
    for key in {k for k, _ in pairs}:
        got = [r["value"] for r in records if r["key"] == key]
        assert got == [v for k, v in pairs if k == key]


def test_consume_one_partition_from_offset_with_idle_timeout(broker):
    run(broker, "topic", "create", "p", "--partitions", "2")
    run(broker, "produce", "p", "--partition", "1", stdin=b"a\nb\nc\n")
    out = run(broker, "consume", "p", "--partition", "1", "--offset", "1", "--timeout", "1")
    assert out.stdout == b"b\nc\n"
    out = run(broker, "consume", "p", "--partition", "0", "--from-beginning", "--timeout", "0.5")
    assert out.stdout == b""


def test_binary_values_survive_base64(broker):
    run(broker, "topic", "create", "bin")
    run(broker, "produce", "bin", stdin=b"\xff\xfe\x00ok\n")
    out = run(
        broker, "consume", "bin", "--from-beginning", "--format", "json", "--bytes", "base64",
        "-n", "1",
    )  # fmt: skip
    assert base64.b64decode(json.loads(out.stdout)["value"]) == b"\xff\xfe\x00ok"


def test_produce_errors_are_clear(broker):
    missing = run(broker, "produce", "no-such-topic", stdin=b"x\n", check=False)
    assert missing.returncode == 1
    assert b"UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr
    run(broker, "topic", "create", "k")
    nokey = run(broker, "produce", "k", "--key-separator", ":", stdin=b"a:1\nnokey\n", check=False)
    assert nokey.returncode == 1
    assert b"line 2" in nokey.stderr
    # The line before the bad one was still delivered.
    out = run(broker, "consume", "k", "--from-beginning", "--print-key", "-n", "1")
    assert out.stdout == b"a\t1\n"


@pytest.mark.parametrize("extra", [[], ["--per-record"]])
def test_bench_produce_json_is_sane(broker, extra):
    doc = run_json(
        broker, "bench", "produce", "--records", "20000", "--json", "--topic", "b", *extra
    )
    assert doc["records"] == 20000
    assert doc["seconds"] > 0
    assert doc["records_per_sec"] == pytest.approx(20000 / doc["seconds"], rel=0.01)
    assert doc["mb_per_sec"] == pytest.approx(20000 * 100 / doc["seconds"] / 1e6, rel=0.01)


def test_bench_consume_and_latency_json(broker):
    doc = run_json(broker, "bench", "consume", "--records", "20000", "--json", "--topic", "c")
    assert doc["records"] == 20000
    assert doc["mb_per_sec"] > 0
    lat = run_json(
        broker, "bench", "latency", "--records", "2000", "--warmup", "100", "--rate", "5000",
        "--json", "--topic", "l",
    )  # fmt: skip
    assert lat["records"] == 2000  # the 100 warm-up records count nowhere
    assert lat["warmup_records"] == 100
    assert lat["records_per_sec"] == pytest.approx(2000 / lat["seconds"], rel=0.01)
    assert 0 <= lat["p50_ms"] <= lat["p99_ms"] <= lat["p999_ms"] <= lat["max_ms"]
