"""The records of the cluster-metadata log, and their msgpack bytes.

Every change to the cluster (a broker registering, a topic created, a leader elected, an
ISR shrinking, a config set) is one of these records. The controller produces them, the
metadata quorum replicates them, and every broker applies them in log order to its
MetadataImage. A Raft entry holds a *batch* of records that is applied atomically (a
topic and all its partitions appear together, or not at all).

Records state facts, not requests. A PartitionRecord is the full state of a partition; a
PartitionChange is a delta whose epochs are derived when applied (any change bumps the
partition epoch; a leader election, even re-electing the same broker, bumps the leader
epoch), so no record can carry an epoch that disagrees with the log.

Bytes: a batch is ``[version, [record, ...]]`` and a record ``[type, *fields]`` in
dataclass order. Decoding checks every type; a record with *more* fields than we know
(written by a newer version) keeps the ones we know, and missing trailing fields take
their defaults, so fields can be appended without breaking older brokers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import MISSING, dataclass, field, fields
from functools import cache
from typing import Any

import msgpack

from logmq.errors import ErrorCode, LogMQError

NO_LEADER = -1
BATCH_VERSION = 1


class MetadataCodecError(LogMQError, ValueError):
    """A metadata record or batch that cannot be decoded (the Raft entry is rejected)."""

    code = ErrorCode.CORRUPT_MESSAGE


@dataclass(frozen=True, slots=True)
class ClusterIdRecord:
    """The cluster's id, chosen once by the first controller (see meta_properties.py)."""

    cluster_id: str


@dataclass(frozen=True, slots=True)
class RegisterBroker:
    """A broker incarnation joined; it stays fenced until it has caught up with the log.

    ``broker_epoch`` grows with every registration of the same id, so requests from a
    previous incarnation (a restarted process) are recognisable and refused.
    """

    broker_id: int
    broker_epoch: int
    incarnation_id: str
    host: str
    port: int
    rack: str | None = None
    # the Kafka listener as clients reach it (None: a broker without one, or older)
    kafka_host: str | None = None
    kafka_port: int = -1
    # every Kafka listener as clients reach it, "NAME://host:port,..." (None: only the
    # one above); a client is told the brokers' endpoints on the listener it came in on
    kafka_listeners: str | None = None


@dataclass(frozen=True, slots=True)
class BrokerFenced:
    """The broker may not lead or be added to an ISR (missed heartbeats, or shut down)."""

    broker_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class BrokerUnfenced:
    broker_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class BrokerStorageFull:
    """The broker's data directory is full (1) or has room again (0), as its heartbeats
    say: a full broker hands its leaderships to in-sync replicas with room and leaves
    the ISRs it cannot follow (Kafka: an offline log directory)."""

    broker_id: int
    broker_epoch: int
    full: int


@dataclass(frozen=True, slots=True)
class TopicRecord:
    name: str
    topic_id: str  # tells a recreated topic from the deleted one of the same name


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    """The full state of one partition (at creation, and in snapshots).

    A partition being reassigned names its ``target_replicas`` (in the target's order);
    ``replicas`` is then the original replicas followed by ``adding_replicas`` (those
    being copied onto new brokers), and ``removing_replicas`` are the originals that
    leave once every target replica is in the ISR. Not moving: all three are empty.
    """

    topic: str
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()
    target_replicas: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PartitionChange:
    """A change of one partition; ``None`` fields are unchanged.

    Setting ``leader`` records an election (it may be NO_LEADER) and bumps the leader
    epoch; every PartitionChange bumps the partition epoch.
    """

    topic: str
    partition: int
    leader: int | None = None
    isr: tuple[int, ...] | None = None
    replicas: tuple[int, ...] | None = None
    adding_replicas: tuple[int, ...] | None = None
    removing_replicas: tuple[int, ...] | None = None
    target_replicas: tuple[int, ...] | None = None  # () ends a reassignment


@dataclass(frozen=True, slots=True)
class ConfigRecord:
    """Set (``value`` is a string) or delete (``value is None``) one config key."""

    resource_type: str  # "topic", or "broker" with name "" for cluster-wide settings
    resource_name: str
    name: str
    value: str | None


