"""The asyncio shell around RaftNode: ticks, the Ready loop, proposals and a transport.

``RaftService`` owns one RaftNode and carries out its Readys exactly as docs/raft.md
prescribes, one at a time: persist (RaftStorage, in a worker thread so the loop keeps
serving), then send, then apply committed entries to the state machine, then snapshot when
the core asks, then advance. Everything else only feeds the node (``on_message``,
``propose``, the tick task) and wakes the loop; all of it runs on the event loop thread, so
the node is never touched concurrently.

A proposal returns a future resolved with the state machine's result once the entry is
committed and applied here, or failed with NotLeaderError when this node is not (or stops
being) the leader: the entry may still commit under the next leader, so callers retry
idempotently, as Kafka clients do after NOT_CONTROLLER.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from logmq.errors import ErrorCode, LogMQError
from logmq.replication.raft import RaftNode, Role
from logmq.replication.raft_codec import RaftCodecError, decode_message, encode_message
from logmq.replication.raft_messages import EntryKind, Snapshot
from logmq.replication.raft_ready import Ready
from logmq.replication.raft_storage import DIR_NAME, RaftStorage

log = logging.getLogger("logmq.raft")


class NotLeaderError(LogMQError):
    """This node does not lead the metadata quorum; ``leader_id`` says who does, if known."""

    code = ErrorCode.NOT_CONTROLLER

    def __init__(self, message: str = "", leader_id: int | None = None) -> None:
        super().__init__(message or f"not the quorum leader (leader: {leader_id})")
        self.leader_id = leader_id


class StateMachine(Protocol):
    """What the quorum replicates into: the metadata image, or a test double."""

    def apply(self, index: int, data: bytes) -> Any:
        """Apply one committed entry; the return value resolves the proposer's future."""

    def snapshot(self) -> bytes:
        """The image as of the last applied index."""

    def restore(self, index: int, data: bytes) -> None:
        """Replace the image by a snapshot (``index == 0`` and ``b""``: the empty image)."""


