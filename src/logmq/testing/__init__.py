"""Real logmq brokers for any project's tests: a Kafka-compatible broker without Docker or
a JVM (docs/testing-with-logmq.md).

``LogmqBroker`` starts one ``logmq-server`` (or a cluster of ``brokers=N``) as
subprocesses on free 127.0.0.1 ports in a temp dir, waits until each serves Kafka
clients, and stops and removes everything on exit::

    from logmq.testing import LogmqBroker

    with LogmqBroker() as kafka:
        kafka.create_topic("orders", partitions=3)
        producer = confluent_kafka.Producer({"bootstrap.servers": kafka.bootstrap_servers})

``async with LogmqBroker() as kafka:`` works too. ``LogmqBroker(security="SASL_SSL")``
adds a secured Kafka listener with its own throwaway CA and users; ``client_config()``
gives a client everything it needs to reach it. The pytest fixtures ``logmq_broker``,
``logmq_cluster``, ``logmq_secure_broker`` and ``logmq_topic`` come from
``logmq.testing.plugin``, which pytest loads by itself once logmq is installed.

This package imports only the standard library: the plugin is imported by every pytest
session of every project that has logmq installed, whether it uses a broker or not.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from logmq.testing._kafka import (
    LEADER_NOT_AVAILABLE,
    NOT_CONTROLLER,
    REQUEST_TIMED_OUT,
    TOPIC_ALREADY_EXISTS,
    ClusterInfo,
    KafkaConnection,
    KafkaError,
)

__all__ = [
    "DEFAULT_SERVER_ARGS",
    "DEFAULT_USERS",
    "BrokerNode",
    "BrokerStartError",
    "KafkaError",
    "LogmqBroker",
]

HOST = "127.0.0.1"

# What a test broker changes from logmq-server's defaults, before the caller's own
# ``server_args`` (for a flag given twice, the later one wins):
DEFAULT_SERVER_ARGS: tuple[str, ...] = (
    # like a Kafka dev broker (auto.create.topics.enable=true): a producer may just write
    "--auto-create-topics",
    # the first commit or group join creates __consumer_offsets: one partition, not
    # Kafka's 50 logs (times 3 replicas in a cluster) created and replicated for a test
    "--offsets-topic-partitions",
    "1",
    "--transaction-state-partitions",
    "1",
    # a classic group's first rebalance does not wait 3 s for more members (as
    # testcontainers sets group.initial.rebalance.delay.ms=0 for Kafka)
    "--group-initial-rebalance-delay-ms",
    "0",
    # a test broker's data is thrown away: a broker still serving a leaked client need
    # not hold up teardown for the default 10 s
    "--shutdown-grace-ms",
    "1000",
    "--log-level",
    "warning",
)

# A whole line: the listeners part comes last, and a chunk may end inside it.
_READY = re.compile(
    rb"logmq-server ready (\S+):(\d+)(?: kafka (\S+):(\d+))?(?: listeners (\S+))?[^\n]*\n"
)
SECURITY_PROTOCOLS = ("SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
DEFAULT_USERS: Mapping[str, str] = {"test": "test-secret"}
_STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
# names and passwords go unescaped into --add-scram specs and a JAAS config
_USER_NAME = re.compile(r"[A-Za-z0-9._@-]+")
_BAD_PASSWORD = re.compile(r'["\\\x00-\x1f]')
_RETRIES = 3  # starts that lost a race for a pre-picked Raft port are tried again


class BrokerStartError(RuntimeError):
    """A broker exited or was not ready in time; the message has its log's tail."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass
