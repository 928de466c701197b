"""The cluster as every broker sees it: an immutable image built from metadata records.

``MetadataImage`` is never modified: a ``MetadataDelta`` replays a batch of records on top
of an image and produces the next one, sharing every topic it did not touch. Readers (the
broker's request handlers, the controller) can hold an image for as long as they like
without locks. The delta also says what changed for one broker (``local_changes``): which
partitions it now leads, which it follows, which it must stop serving; that is what drives
the replica manager.

A snapshot is simply the records that rebuild the image from empty (``to_records``), so
one codec and one replay path serve both the log and snapshots.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType

from logmq.cluster.metadata_records import (
    NO_LEADER,
    BrokerFenced,
    BrokerStorageFull,
    BrokerUnfenced,
    ClusterIdRecord,
    ConfigRecord,
    PartitionChange,
    PartitionRecord,
    ProducerIdsBlock,
    Record,
    RegisterBroker,
    RemoteSegmentRecord,
    RemoteSegmentStateChange,
    RemoveTopic,
    TopicRecord,
    encode_records,
    iter_records,
)
from logmq.cluster.remote_image import (
    EMPTY_REMOTE,
    RemotePartition,
    RemoteSegmentError,
    RemoteSegmentsDelta,
    RemoteSegmentsImage,
)
from logmq.cluster.security_image import (
    EMPTY_SECURITY,
    SECURITY_RECORD_TYPES,
    SecurityDelta,
    SecurityImage,
    SecurityRecordError,
)
from logmq.errors import ErrorCode, LogMQError
from logmq.storage.remote.segment_metadata import RemoteSegment

TOPIC = "topic"
BROKER = "broker"
CLUSTER_WIDE = ""  # the resource name of cluster-wide broker settings
REASSIGNMENT_THROTTLE = "reassignment.throttled.rate"  # bytes/s; set while moves run
TopicPartition = tuple[str, int]


class MetadataError(LogMQError, ValueError):
    """A record that cannot apply to the image (the batch is rejected as a whole). The
    controller's own records never break the image's rules, so this is the broker's
    fault, answered UNKNOWN_SERVER_ERROR as the quorum answers a rejected batch."""

    code = ErrorCode.UNKNOWN_SERVER_ERROR


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    broker_id: int
    broker_epoch: int
    incarnation_id: str
    host: str
    port: int
    rack: str | None = None
    fenced: bool = True
    storage_full: bool = False  # its data dir is full: it should not lead or follow
    kafka_host: str | None = None  # its Kafka listener as clients reach it
    kafka_port: int = -1
    kafka_listeners: str | None = None  # all of them, "NAME://host:port,..."


@dataclass(frozen=True, slots=True)
class PartitionRegistration:
    topic: str
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()
    target_replicas: tuple[int, ...] = ()  # set while a reassignment runs

    @property
    def key(self) -> TopicPartition:
        return (self.topic, self.partition)

    @property
    def reassigning(self) -> bool:
        return bool(self.target_replicas)

    @property
    def original_replicas(self) -> tuple[int, ...]:
        """The replicas before the current reassignment (what a cancel returns to)."""
        return tuple(r for r in self.replicas if r not in self.adding_replicas)

    @property
    def has_leader(self) -> bool:
        return self.leader != NO_LEADER

    def changed(self, change: PartitionChange) -> PartitionRegistration:
        """This partition after ``change``, with its epochs bumped."""
        return PartitionRegistration(
            topic=self.topic,
            partition=self.partition,
            replicas=self.replicas if change.replicas is None else change.replicas,
            isr=self.isr if change.isr is None else change.isr,
            leader=self.leader if change.leader is None else change.leader,
            leader_epoch=self.leader_epoch + (change.leader is not None),
            partition_epoch=self.partition_epoch + 1,
            adding_replicas=(
                self.adding_replicas if change.adding_replicas is None else change.adding_replicas
            ),
            removing_replicas=(
                self.removing_replicas
                if change.removing_replicas is None
                else change.removing_replicas
            ),
            target_replicas=(
                self.target_replicas if change.target_replicas is None else change.target_replicas
            ),
        )

    def to_record(self) -> PartitionRecord:
        return PartitionRecord(
            self.topic,
            self.partition,
            self.replicas,
            self.isr,
            self.leader,
            self.leader_epoch,
            self.partition_epoch,
            self.adding_replicas,
            self.removing_replicas,
            self.target_replicas,
        )

    @classmethod
    def from_record(cls, r: PartitionRecord) -> PartitionRegistration:
        return cls(
            r.topic,
            r.partition,
            r.replicas,
            r.isr,
            r.leader,
            r.leader_epoch,
            r.partition_epoch,
            r.adding_replicas,
            r.removing_replicas,
            r.target_replicas,
        )


_EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class TopicImage:
    name: str
    topic_id: str
    partitions: Mapping[int, PartitionRegistration] = field(default_factory=lambda: _EMPTY)


@dataclass(frozen=True)
class MetadataImage:
    cluster_id: str | None = None
    brokers: Mapping[int, BrokerRegistration] = field(default_factory=lambda: _EMPTY)
    topics: Mapping[str, TopicImage] = field(default_factory=lambda: _EMPTY)
    configs: Mapping[tuple[str, str], Mapping[str, str]] = field(default_factory=lambda: _EMPTY)
    offset: int = 0  # the Raft index of the last batch applied
    next_producer_id: int = 0  # ids below were allocated to brokers (ProducerIdsBlock)
    # SCRAM credentials, ACLs and client quotas (security_image.py)
    security: SecurityImage = field(default_factory=lambda: EMPTY_SECURITY)
    # remote segments by topic id and partition (remote_image.py)
    remote: RemoteSegmentsImage = field(default_factory=lambda: EMPTY_REMOTE)

    # -- queries -----------------------------------------------------------------------------

    def partition(self, topic: str, partition: int) -> PartitionRegistration | None:
        t = self.topics.get(topic)
        return t.partitions.get(partition) if t is not None else None

    def partitions(self) -> Iterable[PartitionRegistration]:
        for t in self.topics.values():
            yield from t.partitions.values()

    def topic_config(self, topic: str) -> Mapping[str, str]:
        return self.configs.get((TOPIC, topic), _EMPTY)

    def is_active(self, broker_id: int) -> bool:
        """Registered and not fenced: may lead and may join an ISR."""
        b = self.brokers.get(broker_id)
        return b is not None and not b.fenced

    def can_lead(self, broker_id: int) -> bool:
        """Active, and its data dir has room: the first choice in elections."""
        b = self.brokers.get(broker_id)
        return b is not None and not b.fenced and not b.storage_full

    def fenced_brokers(self) -> list[int]:
        """Registered brokers the controller has fenced: they may not join an ISR."""
        return [b for b, reg in self.brokers.items() if reg.fenced]

    def active_brokers(self) -> list[int]:
        return sorted(b for b, reg in self.brokers.items() if not reg.fenced)

    def reassignments(self) -> Iterable[PartitionRegistration]:
        return iter(self._reassigning)

    @cached_property
    def topic_uuids(self) -> Mapping[str, uuid.UUID]:
        """Each topic's id as a UUID, built once per image: Kafka clients name topics by
        id (Fetch 13+, Metadata 10+), and parsing every id per request cost O(topics)."""
        out = {}
        for name, t in self.topics.items():
            try:
                out[name] = uuid.UUID(t.topic_id)
            except ValueError:  # not a UUID: Kafka clients cannot name it by id
                continue
        return out

    @cached_property
    def topics_by_uuid(self) -> Mapping[uuid.UUID, str]:
        """Topic names by id (the inverse of ``topic_uuids``), built once per image."""
        return {tid: name for name, tid in self.topic_uuids.items()}

    @cached_property
    def topic_names_by_id(self) -> Mapping[str, str]:
        """Topic names by id (any string id), built once per image."""
        return {t.topic_id: name for name, t in self.topics.items()}

    def remote_segments(self, topic_id: str, partition: int) -> tuple[RemoteSegment, ...]:
        """The partition's remote segments in (base_offset, segment_id) order, every
        state but DELETE_FINISHED (those have left); () if none. Cheap: no copy."""
        return self.remote.segments(topic_id, partition)

    def remote_segment(
        self, topic_id: str, partition: int, segment_id: str
    ) -> RemoteSegment | None:
        return self.remote.segment(topic_id, partition, segment_id)

    def orphaned_remote_partitions(self) -> list[RemotePartition]:
        """(topic id, partition) holding remote segments of a topic that is gone (deleted,
        or recreated under a new id), sorted: their objects are still to delete."""
        names = self.topic_names_by_id
        return [key for key in self.remote.partitions() if key[0] not in names]

    @cached_property
    def _reassigning(self) -> tuple[PartitionRegistration, ...]:
        # Found once per image: the controller asks on every tick, and walking 10,000
        # partitions each time was most of an idle controller's work.
        return tuple(p for p in self.partitions() if p.reassigning)

    @property
    def reassignment_throttle(self) -> int | None:
        """Bytes/s allowed for reassignment traffic per broker and direction (None: no limit)."""
        value = self.configs.get((BROKER, CLUSTER_WIDE), _EMPTY).get(REASSIGNMENT_THROTTLE)
        return int(value) if value is not None else None

    # -- changes -----------------------------------------------------------------------------

    def apply(self, records: Iterable[Record], offset: int | None = None) -> MetadataImage:
        delta = MetadataDelta(self)
        for record in records:
            delta.replay(record)
        return delta.apply(offset)

    # -- snapshots ---------------------------------------------------------------------------

    def to_records(self) -> list[Record]:
        """Records that rebuild this image from an empty one."""
        out: list[Record] = []
        if self.cluster_id is not None:
            out.append(ClusterIdRecord(self.cluster_id))
        if self.next_producer_id:
            out.append(ProducerIdsBlock(-1, self.next_producer_id))
        for b in sorted(self.brokers.values(), key=lambda b: b.broker_id):
            out.append(
                RegisterBroker(
                    b.broker_id,
                    b.broker_epoch,
                    b.incarnation_id,
                    b.host,
                    b.port,
                    b.rack,
                    b.kafka_host,
                    b.kafka_port,
                    b.kafka_listeners,
                )
            )
            if not b.fenced:
                out.append(BrokerUnfenced(b.broker_id, b.broker_epoch))
            if b.storage_full:
                out.append(BrokerStorageFull(b.broker_id, b.broker_epoch, 1))
        for name in sorted(self.topics):
            t = self.topics[name]
            out.append(TopicRecord(t.name, t.topic_id))
            out.extend(t.partitions[p].to_record() for p in sorted(t.partitions))
        for (rtype, rname), values in sorted(self.configs.items()):
            out.extend(ConfigRecord(rtype, rname, k, v) for k, v in sorted(values.items()))
        out.extend(self.security.to_records())
        out.extend(self.remote.to_records())
        return out

    def to_bytes(self) -> bytes:
        return encode_records(self.to_records())

    @classmethod
    def from_bytes(cls, data: bytes, offset: int = 0) -> MetadataImage:
        return EMPTY_IMAGE.apply(iter_records(data), offset) if data else EMPTY_IMAGE


EMPTY_IMAGE = MetadataImage()


@dataclass(frozen=True, slots=True)
class LocalReplicaChanges:
    """What a metadata delta means for one broker's replicas."""

    leaders: dict[TopicPartition, PartitionRegistration]  # lead (new epoch or new ISR)
    followers: dict[TopicPartition, PartitionRegistration]  # follow (new leader or epoch)
    deleted: set[TopicPartition]  # no longer a replica here: stop serving and delete

    def __bool__(self) -> bool:
        return bool(self.leaders or self.followers or self.deleted)


