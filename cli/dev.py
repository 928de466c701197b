"""``logmq dev cluster``: a local N-broker cluster in the foreground, for trying things out.

Starts N ``logmq-server`` processes on 127.0.0.1, all voters of one metadata quorum, each
with its own data dir (``DATA_DIR/node-<id>``, log in ``node-<id>.log``). Client ports are
``BASE_PORT .. BASE_PORT+N-1`` and Raft ports ``BASE_PORT+100 ..``; ``--base-port 0``
picks free ports. Once every broker is ready it prints ``logmq dev cluster ready
BOOTSTRAP``; Ctrl-C (or SIGTERM) stops the brokers with SIGTERM, i.e. cleanly. If a
broker dies, the others are stopped and the command exits non-zero.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import click

READY_PREFIX = b"logmq-server ready"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
RAFT_PORT_OFFSET = 100


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class DevCluster:
    """N broker processes; ``start`` waits for every ready line, ``stop`` sends SIGTERM."""

    def __init__(self, brokers: int, data_dir: Path, base_port: int, extra: tuple[str, ...]):
        self.data_dir = data_dir
        if base_port:
            self.ports = [base_port + i for i in range(brokers)]
            self.raft_ports = [base_port + RAFT_PORT_OFFSET + i for i in range(brokers)]
        else:
            ports = _free_ports(2 * brokers)
            self.ports, self.raft_ports = ports[:brokers], ports[brokers:]
        self.voters = ",".join(f"{i + 1}@127.0.0.1:{p}" for i, p in enumerate(self.raft_ports))
        self.extra = extra
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def command(self, node_id: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "logmq_cli.server",
            "--node-id",
            str(node_id),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.ports[node_id - 1]),
            "--data-dir",
            str(self.data_dir / f"node-{node_id}"),
            "--quorum-voters",
            self.voters,
            *self.extra,
        ]

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for node_id in range(1, len(self.ports) + 1):
            with open(self.data_dir / f"node-{node_id}.log", "ab") as log_file:
                self.procs.append(
                    subprocess.Popen(
                        self.command(node_id),
                        stdout=subprocess.PIPE,
                        stderr=log_file,
                        env=env,
                        start_new_session=True,  # Ctrl-C reaches us; we stop them in order
                    )
                )
        self._wait_ready()

    def _wait_ready(self) -> None:
        waiting = {p.stdout.fileno(): p for p in self.procs if p.stdout is not None}
        buffers: dict[int, bytes] = dict.fromkeys(waiting, b"")
        deadline = time.monotonic() + START_TIMEOUT_S
        with selectors.DefaultSelector() as sel:
            for fd in waiting:
                sel.register(fd, selectors.EVENT_READ)
            while waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise click.ClickException("brokers did not become ready in time")
                for key, _ in sel.select(min(left, 0.5)):
                    fd = key.fd
                    chunk = os.read(fd, 4096)
                    if not chunk:
                        raise click.ClickException(self._died_message(waiting[fd]))
                    buffers[fd] += chunk
                    if READY_PREFIX in buffers[fd]:
                        sel.unregister(fd)
                        del waiting[fd]
                for proc in waiting.values():
                    if proc.poll() is not None:
                        raise click.ClickException(self._died_message(proc))

    def _died_message(self, proc: subprocess.Popen[bytes]) -> str:
        node_id = self.procs.index(proc) + 1
        log = self.data_dir / f"node-{node_id}.log"
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-10:])
        return f"broker {node_id} exited during start (see {log}):\n{tail}"

    def dead(self) -> list[int]:
        return [i + 1 for i, p in enumerate(self.procs) if p.poll() is not None]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


@click.group()
def dev() -> None:
    """Local development helpers."""


@dev.command("cluster")
@click.option("--brokers", "-n", type=click.IntRange(1, 9), default=3, show_default=True)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("./logmq-cluster"),
    show_default=True,
    help="Parent of the brokers' data dirs (node-1, node-2, ...); kept between runs.",
)
@click.option(
    "--base-port",
    type=click.IntRange(0, 65000),
    default=9092,
    show_default=True,
    help="Client port of broker 1 (the others follow; Raft ports are +100); 0 = free ports.",
)
@click.option(
    "--server-arg",
    "server_args",
    multiple=True,
    metavar="ARG",
    help="Extra argument for every logmq-server (repeatable), e.g. --server-arg=--log-level=debug.",
)
def cluster(brokers: int, data_dir: Path, base_port: int, server_args: tuple[str, ...]) -> None:
    """Run a local cluster of BROKERS brokers in the foreground until Ctrl-C."""
    dc = DevCluster(brokers, data_dir, base_port, server_args)
    stop_requested = False

    def request_stop(*_: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    old_int = signal.signal(signal.SIGINT, request_stop)
    old_term = signal.signal(signal.SIGTERM, request_stop)
    code = 0
    try:
        dc.start()
        click.echo(f"logmq dev cluster ready {dc.bootstrap}", nl=True)
        click.echo(f"  export LOGMQ_BOOTSTRAP={dc.bootstrap}   # Ctrl-C stops the cluster")
        sys.stdout.flush()
        while not stop_requested:
            dead = dc.dead()
            if dead:
                click.echo(f"broker(s) {dead} exited; stopping the cluster", err=True)
                code = 1
                break
            time.sleep(0.2)  # watching child processes: there is no event to await
    finally:
        with contextlib.suppress(Exception):
            dc.stop()
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
    click.echo("cluster stopped")
    sys.exit(code)