@dataclass(frozen=True, slots=True)
class RemoveTopic:
    name: str
    topic_id: str


@dataclass(frozen=True, slots=True)
class ProducerIdsBlock:
    """Producer ids below ``next_producer_id`` are taken (a block went to ``broker_id``).

    Brokers hand out idempotent-producer ids from blocks the controller allocates here,
    so no two brokers ever give out the same id, across restarts and failovers.
    """

    broker_id: int
    next_producer_id: int


@dataclass(frozen=True, slots=True)
class UserScramCredentialRecord:
    """A user's SCRAM credential for one mechanism (set or replaced); never a password."""

    name: str
    mechanism: str  # "SCRAM-SHA-256" or "SCRAM-SHA-512"
    salt: bytes
    stored_key: bytes = field(repr=False)  # kept out of logs
    server_key: bytes = field(repr=False)
    iterations: int


@dataclass(frozen=True, slots=True)
class RemoveUserScramCredential:
    name: str
    mechanism: str


@dataclass(frozen=True, slots=True)
class AccessControlEntryRecord:
    """One ACL binding; ``id`` (a uuid) lets a removal name exactly this one. The enum
    fields carry Kafka's wire codes (security/acl.py)."""

    id: str
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int


@dataclass(frozen=True, slots=True)
class RemoveAccessControlEntry:
    id: str


@dataclass(frozen=True, slots=True)
class ClientQuotaRecord:
    """Set (a number) or remove (None) one quota key of a client entity.

    ``entity`` is ((entity_type, name), ...) sorted by type, e.g. (("client-id", None),
    ("user", "alice")): user alice's default for client ids; a None name is the
    type's default entity.
    """

    entity: tuple[tuple[str, str | None], ...]
    key: str
    value: float | None


@dataclass(frozen=True, slots=True)
class RemoteSegmentRecord:
    """A segment copied (being copied) to the remote tier: every field of
    storage/remote/segment_metadata.RemoteSegment, ``state`` as its number.

    Written at COPY_STARTED by the controller, and in snapshots in whatever state the
    segment is in. Keyed by topic id, not name: a deleted topic's segments stay in the
    image until their objects are deleted (metadata_image.orphaned_remote_partitions).
    """

    topic_id: str
    partition: int
    segment_id: str
    base_offset: int
    end_offset: int
    max_timestamp: int
    size_bytes: int
    leader_epochs: tuple[tuple[int, int], ...]  # (epoch, start offset), ascending
    copier_epoch: int
    broker_id: int
    state: int = 0  # a SegmentState
    checksum: str = ""
    event_ms: int = 0
    topic: str = ""  # the topic's name at copy time (the objects' keys hold it)
    corrupt: int = 0  # 1: found not matching its checksums (never served)


@dataclass(frozen=True, slots=True)
class RemoteSegmentStateChange:
    """A remote segment moved to ``state`` (a SegmentState); DELETE_FINISHED removes it
    from the image. An empty ``checksum`` keeps the segment's. ``corrupt`` 1 (with the
    state it is in, COPY_FINISHED) marks it found corrupt."""

    topic_id: str
    partition: int
    segment_id: str
    state: int
    checksum: str = ""
    event_ms: int = 0
    corrupt: int = 0


Record = (
    ClusterIdRecord
    | RegisterBroker
    | BrokerFenced
    | BrokerUnfenced
    | TopicRecord
    | PartitionRecord
    | PartitionChange
    | ConfigRecord
    | RemoveTopic
    | ProducerIdsBlock
    | BrokerStorageFull
    | UserScramCredentialRecord
    | RemoveUserScramCredential
    | AccessControlEntryRecord
    | RemoveAccessControlEntry
    | ClientQuotaRecord
    | RemoteSegmentRecord
    | RemoteSegmentStateChange
)

