"""``logmq reassign`` and ``logmq cluster decommission / rebalance``.

Parsing and validation run without a broker (every bad input is one ``Error:`` line and
exit status 1); ``generate`` and the error paths run against a real single broker; one
three-broker cluster runs execute -> verify -> done, a throttled move that is cancelled,
a decommission and a rebalance.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result

from logmq.client import Admin, Producer
from logmq.client.reassignment_admin import LogDirPartition, PartitionReassignment
from logmq_cli.main import cli
from logmq_cli.reassign import parse_rate
from logmq_cli.reassign_progress import (
    DONE,
    MISSING,
    MOVING,
    NOT_STARTED,
    OTHER_MOVE,
    PartitionState,
    Report,
    classify,
    copy_progress,
)
from tests.harness import BrokerCluster

NO_BROKER = "127.0.0.1:1"  # nothing listens there: these commands must fail before connecting


def invoke(bootstrap: str, *args: str, code: int = 0, stdin: str | None = None) -> Result:
    result = CliRunner().invoke(
        cli, ["-b", bootstrap, "--request-timeout", "20", *args], input=stdin
    )
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.output
    return result


def one_line_error(result: Result, *fragments: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def plan_text(*entries: tuple[str, int, list[int]]) -> str:
    parts = [{"topic": t, "partition": p, "replicas": r} for t, p, r in entries]
    return json.dumps({"version": 1, "partitions": parts})


# -- no broker needed -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("50MB/s", 50_000_000),
        ("10MiB/s", 10 * 1024 * 1024),
        ("500KB/s", 500_000),
        ("1048576", 1048576),
        ("1.5 mb/s", 1_500_000),
        ("2GiB", 2 * 1024**3),
        ("0", 0),
    ],
)
def test_rates_parse(text, rate):
    assert parse_rate(text) == rate


@pytest.mark.parametrize("text", ["", "fast", "50XB/s", "-5MB/s", "5 MB/min", "1e6"])
def test_bad_rates_are_refused(text):
    with pytest.raises(Exception, match="invalid rate"):
        parse_rate(text)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("not json", "not valid JSON"),
        ('{"version": 2, "partitions": []}', "unsupported plan version 2"),
        ('{"version": 1, "partitions": []}', "the plan has no partitions"),
        (plan_text(("t", 0, [1, 2, 1])), "appears twice"),
        (plan_text(("t", 0, [])), "replica set is empty"),
        (plan_text(("t", 0, [1]), ("t", 0, [2])), "t-0 appears twice"),
        ('{"version": 1, "partitions": [{"topic": "t", "replicas": [1]}]}', '"partition"'),
    ],
)
@pytest.mark.parametrize("command", ["execute", "verify", "cancel"])
def test_bad_plan_files_are_one_line_errors(tmp_path, content, fragment, command):
    path = tmp_path / "plan.json"
    path.write_text(content)
    one_line_error(invoke(NO_BROKER, "reassign", command, str(path), code=1), fragment)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["reassign", "execute"], "Missing argument"),
        (["reassign", "execute", "/no/such/plan.json"], "cannot read plan"),
        (["reassign", "execute", "-", "--throttle", "lots"], "invalid rate"),
        (["reassign", "verify", "-", "--bogus"], "No such option"),
        (["reassign", "generate", "--brokers", "1,2"], "Missing option '--topics'"),
        (["reassign", "generate", "--topics", "t", "--brokers", "1,x"], "broker ids"),
        (["reassign", "generate", "--topics", " , ", "--brokers", "1"], "at least one topic"),
        (["cluster", "decommission", "one"], "not a valid integer"),
        (["cluster", "decommission", "1", "--throttle", "9 parsecs"], "invalid rate"),
        (["cluster", "rebalance", "--throttle", "x"], "invalid rate"),
    ],
)
def test_bad_arguments_are_one_line_errors(args, fragment):
    one_line_error(invoke(NO_BROKER, *args, code=1, stdin=plan_text(("t", 0, [1]))), fragment)


def test_partition_states():
    moving = PartitionReassignment("t", 0, [1, 2, 3], [1, 2], 1, [3], [1], [2, 3])
    assert classify((2, 3), [1, 2, 3], moving) == MOVING
    assert classify((3, 2), [1, 2, 3], moving) == OTHER_MOVE
    assert classify((2, 3), [2, 3], None) == DONE
    assert classify((3, 2), [2, 3], None) == NOT_STARTED  # the order is part of the plan
    assert classify((2, 3), None, None) == MISSING


def test_exit_codes_follow_the_worst_partition():
    def report(*states: str) -> Report:
        return Report([PartitionState("t", i, s, [1], [1]) for i, s in enumerate(states)], None)

    assert report(DONE, DONE).exit_code == 0 and report(DONE).complete
    assert report(DONE, MOVING).exit_code == 1
    assert report(MOVING, NOT_STARTED).exit_code == 2
    assert report(OTHER_MOVE).exit_code == 2 and report(MISSING).exit_code == 2


def test_bytes_copied_are_capped_at_the_leader_and_full_once_caught_up():
    leader = LogDirPartition("t", 0, size=1000, log_start_offset=0, log_end_offset=50)
    assert copy_progress(leader, None) == (0, 1000)
    half = LogDirPartition("t", 0, size=500, log_start_offset=0, log_end_offset=25)
    assert copy_progress(leader, half) == (500, 1000)
    bigger = LogDirPartition("t", 0, size=1200, log_start_offset=0, log_end_offset=49)
    assert copy_progress(leader, bigger) == (1000, 1000)
    caught_up = LogDirPartition("t", 0, size=900, log_start_offset=0, log_end_offset=50)
    assert copy_progress(leader, caught_up) == (1000, 1000)
    assert copy_progress(None, half) == (0, 0)  # the leader did not answer


# -- one real broker --------------------------------------------------------------------------


def test_generate_and_errors_against_one_broker(broker, tmp_path):
    b = broker.bootstrap
    invoke(b, "topic", "create", "orders", "--partitions", "3")

    balanced = invoke(b, "reassign", "generate", "--topics", "orders", "--brokers", "1")
    assert json.loads(balanced.stdout) == {"version": 1, "partitions": []}
    assert "already balanced" in balanced.stderr
    doc = json.loads(
        invoke(b, "reassign", "generate", "--topics", "orders", "--brokers", "1", "--json").stdout
    )
    assert doc == {"proposed": {"version": 1, "partitions": []}, "current": doc["current"]}

    one_line_error(
        invoke(b, "reassign", "generate", "--topics", "orders", "--brokers", "1,7", code=1),
        "BROKER_NOT_AVAILABLE",
        "7",
    )
    one_line_error(
        invoke(b, "reassign", "generate", "--topics", "orders,nope", "--brokers", "1", code=1),
        "unknown topic(s): nope",
    )

    # nothing moves when the controller refuses: unknown broker, unknown partition
    plan = tmp_path / "plan.json"
    plan.write_text(plan_text(("orders", 0, [7])))
    one_line_error(invoke(b, "reassign", "execute", str(plan), code=1), "unknown broker")
    plan.write_text(plan_text(("orders", 0, [1]), ("orders", 9, [1])))
    one_line_error(invoke(b, "reassign", "execute", str(plan), code=1), "orders-9")

    # a plan that matches the cluster is complete; nothing is moving to cancel
    plan.write_text(plan_text(("orders", 1, [1])))
    assert invoke(b, "reassign", "verify", str(plan), "--no-wait").exit_code == 0
    report = json.loads(invoke(b, "reassign", "verify", str(plan), "--json").stdout)
    assert report["complete"] and report["partitions"][0]["state"] == DONE
    assert "Nothing to cancel" in invoke(b, "reassign", "cancel").stdout
    assert json.loads(invoke(b, "reassign", "cancel", "--json").stdout) == {"cancelled": []}

    assert "Nothing to move" in invoke(b, "cluster", "rebalance").stdout
    one_line_error(invoke(b, "cluster", "decommission", "1", code=1), "only 0 live broker")
    one_line_error(invoke(b, "cluster", "decommission", "5", code=1), "unknown broker 5")


# -- three real brokers -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def trio() -> Iterator[BrokerCluster]:
    c = BrokerCluster(3, extra_args=["--broker-session-timeout-ms", "3000"])
    try:
        c.start()
        yield c
    finally:
        c.close()


def replicas_of(bootstrap: str, topic: str) -> dict[int, tuple[list[int], list[int]]]:
    doc = json.loads(invoke(bootstrap, "topic", "describe", topic, "--json").stdout)
    return {p["partition"]: (p["replicas"], sorted(p["isr"])) for p in doc["partitions"]}


def fill(bootstrap: str, topic: str, batches: int, size: int) -> None:
    """``batches`` acks=all batches of ``size`` bytes each (flushed one by one)."""
    with Producer(bootstrap, acks="all") as p:
        for i in range(batches):
            p.send(topic, b"v" * size, partition=0, key=str(i).encode())
            p.flush()


def test_execute_verify_then_cancel_a_throttled_move(trio, tmp_path):
    b = trio.bootstrap
    invoke(b, "topic", "create", "moves", "-p", "1", "-r", "2")
    fill(b, "moves", 20, 10_000)
    before, _ = replicas_of(b, "moves")[0]
    newcomer = ({1, 2, 3} - set(before)).pop()
    target = [newcomer, before[0]]  # the new broker leads once the move is done
    plan = tmp_path / "plan.json"
    plan.write_text(plan_text(("moves", 0, target)))

    started = invoke(b, "reassign", "execute", str(plan), "--throttle", "10MB/s")
    assert "Started moving 1 partition(s)" in started.stdout
    assert json.loads(started.stderr) == json.loads(
        plan_text(("moves", 0, before))
    )  # the rollback plan
    done = invoke(b, "reassign", "verify", str(plan), "--timeout", "60", "--interval", "0.1")
    assert "Every partition is on its target replicas" in done.stdout
    assert replicas_of(b, "moves")[0] == (target, sorted(target))
    report = json.loads(invoke(b, "reassign", "verify", str(plan), "--no-wait", "--json").stdout)
    assert report["complete"] and report["throttle_bytes_per_sec"] is None  # removed at the end

    # a move throttled to a crawl: moving (exit 1), then cancelled (back, exit 2)
    invoke(b, "topic", "create", "slow", "-p", "1", "-r", "2")
    fill(b, "slow", 60, 4_000)
    original, _ = replicas_of(b, "slow")[0]
    newcomer = ({1, 2, 3} - set(original)).pop()
    plan.write_text(plan_text(("slow", 0, [original[0], newcomer])))
    invoke(b, "reassign", "execute", str(plan), "--throttle", "2KB/s", "--json")
    moving = invoke(b, "reassign", "verify", str(plan), "--no-wait", "--json", code=1)
    doc = json.loads(moving.stdout)
    assert doc["throttle_bytes_per_sec"] == 2000
    (entry,) = doc["partitions"]
    assert entry["state"] == MOVING and entry["adding_replicas"] == [newcomer]
    assert entry["bytes_total"] > entry["bytes_copied"] >= 0
    again = invoke(b, "reassign", "execute", str(plan), code=1)
    one_line_error(again, "already running")
    invoke(b, "reassign", "execute", str(plan), "--throttle", "3KiB/s")  # changes the throttle
    busy = invoke(b, "cluster", "decommission", str(newcomer), code=1)
    one_line_error(busy, "REASSIGNMENT_IN_PROGRESS", "slow-0 is moving to or from")
    one_line_error(invoke(b, "cluster", "rebalance", code=1), "slow-0 is moving")

    cancelled = json.loads(invoke(b, "reassign", "cancel", str(plan), "--json").stdout)
    assert cancelled == {"cancelled": [{"topic": "slow", "partition": 0, "replicas": original}]}
    stuck = invoke(b, "reassign", "verify", str(plan), "--no-wait", code=2)
    assert "neither on their target nor moving" in stuck.stderr
    assert replicas_of(b, "slow")[0][0] == original
    with Admin(b) as admin:
        listing = admin.list_partition_reassignments()
    assert listing.partitions == {} and listing.throttle_bytes_per_sec is None


def test_decommission_then_rebalance(trio, tmp_path):
    b = trio.bootstrap
    invoke(b, "topic", "create", "spread", "-p", "6", "-r", "2")
    fill(b, "spread", 5, 1_000)
    with Admin(b) as admin:
        topics = admin.list_topics(internal=True)

    def holders() -> dict[int, int]:
        counts = dict.fromkeys((1, 2, 3), 0)
        for topic in topics:
            for replicas, _ in replicas_of(b, topic).values():
                for r in replicas:
                    counts[r] += 1
        return counts

    saved = tmp_path / "decommission.json"
    out = invoke(b, "cluster", "decommission", "3", "--save-plan", str(saved), "--json")
    doc = json.loads(out.stdout)
    assert doc["complete"] and doc["plan"]["partitions"]
    assert holders()[3] == 0
    assert invoke(b, "reassign", "verify", str(saved), "--no-wait").exit_code == 0

    dry = json.loads(invoke(b, "cluster", "rebalance", "--dry-run", "--json").stdout)
    assert dry["dry_run"] and dry["plan"]["partitions"]
    assert holders()[3] == 0  # a dry run moves nothing
    assert "Done: balanced" in invoke(b, "cluster", "rebalance", "--throttle", "50MB/s").stdout
    counts = holders()
    assert max(counts.values()) - min(counts.values()) <= 1, counts
    assert "Nothing to move" in invoke(b, "cluster", "rebalance").stdout