class MetadataDelta:
    """Records replayed on top of an image; ``apply`` gives the next image."""

    def __init__(self, image: MetadataImage) -> None:
        self.image = image
        self._cluster_id = image.cluster_id
        self._next_producer_id = image.next_producer_id
        self._brokers: dict[int, BrokerRegistration] = {}
        self._topics: dict[str, TopicImage | None] = {}  # None: removed
        self._partitions: dict[TopicPartition, PartitionRegistration] = {}
        self._configs: dict[tuple[str, str], dict[str, str] | None] = {}
        self.removed_topics: dict[str, TopicImage] = {}
        self._security: SecurityDelta | None = None  # made by the first security record
        self._remote: RemoteSegmentsDelta | None = None  # by the first remote-segment record

    # -- reading through the delta ---------------------------------------------------------

    def broker(self, broker_id: int) -> BrokerRegistration | None:
        if broker_id in self._brokers:
            return self._brokers[broker_id]
        return self.image.brokers.get(broker_id)

    def topic(self, name: str) -> TopicImage | None:
        if name in self._topics:
            return self._topics[name]
        return self.image.topics.get(name)

    def partition(self, topic: str, partition: int) -> PartitionRegistration | None:
        key = (topic, partition)
        if key in self._partitions:
            return self._partitions[key]
        t = self.topic(topic)
        return t.partitions.get(partition) if t is not None else None

    @property
    def changed_partitions(self) -> dict[TopicPartition, PartitionRegistration]:
        return dict(self._partitions)

    @property
    def changed_remote_partitions(self) -> set[RemotePartition]:
        """(topic id, partition) whose remote segments changed in this delta."""
        return self._remote.changed_partitions if self._remote is not None else set()

    def remote_segment(
        self, topic_id: str, partition: int, segment_id: str
    ) -> RemoteSegment | None:
        if self._remote is not None:
            return self._remote.segment(topic_id, partition, segment_id)
        return self.image.remote.segment(topic_id, partition, segment_id)

    # -- replay --------------------------------------------------------------------------------

    def replay(self, record: Record) -> None:
        if isinstance(record, SECURITY_RECORD_TYPES):
            if self._security is None:
                self._security = SecurityDelta(self.image.security)
            try:
                self._security.replay(record)
            except SecurityRecordError as err:
                raise MetadataError(str(err)) from None
            return
        if isinstance(record, (RemoteSegmentRecord, RemoteSegmentStateChange)):
            if self._remote is None:
                self._remote = RemoteSegmentsDelta(self.image.remote)
            try:
                self._remote.replay(record)
            except RemoteSegmentError as err:
                raise MetadataError(str(err)) from None
            return
        match record:
            case ClusterIdRecord(cluster_id=cid):
                if self._cluster_id is not None and self._cluster_id != cid:
                    raise MetadataError(f"cluster id is {self._cluster_id}, record says {cid}")
                self._cluster_id = cid
            case RegisterBroker():
                old = self.broker(record.broker_id)
                if old is not None and record.broker_epoch <= old.broker_epoch:
                    raise MetadataError(
                        f"broker {record.broker_id} epoch {record.broker_epoch} "
                        f"is not newer than {old.broker_epoch}"
                    )
                self._brokers[record.broker_id] = BrokerRegistration(
                    record.broker_id,
                    record.broker_epoch,
                    record.incarnation_id,
                    record.host,
                    record.port,
                    record.rack,
                    fenced=True,
                    kafka_host=record.kafka_host,
                    kafka_port=record.kafka_port,
                    kafka_listeners=record.kafka_listeners,
                )
            case BrokerFenced() | BrokerUnfenced():
                old = self.broker(record.broker_id)
                if old is None or old.broker_epoch != record.broker_epoch:
                    raise MetadataError(f"{record} does not match registration {old}")
                fenced = isinstance(record, BrokerFenced)
                self._brokers[record.broker_id] = replace(old, fenced=fenced)
            case BrokerStorageFull():
                old = self.broker(record.broker_id)
                if old is None or old.broker_epoch != record.broker_epoch:
                    raise MetadataError(f"{record} does not match registration {old}")
                self._brokers[record.broker_id] = replace(old, storage_full=bool(record.full))
            case TopicRecord(name=name, topic_id=tid):
                if self.topic(name) is not None:
                    raise MetadataError(f"topic {name!r} already exists")
                self._topics[name] = TopicImage(name, tid)
            case PartitionRecord():
                if self.topic(record.topic) is None:
                    raise MetadataError(f"partition of unknown topic {record.topic!r}")
                _check_partition(record)
                key = (record.topic, record.partition)
                self._partitions[key] = PartitionRegistration.from_record(record)
            case PartitionChange():
                old_part = self.partition(record.topic, record.partition)
                if old_part is None:
                    raise MetadataError(
                        f"change of unknown partition {record.topic}-{record.partition}"
                    )
                new_part = old_part.changed(record)
                _check_partition(new_part)
                self._partitions[new_part.key] = new_part
            case ConfigRecord():
                key = (record.resource_type, record.resource_name)
                if record.resource_type == TOPIC and self.topic(record.resource_name) is None:
                    raise MetadataError(f"config for unknown topic {record.resource_name!r}")
                if key in self._configs:
                    values = self._configs[key]
                    if values is None:  # the topic was removed (and recreated) in this delta
                        values = self._configs[key] = {}
                else:
                    values = self._configs[key] = dict(self.image.configs.get(key, {}))
                if record.value is None:
                    values.pop(record.name, None)
                else:
                    values[record.name] = record.value
            case ProducerIdsBlock(next_producer_id=next_id):
                if next_id < self._next_producer_id:
                    raise MetadataError(
                        f"producer id block ends at {next_id}, before {self._next_producer_id}"
                    )
                self._next_producer_id = next_id
            case RemoveTopic(name=name, topic_id=tid):
                t = self.topic(name)
                if t is None or t.topic_id != tid:
                    raise MetadataError(f"no topic {name!r} with id {tid}")
                self._topics[name] = None
                if name in self.image.topics:
                    self.removed_topics[name] = self.image.topics[name]
                for key in [k for k in self._partitions if k[0] == name]:
                    del self._partitions[key]
                self._configs[(TOPIC, name)] = None
            case _:
                raise MetadataError(f"unknown record {record!r}")

    # -- results -------------------------------------------------------------------------------

    def apply(self, offset: int | None = None) -> MetadataImage:
        image = self.image
        brokers = image.brokers
        if self._brokers:
            brokers = MappingProxyType({**image.brokers, **self._brokers})
        topics = image.topics
        if self._topics or self._partitions:
            merged: dict[str, TopicImage] = dict(image.topics)
            for name, t in self._topics.items():
                if t is None:
                    merged.pop(name, None)
                else:
                    merged[name] = t
            by_topic: dict[str, dict[int, PartitionRegistration]] = {}
            for (name, p), part in self._partitions.items():
                by_topic.setdefault(name, {})[p] = part
            for name, parts in by_topic.items():
                t = merged[name]
                merged[name] = replace(t, partitions=MappingProxyType({**t.partitions, **parts}))
            topics = MappingProxyType(merged)
        configs = image.configs
        if self._configs:
            new_configs = dict(image.configs)
            for key, values in self._configs.items():
                if values:
                    new_configs[key] = MappingProxyType(dict(values))
                else:
                    new_configs.pop(key, None)
            configs = MappingProxyType(new_configs)
        security = image.security
        if self._security is not None:
            security = self._security.apply(offset)
        remote = self._remote.apply() if self._remote is not None else image.remote
        return MetadataImage(
            cluster_id=self._cluster_id,
            next_producer_id=self._next_producer_id,
            brokers=brokers,
            topics=topics,
            configs=configs,
            offset=image.offset if offset is None else offset,
            security=security,
            remote=remote,
        )

    def local_changes(self, broker_id: int) -> LocalReplicaChanges:
        """Partitions ``broker_id`` now leads or follows (with new state), or must drop."""
        leaders: dict[TopicPartition, PartitionRegistration] = {}
        followers: dict[TopicPartition, PartitionRegistration] = {}
        deleted: set[TopicPartition] = set()
        for name, t in self.removed_topics.items():
            for p, part in t.partitions.items():
                if broker_id in part.replicas:
                    deleted.add((name, p))
        for key, new in self._partitions.items():
            old = self.image.partition(*key)
            if self._topics.get(key[0], True) is None:
                continue
            if broker_id not in new.replicas:
                if old is not None and broker_id in old.replicas:
                    deleted.add(key)
                continue
            if new.leader == broker_id:
                leaders[key] = new
            elif (
                old is None
                or old.leader != new.leader
                or old.leader_epoch != new.leader_epoch
                or broker_id not in old.replicas
            ):
                followers[key] = new
        return LocalReplicaChanges(leaders, followers, deleted)


