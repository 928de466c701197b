"""``logmq acl``, ``logmq user`` and ``logmq quota``: ACLs, SCRAM users and client quotas.

The options follow kafka-acls, kafka-configs and rpk where they can, so a Kafka operator's
fingers know them. In ``acl list`` and ``acl remove`` an option left out matches anything.
SCRAM passwords are salted by the client: only the salt and derived keys reach the
broker, and nothing the CLI prints ever holds a password or a key.
"""

from __future__ import annotations

import itertools
from typing import Any

import click

from logmq.client import Admin
from logmq.client.security_admin import QuotaAlteration, QuotaEntry, QuotaFilter
from logmq.security.acl import (
    CLUSTER_NAME,
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
    validate_binding,
)
from logmq.security.scram import (
    DEFAULT_ITERATIONS,
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    SCRAM_MECHANISMS,
)
from logmq_cli.common import CliContext, client_errors
from logmq_cli.output import emit_json, print_table

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def open_admin(ctx: CliContext) -> Admin:
    return Admin(ctx.bootstrap, request_timeout_ms=ctx.request_timeout_ms, security=ctx.security())


def _camel(name: str) -> str:
    """CLUSTER_ACTION -> ClusterAction: the spelling kafka-acls prints and takes."""
    return "".join(w.capitalize() for w in name.split("_"))


def _squash(text: str) -> str:
    return text.replace("-", "").replace("_", "").lower()


_OPERATIONS = {
    _squash(op.name): op
    for op in AclOperation
    if op not in (AclOperation.UNKNOWN, AclOperation.ANY)
}


class OperationType(click.ParamType):
    """An ACL operation as kafka-acls spells it (Read, ClusterAction...), in any case,
    with or without dashes and underscores."""

    name = "operation"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, AclOperation):
            return value
        op = _OPERATIONS.get(_squash(str(value)))
        if op is None:
            known = ", ".join(_camel(o.name) for o in _OPERATIONS.values())
            self.fail(f"unknown operation {value!r}; expected one of {known}", param, ctx)
        return op


# -- acl ------------------------------------------------------------------------------------


def binding_to_json(b: AclBinding) -> dict[str, Any]:
    p, e = b.pattern, b.entry
    return {
        "resource_type": p.resource_type.name.lower(),
        "resource_name": p.name,
        "pattern_type": p.pattern_type.name.lower(),
        "principal": e.principal,
        "host": e.host,
        "operation": _camel(e.operation.name),
        "permission": _camel(e.permission_type.name),
    }


def print_bindings(bindings: list[AclBinding], title: str | None = None) -> None:
    columns = ["type", "resource", "pattern", "principal", "host"]
    rows = [list(binding_to_json(b).values()) for b in bindings]
    print_table([*columns, "operation", "permission"], rows, title=title)


def resource_options(fn: Any) -> Any:
    for option in reversed(
        [
            click.option("--topic", "topics", multiple=True, help="A topic (repeatable)."),
            click.option("--group", "groups", multiple=True, help="A consumer group (repeatable)."),
            click.option("--cluster", is_flag=True, help="The cluster itself."),
            click.option(
                "--transactional-id",
                "transactional_ids",
                multiple=True,
                help="A transactional id (repeatable).",
            ),
            click.option(
                "--resource-pattern-type",
                type=click.Choice(["literal", "prefixed", "match", "any"], case_sensitive=False),
                default=None,
                help="How resource names match: add takes literal (default) or prefixed; list "
                "and remove also take match (every ACL that applies to the name) and any.",
            ),
        ]
    ):
        fn = option(fn)
    return fn


def _resources(
    topics: tuple[str, ...], groups: tuple[str, ...], cluster: bool, txn_ids: tuple[str, ...]
) -> list[tuple[ResourceType, str]]:
    out = [(ResourceType.TOPIC, t) for t in topics]
    out += [(ResourceType.GROUP, g) for g in groups]
    if cluster:
        out.append((ResourceType.CLUSTER, CLUSTER_NAME))
    out += [(ResourceType.TRANSACTIONAL_ID, t) for t in txn_ids]
    return out


MISSING_RESOURCE = "name a resource: --topic, --group, --cluster or --transactional-id"