class BrokerNode:
    """One ``logmq-server`` process of a ``LogmqBroker``."""

    node_id: int
    data_dir: Path
    log_path: Path  # the broker's stderr
    process: subprocess.Popen | None = None
    port: int | None = None  # native protocol (logmq clients, the logmq CLI)
    kafka_port: int | None = None
    # every Kafka listener by name ("PLAINTEXT", "SASL_SSL"...): "host:port"
    listeners: dict[str, str] = field(default_factory=dict)
    _ready_buf: bytes = field(default=b"", repr=False)

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.kafka_port}"

    @property
    def native_bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class LogmqBroker:
    """One logmq broker, or a cluster of ``brokers`` brokers forming one metadata quorum,
    as ``logmq-server`` subprocesses on 127.0.0.1, for tests.

    ``server_args`` are appended to every broker's command line after
    ``DEFAULT_SERVER_ARGS`` (pass ``defaults=False`` to leave those out). The brokers live
    under ``data_dir`` (kept afterwards) or a new temp dir (removed afterwards). A start
    that fails, or a body that raises, still stops every process and removes the temp dir.

    ``security`` ("SSL", "SASL_PLAINTEXT" or "SASL_SSL") adds a second Kafka listener of
    that protocol (``secure_bootstrap_servers``); the first stays PLAINTEXT, for this
    helper's own readiness checks and ``create_topic``. TLS uses a CA and a certificate for
    127.0.0.1 and localhost made in the data dir (``ca_path``). SASL knows ``users`` (name
    to password) through ``mechanism``. ``acls=True`` turns Kafka's authorizer on with the
    first user as a super user, so every other user needs ACLs; the PLAINTEXT listener's
    anonymous clients are super users too, so that this helper keeps working.
    """

    def __init__(
        self,
        brokers: int = 1,
        *,
        server_args: Sequence[str] = (),
        data_dir: str | os.PathLike[str] | None = None,
        startup_timeout: float = 30.0,
        stop_timeout: float = 15.0,
        defaults: bool = True,
        security: str | None = None,
        users: Mapping[str, str] | None = None,
        mechanism: str = "SCRAM-SHA-512",
        acls: bool = False,
    ):
        if brokers < 1:
            raise ValueError("brokers must be at least 1")
        self.security = security.upper() if security else None
        if self.security is not None and self.security not in SECURITY_PROTOCOLS:
            raise ValueError(f"security must be one of {', '.join(SECURITY_PROTOCOLS)} or None")
        self.mechanism = mechanism.upper()
        if self.mechanism not in SASL_MECHANISMS:
            raise ValueError(f"mechanism must be one of {', '.join(SASL_MECHANISMS)}")
        self.users = dict(DEFAULT_USERS if users is None else users)
        for name, password in self.users.items():
            if not _USER_NAME.fullmatch(name):
                raise ValueError(f"user name {name!r}: letters, digits and ._@- only")
            if not password or _BAD_PASSWORD.search(password):
                raise ValueError(f"user {name!r}: a password without quotes or backslashes")
        if self.sasl and not self.users:
            raise ValueError("SASL needs at least one user")
        if acls and not self.sasl:
            raise ValueError("acls=True needs a SASL security protocol (users to grant to)")
        self.acls = acls
        self.ca_path: Path | None = None  # the CA certificate (PEM) while TLS brokers run
        self.brokers = brokers
        self.server_args = [*(DEFAULT_SERVER_ARGS if defaults else ()), *server_args]
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._given_dir = Path(data_dir) if data_dir is not None else None
        self.data_dir: Path | None = self._given_dir
        self.nodes: list[BrokerNode] = []
        self._lock = threading.Lock()

    # -- addresses ----------------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        """The Kafka listeners, ``"127.0.0.1:p1,127.0.0.1:p2,..."``, for any Kafka client."""
        self._require_started()
        return ",".join(n.bootstrap_servers for n in self.nodes)

    @property
    def native_bootstrap(self) -> str:
        """The native listeners, for logmq's own clients and the ``logmq`` CLI."""
        self._require_started()
        return ",".join(n.native_bootstrap for n in self.nodes)

    @property
    def tls(self) -> bool:
        return self.security in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.security in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def secure_bootstrap_servers(self) -> str:
        """The secured Kafka listeners (``bootstrap_servers`` for a broker without
        ``security``)."""
        self._require_started()
        if self.security is None:
            return self.bootstrap_servers
        return ",".join(n.listeners[self.security] for n in self.nodes)

    def _credentials(self, user: str | None, password: str | None) -> tuple[str, str]:
        name = user if user is not None else next(iter(self.users))
        if password is None:
            if name not in self.users:
                raise KeyError(f"no user {name!r} (users: {', '.join(self.users)})")
            password = self.users[name]
        return name, password

    def client_config(self, user: str | None = None, *, password: str | None = None) -> dict:
        """What a librdkafka client (confluent-kafka, kcat) needs for the secured
        listener, as ``user`` (default: the first one), ``bootstrap.servers`` included:
        ``Producer(broker.client_config())``. ``password`` overrides the user's (a test of
        a wrong one)."""
        conf: dict[str, str] = {"bootstrap.servers": self.secure_bootstrap_servers}
        if self.security is None:
            return conf
        conf["security.protocol"] = self.security
        if self.tls:
            conf["ssl.ca.location"] = str(self.ca_path)
        if self.sasl:
            name, secret = self._credentials(user, password)
            conf.update(
                {"sasl.mechanism": self.mechanism, "sasl.username": name, "sasl.password": secret}
            )
        return conf

    def kafka_python_config(
        self, user: str | None = None, *, password: str | None = None
    ) -> dict[str, Any]:
        """``client_config`` in kafka-python's keyword names:
        ``KafkaProducer(**broker.kafka_python_config())``."""
        conf: dict[str, Any] = {"bootstrap_servers": self.secure_bootstrap_servers}
        if self.security is None:
            return conf
        conf["security_protocol"] = self.security
        if self.tls:
            conf["ssl_cafile"] = str(self.ca_path)
        if self.sasl:
            name, secret = self._credentials(user, password)
            conf.update(
                {
                    "sasl_mechanism": self.mechanism,
                    "sasl_plain_username": name,
                    "sasl_plain_password": secret,
                }
            )
        return conf

    def aiokafka_config(
        self, user: str | None = None, *, password: str | None = None
    ) -> dict[str, Any]:
        """``kafka_python_config`` for aiokafka, which takes an ``ssl_context`` (trusting
        ``ca_path``) instead of ``ssl_cafile``: ``AIOKafkaProducer(**broker.aiokafka_config())``."""
        conf = self.kafka_python_config(user, password=password)
        cafile = conf.pop("ssl_cafile", None)
        if cafile is not None:
            import ssl

            conf["ssl_context"] = ssl.create_default_context(cafile=cafile)
        return conf

    def _require_started(self) -> None:
        if not self.nodes or any(n.kafka_port is None for n in self.nodes):
            raise RuntimeError("the broker is not started")

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> LogmqBroker:
        """Start every broker and return once each serves Kafka clients and sees them all."""
        if self.nodes:
            raise RuntimeError("already started")
        _live.add(self)
        try:
            for attempt in range(_RETRIES):
                try:
                    self._start_once()
                    return self
                except BrokerStartError:
                    lost_race = any(
                        "address already in use" in n.log_tail(10_000).lower() for n in self.nodes
                    )
                    if not lost_race or self._given_dir is not None or attempt == _RETRIES - 1:
                        raise
                    self._stop_processes()  # and again from scratch, on other ports
                    assert self.data_dir is not None
                    shutil.rmtree(self.data_dir, ignore_errors=True)
                    self.data_dir = None
        except BaseException:
            self.stop()
            raise
        return self

    def _start_once(self) -> None:
        if self._given_dir is not None:
            self._given_dir.mkdir(parents=True, exist_ok=True)
            self.data_dir = self._given_dir
        elif self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="logmq-testing-"))
        base = self.data_dir
        deadline = time.monotonic() + self.startup_timeout
        voters: list[str] = []
        if self.brokers > 1:  # each voter's Raft address must be known to all up front
            voters = ["--quorum-voters", ",".join(
                f"{i}@{HOST}:{_free_port()}" for i in range(1, self.brokers + 1)
            )]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOGMQ_")}
        security = self._security_args(base)
        self.nodes = [
            BrokerNode(i, base / f"broker-{i}", base / f"broker-{i}.log")
            for i in range(1, self.brokers + 1)
        ]
        for node in self.nodes:
            command = [
                sys.executable,
                "-m",
                "logmq_cli.server",
                "--node-id",
                str(node.node_id),
                "--data-dir",
                str(node.data_dir),
                "--host",
                HOST,
                "--port",
                "0",  # ports 0: the ready line says which, so no race for them
                "--kafka-port",
                "0",
                "--stop-on-stdin-close",
                *voters,
                *security,
                *self.server_args,
            ]
            with open(node.log_path, "ab") as log:
                node.process = subprocess.Popen(
                    command,
                    stdin=subprocess.PIPE,  # our end closing (even on kill -9) stops it
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=env,
                    start_new_session=True,  # a Ctrl-C is ours to handle, not each broker's
                )
        self._wait_ready_lines(deadline)
        self._wait_serving_kafka(deadline)

    def _wait_ready_lines(self, deadline: float) -> None:
        waiting = {n.process.stdout.fileno(): n for n in self.nodes}  # type: ignore[union-attr]
        with selectors.DefaultSelector() as sel:
            for fd, node in waiting.items():
                sel.register(fd, selectors.EVENT_READ, node)
            while waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    node = next(iter(waiting.values()))
                    raise BrokerStartError(
                        f"logmq broker {node.node_id} not ready after {self.startup_timeout} s;"
                        f" its log ({node.log_path}):\n{node.log_tail()}"
                    )
                for key, _ in sel.select(left):
                    node = key.data
                    chunk = os.read(key.fd, 4096)
                    if not chunk:  # stdout closed: it exited
                        code = node.process.wait()
                        raise BrokerStartError(
                            f"logmq broker {node.node_id} exited with {code} during start;"
                            f" its log:\n{node.log_tail()}"
                        )
                    node._ready_buf += chunk
                    match = _READY.search(node._ready_buf)
                    if match is not None and match.group(4) is not None:
                        node.port, node.kafka_port = int(match.group(2)), int(match.group(4))
                        node.listeners = _parse_listeners(match.group(5))
                        if self.security is not None and self.security not in node.listeners:
                            raise BrokerStartError(
                                f"logmq broker {node.node_id} named no {self.security} listener"
                                f" in its ready line: {match.group(0).decode(errors='replace')}"
                            )
                        sel.unregister(key.fd)
                        del waiting[key.fd]
                    elif match is not None:
                        raise BrokerStartError(
                            f"logmq broker {node.node_id} serves no Kafka listener (--no-kafka?)"
                        )

    def _security_args(self, base: Path) -> list[str]:
        """The ``logmq-server`` arguments of ``security``: a PLAINTEXT listener first (this
        helper's), the secured one, certificates made under ``base``, users, authorizer."""
        self.ca_path = None
        if self.security is None:
            return []
        # the native listener stays PLAINTEXT, said explicitly (a secured Kafka listener
        # would otherwise lend it its protocol), for native_bootstrap's clients
        props = {
            "listeners": f"PLAINTEXT://{HOST}:0,{self.security}://{HOST}:0",
            "listener.security.protocol.map": "NATIVE:PLAINTEXT",
        }
        if self.tls:
            from logmq.testing.certs import make_ca, make_cert  # needs cryptography

            tls_dir = base / "tls"
            ca = make_ca(tls_dir)
            cert = make_cert(ca, tls_dir, HOST, sans=(HOST, "localhost"))
            self.ca_path = ca.cert_path
            props.update(
                {
                    "ssl.keystore.type": "PEM",
                    "ssl.keystore.location": str(cert.keystore_path),
                    "ssl.truststore.type": "PEM",
                    "ssl.truststore.location": str(ca.cert_path),
                }
            )
        args: list[str] = []
        if self.sasl:
            props["sasl.enabled.mechanisms"] = self.mechanism
            if self.mechanism == "PLAIN":
                entries = " ".join(f'user_{n}="{p}"' for n, p in self.users.items())
                props[f"listener.name.{self.security.lower()}.plain.sasl.jaas.config"] = (
                    f"org.apache.kafka.common.security.plain.PlainLoginModule required {entries};"
                )
            else:
                for name, password in self.users.items():
                    spec = f'{self.mechanism}=[name="{name}",password="{password}"]'
                    args += ["--add-scram", spec]
        if self.acls:
            props["authorizer.class.name"] = _STANDARD_AUTHORIZER
            # the first user; and anonymous clients, who reach only the PLAINTEXT
            # listener (the secured one authenticates everyone): create_topic's
            props["super.users"] = f"User:{next(iter(self.users))};User:ANONYMOUS"
        for key, value in props.items():
            args += ["--override", f"{key}={value}"]
        return args

    def _wait_serving_kafka(self, deadline: float) -> None:
        """A Kafka Metadata round trip with each broker, until it lists every broker.

        The ready line means registered with the controller; the others' registrations
        reach each broker's metadata a little later."""
        want = {n.node_id for n in self.nodes}
        for node in self.nodes:
            self._poll(
                lambda node=node: self._metadata(node),
                lambda info: {b[0] for b in info.brokers} >= want,
                deadline,
                f"broker {node.node_id} listing brokers {sorted(want)} in Kafka Metadata",
            )

    def stop(self) -> None:
        """Stop every broker (SIGTERM, SIGKILL after ``stop_timeout``), remove a temp dir."""
        with self._lock:
            self._stop_processes()
            if self._given_dir is None and self.data_dir is not None:
                shutil.rmtree(self.data_dir, ignore_errors=True)
                self.data_dir = None
                self.ca_path = None  # removed with it
            _live.discard(self)

    def _stop_processes(self) -> None:
        procs = [n.process for n in self.nodes if n.process is not None]
        for proc in procs:  # all at once: a cluster's brokers stop side by side
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for proc in procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
        self.nodes = []

    def __enter__(self) -> LogmqBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> LogmqBroker:
        import asyncio  # here: importing this package stays cheap for the pytest plugin

        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        import asyncio

        await asyncio.to_thread(self.stop)

    def __repr__(self) -> str:
        where = self.bootstrap_servers if self.nodes and self.nodes[0].kafka_port else "stopped"
        secured = f", security={self.security!r}" if self.security else ""
        return f"LogmqBroker(brokers={self.brokers}{secured}, {where})"

    # -- helpers ------------------------------------------------------------------------
    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = 1,
        config: Mapping[str, str] | None = None,
        *,
        timeout: float = 30.0,
        **configs: Any,
    ) -> str:
        """Create a topic and return its name once every broker knows a leader for each of
        its partitions (clients then never see it missing or leaderless).

        Topic configs by their Kafka names in ``config``, or as keywords with ``_`` for
        ``.`` (Kafka's topic config names have no ``_``):
        ``create_topic("t", cleanup_policy="compact", retention_ms=60_000)``.
        """
        self._require_started()
        settings = {k: _config_value(v) for k, v in (config or {}).items()}
        settings.update({k.replace("_", "."): _config_value(v) for k, v in configs.items()})
        deadline = time.monotonic() + timeout

        timed_out = False

        def attempt() -> bool:
            nonlocal timed_out
            for node in self.nodes:  # CreateTopics goes to the controller
                with self._connect(node, deadline) as conn:
                    try:
                        conn.create_topic(
                            name, partitions, replication_factor, settings, int(timeout * 1000)
                        )
                        return True
                    except KafkaError as e:
                        if e.code == TOPIC_ALREADY_EXISTS and timed_out:
                            return True  # our own create, which had timed out, went through
                        if e.code not in (NOT_CONTROLLER, REQUEST_TIMED_OUT):
                            raise
                        timed_out = timed_out or e.code == REQUEST_TIMED_OUT
            return False

        self._poll(attempt, bool, deadline, f"creating topic {name!r}")
        for node in self.nodes:
            self._poll(
                lambda node=node: self._metadata(node, [name]),
                lambda info: _has_leaders(info, name, partitions),
                deadline,
                f"leaders of {name!r} known to broker {node.node_id}",
            )
        return name

    async def acreate_topic(self, name: str, *args: Any, **kwargs: Any) -> str:
        """``create_topic`` off the event loop, for async tests."""
        import asyncio

        return await asyncio.to_thread(self.create_topic, name, *args, **kwargs)

    def _connect(self, node: BrokerNode, deadline: float) -> KafkaConnection:
        return KafkaConnection(HOST, node.kafka_port or 0, max(deadline - time.monotonic(), 0.1))

    def _metadata(self, node: BrokerNode, topics: list[str] | None = None) -> ClusterInfo:
        if not node.running:
            raise BrokerStartError(
                f"logmq broker {node.node_id} exited; its log:\n{node.log_tail()}"
            )
        with self._connect(node, time.monotonic() + 5) as conn:
            return conn.metadata(topics)

    @staticmethod
    def _poll(fetch: Any, done: Any, deadline: float, what: str) -> Any:
        """``fetch()`` until ``done(result)``: for state that has no event to wait on
        (another process's metadata), checked every few ms up to the deadline."""
        pause = 0.002
        while True:
            try:
                result = fetch()
                if done(result):
                    return result
                error: BaseException | None = None
            except (OSError, ConnectionError) as e:
                error = e
            if time.monotonic() >= deadline:
                raise TimeoutError(f"timed out waiting for {what}") from error
            time.sleep(pause)
            pause = min(pause * 2, 0.05)


def _parse_listeners(raw: bytes | None) -> dict[str, str]:
    """The ready line's ``NAME=host:port,...`` (empty from a server too old to print it)."""
    if not raw:
        return {}
    pairs = (item.partition("=") for item in raw.decode().split(","))
    return {name: address for name, _, address in pairs if name and address}


def _config_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _has_leaders(info: ClusterInfo, name: str, partitions: int) -> bool:
    for topic in info.topics:
        if topic.name == name and topic.error_code == 0:
            leaders = [p for p in topic.partitions if p.leader >= 0 and p.error_code == 0]
            return len(leaders) >= partitions
        if topic.name == name and topic.error_code not in (0, 3, LEADER_NOT_AVAILABLE):
            raise KafkaError(topic.error_code, f"Metadata for {name!r}")
    return False


# Brokers still running when the interpreter exits (a test that never stopped its
# broker, an interrupted session) are stopped then, not left behind.
_live: weakref.WeakSet[LogmqBroker] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    for broker in list(_live):
        broker.stop()
