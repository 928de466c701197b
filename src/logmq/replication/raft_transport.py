"""Raft messages between quorum members over TCP: small frames, best effort, bounded.

Each member listens on its quorum address and dials every peer it sends to, so a pair of
members uses two connections, each carrying one direction: no races deciding which of two
simultaneous dials survives. A frame is ``[u32 length][payload]``, the client protocol's
framing, read with its ``read_frame`` (net/frame_reader.py: same size check, same
FrameTooLargeError). The dialer's first frame is a hello (msgpack map: magic, version,
node id, cluster id, voter ids, listen address) and the listener answers with its own
hello or ``{"error": ...}`` (a hello frame is at most 64 KiB, and a hello a map of a few
keys: what one may hold is bounded by that); members that disagree on the cluster id or
on the voter set refuse each other with a clear message instead of forming a quorum. The
listen address tells the listener where to reach a dialer it has no address for (an
observer: ``on_peer_hello``). The Raft messages after the hello are decoded by their
layout, each count bounded before anything is built (raft_codec.py).

Sending never blocks the Raft loop: each peer has a bounded queue drained by its own
task, which reconnects with exponential backoff. When the queue is full the oldest message
is dropped: Raft retransmits what matters (heartbeats every tick, probes after a loss).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import msgpack

from logmq.errors import InvalidFrameError
from logmq.net.codec import SIZE
from logmq.net.frame_reader import read_frame
from logmq.replication.raft_service import RaftTransport

STOP_WAIT_S = 1.0  # how long stop() waits for the server's connections to close
log = logging.getLogger("logmq.raft.transport")

MAGIC = "logmq-raft"
VERSION = 1
HANDSHAKE_TIMEOUT = 5.0
HELLO_MAX_BYTES = 1 << 16  # a hello: six keys and the voter ids
HELLO_MAX_KEYS = 16


class FrameError(Exception):
    """The peer's hello refused us or is not ours (bad framing is InvalidFrameError)."""


def frame(payload: bytes) -> bytes:
    return SIZE.pack(len(payload)) + payload


def unpack_hello(data: bytes) -> Any:
    """A hello frame's map (the Raft messages after it: raft_codec.decode_message)."""
    return msgpack.unpackb(data, raw=False, max_map_len=HELLO_MAX_KEYS)


