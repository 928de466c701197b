"""Kafka's ACL model and authorizer, as a sans-IO core.

The enums carry Kafka's wire codes so CreateAcls/DescribeAcls/DeleteAcls bodies map onto
them directly. ``AclAuthorizer`` holds the committed ACL set (fed from the metadata log)
and answers ``authorize`` with the semantics of Kafka's StandardAuthorizer: super users
first; then the ACLs that apply to the resource (literal on its name, literal ``*``, and
prefixed ones whose prefix starts the name); a matching DENY wins, else a matching ALLOW
grants, else the answer is DENY - unless *no* ACL at all applies to the resource, when
``allow_everyone_if_no_acl_found`` decides.

Requests on a connection repeat the same few (operation, resource) questions, so
``AuthorizationCache`` memoises answers per connection and drops them whenever the
authorizer's ``version`` moves.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

WILDCARD = "*"  # a literal resource name matching every name, and the any-host entry
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class AclPermissionType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


_Op = AclOperation

# Kafka's per-resource-type operation lists (ALL is valid everywhere).
SUPPORTED_OPERATIONS: Mapping[ResourceType, frozenset[AclOperation]] = {
    ResourceType.TOPIC: frozenset(
        {
            _Op.READ,
            _Op.WRITE,
            _Op.CREATE,
            _Op.DESCRIBE,
            _Op.DELETE,
            _Op.ALTER,
            _Op.DESCRIBE_CONFIGS,
            _Op.ALTER_CONFIGS,
        }
    ),
    ResourceType.GROUP: frozenset({_Op.READ, _Op.DESCRIBE, _Op.DELETE}),
    ResourceType.CLUSTER: frozenset(
        {
            _Op.CREATE,
            _Op.CLUSTER_ACTION,
            _Op.DESCRIBE_CONFIGS,
            _Op.ALTER_CONFIGS,
            _Op.IDEMPOTENT_WRITE,
            _Op.ALTER,
            _Op.DESCRIBE,
        }
    ),
    ResourceType.TRANSACTIONAL_ID: frozenset({_Op.DESCRIBE, _Op.WRITE}),
    ResourceType.DELEGATION_TOKEN: frozenset({_Op.DESCRIBE}),
    ResourceType.USER: frozenset({_Op.CREATE_TOKENS, _Op.DESCRIBE_TOKENS}),
}

# Only ALLOW entries imply: an ALLOW of READ grants DESCRIBE, a DENY of READ denies READ only.
_IMPLIED_BY: Mapping[AclOperation, frozenset[AclOperation]] = {
    _Op.DESCRIBE: frozenset({_Op.READ, _Op.WRITE, _Op.DELETE, _Op.ALTER}),
    _Op.DESCRIBE_CONFIGS: frozenset({_Op.ALTER_CONFIGS}),
}
# operation asked -> the entry operations that grant it (ALLOW) / refuse it (DENY)
_ALLOWED_BY: dict[AclOperation, frozenset[AclOperation]] = {
    op: frozenset({op, _Op.ALL}) | _IMPLIED_BY.get(op, frozenset()) for op in AclOperation
}
_DENIED_BY: dict[AclOperation, frozenset[AclOperation]] = {
    op: frozenset({op, _Op.ALL}) for op in AclOperation
}


@dataclass(frozen=True, slots=True)
class ResourcePattern:
    resource_type: ResourceType
    name: str
    pattern_type: PatternType = PatternType.LITERAL


@dataclass(frozen=True, slots=True)
class AccessControlEntry:
    principal: str  # "Type:name", e.g. "User:alice"; "User:*" matches every principal
    host: str  # an address as the broker sees the peer, or "*"
    operation: AclOperation
    permission_type: AclPermissionType


@dataclass(frozen=True, slots=True)
class AclBinding:
    pattern: ResourcePattern
    entry: AccessControlEntry


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """A DescribeAcls/DeleteAcls filter; every default matches anything.

    ``pattern_type``: ANY matches every stored pattern type with an exact name; MATCH
    matches the bindings that would *apply* to ``name`` (literal on it, literal ``*``,
    prefixed ones that start it); LITERAL/PREFIXED match that type with an exact name.
    ``name``/``principal``/``host`` of None match any value.
    """

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission_type: AclPermissionType = AclPermissionType.ANY

    @property
    def is_unknown(self) -> bool:
        """A filter naming an UNKNOWN value; Kafka refuses it in DeleteAcls."""
        return validate_filter(self) is not None

    def matches_pattern(self, pattern: ResourcePattern) -> bool:
        rt = self.resource_type
        if rt != ResourceType.ANY and rt != pattern.resource_type:
            return False
        pt = self.pattern_type
        if pt != PatternType.ANY and pt != PatternType.MATCH and pt != pattern.pattern_type:
            return False
        name = self.name
        if name is None:
            return True
        if pt != PatternType.MATCH:
            return name == pattern.name
        if pattern.pattern_type == PatternType.LITERAL:
            return name == pattern.name or pattern.name == WILDCARD
        if pattern.pattern_type == PatternType.PREFIXED:
            return name.startswith(pattern.name)
        return False

    def matches_entry(self, entry: AccessControlEntry) -> bool:
        if self.principal is not None and self.principal != entry.principal:
            return False
        if self.host is not None and self.host != entry.host:
            return False
        if self.operation != AclOperation.ANY and self.operation != entry.operation:
            return False
        return (
            self.permission_type == AclPermissionType.ANY
            or self.permission_type == entry.permission_type
        )

    def matches(self, binding: AclBinding) -> bool:
        return self.matches_pattern(binding.pattern) and self.matches_entry(binding.entry)


UNKNOWN_PATTERN_FILTER_MESSAGE = "Unknown patternFilter."
UNKNOWN_ENTRY_FILTER_MESSAGE = "Unknown entryFilter."


def validate_filter(f: AclBindingFilter) -> str | None:
    """DeleteAcls refuses a filter with an UNKNOWN value (INVALID_REQUEST); None if fine."""
    if f.resource_type == ResourceType.UNKNOWN or f.pattern_type == PatternType.UNKNOWN:
        return UNKNOWN_PATTERN_FILTER_MESSAGE
    if f.operation == AclOperation.UNKNOWN or f.permission_type == AclPermissionType.UNKNOWN:
        return UNKNOWN_ENTRY_FILTER_MESSAGE
    return None


def validate_binding(binding: AclBinding) -> str | None:
    """Why CreateAcls must refuse ``binding`` (an INVALID_REQUEST message), or None.

    Kafka's broker checks the CLUSTER name and the empty name first, then the controller
    refuses non-concrete enum values and a principal without a colon; the message texts
    follow Kafka's. Two checks are logmq's own (Kafka leaves them to its CLI, or accepts
    ACLs that can never match): an operation the resource type does not support, and a
    PREFIXED pattern named ``*``.
    """
    pattern, entry = binding.pattern, binding.entry
    if pattern.resource_type == ResourceType.CLUSTER and pattern.name != CLUSTER_NAME:
        return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
    if not pattern.name:
        return "Invalid empty resource name"
    if pattern.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        return f"Invalid resourceType {pattern.resource_type.name}"
    if pattern.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return f"Invalid patternType {pattern.pattern_type.name}"
    if entry.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        return f"Invalid operation {entry.operation.name}"
    if entry.permission_type not in (AclPermissionType.DENY, AclPermissionType.ALLOW):
        return f"Invalid permissionType {entry.permission_type.name}"
    if ":" not in entry.principal:
        return (
            f"Could not parse principal from `{entry.principal}` (no colon is present "
            "separating the principal type from the principal name)"
        )
    supported = SUPPORTED_OPERATIONS[pattern.resource_type]
    if entry.operation != AclOperation.ALL and entry.operation not in supported:
        ops = ", ".join(op.name for op in sorted(supported))
        return (
            f"ResourceType {pattern.resource_type.name} only supports operations ALL, {ops}; "
            f"not {entry.operation.name}"
        )
    if pattern.pattern_type == PatternType.PREFIXED and pattern.name == WILDCARD:
        return "A PREFIXED pattern cannot be named '*'; use a LITERAL '*' to match every name"
    return None


# -- records for the metadata log ---------------------------------------------------------

_RECORD_KEYS = (
    "resource_type",
    "name",
    "pattern_type",
    "principal",
    "host",
    "operation",
    "permission",
)


def to_record(binding: AclBinding) -> dict[str, Any]:
    """A msgpack-friendly dict of plain ints and strings."""
    p, e = binding.pattern, binding.entry
    return {
        "resource_type": int(p.resource_type),
        "name": p.name,
        "pattern_type": int(p.pattern_type),
        "principal": e.principal,
        "host": e.host,
        "operation": int(e.operation),
        "permission": int(e.permission_type),
    }


def binding_from_record(record: Mapping[str, Any]) -> AclBinding:
    """The inverse of ``to_record``; ValueError on a missing key, wrong type or unknown code."""
    try:
        values = [record[k] for k in _RECORD_KEYS]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"ACL record lacks a field: {exc}") from None
    rt, name, pt, principal, host, op, perm = values
    for label, value in (("name", name), ("principal", principal), ("host", host)):
        if not isinstance(value, str):
            raise ValueError(f"ACL record {label} is not a string: {value!r}")
    try:
        return AclBinding(
            ResourcePattern(ResourceType(rt), name, PatternType(pt)),
            AccessControlEntry(principal, host, AclOperation(op), AclPermissionType(perm)),
        )
    except ValueError as exc:
        raise ValueError(f"ACL record has an unknown code: {exc}") from None


# -- the authorizer -------------------------------------------------------------------------

_DENY = AclPermissionType.DENY
_LITERAL = PatternType.LITERAL
_PREFIXED = PatternType.PREFIXED


class AclAuthorizer:
    """The committed ACLs, indexed for ``authorize``.

    Literal ACLs sit per resource type in a dict keyed by name; the literal ``*`` ACLs are
    simply the entry under name ``*``. Prefixed ACLs sit per resource type in a dict keyed
    by prefix, with the sorted set of prefix lengths in use, so a lookup probes one slice of
    the name per distinct length rather than scanning every prefix.

    ``version`` grows on every change (ACLs, super users, the no-ACL default) so caches can
    tell they are stale.
    """

    def __init__(
        self,
        bindings: Iterable[AclBinding] = (),
        *,
        super_users: Iterable[str] = (),
        allow_everyone_if_no_acl_found: bool = False,
    ) -> None:
        self._super_users = frozenset(super_users)
        self._allow_if_none = bool(allow_everyone_if_no_acl_found)
        self._bindings: set[AclBinding] = set()
        self._literal: dict[ResourceType, dict[str, set[AccessControlEntry]]] = {}
        self._prefixed: dict[ResourceType, dict[str, set[AccessControlEntry]]] = {}
        self._prefix_lengths: dict[ResourceType, tuple[int, ...]] = {}
        self.version = 0
        for b in bindings:
            self.add(b)

    # configuration ------------------------------------------------------------------------

    @property
    def super_users(self) -> frozenset[str]:
        return self._super_users

    @super_users.setter
    def super_users(self, value: Iterable[str]) -> None:
        self._super_users = frozenset(value)
        self.version += 1

    @property
    def allow_everyone_if_no_acl_found(self) -> bool:
        return self._allow_if_none

    @allow_everyone_if_no_acl_found.setter
    def allow_everyone_if_no_acl_found(self, value: bool) -> None:
        self._allow_if_none = bool(value)
        self.version += 1

    # the committed set --------------------------------------------------------------------

    def add(self, binding: AclBinding) -> bool:
        """Add one binding; False (and no version bump) if it was already present.

        Bindings are assumed valid (``validate_binding``); a pattern type other than
        LITERAL/PREFIXED is refused with ValueError because it could never apply.
        """
        if binding in self._bindings:
            return False
        p = binding.pattern
        if p.pattern_type == _LITERAL:
            by_name = self._literal.setdefault(p.resource_type, {})
            by_name.setdefault(p.name, set()).add(binding.entry)
        elif p.pattern_type == _PREFIXED:
            by_prefix = self._prefixed.setdefault(p.resource_type, {})
            entries = by_prefix.get(p.name)
            if entries is None:
                entries = by_prefix[p.name] = set()
                self._reindex_lengths(p.resource_type)
            entries.add(binding.entry)
        else:
            raise ValueError(f"cannot store an ACL with pattern type {p.pattern_type.name}")
        self._bindings.add(binding)
        self.version += 1
        return True

    def remove(self, binding: AclBinding) -> bool:
        """Remove one binding; False (and no version bump) if it was absent."""
        if binding not in self._bindings:
            return False
        self._bindings.discard(binding)
        p = binding.pattern
        if p.pattern_type == _LITERAL:
            by_name = self._literal[p.resource_type]
            entries = by_name[p.name]
            entries.discard(binding.entry)
            if not entries:
                del by_name[p.name]
        else:
            by_prefix = self._prefixed[p.resource_type]
            entries = by_prefix[p.name]
            entries.discard(binding.entry)
            if not entries:
                del by_prefix[p.name]
                self._reindex_lengths(p.resource_type)
        self.version += 1
        return True

    def _reindex_lengths(self, resource_type: ResourceType) -> None:
        by_prefix = self._prefixed.get(resource_type, {})
        self._prefix_lengths[resource_type] = tuple(sorted({len(k) for k in by_prefix}))

    def bindings(self) -> Iterator[AclBinding]:
        return iter(tuple(self._bindings))

    def matching(self, filter: AclBindingFilter) -> list[AclBinding]:
        """The bindings ``filter`` matches (DescribeAcls; DeleteAcls then removes them)."""
        return [b for b in self._bindings if filter.matches(b)]

    def __len__(self) -> int:
        return len(self._bindings)

    # authorization ------------------------------------------------------------------------

    def _applicable(self, resource_type: ResourceType, name: str) -> list[set[AccessControlEntry]]:
        """The entry sets of every ACL pattern that applies to (resource_type, name)."""
        found = []
        by_name = self._literal.get(resource_type)
        if by_name:
            entries = by_name.get(name)
            if entries:
                found.append(entries)
            if name != WILDCARD:
                entries = by_name.get(WILDCARD)
                if entries:
                    found.append(entries)
        lengths = self._prefix_lengths.get(resource_type)
        if lengths:
            by_prefix = self._prefixed[resource_type]
            size = len(name)
            for n in lengths:
                if n > size:
                    break
                entries = by_prefix.get(name[:n])
                if entries:
                    found.append(entries)
        return found

    def authorize(
        self,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        """Whether ``principal`` connecting from ``host`` may do ``operation`` on the resource."""
        if principal in self._super_users:
            return True
        sections = self._applicable(resource_type, name)
        if not sections:
            return self._allow_if_none
        allowed_by = _ALLOWED_BY[operation]
        denied_by = _DENIED_BY[operation]
        allowed = False
        for entries in sections:
            for e in entries:
                if e.principal != principal and e.principal != WILDCARD_PRINCIPAL:
                    continue
                if e.host != host and e.host != WILDCARD:
                    continue
                if e.permission_type == _DENY:
                    if e.operation in denied_by:
                        return False
                elif e.operation in allowed_by:
                    allowed = True
        return allowed


class AuthorizationCache:
    """One connection's memo of ``authorize`` answers (principal and host are fixed).

    Dropped whole when the authorizer's ``version`` moves or when it reaches
    ``max_entries`` (a client naming ever more resources cannot grow it without bound).
    A hit costs a version compare and one dict lookup.
    """

    __slots__ = ("_answers", "_authorizer", "_version", "host", "max_entries", "principal")

    def __init__(
        self, authorizer: AclAuthorizer, principal: str, host: str, *, max_entries: int = 4096
    ) -> None:
        self._authorizer = authorizer
        self.principal = principal
        self.host = host
        self.max_entries = max_entries
        self._answers: dict[tuple[AclOperation, ResourceType, str], bool] = {}
        self._version = authorizer.version

    def authorize(self, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
        answers = self._answers
        if self._version != self._authorizer.version:
            answers.clear()
            self._version = self._authorizer.version
        key = (operation, resource_type, name)
        answer = answers.get(key)
        if answer is None:
            answer = self._authorizer.authorize(
                self.principal, self.host, operation, resource_type, name
            )
            if len(answers) >= self.max_entries:
                answers.clear()
            answers[key] = answer
        return answer

    def __len__(self) -> int:
        return len(self._answers)
