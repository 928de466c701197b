"""``logmq storage remote status`` and ``logmq topic describe`` of a tiered topic, as
real subprocesses against a real tiered ``logmq-server`` (the directory back end).

Both ask DescribeRemoteTier (native API 1001)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import BrokerProcess
from tests.storage.remote.test_tiered_broker import (
    create_tiered_topic,
    local_log_files,
    produce,
    start_tiered_broker,
    wait_for,
)

DEADLINE = 120


def run(broker: BrokerProcess, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    # wide enough that rich prints every column's header on one line
    env = {**os.environ, "LOGMQ_BOOTSTRAP": broker.bootstrap, "COLUMNS": "300"}
    proc = subprocess.run(
        [sys.executable, "-m", "logmq_cli.main", *args],
        capture_output=True,
        env=env,
        timeout=DEADLINE,
    )
    if check:
        assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return proc


def run_json(broker: BrokerProcess, *args: str):
    return json.loads(run(broker, *args).stdout)


@pytest.fixture(scope="module")
def tiered(tmp_path_factory):
    broker = start_tiered_broker(tmp_path_factory.mktemp("tiered-cli"))
    create_tiered_topic(broker, "history")
    produce(broker, "history", 10_000)
    # local retention lets copied segments go once a finished copy covers them
    wait_for(lambda: local_log_files(broker, "history")[0] > 0, what="local segments to go")
    yield broker
    broker.stop()


def history_row(doc: dict) -> dict:
    [row] = [p for p in doc["partitions"] if (p["topic"], p["partition"]) == ("history", 0)]
    return row


def test_status_lists_each_tiered_partition_with_both_tiers(tiered):
    doc = run_json(tiered, "storage", "remote", "status", "--json")
    assert doc["brokers"] == [{"broker_id": 1, "tiering": True, "error": None}]
    row = history_row(doc)
    assert row["tiered"] is True and row["leader"] is True and row["broker_id"] == 1
    assert row["log_start_offset"] == 0  # the log starts in the remote tier
    assert row["local_log_start_offset"] > 0  # the local log no longer does
    assert row["remote_segments"] > 0 and row["remote_bytes"] > 0
    assert row["local_bytes"] > 0
    assert row["highest_copied_offset"] >= row["local_log_start_offset"] - 1
    assert row["copy_lag_segments"] >= 0 and row["copy_lag_bytes"] >= 0
    assert row["pending_deletes"] >= 0 and row["last_error"] is None

    table = run(tiered, "storage", "remote", "status").stdout.decode()
    for header in ("topic", "local log start", "remote segments", "copy lag bytes", "last error"):
        assert header in table
    assert "history" in table

    only = run_json(tiered, "storage", "remote", "status", "--json", "--topic", "nothing-here")
    assert only["partitions"] == []


def test_topic_describe_adds_the_tiers_of_a_tiered_topic(tiered):
    doc = run_json(tiered, "topic", "describe", "history", "--json")
    [p] = doc["partitions"]
    assert "remote_tier_error" not in doc
    assert p["log_start_offset"] == 0
    assert p["local_log_start_offset"] > 0 and p["local_bytes"] > 0
    assert p["remote_log_start_offset"] == 0 and p["remote_bytes"] > 0
    assert p["copy_lag_segments"] >= 0 and p["copy_lag_bytes"] >= 0
    table = run(tiered, "topic", "describe", "history").stdout.decode()
    assert "remote start offset" in table and "copy lag bytes" in table


def test_topic_describe_of_an_untiered_topic_has_no_tier_columns(tiered):
    run(tiered, "topic", "create", "plain")
    doc = run_json(tiered, "topic", "describe", "plain", "--json")
    [p] = doc["partitions"]
    assert "local_bytes" not in p and "remote_tier_error" not in doc
    assert "remote start offset" not in run(tiered, "topic", "describe", "plain").stdout.decode()


def test_a_store_that_is_gone_shows_as_the_last_error_and_copying_waits(tiered):
    root: Path = tiered.remote_root  # type: ignore[attr-defined]
    create_tiered_topic(tiered, "stalled")
    moved = root.with_name("remote-away")
    root.rename(moved)  # the mount is gone: every write fails, non-retriably
    try:
        produce(tiered, "stalled", 5_000)

        def stalled_row():
            doc = run_json(tiered, "storage", "remote", "status", "--json", "--topic", "stalled")
            rows = [p for p in doc["partitions"] if p["topic"] == "stalled"]
            return rows[0] if rows and rows[0]["last_error"] else None

        row = wait_for(stalled_row, what="the copy's error in the status")
        assert "rsm.config.storage.root" in row["last_error"]
        assert row["remote_segments"] == 0 and row["copy_lag_segments"] > 0
        # nothing copied, so nothing leaves the local disk
        assert local_log_files(tiered, "stalled")[0] == 0
    finally:
        moved.rename(root)

    def caught_up():
        doc = run_json(tiered, "storage", "remote", "status", "--json", "--topic", "stalled")
        [row] = [p for p in doc["partitions"] if p["topic"] == "stalled"]
        return row if row["last_error"] is None and row["remote_segments"] > 0 else None

    wait_for(caught_up, what="copying to resume")


def test_status_of_a_broker_that_does_not_tier(broker):
    doc = run_json(broker, "storage", "remote", "status", "--json")
    assert doc == {"brokers": [{"broker_id": 1, "tiering": False, "error": None}], "partitions": []}
    proc = run(broker, "storage", "remote", "status")
    assert b"No broker tiers" in proc.stderr


def test_status_with_no_broker_there_is_one_error_line(tmp_path):
    from tests.harness import free_port

    env = {**os.environ, "LOGMQ_BOOTSTRAP": f"127.0.0.1:{free_port()}"}
    proc = subprocess.run(
        [sys.executable, "-m", "logmq_cli.main", "storage", "remote", "status"],
        capture_output=True,
        env=env,
        timeout=DEADLINE,
    )
    assert proc.returncode == 1
    assert proc.stderr.decode().startswith("Error:") and b"Traceback" not in proc.stderr


def test_a_malformed_broker_answer_is_that_brokers_error_not_a_crash():
    """A broker's DescribeRemoteTier answer is input like any other: a shape the CLI
    cannot read names that broker as failed, and the others are still shown."""
    from logmq_cli.storage import merge

    good = {"tiering": True, "partitions": [{"topic": "t", "partition": 0, "leader": True}]}
    bad = [{"partitions": [1]}, {"partitions": "x"}, {"partitions": [{"topic": "t"}]}, [1]]
    for answer in bad:
        report = merge([(1, answer), (2, good)])  # type: ignore[list-item]
        assert report.brokers[0] == {"broker_id": 1, "tiering": None, "error": "a malformed answer"}
        assert list(report.partitions) == [("t", 0)]