# Type codes are part of the log format: append only, never renumber.
_TYPES: dict[int, type] = {
    1: ClusterIdRecord,
    2: RegisterBroker,
    3: BrokerFenced,
    4: BrokerUnfenced,
    5: TopicRecord,
    6: PartitionRecord,
    7: PartitionChange,
    8: ConfigRecord,
    9: RemoveTopic,
    10: ProducerIdsBlock,
    11: BrokerStorageFull,
    12: UserScramCredentialRecord,
    13: RemoveUserScramCredential,
    14: AccessControlEntryRecord,
    15: RemoveAccessControlEntry,
    16: ClientQuotaRecord,
    17: RemoteSegmentRecord,
    18: RemoteSegmentStateChange,
}
_CODES = {cls: code for code, cls in _TYPES.items()}

# Field kinds: i int, s str, I int tuple, b bytes, f float, E a client-quota entity (an
# array of [type, name-or-None] pairs), k a short str (an id or a checksum, at most
# MAX_ID_CHARS), P an array of [int, int] pairs (at most MAX_PAIRS); a trailing "?"
# allows None.
_KINDS: dict[type, str] = {
    ClusterIdRecord: "s",
    RegisterBroker: "i i s s i s? s? i s?",
    BrokerFenced: "i i",
    BrokerUnfenced: "i i",
    TopicRecord: "s s",
    PartitionRecord: "s i I I i i i I I I",
    PartitionChange: "s i i? I? I? I? I? I?",
    ConfigRecord: "s s s s?",
    RemoveTopic: "s s",
    ProducerIdsBlock: "i i",
    BrokerStorageFull: "i i i",
    UserScramCredentialRecord: "s s b b b i",
    RemoveUserScramCredential: "s s",
    AccessControlEntryRecord: "s i s i s s i i",
    RemoveAccessControlEntry: "s",
    ClientQuotaRecord: "E s f?",
    RemoteSegmentRecord: "k i k i i i i P i i i k i s i",
    RemoteSegmentStateChange: "k i k i k i i",
}
# bounds on what untrusted bytes can make the codec build: a SCRAM salt or key is tens
# of bytes, and a quota entity has one component per entity type
MAX_BYTES_FIELD = 1024
MAX_ENTITY_PARTS = 4
# a topic id, a remote segment id (uuid hex) or a checksum (xxh3-64 hex) is tens of
# characters; a segment's leader epochs are one per election within it
MAX_ID_CHARS = 128
MAX_PAIRS = 4096


def encode_record(record: Record) -> list[Any]:
    out: list[Any] = [_CODES[type(record)]]
    for name in _names(type(record)):
        value = getattr(record, name)
        out.append(list(value) if isinstance(value, tuple) else value)
    return out


def decode_record(raw: Any) -> Record:
    if not (isinstance(raw, list) and raw and type(raw[0]) is int):
        raise MetadataCodecError(f"a metadata record is an array [type, ...], got {raw!r:.60}")
    cls = _TYPES.get(raw[0])
    if cls is None:
        raise MetadataCodecError(f"unknown metadata record type {raw[0]}")
    record = _fast_decoder(cls)(raw)
    return record if record is not None else _decode_checked(cls, raw)


def _decode_checked(cls: type, raw: list[Any]) -> Record:
    """Field by field, with what is wrong named (and older or newer field counts)."""
    decoders, required = _decoders(cls)
    values = raw[1 : 1 + len(decoders)]
    if len(values) < required:
        raise MetadataCodecError(f"{cls.__name__} needs {required} fields, got {len(values)}")
    try:
        decoded = [decode(value) for decode, value in zip(decoders, values, strict=False)]
    except MetadataCodecError as err:
        raise MetadataCodecError(f"{cls.__name__}: {err}") from None
    return cls(*decoded)


def encode_records(records: Iterable[Record]) -> bytes:
    """One Raft entry: a batch applied atomically."""
    return msgpack.packb([BATCH_VERSION, [encode_record(r) for r in records]], use_bin_type=True)