def _principal_specs(
    allow_principals: tuple[str, ...],
    deny_principals: tuple[str, ...],
    allow_hosts: tuple[str, ...],
    deny_hosts: tuple[str, ...],
) -> list[tuple[str, AclPermissionType, tuple[str, ...]]]:
    """(principal, permission, hosts) for each principal; hosts go with their kind."""
    if allow_hosts and not allow_principals:
        raise click.UsageError("--allow-host needs --allow-principal")
    if deny_hosts and not deny_principals:
        raise click.UsageError("--deny-host needs --deny-principal")
    for p in (*allow_principals, *deny_principals):
        if ":" not in p:
            raise click.BadParameter(
                f"a principal is TYPE:NAME, like User:alice, got {p!r}", param_hint="principal"
            )
    return [(p, AclPermissionType.ALLOW, allow_hosts) for p in allow_principals] + [
        (p, AclPermissionType.DENY, deny_hosts) for p in deny_principals
    ]


def principal_options(fn: Any) -> Any:
    for option in reversed(
        [
            click.option(
                "--allow-principal",
                "allow_principals",
                multiple=True,
                metavar="TYPE:NAME",
                help="Principal allowed, e.g. User:alice or User:* (repeatable).",
            ),
            click.option(
                "--deny-principal",
                "deny_principals",
                multiple=True,
                metavar="TYPE:NAME",
                help="Principal denied (repeatable).",
            ),
            click.option(
                "--allow-host",
                "allow_hosts",
                multiple=True,
                help="Host the allowed principals may connect from (repeatable).",
            ),
            click.option(
                "--deny-host",
                "deny_hosts",
                multiple=True,
                help="Host the denied principals are refused from (repeatable).",
            ),
            click.option(
                "--operation",
                "operations",
                multiple=True,
                type=OperationType(),
                help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, "
                "DescribeConfigs, AlterConfigs, IdempotentWrite, All (repeatable).",
            ),
        ]
    ):
        fn = option(fn)
    return fn


@click.group()
def acl() -> None:
    """Add, list and remove ACLs (as kafka-acls does)."""


@acl.command("add")
@principal_options
@resource_options
@json_option
@click.pass_obj
@client_errors
def acl_add(
    ctx: CliContext,
    allow_principals: tuple[str, ...],
    deny_principals: tuple[str, ...],
    allow_hosts: tuple[str, ...],
    deny_hosts: tuple[str, ...],
    operations: tuple[AclOperation, ...],
    topics: tuple[str, ...],
    groups: tuple[str, ...],
    cluster: bool,
    transactional_ids: tuple[str, ...],
    resource_pattern_type: str | None,
    as_json: bool,
) -> None:
    """Allow or deny principals operations on resources.

    Every combination of principal, host, operation and resource becomes one ACL; hosts
    default to * and operations to All.

    \b
    logmq acl add --allow-principal User:alice --operation Read --operation Describe \\
        --topic orders
    """
    specs = _principal_specs(allow_principals, deny_principals, allow_hosts, deny_hosts)
    if not specs:
        raise click.UsageError("name who: --allow-principal or --deny-principal")
    resources = _resources(topics, groups, cluster, transactional_ids)
    if not resources:
        raise click.UsageError(MISSING_RESOURCE)
    pattern = PatternType[(resource_pattern_type or "literal").upper()]
    if pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise click.UsageError("acl add takes --resource-pattern-type literal or prefixed")
    bindings = [
        AclBinding(ResourcePattern(rt, name, pattern), AccessControlEntry(p, host, op, perm))
        for (rt, name), (p, perm, hosts) in itertools.product(resources, specs)
        for host in hosts or ("*",)
        for op in operations or (AclOperation.ALL,)
    ]
    bindings = list(dict.fromkeys(bindings))
    # The broker judges each ACL on its own and keeps the valid ones; checking them all
    # first (with the broker's own rules) makes a refused command add nothing.
    for b in bindings:
        problem = validate_binding(b)
        if problem:
            raise click.ClickException(f"INVALID_REQUEST: {problem}; no ACL added")
    with open_admin(ctx) as admin:
        admin.create_acls(bindings)
    if as_json:
        emit_json({"created": [binding_to_json(b) for b in bindings]})
    else:
        print_bindings(bindings, title=f"Added {len(bindings)} ACL(s)")


