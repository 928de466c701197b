"""``logmq topic alter NAME --partitions N`` as a real subprocess against a real broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from logmq_cli.main import cli

DEADLINE = 120  # seconds; a hung CLI fails the test instead of hanging the suite


def run(broker, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "LOGMQ_BOOTSTRAP": broker.bootstrap}
    proc = subprocess.run(
        [sys.executable, "-m", "logmq_cli.main", *args],
        capture_output=True,
        env=env,
        timeout=DEADLINE,
    )
    if check:
        assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return proc


def partitions_of(broker, topic: str) -> list[int]:
    doc = json.loads(run(broker, "topic", "describe", topic, "--json").stdout)
    return [p["partition"] for p in doc["partitions"]]


def test_topic_alter_adds_partitions(broker):
    run(broker, "topic", "create", "orders", "--partitions", "2")

    done = run(broker, "topic", "alter", "orders", "--partitions", "5")
    assert b"now has 5 partition(s)" in done.stdout
    assert b"per-key order" in done.stderr  # the warning about keyed records
    assert partitions_of(broker, "orders") == [0, 1, 2, 3, 4]

    doc = json.loads(run(broker, "topic", "alter", "orders", "-p", "6", "--json").stdout)
    assert doc == {"topic": "orders", "partitions": 6}

    same = run(broker, "topic", "alter", "orders", "--partitions", "6", check=False)
    assert same.returncode == 1
    assert b"INVALID_PARTITIONS" in same.stderr and b"has 6 partition(s)" in same.stderr
    assert b"Traceback" not in same.stderr

    missing = run(broker, "topic", "alter", "nope", "--partitions", "3", check=False)
    assert missing.returncode == 1 and b"UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr
    assert partitions_of(broker, "orders") == list(range(6))


@pytest.mark.parametrize(
    "args",
    [
        ["topic", "alter", "t"],  # --partitions is required
        ["topic", "alter", "t", "--partitions", "0"],
        ["topic", "alter", "--partitions", "3"],
    ],
)
def test_topic_alter_usage_errors(args):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
