"""Real brokers for tests: a ``logmq-server`` subprocess, or a Broker in this process.

``BrokerProcess`` runs ``python -m logmq_cli.server`` on 127.0.0.1 with a free port and
its own data dir, and waits for the server's ``logmq-server ready HOST:PORT`` line on
stdout (a condition with a deadline, no sleeps). Its stderr goes to ``log_path``; a
start failure raises with the tail of that log. Stable API used by other test suites:
``.port``, ``.bootstrap``, ``.data_dir``, ``.start()``, ``.stop()``, ``.kill()``,
``.restart()``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

READY_PREFIX = b"logmq-server ready"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0


_HANDED_OUT: collections.deque[int] = collections.deque(maxlen=4096)


def free_port() -> int:
    """A port nothing listens on now, and not one this process handed out lately.

    The kernel may give the same free port to two binds in a row; callers that pick
    several ports before starting anything (a cluster's client and quorum ports) must
    not get one twice.
    """
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            break
    _HANDED_OUT.append(port)
    return port


def compile_sources() -> None:
    """Write the bytecode of logmq and its CLI, as a non-editable install does.

    An editable install under PYTHONDONTWRITEBYTECODE (set on some machines) would make
    every broker subprocess compile the whole package again at start: about 0.4 s each,
    which the suite's hundreds of starts and the benchmarks' restart times would pay.
    """
    import compileall

    root = Path(__file__).resolve().parent.parent
    for folder in (root / "src" / "logmq", root / "cli"):
        compileall.compile_dir(folder, quiet=2, workers=1)


class BrokerStartError(RuntimeError):
    pass


class BrokerProcess:
    """One broker subprocess. Use ``start()`` or ``with BrokerProcess(...) as b:``."""

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        *,
        port: int | None = None,
        node_id: int = 1,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        log_level: str = "info",
    ):
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="logmq-broker-")
            data_dir = Path(self._tmp.name) / "data"
        else:
            self._tmp = None
        self.data_dir = Path(data_dir)
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-broker.log"
        self._fixed_port = port is not None
        self.port = port if port is not None else free_port()
        self.kafka_port = free_port()  # every test broker serves Kafka clients too
        self.node_id = node_id
        self.extra_args = list(extra_args)
        self.env = env
        self.log_level = log_level
        self.proc: subprocess.Popen | None = None
        self.returncode: int | None = None

    # -- properties -------------------------------------------------------------------
    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def kafka_bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "logmq_cli.server",
            "--data-dir",
            str(self.data_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--kafka-port",
            str(self.kafka_port),
            "--node-id",
            str(self.node_id),
            "--log-level",
            self.log_level,
            *self.extra_args,
        ]

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    # -- lifecycle --------------------------------------------------------------------
    def start(self, timeout: float = START_TIMEOUT) -> BrokerProcess:
        if self.running:
            raise RuntimeError("broker already running")
        for attempt in range(3):
            try:
                self._spawn_and_wait(timeout)
                return self
            except BrokerStartError as e:
                in_use = "address already in use" in str(e).lower()
                if self._fixed_port or not in_use or attempt == 2:
                    raise
                self.port = free_port()  # lost a race for the port: pick another
                self.kafka_port = free_port()
        return self

    def _spawn_and_wait(self, timeout: float) -> None:
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(self.env or {})
        env.setdefault("PYTHONUNBUFFERED", "1")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        self.returncode = None
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while READY_PREFIX not in buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    raise BrokerStartError(
                        f"broker not ready after {timeout}s; log:\n{self.log_tail()}"
                    )
                if sel.select(left):
                    chunk = os.read(self.proc.stdout.fileno(), 4096)
                    if not chunk:  # stdout closed: the process died
                        self.proc.wait()
                        self.returncode = self.proc.returncode
                        raise BrokerStartError(
                            f"broker exited with {self.returncode} during start; log:\n"
                            f"{self.log_tail()}"
                        )
                    buf += chunk

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM and wait; returns the exit code (0 for a clean shutdown)."""
        return self._signal_and_wait(signal.SIGTERM, timeout)

    def kill(self) -> int | None:
        """SIGKILL: no flush, no clean-shutdown marker."""
        return self._signal_and_wait(signal.SIGKILL, STOP_TIMEOUT)

    def restart(self, timeout: float = START_TIMEOUT) -> BrokerProcess:
        if self.running:
            self.stop()
        self._fixed_port = True  # clients keep their bootstrap address
        return self.start(timeout)

    def _signal_and_wait(self, sig: int, timeout: float) -> int | None:
        proc = self.proc
        if proc is None:
            return self.returncode
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        self.returncode = proc.returncode
        self.proc = None
        return self.returncode

    def close(self) -> None:
        """Stop (SIGTERM, then SIGKILL if needed) and remove a temp data dir we created."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> BrokerProcess:
        return self.start() if not self.running else self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"BrokerProcess({self.bootstrap}, data_dir={self.data_dir}, pid={self.pid})"


@contextlib.asynccontextmanager
async def inprocess_broker(data_dir: str | os.PathLike, **settings: Any) -> AsyncIterator[Any]:
    """A Broker in the running event loop, on a free port; yields the Broker.

    Faster than a subprocess and lets tests patch internals (the zero-copy proof does).
    """
    from logmq.broker.config import BrokerConfig
    from logmq.server import Broker

    settings.setdefault("port", 0)
    broker = Broker(BrokerConfig(data_dir=Path(data_dir), **settings))
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


async def wait_until(condition: Any, timeout: float = 10.0, what: str = "condition") -> None:
    """Wait for ``condition()`` to become true, failing after ``timeout`` seconds.

    For state that offers no event to await (another process, a socket's buffer): it
    re-checks on every loop turn with a short yield, and never assumes timing.
    """
    import asyncio

    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.005)


class BrokerCluster:
    """N ``logmq-server`` processes forming one metadata quorum (every node a voter).

    Free client and Raft ports, one data dir each under a temp dir. ``start()`` starts
    them all at once (a member is ready only once the quorum has formed and it has
    registered) and waits for every ready line.
    """

    def __init__(
        self,
        n: int = 3,
        *,
        base_dir: str | os.PathLike | None = None,
        extra_args: Sequence[str] = (),
        log_level: str = "info",
    ):
        if base_dir is None:
            self._tmp: tempfile.TemporaryDirectory | None = tempfile.TemporaryDirectory(
                prefix="logmq-cluster-"
            )
            base_dir = self._tmp.name
        else:
            self._tmp = None
        self.base_dir = Path(base_dir)
        raft_ports = [free_port() for _ in range(n)]
        self.voters = ",".join(f"{i + 1}@127.0.0.1:{p}" for i, p in enumerate(raft_ports))
        self.nodes: dict[int, BrokerProcess] = {
            i: BrokerProcess(
                self.base_dir / f"node-{i}",
                node_id=i,
                extra_args=["--quorum-voters", self.voters, *extra_args],
                log_level=log_level,
            )
            for i in range(1, n + 1)
        }

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.nodes.values() if b.running)

    def start(self, timeout: float = START_TIMEOUT) -> BrokerCluster:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(len(self.nodes)) as pool:
            for f in [pool.submit(b.start, timeout) for b in self.nodes.values()]:
                f.result()
        return self

    def wait_for_topic(self, name: str, partitions: int, timeout: float = 30.0) -> None:
        """Wait until every running broker's metadata has ``name`` with ``partitions``
        partitions, each with a leader.

        CreateTopics answers once the controller has committed the topic and the broker
        that answered has applied it; the other brokers apply it at their next metadata
        fetch, so a client asking one of them at once may still hear "unknown topic" (as
        in Kafka, whose own tests wait for every broker the same way)."""
        from logmq.client import Admin
        from logmq.errors import LogMQError

        deadline = time.monotonic() + timeout
        for node in self.nodes.values():
            if not node.running:
                continue
            while True:
                try:
                    with Admin(node.bootstrap) as admin:
                        parts = admin.describe_topics([name])[name].partitions
                    if len(parts) == partitions and all(p.leader >= 0 for p in parts):
                        break
                except LogMQError:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(f"broker {node.node_id} does not know topic {name}")
                time.sleep(0.05)

    def close(self) -> None:
        for b in self.nodes.values():
            b.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> BrokerCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
