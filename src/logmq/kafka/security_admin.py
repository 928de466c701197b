"""Kafka's ACL and SCRAM admin APIs: Create/Describe/DeleteAcls (v0-3) and
Describe/AlterUserScramCredentials (v0), over the security admin service.

Changes run on the controller and are in every broker's image once answered; describes
read this broker's image. Who may call them is the pipeline's question (ALTER or
DESCRIBE on the cluster: kafka/authorization.py); each change names its client, and the
controller writes it to the audit log once committed (broker/metadata/security_changes.py).
"""

from __future__ import annotations

from typing import Any

from logmq.broker.metadata.security_admin import SecurityAdmin
from logmq.cluster.controller_api import ClientQuotaAlteration
from logmq.cluster.security_image import QuotaFilterComponent
from logmq.errors import ErrorCode
from logmq.kafka.messages import NO_THROTTLE, build, kio_code, response_module
from logmq.net.codec import Request
from logmq.net.reply import Reply
from logmq.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
    validate_binding,
    validate_filter,
)
from logmq.security.scram import ScramCredential

# Kafka's ScramMechanism codes on the wire
SCRAM_CODES = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
SCRAM_NAMES = {name: code for code, name in SCRAM_CODES.items()}


def _enum(enum: type, value: int) -> Any:
    try:
        return enum(int(value))
    except ValueError:
        return enum(0)  # UNKNOWN: validation refuses it with Kafka's message


def _filter(f: Any, version: int) -> AclBindingFilter:
    """A Describe/DeleteAcls filter (v0 has no pattern type: literal only)."""
    pattern = f.pattern_type_filter if version >= 1 else int(PatternType.LITERAL)
    return AclBindingFilter(
        _enum(ResourceType, f.resource_type_filter),
        f.resource_name_filter,
        _enum(PatternType, pattern),
        f.principal_filter,
        f.host_filter,
        _enum(AclOperation, f.operation),
        _enum(AclPermissionType, f.permission_type),
    )


