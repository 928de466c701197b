"""The native security APIs' bodies for ACLs and SCRAM credentials (docs/protocol.md,
"Security APIs"): written by the broker's service and logmq's admin client, read by the
native handlers. Bodies from the wire are untrusted: every field is checked."""

from __future__ import annotations

from typing import Any

from logmq.errors import ErrorCode, LogMQError
from logmq.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from logmq.security.scram import ScramCredential


class SecurityBodyError(LogMQError, ValueError):
    """A native security body that does not say what it must."""

    code = ErrorCode.INVALID_REQUEST


def binding_body(binding: AclBinding) -> dict[str, Any]:
    p, e = binding.pattern, binding.entry
    return {
        "resource_type": int(p.resource_type),
        "resource_name": p.name,
        "pattern_type": int(p.pattern_type),
        "principal": e.principal,
        "host": e.host,
        "operation": int(e.operation),
        "permission_type": int(e.permission_type),
    }


def filter_body(f: AclBindingFilter) -> dict[str, Any]:
    return {
        "resource_type": int(f.resource_type),
        "resource_name": f.name,
        "pattern_type": int(f.pattern_type),
        "principal": f.principal,
        "host": f.host,
        "operation": int(f.operation),
        "permission_type": int(f.permission_type),
    }


def field_of(body: Any, key: str, typ: type, *, optional: bool = False) -> Any:
    if not isinstance(body, dict):
        raise SecurityBodyError(f"expected a map around {key!r}, got {type(body).__name__}")
    value = body.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, typ):
        raise SecurityBodyError(f"field {key!r} must be {typ.__name__}, got {value!r:.40}")
    return value


def _enum(enum: type, body: Any, key: str) -> Any:
    value = field_of(body, key, int)
    try:
        return enum(value)
    except ValueError:
        raise SecurityBodyError(f"field {key!r}: unknown code {value}") from None


def parse_binding(body: Any) -> AclBinding:
    return AclBinding(
        ResourcePattern(
            _enum(ResourceType, body, "resource_type"),
            field_of(body, "resource_name", str),
            _enum(PatternType, body, "pattern_type"),
        ),
        AccessControlEntry(
            field_of(body, "principal", str),
            field_of(body, "host", str),
            _enum(AclOperation, body, "operation"),
            _enum(AclPermissionType, body, "permission_type"),
        ),
    )


def parse_filter(body: Any) -> AclBindingFilter:
    return AclBindingFilter(
        _enum(ResourceType, body, "resource_type"),
        field_of(body, "resource_name", str, optional=True),
        _enum(PatternType, body, "pattern_type"),
        field_of(body, "principal", str, optional=True),
        field_of(body, "host", str, optional=True),
        _enum(AclOperation, body, "operation"),
        _enum(AclPermissionType, body, "permission_type"),
    )


def scram_upsertion_body(name: str, cred: ScramCredential) -> dict[str, Any]:
    return {
        "name": name,
        "mechanism": cred.mechanism,
        "salt": cred.salt,
        "stored_key": cred.stored_key,
        "server_key": cred.server_key,
        "iterations": cred.iterations,
    }
