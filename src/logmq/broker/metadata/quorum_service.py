"""This broker's seat in the metadata quorum: Raft, the metadata image and the controller.

Every broker runs one ``MetadataQuorum``. It drives a RaftService over the metadata log,
applies committed batches to a MetadataLoader (the image every request handler reads),
and, while this node is the *ready* quorum leader, owns the active Controller: requests
go through ``submit`` (run the controller, propose its records as one entry, answer once
committed). A broker started without ``--quorum-voters`` is a quorum of one through the
same path; its transport has nobody to talk to.

The broker side of the controller protocol also lives here: register once the quorum has
a leader, then heartbeat, locally when this node is the controller and over the client
port otherwise (BrokerRegistration/BrokerHeartbeat, answered by cluster_api.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from logmq.client.connection import BrokerConnection
from logmq.cluster.controller import Controller
from logmq.cluster.controller_api import ControllerConfig, ControllerResult
from logmq.cluster.meta_properties import ClusterIdentityError, check_meta_properties, read_identity
from logmq.cluster.metadata_image import MetadataImage
from logmq.cluster.metadata_loader import MetadataLoader
from logmq.cluster.metadata_records import Record, encode_records
from logmq.errors import ErrorCode, LogMQError
from logmq.net.codec import ApiKey
from logmq.replication.raft_service import (
    Leadership,
    NotLeaderError,
    RaftConfig,
    RaftService,
    RaftTransport,
    quorum_directory,
)
from logmq.replication.raft_transport import TcpTransport
from logmq.security.scram import ScramCredential

log = logging.getLogger("logmq.quorum")

T = TypeVar("T")
Address = tuple[str, int]


class NullTransport(RaftTransport):
    """A quorum of one has no peers: nothing to send, nothing arrives."""

    async def start(self, on_message: Callable[[bytes], None]) -> None:
        return None

    def send(self, to_node: int, data: bytes) -> None:
        return None

    async def stop(self) -> None:
        return None


class MetadataQuorum:
    def __init__(
        self,
        node_id: int,
        data_dir: Path,
        voters: dict[int, Address] | None,
        advertised: Callable[[], Address | None],
        *,
        kafka_advertised: Callable[[], Address | None] = lambda: None,
        kafka_listeners: Callable[[], str | None] = lambda: None,
        controller_config: ControllerConfig | None = None,
        heartbeat_ms: int = 1_000,
        raft_config: RaftConfig | None = None,
        observer_host: str = "127.0.0.1",
        peer_addresses: dict[int, Address] | None = None,
        bootstrap_scram: Sequence[tuple[str, ScramCredential]] = (),
        client_security: Any = None,
        raft_tls: Any = None,
    ) -> None:
        self.node_id = node_id
        self.data_dir = data_dir
        self.voters = voters  # None: a quorum of one (this node), no listener
        self._advertised = advertised
        self._kafka_advertised = kafka_advertised  # the Kafka listener, registered too
        self._kafka_listeners = kafka_listeners  # all of them, by name
        # where this node dials a peer's client port, when not at its registered address
        self.peer_addresses = dict(peer_addresses or {})
        self.controller_config = controller_config or ControllerConfig()
        # (user, credential): written with the cluster id by the cluster's first
        # controller (``--add-scram``), ignored once the cluster has an id
        self.bootstrap_scram = tuple(bootstrap_scram)
        # how this broker reaches the controller's native listener (client/security.py)
        self.client_security = client_security
        self.raft_tls = raft_tls  # security/settings.RaftTls: mutual TLS on the Raft port
        self.heartbeat_ms = heartbeat_ms
        self.loader = MetadataLoader()
        self.incarnation_id = uuid.uuid4().hex
        self.broker_epoch = -1
        self.controller: Controller | None = None
        self._controller_term = -1
        self._followed: int | None = None  # the last other node we knew as quorum leader
        self.transport: RaftTransport
        self.raft: RaftService
        self._raft_config = raft_config
        self._tasks: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()
        self._conn: BrokerConnection | None = None
        self._conn_target: Address | None = None
        # One dial at a time: thousands of ISR changes at once (a cluster of 10,000
        # partitions coming up) must share one connection, not open one each.
        self._dialing = asyncio.Lock()
        self._submit_lock = asyncio.Lock()
        self.fatal: str | None = None  # a configuration problem that must stop the broker
        self.ready = False  # wait_ready has returned: start-up checks are over
        self._stopping = False
        self.recorded_cluster_id: str | None = None
        self.observer_host = observer_host
        # Whether this broker's data dir is full; heartbeats tell the controller, which
        # then moves leaderships to replicas with room (set by the broker once storage is up).
        self.storage_full: Callable[[], bool] | None = None
        self.observers: dict[int, Address] = {}  # non-voters that dialled us, by Raft address

    # -- read-only view ------------------------------------------------------------------

    @property
    def image(self) -> MetadataImage:
        return self.loader.image

    @property
    def controller_id(self) -> int | None:
        return self.raft.leader_id if self.raft.running else None

    @property
    def is_controller(self) -> bool:
        return self.controller is not None

    def controller_address(self) -> Address | None:
        """The client address of the quorum leader, once it has registered."""
        leader = self.controller_id
        return self.broker_address(leader) if leader is not None else None

    def broker_address(self, node_id: int) -> Address | None:
        """Where this node dials a registered broker: ``--peer-addresses``, else advertised."""
        reg = self.image.brokers.get(node_id)
        if reg is None:
            return None
        return self.peer_addresses.get(node_id, (reg.host, reg.port))

    def quorum_state(self) -> dict[str, Any]:
        raft = self.raft
        node = raft.node
        voters = sorted(self.voters) if self.voters else [self.node_id]
        state: dict[str, Any] = {
            "leader_id": raft.leader_id if raft.leader_id is not None else -1,
            "leader_epoch": raft.term,
            "high_watermark": raft.commit_index,
            "voters": [],
            "observers": [{"node_id": n} for n in sorted(self.observers)],
        }
        for v in voters:
            if v == self.node_id:
                state["voters"].append({"node_id": v, "log_end_offset": node.last_index})
            else:
                progress = node.progress(v) if raft.is_leader else None
                match = progress.match if progress is not None else -1
                state["voters"].append({"node_id": v, "log_end_offset": match})
        return state

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        recorded_node, recorded_cluster = read_identity(self.data_dir)
        if recorded_node is not None and recorded_node != self.node_id:
            check_meta_properties(self.data_dir, self.node_id, None)  # raises, with message
        self.recorded_cluster_id = recorded_cluster
        voters = self.voters or {self.node_id: ("127.0.0.1", 0)}
        if self.voters is None:
            self.transport = NullTransport()
        else:
            # an observer (not among the voters) listens on any free port of its host;
            # it dials every voter at start, and its handshake says where it listens
            listen = voters.get(self.node_id, (self.observer_host, 0))
            self.transport = TcpTransport(
                self.node_id,
                listen,
                {n: a for n, a in voters.items() if n != self.node_id},
                cluster_id=recorded_cluster,
                voters=voters,
                on_config_error=self._on_config_error,
                on_peer_hello=self._on_peer_hello,
                server_ssl=self.raft_tls.server if self.raft_tls is not None else None,
                client_ssl=self.raft_tls.client if self.raft_tls is not None else None,
                admit_peer=self.raft_tls.admit if self.raft_tls is not None else None,
            )
        self.raft = RaftService(
            self.node_id,
            voters,
            quorum_directory(self.data_dir),
            self.transport,
            self.loader,
            observers=() if self.node_id in voters else (self.node_id,),
            config=self._raft_config,
        )
        self.loader.add_listener(self._on_image)
        self.raft.add_listener(self._on_leadership)
        await self.raft.start()
        self._tasks = [
            asyncio.create_task(self._broker_lifecycle(), name=f"quorum-{self.node_id}-broker"),
            asyncio.create_task(self._controller_ticks(), name=f"quorum-{self.node_id}-tick"),
        ]

    async def wait_ready(self) -> None:
        """Until this broker is registered, unfenced and the cluster id is recorded."""
        while True:
            if self.fatal is not None:
                raise ClusterIdentityError(self.fatal)
            if self.raft.failed is not None:
                raise LogMQError(
                    f"metadata quorum failed: {self.raft.failed}", ErrorCode.STORAGE_ERROR
                )
            image = self.image
            reg = image.brokers.get(self.node_id)
            if (
                image.cluster_id is not None
                and reg is not None
                and reg.incarnation_id == self.incarnation_id
                and not reg.fenced
            ):
                self.ready = True
                return
            self._changed.clear()
            await self._changed.wait()

    async def stop(self) -> None:
        self._stopping = True
        if self.broker_epoch >= 0 and self.raft.running:
            # a controlled shutdown: fence ourselves so leaderships move at once
            with contextlib.suppress(LogMQError, OSError, TimeoutError):
                async with asyncio.timeout(2.0):
                    await self._heartbeat(want_shutdown=True)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        await self.raft.stop()

    # -- listeners -----------------------------------------------------------------------

    def _on_config_error(self, node_id: int, problem: str) -> None:
        # Still starting: refuse to join a mismatched quorum. (Not "not registered yet": a
        # stray data dir can hold an old registration of this node that replays first.)
        if not self.ready:
            self.fatal = problem
            self._changed.set()

    def _on_peer_hello(self, node_id: int, address: Address) -> None:
        """A non-voter dialled us: whichever voter leads replicates the log to it."""
        if self.voters is None or node_id in self.voters or node_id == self.node_id:
            return
        if self.observers.get(node_id) != address:
            self.observers[node_id] = address
            log.info("observer %d at %s:%d", node_id, *address)
            assert isinstance(self.transport, TcpTransport)
            self.transport.add_peer(node_id, *address)
        self.raft.add_observer(node_id)

    def _on_image(self, image: MetadataImage, delta: object) -> None:
        if image.cluster_id is not None and self.fatal is None:
            try:
                check_meta_properties(self.data_dir, self.node_id, image.cluster_id)
            except ClusterIdentityError as err:
                self.fatal = str(err)
            if isinstance(self.transport, TcpTransport):
                self.transport.cluster_id = image.cluster_id
        self._changed.set()

    def _on_leadership(self, leadership: Leadership) -> None:
        if leadership.leader_id not in (None, self.node_id):
            self._followed = leadership.leader_id
        if leadership.is_ready_leader:
            if self.controller is None or self._controller_term != leadership.term:
                self._become_controller(leadership.term)
        else:
            if self.controller is not None:
                log.info("node %d is no longer the controller", self.node_id)
            self.controller = None
        self._changed.set()

    def _become_controller(self, term: int) -> None:
        log.info("node %d is the controller (term %d)", self.node_id, term)
        now = now_ms()
        self.controller = Controller(self.image, now, self.controller_config)
        self._controller_term = term
        old = self._followed
        heard = self.raft.last_heard.get(old) if old is not None else None
        if old in self.image.brokers and heard is not None:
            # We campaigned after an election timeout (1-2 s) without a word from the old
            # leader: its session runs from its last message, not from now, so a dead
            # controller's partitions move after max(session, election), not the sum.
            self.controller.last_heard(old, min(now, int(heard * 1000)))
        self._followed = None
        records: list[Record] = []
        if self.image.cluster_id is None:
            records += self.controller.bootstrap(
                self.recorded_cluster_id, scram=self.bootstrap_scram
            ).records
        if records:
            self._propose_detached(records)

    def _propose_detached(self, records: list[Record]) -> None:
        try:
            future = self.raft.propose(encode_records(records))
        except NotLeaderError:
            self.controller = None
            return
        future.add_done_callback(self._after_commit)

    def _after_commit(self, future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is not None:
            log.warning("controller records not committed: %s", future.exception())
            self._reset_controller()

    def _reset_controller(self) -> None:
        """The controller's own image went ahead of what committed: start it over."""
        if self.controller is not None and self.raft.leadership.is_ready_leader:
            self.controller = Controller(self.image, now_ms(), self.controller_config)
        else:
            self.controller = None

    # -- controller requests -------------------------------------------------------------

    async def submit(self, operation: Callable[[Controller], ControllerResult[T]]) -> T:
        """Run ``operation`` on the active controller and wait until its records commit.

        NotLeaderError (NOT_CONTROLLER) when this node is not the ready quorum leader.
        """
        controller = self.controller
        if controller is None:
            raise NotLeaderError(leader_id=self.controller_id)
        result = operation(controller)
        if not result.records:
            return result.response
        try:
            future = self.raft.propose(encode_records(result.records))
        except NotLeaderError:
            self.controller = None
            raise
        try:
            await future
        except NotLeaderError:
            raise
        except Exception as err:  # the batch did not apply: rebuild from the committed image
            self._reset_controller()
            raise LogMQError(f"metadata change rejected: {err}", ErrorCode.UNKNOWN_SERVER_ERROR)
        return result.response

    async def wait_for_offset(self, offset: int, timeout: float = 10.0) -> None:
        """Until the local image has applied ``offset`` (a forwarded change is visible)."""
        async with asyncio.timeout(timeout):
            while self.image.offset < offset:
                self._changed.clear()
                await self._changed.wait()

    async def wait_for(self, condition: Callable[[MetadataImage], bool], timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while not condition(self.image):
                    self._changed.clear()
                    await self._changed.wait()
                return True
        return False

    async def call_controller(
        self, api_key: int, body: dict[str, Any], timeout: float = 10.0
    ) -> dict[str, Any]:
        """Send a request to the controller's client port (forwarding, registration).

        Never to this node itself: elected but not yet the active controller (still
        loading), it would forward the request to itself again and again until the
        first copy timed out; NOT_CONTROLLER (retriable) makes the caller wait instead."""
        if self.controller_id == self.node_id:
            raise LogMQError("this node is becoming the controller", ErrorCode.NOT_CONTROLLER)
        address = self.controller_address()
        if address is None:
            raise LogMQError("no controller is known yet", ErrorCode.NOT_CONTROLLER)
        conn = self._conn
        if conn is None or not conn.is_open or self._conn_target != address:
            async with self._dialing:
                conn = self._conn
                if conn is None or not conn.is_open or self._conn_target != address:
                    if conn is not None:
                        conn.close()
                    self._conn = None
                    conn = await BrokerConnection.open(
                        *address,
                        connect_timeout=timeout,
                        client_id=f"broker-{self.node_id}",
                        security=self.client_security,
                    )
                    self._conn, self._conn_target = conn, address
        try:
            resp = await conn.request(api_key, body, timeout=timeout)
        except LogMQError:
            conn.close()
            if self._conn is conn:
                self._conn = None
            raise
        return resp.body

    # -- the broker side: registration and heartbeats ------------------------------------

    async def _broker_lifecycle(self) -> None:
        interval = self.heartbeat_ms / 1000
        last_problem = ""
        while not self._stopping:
            try:
                if self.broker_epoch < 0:
                    await self._register()
                else:
                    await self._heartbeat()
            except (LogMQError, OSError, TimeoutError) as err:
                if self.broker_epoch < 0 and str(err) != last_problem:
                    # a broker that cannot register never becomes ready: say why, once
                    log.info("broker %d: not registered yet: %s", self.node_id, err)
                    last_problem = str(err)
                else:
                    log.debug("broker %d: controller not reachable: %s", self.node_id, err)
            except Exception:  # a bug must not silently end registration and heartbeats
                log.exception("broker %d: registration/heartbeat failed", self.node_id)
            if self.broker_epoch >= 0:
                await asyncio.sleep(interval)  # the heartbeat period, not synchronisation
            else:  # retry registering on the next metadata change, or soon
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.2):
                        await self._changed.wait()

    async def _register(self) -> None:
        if self.controller_id is None:
            return
        address = self._advertised()
        if address is None:  # not listening yet
            return
        host, port = address
        kafka = self._kafka_advertised()
        listeners = self._kafka_listeners()
        cluster_id = self.recorded_cluster_id
        if self.is_controller:
            response = await self.submit(
                lambda c: c.register_broker(
                    self.node_id,
                    self.incarnation_id,
                    host,
                    port,
                    now_ms(),
                    cluster_id=cluster_id,
                    kafka=kafka,
                    kafka_listeners=listeners,
                )
            )
            error, message, epoch = response.error, response.message, response.broker_epoch
        else:
            if self.controller_address() is None:
                return
            body = await self.call_controller(
                ApiKey.BROKER_REGISTRATION,
                {
                    "broker_id": self.node_id,
                    "incarnation_id": self.incarnation_id,
                    "host": host,
                    "port": port,
                    "cluster_id": cluster_id,
                    "kafka_host": kafka[0] if kafka is not None else None,
                    "kafka_port": kafka[1] if kafka is not None else -1,
                    "kafka_listeners": listeners,
                },
            )
            error = ErrorCode(body.get("error", 0))
            message, epoch = body.get("message") or "", int(body.get("broker_epoch", -1))
        if error is ErrorCode.INCONSISTENT_CLUSTER_ID:
            self.fatal = message
            self._changed.set()
            return
        if error is not ErrorCode.NONE:
            raise LogMQError(message, error)
        self.broker_epoch = epoch
        log.info("broker %d registered with epoch %d", self.node_id, epoch)
        await self._heartbeat()

    def _caught_up(self) -> bool:
        reg = self.image.brokers.get(self.node_id)
        return reg is not None and reg.broker_epoch == self.broker_epoch

    async def _heartbeat(self, *, want_shutdown: bool = False) -> None:
        caught_up = self._caught_up()
        full = self.storage_full() if self.storage_full is not None else None
        if self.is_controller:
            response = await self.submit(
                lambda c: c.heartbeat(
                    self.node_id,
                    self.broker_epoch,
                    now_ms(),
                    caught_up=caught_up,
                    want_shutdown=want_shutdown,
                    storage_full=full,
                )
            )
            error = response.error
        else:
            body = await self.call_controller(
                ApiKey.BROKER_HEARTBEAT,
                {
                    "broker_id": self.node_id,
                    "broker_epoch": self.broker_epoch,
                    "caught_up": caught_up,
                    "want_shutdown": want_shutdown,
                    "storage_full": full,
                },
                timeout=self._heartbeat_timeout(),
            )
            error = ErrorCode(body.get("error", 0))
        if error in (ErrorCode.STALE_BROKER_EPOCH, ErrorCode.BROKER_ID_NOT_REGISTERED):
            self.broker_epoch = -1  # register again

    def _heartbeat_timeout(self) -> float:
        """Half a session: a stuck connection is dropped and redialled before we expire."""
        return max(0.2, self.controller_config.session_timeout_ms / 2000)

    async def _controller_ticks(self) -> None:
        # an expired session is noticed within an eighth of it: failover is session + this
        interval = min(1.0, max(0.05, self.controller_config.session_timeout_ms / 8000))
        step = int(interval * 1000)
        last = now_ms()
        while True:
            await asyncio.sleep(interval)  # the controller's clock, not synchronisation
            now = now_ms()
            late, last = now - last - step, now
            controller = self.controller
            if controller is None:
                continue
            if late > step:  # the loop stalled: heartbeats may wait unread in its queue
                controller.paused(late)
            result = controller.tick(now)
            if result.records:
                self._propose_detached(result.records)


def now_ms() -> int:
    return int(time.monotonic() * 1000)
