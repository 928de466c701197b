"""A deterministic simulation of one replicated partition: brokers, network, controller.

Each broker runs a real PartitionReplica over an in-memory log with a real
LeaderEpochCache, carrying out the replica's actions exactly as the broker's shell will
(truncate, fetch, OffsetsForLeaderEpoch, AlterPartition). The real Controller decides
elections, fencing and ISR changes; its metadata reaches each broker only when the test
delivers it, so brokers act on stale views. Every message between brokers (and to the
controller) sits in ``network`` until the test delivers, drops or duplicates it, in any
order. Logs survive crashes (acks=all with fsync), as do HW checkpoints.

``acked`` records what producers were told: offset -> value. The checks say that every
acknowledged record is in the log of the leader the controller names, that logs never
disagree below their high watermarks, and, after healing, that every replica holds
every acknowledged record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from logmq.cluster.controller import Controller
from logmq.cluster.controller_api import AlterPartitionRequest, ControllerConfig, NewTopic
from logmq.cluster.metadata_image import EMPTY_IMAGE, PartitionRegistration
from logmq.cluster.metadata_records import NO_LEADER
from logmq.errors import ErrorCode
from logmq.replication.partition_replica import (
    AlterIsr,
    AskLeaderEpoch,
    PartitionReplica,
    ProduceCompleted,
    ReplicaConfig,
    ResetTo,
    StartFetching,
    TruncateTo,
)
from logmq.storage.leader_epoch import LeaderEpochCache

TOPIC = "t"
SESSION_MS = 1_000
LAG_MS = 2_000
PRODUCE_TIMEOUT_MS = 5_000
MAX_FETCH = 3


class SafetyViolation(AssertionError):
    pass


@dataclass
class SimLog:
    records: list[tuple[int, str]] = field(default_factory=list)  # (epoch, value)
    epochs: LeaderEpochCache = field(default_factory=lambda: LeaderEpochCache(None))

    @property
    def leo(self) -> int:
        return len(self.records)

    def append(self, epoch: int, value: str) -> None:
        if epoch > self.epochs.latest_epoch:
            self.epochs.assign(epoch, self.leo)  # what PartitionLog.append does
        self.records.append((epoch, value))

    def truncate(self, offset: int) -> None:
        del self.records[offset:]
        self.epochs.truncate_from_end(offset)


class LegacyReplica(PartitionReplica):
    """Pre-KIP-101 followers, for contrast only: truncate to the local HW, ask nobody."""

    def become_follower(self, state):  # type: ignore[no-untyped-def]
        actions = super().become_follower(state)
        if self.asked_epoch is None:
            return actions
        kept = [a for a in actions if not isinstance(a, AskLeaderEpoch)]
        return kept + self._truncated(min(self.hw, self.leo))


@dataclass
class SimBroker:
    broker_id: int
    log: SimLog = field(default_factory=SimLog)
    alive: bool = True
    incarnation: int = 0
    replica: PartitionReplica | None = None
    hw_checkpoint: int = 0
    meta_queue: list[PartitionRegistration] = field(default_factory=list)
    seen_meta: PartitionRegistration | None = None


@dataclass(frozen=True)
class Msg:
    kind: str  # fetch, fetch_resp, ask, ask_resp, alter, alter_resp
    src: int  # broker id; 0 is the controller
    dst: int
    incarnation: int  # of the receiving broker the message is meant for (responses)
    body: tuple[Any, ...]


class PartitionSim:
    def __init__(
        self,
        brokers: int = 3,
        *,
        min_insync: int = 2,
        legacy_hw_truncation: bool = False,
        unclean: bool = False,
    ) -> None:
        self.now = 0
        self.min_insync = min_insync
        self.legacy = legacy_hw_truncation
        self.controller = Controller(
            EMPTY_IMAGE,
            0,
            ControllerConfig(session_timeout_ms=SESSION_MS, auto_leader_rebalance=False),
            new_id=lambda: "id",
        )
        self.controller.bootstrap("sim")
        self.broker_epochs: dict[int, int] = {}
        self.brokers = {b: SimBroker(b) for b in range(1, brokers + 1)}
        for b in self.brokers:
            self._register(b)
        configs = {"unclean.leader.election.enable": "true"} if unclean else {}
        created = self.controller.create_topics(
            [NewTopic(TOPIC, 1, brokers, configs=configs)]
        ).response[TOPIC]
        assert created.error is ErrorCode.NONE, created
        self.network: list[Msg] = []
        self.silenced: set[int] = set()  # alive, but cut off from the controller
        self.acked: dict[int, str] = {}
        self.produced = 0
        self.outcomes: dict[str, ErrorCode] = {}
        self._published: PartitionRegistration | None = None
        self._leader_hw: dict[tuple[int, int], int] = {}  # (broker, epoch) -> HW seen
        self.publish()

    # -- controller side ---------------------------------------------------------------------

    @property
    def partition(self) -> PartitionRegistration:
        part = self.controller.image.partition(TOPIC, 0)
        assert part is not None
        return part

    def _register(self, b: int) -> None:
        broker = self.brokers[b]
        res = self.controller.register_broker(
            b, f"{b}-{broker.incarnation}", "127.0.0.1", 9000 + b, self.now
        ).response
        self.broker_epochs[b] = res.broker_epoch
        self.controller.heartbeat(b, res.broker_epoch, self.now, caught_up=True)

    def publish(self) -> None:
        part = self.partition
        if part == self._published:
            return
        self._published = part
        for b, broker in self.brokers.items():
            if broker.alive and b not in self.silenced:
                broker.meta_queue.append(part)

    def silence(self, b: int) -> None:
        """``b`` stays alive but nothing passes between it and the controller."""
        self.silenced.add(b)

    def unsilence(self, b: int) -> None:
        """Reconnected: it catches up with the metadata it missed."""
        if b in self.silenced:
            self.silenced.discard(b)
            if self.brokers[b].alive:
                self.brokers[b].meta_queue.append(self.partition)

    def advance(self, ms: int) -> None:
        """Time passes: live brokers heartbeat, the controller fences the silent ones."""
        self.now += ms
        for b, broker in self.brokers.items():
            if broker.alive and b not in self.silenced:
                self.controller.heartbeat(b, self.broker_epochs[b], self.now, caught_up=True)
        self.controller.tick(self.now)
        self.publish()

    # -- broker lifecycle ----------------------------------------------------------------------

    def crash(self, b: int) -> None:
        broker = self.brokers[b]
        broker.alive, broker.replica, broker.meta_queue, broker.seen_meta = False, None, [], None

    def restart(self, b: int) -> None:
        broker = self.brokers[b]
        if broker.alive:
            return
        broker.alive = True
        broker.incarnation += 1
        self.silenced.discard(b)
        cls = LegacyReplica if self.legacy else PartitionReplica
        broker.replica = cls(
            b,
            broker.log.epochs,
            log_end_offset=broker.log.leo,
            high_watermark=broker.hw_checkpoint,
            config=ReplicaConfig(
                replica_lag_time_max_ms=LAG_MS, min_insync_replicas=self.min_insync
            ),
        )
        self._register(b)
        self._published = None  # the restarted broker needs the current state
        self.publish()

    def _replica(self, b: int) -> PartitionReplica:
        broker = self.brokers[b]
        if broker.replica is None:
            cls = LegacyReplica if self.legacy else PartitionReplica
            broker.replica = cls(
                b,
                broker.log.epochs,
                log_end_offset=broker.log.leo,
                high_watermark=broker.hw_checkpoint,
                config=ReplicaConfig(
                    replica_lag_time_max_ms=LAG_MS, min_insync_replicas=self.min_insync
                ),
            )
        return broker.replica

    def deliver_metadata(self, b: int) -> bool:
        broker = self.brokers[b]
        if not broker.alive or not broker.meta_queue:
            return False
        part = broker.meta_queue.pop(0)
        broker.seen_meta = part
        replica = self._replica(b)
        if part.leader == b:
            actions = replica.become_leader(part, self.now)
        elif b in part.replicas:
            actions = replica.become_follower(part)
        else:
            actions = replica.stop()
        self._carry_out(b, actions)
        return True

    def deliver_all_metadata(self) -> None:
        for b in self.brokers:
            while self.deliver_metadata(b):
                pass

    # -- clients -------------------------------------------------------------------------------

    def produce(self, b: int) -> ErrorCode | None:
        """A producer with acks=all sends one record to ``b`` (which it thinks leads)."""
        broker = self.brokers[b]
        if not broker.alive or broker.replica is None:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        replica = broker.replica
        error = replica.check_append(-1)
        if error is not ErrorCode.NONE:
            return error
        self.produced += 1
        value = f"v{self.produced}"
        offset = broker.log.leo
        broker.log.append(replica.leader_epoch, value)
        self._carry_out(b, replica.on_append(broker.log.leo))
        key = (b, broker.incarnation, offset, value)
        result = replica.await_replication(key, offset + 1, self.now + PRODUCE_TIMEOUT_MS)
        if result is not None:
            self._complete(key, result)
        return result

    def _complete(self, key: tuple, error: ErrorCode) -> None:
        _, _, offset, value = key
        self.outcomes[value] = error
        if error is ErrorCode.NONE:
            if self.acked.get(offset, value) != value:
                raise SafetyViolation(
                    f"offset {offset} acknowledged as {self.acked[offset]} and as {value}"
                )
            self.acked[offset] = value

    def tick(self, b: int) -> None:
        broker = self.brokers[b]
        if broker.alive and broker.replica is not None:
            self._carry_out(b, broker.replica.tick(self.now))

    def poll(self, b: int) -> None:
        """Resend what a follower waits for (its fetch or its epoch question) after a loss."""
        broker = self.brokers[b]
        replica = broker.replica
        if not broker.alive or replica is None or replica.leader_id in (NO_LEADER, b):
            return
        if replica.fetching:
            self._send_fetch(b)
        elif replica.asked_epoch is not None:
            self._send("ask", b, replica.leader_id, (replica.leader_epoch, replica.asked_epoch))

    # -- the network ---------------------------------------------------------------------------

    def _send(self, kind: str, src: int, dst: int, body: tuple, incarnation: int = -1) -> None:
        self.network.append(Msg(kind, src, dst, incarnation, body))

    def _send_fetch(self, b: int) -> None:
        replica = self.brokers[b].replica
        assert replica is not None
        self._send("fetch", b, replica.leader_id, (replica.leo, replica.leader_epoch))

    def drop(self, position: int) -> None:
        if self.network:
            self.network.pop(position % len(self.network))

    def deliver(self, position: int = 0, *, keep: bool = False) -> None:
        if not self.network:
            return
        position %= len(self.network)
        msg = self.network[position] if keep else self.network.pop(position)
        if msg.kind == "alter":
            self._on_alter(msg)
            return
        broker = self.brokers[msg.dst]
        if not broker.alive or broker.replica is None:
            return
        if msg.incarnation not in (-1, broker.incarnation):
            return  # a response to a previous incarnation
        replica = broker.replica
        if msg.kind == "fetch":
            self._on_fetch(msg)
        elif msg.kind == "fetch_resp":
            self._on_fetch_response(msg)
        elif msg.kind == "ask":
            cle, epoch = msg.body
            found = replica.end_offset_for_epoch(cle, epoch)
            answer = (cle, found.error, found.leader_epoch, found.end_offset)
            self._send("ask_resp", msg.dst, msg.src, answer, self._inc(msg.src))
        elif msg.kind == "ask_resp":
            cle, error, e, end = msg.body
            if cle == replica.leader_epoch:
                self._carry_out(msg.dst, replica.on_leader_epoch_answer(error, e, end))
        elif msg.kind == "alter_resp":
            error, part = msg.body
            self._carry_out(msg.dst, replica.on_alter_isr_response(error, part))

    def deliver_where(self, predicate: Callable[[Msg], bool]) -> bool:
        """Deliver the first in-flight message matching ``predicate``; False if none."""
        for position, msg in enumerate(self.network):
            if predicate(msg):
                self.deliver(position)
                return True
        return False

    def deliver_all(self, limit: int = 100_000) -> None:
        for _ in range(limit):
            if not self.network:
                return
            self.deliver(0)
        raise AssertionError("network never went quiet")

    def _inc(self, b: int) -> int:
        return self.brokers[b].incarnation

    def _on_fetch(self, msg: Msg) -> None:
        leader = self.brokers[msg.dst]
        replica = leader.replica
        assert replica is not None
        offset, cle = msg.body
        fetched = replica.on_follower_fetch(msg.src, offset, cle, self.now)
        error = fetched.error
        self._carry_out(msg.dst, fetched.actions)
        records = leader.log.records[offset : offset + MAX_FETCH] if error is ErrorCode.NONE else []
        self._send(
            "fetch_resp",
            msg.dst,
            msg.src,
            (cle, error, offset, tuple(records), replica.hw),
            self._inc(msg.src),
        )

    def _on_fetch_response(self, msg: Msg) -> None:
        broker = self.brokers[msg.dst]
        replica = broker.replica
        assert replica is not None
        cle, error, offset, records, hw = msg.body
        if (
            replica.is_leader
            or not replica.fetching
            or cle != replica.leader_epoch
            or msg.src != replica.leader_id
            or error is not ErrorCode.NONE
            or offset != broker.log.leo
        ):
            return  # stale, duplicated, or an error the next metadata resolves
        for epoch, value in records:
            broker.log.append(epoch, value)
        self._carry_out(msg.dst, replica.on_fetched(broker.log.leo, hw))
        if records:
            # More may follow at once; an empty answer is a real broker's long poll,
            # which ``poll`` stands for.
            self._send_fetch(msg.dst)

    def _on_alter(self, msg: Msg) -> None:
        request: AlterIsr = msg.body[0]
        b = msg.src
        if b in self.silenced:
            return  # lost on the way to the controller
        result = self.controller.alter_partition(
            AlterPartitionRequest(
                b,
                msg.body[1],
                TOPIC,
                0,
                request.leader_epoch,
                request.partition_epoch,
                request.isr,
            )
        )
        self.publish()
        self._send(
            "alter_resp", 0, b, (result.response.error, result.response.partition), msg.incarnation
        )

    # -- carrying out actions --------------------------------------------------------------------

    def _carry_out(self, b: int, actions: list) -> None:
        broker = self.brokers[b]
        replica = broker.replica
        assert replica is not None
        for action in actions:
            if isinstance(action, AlterIsr):
                self.network.append(
                    Msg("alter", b, 0, broker.incarnation, (action, self.broker_epochs[b]))
                )
            elif isinstance(action, ProduceCompleted):
                self._complete(action.key, action.error)  # type: ignore[arg-type]
            elif isinstance(action, AskLeaderEpoch):
                self._send("ask", b, action.leader, (action.current_leader_epoch, action.epoch))
            elif isinstance(action, TruncateTo):
                broker.log.truncate(action.offset)
            elif isinstance(action, ResetTo):
                broker.log = SimLog()
            elif isinstance(action, StartFetching):
                self._send_fetch(b)
        broker.hw_checkpoint = replica.hw
        if replica.is_leader:
            key = (b, replica.leader_epoch)
            if replica.hw < self._leader_hw.get(key, 0):
                raise SafetyViolation(f"leader {b} moved its HW back in epoch {key[1]}")
            self._leader_hw[key] = replica.hw

    # -- checks ----------------------------------------------------------------------------------

    def check(self) -> None:
        part = self.partition
        if part.leader != NO_LEADER:
            leader = self.brokers[part.leader]
            for offset, value in self.acked.items():
                got = leader.log.records[offset][1] if offset < leader.log.leo else None
                if got != value:
                    raise SafetyViolation(
                        f"acknowledged {value}@{offset} missing on leader {part.leader} "
                        f"(epoch {part.leader_epoch}): has {got}"
                    )
        for member in part.isr:
            # Every ISR member may be elected: each must hold every acknowledged record.
            log = self.brokers[member].log
            for offset, value in self.acked.items():
                if offset >= log.leo or log.records[offset][1] != value:
                    raise SafetyViolation(
                        f"ISR member {member} lacks acknowledged {value}@{offset}"
                    )
        logs = [
            (b.log.records[: min(b.hw_checkpoint, b.log.leo)], b.broker_id)
            for b in self.brokers.values()
        ]
        for i, (a, ida) in enumerate(logs):
            for c, idc in logs[i + 1 :]:
                n = min(len(a), len(c))
                if a[:n] != c[:n]:
                    raise SafetyViolation(f"brokers {ida} and {idc} disagree below their HW")

    def heal(self, rounds: int = 200) -> None:
        """Restart everyone, let time pass and messages flow until all replicas agree."""
        for b in list(self.silenced):
            self.unsilence(b)
        for b in self.brokers:
            self.restart(b)
        for _ in range(rounds):
            self.deliver_all_metadata()
            for b in self.brokers:
                self.poll(b)
            self.deliver_all()
            self.check()
            for b in self.brokers:
                self.tick(b)
            self.deliver_all()
            self.advance(200)
            self.deliver_all_metadata()
            self.check()
            part = self.partition
            logs = {tuple(b.log.records) for b in self.brokers.values()}
            if (
                part.leader != NO_LEADER
                and len(part.isr) == len(part.replicas)
                and len(logs) == 1
                and all(
                    b.replica is not None and b.replica.leader_epoch == part.leader_epoch
                    for b in self.brokers.values()
                )
            ):
                return
        raise AssertionError(f"no convergence: {self.partition}")
