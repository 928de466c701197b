"""The controller's side of the security changes: ACLs, SCRAM credentials, client quotas.

Every such change of either door ends here, on the active controller: the native door's
request, taken here or forwarded by the broker that took it, and the Kafka door's, which
SecurityAdmin (security_admin.py) sends as the same request. So this is where each change
is written to the ``logmq.audit`` logger, once, and only once the quorum has committed it:
one line per change actually written (a binding already stored, a credential
``--add-scram`` keeps, ``validate_only`` write nothing and log nothing), naming the client
that asked (net/requester.py: its connection, or the identity the broker that took the
request sends along), or the broker itself for its own changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from logmq.cluster.controller_api import (
    AclDeleteResult,
    ApiResult,
    ClientQuotaAlteration,
    ControllerResult,
)
from logmq.cluster.metadata_records import (
    AccessControlEntryRecord,
    ClientQuotaRecord,
    Record,
    RemoveUserScramCredential,
    UserScramCredentialRecord,
)
from logmq.cluster.security_image import QuotaEntity, binding_of
from logmq.net.pipeline import ConnectionContext
from logmq.security.acl import AclBinding, AclBindingFilter
from logmq.security.authorization import audit_change
from logmq.security.scram import ScramCredential

if TYPE_CHECKING:
    from logmq.broker.metadata.quorum_service import MetadataQuorum
    from logmq.cluster.controller import Controller

T = TypeVar("T")


class SecurityChanges:
    """Security changes committed through the metadata quorum, each audited once."""

    def __init__(self, quorum: MetadataQuorum) -> None:
        self._quorum = quorum

    async def create_acls(
        self, bindings: Sequence[AclBinding], requester: ConnectionContext | None
    ) -> list[ApiResult]:
        results, written = await self._commit(lambda c: c.create_acls(bindings))
        _audit(requester, _changes(written))
        return results

    async def delete_acls(
        self, filters: Sequence[AclBindingFilter], requester: ConnectionContext | None
    ) -> list[AclDeleteResult]:
        results, _ = await self._commit(lambda c: c.delete_acls(filters))
        # a removal record names the ACL's id only; the results name what it was
        deleted = [b for r in results for b in r.deleted]
        _audit(requester, [f"ACL deleted: {describe_binding(b)}" for b in deleted])
        return results

    async def alter_scram(
        self,
        upsertions: Sequence[tuple[str, ScramCredential]],
        deletions: Sequence[tuple[str, str]],
        requester: ConnectionContext | None,
        *,
        keep_existing: bool = False,
    ) -> dict[str, ApiResult]:
        results, written = await self._commit(
            lambda c: c.alter_scram_credentials(upsertions, deletions, keep_existing=keep_existing)
        )
        _audit(requester, _changes(written))
        return results

    async def alter_client_quotas(
        self,
        entries: Sequence[ClientQuotaAlteration],
        requester: ConnectionContext | None,
        *,
        validate_only: bool = False,
    ) -> list[ApiResult]:
        results, written = await self._commit(
            lambda c: c.alter_client_quotas(entries, validate_only=validate_only)
        )
        _audit(requester, _changes(written))
        return results

    async def _commit(
        self, operation: Callable[[Controller], ControllerResult[T]]
    ) -> tuple[T, list[Record]]:
        """The operation's answer once committed, and the records it wrote. Raises when
        the change is not known to be committed (nothing is audited then)."""
        written: list[Record] = []

        def run(controller: Controller) -> ControllerResult[T]:
            result = operation(controller)
            written.extend(result.records)
            return result

        return await self._quorum.submit(run), written


def describe_binding(b: AclBinding) -> str:
    p, e = b.pattern, b.entry
    return (
        f"{e.permission_type.name} {e.principal} from {e.host} {e.operation.name} "
        f"{p.resource_type.name}:{p.pattern_type.name}:{p.name}"
    )


def _audit(requester: ConnectionContext | None, changes: Sequence[str]) -> None:
    for what in changes:
        audit_change(requester, what)


def _changes(records: Sequence[Record]) -> list[str]:
    """What the committed records changed, one line per binding, credential and quota
    entity."""
    out: list[str] = []
    quotas: dict[QuotaEntity, list[str]] = {}
    for r in records:
        if isinstance(r, AccessControlEntryRecord):
            out.append(f"ACL created: {describe_binding(binding_of(r))}")
        elif isinstance(r, UserScramCredentialRecord):
            out.append(f"{r.mechanism} credential of User:{r.name} set")
        elif isinstance(r, RemoveUserScramCredential):
            out.append(f"{r.mechanism} credential of User:{r.name} deleted")
        elif isinstance(r, ClientQuotaRecord):
            change = f"{r.key} removed" if r.value is None else f"{r.key}={_number(r.value)}"
            quotas.setdefault(r.entity, []).append(change)
    for entity, changed in quotas.items():
        who = ", ".join(f"{t}={'<default>' if n is None else n}" for t, n in entity)
        out.append(f"client quotas of {who} changed: {', '.join(changed)}")
    return out


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else str(value)
