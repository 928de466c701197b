"""Handlers of the security APIs: ACLs, SCRAM credentials and client quotas.

CreateAcls, DeleteAcls, AlterUserScramCredentials and AlterClientQuotas change the
metadata log: they run on the controller (any other broker forwards them, see
registry.py: ``controller``) and answer once committed, with the metadata offset a
forwarding broker waits for; broker/metadata/security_changes.py commits and audits them,
for the client the request names (net/requester.py). DescribeAcls, DescribeUserScramCredentials and
DescribeClientQuotas are answered from this broker's own image: every broker holds the
same committed set.

Bodies (msgpack maps; ``binding`` and ``filter`` as broker/metadata/security_admin.py writes them:
resource_type, resource_name, pattern_type, principal, host, operation, permission_type,
with Kafka's enum codes; a filter's name, principal and host may be nil):

* CreateAcls ``{"creations": [binding]}`` -> ``{"results": [{"error", "message"}]}``
* DeleteAcls ``{"filters": [filter]}`` ->
  ``{"results": [{"error", "message", "matching": [binding]}]}``
* DescribeAcls ``{"filter": filter}`` -> ``{"error", "message", "bindings": [binding]}``
* AlterUserScramCredentials ``{"upsertions": [{"name", "mechanism", "salt",
  "stored_key", "server_key", "iterations"}], "deletions": [{"name", "mechanism"}]}``
  (salted credentials: never a password), and ``"keep_existing": true`` to leave a
  credential the user already has for that mechanism as it is (``--add-scram``) ->
  ``{"results": [{"user", "error", "message"}]}``
* DescribeUserScramCredentials ``{"users": [name] | nil}`` -> ``{"error", "message",
  "results": [{"user", "error", "message", "credentials": [{"mechanism",
  "iterations"}]}]}`` (never salts or keys)
* AlterClientQuotas ``{"entries": [{"entity": [{"type", "name"}], "ops": [{"key",
  "value"}]}], "validate_only"}`` (a nil name: the default entity; a nil value removes the
  key) -> ``{"entries": [{"entity", "error", "message"}]}``
* DescribeClientQuotas ``{"components": [{"entity_type", "match_type", "match"}],
  "strict"}`` (match_type 0 exact, 1 default, 2 any named) -> ``{"error", "message",
  "entries": [{"entity": [{"type", "name"}], "values": {key: value}}]}``
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from logmq.broker.metadata.security_admin import entity_body, parse_component, parse_quota_entry
from logmq.broker.metadata.security_changes import SecurityChanges
from logmq.cluster.controller_api import ApiResult, ClientQuotaAlteration
from logmq.cluster.security_image import scram_alteration_error
from logmq.errors import ErrorCode
from logmq.native.request_fields import InvalidRequestError, req_field, req_list
from logmq.net.codec import Request
from logmq.net.reply import Reply
from logmq.net.requester import requester
from logmq.security.acl import AclBinding, AclBindingFilter, validate_filter
from logmq.security.bodies import SecurityBodyError, binding_body, parse_binding, parse_filter
from logmq.security.scram import ScramCredential

if TYPE_CHECKING:
    from logmq.broker.metadata.quorum_service import MetadataQuorum
    from logmq.broker.metrics import BrokerMetrics


def _result(code: ErrorCode = ErrorCode.NONE, message: str | None = None) -> dict[str, Any]:
    return {"error": int(code), "message": message or None}


def _invalid(err: Exception) -> InvalidRequestError:
    return InvalidRequestError(str(err))


class SecurityApi:
    """ACL, SCRAM-credential and client-quota APIs: changes through ``changes`` (on the
    controller), describes from the quorum's image."""

    def __init__(
        self,
        quorum: MetadataQuorum,
        changes: SecurityChanges,
        metrics: BrokerMetrics | None = None,
    ) -> None:
        self.quorum = quorum
        self.changes = changes
        self.metrics = metrics

    def _done(self, req: Request, body: dict[str, Any]) -> Reply:
        """A controller answer; a forwarding broker also gets the metadata offset to await."""
        if req.body.get("forwarded_by") is not None:
            body["metadata_offset"] = self.quorum.image.offset
        return Reply(body)

    def _count(self, req: Request, code: ErrorCode) -> None:
        if self.metrics is not None and code is not ErrorCode.NONE:
            self.metrics.error(req.api_key, code)

    # -- ACLs (create/delete on the controller) ----------------------------------------

    async def create_acls(self, req: Request) -> Reply:
        creations = req_list(req.body, "creations")
        who = requester(req.context, req.body)
        results: dict[int, dict[str, Any]] = {}
        wanted: list[tuple[int, AclBinding]] = []
        for i, raw in enumerate(creations):
            try:
                wanted.append((i, parse_binding(raw)))
            except SecurityBodyError as e:
                results[i] = _result(ErrorCode.INVALID_REQUEST, str(e))
        if wanted:
            bindings = [b for _, b in wanted]
            created = await self.changes.create_acls(bindings, who)
            for (i, _), r in zip(wanted, created, strict=True):
                results[i] = _result(r.error, r.message)
        for r in results.values():
            self._count(req, ErrorCode(r["error"]))
        return self._done(req, {"results": [results[i] for i in range(len(creations))]})

    async def delete_acls(self, req: Request) -> Reply:
        raw_filters = req_list(req.body, "filters")
        who = requester(req.context, req.body)
        results: dict[int, dict[str, Any]] = {}
        wanted: list[tuple[int, AclBindingFilter]] = []
        for i, raw in enumerate(raw_filters):
            try:
                wanted.append((i, parse_filter(raw)))
            except SecurityBodyError as e:
                results[i] = {**_result(ErrorCode.INVALID_REQUEST, str(e)), "matching": []}
        if wanted:
            filters = [f for _, f in wanted]
            deleted = await self.changes.delete_acls(filters, who)
            for (i, _), r in zip(wanted, deleted, strict=True):
                results[i] = {
                    **_result(r.error, r.message),
                    "matching": [binding_body(b) for b in r.deleted],
                }
        for r in results.values():
            self._count(req, ErrorCode(r["error"]))
        return self._done(req, {"results": [results[i] for i in range(len(raw_filters))]})

    async def describe_acls(self, req: Request) -> Reply:
        raw = req_field(req.body, "filter", dict, None)
        try:
            f = AclBindingFilter() if raw is None else parse_filter(raw)
        except SecurityBodyError as e:
            raise _invalid(e) from None
        problem = validate_filter(f)
        if problem:
            return Reply({**_result(ErrorCode.INVALID_REQUEST, problem), "bindings": []})
        bindings = self.quorum.image.security.matching_acls(f)
        return Reply({**_result(), "bindings": [binding_body(b) for b in bindings]})

    # -- SCRAM credentials --------------------------------------------------------------

    async def alter_user_scram_credentials(self, req: Request) -> Reply:
        """Checked here as far as the body goes (a credential that cannot be built is
        refused with Kafka's code before it travels on); the controller decides the rest.
        A user's first change decides its fate, as on Kafka's controller: refused here
        if it is malformed, DUPLICATE_RESOURCE if the user is named again."""
        alterations: list[tuple[str, str, ScramCredential | None, ApiResult | None]] = []
        keep_existing = req_field(req.body, "keep_existing", bool, False)
        who = requester(req.context, req.body)
        try:
            for d in req_list(req.body, "deletions", []):
                name, mechanism = _name_mechanism(d)
                refusal = scram_alteration_error(name, mechanism)
                alterations.append(
                    (name, mechanism, None, ApiResult(*refusal) if refusal else None)
                )
            for u in req_list(req.body, "upsertions", []):
                name, mechanism = _name_mechanism(u)
                iterations = req_field(u, "iterations", int)
                salt = req_field(u, "salt", bytes)
                cred, problem = None, None
                refusal = scram_alteration_error(name, mechanism, iterations, len(salt))
                if refusal:
                    problem = ApiResult(*refusal)
                else:
                    try:
                        cred = ScramCredential(
                            mechanism,
                            salt,
                            req_field(u, "stored_key", bytes),
                            req_field(u, "server_key", bytes),
                            iterations,
                        )
                    except ValueError as e:
                        problem = ApiResult(ErrorCode.UNACCEPTABLE_CREDENTIAL, str(e))
                alterations.append((name, mechanism, cred, problem))
        except SecurityBodyError as e:
            raise _invalid(e) from None
        first: dict[str, ApiResult | None] = {}
        mentions: dict[str, int] = {}
        for name, _, _, problem in alterations:
            first.setdefault(name, problem)
            mentions[name] = mentions.get(name, 0) + 1
        outcome: dict[str, ApiResult] = {}
        for name, problem in first.items():
            if problem is not None:
                outcome[name] = problem
            elif mentions[name] > 1:
                outcome[name] = ApiResult(
                    ErrorCode.DUPLICATE_RESOURCE,
                    "A user credential cannot be altered twice in the same request",
                )
        # every user left was named once, without a problem found here
        upserts = [(n, c) for n, _, c, _ in alterations if c is not None and n not in outcome]
        deletes = [
            (n, m) for n, m, c, p in alterations if c is None and p is None and n not in outcome
        ]
        if upserts or deletes:
            answered = await self.changes.alter_scram(
                upserts, deletes, who, keep_existing=keep_existing
            )
            outcome.update(answered)
        results = []
        for name in first:
            r = outcome[name]
            self._count(req, r.error)
            results.append({"user": name, **_result(r.error, r.message)})
        return self._done(req, {"results": results})

    async def describe_user_scram_credentials(self, req: Request) -> Reply:
        names = req_field(req.body, "users", list, None)
        if names is not None and not all(isinstance(n, str) for n in names):
            raise InvalidRequestError("'users' must list user names")
        results = [
            {
                "user": d.user,
                **_result(d.error, d.message),
                "credentials": [{"mechanism": m, "iterations": i} for m, i in d.credentials],
            }
            for d in self.quorum.image.security.describe_scram(names)
        ]
        return Reply({**_result(), "results": results})

    # -- client quotas ----------------------------------------------------------------

    async def alter_client_quotas(self, req: Request) -> Reply:
        raw_entries = req_list(req.body, "entries")
        validate_only = req_field(req.body, "validate_only", bool, False)
        who = requester(req.context, req.body)
        results: dict[int, dict[str, Any]] = {}
        wanted: list[tuple[int, ClientQuotaAlteration]] = []
        for i, raw in enumerate(raw_entries):
            entity = raw.get("entity") if isinstance(raw, dict) else None
            try:
                wanted.append((i, parse_quota_entry(raw)))
            except SecurityBodyError as e:
                results[i] = {"entity": entity, **_result(ErrorCode.INVALID_REQUEST, str(e))}
        if wanted:
            entries = [e for _, e in wanted]
            answered = await self.changes.alter_client_quotas(
                entries, who, validate_only=validate_only
            )
            for (i, e), r in zip(wanted, answered, strict=True):
                results[i] = {"entity": entity_body(e.entity), **_result(r.error, r.message)}
        for r in results.values():
            self._count(req, ErrorCode(r["error"]))
        return self._done(req, {"entries": [results[i] for i in range(len(raw_entries))]})

    async def describe_client_quotas(self, req: Request) -> Reply:
        strict = req_field(req.body, "strict", bool, False)
        try:
            components = [parse_component(c) for c in req_list(req.body, "components", [])]
        except SecurityBodyError as e:
            raise _invalid(e) from None
        d = self.quorum.image.security.describe_client_quotas(components, strict)
        entries = [
            {"entity": entity_body(entity), "values": dict(values)} for entity, values in d.entries
        ]
        return Reply({**_result(d.error, d.message), "entries": entries})


def _name_mechanism(body: Any) -> tuple[str, str]:
    name = req_field(body, "name", str)
    mechanism = req_field(body, "mechanism", str)
    return name, mechanism
