"""``logmq dev cluster``: a local N-broker cluster in the foreground, for trying things out.

Starts N ``logmq-server`` processes on 127.0.0.1, all voters of one metadata quorum, each
with its own data dir (``DATA_DIR/node-<id>``, log in ``node-<id>.log``). Native client
ports are ``BASE_PORT .. BASE_PORT+N-1``, Kafka ports ``BASE_PORT-100 ..`` (9092.. by
default) and Raft ports ``BASE_PORT+100 ..``; ``--base-port 0`` picks free ports.
Once every broker is ready it prints ``logmq dev cluster ready
BOOTSTRAP``; Ctrl-C (or SIGTERM) stops the brokers with SIGTERM, i.e. cleanly.

It is there to try failover, so a broker that dies is reported (node id, how it ended,
its log) and the others keep running. ``logmq dev kill N`` and ``logmq dev restart N``
act on a running dev cluster through its directory: it publishes its brokers in
``DATA_DIR/dev-cluster.json`` and takes restart requests as files in
``DATA_DIR/requests/``, since only the process that started a broker can watch it.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

READY_PREFIX = b"logmq-server ready"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
KAFKA_PORT_OFFSET = -100
RAFT_PORT_OFFSET = 100
WATCH_INTERVAL_S = 0.2  # how often deaths and requests are looked for
DEFAULT_DATA_DIR = Path("./logmq-cluster")
STATE_FILE = "dev-cluster.json"
REQUESTS_DIR = "requests"


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


def describe_exit(returncode: int) -> str:
    """How a process ended, in words: ``killed by SIGKILL``, ``exited with code 1``."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def dev_command(data_dir: Path, *args: str) -> str:
    """The ``logmq dev ...`` command line a user types for this cluster directory."""
    where = [] if data_dir == DEFAULT_DATA_DIR else ["--data-dir", str(data_dir)]
    return shlex.join(["logmq", "dev", *args, *where])


def _names(node_ids: list[int]) -> str:
    return ", ".join(map(str, node_ids))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(slots=True)
class BrokerSlot:
    """One node of the dev cluster and the process running it now, if any."""

    node_id: int
    proc: subprocess.Popen[bytes] | None = None
    state: str = "stopped"  # starting | running | dead | stopped
    starts: int = 0
    started_at: float = 0.0
    seen: bytes = b""  # stdout until the ready line
    ended: str = ""  # describe_exit of the last process
    restart_wanted: bool = False