_INT32 = 1 << 31


def _check_partition(p: PartitionRecord | PartitionRegistration) -> None:
    """Structural rules every partition state obeys, whoever wrote the record.

    Runs for every partition record replayed (tens of thousands at a start), so the
    usual case, a full ISR and no reassignment, takes the fewest steps.
    """
    replicas, isr = p.replicas, p.isr
    distinct = set(replicas)
    if p.partition < 0 or not replicas or len(distinct) != len(replicas):
        raise MetadataError(f"{p.topic}-{p.partition}: bad replicas {p.replicas}")
    if isr != replicas and (not isr or not set(isr) <= distinct or len(set(isr)) != len(isr)):
        raise MetadataError(f"{p.topic}-{p.partition}: ISR {p.isr} not within {p.replicas}")
    if p.leader != NO_LEADER and p.leader not in isr:
        raise MetadataError(f"{p.topic}-{p.partition}: leader {p.leader} outside ISR {p.isr}")
    if not (-_INT32 <= p.leader_epoch < _INT32 and -_INT32 <= p.partition_epoch < _INT32):
        # Kafka's epochs are int32s; past 2^64 - 1 (a change bumping one) the image
        # could not even be written to a snapshot (msgpack)
        raise MetadataError(
            f"{p.topic}-{p.partition}: leader epoch {p.leader_epoch} or partition epoch "
            f"{p.partition_epoch} is not an int32"
        )
    adding, removing, target = p.adding_replicas, p.removing_replicas, p.target_replicas
    if not target:
        if adding or removing:
            raise MetadataError(f"{p.topic}-{p.partition}: adding/removing without a target")
        return
    original = tuple(r for r in p.replicas if r not in adding)
    if (
        len(set(target)) != len(target)
        or p.replicas != original + adding
        or adding != tuple(r for r in target if r not in original)
        or removing != tuple(r for r in original if r not in target)
    ):
        raise MetadataError(
            f"{p.topic}-{p.partition}: reassignment of {list(original)} to {list(target)} "
            f"does not match replicas {list(p.replicas)}, adding {list(adding)}, "
            f"removing {list(removing)}"
        )