def _filters(
    resources: list[tuple[ResourceType, str]],
    pattern_type: str | None,
    specs: list[tuple[str | None, AclPermissionType, tuple[str, ...]]],
    operations: tuple[AclOperation, ...],
) -> list[AclBindingFilter]:
    """Filters for every combination given; what is left out matches anything."""
    if resources:
        pattern = PatternType[(pattern_type or "literal").upper()]
        patterns: list[tuple[ResourceType, str | None, PatternType]] = [
            (rt, name, pattern) for rt, name in resources
        ]
    else:
        pattern = PatternType[(pattern_type or "any").upper()]
        patterns = [(ResourceType.ANY, None, pattern)]
    out = [
        AclBindingFilter(rt, name, pt, principal, host, op, perm)
        for (rt, name, pt), (principal, perm, hosts) in itertools.product(patterns, specs)
        for host in hosts or (None,)
        for op in operations or (AclOperation.ANY,)
    ]
    return list(dict.fromkeys(out))


@acl.command("list")
@click.option(
    "--principal",
    "principals",
    multiple=True,
    metavar="TYPE:NAME",
    help="Only this principal's ACLs (repeatable).",
)
@click.option("--operation", "operations", multiple=True, type=OperationType())
@resource_options
@json_option
@click.pass_obj
@client_errors
def acl_list(
    ctx: CliContext,
    principals: tuple[str, ...],
    operations: tuple[AclOperation, ...],
    topics: tuple[str, ...],
    groups: tuple[str, ...],
    cluster: bool,
    transactional_ids: tuple[str, ...],
    resource_pattern_type: str | None,
    as_json: bool,
) -> None:
    """List ACLs: all of them, or those of the resources and principals named.

    With a resource, --resource-pattern-type defaults to literal (as kafka-acls does):
    use match to see every ACL that applies to a name, prefixed ones included.
    """
    resources = _resources(topics, groups, cluster, transactional_ids)
    specs: list[tuple[str | None, AclPermissionType, tuple[str, ...]]] = [
        (p, AclPermissionType.ANY, ()) for p in principals
    ] or [(None, AclPermissionType.ANY, ())]
    found: dict[AclBinding, None] = {}
    with open_admin(ctx) as admin:
        for f in _filters(resources, resource_pattern_type, specs, operations):
            found.update(dict.fromkeys(admin.describe_acls(f)))
    bindings = sorted(found, key=_binding_order)
    if as_json:
        emit_json([binding_to_json(b) for b in bindings])
    else:
        print_bindings(bindings)


def _binding_order(b: AclBinding) -> tuple[Any, ...]:
    p, e = b.pattern, b.entry
    return (p.resource_type, p.name, p.pattern_type, e.principal, e.host, e.operation)


@acl.command("remove")
@principal_options
@resource_options
@click.option("--force", "-f", is_flag=True, help="Do not ask for confirmation.")
@json_option
@click.pass_obj
@client_errors
def acl_remove(
    ctx: CliContext,
    allow_principals: tuple[str, ...],
    deny_principals: tuple[str, ...],
    allow_hosts: tuple[str, ...],
    deny_hosts: tuple[str, ...],
    operations: tuple[AclOperation, ...],
    topics: tuple[str, ...],
    groups: tuple[str, ...],
    cluster: bool,
    transactional_ids: tuple[str, ...],
    resource_pattern_type: str | None,
    force: bool,
    as_json: bool,
) -> None:
    """Remove the ACLs of the resources named that match the other options.

    Left out, principals, hosts and operations match anything: without a principal,
    every ACL of the resource goes.
    """
    resources = _resources(topics, groups, cluster, transactional_ids)
    if not resources:
        raise click.UsageError(MISSING_RESOURCE)
    specs: list[tuple[str | None, AclPermissionType, tuple[str, ...]]] = list(
        _principal_specs(allow_principals, deny_principals, allow_hosts, deny_hosts)
    ) or [(None, AclPermissionType.ANY, ())]
    filters = _filters(resources, resource_pattern_type, specs, operations)
    if not force:
        what = ", ".join(f"{rt.name.lower()} {name}" for rt, name in resources)
        who = "every principal" if specs[0][0] is None else "the principals named"
        click.confirm(f"Remove the ACLs of {who} on {what}?", abort=True, err=True)
    with open_admin(ctx) as admin:
        removed = admin.delete_acls(filters)
    if as_json:
        emit_json({"removed": [binding_to_json(b) for b in removed]})
    elif removed:
        print_bindings(removed, title=f"Removed {len(removed)} ACL(s)")
    else:
        click.echo("No ACL matched; nothing removed.")


# -- user -----------------------------------------------------------------------------------


@click.group()
def user() -> None:
    """Add, list and remove SCRAM users (the credentials SASL/SCRAM checks)."""