class DevCluster:
    """N broker processes supervised in the foreground.

    ``start`` waits for every ready line; ``watch`` then reports deaths and carries out
    restart requests until asked to stop; ``stop`` sends SIGTERM to what still runs.
    """

    def __init__(self, brokers: int, data_dir: Path, base_port: int, extra: tuple[str, ...]):
        self.data_dir = data_dir
        if base_port:
            self.ports = [base_port + i for i in range(brokers)]
            self.raft_ports = [base_port + RAFT_PORT_OFFSET + i for i in range(brokers)]
            self.kafka_ports = [base_port + KAFKA_PORT_OFFSET + i for i in range(brokers)]
        else:
            ports = _free_ports(3 * brokers)
            self.ports, self.raft_ports = ports[:brokers], ports[brokers : 2 * brokers]
            self.kafka_ports = ports[2 * brokers :]
        self.voters = ",".join(f"{i + 1}@127.0.0.1:{p}" for i, p in enumerate(self.raft_ports))
        self.extra = extra
        self.slots = {n: BrokerSlot(n) for n in range(1, brokers + 1)}
        self._selector = selectors.DefaultSelector()
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    @property
    def kafka_bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.kafka_ports)

    @property
    def state_path(self) -> Path:
        return self.data_dir / STATE_FILE

    @property
    def requests_dir(self) -> Path:
        return self.data_dir / REQUESTS_DIR

    def log_path(self, node_id: int) -> Path:
        return self.data_dir / f"node-{node_id}.log"

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
            "--kafka-port",
            str(self.kafka_ports[node_id - 1]),
            "--data-dir",
            str(self.data_dir / f"node-{node_id}"),
            "--quorum-voters",
            self.voters,
            *self.extra,
        ]

    # -- processes ----------------------------------------------------------------
    def _spawn(self, slot: BrokerSlot) -> None:
        with open(self.log_path(slot.node_id), "ab") as log_file:
            slot.proc = subprocess.Popen(
                self.command(slot.node_id),
                stdout=subprocess.PIPE,
                stderr=log_file,
                stdin=subprocess.DEVNULL,
                env=self._env,
                start_new_session=True,  # Ctrl-C reaches us; we stop them in order
            )
        assert slot.proc.stdout is not None
        os.set_blocking(slot.proc.stdout.fileno(), False)
        self._selector.register(slot.proc.stdout, selectors.EVENT_READ, slot)
        slot.state, slot.seen, slot.restart_wanted = "starting", b"", False
        slot.starts += 1
        slot.started_at = time.monotonic()

    def _read_output(self, timeout: float) -> list[BrokerSlot]:
        """Read what brokers printed; returns the slots that just became ready. Output
        after the ready line is read too, so a broker never blocks on a full pipe."""
        ready = []
        for key, _ in self._selector.select(timeout):
            slot: BrokerSlot = key.data
            try:
                chunk = os.read(key.fd, 4096)
            except BlockingIOError:
                continue
            if not chunk:  # exited: poll() tells how
                self._selector.unregister(key.fileobj)
                continue
            if slot.state == "starting":
                slot.seen += chunk
                if READY_PREFIX in slot.seen:
                    slot.state, slot.seen = "running", b""
                    ready.append(slot)
        return ready

    def _reap(self, slot: BrokerSlot) -> bool:
        """True when the slot's process has just been found dead."""
        proc = slot.proc
        if proc is None or proc.poll() is None:
            return False
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(proc.stdout)  # type: ignore[arg-type]
        if proc.stdout is not None:
            proc.stdout.close()
        slot.proc, slot.state, slot.ended = None, "dead", describe_exit(proc.returncode)
        return True

    def _log_tail(self, node_id: int, lines: int = 10) -> str:
        try:
            text = self.log_path(node_id).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def start(self) -> None:
        """Start every broker and wait until all are ready; one dying fails the start."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for slot in self.slots.values():
            self._spawn(slot)
        deadline = time.monotonic() + START_TIMEOUT_S
        while any(s.state == "starting" for s in self.slots.values()):
            left = deadline - time.monotonic()
            if left <= 0:
                raise click.ClickException("brokers did not become ready in time")
            self._read_output(min(left, WATCH_INTERVAL_S))
            for slot in self.slots.values():
                if self._reap(slot):
                    raise click.ClickException(
                        f"broker {slot.node_id} {slot.ended} during start "
                        f"(see {self.log_path(slot.node_id)}):\n{self._log_tail(slot.node_id)}"
                    )
        self.write_state()

    def stop(self) -> None:
        """SIGTERM every broker still running, then wait (SIGKILL after STOP_TIMEOUT_S)."""
        running = [s for s in self.slots.values() if s.proc is not None]
        for slot in running:
            with contextlib.suppress(ProcessLookupError):
                slot.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for slot in running:
            proc = slot.proc
            assert proc is not None
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            self._reap(slot)
            slot.state = "stopped"
        self._selector.close()
        with contextlib.suppress(OSError):
            self.state_path.unlink()
        for request in self._requests():
            with contextlib.suppress(OSError):
                request.unlink()
        with contextlib.suppress(OSError):
            self.requests_dir.rmdir()

    # -- watching -----------------------------------------------------------------
    def watch(self, stop_requested: Callable[[], bool]) -> None:
        """Report deaths and serve restart requests until ``stop_requested()``."""
        while not stop_requested():
            changed = False
            for slot in self._read_output(WATCH_INTERVAL_S):
                pid = slot.proc.pid if slot.proc is not None else "?"
                click.echo(f"broker {slot.node_id} is ready again (pid {pid})", err=True)
                changed = True
            for slot in self.slots.values():
                if self._reap(slot):
                    changed = True
                    if slot.restart_wanted:
                        self._spawn(slot)
                    else:
                        self._report_death(slot)
                elif slot.state == "starting" and (
                    time.monotonic() - slot.started_at > START_TIMEOUT_S
                ):
                    click.echo(f"broker {slot.node_id} is not ready yet; stopping it", err=True)
                    slot.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
                    slot.started_at = time.monotonic()  # SIGKILL only after another wait
            for request in self._requests():
                changed |= self._serve(request)
            if changed:
                self.write_state()

    def _report_death(self, slot: BrokerSlot) -> None:
        others = [s.node_id for s in self.slots.values() if s.proc is not None]
        lines = [
            f"broker {slot.node_id} died ({slot.ended}); "
            + (f"brokers {_names(others)} keep running" if others else "no broker is running"),
            f"  its log: {self.log_path(slot.node_id)}",
        ]
        if not slot.ended.startswith("killed"):
            tail = self._log_tail(slot.node_id, 5)
            lines += ["  " + line for line in tail.splitlines()]
        lines.append(
            f"  restart it with: {dev_command(self.data_dir, 'restart', str(slot.node_id))}"
        )
        click.echo("\n".join(lines), err=True)

    def _requests(self) -> list[Path]:
        try:
            return sorted(self.requests_dir.iterdir())
        except OSError:
            return []

    def _serve(self, request: Path) -> bool:
        """Carry out one request file (``restart-<node id>``); True if a broker changed."""
        with contextlib.suppress(OSError):
            request.unlink()
        kind, _, node = request.name.partition("-")
        slot = self.slots.get(int(node)) if node.isdigit() else None
        if kind != "restart" or slot is None:
            click.echo(f"ignoring unknown request {request.name!r}", err=True)
            return False
        click.echo(f"restarting broker {slot.node_id}", err=True)
        if slot.proc is None:
            self._spawn(slot)
        else:
            slot.restart_wanted = True  # started again once it has exited
            with contextlib.suppress(ProcessLookupError):
                slot.proc.send_signal(signal.SIGTERM)
        return True

    def state(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "bootstrap": self.bootstrap,
            "kafka_bootstrap": self.kafka_bootstrap,
            "brokers": {
                str(s.node_id): {
                    "state": s.state,
                    "pid": s.proc.pid if s.proc is not None else None,
                    "port": self.ports[s.node_id - 1],
                    "starts": s.starts,
                    "ended": s.ended,
                    "log": str(self.log_path(s.node_id)),
                }
                for s in self.slots.values()
            },
        }

    def write_state(self) -> None:
        """Publish the brokers for ``logmq dev kill|restart`` (atomically: they poll it)."""
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state(), indent=1))
        os.replace(tmp, self.state_path)

    def claim(self) -> None:
        """Refuse to run twice on one directory (two clusters would share data dirs)."""
        state = read_state(self.data_dir)
        if state is not None and state["pid"] != os.getpid() and _pid_alive(state["pid"]):
            raise click.ClickException(
                f"a dev cluster (pid {state['pid']}) already runs in {self.data_dir}"
            )
        self.requests_dir.mkdir(parents=True, exist_ok=True)
        for stale in self._requests():
            stale.unlink()


def read_state(data_dir: Path) -> dict[str, Any] | None:
    """What the dev cluster running in ``data_dir`` published, or None."""
    try:
        return json.loads((data_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def running_state(data_dir: Path) -> dict[str, Any]:
    state = read_state(data_dir)
    if state is None or not _pid_alive(state["pid"]):
        raise click.ClickException(
            f"no dev cluster is running in {data_dir} (start one with `logmq dev cluster`)"
        )
    return state


def broker_entry(state: dict[str, Any], node_id: int) -> dict[str, Any]:
    entry = state["brokers"].get(str(node_id))
    if entry is None:
        raise click.ClickException(f"the dev cluster has no broker {node_id}")
    return entry


data_dir_option = click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DATA_DIR,
    show_default=True,
    help="Parent of the brokers' data dirs (node-1, node-2, ...); kept between runs.",
)


@click.group()
def dev() -> None:
    """Local development helpers: a cluster in the foreground, broker kills and restarts."""


@dev.command("cluster")
@click.option("--brokers", "-n", type=click.IntRange(1, 9), default=3, show_default=True)
@data_dir_option
@click.option(
    "--base-port",
    type=click.IntRange(0, 65000),
    default=9192,
    show_default=True,
    help="Native client port of broker 1 (the others follow; Kafka ports are -100, Raft "
    "ports +100); 0 = free ports.",
)
@click.option(
    "--server-arg",
    "server_args",
    multiple=True,
    metavar="ARG",
    help="Extra argument for every logmq-server (repeatable), e.g. --server-arg=--log-level=debug.",
)
def cluster(brokers: int, data_dir: Path, base_port: int, server_args: tuple[str, ...]) -> None:
    """Run a local cluster of BROKERS brokers in the foreground until Ctrl-C.

    A broker that dies is reported and the others keep running: try a failover with
    `logmq dev kill N`, watch, then `logmq dev restart N`.
    """
    dc = DevCluster(brokers, data_dir, base_port, server_args)
    stop_requested = False

    def request_stop(*_: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    dc.data_dir.mkdir(parents=True, exist_ok=True)
    dc.claim()
    old_int = signal.signal(signal.SIGINT, request_stop)
    old_term = signal.signal(signal.SIGTERM, request_stop)
    try:
        dc.start()
        click.echo(f"logmq dev cluster ready {dc.bootstrap}", nl=True)
        click.echo(f"  export LOGMQ_BOOTSTRAP={dc.bootstrap}   # Ctrl-C stops the cluster")
        pids = ", ".join(f"{s.node_id}: pid {s.proc.pid}" for s in dc.slots.values() if s.proc)
        click.echo(f"  brokers {pids}; logs in {dc.data_dir}/node-N.log")
        click.echo(
            f"  failover: {dev_command(data_dir, 'kill', 'N')}, watch, then "
            f"{dev_command(data_dir, 'restart', 'N')}"
        )
        sys.stdout.flush()
        dc.watch(lambda: stop_requested)
        click.echo("stopping the brokers", err=True)
    finally:
        with contextlib.suppress(Exception):
            dc.stop()
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
    click.echo("cluster stopped")


@dev.command("kill")
@click.argument("node_id", metavar="N", type=click.IntRange(min=1))
@click.option(
    "--signal",
    "sig",
    type=click.Choice(["KILL", "TERM"]),
    default="KILL",
    show_default=True,
    help="KILL: a crash (no clean shutdown); TERM: a clean stop.",
)
@data_dir_option
def kill(node_id: int, sig: str, data_dir: Path) -> None:
    """Kill broker N of the dev cluster running in --data-dir (to try a failover)."""
    entry = broker_entry(running_state(data_dir), node_id)
    if entry["pid"] is None or entry["state"] not in ("starting", "running"):
        raise click.ClickException(f"broker {node_id} is not running ({entry['state']})")
    try:
        os.kill(entry["pid"], signal.Signals[f"SIG{sig}"])
    except ProcessLookupError:
        raise click.ClickException(f"broker {node_id} is not running") from None
    click.echo(f"sent SIG{sig} to broker {node_id} (pid {entry['pid']})")


@dev.command("restart")
@click.argument("node_id", metavar="N", type=click.IntRange(min=1))
@data_dir_option
def restart(node_id: int, data_dir: Path) -> None:
    """Start broker N of the dev cluster running in --data-dir again (stopping it cleanly
    first if it runs), and wait until it is ready."""
    state = running_state(data_dir)
    before = broker_entry(state, node_id)["starts"]
    requests = data_dir / REQUESTS_DIR
    requests.mkdir(exist_ok=True)
    (requests / f"restart-{node_id}").touch()
    deadline = time.monotonic() + STOP_TIMEOUT_S + START_TIMEOUT_S
    while time.monotonic() < deadline:
        state = read_state(data_dir)
        if state is None or not _pid_alive(state["pid"]):
            raise click.ClickException("the dev cluster stopped")
        entry = broker_entry(state, node_id)
        if entry["starts"] > before and entry["state"] == "running":
            click.echo(f"broker {node_id} is running again (pid {entry['pid']})")
            return
        if entry["starts"] > before and entry["state"] == "dead":
            raise click.ClickException(
                f"broker {node_id} {entry['ended']} during start; see {entry['log']}"
            )
        time.sleep(WATCH_INTERVAL_S)  # polling the dev cluster's state file
    raise click.ClickException(f"broker {node_id} did not restart in time; see the dev cluster")
