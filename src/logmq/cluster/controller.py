"""The controller: the quorum leader's decisions about brokers, topics and partitions.

Sans-IO. The shell creates a Controller from the committed MetadataImage when its node
becomes a *ready* quorum leader (it has applied everything committed before its term),
feeds it requests with ``now_ms``, proposes the records each call returns as one Raft
entry (so they apply atomically), and sends the response once that entry is committed.
The controller applies its own records to its image at once, so the next request sees the
effect of the previous one even before it commits; if leadership is lost, the shell
throws the controller away and the next leader starts again from the committed image.

Rules (Kafka's KRaft semantics):

* Brokers register (fenced), then heartbeat; a broker that has caught up with the log is
  unfenced. A broker that misses heartbeats for ``session_timeout_ms`` is fenced: it is
  removed from every ISR it is in (except when it is the last member: the ISR then keeps
  naming who holds the data, KIP-841) and its leaderships move to another ISR member.
* A broker whose heartbeats say its data directory is full (BrokerStorageFull) hands
  each leadership to the first in-sync replica with room and leaves every ISR it is not
  the last member of (Kafka: an offline log directory). With no such replica it keeps
  leading, so acknowledged records stay readable; produce there fails with the storage
  error. It may not join an ISR until its heartbeats say it has room again; leadership
  then comes back through preferred-leader election.
* Leaders are elected only from the ISR, first in replica order among active brokers
  (those with room in their data directory before full ones).
  If none is available the partition is left leaderless, unless the topic sets
  ``unclean.leader.election.enable=true``: then any active replica may lead, with an ISR
  of itself (acknowledged records may be lost: that is the point of the setting).
* Every election bumps the leader epoch, every change the partition epoch.
  AlterPartition (ISR changes asked for by leaders) must name the current leader epoch
  and partition epoch, so a request from a deposed leader or based on stale state is
  refused; only active brokers may join an ISR.
* Reassignment (reassignment.py): a move adds the target replicas, completes once they
  are all in the ISR (checked after every ISR change and on every tick, so a new
  controller carries on a move from the committed state), and removes the reassignment
  throttle when the last move ends.
* Remote segments (KIP-405; remote_segments.py has the rules): a partition leader's
  copies and deletions, fenced by its current leader epoch.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence

from logmq.cluster import reassignment, remote_segments
from logmq.cluster.controller_api import (
    OK,
    AclDeleteResult,
    AlterPartitionRequest,
    AlterPartitionResponse,
    ApiResult,
    ClientQuotaAlteration,
    ControllerConfig,
    ControllerResult,
    CreateTopicResult,
    HeartbeatResponse,
    NewTopic,
    ProducerIdsResponse,
    ReassignmentResult,
    RegistrationResponse,
    RemoteSegmentChange,
)
from logmq.cluster.metadata_image import (
    BROKER,
    CLUSTER_WIDE,
    REASSIGNMENT_THROTTLE,
    TOPIC,
    MetadataImage,
    PartitionRegistration,
    TopicPartition,
)
from logmq.cluster.metadata_records import (
    NO_LEADER,
    BrokerFenced,
    BrokerStorageFull,
    BrokerUnfenced,
    ClientQuotaRecord,
    ClusterIdRecord,
    ConfigRecord,
    PartitionChange,
    ProducerIdsBlock,
    Record,
    RegisterBroker,
    RemoveAccessControlEntry,
    RemoveTopic,
    RemoveUserScramCredential,
    TopicRecord,
)
from logmq.cluster.replica_placement import assignment_problem, place_replicas
from logmq.cluster.security_image import (
    QUOTA_KEYS,
    acl_record,
    quota_entity,
    quota_entity_error,
    quota_value_error,
    scram_alteration_error,
    scram_record,
)
from logmq.cluster.topic_names import topic_name_error
from logmq.errors import ErrorCode, InvalidConfigError
from logmq.security.acl import AclBinding, AclBindingFilter, validate_binding, validate_filter
from logmq.security.scram import ScramCredential
from logmq.storage.config import LogConfig, validate_remote_storage

UNCLEAN_KEY = "unclean.leader.election.enable"


class Controller:
    def __init__(
        self,
        image: MetadataImage,
        now_ms: int,
        config: ControllerConfig | None = None,
        *,
        new_id: Callable[[], str] | None = None,
    ) -> None:
        self._image = image
        self.config = config or ControllerConfig()
        self._new_id = new_id or (lambda: uuid.uuid4().hex)
        # Heartbeat times live only in the active controller's memory: a new controller
        # gives every broker a full session before fencing it.
        self._last_heartbeat = {b: now_ms for b in image.brokers}
        self._placement_cursor = 0
        self._next_rebalance_ms = now_ms + self.config.leader_rebalance_interval_ms

    @property
    def image(self) -> MetadataImage:
        """The committed image plus every record this controller has produced."""
        return self._image

    def _commit(self, records: list[Record]) -> list[Record]:
        if records:
            self._image = self._image.apply(records)
        return records

    # -- cluster id ----------------------------------------------------------------------------

    def bootstrap(
        self,
        cluster_id: str | None = None,
        *,
        scram: Iterable[tuple[str, ScramCredential]] = (),
    ) -> ControllerResult[str]:
        """Choose the cluster id once (the first controller of a new cluster does).

        ``scram``: (user, credential) pairs written in the same batch as the cluster id
        (``kafka-storage format --add-scram``), so a cluster that requires SASL has its
        first administrator from the start; a cluster that has an id ignores them.
        """
        if self._image.cluster_id is not None:
            return ControllerResult([], self._image.cluster_id)
        cid = cluster_id or self._new_id()
        records: list[Record] = [ClusterIdRecord(cid)]
        latest: dict[tuple[str, str], ScramCredential] = {}
        for name, cred in scram:
            refusal = scram_alteration_error(name, cred.mechanism, cred.iterations, len(cred.salt))
            if refusal:
                raise ValueError(f"bootstrap SCRAM credential of {name!r}: {refusal[1]}")
            latest[(name, cred.mechanism)] = cred  # the last one given for a key wins
        records += [scram_record(name, cred) for (name, _), cred in latest.items()]
        return ControllerResult(self._commit(records), cid)

    # -- brokers -------------------------------------------------------------------------------

    def register_broker(
        self,
        broker_id: int,
        incarnation_id: str,
        host: str,
        port: int,
        now_ms: int,
        *,
        rack: str | None = None,
        cluster_id: str | None = None,
        kafka: tuple[str, int] | None = None,
        kafka_listeners: str | None = None,
    ) -> ControllerResult[RegistrationResponse]:
        image = self._image
        if cluster_id and image.cluster_id and cluster_id != image.cluster_id:
            return ControllerResult(
                [],
                RegistrationResponse(
                    ErrorCode.INCONSISTENT_CLUSTER_ID,
                    f"broker {broker_id} belongs to cluster {cluster_id}, "
                    f"this quorum is cluster {image.cluster_id}",
                ),
            )
        if broker_id < 0:
            return ControllerResult(
                [], RegistrationResponse(ErrorCode.INVALID_REQUEST, "negative broker id")
            )
        old = image.brokers.get(broker_id)
        self._last_heartbeat[broker_id] = now_ms
        if old is not None and old.incarnation_id == incarnation_id:
            return ControllerResult([], RegistrationResponse(broker_epoch=old.broker_epoch))
        epoch = old.broker_epoch + 1 if old is not None else 1
        kafka_host, kafka_port = kafka if kafka is not None else (None, -1)
        records: list[Record] = [
            RegisterBroker(
                broker_id,
                epoch,
                incarnation_id,
                host,
                port,
                rack,
                kafka_host,
                kafka_port,
                kafka_listeners,
            )
        ]
        if old is not None and not old.fenced:
            # A new incarnation lost the old one's in-memory state: treat as fenced.
            records += self._moves_away_from(broker_id)
        return ControllerResult(self._commit(records), RegistrationResponse(broker_epoch=epoch))

    def heartbeat(
        self,
        broker_id: int,
        broker_epoch: int,
        now_ms: int,
        *,
        caught_up: bool = False,
        want_fence: bool = False,
        want_shutdown: bool = False,
        storage_full: bool | None = None,
    ) -> ControllerResult[HeartbeatResponse]:
        """``caught_up``: the broker has applied the metadata log up to its registration.

        ``storage_full``: whether its data directory is full (None: not reported)."""
        reg = self._image.brokers.get(broker_id)
        if reg is None:
            return ControllerResult(
                [], HeartbeatResponse(ErrorCode.BROKER_ID_NOT_REGISTERED, f"broker {broker_id}")
            )
        if reg.broker_epoch != broker_epoch:
            return ControllerResult(
                [],
                HeartbeatResponse(
                    ErrorCode.STALE_BROKER_EPOCH,
                    f"broker {broker_id} epoch {broker_epoch}, registered {reg.broker_epoch}",
                ),
            )
        self._last_heartbeat[broker_id] = now_ms
        records: list[Record] = []
        if storage_full is not None and storage_full != reg.storage_full:
            records += self._storage_changed(broker_id, reg.broker_epoch, storage_full)
        if want_fence or want_shutdown:
            records += self._fence(broker_id) if not reg.fenced else []
            return ControllerResult(records, HeartbeatResponse(should_shutdown=want_shutdown))
        if reg.fenced and caught_up:
            records += self._unfence(broker_id)
            return ControllerResult(records, HeartbeatResponse(fenced=False))
        return ControllerResult(records, HeartbeatResponse(fenced=reg.fenced))

    def last_heard(self, broker_id: int, at_ms: int) -> None:
        """For a new controller: ``broker_id`` was last heard from at ``at_ms``, not now
        (the old controller's silence over Raft is known), so its session runs from then."""
        self._last_heartbeat[broker_id] = at_ms

    def paused(self, ms: int) -> None:
        """The controller itself did not run for ``ms`` (its process or event loop
        stalled): silence it could not have heard is not the brokers' fault, so every
        session is extended by it. Without this a broker sharing a stalled process with
        the controller is fenced the moment the stall ends, before its queued
        heartbeat is read, and every partition it leads changes leader twice."""
        if ms > 0:
            for b in self._last_heartbeat:
                self._last_heartbeat[b] += ms

    def tick(self, now_ms: int) -> ControllerResult[None]:
        """Fence brokers whose session expired; periodically restore preferred leaders."""
        records: list[Record] = []
        timeout = self.config.session_timeout_ms
        for b, reg in sorted(self._image.brokers.items()):
            last = self._last_heartbeat.setdefault(b, now_ms)
            if not reg.fenced and now_ms - last > timeout:
                records += self._fence(b)
        if self.config.auto_leader_rebalance and now_ms >= self._next_rebalance_ms:
            self._next_rebalance_ms = now_ms + self.config.leader_rebalance_interval_ms
            records += self.elect_leaders(None).records
        records += self._finish_reassignments()
        return ControllerResult(records, None)

    def _fence(self, broker_id: int) -> list[Record]:
        reg = self._image.brokers[broker_id]
        records: list[Record] = [BrokerFenced(broker_id, reg.broker_epoch)]
        records += self._moves_away_from(broker_id)
        return self._commit(records)

    def _moves_away_from(self, broker_id: int) -> list[Record]:
        """Changes that take ``broker_id`` out of ISRs and leaderships (not committed)."""

        def active(b: int) -> bool:
            return b != broker_id and self._image.is_active(b)

        out: list[Record] = []
        for part in self._image.partitions():
            if broker_id not in part.replicas:
                continue
            # KIP-841: the last ISR member stays, so the ISR keeps naming the holder.
            isr = tuple(r for r in part.isr if r != broker_id) or part.isr
            leader = part.leader
            if leader in (broker_id, NO_LEADER):
                leader, isr = self._elect(part, isr, active)
            change = _change(part, leader, isr, elected=part.leader == broker_id)
            if change is not None:
                out.append(change)
        return out

    def _storage_changed(self, broker_id: int, epoch: int, full: bool) -> list[Record]:
        records = self._commit([BrokerStorageFull(broker_id, epoch, int(full))])
        if full:
            records += self._commit(self._moves_away_from_full(broker_id))
        return records

    def _moves_away_from_full(self, broker_id: int) -> list[Record]:
        """Changes that take a broker that cannot write out of leaderships and ISRs.

        A leadership moves only to an in-sync replica with room; without one the full
        broker keeps it (its acknowledged records stay readable). As a follower it
        leaves the ISR unless that would leave the ISR empty.
        """
        image = self._image
        out: list[Record] = []
        for part in image.partitions():
            if broker_id not in part.isr:
                continue
            rest = tuple(r for r in part.isr if r != broker_id)
            if not rest:
                continue
            if part.leader == broker_id:
                leader = next(
                    (r for r in part.replicas if r in rest and image.can_lead(r)), NO_LEADER
                )
                if leader == NO_LEADER:
                    continue
                change = _change(part, leader, rest, elected=True)
            else:
                change = _change(part, part.leader, rest, elected=False)
            if change is not None:
                out.append(change)
        return out

    def _unfence(self, broker_id: int) -> list[Record]:
        reg = self._image.brokers[broker_id]
        records: list[Record] = [BrokerUnfenced(broker_id, reg.broker_epoch)]

        def active(b: int) -> bool:
            return b == broker_id or self._image.is_active(b)

        for part in self._image.partitions():
            if part.has_leader or broker_id not in part.replicas:
                continue
            leader, isr = self._elect(part, part.isr, active)
            change = _change(part, leader, isr, elected=False)
            if change is not None:
                records.append(change)
        return self._commit(records) + self._finish_reassignments()

    # -- elections -----------------------------------------------------------------------------

    def _unclean_allowed(self, topic: str) -> bool:
        value = self._image.topic_config(topic).get(UNCLEAN_KEY, "false")
        return value.strip().lower() == "true"

    def _elect(
        self,
        part: PartitionRegistration,
        isr: tuple[int, ...],
        active: Callable[[int], bool],
        *,
        unclean: bool | None = None,
    ) -> tuple[int, tuple[int, ...]]:
        """(leader, ISR) after electing from ``isr``; NO_LEADER if nobody may lead."""
        eligible = [r for r in part.replicas if r in isr and active(r)]
        for r in eligible:
            if not self._image.brokers[r].storage_full:
                return r, isr
        if eligible:  # every candidate's disk is full: one still serves what it holds
            return eligible[0], isr
        if unclean if unclean is not None else self._unclean_allowed(part.topic):
            for r in part.replicas:
                if active(r):
                    return r, (r,)
        return NO_LEADER, isr

    def elect_leaders(
        self, partitions: Iterable[TopicPartition] | None, *, unclean: bool = False
    ) -> ControllerResult[dict[TopicPartition, ApiResult]]:
        """Preferred-leader election (or, with ``unclean``, elect leaderless partitions)."""
        image = self._image
        explicit = partitions is not None
        keys = list(partitions) if explicit else [p.key for p in image.partitions()]
        records: list[Record] = []
        results: dict[TopicPartition, ApiResult] = {}
        for key in keys:
            part = image.partition(*key)
            if part is None:
                results[key] = ApiResult(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {key[0]}-{key[1]}"
                )
                continue
            if unclean:
                if part.has_leader:
                    results[key] = ApiResult(ErrorCode.ELECTION_NOT_NEEDED, "has a leader")
                    continue
                leader, isr = self._elect(part, part.isr, image.is_active, unclean=True)
                if leader == NO_LEADER:
                    results[key] = ApiResult(
                        ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, "no replica is available"
                    )
                    continue
            else:
                preferred = part.replicas[0]
                if part.leader == preferred:
                    results[key] = ApiResult(ErrorCode.ELECTION_NOT_NEEDED, "already preferred")
                    continue
                if preferred not in part.isr or not image.can_lead(preferred):
                    results[key] = ApiResult(
                        ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
                        f"broker {preferred} is not an available in-sync replica",
                    )
                    continue
                leader, isr = preferred, part.isr
            records.append(
                PartitionChange(part.topic, part.partition, leader=leader, isr=_or(isr, part.isr))
            )
            results[key] = OK
        if not explicit:
            results = {k: v for k, v in results.items() if v.ok}
        return ControllerResult(self._commit(records), results)

    # -- topics --------------------------------------------------------------------------------

    def create_topics(
        self, topics: Sequence[NewTopic], *, validate_only: bool = False
    ) -> ControllerResult[dict[str, CreateTopicResult]]:
        results: dict[str, CreateTopicResult] = {}
        records: list[Record] = []
        names = [t.name for t in topics]
        for spec in topics:
            if names.count(spec.name) > 1:
                results[spec.name] = CreateTopicResult(
                    ErrorCode.INVALID_REQUEST, "topic named more than once in the request"
                )
                continue
            result, topic_records = self._create_topic(spec)
            results[spec.name] = result
            if result.error is ErrorCode.NONE and not validate_only:
                records += self._commit(topic_records)
        return ControllerResult(records, results)

    def _create_topic(self, spec: NewTopic) -> tuple[CreateTopicResult, list[Record]]:
        image = self._image
        problem = topic_name_error(spec.name)
        if problem:
            return CreateTopicResult(ErrorCode.INVALID_TOPIC_EXCEPTION, problem), []
        if spec.name in image.topics:
            return CreateTopicResult(
                ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {spec.name!r} already exists"
            ), []
        try:
            LogConfig.from_dict(dict(spec.configs))
            validate_remote_storage(
                LogConfig.from_dict({**self.config.topic_defaults, **spec.configs}),
                None,
                self.config.remote_storage_enabled,
            )
        except InvalidConfigError as err:
            return CreateTopicResult(ErrorCode.INVALID_CONFIG, str(err)), []
        active = image.active_brokers()
        if spec.assignments is not None:
            assignment, error = self._check_assignment(spec)
            if error is not None:
                return error, []
        else:
            count = (
                spec.num_partitions if spec.num_partitions != -1 else self.config.default_partitions
            )
            rf = (
                spec.replication_factor
                if spec.replication_factor != -1
                else self.config.default_replication_factor
            )
            if count < 1:
                return CreateTopicResult(
                    ErrorCode.INVALID_PARTITIONS, f"number of partitions must be >= 1, got {count}"
                ), []
            if rf < 1:
                return CreateTopicResult(
                    ErrorCode.INVALID_REPLICATION_FACTOR,
                    f"replication factor must be >= 1, got {rf}",
                ), []
            if rf > len(active):
                return CreateTopicResult(
                    ErrorCode.INVALID_REPLICATION_FACTOR,
                    f"replication factor {rf} is larger than the {len(active)} available "
                    f"broker(s) {active}",
                ), []
            start = self._placement_cursor % len(active)
            self._placement_cursor += count
            assignment = place_replicas(active, count, rf, start)
        topic_id = self._new_id()
        records: list[Record] = [TopicRecord(spec.name, topic_id)]
        partitions = []
        for p, replicas in enumerate(assignment):
            part = self._new_partition(spec.name, p, replicas)
            partitions.append(part)
            records.append(part.to_record())
        records += [ConfigRecord(TOPIC, spec.name, k, v) for k, v in sorted(spec.configs.items())]
        return CreateTopicResult(topic_id=topic_id, partitions=tuple(partitions)), records

    def _check_assignment(
        self, spec: NewTopic
    ) -> tuple[list[tuple[int, ...]], CreateTopicResult | None]:
        """Kafka's checks on a manual assignment, in its order and with its codes.

        Both counts must be -1 (INVALID_REQUEST); then list by list: non-empty, only
        registered brokers, none twice, all of one length, at least one broker active;
        then the partitions must be exactly 0..n-1 (INVALID_REPLICA_ASSIGNMENT).
        """
        assert spec.assignments is not None
        if spec.replication_factor != -1 or spec.num_partitions != -1:
            given = "replication factor" if spec.replication_factor != -1 else "partition count"
            return [], CreateTopicResult(
                ErrorCode.INVALID_REQUEST,
                f"a manual replica assignment was given, so the {given} must be -1",
            )
        bad = ErrorCode.INVALID_REPLICA_ASSIGNMENT
        image = self._image
        rf: int | None = None
        for p, replicas in spec.assignments.items():
            problem = assignment_problem(
                replicas, image.brokers, image.is_active, rf, "earlier partitions have"
            )
            if problem:
                return [], CreateTopicResult(bad, f"the assignment of partition {p} has {problem}")
            rf = len(replicas)
        n = len(spec.assignments)
        missing = next((p for p in range(n) if p not in spec.assignments), None)
        if not n or missing is not None:
            return [], CreateTopicResult(
                bad,
                f"the assigned partitions must be numbered 0..n-1 with none missing; "
                f"{n} partition(s) given, partition {missing or 0} missing",
            )
        return [tuple(spec.assignments[p]) for p in range(len(spec.assignments))], None

    def _new_partition(
        self, topic: str, partition: int, replicas: Sequence[int]
    ) -> PartitionRegistration:
        """A new partition is empty everywhere: every active replica is in sync, and the
        first of them (the preferred leader, when active) leads."""
        replicas = tuple(replicas)
        live = tuple(r for r in replicas if self._image.is_active(r))
        leader = live[0] if live else NO_LEADER
        return PartitionRegistration(topic, partition, replicas, live or replicas, leader, 0, 0)

    def create_partitions(
        self,
        topic: str,
        count: int,
        *,
        assignments: Sequence[Sequence[int]] | None = None,
        validate_only: bool = False,
    ) -> ControllerResult[ApiResult]:
        """Grow ``topic`` to ``count`` partitions with the topic's replication factor:
        placed like new topics' partitions, or on ``assignments``, one replica list per
        new partition in order (the first broker the preferred leader), checked by the
        rule CreateTopics applies (INVALID_REPLICA_ASSIGNMENT naming what is wrong)."""
        t = self._image.topics.get(topic)
        if t is None:
            return ControllerResult(
                [], ApiResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {topic!r}")
            )
        old = len(t.partitions)
        if count <= old:
            return ControllerResult(
                [],
                ApiResult(
                    ErrorCode.INVALID_PARTITIONS,
                    f"topic {topic!r} has {old} partition(s); the new count must be larger "
                    f"(partitions can be added, never removed), got {count}",
                ),
            )
        first = t.partitions.get(0)
        # a partition being moved lists old and new replicas: its target is the factor
        rf = len(first.target_replicas or first.replicas) if first is not None else 1
        if assignments is not None:
            problem = self._partitions_assignment_problem(topic, old, count, rf, assignments)
            if problem:
                return ControllerResult(
                    [], ApiResult(ErrorCode.INVALID_REPLICA_ASSIGNMENT, problem)
                )
            if validate_only:
                return ControllerResult([], OK)
            placed = [tuple(r) for r in assignments]
        else:
            active = self._image.active_brokers()
            if rf > len(active):
                return ControllerResult(
                    [],
                    ApiResult(
                        ErrorCode.INVALID_REPLICATION_FACTOR,
                        f"replication factor {rf} is larger than the {len(active)} available "
                        f"broker(s) {active}",
                    ),
                )
            if validate_only:
                return ControllerResult([], OK)
            start = self._placement_cursor % len(active)
            self._placement_cursor += count - old
            placed = place_replicas(active, count - old, rf, start)
        records: list[Record] = [
            self._new_partition(topic, p, replicas).to_record()
            for p, replicas in enumerate(placed, start=old)
        ]
        return ControllerResult(self._commit(records), OK)

    def _partitions_assignment_problem(
        self,
        topic: str,
        old: int,
        count: int,
        rf: int,
        assignments: Sequence[Sequence[int]],
    ) -> str | None:
        """What is wrong with CreatePartitions' replica lists, or None."""
        added = count - old
        if len(assignments) != added:
            return (
                f"{len(assignments)} replica list(s) given, but growing topic {topic!r} from "
                f"{old} to {count} partitions adds {added}: one list per new partition"
            )
        image = self._image
        for p, replicas in enumerate(assignments, start=old):
            problem = assignment_problem(replicas, image.brokers, image.is_active, rf)
            if problem:
                return f"the assignment of new partition {p} has {problem}"
        return None

    def delete_topics(self, names: Iterable[str]) -> ControllerResult[dict[str, ApiResult]]:
        results: dict[str, ApiResult] = {}
        records: list[Record] = []
        for name in dict.fromkeys(names):
            topic = self._image.topics.get(name)
            if topic is None:
                results[name] = ApiResult(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}"
                )
                continue
            records += self._commit([RemoveTopic(name, topic.topic_id)])
            results[name] = OK
        return ControllerResult(records, results)

    def alter_configs(
        self, topic: str, changes: Mapping[str, str | None], *, validate_only: bool = False
    ) -> ControllerResult[ApiResult]:
        """Set (string) or delete (None) topic config keys, validated as a whole."""
        if topic not in self._image.topics:
            return ControllerResult(
                [], ApiResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {topic!r}")
            )
        current = dict(self._image.topic_config(topic))
        merged = dict(current)
        for key, value in changes.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        try:
            LogConfig.from_dict(merged)
            defaults = self.config.topic_defaults
            validate_remote_storage(
                LogConfig.from_dict({**defaults, **merged}),
                LogConfig.from_dict({**defaults, **current}),
                self.config.remote_storage_enabled,
            )
        except InvalidConfigError as err:
            return ControllerResult([], ApiResult(ErrorCode.INVALID_CONFIG, str(err)))
        records: list[Record] = [
            ConfigRecord(TOPIC, topic, k, merged.get(k))
            for k in sorted(changes)
            if merged.get(k) != current.get(k)
        ]
        if validate_only:
            return ControllerResult([], OK)
        self._commit(records)
        if self._unclean_allowed(topic):
            # Turning unclean election on revives partitions that had nobody to elect.
            leaderless = [
                p.key for p in self._image.topics[topic].partitions.values() if not p.has_leader
            ]
            for key in leaderless:
                part = self._image.partition(*key)
                assert part is not None
                leader, isr = self._elect(part, part.isr, self._image.is_active)
                change = _change(part, leader, isr, elected=False)
                if change is not None:
                    records += self._commit([change])
        return ControllerResult(records, OK)

    # -- producer ids --------------------------------------------------------------------------

    def allocate_producer_ids(
        self, broker_id: int, broker_epoch: int, count: int
    ) -> ControllerResult[ProducerIdsResponse]:
        """A block of ``count`` idempotent-producer ids no other broker ever gets."""
        reg = self._image.brokers.get(broker_id)
        if reg is None or reg.broker_epoch != broker_epoch:
            return ControllerResult(
                [],
                ProducerIdsResponse(ErrorCode.STALE_BROKER_EPOCH, f"broker {broker_id} is stale"),
            )
        if count < 1:
            return ControllerResult(
                [], ProducerIdsResponse(ErrorCode.INVALID_REQUEST, "count must be >= 1")
            )
        start = self._image.next_producer_id
        records = self._commit([ProducerIdsBlock(broker_id, start + count)])
        return ControllerResult(records, ProducerIdsResponse(start=start, count=count))

    # -- SCRAM credentials, ACLs, client quotas ---------------------------------------------

    def alter_scram_credentials(
        self,
        upsertions: Sequence[tuple[str, ScramCredential]],
        deletions: Sequence[tuple[str, str]],
        *,
        keep_existing: bool = False,
    ) -> ControllerResult[dict[str, ApiResult]]:
        """AlterUserScramCredentials: per user, all of its changes or none (Kafka's rules).

        ``keep_existing`` (a broker's ``--add-scram`` on a cluster that exists): an
        upsertion of a credential the user already has for that mechanism writes nothing
        and succeeds, so brokers given the same option create the user once.

        A user may be named once per request (a second mention, even for another
        mechanism, is DUPLICATE_RESOURCE, as Kafka's controller answers); an empty name or
        iterations out of bounds are UNACCEPTABLE_CREDENTIAL, an unknown mechanism
        UNSUPPORTED_SASL_MECHANISM, deleting a missing credential RESOURCE_NOT_FOUND.
        Results come in the order users are first named, deletions before upsertions.
        """
        image = self._image.security
        errors: dict[str, ApiResult] = {}
        accepted: dict[str, Record] = {}
        kept: set[str] = set()  # keep_existing: named, nothing to write
        order: dict[str, None] = {}
        alterations = [(n, m, None) for n, m in deletions]
        alterations += [(n, c.mechanism, c) for n, c in upsertions]
        for name, mechanism, cred in alterations:
            order.setdefault(name, None)
            if name in errors:
                continue
            if accepted.pop(name, None) is not None or name in kept:
                errors[name] = ApiResult(
                    ErrorCode.DUPLICATE_RESOURCE,
                    "A user credential cannot be altered twice in the same request",
                )
                continue
            refusal = scram_alteration_error(
                name,
                mechanism,
                None if cred is None else cred.iterations,
                0 if cred is None else len(cred.salt),
            )
            problem = ApiResult(*refusal) if refusal else None
            if problem is None and cred is None and image.scram_credential(name, mechanism) is None:
                problem = ApiResult(
                    ErrorCode.RESOURCE_NOT_FOUND,
                    f"Attempt to delete a user credential that does not exist: "
                    f"{mechanism} of {name!r}",
                )
            if problem is not None:
                errors[name] = problem
            elif cred is None:
                accepted[name] = RemoveUserScramCredential(name, mechanism)
            elif keep_existing and image.scram_credential(name, mechanism) is not None:
                kept.add(name)
            else:
                accepted[name] = scram_record(name, cred)
        records = self._commit([accepted[n] for n in order if n in accepted])
        return ControllerResult(records, {n: errors.get(n, OK) for n in order})

    def create_acls(self, bindings: Sequence[AclBinding]) -> ControllerResult[list[ApiResult]]:
        """CreateAcls: each binding validated on its own; one already stored (or earlier in
        the request) succeeds without a second copy."""
        results: list[ApiResult] = []
        records: list[Record] = []
        existing = self._image.security.acl_ids
        added: set[AclBinding] = set()
        for binding in bindings:
            problem = validate_binding(binding)
            if problem:
                results.append(ApiResult(ErrorCode.INVALID_REQUEST, problem))
                continue
            if binding not in existing and binding not in added:
                added.add(binding)
                records.append(acl_record(self._new_uuid(), binding))
            results.append(OK)
        return ControllerResult(self._commit(records), results)

    def delete_acls(
        self, filters: Sequence[AclBindingFilter]
    ) -> ControllerResult[list[AclDeleteResult]]:
        """DeleteAcls: each filter removes the stored bindings it matches; a filter with
        an UNKNOWN value is INVALID_REQUEST (Kafka's rule)."""
        acls = self._image.security.acls
        results: list[AclDeleteResult] = []
        records: list[Record] = []
        removed: set[str] = set()
        for f in filters:
            problem = validate_filter(f)
            if problem:
                results.append(AclDeleteResult(ErrorCode.INVALID_REQUEST, problem))
                continue
            ids = [i for i in sorted(acls) if i not in removed and f.matches(acls[i])]
            removed.update(ids)
            records += [RemoveAccessControlEntry(i) for i in ids]
            results.append(AclDeleteResult(deleted=tuple(acls[i] for i in ids)))
        return ControllerResult(self._commit(records), results)

    def alter_client_quotas(
        self, entries: Sequence[ClientQuotaAlteration], *, validate_only: bool = False
    ) -> ControllerResult[list[ApiResult]]:
        """AlterClientQuotas: each entry (one entity's changes) applies whole or not at
        all. Entity types ``user`` and ``client-id`` (a None name: the default entity);
        keys producer_byte_rate, consumer_byte_rate (whole numbers), request_percentage
        and controller_mutation_rate; values > 0, None removes the key."""
        results: list[ApiResult] = []
        records: list[Record] = []
        for entry in entries:
            entity = quota_entity(entry.entity)
            problem = quota_entity_error(entity)
            changes: list[Record] = []
            current = self._image.security.quotas.get(entity, {})
            for key, value in entry.ops.items():
                if problem:
                    break
                if value is None:
                    if key not in QUOTA_KEYS:
                        problem = quota_value_error(key, 1)  # names the known keys
                    elif key in current:
                        changes.append(ClientQuotaRecord(entity, key, None))
                    continue
                problem = quota_value_error(key, value)
                if problem is None and current.get(key) != float(value):
                    changes.append(ClientQuotaRecord(entity, key, float(value)))
            if problem:
                results.append(ApiResult(ErrorCode.INVALID_REQUEST, problem))
                continue
            results.append(OK)
            if not validate_only:
                records += self._commit(changes)
        return ControllerResult(records, results)

    def _new_uuid(self) -> str:
        """A fresh ACL id: a UUID string (``new_id`` makes it deterministic in tests)."""
        raw = self._new_id()
        try:
            return str(uuid.UUID(raw))
        except ValueError:
            return raw

    # -- reassignment ----------------------------------------------------------------------------

    def alter_reassignments(
        self,
        moves: Mapping[TopicPartition, Sequence[int] | None],
        *,
        throttle: int | None = None,
    ) -> ControllerResult[ReassignmentResult]:
        """Start (target replicas) or cancel (None) moves: all of them, or none.

        ``throttle``: bytes/s for reassignment traffic (None: unchanged, 0: removed).
        """
        image = self._image
        results: dict[TopicPartition, ApiResult] = {}
        if throttle is not None and (type(throttle) is not int or throttle < 0):
            message = f"the throttle must be a number of bytes/s >= 0, got {throttle!r}"
            return ControllerResult([], ReassignmentResult(ErrorCode.INVALID_REQUEST, message))
        for key, target in moves.items():
            part = image.partition(*key)
            min_isr = 1
            if part is not None:
                configs = {**self.config.topic_defaults, **image.topic_config(key[0])}
                min_isr = LogConfig.from_dict(configs).min_insync_replicas
            problem = reassignment.check_target(part, key, target, image.brokers, min_isr)
            results[key] = problem or OK
        failed = [(key, r) for key, r in results.items() if not r.ok]
        if failed:
            message = "; ".join(r.message for _, r in failed) + " (nothing was started)"
            return ControllerResult([], ReassignmentResult(failed[0][1].error, message, results))
        records: list[Record] = []
        for key, target in moves.items():
            part = image.partition(*key)
            assert part is not None
            if target is None:
                records += self._commit([reassignment.cancel(part, self._image.is_active)])
            else:
                change = reassignment.start(part, target)
                if change is not None:
                    records += self._commit([change])
        if throttle is not None and self._image.reassignment_throttle != (throttle or None):
            value = str(throttle) if throttle > 0 else None
            records += self._commit(
                [ConfigRecord(BROKER, CLUSTER_WIDE, REASSIGNMENT_THROTTLE, value)]
            )
        records += self._finish_reassignments(list(moves))
        return ControllerResult(records, ReassignmentResult(partitions=results))

    def _finish_reassignments(self, keys: Iterable[TopicPartition] | None = None) -> list[Record]:
        """Complete the moves whose target is in sync; drop the throttle once none is left."""
        image = self._image
        if keys is None:
            parts = list(image.reassignments())
        else:
            parts = [p for p in (image.partition(*k) for k in keys) if p and p.reassigning]
        records: list[Record] = []
        for part in parts:
            change = reassignment.completion(part, self._image.is_active)
            if change is not None:
                records += self._commit([change])
        if self._image.reassignment_throttle is not None and not any(
            True for _ in self._image.reassignments()
        ):
            records += self._commit(
                [ConfigRecord(BROKER, CLUSTER_WIDE, REASSIGNMENT_THROTTLE, None)]
            )
        return records

    # -- remote segments from leaders --------------------------------------------------------

    def alter_remote_segments(
        self, broker_id: int, broker_epoch: int, changes: Sequence[RemoteSegmentChange]
    ) -> ControllerResult[list[ApiResult]]:
        """Remote-segment changes of a partition leader: each judged on its own, the
        accepted ones one batch (remote_segments.py)."""
        records, results = remote_segments.alter_remote_segments(
            self._image, broker_id, broker_epoch, changes
        )
        return ControllerResult(self._commit(records), results)

    # -- ISR changes from leaders --------------------------------------------------------------

    def alter_partition(
        self, req: AlterPartitionRequest
    ) -> ControllerResult[AlterPartitionResponse]:
        result = self.alter_partitions([req])
        return ControllerResult(result.records, result.response[0])

    def alter_partitions(
        self, reqs: list[AlterPartitionRequest]
    ) -> ControllerResult[list[AlterPartitionResponse]]:
        """ISR changes of many partitions (a leader sends all it has waiting at once):
        each checked on its own, the accepted ones committed as one batch of records, so
        the image is rebuilt once, not once per partition."""
        image = self._image
        refused: dict[int, AlterPartitionResponse] = {}
        accepted: list[AlterPartitionRequest] = []
        seen: set[tuple[str, int]] = set()
        for i, req in enumerate(reqs):
            key = (req.topic, req.partition)
            problem = self._alter_refusal(image, req)
            if problem is None and key in seen:
                problem = (ErrorCode.INVALID_UPDATE_VERSION, "the partition twice in one request")
            if problem is not None:
                refused[i] = AlterPartitionResponse(*problem, image.partition(*key))
            else:
                seen.add(key)
                accepted.append(req)
        records: list[Record] = []
        if accepted:
            # Recorded even when the ISR is unchanged: moving the partition epoch voids
            # every other request the leader made at the old one (copies, retries),
            # which it counts until then (partition_replica.py, maximal ISR).
            records = self._commit(
                [PartitionChange(r.topic, r.partition, isr=tuple(r.new_isr)) for r in accepted]
            )
            records += self._finish_reassignments([(r.topic, r.partition) for r in accepted])
        responses = [
            refused.get(i)
            or AlterPartitionResponse(partition=self._image.partition(r.topic, r.partition))
            for i, r in enumerate(reqs)
        ]
        return ControllerResult(records, responses)

    def _alter_refusal(
        self, image: MetadataImage, req: AlterPartitionRequest
    ) -> tuple[ErrorCode, str] | None:
        reg = image.brokers.get(req.broker_id)
        if reg is None or reg.broker_epoch != req.broker_epoch:
            return ErrorCode.STALE_BROKER_EPOCH, f"broker {req.broker_id} epoch is stale"
        part = image.partition(req.topic, req.partition)
        if part is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{req.topic}-{req.partition}"
        if req.leader_epoch < part.leader_epoch:
            return (
                ErrorCode.FENCED_LEADER_EPOCH,
                f"leader epoch {req.leader_epoch} < current {part.leader_epoch}",
            )
        if req.leader_epoch > part.leader_epoch:
            return ErrorCode.UNKNOWN_LEADER_EPOCH, f"leader epoch {req.leader_epoch}"
        if part.leader != req.broker_id:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, f"broker {req.broker_id} does not lead"
        if req.partition_epoch != part.partition_epoch:
            return (
                ErrorCode.INVALID_UPDATE_VERSION,
                f"partition epoch {req.partition_epoch}, current {part.partition_epoch}",
            )
        new_isr = tuple(req.new_isr)
        if (
            req.broker_id not in new_isr
            or len(set(new_isr)) != len(new_isr)
            or not set(new_isr) <= set(part.replicas)
        ):
            return (
                ErrorCode.INVALID_REQUEST,
                f"ISR {list(new_isr)} must hold the leader and only replicas {list(part.replicas)}",
            )
        joining = [r for r in new_isr if r not in part.isr and not image.can_lead(r)]
        if joining:
            return (
                ErrorCode.INELIGIBLE_REPLICA,
                f"broker(s) {joining} are fenced, unregistered or out of disk space",
            )
        return None


def _or(new: tuple[int, ...], old: tuple[int, ...]) -> tuple[int, ...] | None:
    return None if new == old else new


def _change(
    part: PartitionRegistration, leader: int, isr: tuple[int, ...], *, elected: bool
) -> PartitionChange | None:
    """The PartitionChange taking ``part`` to (leader, isr), or None if nothing changes."""
    if leader == part.leader and isr == part.isr and not elected:
        return None
    return PartitionChange(
        part.topic,
        part.partition,
        leader=leader if (elected or leader != part.leader) else None,
        isr=_or(isr, part.isr),
    )
