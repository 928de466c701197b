"""Security admin for either door: ACLs, SCRAM credentials and client quotas.

The changes run on the controller, which writes them to the metadata log; like
TopicAdmin (topic_admin.py) this service speaks the inter-broker (native) requests on
a door's behalf, takes typed requests and answers typed outcomes in request order. The
describes are answered from this broker's own metadata image: every broker holds the
same committed set, so no request travels for them. A change names the client it is
made for (``caller``: net/requester.py), which the controller audits it with
(security_changes.py).

The helpers below are the native bodies of these APIs (docs: native/security_api.py),
shared by this service, which writes them, and the native handlers, which read them.
Credentials travel already salted (ScramCredential): a password never reaches the
controller or the log.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from logmq.cluster.controller_api import AclDeleteResult, ApiResult, ClientQuotaAlteration
from logmq.cluster.security_image import (
    ClientQuotasDescription,
    QuotaEntity,
    QuotaFilterComponent,
    ScramUserDescription,
)
from logmq.errors import ErrorCode, LogMQError
from logmq.net.codec import ApiKey
from logmq.net.pipeline import ConnectionContext
from logmq.net.requester import ON_BEHALF_OF, on_behalf_of
from logmq.security.acl import (
    AclBinding,
    AclBindingFilter,
)
from logmq.security.bodies import (
    SecurityBodyError,
    binding_body,
    field_of,
    filter_body,
    parse_binding,
    scram_upsertion_body,
)
from logmq.security.scram import ScramCredential

if TYPE_CHECKING:
    from logmq.cluster.metadata_image import MetadataImage

RunOnController = Callable[[int, dict[str, Any]], Awaitable[dict[str, Any]]]


# the ACL and SCRAM bodies live in security/bodies.py (logmq's admin client writes them too)


def entity_body(entity: QuotaEntity | Mapping[str, str | None]) -> list[dict[str, Any]]:
    items = entity.items() if isinstance(entity, Mapping) else entity
    return [{"type": t, "name": n} for t, n in items]


def parse_entity(body: Any) -> dict[str, str | None]:
    if not isinstance(body, list):
        raise SecurityBodyError("'entity' must list {type, name} components")
    out: dict[str, str | None] = {}
    for part in body:
        t = field_of(part, "type", str)
        if t in out:
            raise SecurityBodyError(f"entity type {t!r} given twice")
        out[t] = field_of(part, "name", str, optional=True)
    return out


def quota_entry_body(entry: ClientQuotaAlteration) -> dict[str, Any]:
    return {
        "entity": entity_body(entry.entity),
        "ops": [{"key": k, "value": v} for k, v in entry.ops.items()],
    }


def parse_quota_entry(body: Any) -> ClientQuotaAlteration:
    entity = parse_entity(field_of(body, "entity", list))
    ops: dict[str, float | None] = {}
    for op in field_of(body, "ops", list):
        key = field_of(op, "key", str)
        value = op.get("value")
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise SecurityBodyError(f"the value of {key!r} must be a number or nil")
        if key in ops:
            raise SecurityBodyError(f"quota key {key!r} given twice for one entity")
        ops[key] = value
    return ClientQuotaAlteration(entity, ops)


def component_body(c: QuotaFilterComponent) -> dict[str, Any]:
    return {"entity_type": c.entity_type, "match_type": c.match_type, "match": c.match}


def parse_component(body: Any) -> QuotaFilterComponent:
    return QuotaFilterComponent(
        field_of(body, "entity_type", str),
        field_of(body, "match_type", int),
        field_of(body, "match", str, optional=True),
    )


def result_of(entry: Any) -> ApiResult:
    """An ``{"error", "message"}`` answer entry as an ApiResult (lenient: it came from a
    broker, not a client)."""
    if not isinstance(entry, dict):
        return ApiResult(ErrorCode.UNKNOWN_SERVER_ERROR, "no answer for it")
    try:
        code = ErrorCode(entry.get("error", 0))
    except ValueError:
        code = ErrorCode.UNKNOWN_SERVER_ERROR
    message = entry.get("message")
    return ApiResult(code, message if isinstance(message, str) else "")


# -- the service ------------------------------------------------------------------------------


class SecurityAdmin:
    """Typed security requests: changes run on the controller (``run_on_controller``
    from native/controller_forwarding.py answers once this broker's image holds them),
    describes read ``image()``, this broker's current metadata image."""

    def __init__(
        self, run_on_controller: RunOnController, image: Callable[[], MetadataImage]
    ) -> None:
        self._run = run_on_controller
        self._image = image

    # -- ACLs ------------------------------------------------------------------------

    async def create_acls(
        self, bindings: Sequence[AclBinding], *, caller: ConnectionContext | None = None
    ) -> list[ApiResult]:
        """CreateAcls: one result per binding, in order."""
        if not bindings:
            return []
        body = {"creations": [binding_body(b) for b in bindings]}
        answer = await self._call(ApiKey.CREATE_ACLS, body, len(bindings), caller)
        if isinstance(answer, ApiResult):
            return [answer] * len(bindings)
        return [result_of(e) for e in answer]

    async def delete_acls(
        self, filters: Sequence[AclBindingFilter], *, caller: ConnectionContext | None = None
    ) -> list[AclDeleteResult]:
        """DeleteAcls: per filter, the bindings it removed (or why it failed)."""
        if not filters:
            return []
        body = {"filters": [filter_body(f) for f in filters]}
        answer = await self._call(ApiKey.DELETE_ACLS, body, len(filters), caller)
        if isinstance(answer, ApiResult):
            return [AclDeleteResult(answer.error, answer.message)] * len(filters)
        out = []
        for entry in answer:
            r = result_of(entry)
            deleted: list[AclBinding] = []
            matching = entry.get("matching") if isinstance(entry, dict) else None
            for raw in matching if isinstance(matching, list) else ():
                try:
                    deleted.append(parse_binding(raw))
                except SecurityBodyError:
                    continue
            out.append(AclDeleteResult(r.error, r.message, tuple(deleted)))
        return out

    def describe_acls(self, filter: AclBindingFilter) -> list[AclBinding]:
        """DescribeAcls from this broker's image (callers check ``validate_filter``)."""
        return self._image().security.matching_acls(filter)

    # -- SCRAM -------------------------------------------------------------------------

    async def alter_scram(
        self,
        upsertions: Sequence[tuple[str, ScramCredential]],
        deletions: Sequence[tuple[str, str]],
        *,
        keep_existing: bool = False,
        caller: ConnectionContext | None = None,
    ) -> dict[str, ApiResult]:
        """AlterUserScramCredentials with salted credentials: user -> result, in the order
        users are first named (deletions first). ``keep_existing``: an upsertion leaves a
        credential the user already has for its mechanism alone (``--add-scram``)."""
        users = list(dict.fromkeys([n for n, _ in deletions] + [n for n, _ in upsertions]))
        if not users:
            return {}
        body = {
            "upsertions": [scram_upsertion_body(n, c) for n, c in upsertions],
            "deletions": [{"name": n, "mechanism": m} for n, m in deletions],
        }
        if keep_existing:
            body["keep_existing"] = True
        if caller is not None:
            body[ON_BEHALF_OF] = on_behalf_of(caller)
        try:
            answer = await self._run(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, body)
        except LogMQError as e:
            return dict.fromkeys(users, ApiResult(e.code, str(e)))
        entries = answer.get("results")
        by_user = {
            e.get("user"): result_of(e)
            for e in (entries if isinstance(entries, list) else ())
            if isinstance(e, dict)
        }
        lost = _failure(answer)
        return {u: by_user.get(u, lost) for u in users}

    def describe_scram(self, names: Sequence[str] | None = None) -> list[ScramUserDescription]:
        """DescribeUserScramCredentials from this broker's image: mechanisms and
        iterations only, never salts or keys."""
        return self._image().security.describe_scram(names)

    # -- client quotas -----------------------------------------------------------------

    async def alter_client_quotas(
        self,
        entries: Sequence[ClientQuotaAlteration],
        *,
        validate_only: bool = False,
        caller: ConnectionContext | None = None,
    ) -> list[ApiResult]:
        """AlterClientQuotas: one result per entry, in order."""
        if not entries:
            return []
        body = {"entries": [quota_entry_body(e) for e in entries], "validate_only": validate_only}
        answer = await self._call(ApiKey.ALTER_CLIENT_QUOTAS, body, len(entries), caller, "entries")
        if isinstance(answer, ApiResult):
            return [answer] * len(entries)
        return [result_of(e) for e in answer]

    def describe_client_quotas(
        self, components: Sequence[QuotaFilterComponent], *, strict: bool = False
    ) -> ClientQuotasDescription:
        return self._image().security.describe_client_quotas(components, strict)

    # -- plumbing ----------------------------------------------------------------------

    async def _call(
        self,
        api_key: int,
        body: dict[str, Any],
        n: int,
        caller: ConnectionContext | None,
        key: str = "results",
    ) -> list[Any] | ApiResult:
        """The controller's per-entry answers, or one failure for every entry."""
        if caller is not None:
            body[ON_BEHALF_OF] = on_behalf_of(caller)
        try:
            answer = await self._run(api_key, body)
        except LogMQError as e:  # no controller answered: every entry failed alike
            return ApiResult(e.code, str(e))
        entries = answer.get(key)
        if not isinstance(entries, list) or len(entries) != n:
            return _failure(answer)
        return entries


def _failure(answer: Mapping[str, Any]) -> ApiResult:
    """What a whole-request answer without per-entry results says went wrong."""
    r = result_of(answer)
    if r.ok:
        return ApiResult(ErrorCode.UNKNOWN_SERVER_ERROR, "no answer for it")
    return r