class KafkaSecurityAdminApis:
    def __init__(self, admin: SecurityAdmin) -> None:
        self.admin = admin

    # -- ACLs ------------------------------------------------------------------------
    async def describe_acls(self, req: Request) -> Reply:
        m = response_module(req.body)
        f = _filter(req.body, req.api_version)
        problem = validate_filter(f)
        if problem:
            return Reply(
                build(
                    m.DescribeAclsResponse,
                    throttle_time=NO_THROTTLE,
                    error_code=kio_code(ErrorCode.INVALID_REQUEST),
                    error_message=problem,
                    resources=(),
                )
            )
        by_pattern: dict[ResourcePattern, list[AccessControlEntry]] = {}
        for b in self.admin.describe_acls(f):
            by_pattern.setdefault(b.pattern, []).append(b.entry)
        resources = tuple(
            build(
                m.DescribeAclsResource,
                resource_type=int(p.resource_type),
                resource_name=p.name,
                pattern_type=int(p.pattern_type),
                acls=tuple(
                    m.AclDescription(
                        principal=e.principal,
                        host=e.host,
                        operation=int(e.operation),
                        permission_type=int(e.permission_type),
                    )
                    for e in entries
                ),
            )
            for p, entries in by_pattern.items()
        )
        return Reply(
            build(
                m.DescribeAclsResponse,
                throttle_time=NO_THROTTLE,
                error_code=kio_code(ErrorCode.NONE),
                error_message=None,
                resources=resources,
            )
        )

    async def create_acls(self, req: Request) -> Reply:
        m = response_module(req.body)
        version = req.api_version
        bindings = []
        for c in req.body.creations:
            pattern = c.resource_pattern_type if version >= 1 else int(PatternType.LITERAL)
            bindings.append(
                AclBinding(
                    ResourcePattern(
                        _enum(ResourceType, c.resource_type),
                        c.resource_name,
                        _enum(PatternType, pattern),
                    ),
                    AccessControlEntry(
                        c.principal,
                        c.host,
                        _enum(AclOperation, c.operation),
                        _enum(AclPermissionType, c.permission_type),
                    ),
                )
            )
        problems = [validate_binding(b) for b in bindings]
        valid = [b for b, p in zip(bindings, problems, strict=True) if p is None]
        created = iter(await self.admin.create_acls(valid, caller=req.context))
        results = []
        for problem in problems:
            if problem is not None:
                results.append(
                    m.AclCreationResult(
                        error_code=kio_code(ErrorCode.INVALID_REQUEST), error_message=problem
                    )
                )
                continue
            r = next(created)
            results.append(
                m.AclCreationResult(error_code=kio_code(r.error), error_message=r.message or None)
            )
        return Reply(m.CreateAclsResponse(throttle_time=NO_THROTTLE, results=tuple(results)))

    async def delete_acls(self, req: Request) -> Reply:
        m = response_module(req.body)
        filters = [_filter(f, req.api_version) for f in req.body.filters]
        problems = [validate_filter(f) for f in filters]
        valid = [f for f, p in zip(filters, problems, strict=True) if p is None]
        deleted = iter(await self.admin.delete_acls(valid, caller=req.context))
        out = []
        for problem in problems:
            if problem is not None:
                out.append(
                    m.DeleteAclsFilterResult(
                        error_code=kio_code(ErrorCode.INVALID_REQUEST),
                        error_message=problem,
                        matching_acls=(),
                    )
                )
                continue
            r = next(deleted)
            out.append(
                m.DeleteAclsFilterResult(
                    error_code=kio_code(r.error),
                    error_message=r.message or None,
                    matching_acls=tuple(
                        build(
                            m.DeleteAclsMatchingAcl,
                            error_code=kio_code(ErrorCode.NONE),
                            error_message=None,
                            resource_type=int(b.pattern.resource_type),
                            resource_name=b.pattern.name,
                            pattern_type=int(b.pattern.pattern_type),
                            principal=b.entry.principal,
                            host=b.entry.host,
                            operation=int(b.entry.operation),
                            permission_type=int(b.entry.permission_type),
                        )
                        for b in r.deleted
                    ),
                )
            )
        return Reply(m.DeleteAclsResponse(throttle_time=NO_THROTTLE, filter_results=tuple(out)))

    # -- SCRAM users -------------------------------------------------------------------
    async def describe_user_scram_credentials(self, req: Request) -> Reply:
        m = response_module(req.body)
        users = req.body.users
        names = None if users is None else [u.name for u in users]
        results = tuple(
            m.DescribeUserScramCredentialsResult(
                user=d.user,
                error_code=kio_code(d.error),
                error_message=d.message,
                credential_infos=tuple(
                    m.CredentialInfo(mechanism=SCRAM_NAMES.get(mech, 0), iterations=iterations)
                    for mech, iterations in d.credentials
                ),
            )
            for d in self.admin.describe_scram(names)
        )
        return Reply(
            m.DescribeUserScramCredentialsResponse(
                throttle_time=NO_THROTTLE,
                error_code=kio_code(ErrorCode.NONE),
                error_message=None,
                results=results,
            )
        )

    async def alter_user_scram_credentials(self, req: Request) -> Reply:
        """Kafka's clients salt the password themselves and send the salted password:
        the broker derives the stored and server keys from it; no password travels."""
        m = response_module(req.body)
        refused: dict[str, tuple[ErrorCode, str]] = {}
        deletions = []
        for d in req.body.deletions:
            mechanism = SCRAM_CODES.get(d.mechanism)
            if mechanism is None:
                refused[d.name] = (ErrorCode.UNSUPPORTED_SASL_MECHANISM, "unknown mechanism")
            else:
                deletions.append((d.name, mechanism))
        upsertions = []
        for u in req.body.upsertions:
            mechanism = SCRAM_CODES.get(u.mechanism)
            if mechanism is None:
                refused[u.name] = (ErrorCode.UNSUPPORTED_SASL_MECHANISM, "unknown mechanism")
                continue
            try:
                cred = ScramCredential.from_salted_password(
                    mechanism, u.salted_password, u.salt, u.iterations
                )
            except ValueError as e:
                refused[u.name] = (ErrorCode.UNACCEPTABLE_CREDENTIAL, str(e))
                continue
            upsertions.append((u.name, cred))
        done = await self.admin.alter_scram(
            [(n, c) for n, c in upsertions if n not in refused],
            [(n, mech) for n, mech in deletions if n not in refused],
            caller=req.context,
        )
        users = list(
            dict.fromkeys(
                [d.name for d in req.body.deletions] + [u.name for u in req.body.upsertions]
            )
        )
        results = []
        for user in users:
            if user in refused:
                code, message = refused[user]
            else:
                r = done[user]
                code, message = r.error, r.message or None
            results.append(
                m.AlterUserScramCredentialsResult(
                    user=user, error_code=kio_code(code), error_message=message
                )
            )
        return Reply(
            m.AlterUserScramCredentialsResponse(throttle_time=NO_THROTTLE, results=tuple(results))
        )

    # -- client quotas -----------------------------------------------------------------
    async def describe_client_quotas(self, req: Request) -> Reply:
        m = response_module(req.body)
        components = [
            QuotaFilterComponent(c.entity_type, int(c.match_type), c.match)
            for c in req.body.components
        ]
        found = self.admin.describe_client_quotas(components, strict=bool(req.body.strict))
        entries = tuple(
            m.EntryData(
                entity=tuple(m.EntityData(entity_type=t, entity_name=n) for t, n in entity),
                values=tuple(m.ValueData(key=k, value=float(v)) for k, v in values.items()),
            )
            for entity, values in found.entries
        )
        return Reply(
            m.DescribeClientQuotasResponse(
                throttle_time=NO_THROTTLE,
                error_code=kio_code(found.error),
                error_message=found.message,
                entries=entries if found.error is ErrorCode.NONE else None,
            )
        )

    async def alter_client_quotas(self, req: Request) -> Reply:
        m = response_module(req.body)
        entries = [
            ClientQuotaAlteration(
                {e.entity_type: e.entity_name for e in entry.entity},
                {op.key: (None if op.remove else float(op.value)) for op in entry.ops},
            )
            for entry in req.body.entries
        ]
        validate_only = bool(req.body.validate_only)
        results = await self.admin.alter_client_quotas(
            entries, validate_only=validate_only, caller=req.context
        )
        out = []
        for entry, r in zip(req.body.entries, results, strict=True):
            out.append(
                m.EntryData(
                    error_code=kio_code(r.error),
                    error_message=r.message or None,
                    entity=tuple(
                        m.EntityData(entity_type=e.entity_type, entity_name=e.entity_name)
                        for e in entry.entity
                    ),
                )
            )
        return Reply(m.AlterClientQuotasResponse(throttle_time=NO_THROTTLE, entries=tuple(out)))
