"""Users' SCRAM credentials, ACLs and client quotas as every broker sees them.

Part of the metadata image (``MetadataImage.security``), replayed from the same log, so
every broker authenticates, authorizes and throttles with the same set from the moment
a change is committed (Kafka's KRaft: UserScramCredentialRecord, AccessControlEntryRecord,
ClientQuotaRecord). Like the rest of the image it is immutable: a ``SecurityDelta``
replays records and builds the next image, sharing whatever part did not change, and
an image that no security record touched is simply the previous one.

``acl_version`` moves with every ACL change (the metadata offset of the batch that
changed them), so a broker rebuilds its AclAuthorizer only when it moves.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from logmq.cluster.metadata_records import (
    MAX_BYTES_FIELD,
    AccessControlEntryRecord,
    ClientQuotaRecord,
    Record,
    RemoveAccessControlEntry,
    RemoveUserScramCredential,
    UserScramCredentialRecord,
)
from logmq.errors import ErrorCode, LogMQError
from logmq.security.acl import (
    AccessControlEntry,
    AclAuthorizer,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
    validate_binding,
)
from logmq.security.scram import MAX_ITERATIONS, MIN_ITERATIONS, SCRAM_MECHANISMS, ScramCredential

# client quota entity types and keys (Kafka's names)
QUOTA_USER = "user"
QUOTA_CLIENT_ID = "client-id"
QUOTA_ENTITY_TYPES = frozenset({QUOTA_USER, QUOTA_CLIENT_ID})
# key -> whether its value must be a whole number (Kafka's LONG quotas)
QUOTA_KEYS: Mapping[str, bool] = MappingProxyType(
    {
        "producer_byte_rate": True,
        "consumer_byte_rate": True,
        "request_percentage": False,
        "controller_mutation_rate": False,
    }
)
# DescribeClientQuotas match types (Kafka's codes)
MATCH_EXACT = 0  # the entity of that type named ``match``
MATCH_DEFAULT = 1  # the type's default entity
MATCH_SPECIFIED = 2  # any entity of that type with a name (not the default)

QuotaEntity = tuple[tuple[str, str | None], ...]  # ((type, name or None: default), ...)
ScramKey = tuple[str, str]  # (user name, mechanism)

_EMPTY: Mapping = MappingProxyType({})


class SecurityRecordError(LogMQError, ValueError):
    """A security record that cannot apply (MetadataDelta rejects its batch, as a
    MetadataError)."""

    code = ErrorCode.UNKNOWN_SERVER_ERROR


def quota_entity(parts: Mapping[str, str | None] | Iterable[tuple[str, str | None]]) -> QuotaEntity:
    """The canonical form of an entity (components sorted by type): one key per entity."""
    items = parts.items() if isinstance(parts, Mapping) else parts
    return tuple(sorted(((t, n) for t, n in items), key=lambda p: p[0]))


def quota_entity_error(entity: QuotaEntity) -> str | None:
    """Why ``entity`` is not a client quota entity logmq keeps, or None."""
    if not entity:
        return "a client quota entity needs at least one component"
    types = [t for t, _ in entity]
    unknown = [t for t in types if t not in QUOTA_ENTITY_TYPES]
    if unknown:
        return f"unknown client quota entity type {unknown[0]!r} (expected user or client-id)"
    if len(set(types)) != len(types):
        return f"entity type {types[0]!r} given more than once"
    if list(entity) != sorted(entity, key=lambda p: p[0]):
        return "entity components must be sorted by type"
    for t, name in entity:
        if name is not None and (not isinstance(name, str) or not name):
            return f"the {t} name must be a non-empty string, or None for the default"
    return None


def quota_value_error(key: str, value: float) -> str | None:
    """Why ``value`` cannot be the quota ``key``, or None."""
    whole = QUOTA_KEYS.get(key)
    if whole is None:
        return f"unknown quota key {key!r} (expected one of {', '.join(sorted(QUOTA_KEYS))})"
    try:
        finite = not isinstance(value, bool) and math.isfinite(value)
    except (TypeError, OverflowError):  # not a number, or an int too large for a float
        finite = False
    if not finite:
        return f"the value of {key} must be a finite number, got {value!r:.40}"
    if value <= 0:
        return f"the value of {key} must be > 0, got {value!r}"
    if whole and value != int(value):
        return f"the value of {key} must be a whole number, got {value!r}"
    return None


def scram_alteration_error(
    name: str, mechanism: str, iterations: int | None = None, salt_size: int = 0
) -> tuple[ErrorCode, str] | None:
    """Why AlterUserScramCredentials refuses a change of ``name`` (Kafka's codes and
    order), or None; ``iterations`` and ``salt_size`` of an upsertion (None, 0 for a
    deletion). A salt the record codec would refuse is refused here, before the log."""
    if not name:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
    if mechanism not in SCRAM_MECHANISMS:
        return ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"Unknown SCRAM mechanism {mechanism!r}"
    if iterations is not None and not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        few = iterations < MIN_ITERATIONS
        return (
            ErrorCode.UNACCEPTABLE_CREDENTIAL,
            f"Too {'few' if few else 'many'} iterations: {iterations} "
            f"(allowed {MIN_ITERATIONS}..{MAX_ITERATIONS})",
        )
    if salt_size > MAX_BYTES_FIELD:
        return (
            ErrorCode.UNACCEPTABLE_CREDENTIAL,
            f"a salt of {salt_size} bytes; at most {MAX_BYTES_FIELD} allowed",
        )
    return None


def binding_of(record: AccessControlEntryRecord) -> AclBinding:
    """The binding an ACL record states (ValueError on an unknown code)."""
    return AclBinding(
        ResourcePattern(
            ResourceType(record.resource_type),
            record.resource_name,
            PatternType(record.pattern_type),
        ),
        AccessControlEntry(
            record.principal,
            record.host,
            AclOperation(record.operation),
            AclPermissionType(record.permission_type),
        ),
    )


def acl_record(acl_id: str, binding: AclBinding) -> AccessControlEntryRecord:
    p, e = binding.pattern, binding.entry
    return AccessControlEntryRecord(
        acl_id,
        int(p.resource_type),
        p.name,
        int(p.pattern_type),
        e.principal,
        e.host,
        int(e.operation),
        int(e.permission_type),
    )


def scram_record(name: str, cred: ScramCredential) -> UserScramCredentialRecord:
    return UserScramCredentialRecord(
        name, cred.mechanism, cred.salt, cred.stored_key, cred.server_key, cred.iterations
    )


# -- answers to describe requests ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScramUserDescription:
    """One user of DescribeUserScramCredentials: mechanisms and iterations, never keys."""

    user: str
    error: ErrorCode = ErrorCode.NONE
    message: str | None = None
    credentials: tuple[tuple[str, int], ...] = ()  # (mechanism, iterations)


@dataclass(frozen=True, slots=True)
class QuotaFilterComponent:
    entity_type: str
    match_type: int = MATCH_EXACT  # MATCH_EXACT / MATCH_DEFAULT / MATCH_SPECIFIED
    match: str | None = None  # the name, for MATCH_EXACT

    def matches(self, name: str | None) -> bool:
        if self.match_type == MATCH_EXACT:
            return name is not None and name == self.match
        if self.match_type == MATCH_DEFAULT:
            return name is None
        return name is not None


@dataclass(frozen=True, slots=True)
class ClientQuotasDescription:
    error: ErrorCode = ErrorCode.NONE
    message: str | None = None
    entries: tuple[tuple[QuotaEntity, Mapping[str, float]], ...] = ()


def quota_filter_error(components: Sequence[QuotaFilterComponent]) -> str | None:
    seen: set[str] = set()
    for c in components:
        if c.entity_type not in QUOTA_ENTITY_TYPES:
            return f"unknown client quota entity type {c.entity_type!r}"
        if c.entity_type in seen:
            return f"entity type {c.entity_type!r} is filtered more than once"
        seen.add(c.entity_type)
        if c.match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED):
            return f"unknown match type {c.match_type!r}"
        if c.match_type == MATCH_EXACT and c.match is None:
            return f"an exact match of {c.entity_type} needs a name"
        if c.match_type != MATCH_EXACT and c.match is not None:
            return f"only an exact match of {c.entity_type} names one"
    return None


# -- the image -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SecurityImage:
    scram: Mapping[ScramKey, ScramCredential] = field(default_factory=lambda: _EMPTY)
    acls: Mapping[str, AclBinding] = field(default_factory=lambda: _EMPTY)  # by record id
    quotas: Mapping[QuotaEntity, Mapping[str, float]] = field(default_factory=lambda: _EMPTY)
    acl_version: int = 0  # moves on every ACL change: the offset of the batch, at least

    # -- queries -----------------------------------------------------------------------

    def scram_credential(self, name: str, mechanism: str) -> ScramCredential | None:
        """The credential a SCRAM exchange checks (ScramServer's lookup)."""
        return self.scram.get((name, mechanism))

    @cached_property
    def scram_users(self) -> Mapping[str, tuple[ScramCredential, ...]]:
        """user -> its credentials, by mechanism name."""
        out: dict[str, list[ScramCredential]] = {}
        for (name, _), cred in sorted(self.scram.items()):
            out.setdefault(name, []).append(cred)
        return MappingProxyType({n: tuple(c) for n, c in out.items()})

    @cached_property
    def acl_bindings(self) -> tuple[AclBinding, ...]:
        """Every binding, built once per image (what an AclAuthorizer is built from)."""
        return tuple(self.acls[i] for i in sorted(self.acls))

    @cached_property
    def acl_ids(self) -> Mapping[AclBinding, str]:
        """The record id of each binding (a binding is stored once)."""
        return MappingProxyType({b: i for i, b in self.acls.items()})

    def matching_acls(self, filter: AclBindingFilter) -> list[AclBinding]:
        return [b for b in self.acl_bindings if filter.matches(b)]

    def authorizer(self, **settings: object) -> AclAuthorizer:
        """A new AclAuthorizer of these bindings (``settings``: its keyword options)."""
        return AclAuthorizer(self.acl_bindings, **settings)  # type: ignore[arg-type]

    def describe_scram(self, names: Sequence[str] | None = None) -> list[ScramUserDescription]:
        """DescribeUserScramCredentials: every user with credentials (``names`` None or
        empty), or the users named, in request order; a user named twice gets
        DUPLICATE_RESOURCE, one without credentials RESOURCE_NOT_FOUND (Kafka's codes)."""
        users = self.scram_users
        if not names:
            return [
                ScramUserDescription(n, credentials=_cred_info(users[n])) for n in sorted(users)
            ]
        counts: dict[str, int] = {}
        for n in names:
            counts[n] = counts.get(n, 0) + 1
        out = []
        for n in counts:
            if counts[n] > 1:
                message = f"Cannot describe SCRAM credentials for the same user twice: {n}"
                out.append(ScramUserDescription(n, ErrorCode.DUPLICATE_RESOURCE, message))
            elif n not in users:
                message = f"Attempt to describe a user credential that does not exist: {n}"
                out.append(ScramUserDescription(n, ErrorCode.RESOURCE_NOT_FOUND, message))
            else:
                out.append(ScramUserDescription(n, credentials=_cred_info(users[n])))
        return out

    def describe_client_quotas(
        self, components: Sequence[QuotaFilterComponent], strict: bool = False
    ) -> ClientQuotasDescription:
        """DescribeClientQuotas: the entities every component matches (``strict``: and
        that have no component of another type), with their quota values."""
        problem = quota_filter_error(components)
        if problem:
            return ClientQuotasDescription(ErrorCode.INVALID_REQUEST, problem)
        wanted = {c.entity_type: c for c in components}
        entries = []
        for entity in sorted(self.quotas, key=_entity_sort_key):
            names = dict(entity)
            if strict and set(names) != set(wanted):
                continue
            if all(t in names and c.matches(names[t]) for t, c in wanted.items()):
                entries.append((entity, self.quotas[entity]))
        return ClientQuotasDescription(entries=tuple(entries))

    # -- changes and snapshots ---------------------------------------------------------

    def apply(self, records: Iterable[Record], offset: int | None = None) -> SecurityImage:
        delta = SecurityDelta(self)
        for record in records:
            delta.replay(record)
        return delta.apply(offset)

    def to_records(self) -> list[Record]:
        out: list[Record] = [scram_record(n, c) for (n, _), c in sorted(self.scram.items())]
        out += [acl_record(i, self.acls[i]) for i in sorted(self.acls)]
        for entity in sorted(self.quotas, key=_entity_sort_key):
            values = self.quotas[entity]
            out += [ClientQuotaRecord(entity, k, values[k]) for k in sorted(values)]
        return out


EMPTY_SECURITY = SecurityImage()
SECURITY_RECORD_TYPES = (
    UserScramCredentialRecord,
    RemoveUserScramCredential,
    AccessControlEntryRecord,
    RemoveAccessControlEntry,
    ClientQuotaRecord,
)


def _cred_info(creds: Iterable[ScramCredential]) -> tuple[tuple[str, int], ...]:
    return tuple((c.mechanism, c.iterations) for c in creds)


def _entity_sort_key(entity: QuotaEntity) -> tuple:
    return tuple((t, n is not None, n or "") for t, n in entity)


class SecurityDelta:
    """Security records replayed on top of a SecurityImage; ``apply`` gives the next one."""

    def __init__(self, image: SecurityImage) -> None:
        self.image = image
        self._scram: dict[ScramKey, ScramCredential | None] = {}  # None: removed
        self._acls: dict[str, AclBinding | None] = {}
        self._quotas: dict[QuotaEntity, dict[str, float]] = {}
        self._acls_changed = False

    def _acl(self, acl_id: str) -> AclBinding | None:
        if acl_id in self._acls:
            return self._acls[acl_id]
        return self.image.acls.get(acl_id)

    def replay(self, record: Record) -> None:
        match record:
            case UserScramCredentialRecord():
                if not record.name:
                    raise SecurityRecordError("a SCRAM credential needs a user name")
                try:
                    cred = ScramCredential(
                        record.mechanism,
                        record.salt,
                        record.stored_key,
                        record.server_key,
                        record.iterations,
                    )
                except ValueError as err:
                    raise SecurityRecordError(f"SCRAM credential of {record.name!r}: {err}")
                self._scram[(record.name, record.mechanism)] = cred
            case RemoveUserScramCredential(name=name, mechanism=mechanism):
                key = (name, mechanism)
                current = self._scram[key] if key in self._scram else self.image.scram.get(key)
                if current is None:
                    raise SecurityRecordError(f"no {mechanism} credential of {name!r} to remove")
                self._scram[key] = None
            case AccessControlEntryRecord():
                if not record.id or self._acl(record.id) is not None:
                    raise SecurityRecordError(f"ACL id {record.id!r} is empty or taken")
                try:
                    binding = binding_of(record)
                except ValueError as err:
                    raise SecurityRecordError(f"ACL {record.id}: {err}")
                problem = validate_binding(binding)
                if problem:
                    raise SecurityRecordError(f"ACL {record.id}: {problem}")
                self._acls[record.id] = binding
                self._acls_changed = True
            case RemoveAccessControlEntry(id=acl_id):
                if self._acl(acl_id) is None:
                    raise SecurityRecordError(f"no ACL {acl_id!r} to remove")
                self._acls[acl_id] = None
                self._acls_changed = True
            case ClientQuotaRecord(entity=entity, key=key, value=value):
                problem = quota_entity_error(entity)
                if problem is None and value is not None:
                    problem = quota_value_error(key, value)
                if problem is None and not key:
                    problem = "an empty quota key"
                if problem:
                    raise SecurityRecordError(f"client quota {entity}: {problem}")
                values = self._quotas.get(entity)
                if values is None:
                    values = self._quotas[entity] = dict(self.image.quotas.get(entity, {}))
                if value is None:
                    values.pop(key, None)
                else:
                    values[key] = value
            case _:
                raise SecurityRecordError(f"not a security record: {record!r}")

    def apply(self, offset: int | None = None) -> SecurityImage:
        image = self.image
        if not (self._scram or self._acls or self._quotas):
            return image
        scram, acls, quotas = image.scram, image.acls, image.quotas
        if self._scram:
            merged_scram = dict(scram)
            for key, cred in self._scram.items():
                if cred is None:
                    merged_scram.pop(key, None)
                else:
                    merged_scram[key] = cred
            scram = MappingProxyType(merged_scram)
        if self._acls:
            merged_acls = dict(acls)
            for acl_id, binding in self._acls.items():
                if binding is None:
                    merged_acls.pop(acl_id, None)
                else:
                    merged_acls[acl_id] = binding
            acls = MappingProxyType(merged_acls)
        if self._quotas:
            merged_quotas = dict(quotas)
            for entity, values in self._quotas.items():
                if values:
                    merged_quotas[entity] = MappingProxyType(dict(values))
                else:
                    merged_quotas.pop(entity, None)
            quotas = MappingProxyType(merged_quotas)
        version = image.acl_version
        if self._acls_changed:
            version = max(version + 1, offset or 0)
        return SecurityImage(scram=scram, acls=acls, quotas=quotas, acl_version=version)