def decode_records(data: bytes | bytearray | memoryview) -> list[Record]:
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException) as err:
        raise MetadataCodecError(f"not a metadata record batch: {err}")
    if not (isinstance(raw, list) and len(raw) == 2 and isinstance(raw[1], list)):
        raise MetadataCodecError("a metadata batch is [version, [records]]")
    if raw[0] != BATCH_VERSION:
        raise MetadataCodecError(f"unknown metadata batch version {raw[0]!r}")
    return [decode_record(r) for r in raw[1]]


def iter_records(data: bytes | bytearray | memoryview) -> Iterator[Record]:
    """``decode_records`` one record at a time, for a snapshot: a whole image's raw
    msgpack lists and records never exist at once (10,000 remote segments' worth was
    most of a start's memory peak, which the process keeps)."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=max(1, len(data)))
    try:
        unpacker.feed(data)
        if unpacker.read_array_header() != 2:
            raise MetadataCodecError("a metadata batch is [version, [records]]")
        version = unpacker.unpack()
        if version != BATCH_VERSION:
            raise MetadataCodecError(f"unknown metadata batch version {version!r}")
        count = unpacker.read_array_header()
        for _ in range(count):
            yield decode_record(unpacker.unpack())
        if unpacker.tell() != len(data):
            raise MetadataCodecError("bytes after the metadata batch")
    except (ValueError, TypeError, msgpack.UnpackException) as err:
        if isinstance(err, MetadataCodecError):
            raise
        raise MetadataCodecError(f"not a metadata record batch: {err}") from None


@cache
def _decoders(cls: type) -> tuple[tuple[Callable[[Any], Any], ...], int]:
    """The field decoders of a record type and how many fields it requires (a start
    replays every record of the metadata log: nothing per record that need not be)."""
    kinds = _KINDS[cls].split()
    return tuple(_DECODE[k] for k in kinds), sum(1 for f in _fields(cls) if f[1])


_FAST_CHECKS = {
    "i": "type({v}) is int",
    "s": "type({v}) is str",
    "I": "type({v}) is list and all(type(x) is int for x in {v})",
    "b": "type({v}) is bytes and len({v}) <= MAX_BYTES_FIELD",
    "f": "type({v}) is float",
    "E": (
        "type({v}) is list and len({v}) <= MAX_ENTITY_PARTS and all(type(p) is list and "
        "len(p) == 2 and type(p[0]) is str and (p[1] is None or type(p[1]) is str) "
        "for p in {v})"
    ),
    "k": "type({v}) is str and len({v}) <= MAX_ID_CHARS",
    "P": (
        "type({v}) is list and (len({v}) == 1 and type({v}[0]) is list and "
        "len({v}[0]) == 2 and type({v}[0][0]) is int and type({v}[0][1]) is int or "
        "len({v}) <= MAX_PAIRS and all(type(p) is list and "
        "len(p) == 2 and type(p[0]) is int and type(p[1]) is int for p in {v}))"
    ),
}
# how a checked field becomes the dataclass value (as is, unless named here)
_FAST_ARGS = {
    "I": "tuple({v})",
    "E": "tuple((p[0], p[1]) for p in {v})",
    # one pair (a segment within one leader epoch) without a generator: a start
    # builds one per remote segment
    "P": "((({v}[0][0], {v}[0][1]),) if len({v}) == 1 else tuple((p[0], p[1]) for p in {v}))",
}


@cache
def _fast_decoder(cls: type) -> Callable[[list[Any]], Any]:
    """A function that builds ``cls`` from a record holding every field with its kind
    (None otherwise: the general path then decodes it or says what is wrong).

    A start replays every partition record of the metadata log and a broker restart
    writes two changes per partition it holds; generated once per type, the checks run
    inline instead of as a function call per field.
    """
    checks, args = [f"len(raw) == {len(_KINDS[cls].split()) + 1}"], []
    for i, kind in enumerate(_KINDS[cls].split(), 1):
        v = f"raw[{i}]"
        check = _FAST_CHECKS[kind.rstrip("?")].format(v=v)
        checks.append(f"({v} is None or {check})" if kind.endswith("?") else check)
        arg = _FAST_ARGS.get(kind.rstrip("?"), "{v}").format(v=v)
        args.append(f"None if {v} is None else {arg}" if kind.endswith("?") and arg != v else arg)
    source = (
        f"def decode(raw):\n    if {' and '.join(checks)}:\n"
        f"        return cls({', '.join(args)})\n    return None\n"
    )
    namespace: dict[str, Any] = {
        "cls": cls,
        "MAX_BYTES_FIELD": MAX_BYTES_FIELD,
        "MAX_ENTITY_PARTS": MAX_ENTITY_PARTS,
        "MAX_ID_CHARS": MAX_ID_CHARS,
        "MAX_PAIRS": MAX_PAIRS,
    }
    exec(source, namespace)  # built from the fixed kinds table above, never from input
    return namespace["decode"]


@cache
def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


@cache
def _fields(cls: type) -> tuple[tuple[str, bool], ...]:
    """(name, required) per field."""
    return tuple(
        (f.name, f.default is MISSING and f.default_factory is MISSING) for f in fields(cls)
    )


def _int(value: Any) -> int:
    if type(value) is not int:
        raise MetadataCodecError(f"expected an integer, got {value!r:.40}")
    return value


def _str(value: Any) -> str:
    if type(value) is not str:
        raise MetadataCodecError(f"expected a string, got {value!r:.40}")
    return value


def _ints(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise MetadataCodecError(f"expected an array of integers, got {value!r:.40}")
    for v in value:
        if type(v) is not int:
            raise MetadataCodecError(f"expected an integer, got {v!r:.40}")
    return tuple(value)


def _bytes(value: Any) -> bytes:
    if type(value) is not bytes:
        raise MetadataCodecError(f"expected bytes, got {value!r:.40}")
    if len(value) > MAX_BYTES_FIELD:
        raise MetadataCodecError(f"{len(value)} bytes, at most {MAX_BYTES_FIELD} allowed")
    return value


def _float(value: Any) -> float:
    if type(value) is not float:
        raise MetadataCodecError(f"expected a float, got {value!r:.40}")
    return value


def _entity(value: Any) -> tuple[tuple[str, str | None], ...]:
    if not isinstance(value, list) or len(value) > MAX_ENTITY_PARTS:
        raise MetadataCodecError(
            f"expected an array of at most {MAX_ENTITY_PARTS} [type, name] pairs, got {value!r:.40}"
        )
    out = []
    for part in value:
        if not (
            isinstance(part, list)
            and len(part) == 2
            and type(part[0]) is str
            and (part[1] is None or type(part[1]) is str)
        ):
            raise MetadataCodecError(f"expected a [type, name-or-nil] pair, got {part!r:.40}")
        out.append((part[0], part[1]))
    return tuple(out)


def _short_str(value: Any) -> str:
    if type(value) is not str:
        raise MetadataCodecError(f"expected a string, got {value!r:.40}")
    if len(value) > MAX_ID_CHARS:
        raise MetadataCodecError(f"a {len(value)}-character id, at most {MAX_ID_CHARS} allowed")
    return value


def _pairs(value: Any) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, list) or len(value) > MAX_PAIRS:
        raise MetadataCodecError(
            f"expected an array of at most {MAX_PAIRS} [int, int] pairs, got {value!r:.40}"
        )
    for pair in value:
        if not (
            isinstance(pair, list)
            and len(pair) == 2
            and type(pair[0]) is int
            and type(pair[1]) is int
        ):
            raise MetadataCodecError(f"expected an [int, int] pair, got {pair!r:.40}")
    return tuple((p[0], p[1]) for p in value)


def _optional(decode: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else decode(value)


_DECODE: dict[str, Callable[[Any], Any]] = {
    "i": _int,
    "s": _str,
    "I": _ints,
    "i?": _optional(_int),
    "s?": _optional(_str),
    "I?": _optional(_ints),
    "b": _bytes,
    "f": _float,
    "f?": _optional(_float),
    "E": _entity,
    "k": _short_str,
    "P": _pairs,
}
