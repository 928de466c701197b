"""Real broker processes to attack: SIGKILL, SIGSTOP/SIGCONT, and a ``Cluster`` of them.

Built on tests/harness.py's BrokerProcess. A ``Cluster`` is N ``logmq-server``
processes on 127.0.0.1 with free ports and one data dir each; with ``proxied=True``
every ordered pair of nodes talks through its own FaultProxy, so a test can cut the
link between two nodes, or isolate one, without touching the others.

``cluster_args`` is the ONE place that knows the server's command line for a cluster
member; adapt it when the replication work settles its options.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.faults.proxy import BLACKHOLE, BOTH, DOWNSTREAM, HOST, UPSTREAM, FaultProxy, ProxyLoop
from tests.harness import START_TIMEOUT, BrokerProcess, free_port

Address = tuple[str, int]
SIGNAL_TIMEOUT = 10.0


def cluster_args(
    node_id: int,
    port: int,
    voters: Mapping[int, Address],
    data_dir: Path,
    extra: Sequence[str] = (),
    *,
    peers: Mapping[int, Address] | None = None,
) -> list[str]:
    """The ``logmq-server`` arguments of one cluster member: the one place to adapt.

    ``voters`` maps each quorum voter's node id to the quorum address *as this node
    dials it*: its own entry is where it listens, the others may be proxies (see
    ``Cluster``), so two members may get different addresses for the same voter. The
    voter *ids* are always the same set. The intended CLI (issue 5):
    ``logmq-server --node-id N --port P --quorum-voters 1@127.0.0.1:9901,...``.

    ``peers`` maps node ids to the broker (client port) address this node dials them at
    for replica fetching and controller requests, through the link proxies; rendered as
    ``--peer-addresses`` (its own entry left out), so ``Cluster.cut`` partitions
    replication traffic too.
    """
    quorum = ",".join(f"{n}@{host}:{p}" for n, (host, p) in sorted(voters.items()))
    others = sorted((n, a) for n, a in (peers or {}).items() if n != node_id)
    dial = ["--peer-addresses", ",".join(f"{n}@{h}:{p}" for n, (h, p) in others)]
    return standalone_args(
        node_id,
        port,
        voters,
        data_dir,
        ["--quorum-voters", quorum, *(dial if others else []), *extra],
    )


def standalone_args(
    node_id: int,
    port: int,
    voters: Mapping[int, Address],
    data_dir: Path,
    extra: Sequence[str] = (),
    *,
    peers: Mapping[int, Address] | None = None,
) -> list[str]:
    """Arguments for independent single-node brokers (no quorum): what works today.

    With it a ``Cluster`` is N unrelated brokers: useful to drive one broker through
    the same nemesis interface, and to test this harness itself.
    """
    return [
        "--node-id",
        str(node_id),
        "--host",
        HOST,
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        *extra,
    ]


ArgsBuilder = Callable[..., list[str]]  # the signature of cluster_args


# -- signals -------------------------------------------------------------------------
def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (R, S, T: stopped, Z ...), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat[stat.rindex(b")") + 2 :].split(b" ", 1)[0].decode()


def wait_for(condition: Callable[[], Any], what: str, timeout: float = SIGNAL_TIMEOUT) -> Any:
    """Poll ``condition`` until it returns something truthy (a short yield between
    checks), and return that; or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while not (got := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)
    return got


def kill(pid: int) -> None:
    """SIGKILL, and wait until the process is gone (or a zombie awaiting its parent)."""
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: process_state(pid) in ("Z", "X", None), f"pid {pid} to die")


def pause(pid: int) -> None:
    """SIGSTOP: the process keeps its sockets but runs nothing (a long GC pause, a VM
    freeze); returns once the kernel reports it stopped."""
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: process_state(pid) in ("T", None), f"pid {pid} to stop")


def resume(pid: int) -> None:
    """SIGCONT, and wait until the kernel no longer reports the process stopped."""
    os.kill(pid, signal.SIGCONT)
    wait_for(lambda: process_state(pid) != "T", f"pid {pid} to continue")


