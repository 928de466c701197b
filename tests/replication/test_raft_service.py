"""RaftService (the asyncio shell) and TcpTransport: real tasks, real disks, real sockets.

Clusters run in the test's event loop with a fast tick (20 ms) so elections take a few
hundred milliseconds; every wait is a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest

from logmq.errors import ErrorCode
from logmq.replication.raft_service import (
    Leadership,
    NotLeaderError,
    RaftConfig,
    RaftService,
    RaftTransport,
)
from logmq.replication.raft_storage import DIR_NAME
from logmq.replication.raft_transport import TcpTransport, frame
from tests.harness import free_port, wait_until

FAST = RaftConfig(tick_ms=20, election_ticks=10, heartbeat_ticks=2, snapshot_every=None)


class ListMachine:
    """Appends every entry to a list; the snapshot is the list."""

    def __init__(self) -> None:
        self.index = 0
        self.values: list[bytes] = []

    def apply(self, index: int, data: bytes) -> int:
        assert index > self.index, "applied out of order"
        self.index = index
        self.values.append(data)
        return len(self.values)

    def snapshot(self) -> bytes:
        return msgpack.packb([self.index, self.values])

    def restore(self, index: int, data: bytes) -> None:
        if data:
            self.index, self.values = msgpack.unpackb(data)
        else:
            self.index, self.values = index, []


class MemoryNetwork:
    """In-process delivery with cuttable links, for shell tests that need partitions."""

    def __init__(self) -> None:
        self.handlers: dict[int, Callable[[bytes], None]] = {}
        self.cut: set[int] = set()

    def transport(self, node_id: int) -> RaftTransport:
        net = self

        class _Transport(RaftTransport):
            async def start(self, on_message):
                net.handlers[node_id] = on_message

            def send(self, to_node, data):
                if node_id in net.cut or to_node in net.cut:
                    return
                handler = net.handlers.get(to_node)
                if handler is not None:
                    asyncio.get_running_loop().call_soon(handler, data)

            async def stop(self):
                net.handlers.pop(node_id, None)

        return _Transport()


class Member:
    def __init__(
        self,
        node_id: int,
        voters: list[int],
        directory: Path,
        make_transport: Callable[[int], RaftTransport],
        config: RaftConfig = FAST,
    ) -> None:
        self.node_id, self.voters, self.directory = node_id, voters, directory
        self.make_transport, self.config = make_transport, config
        self.sm = ListMachine()
        self.service: RaftService | None = None

    async def start(self) -> Member:
        self.sm = ListMachine()
        self.service = RaftService(
            self.node_id,
            self.voters,
            self.directory,
            self.make_transport(self.node_id),
            self.sm,
            config=self.config,
        )
        await self.service.start()
        return self

    async def stop(self, **kwargs) -> None:
        if self.service is not None:
            await self.service.stop(**kwargs)
            self.service = None

    @property
    def up(self) -> bool:
        return self.service is not None


def leader_of(members: list[Member]) -> Member | None:
    leaders = [m for m in members if m.up and m.service.is_leader]
    return max(leaders, key=lambda m: m.service.term) if leaders else None


async def wait_leader(members: list[Member], timeout: float = 10.0) -> Member:
    def ready() -> bool:
        lead = leader_of(members)
        return lead is not None and lead.service.leadership.is_ready_leader

    await wait_until(ready, timeout, "a ready leader")
    lead = leader_of(members)
    assert lead is not None
    return lead


async def propose_until_applied(members: list[Member], data: bytes, timeout: float = 10) -> int:
    """Propose at the current leader, retrying across leader changes; returns the result."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        lead = await wait_leader(members, timeout)
        try:
            return await asyncio.wait_for(lead.service.propose(data), timeout)
        except NotLeaderError:
            if asyncio.get_running_loop().time() > deadline:
                raise


async def stop_all(members: list[Member]) -> None:
    for m in members:
        await m.stop(transfer_leadership=False)


def tcp_cluster(tmp_path: Path, ids: list[int], **transport_options) -> list[Member]:
    ports = {i: free_port() for i in ids}
    addresses = {i: ("127.0.0.1", p) for i, p in ports.items()}

    def make(node_id: int) -> RaftTransport:
        return TcpTransport(
            node_id,
            addresses[node_id],
            addresses,
            voters=ids,
            backoff_max=0.2,
            **transport_options,
        )

    return [Member(i, ids, tmp_path / f"n{i}" / DIR_NAME, make) for i in ids]


