"""The admin client's side of the security APIs: ACLs, SCRAM users and client quotas.

Bodies as native/security_api.py documents them; the ACL and SCRAM ones are
security/bodies.py's, shared with the broker.
Passwords are salted here (ScramCredential.from_password): only the salt, StoredKey and
ServerKey travel, and describes answer mechanisms and iteration counts, never keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from logmq.errors import ErrorCode, LogMQError, error_for
from logmq.security.acl import (
    AclBinding,
)
from logmq.security.bodies import (  # noqa: F401  (the admin's encoders)
    binding_body,
    filter_body,
    parse_binding,
    scram_upsertion_body,
)
from logmq.security.scram import ScramCredential

# DescribeClientQuotas match types (Kafka's codes)
MATCH_EXACT = 0
MATCH_DEFAULT = 1
MATCH_ANY = 2  # any entity of that type with a name (not the default)

QUOTA_USER = "user"
QUOTA_CLIENT_ID = "client-id"


@dataclass(slots=True, frozen=True)
class ScramCredentialInfo:
    """What a describe tells of one credential: never its salt or keys."""

    mechanism: str
    iterations: int


@dataclass(slots=True, frozen=True)
class QuotaAlteration:
    """Quota changes of one entity. ``entity`` maps "user"/"client-id" to a name (None:
    that type's default entity); ``ops`` maps a quota key (producer_byte_rate,
    consumer_byte_rate, request_percentage, controller_mutation_rate) to its new value
    (None: remove it)."""

    entity: Mapping[str, str | None]
    ops: Mapping[str, float | None]


@dataclass(slots=True, frozen=True)
class QuotaFilter:
    """One component of a DescribeClientQuotas filter; build with the class methods."""

    entity_type: str
    match_type: int = MATCH_EXACT
    match: str | None = None

    @classmethod
    def exact(cls, entity_type: str, name: str) -> QuotaFilter:
        return cls(entity_type, MATCH_EXACT, name)

    @classmethod
    def default(cls, entity_type: str) -> QuotaFilter:
        return cls(entity_type, MATCH_DEFAULT)

    @classmethod
    def any(cls, entity_type: str) -> QuotaFilter:
        return cls(entity_type, MATCH_ANY)


@dataclass(slots=True, frozen=True)
class QuotaEntry:
    """An entity (type -> name, None for the default) and its quota values."""

    entity: dict[str, str | None]
    values: dict[str, float] = field(default_factory=dict)


# -- bodies ---------------------------------------------------------------------------------


def entity_body(entity: Mapping[str, str | None]) -> list[dict[str, Any]]:
    # sorted by type: the broker keys an entity by its components in that order
    return [{"type": t, "name": entity[t]} for t in sorted(entity)]


def quota_entry_body(a: QuotaAlteration) -> dict[str, Any]:
    return {
        "entity": entity_body(a.entity),
        "ops": [{"key": str(k), "value": None if v is None else v} for k, v in a.ops.items()],
    }


def component_body(c: QuotaFilter) -> dict[str, Any]:
    return {"entity_type": c.entity_type, "match_type": c.match_type, "match": c.match}


# -- answers --------------------------------------------------------------------------------


def raise_if_error(entry: Mapping[str, Any], what: str) -> None:
    """Raise the broker's error of an ``{"error", "message"}`` entry, with its message."""
    code = entry.get("error", 0)
    if code:
        try:
            name = ErrorCode(code).name
        except ValueError:
            name = f"error {code}"
        raise error_for(code, entry.get("message") or f"{what}: {name}")


def check_results(entries: Any, n: int, what: str) -> list[dict[str, Any]]:
    """Per-entry results, in request order; the first failure raises."""
    if not isinstance(entries, list) or len(entries) != n:
        raise LogMQError(f"{what}: the broker answered {n} request entries with a bad shape")
    for e in entries:
        raise_if_error(e, what)
    return entries


def parse_deleted(results: list[dict[str, Any]]) -> list[AclBinding]:
    """The bindings a DeleteAcls removed, once each, in the order answered."""
    out: dict[AclBinding, None] = {}
    for r in results:
        for raw in r.get("matching") or ():
            out[parse_binding(raw)] = None
    return list(out)


def parse_scram_users(body: Mapping[str, Any]) -> dict[str, list[ScramCredentialInfo]]:
    raise_if_error(body, "describe SCRAM users")
    out: dict[str, list[ScramCredentialInfo]] = {}
    for r in body.get("results") or ():
        raise_if_error(r, f"describe SCRAM user {r.get('user')}")
        out[r["user"]] = [
            ScramCredentialInfo(c["mechanism"], int(c["iterations"]))
            for c in r.get("credentials") or ()
        ]
    return out


def parse_quota_entries(body: Mapping[str, Any]) -> list[QuotaEntry]:
    raise_if_error(body, "describe client quotas")
    return [
        QuotaEntry(
            {c["type"]: c.get("name") for c in e.get("entity") or ()},
            {str(k): float(v) for k, v in (e.get("values") or {}).items()},
        )
        for e in body.get("entries") or ()
    ]


def scram_credential(password: str, mechanism: str, iterations: int) -> ScramCredential:
    """A freshly salted credential; ValueError for an unknown mechanism, bad iteration
    count or empty password (refused before anything travels)."""
    if not password:
        raise ValueError("a SCRAM password must not be empty")
    return ScramCredential.from_password(mechanism, password, iterations)