@user.command("add")
@click.argument("name")
@click.option(
    "--password",
    envvar="LOGMQ_USER_PASSWORD",
    prompt=True,
    hide_input=True,
    confirmation_prompt=True,
    help="The password (prompted without echo when left out; env: LOGMQ_USER_PASSWORD). "
    "On the command line it shows in the process list and shell history.",
)
@click.option(
    "--mechanism",
    type=click.Choice(SCRAM_MECHANISMS, case_sensitive=False),
    default="SCRAM-SHA-512",
    show_default=True,
)
@click.option(
    "--iterations",
    type=click.IntRange(MIN_ITERATIONS, MAX_ITERATIONS),
    default=DEFAULT_ITERATIONS,
    show_default=True,
)
@json_option
@click.pass_obj
@client_errors
def user_add(
    ctx: CliContext, name: str, password: str, mechanism: str, iterations: int, as_json: bool
) -> None:
    """Create user NAME, or replace its credential for the mechanism."""
    if not password:
        raise click.BadParameter("the password must not be empty", param_hint="--password")
    mechanism = mechanism.upper()
    with open_admin(ctx) as admin:
        admin.upsert_scram_user(name, password, mechanism, iterations)
    if as_json:
        emit_json({"user": name, "mechanism": mechanism, "iterations": iterations})
    else:
        click.echo(f"Set the {mechanism} credential of user {name} ({iterations} iterations).")


@user.command("list")
@click.argument("names", nargs=-1)
@json_option
@click.pass_obj
@client_errors
def user_list(ctx: CliContext, names: tuple[str, ...], as_json: bool) -> None:
    """SCRAM users (all, or NAMES) with each credential's mechanism and iterations."""
    with open_admin(ctx) as admin:
        users = admin.describe_scram_users(list(names) or None)
    if as_json:
        emit_json(
            [
                {
                    "user": u,
                    "credentials": [
                        {"mechanism": c.mechanism, "iterations": c.iterations} for c in creds
                    ],
                }
                for u, creds in users.items()
            ]
        )
        return
    rows = [[u, c.mechanism, c.iterations] for u, creds in users.items() for c in creds]
    print_table(["user", "mechanism", "iterations"], rows)


@user.command("remove")
@click.argument("name")
@click.option(
    "--mechanism",
    type=click.Choice(SCRAM_MECHANISMS, case_sensitive=False),
    default=None,
    help="Remove only this credential (default: every one the user has).",
)
@json_option
@click.pass_obj
@client_errors
def user_remove(ctx: CliContext, name: str, mechanism: str | None, as_json: bool) -> None:
    """Remove user NAME's SCRAM credentials."""
    with open_admin(ctx) as admin:
        removed = admin.delete_scram_user(name, mechanism.upper() if mechanism else None)
    if as_json:
        emit_json({"user": name, "removed": removed})
    else:
        click.echo(f"Removed the {', '.join(removed)} credential(s) of user {name}.")


# -- quota ----------------------------------------------------------------------------------

QUOTA_KEYS = (
    "producer_byte_rate",
    "consumer_byte_rate",
    "request_percentage",
    "controller_mutation_rate",
)
DEFAULT_NAME = "<default>"


def entity_options(fn: Any) -> Any:
    for option in reversed(
        [
            click.option("--user", "user_name", metavar="NAME", help="A user principal's name."),
            click.option("--user-default", is_flag=True, help="The default of every user."),
            click.option("--client-id", metavar="ID", help="A client id."),
            click.option(
                "--client-id-default", is_flag=True, help="The default of every client id."
            ),
        ]
    ):
        fn = option(fn)
    return fn


def _entity(
    user_name: str | None, user_default: bool, client_id: str | None, client_id_default: bool
) -> dict[str, str | None]:
    """The entity the options name: type -> name (None: that type's default)."""
    if user_name is not None and user_default:
        raise click.UsageError("give --user or --user-default, not both")
    if client_id is not None and client_id_default:
        raise click.UsageError("give --client-id or --client-id-default, not both")
    for value, option in ((user_name, "--user"), (client_id, "--client-id")):
        if value is not None and not value:
            raise click.BadParameter("must not be empty", param_hint=option)
    entity: dict[str, str | None] = {}
    if user_name is not None or user_default:
        entity["user"] = user_name
    if client_id is not None or client_id_default:
        entity["client-id"] = client_id
    return entity