# -- the shell --------------------------------------------------------------------------------


async def test_quorum_of_one_leads_at_once_and_commits(tmp_path):
    net = MemoryNetwork()
    solo = await Member(1, [1], tmp_path / "q", net.transport).start()
    try:
        assert solo.service.is_leader  # campaign() at start: no election timeout
        assert await solo.service.propose(b"a") == 1
        assert await solo.service.propose(b"b") == 2
        assert solo.sm.values == [b"a", b"b"]
    finally:
        await solo.stop()
    again = await Member(1, [1], tmp_path / "q", net.transport).start()
    try:
        await wait_until(lambda: again.sm.values == [b"a", b"b"], 5, "replay from disk")
    finally:
        await again.stop()


async def test_three_members_over_tcp_elect_replicate_survive_a_stop_and_restart(tmp_path):
    members = tcp_cluster(tmp_path, [1, 2, 3])
    try:
        for m in members:
            await m.start()
        for i in range(5):
            await propose_until_applied(members, b"v%d" % i)
        want = [b"v%d" % i for i in range(5)]
        await wait_until(lambda: all(m.sm.values == want for m in members), 10, "replication")
        # Stop the leader without a handover: the other two elect a new one and go on.
        old = await wait_leader(members)
        old_term = old.service.term
        await old.stop(transfer_leadership=False)
        for i in range(5, 8):
            await propose_until_applied(members, b"v%d" % i)
        new = await wait_leader(members)
        assert new is not old and new.service.term > old_term
        # The stopped member restarts from its disk and catches up.
        await old.start()
        want = [b"v%d" % i for i in range(8)]
        await wait_until(lambda: all(m.sm.values == want for m in members), 10, "catch-up")
        assert all(m.service.leader_id == new.node_id for m in members)
    finally:
        await stop_all(members)


async def test_whole_cluster_restart_keeps_every_committed_entry(tmp_path):
    members = tcp_cluster(tmp_path, [1, 2, 3])
    try:
        for m in members:
            await m.start()
        for i in range(4):
            await propose_until_applied(members, b"x%d" % i)
        await stop_all(members)
        for m in members:
            await m.start()
        await propose_until_applied(members, b"after")
        want = [b"x0", b"x1", b"x2", b"x3", b"after"]
        await wait_until(lambda: all(m.sm.values == want for m in members), 10, "restart")
    finally:
        await stop_all(members)


async def test_follower_refuses_proposals_and_names_the_leader(tmp_path):
    net = MemoryNetwork()
    members = [Member(i, [1, 2, 3], tmp_path / str(i), net.transport) for i in (1, 2, 3)]
    try:
        for m in members:
            await m.start()
        lead = await wait_leader(members)
        await wait_until(
            lambda: all(m.service.leader_id == lead.node_id for m in members), 5, "followers"
        )
        follower = next(m for m in members if m is not lead)
        with pytest.raises(NotLeaderError) as info:
            follower.service.propose(b"x")
        assert info.value.leader_id == lead.node_id
        assert info.value.code is ErrorCode.NOT_CONTROLLER and info.value.retriable
    finally:
        await stop_all(members)


async def test_pending_proposals_fail_when_the_leader_is_cut_off(tmp_path):
    net = MemoryNetwork()
    members = [Member(i, [1, 2, 3], tmp_path / str(i), net.transport) for i in (1, 2, 3)]
    try:
        for m in members:
            await m.start()
        lead = await wait_leader(members)
        await propose_until_applied(members, b"before")
        net.cut.add(lead.node_id)
        future = lead.service.propose(b"lost")
        with pytest.raises(NotLeaderError):
            await asyncio.wait_for(future, 10)  # check-quorum makes it step down
        net.cut.clear()
        await propose_until_applied(members, b"after")
        await wait_until(
            lambda: all(m.sm.values[-1] == b"after" for m in members), 10, "healed cluster"
        )
        for m in members:
            assert m.sm.values.count(b"before") == 1
    finally:
        await stop_all(members)


