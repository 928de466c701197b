"""``logmq-server`` before it serves: ``--version``/``-h``, and a port it cannot have.

A taken port must stop the start with one line naming the listener and the option that
moves it, before the data dir is created (issue 35, item 10); a directory that existed
is never touched.
"""

from __future__ import annotations

import importlib.metadata
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import logmq.server
from logmq.broker.config import BrokerConfig
from logmq.net.bind_check import ListenerUnavailableError
from logmq.server import Broker
from tests.harness import BrokerProcess, free_port

SERVER = [sys.executable, "-m", "logmq_cli.server"]
LOGMQ = [sys.executable, "-m", "logmq_cli.main"]
VERSION = importlib.metadata.version("logmq")


def run(*args: str | Path, cmd: list[str] = SERVER) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*cmd, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def taken() -> Iterator[int]:
    """A port another process-like holder listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize(("cmd", "prog"), [(SERVER, "logmq-server"), (LOGMQ, "logmq")])
def test_version_and_short_help(cmd, prog):
    version = run("--version", cmd=cmd)
    assert version.returncode == 0, version.stderr
    assert version.stdout == f"{prog}, version {VERSION}\n"
    short, long = run("-h", cmd=cmd), run("--help", cmd=cmd)
    assert short.returncode == long.returncode == 0
    assert short.stdout == long.stdout and "Usage:" in short.stdout


def test_logmq_version_in_the_environment_does_not_stop_a_start(tmp_path):
    """LOGMQ_<OPTION> variables set options; LOGMQ_VERSION (an image's label) must not."""
    with BrokerProcess(tmp_path / "data", env={"LOGMQ_VERSION": VERSION}) as broker:
        assert broker.running


@pytest.mark.parametrize(
    ("option", "listener"),
    [
        ("--kafka-port", "the Kafka listener PLAINTEXT"),
        ("--port", "the native listener NATIVE"),
        ("--metrics-port", "the metrics endpoint"),
    ],
)
def test_a_taken_port_names_its_option_and_creates_no_data_dir(tmp_path, taken, option, listener):
    data_dir = tmp_path / "new" / "data"
    ports = {"--port": "0", "--kafka-port": "0", option: str(taken)}
    proc = run("--data-dir", data_dir, *(x for kv in ports.items() for x in kv))
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"logmq-server: cannot start: {listener} cannot listen on 127.0.0.1:{taken}: address "
        f"already in use; stop what holds it or choose another port with {option} "
        "(0: any free port)"
    ]
    assert not (tmp_path / "new").exists()


def test_a_taken_raft_port_names_the_voter_entry(tmp_path, taken):
    proc = run(
        "--data-dir", tmp_path / "d", "--port", "0", "--kafka-port", "0",
        "--quorum-voters", f"1@127.0.0.1:{taken},2@127.0.0.1:{free_port()}",
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"logmq-server: cannot start: the Raft listener of node 1 cannot listen on "
        f"127.0.0.1:{taken}: address already in use; stop what holds it or choose another "
        "port with --quorum-voters (node 1's entry)"
    ]
    assert not (tmp_path / "d").exists()


def test_two_listeners_on_one_port(tmp_path):
    port = str(free_port())
    proc = run("--data-dir", tmp_path / "d", "--port", port, "--kafka-port", port)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "logmq-server: cannot start: the native listener NATIVE and the Kafka listener "
        f"PLAINTEXT both want port {port}: give one of them another port (--port, --kafka-port)"
    ]
    assert not (tmp_path / "d").exists()


def test_a_listener_from_the_listeners_property_names_it(tmp_path, taken):
    proc = run(
        "--data-dir", tmp_path / "d", "--port", "0",
        "--override", f"listeners=PLAINTEXT://127.0.0.1:{taken}",
    )  # fmt: skip
    assert proc.returncode == 1
    assert "the listeners property (--override listeners=...)" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1


def test_an_existing_data_dir_is_left_as_it_was(tmp_path, taken):
    with BrokerProcess(tmp_path / "data") as broker:
        assert broker.stop() == 0
    before = snapshot(broker.data_dir)
    assert "meta.properties" in before
    proc = run("--data-dir", broker.data_dir, "--port", taken, "--kafka-port", "0")
    assert proc.returncode == 1 and "--port" in proc.stderr
    assert snapshot(broker.data_dir) == before
    with broker:  # and it still starts, on free ports
        assert broker.running


async def test_a_bind_lost_after_the_check_removes_the_dir_it_created(tmp_path, taken, monkeypatch):
    """Another process can take a port between the check and the bind: the start fails
    with the same words and removes the data dir it created (only that one)."""
    monkeypatch.setattr(logmq.server, "check_listeners", lambda plan: None)
    data_dir = tmp_path / "a" / "b"
    config = BrokerConfig(data_dir=data_dir, port=taken, kafka_port=0)
    with pytest.raises(ListenerUnavailableError, match="choose another port with --port"):
        await Broker(config).start()
    assert not (tmp_path / "a").exists()
    # a dir that existed stays, with what the failed start wrote in it
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "mine").write_text("keep")
    config = BrokerConfig(data_dir=existing, port=taken, kafka_port=0)
    with pytest.raises(ListenerUnavailableError):
        await Broker(config).start()
    assert (existing / "mine").read_text() == "keep"