class ClusterNode(BrokerProcess):
    """A BrokerProcess whose command line comes from an args builder, on fixed ports."""

    def __init__(
        self,
        node_id: int,
        data_dir: Path,
        *,
        port: int,
        quorum_port: int,
        args_builder: ArgsBuilder,
        voters: Mapping[int, Address],
        peers: Mapping[int, Address] | None = None,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(data_dir, port=port, node_id=node_id, extra_args=extra_args, env=env)
        self.quorum_port = quorum_port
        self.args_builder = args_builder
        self.voters = dict(voters)
        self.peers = dict(peers) if peers is not None else None
        self.paused = False

    def command(self) -> list[str]:
        args = self.args_builder(
            self.node_id, self.port, self.voters, self.data_dir, self.extra_args, peers=self.peers
        )
        # the Kafka listener where ``kafka_bootstrap`` says (a restart keeps the port)
        return [
            sys.executable,
            "-m",
            "logmq_cli.server",
            *args,
            "--kafka-port",
            str(self.kafka_port),
        ]

    def pause(self) -> None:
        if self.pid is None:
            raise RuntimeError(f"node {self.node_id} is not running")
        pause(self.pid)
        self.paused = True

    def resume(self) -> None:
        if self.pid is not None and self.paused:
            resume(self.pid)
        self.paused = False

    def kill(self) -> int | None:
        """SIGKILL (works on a stopped process too)."""
        code = super().kill()
        self.paused = False
        return code

    def stop(self, timeout: float = 30.0) -> int | None:
        self.resume()  # a stopped process would only see SIGTERM after SIGCONT
        return super().stop(timeout)


class Cluster:
    """N broker processes on 127.0.0.1, optionally with a proxy on every link.

    Node ids are 1..N. Each node gets a broker port and a quorum port. With
    ``proxied=True`` node i reaches node j's quorum address through the proxy
    ``links[(i, j)]`` (the address in i's ``--quorum-voters``), so ``cut(i, j)`` breaks
    exactly that pair. Broker-to-broker *data* traffic (replica fetches, requests to the
    controller) goes through ``data_links[(i, j)]`` the same way (``--peer-addresses``),
    so a cut or an isolation stops replication too; clients still reach every node.

    ``voters`` (default: every node) are the metadata quorum; a node outside it runs as
    an observer: it follows the metadata log, never votes, and listens for Raft on a
    port of its own choosing (its ``quorum_port`` is then unused).
    """

    def __init__(
        self,
        size: int = 3,
        base_dir: str | os.PathLike | None = None,
        *,
        args_builder: ArgsBuilder = cluster_args,
        extra_args: Sequence[str] = (),
        proxied: bool = True,
        env: dict[str, str] | None = None,
        voters: Sequence[int] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one node")
        self._tmp = None
        if base_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="logmq-cluster-")
            base_dir = self._tmp.name
        self.base_dir = Path(base_dir)
        self.ids = list(range(1, size + 1))
        # the metadata quorum's voters (default: every node); the others are observers
        self.voter_ids = sorted(voters) if voters is not None else list(self.ids)
        if not self.voter_ids or not set(self.voter_ids) <= set(self.ids):
            raise ValueError(f"voters {voters} must be a non-empty subset of {self.ids}")
        self.proxy_loop: ProxyLoop | None = ProxyLoop("cluster-proxies") if proxied else None
        self.links: dict[tuple[int, int], FaultProxy] = {}
        self.data_links: dict[tuple[int, int], FaultProxy] = {}
        ports = {n: (free_port(), free_port()) for n in self.ids}
        try:
            if self.proxy_loop is not None:
                for i in self.ids:
                    for j in self.ids:
                        if i != j:
                            self.links[(i, j)] = self._proxy(ports[j][1], f"quorum {i}->{j}")
                            self.data_links[(i, j)] = self._proxy(ports[j][0], f"data {i}->{j}")
        except BaseException:
            self._close_proxies()
            raise
        self.nodes: dict[int, ClusterNode] = {}
        for n in self.ids:
            voters = {j: self._dial(n, j, ports[j][1], self.links) for j in self.voter_ids}
            peers = {j: self._dial(n, j, ports[j][0], self.data_links) for j in self.ids}
            self.nodes[n] = ClusterNode(
                n,
                self.base_dir / f"node-{n}" / "data",
                port=ports[n][0],
                quorum_port=ports[n][1],
                args_builder=args_builder,
                voters=voters,
                peers=peers,
                extra_args=extra_args,
                env=env,
            )

    def _proxy(self, target_port: int, name: str) -> FaultProxy:
        return FaultProxy(target_port, loop=self.proxy_loop, name=name).start()

    @staticmethod
    def _dial(
        src: int, dst: int, port: int, links: Mapping[tuple[int, int], FaultProxy]
    ) -> Address:
        link = links.get((src, dst))
        return (HOST, link.port if link is not None else port)

    # -- addresses ------------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        """Every node's broker address (clients try them in turn)."""
        return ",".join(self.nodes[n].bootstrap for n in self.ids)

    def node(self, node_id: int) -> ClusterNode:
        return self.nodes[node_id]

    def running(self) -> list[int]:
        return [n for n in self.ids if self.nodes[n].running]

    # -- lifecycle ------------------------------------------------------------------
    def start(self, timeout: float = START_TIMEOUT) -> Cluster:
        """Start every node at once (a quorum may need its peers before it is ready)."""
        with concurrent.futures.ThreadPoolExecutor(len(self.ids)) as pool:
            futures = [pool.submit(self.nodes[n].start, timeout) for n in self.ids]
            errors = [f.exception() for f in futures]
        failed = [e for e in errors if e is not None]
        if failed:
            self.stop()
            raise failed[0]
        return self

    def stop(self) -> None:
        """SIGTERM every node (SIGCONT first for stopped ones), in parallel."""
        with concurrent.futures.ThreadPoolExecutor(len(self.ids)) as pool:
            list(pool.map(lambda n: self.nodes[n].stop(), self.ids))

    def close(self) -> None:
        """Heal, stop every node, close the proxies, remove a temp dir we made."""
        try:
            self.heal()
            self.stop()
        finally:
            self._close_proxies()
            if self._tmp is not None:
                self._tmp.cleanup()

    def _close_proxies(self) -> None:
        for p in (*self.links.values(), *self.data_links.values()):
            with contextlib.suppress(Exception):
                p.close()
        if self.proxy_loop is not None:
            self.proxy_loop.close()
            self.proxy_loop = None

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- process faults -------------------------------------------------------------
    def kill(self, node_id: int) -> None:
        """SIGKILL: no flush, no clean-shutdown marker; the page cache survives."""
        self.nodes[node_id].kill()

    def restart(self, node_id: int, timeout: float = START_TIMEOUT) -> None:
        """Start a node again on the same ports and data dir (after kill or stop)."""
        node = self.nodes[node_id]
        if node.running:
            node.stop()
        node.start(timeout)

    def pause(self, node_id: int) -> None:
        self.nodes[node_id].pause()

    def resume(self, node_id: int) -> None:
        self.nodes[node_id].resume()

    # -- network faults -------------------------------------------------------------
    def _links_between(self, a: int, b: int) -> list[tuple[FaultProxy, str]]:
        """Every proxy carrying traffic between a and b, with the direction a -> b."""
        out = []
        for links in (self.links, self.data_links):
            if (a, b) in links:
                out.append((links[(a, b)], UPSTREAM))
            if (b, a) in links:
                out.append((links[(b, a)], DOWNSTREAM))
        if not out:
            raise RuntimeError("this cluster has no proxies (proxied=False)")
        return out

    def cut(self, a: int, b: int, mode: str = BLACKHOLE) -> None:
        """Partition a from b, both ways (every link proxy between the two)."""
        for proxy, _ in self._links_between(a, b):
            proxy.cut(mode, BOTH)

    def cut_one_way(self, src: int, dst: int) -> None:
        """Bytes from src no longer reach dst; dst's still reach src (a blackhole)."""
        for proxy, direction in self._links_between(src, dst):
            proxy.cut(BLACKHOLE, direction)

    def isolate(self, node_id: int, mode: str = BLACKHOLE) -> None:
        """Cut ``node_id`` off from every other node (clients still reach it)."""
        for other in self.ids:
            if other != node_id:
                self.cut(node_id, other, mode)

    def heal(self, *nodes: int) -> None:
        """Heal the links touching ``nodes`` (all links if none given); resume them too."""
        touched = set(nodes) or set(self.ids)
        for links in (self.links, self.data_links):
            for (i, j), proxy in links.items():
                if i in touched or j in touched:
                    proxy.heal()
        for n in touched:
            self.nodes[n].resume()

    # -- cluster state --------------------------------------------------------------
    def leader_of(self, topic: str, partition: int, timeout_ms: int = 3000) -> int | None:
        """The node the running brokers name as the partition's leader, if any answers."""
        from logmq import Admin
        from logmq.errors import LogMQError

        live = [self.nodes[n].bootstrap for n in self.running() if not self.nodes[n].paused]
        if not live:
            return None
        try:
            with Admin(",".join(live), request_timeout_ms=timeout_ms) as admin:
                desc = admin.describe_topics([topic])[topic]
        except (LogMQError, OSError, TimeoutError):
            return None
        for p in desc.partitions:
            if p.partition == partition and p.leader in self.nodes:
                return p.leader
        return None

    def __repr__(self) -> str:
        return f"Cluster({self.bootstrap}, running={self.running()})"