class RaftTransport(ABC):
    """Carries opaque message bytes between quorum members; losing some is fine."""

    @abstractmethod
    async def start(self, on_message: Callable[[bytes], None]) -> None:
        """Start delivering inbound messages to ``on_message``."""

    @abstractmethod
    def send(self, to_node: int, data: bytes) -> None:
        """Queue ``data`` for ``to_node``; never blocks, may drop."""

    @abstractmethod
    async def stop(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RaftConfig:
    tick_ms: int = 100
    election_ticks: int = 10
    heartbeat_ticks: int = 2
    snapshot_every: int | None = 10_000  # applied entries between state-machine snapshots
    snapshot_bytes: int | None = 1 << 20  # or applied bytes (at least the snapshot's size)
    max_entries_per_message: int = 256
    max_inflight: int = 64
    segment_bytes: int = 8 << 20


@dataclass(frozen=True, slots=True)
class Leadership:
    """What listeners are told whenever it changes."""

    term: int
    leader_id: int | None
    # True once this node leads *and* has applied an entry of its own term, i.e. its
    # state machine holds everything committed before it: only then may it act on it.
    is_ready_leader: bool


class RaftService:
    def __init__(
        self,
        node_id: int,
        voters: Iterable[int],
        directory: str | Path,
        transport: RaftTransport,
        state_machine: StateMachine,
        *,
        observers: Iterable[int] = (),
        config: RaftConfig | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.node_id = node_id
        self.voters = frozenset(voters)
        self.directory = Path(directory)
        self.transport = transport
        self.state_machine = state_machine
        self.config = config or RaftConfig()
        self._observers = frozenset(observers)
        self._rng = rng
        self._node: RaftNode | None = None
        self._storage: RaftStorage | None = None
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: dict[int, tuple[int, asyncio.Future[Any]]] = {}
        self._listeners: list[Callable[[Leadership], None]] = []
        self._leadership = Leadership(0, None, False)
        self._leadership_changed = asyncio.Event()
        self._applied_index = 0
        self._applied_term = 0
        self._stopping = False
        self.failed: BaseException | None = None
        self.dropped_messages = 0
        # node id -> time.monotonic() of its last message here: proof it was alive then
        self.last_heard: dict[int, float] = {}

    # -- read-only view ---------------------------------------------------------------------

    @property
    def node(self) -> RaftNode:
        if self._node is None:
            raise RuntimeError("RaftService not started")
        return self._node

    @property
    def running(self) -> bool:
        return self._node is not None and not self._stopping and self.failed is None

    @property
    def role(self) -> Role:
        return self.node.role

    @property
    def term(self) -> int:
        return self.node.term

    @property
    def leader_id(self) -> int | None:
        return self.node.leader_id

    @property
    def is_leader(self) -> bool:
        return self._node is not None and self._node.role is Role.LEADER

    @property
    def leadership(self) -> Leadership:
        return self._leadership

    @property
    def applied_index(self) -> int:
        return self._applied_index

    @property
    def commit_index(self) -> int:
        return self.node.commit_index

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the disk, restore the state machine, then start ticking and listening.

        A stopped service may be started again: it comes back from its disk.
        """
        if self._node is not None and not self._stopping:
            raise RuntimeError("RaftService already started")
        self._stopping, self.failed = False, None
        self._wake = asyncio.Event()
        self._leadership = Leadership(0, None, False)
        storage = RaftStorage(self.directory, segment_bytes=self.config.segment_bytes)
        state = await asyncio.to_thread(storage.load)
        self._storage = storage
        cfg = self.config
        self._node = RaftNode(
            self.node_id,
            self.voters,
            state,
            observers=self._observers,
            election_ticks=cfg.election_ticks,
            heartbeat_ticks=cfg.heartbeat_ticks,
            rng=self._rng,
            max_entries_per_message=cfg.max_entries_per_message,
            max_inflight=cfg.max_inflight,
            snapshot_threshold=cfg.snapshot_every,
            snapshot_bytes=cfg.snapshot_bytes,
        )
        self.state_machine.restore(state.snapshot.index, state.snapshot.data)
        self._applied_index, self._applied_term = state.snapshot.index, state.snapshot.term
        await self.transport.start(self.on_message)
        if self.voters == {self.node_id}:
            self._node.campaign()  # a quorum of one needs no election timeout
        self._tasks = [
            asyncio.create_task(self._drive(), name=f"raft-{self.node_id}-ready"),
            asyncio.create_task(self._tick(), name=f"raft-{self.node_id}-tick"),
        ]
        self._wake.set()

    async def stop(self, *, transfer_leadership: bool = True) -> None:
        """Hand over leadership if we can, finish the current Ready, then stop everything."""
        if self._node is None or self._stopping:
            return
        if transfer_leadership and self.running and self.is_leader and len(self.voters) > 1:
            await self._transfer_before_stop()
        self._stopping = True
        # A start that failed (e.g. its port was taken) made no tasks: stop what it made.
        tasks = self._tasks[::-1]  # (tick, drive): stop ticking first
        if tasks:
            tasks[0].cancel()
        self._wake.set()
        for task in tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        await self.transport.stop()
        self._fail_pending(NotLeaderError("the quorum member is stopping", None))
        if self._storage is not None:
            self._storage.close()

    async def _transfer_before_stop(self) -> None:
        node = self.node
        peers = [(p.match, v) for v in self.voters - {self.node_id} if (p := node.progress(v))]
        if not peers or not node.transfer_leadership(max(peers)[1]):
            return
        self._wake.set()
        timeout = self.config.tick_ms * self.config.election_ticks / 1000
        try:
            await asyncio.wait_for(self._wait_not_leader(), timeout)
        except TimeoutError:
            log.info("raft %d: leadership transfer did not finish before stop", self.node_id)

    async def _wait_not_leader(self) -> None:
        while self.is_leader and self.failed is None:
            self._leadership_changed.clear()
            await self._leadership_changed.wait()

    # -- inputs ------------------------------------------------------------------------------

    def on_message(self, data: bytes) -> None:
        """Inbound bytes from the transport: decode, step, wake the Ready loop."""
        if not self.running:
            return
        try:
            msg = decode_message(data)
            self.node.step(msg)
        except (RaftCodecError, ValueError) as err:
            self.dropped_messages += 1
            log.debug("raft %d: dropped a malformed message: %s", self.node_id, err)
            return
        self.last_heard[msg.src] = time.monotonic()
        self._wake.set()

    def propose(self, data: bytes) -> asyncio.Future[Any]:
        """Append ``data`` if we lead; the future resolves when it is applied here."""
        if not self.running:
            raise NotLeaderError("the quorum member is not running", None)
        index = self.node.propose(data)
        if index is None:
            raise NotLeaderError(leader_id=self.node.leader_id)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[index] = (self.node.term, future)
        self._wake.set()
        return future

    def campaign(self) -> None:
        self.node.campaign()
        self._wake.set()

    def add_observer(self, node_id: int) -> None:
        self.node.add_observer(node_id)
        self._wake.set()

    def add_listener(self, listener: Callable[[Leadership], None]) -> None:
        """``listener(Leadership)`` runs on every change of term, leader or readiness."""
        self._listeners.append(listener)

    async def wait_for_leader(self, *, ready: bool = False) -> int:
        """Wait until a leader is known (``ready``: until this node is a ready leader)."""
        while True:
            current = self._leadership
            if self.failed is not None:
                raise LogMQError(f"quorum member failed: {self.failed}", ErrorCode.STORAGE_ERROR)
            if ready and current.is_ready_leader:
                return self.node_id
            if not ready and current.leader_id is not None:
                return current.leader_id
            self._leadership_changed.clear()
            await self._leadership_changed.wait()

    # -- the tasks ---------------------------------------------------------------------------

    async def _tick(self) -> None:
        interval = self.config.tick_ms / 1000
        while True:
            await asyncio.sleep(interval)  # Raft's logical clock, not synchronisation
            if self.running:
                self.node.tick()
                self._wake.set()

    async def _drive(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                while self.failed is None and (rd := self.node.ready()) is not None:
                    await self._carry_out(rd)
                    self.node.advance(rd)
                    self._observe_leadership()
            except Exception as err:  # disk failure or a state-machine bug: stop serving
                log.exception("raft %d: stopping after a failure", self.node_id)
                self.failed = err
                self._fail_pending(NotLeaderError(f"quorum member failed: {err}", None))
                self._notify()
                return
            if self.failed is None:
                self._observe_leadership()  # a step-down without a Ready (check-quorum)
            if self._stopping:
                return

    async def _carry_out(self, rd: Ready) -> None:
        assert self._storage is not None
        if (
            rd.hard_state is not None
            or rd.snapshot is not None
            or rd.truncate_from is not None
            or rd.entries
        ):
            await asyncio.to_thread(self._storage.save, rd)
        if rd.snapshot is not None:
            self.state_machine.restore(rd.snapshot.index, rd.snapshot.data)
            self._applied_index, self._applied_term = rd.snapshot.index, rd.snapshot.term
        for msg in rd.messages:
            self.transport.send(msg.dst, encode_message(msg))
        for entry in rd.committed_entries:
            result: Any = None
            error: BaseException | None = None
            if entry.kind is EntryKind.DATA:
                try:
                    result = self.state_machine.apply(entry.index, entry.data)
                except Exception as err:  # deterministic: every member fails alike
                    log.exception("raft %d: applying entry %d failed", self.node_id, entry.index)
                    error = err
            self._applied_index, self._applied_term = entry.index, entry.term
            self._resolve(entry.index, entry.term, result, error)
        if rd.take_snapshot_at is not None:
            await self._snapshot(rd.take_snapshot_at)

    async def _snapshot(self, index: int) -> None:
        assert self._storage is not None
        node = self.node
        term = node.log.term_at(index)
        if term is None or index != self._applied_index:
            return
        data = self.state_machine.snapshot()
        await asyncio.to_thread(self._storage.save_snapshot, Snapshot(index, term, data))
        if index > node.log.snapshot.index:
            try:
                node.compact(index, data)
            except ValueError as err:  # overtaken meanwhile (e.g. a snapshot installed)
                log.info("raft %d: skipped compaction at %d: %s", self.node_id, index, err)

    # -- proposals and leadership --------------------------------------------------------------

    def _resolve(self, index: int, term: int, result: Any, error: BaseException | None) -> None:
        pending = self._pending.pop(index, None)
        if pending is None:
            return
        proposed_term, future = pending
        if future.done():
            return
        if proposed_term != term:
            future.set_exception(
                NotLeaderError("the proposal was replaced by another leader's entry", None)
            )
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def _fail_pending(self, error: NotLeaderError) -> None:
        pending, self._pending = self._pending, {}
        for _, future in pending.values():
            if not future.done():
                future.set_exception(error)

    def _observe_leadership(self) -> None:
        node = self.node
        ready = node.role is Role.LEADER and self._applied_term == node.term
        current = Leadership(node.term, node.leader_id, ready)
        if current == self._leadership:
            return
        self._leadership = current
        if node.role is not Role.LEADER:
            self._fail_pending(NotLeaderError(leader_id=node.leader_id))
        self._notify()

    def _notify(self) -> None:
        self._leadership_changed.set()
        for listener in self._listeners:
            try:
                listener(self._leadership)
            except Exception:
                log.exception("raft %d: leadership listener failed", self.node_id)


def quorum_directory(data_dir: str | Path) -> Path:
    """Where a broker keeps its metadata quorum state."""
    return Path(data_dir) / DIR_NAME
