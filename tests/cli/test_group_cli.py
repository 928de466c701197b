"""``logmq group ...`` and ``logmq consume --group``: as subprocesses against a real broker,
plus the pure reset planner."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from logmq import Consumer, Producer
from logmq_cli.group import EARLIEST, LATEST, PlannedReset, plan_reset
from logmq_cli.main import cli
from tests.cli.test_cli_e2e import run, run_json

# -- the planner ------------------------------------------------------------------------

TP0, TP1 = ("t", 0), ("t", 1)
LOW = {TP0: 5, TP1: 0}
HIGH = {TP0: 50, TP1: 10}


def plan(**how):
    return plan_reset([TP1, TP0], {TP0: 20}, LOW, HIGH, **how)


def test_plan_to_earliest_and_latest():
    assert plan(to=EARLIEST) == [PlannedReset("t", 0, 20, 5), PlannedReset("t", 1, None, 0)]
    assert [r.new for r in plan(to=LATEST)] == [50, 10]


def test_plan_offsets_are_clamped_into_the_log():
    assert [r.new for r in plan(to_offset=30)] == [30, 10]
    assert [r.new for r in plan(to_offset=0)] == [5, 0]


def test_plan_shift_starts_from_committed_or_log_start():
    assert [r.new for r in plan(shift_by=-3)] == [17, 0]
    assert [r.new for r in plan(shift_by=4)] == [24, 4]
    assert [r.new for r in plan(shift_by=1000)] == [50, 10]


def test_plan_by_time_uses_the_end_when_nothing_is_that_recent():
    assert [r.new for r in plan(by_time={TP0: 7, TP1: -1})] == [7, 10]


def test_plan_needs_a_strategy():
    with pytest.raises(ValueError):
        plan()


def test_group_help_and_usage_errors():
    result = CliRunner().invoke(cli, ["--help"])
    assert "group" in result.output
    result = CliRunner().invoke(
        cli, ["group", "reset-offsets", "g", "--topic", "t", "--to-earliest", "--to-latest"]
    )
    assert result.exit_code == 2
    assert "exactly one of" in result.output
    result = CliRunner().invoke(cli, ["consume", "t", "--group", "g", "--partition", "0"])
    assert result.exit_code == 2


# -- against a broker -------------------------------------------------------------------


def offsets(broker, group: str) -> dict[int, int]:
    doc = run_json(broker, "group", "describe", group, "--json")
    return {p["partition"]: p["committed_offset"] for p in doc["partitions"]}


def test_group_commands(broker):
    run(broker, "topic", "create", "t", "--partitions", "2")
    with Producer(broker.bootstrap) as p:
        for i in range(20):
            p.send("t", f"v{i}", partition=i % 2)

    # A group consumer commits exactly what it printed when it exits.
    first = run(broker, "consume", "t", "--group", "g", "--from-beginning", "-n", "5")
    assert len(first.stdout.splitlines()) == 5
    assert b"Processed 5 records" in first.stderr
    assert {"group_id": "g", "type": "consumer", "state": "empty", "members": 0} in run_json(
        broker, "group", "list", "--json"
    )
    doc = run_json(broker, "group", "describe", "g", "--json")
    assert doc["members"] == []
    assert sum(p["committed_offset"] for p in doc["partitions"]) == 5
    assert doc["total_lag"] == 15
    assert all(p["log_end_offset"] == 10 for p in doc["partitions"])

    # The next run resumes at the committed offsets: together they read everything once.
    rest = run(broker, "consume", "t", "--group", "g", "-n", "15")
    values = first.stdout.splitlines() + rest.stdout.splitlines()
    assert sorted(values) == sorted(f"v{i}".encode() for i in range(20))
    table = run(broker, "group", "describe", "g").stdout.decode()
    assert "log end offset" in table and "total lag 0" in table

    # Dry run: a plan, nothing changed.
    dry = run_json(broker, "group", "reset-offsets", "g", "--topic", "t", "--to-earliest", "--json")
    assert dry["executed"] is False
    assert [(p["current_offset"], p["new_offset"]) for p in dry["partitions"]] == [(10, 0)] * 2
    assert offsets(broker, "g") == {0: 10, 1: 10}
    assert (
        b"Dry run"
        in run(broker, "group", "reset-offsets", "g", "--topic", "t", "--to-latest").stdout
    )

    def reset(*how: str) -> dict[int, int]:
        run(broker, "group", "reset-offsets", "g", *how, "--execute")
        return offsets(broker, "g")

    assert reset("--topic", "t", "--to-earliest") == {0: 0, 1: 0}
    assert reset("--topic", "t", "--shift-by", "3") == {0: 3, 1: 3}
    assert reset("--topic", "t:1", "--to-offset", "100") == {0: 3, 1: 10}  # clamped
    assert reset("--topic", "t", "--to-datetime", "2999-01-01T00:00:00+00:00") == {0: 10, 1: 10}
    assert reset("--topic", "t", "--to-datetime", "2000-01-01T00:00:00") == {0: 0, 1: 0}
    again = run(broker, "consume", "t", "--group", "g", "-n", "20")
    assert len(again.stdout.splitlines()) == 20

    # While a member is live, resets and deletes are refused with a clear message.
    with Consumer(broker.bootstrap, group_id="g", topics=["t"]) as member:
        member.poll(0.5)
        busy = run(
            broker, "group", "reset-offsets", "g", "--topic", "t", "--to-earliest", "--execute",
            check=False,
        )  # fmt: skip
        assert busy.returncode == 1
        assert b"NON_EMPTY_GROUP" in busy.stderr
        assert run(broker, "group", "delete", "g", check=False).returncode == 1
        doc = run_json(broker, "group", "describe", "g", "--json")
        assert [m["member_id"] for m in doc["members"]] == [member.member_id]
        assert {p["member_id"] for p in doc["partitions"]} == {member.member_id}

    bad = run(broker, "group", "reset-offsets", "g", "--topic", "t:7", "--to-earliest", check=False)
    assert bad.returncode == 2

    run(broker, "group", "delete", "g")
    assert "g" not in [g["group_id"] for g in run_json(broker, "group", "list", "--json")]
    missing = run(broker, "group", "describe", "g", check=False)
    assert missing.returncode == 1
    assert b"GROUP_ID_NOT_FOUND" in missing.stderr
    assert json.loads(run(broker, "group", "list", "--json").stdout) == []