async def test_graceful_stop_hands_leadership_over(tmp_path):
    net = MemoryNetwork()
    members = [Member(i, [1, 2, 3], tmp_path / str(i), net.transport) for i in (1, 2, 3)]
    try:
        for m in members:
            await m.start()
        lead = await wait_leader(members)
        await propose_until_applied(members, b"x")
        seen: list[Leadership] = []
        others = [m for m in members if m is not lead]
        for m in others:
            m.service.add_listener(seen.append)
        term = lead.service.term
        await lead.stop(transfer_leadership=True)
        # stop() returned once the target campaigned; it wins the very next term, with
        # no election timeout in between.
        await wait_until(lambda: leader_of(others) is not None, 5, "the successor")
        successor = leader_of(others)
        assert successor.service.term == term + 1
        await wait_until(
            lambda: any(s.leader_id == successor.node_id for s in seen), 5, "listeners told"
        )
    finally:
        await stop_all(members)


async def test_snapshots_bound_the_log_and_restore_after_restart(tmp_path):
    net = MemoryNetwork()
    config = RaftConfig(tick_ms=20, election_ticks=10, heartbeat_ticks=2, snapshot_every=5)
    members = [Member(i, [1, 2, 3], tmp_path / str(i), net.transport, config) for i in (1, 2, 3)]
    try:
        for m in members:
            await m.start()
        for i in range(23):
            await propose_until_applied(members, b"s%d" % i)
        want = [b"s%d" % i for i in range(23)]
        await wait_until(lambda: all(m.sm.values == want for m in members), 10, "replication")
        await wait_until(
            lambda: all(m.service.node.log.snapshot.index >= 15 for m in members), 10, "snapshots"
        )
        victim = next(m for m in members if not m.service.is_leader)
        await victim.stop()
        assert list(victim.directory.glob("*.snapshot"))
        # While it is down the others compact past everything it has: it needs the snapshot.
        for i in range(23, 40):
            await propose_until_applied(members, b"s%d" % i)
        await victim.start()
        want = [b"s%d" % i for i in range(40)]
        await wait_until(lambda: victim.sm.values == want, 10, "snapshot catch-up")
    finally:
        await stop_all(members)


async def test_malformed_messages_are_dropped_not_fatal(tmp_path):
    net = MemoryNetwork()
    solo = await Member(1, [1], tmp_path / "q", net.transport).start()
    try:
        junk = [b"", b"\xc1", msgpack.packb([99, 2, 1, 0]), msgpack.packb([3, 2, 1])]
        # over the limits: a message of 200,000 items, entries that are not entries
        junk.append(msgpack.packb([[None]] * 200_000))
        junk.append(msgpack.packb([3, 2, 1, 1, 0, 0, [[None]] * 200_000, 0]))
        for data in junk:
            solo.service.on_message(data)
        assert solo.service.dropped_messages == len(junk)
        assert await solo.service.propose(b"still fine") == 1
    finally:
        await solo.stop()


# -- the TCP transport ------------------------------------------------------------------------


async def _pair(tmp_path, a_options=None, b_options=None):
    pa, pb = free_port(), free_port()
    addresses = {1: ("127.0.0.1", pa), 2: ("127.0.0.1", pb)}
    got: dict[int, list[bytes]] = {1: [], 2: []}
    a = TcpTransport(1, addresses[1], addresses, backoff_max=0.1, **(a_options or {}))
    b = TcpTransport(2, addresses[2], addresses, backoff_max=0.1, **(b_options or {}))
    await a.start(got[1].append)
    await b.start(got[2].append)
    return a, b, got


async def test_transport_delivers_in_order_and_reconnects(tmp_path):
    a, b, got = await _pair(tmp_path)
    try:
        for i in range(100):
            a.send(2, b"m%d" % i)
        await wait_until(lambda: len(got[2]) == 100, 10, "delivery")
        assert got[2] == [b"m%d" % i for i in range(100)]
        # The receiver goes away and comes back on the same port: the sender reconnects.
        port = b.port
        await b.stop()
        b2 = TcpTransport(2, ("127.0.0.1", port), {1: ("127.0.0.1", a.port)})
        again: list[bytes] = []
        await b2.start(again.append)
        try:

            async def keep_sending() -> None:
                while not again:
                    a.send(2, b"hello again")
                    await asyncio.sleep(0.01)  # a heartbeat-like trickle

            await asyncio.wait_for(keep_sending(), 10)
        finally:
            await b2.stop()
    finally:
        await a.stop()