class _Peer:
    """The outbound side towards one member: a bounded queue and the task that drains it."""

    def __init__(self, transport: TcpTransport, node_id: int, host: str, port: int) -> None:
        self.transport = transport
        self.node_id = node_id
        self.address = (host, port)
        self.queue: deque[bytes] = deque(maxlen=transport.max_queue)
        self.wakeup = asyncio.Event()
        self.connected = False
        self.dropped = 0
        self.task: asyncio.Task[None] | None = None

    def put(self, data: bytes) -> None:
        if len(self.queue) == self.queue.maxlen:
            self.dropped += 1  # deque drops the oldest on append
        self.queue.append(data)
        self.wakeup.set()

    async def run(self) -> None:
        t = self.transport
        delay = t.backoff_initial
        while True:
            writer: asyncio.StreamWriter | None = None
            eof: asyncio.Task[bytes] | None = None
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
                # cancellation that meets a completing handshake, and this loop would
                # then outlive stop(), which waits for it
                async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                    tls = t.client_ssl
                    reader, writer = await asyncio.open_connection(
                        *self.address,
                        ssl=tls,
                        server_hostname=self.address[0] if tls is not None else None,
                    )
                _tune(writer)
                writer.write(frame(t.hello()))
                async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                    reply = await read_frame(reader, HELLO_MAX_BYTES)
                problem = t.check_hello(reply, expect=self.node_id)
                if problem:
                    t.report(self.node_id, problem)
                    raise FrameError(problem)
                self.connected, delay = True, t.backoff_initial
                eof = asyncio.create_task(reader.read(1))  # the listener never sends more
                await self._pump(writer, eof)
            except (
                OSError,
                EOFError,
                TimeoutError,
                FrameError,
                InvalidFrameError,
                asyncio.IncompleteReadError,
            ) as e:
                log.debug("raft transport %d -> %d: %s", t.node_id, self.node_id, e)
            except RuntimeError as e:
                # uvloop refuses writes on a transport a reset already closed
                log.debug("raft transport %d -> %d: %s", t.node_id, self.node_id, e)
            except Exception:
                # whatever it was, this task must go on: without it the peer never hears
                # from us again (a leader would never reach a restarted follower)
                log.exception("raft transport %d -> %d failed", t.node_id, self.node_id)
            finally:
                self.connected = False
                if eof is not None:
                    eof.cancel()
                if writer is not None:
                    writer.close()
                    with contextlib.suppress(Exception):
                        await writer.wait_closed()
            await asyncio.sleep(delay)  # reconnect backoff, not synchronisation
            delay = min(delay * 2, t.backoff_max)

    async def _pump(self, writer: asyncio.StreamWriter, eof: asyncio.Task[bytes]) -> None:
        while True:
            while not self.queue:
                self.wakeup.clear()
                waiter = asyncio.create_task(self.wakeup.wait())
                try:
                    await asyncio.wait({waiter, eof}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                if eof.done():
                    raise EOFError("peer closed the connection")
            batch = [frame(self.queue.popleft()) for _ in range(len(self.queue))]
            writer.writelines(batch)
            await writer.drain()


class TcpTransport(RaftTransport):
    def __init__(
        self,
        node_id: int,
        listen: tuple[str, int],
        peers: dict[int, tuple[str, int]],
        *,
        cluster_id: str | None = None,
        voters: Iterable[int] = (),
        max_queue: int = 1024,
        max_frame_bytes: int = 64 << 20,
        backoff_initial: float = 0.05,
        backoff_max: float = 1.0,
        on_config_error: Callable[[int, str], None] | None = None,
        on_peer_hello: Callable[[int, tuple[str, int]], None] | None = None,
        server_ssl: ssl.SSLContext | None = None,
        client_ssl: ssl.SSLContext | None = None,
        admit_peer: Callable[[Any], str | None] | None = None,
    ) -> None:
        self.node_id = node_id
        # mutual TLS between quorum members (controller.listener.names mapped to SSL):
        # only holders of a certificate the truststore signs can speak Raft, and
        # ``admit_peer`` (given the ssl object) may refuse a principal that is no broker
        self.server_ssl = server_ssl
        self.client_ssl = client_ssl
        self.admit_peer = admit_peer
        self.listen = listen
        self.cluster_id = cluster_id
        self.voters = sorted(set(voters))
        self.max_queue = max_queue
        self.max_frame_bytes = max_frame_bytes
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.on_config_error = on_config_error
        # a member that dialled us, with the address it listens on (how a quorum leader
        # learns where an observer, absent from --quorum-voters, can be reached)
        self.on_peer_hello = on_peer_hello
        self.config_errors: dict[int, str] = {}
        self._addresses = {n: a for n, a in peers.items() if n != node_id}
        self._peers: dict[int, _Peer] = {}
        self._on_message: Callable[[bytes], None] | None = None
        self._server: asyncio.Server | None = None
        self._inbound: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self.port: int | None = None

    # -- RaftTransport -----------------------------------------------------------------------

    async def start(self, on_message: Callable[[bytes], None]) -> None:
        self._on_message = on_message
        self._server = await asyncio.start_server(
            self._accept,
            *self.listen,
            ssl=self.server_ssl,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT if self.server_ssl is not None else None,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        for node_id, (host, port) in self._addresses.items():
            self._start_peer(node_id, host, port)

    def send(self, to_node: int, data: bytes) -> None:
        peer = self._peers.get(to_node)
        if peer is None:
            log.debug("raft transport %d: no address for node %d", self.node_id, to_node)
            return
        peer.put(data)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        outbound = [p.task for p in self._peers.values() if p.task]
        for task in outbound:
            task.cancel()
        # Inbound handlers belong to the server's streams: end them by closing their
        # connections (cancelling them would be reported as an error by asyncio).
        inbound = list(self._inbound.items())
        for _, writer in inbound:
            writer.close()
        for task in outbound + [t for t, _ in inbound]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            # A connection the server accepted whose handler has not started yet is in
            # no list above and stays open until its peer hangs up; a peer that waits
            # for our hello never does. Do not let it hold the stop (the sockets close
            # with the process, or when the loop closes).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STOP_WAIT_S):
                    await self._server.wait_closed()
            self._server = None
        self._peers.clear()

    # -- membership ----------------------------------------------------------------------------

    def add_peer(self, node_id: int, host: str, port: int) -> None:
        """Learn (or change) a member's address, e.g. an observer that just registered."""
        if node_id == self.node_id or self._addresses.get(node_id) == (host, port):
            return
        self._addresses[node_id] = (host, port)
        old = self._peers.pop(node_id, None)
        if old is not None and old.task is not None:
            old.task.cancel()
        if self._server is not None:
            self._start_peer(node_id, host, port)

    def peer_stats(self) -> dict[int, dict[str, Any]]:
        return {
            n: {"connected": p.connected, "queued": len(p.queue), "dropped": p.dropped}
            for n, p in self._peers.items()
        }

    def _start_peer(self, node_id: int, host: str, port: int) -> None:
        peer = _Peer(self, node_id, host, port)
        peer.task = asyncio.create_task(peer.run(), name=f"raft-{self.node_id}-to-{node_id}")
        self._peers[node_id] = peer

    # -- handshake -----------------------------------------------------------------------------

    def hello(self) -> bytes:
        return msgpack.packb(
            {
                "magic": MAGIC,
                "version": VERSION,
                "node_id": self.node_id,
                "cluster_id": self.cluster_id,
                "voters": self.voters,
                "listen": [self.listen[0], self.port] if self.port else None,
            }
        )

    def check_hello(self, data: bytes, *, expect: int | None = None) -> str | None:
        """Why this peer must not join our quorum traffic, or None."""
        try:
            hello = unpack_hello(data)
            return self._check_hello(hello, expect)
        except (ValueError, TypeError, msgpack.UnpackException):  # e.g. voters [1, "x"]
            return "the peer does not speak the logmq quorum protocol"

    def _check_hello(self, hello: Any, expect: int | None) -> str | None:
        if not isinstance(hello, dict) or hello.get("magic") != MAGIC:
            return "the peer does not speak the logmq quorum protocol"
        if "error" in hello:
            return f"the peer refused us: {hello['error']}"
        if hello.get("version") != VERSION:
            return f"quorum protocol version {hello.get('version')!r}, we speak {VERSION}"
        node_id, cluster_id, voters = (
            hello.get("node_id"),
            hello.get("cluster_id"),
            hello.get("voters"),
        )
        if type(node_id) is not int or (expect is not None and node_id != expect):
            return f"expected node {expect} at this address, found node {node_id!r}"
        if cluster_id and self.cluster_id and cluster_id != self.cluster_id:
            return (
                f"node {node_id} belongs to cluster {cluster_id}, this node to cluster "
                f"{self.cluster_id}: check the data directories and --quorum-voters"
            )
        if voters and self.voters and sorted(voters) != self.voters:
            return (
                f"node {node_id} has quorum voters {sorted(voters)}, this node has "
                f"{self.voters}: every member must be started with the same --quorum-voters"
            )
        return None

    def _announce(self, data: bytes) -> None:
        if self.on_peer_hello is None:
            return
        hello = unpack_hello(data)
        listen = hello.get("listen")
        node_id = hello.get("node_id")
        if (
            isinstance(listen, list)
            and len(listen) == 2
            and isinstance(listen[0], str)
            and type(listen[1]) is int
            and 0 < listen[1] < 65536
            and type(node_id) is int
        ):
            self.on_peer_hello(node_id, (listen[0], listen[1]))

    def report(self, node_id: int, problem: str) -> None:
        if self.config_errors.get(node_id) != problem:
            log.error("raft transport %d: refusing node %s: %s", self.node_id, node_id, problem)
        self.config_errors[node_id] = problem
        if self.on_config_error is not None:
            self.on_config_error(node_id, problem)

    # -- inbound -------------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._inbound[task] = writer
        peer: Any = "?"
        try:
            _tune(writer)
            if self.admit_peer is not None:
                refused = self.admit_peer(writer.get_extra_info("ssl_object"))
                if refused:
                    log.warning("raft transport %d: refused a peer: %s", self.node_id, refused)
                    return
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                data = await read_frame(reader, HELLO_MAX_BYTES)
            problem = self.check_hello(data)
            with contextlib.suppress(Exception):
                peer = unpack_hello(data).get("node_id", "?")
            if problem:
                self.report(peer if isinstance(peer, int) else -1, problem)
                writer.write(frame(msgpack.packb({"magic": MAGIC, "error": problem})))
                await writer.drain()
                return
            writer.write(frame(self.hello()))
            await writer.drain()
            self._announce(data)
            while True:
                payload = await read_frame(reader, self.max_frame_bytes)
                if self._on_message is not None:
                    try:
                        self._on_message(payload)
                    except Exception:
                        log.exception("raft transport %d: message handler failed", self.node_id)
        except (
            OSError,
            TimeoutError,
            InvalidFrameError,
            asyncio.IncompleteReadError,
            RuntimeError,
        ) as e:
            # (RuntimeError: uvloop refuses a write on a transport a reset closed)
            log.debug("raft transport %d <- %s: %s", self.node_id, peer, e)
        finally:
            self._inbound.pop(task, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def _tune(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
