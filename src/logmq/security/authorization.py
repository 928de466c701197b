"""May this connection do this? Kafka's ACL decisions for both doors, and the audit log.

One ``Authorization`` per broker: ``authorizer.class.name`` turns it on, ``super.users``
and ``allow.everyone.if.no.acl.found`` shape it, and the ACLs are the metadata image's
(committed through the controller, so every broker decides alike once it has the
change). The authorizer is rebuilt only when the image's ACLs change; each connection
keeps its own cache of decisions (``ConnectionContext.authz``), so a Produce or Fetch
on a topic already decided costs one dictionary lookup.

Denials and every security change are written to the ``logmq.audit`` logger: who, from
where, what (docs/security.md shows how to route it to a file).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from logmq.errors import ErrorCode, LogMQError
from logmq.net.pipeline import ConnectionContext
from logmq.security.acl import (
    AclAuthorizer,
    AclOperation,
    AclPermissionType,
    AuthorizationCache,
    PatternType,
    ResourceType,
)

if TYPE_CHECKING:
    from logmq.security.settings import SecuritySettings

audit = logging.getLogger("logmq.audit")

CLUSTER = "kafka-cluster"
DENIED_CODES = {
    ResourceType.TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ResourceType.GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
    ResourceType.CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
    ResourceType.TRANSACTIONAL_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}


class AuthorizationError(LogMQError):
    """Denied: the code is the resource type's *_AUTHORIZATION_FAILED."""


class Authorization:
    def __init__(self, settings: SecuritySettings, image: Callable[[], Any]) -> None:
        self.enabled = settings.acls_enabled
        self.super_users = settings.super_users
        self.allow_if_no_acl = settings.allow_everyone_if_no_acl_found
        self._image = image
        self._authorizer: AclAuthorizer | None = None
        self._acl_version = -1

    def authorizer(self) -> AclAuthorizer:
        """The authorizer over the image's ACLs, rebuilt when they change."""
        security = self._image().security
        if self._authorizer is None or security.acl_version != self._acl_version:
            self._authorizer = AclAuthorizer(
                security.acl_bindings,
                super_users=self.super_users,
                allow_everyone_if_no_acl_found=self.allow_if_no_acl,
            )
            self._acl_version = security.acl_version
        return self._authorizer

    def _cache(self, context: ConnectionContext) -> AuthorizationCache:
        authorizer = self.authorizer()
        held = context.authz  # (the authorizer it was made for, the cache)
        if held is None or held[0] is not authorizer:
            held = context.authz = (
                authorizer,
                AuthorizationCache(authorizer, context.principal, context.host),
            )
        return held[1]

    def allowed(
        self,
        context: ConnectionContext | None,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
        *,
        log_denial: bool = True,
    ) -> bool:
        if not self.enabled or context is None:
            return True
        ok = self._cache(context).authorize(operation, resource_type, name)
        if not ok and log_denial:
            audit.info(
                "DENIED %s %s %s:%s from %s on %s",
                context.principal,
                operation.name,
                resource_type.name,
                name,
                context.peer,
                context.listener,
            )
        return ok

    def check(
        self,
        context: ConnectionContext | None,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
    ) -> None:
        """Raise the resource type's authorization error unless allowed."""
        if not self.allowed(context, operation, resource_type, name):
            raise AuthorizationError(
                f"{context.principal if context else '?'} may not {operation.name} "
                f"{resource_type.name.lower()} {name!r}",
                DENIED_CODES.get(resource_type, ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
            )

    def allowed_on_some(
        self,
        context: ConnectionContext | None,
        operation: AclOperation,
        resource_type: ResourceType,
    ) -> bool:
        """Is there any resource of this type it may ``operation`` (Kafka's
        authorizeByResourceType, as InitProducerId asks it: KIP-679)? An ALLOW for its
        principal (or User:*) and host (or *) on any pattern, unless a DENY of the same
        operation covers every name (a literal '*')."""
        if not self.enabled or context is None:
            return True
        authorizer = self.authorizer()
        if context.principal in self.super_users:
            return True
        ops = (operation, AclOperation.ALL)
        principals = (context.principal, "User:*")
        hosts = (context.host, "*")
        allows = denies_all = False
        any_acl = False
        for b in authorizer.bindings():
            if b.pattern.resource_type is not resource_type:
                continue
            any_acl = True
            e = b.entry
            if e.principal not in principals or e.host not in hosts or e.operation not in ops:
                continue
            if e.permission_type is AclPermissionType.ALLOW:
                allows = True
            elif b.pattern.name == "*" and b.pattern.pattern_type is PatternType.LITERAL:
                denies_all = True
        if not any_acl:
            return self.allow_if_no_acl
        return allows and not denies_all

    def denied_topics(
        self, context: ConnectionContext | None, operation: AclOperation, names: Iterable[str]
    ) -> set[str]:
        """The topics of ``names`` this connection may not ``operation``."""
        if not self.enabled or context is None:
            return set()
        return {
            n for n in set(names) if not self.allowed(context, operation, ResourceType.TOPIC, n)
        }

    def may_describe(self, context: ConnectionContext | None, name: str) -> bool:
        """Metadata's rule: a topic it may not describe is not there (no audit line)."""
        return self.allowed(
            context, AclOperation.DESCRIBE, ResourceType.TOPIC, name, log_denial=False
        )

    def describable(
        self, context: ConnectionContext | None, resource_type: ResourceType, names: Iterable[str]
    ) -> list[str]:
        """What a listing shows this connection, on either door, as Kafka's listings
        (Metadata of all topics, ListGroups, ListTransactions, OffsetFetch of all
        topics): the names it may DESCRIBE, in their order, the others left out without
        an audit line. DESCRIBE on the cluster lists every group (Kafka's ListGroups)."""
        names = list(names)
        if not self.enabled or context is None:
            return names
        if resource_type is ResourceType.GROUP and self.allowed(
            context, AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER, log_denial=False
        ):
            return names
        return [
            n
            for n in names
            if self.allowed(context, AclOperation.DESCRIBE, resource_type, n, log_denial=False)
        ]

    def may_create_topic(self, context: ConnectionContext | None, name: str) -> bool:
        """Auto-creation's rule (Metadata, either door): CREATE on the cluster or the topic."""
        return self.allowed(
            context, AclOperation.CREATE, ResourceType.CLUSTER, CLUSTER, log_denial=False
        ) or self.allowed(context, AclOperation.CREATE, ResourceType.TOPIC, name)

    def denial(
        self,
        context: ConnectionContext | None,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
    ) -> ErrorCode | None:
        """The code an entry of a many-resource request answers when denied (Kafka
        answers each resource in its own entry), else None."""
        if self.allowed(context, operation, resource_type, name):
            return None
        return DENIED_CODES.get(resource_type, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)


def audit_change(context: ConnectionContext | None, what: str) -> None:
    """Who changed ACLs, users, quotas or configs, from where."""
    if context is None:
        audit.info("%s (by the broker itself)", what)
    else:
        audit.info(
            "%s by %s from %s on %s", what, context.principal, context.peer, context.listener
        )