async def test_cluster_id_mismatch_is_refused_on_both_sides(tmp_path):
    errors: list[tuple[int, str]] = []
    a, b, got = await _pair(
        tmp_path,
        {"cluster_id": "aaa", "on_config_error": lambda n, m: errors.append((n, m))},
        {"cluster_id": "bbb"},
    )
    try:
        a.send(2, b"x")
        await wait_until(lambda: 2 in a.config_errors and 1 in b.config_errors, 10, "refusal")
        assert "cluster" in a.config_errors[2] and "bbb" in b.config_errors[1]
        assert errors and errors[0][0] == 2
        assert got[2] == []
    finally:
        await a.stop()
        await b.stop()


async def test_voter_set_mismatch_is_refused(tmp_path):
    a, b, got = await _pair(tmp_path, {"voters": [1, 2, 3]}, {"voters": [1, 2]})
    try:
        a.send(2, b"x")
        await wait_until(lambda: 1 in b.config_errors, 10, "refusal")
        assert "--quorum-voters" in b.config_errors[1]
        assert got[2] == []
    finally:
        await a.stop()
        await b.stop()


async def test_garbage_and_oversized_frames_close_only_that_connection(tmp_path):
    a, b, got = await _pair(tmp_path, b_options={"max_frame_bytes": 1024})
    try:
        loop = asyncio.get_running_loop()
        for junk in (b"GET / HTTP/1.1\r\n\r\n", frame(b"\x00" * 10), struct.pack(">I", 1 << 30)):
            s = socket.create_connection(("127.0.0.1", b.port))
            s.setblocking(False)
            await loop.sock_sendall(s, junk)
            s.close()
        # A well-formed peer whose frame is too large gets disconnected (losing what
        # followed it on that connection, as Raft allows), reconnects and carries on.
        a.send(2, b"z" * 5000)

        async def keep_sending() -> None:
            while b"small" not in got[2]:
                a.send(2, b"small")
                await asyncio.sleep(0.01)  # a heartbeat-like trickle

        await asyncio.wait_for(keep_sending(), 10)
        assert all(len(m) <= 1024 for m in got[2])
    finally:
        await a.stop()
        await b.stop()


async def test_queue_to_an_unreachable_peer_is_bounded(tmp_path):
    t = TcpTransport(1, ("127.0.0.1", 0), {2: ("127.0.0.1", free_port())}, max_queue=10)
    await t.start(lambda data: None)
    try:
        for i in range(100):
            t.send(2, b"%d" % i)
        stats = t.peer_stats()[2]
        assert stats["queued"] == 10 and stats["dropped"] == 90
        t.send(99, b"nobody")  # unknown node: dropped quietly
    finally:
        await t.stop()


def test_a_peer_that_resets_at_accept_does_not_end_the_link():
    """A dial that lands on a listener that resets at once (a fault proxy whose target is
    down, a restarting node) makes uvloop refuse the hello write with a RuntimeError; the
    sender must keep redialling, or a leader never reaches a restarted follower again."""
    import uvloop

    async def scenario() -> None:
        port = free_port()
        resets = 0

        def reset_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal resets
            resets += 1
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()

        resetter = await asyncio.start_server(reset_at_once, "127.0.0.1", port)
        a = TcpTransport(1, ("127.0.0.1", 0), {2: ("127.0.0.1", port)}, backoff_max=0.05)
        await a.start(lambda data: None)
        try:
            a.send(2, b"early")
            await wait_until(lambda: resets >= 5, 10, "dials that were reset")
            resetter.close()
            await resetter.wait_closed()
            got: list[bytes] = []
            b = TcpTransport(2, ("127.0.0.1", port), {1: ("127.0.0.1", a.port)})
            await b.start(got.append)
            try:

                async def keep_sending() -> None:
                    while b"hello" not in got:
                        a.send(2, b"hello")
                        await asyncio.sleep(0.01)  # a heartbeat-like trickle

                await asyncio.wait_for(keep_sending(), 10)
            finally:
                await b.stop()
        finally:
            await a.stop()

    uvloop.run(scenario())
