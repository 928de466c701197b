"""What a new user hit (issue 12), each as a real ``logmq`` subprocess where it matters:
no broker running, a missing topic, Ctrl-C on consume, the help text, and a dev cluster
that keeps running when one of its brokers dies."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from logmq import Admin
from logmq_cli.main import cli
from tests.harness import free_port

DEADLINE = 120  # seconds; a hung CLI fails the test instead of hanging the suite
LOGMQ = [sys.executable, "-m", "logmq_cli.main"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def run(*args: str, stdin: bytes | None = None, timeout: float = DEADLINE):
    return subprocess.run(
        [*LOGMQ, *args], input=stdin, capture_output=True, env=ENV, timeout=timeout
    )


class Output:
    """A subprocess's stdout and stderr read as they come, to wait on what it printed."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.text = {"out": b"", "err": b""}
        self._sel = selectors.DefaultSelector()
        self._sel.register(proc.stdout, selectors.EVENT_READ, "out")  # type: ignore[arg-type]
        self._sel.register(proc.stderr, selectors.EVENT_READ, "err")  # type: ignore[arg-type]

    def wait_for(self, what: bytes, stream: str = "out", timeout: float = 60.0) -> None:
        self.wait_until(lambda: what in self.text[stream], repr(what), timeout)

    def wait_until(self, condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            left = deadline - time.monotonic()
            assert left > 0, f"no {what} within {timeout}s: {self.text}"
            self._read(left)

    def _read(self, timeout: float, *, exiting: bool = False) -> None:
        for key, _ in self._sel.select(timeout):
            chunk = os.read(key.fd, 65536)
            if chunk:
                self.text[key.data] += chunk
            else:
                self._sel.unregister(key.fileobj)
        if not exiting and not self._sel.get_map() and self.proc.poll() is not None:
            raise AssertionError(f"process exited ({self.proc.returncode}): {self.text}")

    def finish(self, timeout: float = 60.0) -> tuple[str, str]:
        """Wait for the exit; everything printed, as text."""
        deadline = time.monotonic() + timeout
        while self._sel.get_map():
            left = deadline - time.monotonic()
            assert left > 0, f"still running after {timeout}s: {self.text}"
            self._read(left, exiting=True)
        self.proc.wait(timeout)
        return self.text["out"].decode(), self.text["err"].decode()


@contextlib.contextmanager
def leftover_brokers_killed(data_dir: Path):
    """Brokers a dev cluster left behind (it runs each in a session of its own, so a
    supervisor killed by a failing test orphans them) are killed afterwards."""
    try:
        yield
    finally:
        state = data_dir / "dev-cluster.json"
        if state.exists():
            for entry in json.loads(state.read_text())["brokers"].values():
                if entry.get("pid"):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(entry["pid"], signal.SIGKILL)


@contextlib.contextmanager
def spawned(args: list[str]):
    """``logmq ARGS`` running, with its Output. On the way out whatever is left of its
    process group is killed: a dev cluster's brokers must not outlive a failed test."""
    proc = subprocess.Popen(
        [*LOGMQ, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
        start_new_session=True,
    )
    try:
        yield proc, Output(proc)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# -- no broker running ------------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [["topic", "list"], ["produce", "t"], ["consume", "t"], ["group", "list"]],
    ids=lambda a: a[0],
)
def test_commands_report_a_closed_bootstrap_at_once_naming_it(args):
    """With a 10-minute request timeout, finishing within DEADLINE shows it was not
    waited for; the error names the address and the refusal."""
    port = free_port()
    out = run("-b", f"127.0.0.1:{port}", "--request-timeout", "600", *args, stdin=b"x\n")
    err = out.stderr.decode()
    assert out.returncode == 1, err
    assert err.startswith("Error: "), err
    assert f"127.0.0.1:{port}" in err
    assert "Connection refused" in err
    assert "Traceback" not in err


# -- a missing topic --------------------------------------------------------------------
def test_missing_topic_errors_name_the_action_and_the_fix(broker):
    produced = run("-b", broker.bootstrap, "produce", "nope", stdin=b"x\n")
    err = produced.stderr.decode()
    assert produced.returncode == 1, err
    assert "cannot produce to topic 'nope': it does not exist" in err
    assert "logmq topic create nope" in err
    assert "describe topic" not in err

    consumed = run("-b", broker.bootstrap, "consume", "nope", "--timeout", "1")
    err = consumed.stderr.decode()
    assert consumed.returncode == 1, err
    assert "cannot consume from topic 'nope': it does not exist" in err
    assert "describe topic" not in err


# -- help text --------------------------------------------------------------------------
def test_consume_help_says_where_it_starts_and_shows_the_tab_readably():
    result = CliRunner().invoke(cli, ["consume", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "newest first" not in text
    assert "starts at the end of each partition" in text
    assert "[default: \\t (a tab)]" in text
    assert "('\\t')" not in text


# -- Ctrl-C on consume ------------------------------------------------------------------
@pytest.mark.parametrize("group", [None, "watchers"])
def test_ctrl_c_stops_consume_cleanly(broker, group):
    topic = f"ctrl-c-{group}"
    assert run("-b", broker.bootstrap, "topic", "create", topic, "-p", "3").returncode == 0
    assert run("-b", broker.bootstrap, "produce", topic, stdin=b"a\nb\nc\n").returncode == 0
    extra = ["--group", group] if group else []
    args = ["-b", broker.bootstrap, "consume", topic, "--from-beginning", *extra]
    with spawned(args) as (proc, output):
        output.wait_until(lambda: output.text["out"].count(b"\n") == 3, "3 records")
        proc.send_signal(signal.SIGINT)
        out, err = output.finish()
    assert "Task was destroyed" not in err, err
    assert "Traceback" not in err, err
    assert proc.returncode == 130, err
    assert sorted(out.split()) == ["a", "b", "c"]
    assert "Processed 3 records." in err
    if group:  # closing committed exactly what was printed
        with Admin(broker.bootstrap) as admin:
            committed = admin.group_offsets(group)
        assert sum(c.offset for c in committed.values()) == 3


# -- the dev cluster --------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_dev_cluster_keeps_running_when_a_broker_dies_and_restarts_it(tmp_path: Path):
    data_dir = tmp_path / "dev"
    where = ["--data-dir", str(data_dir)]
    with (
        leftover_brokers_killed(data_dir),
        spawned(["dev", "cluster", "--brokers", "3", "--base-port", "0", *where]) as (
            proc,
            output,
        ),
    ):
        output.wait_for(b"logmq dev cluster ready ")
        output.wait_for(b"failover:")
        first = output.text["out"].decode().splitlines()[0]
        bootstrap = first.split()[-1]

        killed = run("dev", "kill", "2", *where)
        assert killed.returncode == 0, killed.stderr
        output.wait_for(b"broker 2 died (killed by SIGKILL)", "err")
        assert proc.poll() is None  # the others keep running ...
        assert b"node-2.log" in output.text["err"]
        assert b"logmq dev restart 2" in output.text["err"]
        created = run("-b", bootstrap, "topic", "create", "after", "-p", "2", "-r", "2")
        assert created.returncode == 0, created.stderr  # ... and serve

        restarted = run("dev", "restart", "2", *where)
        assert restarted.returncode == 0, restarted.stderr
        assert b"broker 2 is running again" in restarted.stdout
        state = json.loads((data_dir / "dev-cluster.json").read_text())
        assert [b["state"] for b in state["brokers"].values()] == ["running"] * 3
        assert state["brokers"]["2"]["starts"] == 2
        described = run("-b", bootstrap, "cluster", "describe", "--json")
        assert described.returncode == 0, described.stderr
        brokers = json.loads(described.stdout)["brokers"]
        assert sorted(b["node_id"] for b in brokers) == [1, 2, 3]

        proc.send_signal(signal.SIGINT)
        out, err = output.finish()
    assert proc.returncode == 0, err
    assert "cluster stopped" in out
    assert "Traceback" not in err
    assert not (data_dir / "dev-cluster.json").exists()
    for n in (1, 3):
        assert "broker stopped cleanly" in (data_dir / f"node-{n}.log").read_text()


def test_dev_restart_without_a_running_cluster_is_a_clear_error(tmp_path: Path):
    out = run("dev", "restart", "1", "--data-dir", str(tmp_path))
    assert out.returncode == 1
    assert b"no dev cluster is running in" in out.stderr