def _quota_key(text: str) -> str:
    key = text.strip().replace("-", "_").lower()
    if key not in QUOTA_KEYS:
        raise click.BadParameter(
            f"unknown quota {text!r}; expected one of {', '.join(QUOTA_KEYS)}",
            param_hint="--remove",
        )
    return key


def _number(v: float) -> int | float:
    return int(v) if float(v).is_integer() else v


def entity_to_json(entity: dict[str, str | None]) -> dict[str, str | None]:
    return dict(sorted(entity.items()))


@click.group()
def quota() -> None:
    """Set and describe client quotas of users and client ids."""


@quota.command("set")
@entity_options
@click.option("--producer-byte-rate", type=click.IntRange(min=1), help="Bytes/s produced.")
@click.option("--consumer-byte-rate", type=click.IntRange(min=1), help="Bytes/s fetched.")
@click.option(
    "--request-percentage",
    type=click.FloatRange(min=0, min_open=True),
    help="Percent of one request-handler thread's time.",
)
@click.option(
    "--controller-mutation-rate",
    type=click.FloatRange(min=0, min_open=True),
    help="Partitions created or deleted per second.",
)
@click.option(
    "--remove",
    "removes",
    multiple=True,
    metavar="KEY",
    help="Remove a quota, e.g. producer_byte_rate (repeatable).",
)
@json_option
@click.pass_obj
@client_errors
def quota_set(
    ctx: CliContext,
    user_name: str | None,
    user_default: bool,
    client_id: str | None,
    client_id_default: bool,
    producer_byte_rate: int | None,
    consumer_byte_rate: int | None,
    request_percentage: float | None,
    controller_mutation_rate: float | None,
    removes: tuple[str, ...],
    as_json: bool,
) -> None:
    """Set or remove the quotas of one entity: a user, a client id, or both together.

    \b
    logmq quota set --user alice --producer-byte-rate 1048576
    logmq quota set --user-default --client-id-default --remove consumer_byte_rate
    """
    entity = _entity(user_name, user_default, client_id, client_id_default)
    if not entity:
        raise click.UsageError(
            "name the entity: --user/--user-default and/or --client-id/--client-id-default"
        )
    given = {
        "producer_byte_rate": producer_byte_rate,
        "consumer_byte_rate": consumer_byte_rate,
        "request_percentage": request_percentage,
        "controller_mutation_rate": controller_mutation_rate,
    }
    ops: dict[str, float | None] = {k: v for k, v in given.items() if v is not None}
    for key in map(_quota_key, removes):
        if key in ops:
            raise click.UsageError(f"{key} is both set and removed")
        ops[key] = None
    if not ops:
        raise click.UsageError("give a quota to set (e.g. --producer-byte-rate) or --remove KEY")
    with open_admin(ctx) as admin:
        admin.alter_client_quotas([QuotaAlteration(entity, ops)])
    if as_json:
        emit_json({"entity": entity_to_json(entity), "ops": ops})
        return
    who = ", ".join(f"{t} {DEFAULT_NAME if n is None else n}" for t, n in sorted(entity.items()))
    for key, value in ops.items():
        if value is None:
            click.echo(f"Removed {key} of {who}.")
        else:
            click.echo(f"Set {key}={_number(value)} for {who}.")


@quota.command("describe")
@entity_options
@json_option
@click.pass_obj
@client_errors
def quota_describe(
    ctx: CliContext,
    user_name: str | None,
    user_default: bool,
    client_id: str | None,
    client_id_default: bool,
    as_json: bool,
) -> None:
    """Quotas of every entity, or of those matching the options (an entity of a user
    and a client id together matches --user alone too)."""
    entity = _entity(user_name, user_default, client_id, client_id_default)
    filters = [
        QuotaFilter.default(t) if n is None else QuotaFilter.exact(t, n) for t, n in entity.items()
    ]
    with open_admin(ctx) as admin:
        entries: list[QuotaEntry] = admin.describe_client_quotas(filters)
    if as_json:
        emit_json(
            [
                {
                    "entity": entity_to_json(e.entity),
                    "values": {k: _number(v) for k, v in sorted(e.values.items())},
                }
                for e in entries
            ]
        )
        return

    def name(e: QuotaEntry, t: str) -> str:
        if t not in e.entity:
            return ""
        n = e.entity[t]
        return DEFAULT_NAME if n is None else n

    rows = [
        [name(e, "user"), name(e, "client-id"), k, _number(v)]
        for e in entries
        for k, v in sorted(e.values.items())
    ]
    print_table(["user", "client-id", "quota", "value"], rows)
