"""``logmq topic``: create, list, describe, delete, grow and reconfigure topics."""

from __future__ import annotations

import asyncio
from typing import Any

import click

from logmq.client import Admin, TopicDescription
from logmq.client.admin import NewTopic
from logmq.errors import ErrorCode, LogMQError
from logmq_cli.common import CliContext, client_errors
from logmq_cli.output import emit_json, parse_key_values, print_table
from logmq_cli.storage import remote_status

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def open_admin(ctx: CliContext) -> Admin:
    return Admin(ctx.bootstrap, request_timeout_ms=ctx.request_timeout_ms, security=ctx.security())


def describe_to_json(desc: TopicDescription, configs: dict[str, Any] | None) -> dict[str, Any]:
    """The ``topic describe --json`` document."""
    out: dict[str, Any] = {
        "topic": desc.name,
        "internal": desc.internal,
        "partitions": [
            {
                "partition": p.partition,
                "leader": p.leader,
                "leader_epoch": p.leader_epoch,
                "replicas": list(p.replicas),
                "isr": list(p.isr),
                "log_start_offset": p.log_start_offset,
                "log_end_offset": p.log_end_offset,
            }
            for p in sorted(desc.partitions, key=lambda p: p.partition)
        ],
    }
    if configs is not None:
        out["configs"] = configs
    return out


@click.group()
def topic() -> None:
    """Create, list, describe, delete, grow and reconfigure topics."""


@topic.command("create")
@click.argument("name")
@click.option("--partitions", "-p", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--replication-factor", "-r", type=click.IntRange(min=1), default=1, show_default=True
)
@click.option(
    "--config",
    "-c",
    "configs",
    multiple=True,
    metavar="KEY=VALUE",
    help="Topic config override; repeat for several.",
)
@click.option(
    "--replica-assignment",
    metavar="B:B,B:B",
    help="Replicas of each partition, as kafka-topics takes them: partitions separated by "
    "commas, brokers by colons, the first the preferred leader (instead of -p and -r).",
)
@click.option("--if-not-exists", is_flag=True, help="Succeed when the topic already exists.")
@json_option
@click.pass_obj
@client_errors
def create(
    ctx: CliContext,
    name: str,
    partitions: int,
    replication_factor: int,
    configs: tuple[str, ...],
    replica_assignment: str | None,
    if_not_exists: bool,
    as_json: bool,
) -> None:
    """Create topic NAME."""
    parsed = parse_key_values(configs, "--config")
    assignments = _parse_assignment(replica_assignment) if replica_assignment else None
    if assignments is not None:
        given = click.get_current_context().get_parameter_source
        if any(
            given(p) is click.core.ParameterSource.COMMANDLINE
            for p in ("partitions", "replication_factor")
        ):
            raise click.UsageError("--replica-assignment replaces --partitions and -r")
        partitions = len(assignments)
    created = True
    with open_admin(ctx) as admin:
        try:
            admin.create_topics(
                [NewTopic(name, partitions, replication_factor, parsed, assignments)]
            )
        except LogMQError as e:
            if not (if_not_exists and e.code == ErrorCode.TOPIC_ALREADY_EXISTS):
                raise
            created = False
    if as_json:
        emit_json({"topic": name, "created": created, "partitions": partitions})
    elif created:
        click.echo(f"Created topic {name} with {partitions} partition(s).")
    else:
        click.echo(f"Topic {name} already exists.")


def _parse_assignment(text: str) -> list[list[int]]:
    try:
        return [[int(b) for b in part.split(":")] for part in text.split(",")]
    except ValueError:
        raise click.BadParameter(
            f"expected broker ids like 1:2,2:3, got {text!r}", param_hint="--replica-assignment"
        ) from None


@topic.command("list")
@click.option("--internal", is_flag=True, help="Include internal topics.")
@json_option
@click.pass_obj
@client_errors
def list_(ctx: CliContext, internal: bool, as_json: bool) -> None:
    """List topics with their partition count and replication factor."""
    with open_admin(ctx) as admin:
        listings = admin.list_topic_listings(internal=internal)
    rows = [
        {
            "topic": t.name,
            "partitions": t.partitions,
            "replication_factor": t.replication_factor,
            "internal": t.internal,
        }
        for t in listings
    ]
    if as_json:
        emit_json(rows)
        return
    columns = ["topic", "partitions", "replicas"] + (["internal"] if internal else [])
    print_table(
        columns,
        [
            [r["topic"], r["partitions"], r["replication_factor"]]
            + (["yes" if r["internal"] else ""] if internal else [])
            for r in rows
        ],
    )


@topic.command("describe")
@click.argument("name")
@json_option
@click.pass_obj
@client_errors
def describe(ctx: CliContext, name: str, as_json: bool) -> None:
    """Partitions of NAME (leader, replicas, ISR, log start/end offsets) and its configs;
    for a tiered topic (remote.storage.enable=true) also each partition's local and
    remote start offsets and bytes and its copy lag, as its leader reports them."""
    with open_admin(ctx) as admin:
        desc = admin.describe_topics([name])[name]
        entries = admin.describe_configs([name]).get(name, {})
    configs = {k: e.value for k, e in sorted(entries.items())}
    doc = describe_to_json(desc, configs)
    tiered = str(configs.get("remote.storage.enable", "false")).lower() == "true"
    if tiered:
        add_remote_tier(ctx, doc)
    if as_json:
        emit_json(doc)
        return
    columns = ["partition", "leader", "replicas", "isr", "log start offset", "log end offset"]
    keys = ["partition", "leader", "replicas", "isr", "log_start_offset", "log_end_offset"]
    if tiered:
        columns += REMOTE_COLUMNS
        keys += REMOTE_KEYS
    print_table(
        columns,
        [[p.get(k) for k in keys] for p in doc["partitions"]],
        title=f"Topic {name}" + (" (internal)" if desc.internal else ""),
    )
    if doc.get("remote_tier_error"):
        click.echo(f"remote tier status unavailable: {doc['remote_tier_error']}", err=True)
    overrides = [(k, e.value) for k, e in sorted(entries.items()) if not e.default]
    if overrides:
        print_table(["config", "value"], overrides, title="Overrides")


REMOTE_COLUMNS = [
    "local start offset",
    "local bytes",
    "remote start offset",
    "remote bytes",
    "copy lag segments",
    "copy lag bytes",
]
REMOTE_KEYS = [
    "local_log_start_offset",
    "local_bytes",
    "remote_log_start_offset",
    "remote_bytes",
    "copy_lag_segments",
    "copy_lag_bytes",
]


def add_remote_tier(ctx: CliContext, doc: dict[str, Any]) -> None:
    """Each partition's two tiers, asked of its leader (DescribeRemoteTier). A leader
    that cannot say (unreachable, not tiering yet, an older broker) leaves the fields
    None and the reason in ``remote_tier_error``: the rest of describe still stands."""
    topic = doc["topic"]
    leaders = {p["leader"] for p in doc["partitions"] if p["leader"] is not None}
    leaders.discard(-1)
    for p in doc["partitions"]:
        p.update(dict.fromkeys(REMOTE_KEYS))
    if not leaders:
        return
    try:
        report = asyncio.run(remote_status(ctx, nodes=leaders, body={"topics": [topic]}))
    except (LogMQError, OSError, TimeoutError) as e:
        doc["remote_tier_error"] = str(e)
        return
    errors = [f"broker {b['broker_id']}: {b['error']}" for b in report.brokers if b["error"]]
    if errors:
        doc["remote_tier_error"] = "; ".join(errors)
    for p in doc["partitions"]:
        row = report.partitions.get((topic, p["partition"]))
        if row is None:
            continue
        p["local_log_start_offset"] = row["local_log_start_offset"]
        p["local_bytes"] = row["local_bytes"]
        # the remote tier starts where the log does once a segment is there
        p["remote_log_start_offset"] = row["log_start_offset"] if row["remote_segments"] else None
        p["remote_bytes"] = row["remote_bytes"]
        p["copy_lag_segments"] = row["copy_lag_segments"]
        p["copy_lag_bytes"] = row["copy_lag_bytes"]


@topic.command("delete")
@click.argument("names", nargs=-1, required=True)
@json_option
@click.pass_obj
@client_errors
def delete(ctx: CliContext, names: tuple[str, ...], as_json: bool) -> None:
    """Delete one or more topics and all their data."""
    with open_admin(ctx) as admin:
        admin.delete_topics(list(names))
    if as_json:
        emit_json({"deleted": list(names)})
    else:
        for n in names:
            click.echo(f"Deleted topic {n}.")


@topic.command("alter")
@click.argument("name")
@click.option(
    "--partitions",
    "-p",
    type=click.IntRange(min=1),
    required=True,
    help="The new total number of partitions (larger than now).",
)
@click.option(
    "--replica-assignment",
    metavar="B:B,B:B",
    help="Replicas of the new partitions, as kafka-topics takes them: partitions separated "
    "by commas, brokers by colons, the first the preferred leader. One list per new "
    "partition, or one per partition (the existing partitions' lists are then skipped, "
    "as kafka-topics --alter does).",
)
@click.option(
    "--validate-only", is_flag=True, help="Check the change on the controller; change nothing."
)
@json_option
@click.pass_obj
@client_errors
def alter(
    ctx: CliContext,
    name: str,
    partitions: int,
    replica_assignment: str | None,
    validate_only: bool,
    as_json: bool,
) -> None:
    """Add partitions to topic NAME (configs: see alter-config).

    Existing records stay where they are. A keyed record goes to hash(key) % partitions,
    so from now on most keys send their new records to another partition than their
    older ones: per-key order holds only within one partition. Moving partitions between
    brokers is `logmq reassign` (docs/reassignment.md).
    """
    lists = _parse_assignment(replica_assignment) if replica_assignment else None
    with open_admin(ctx) as admin:
        if lists is not None:
            lists = _new_partitions_lists(admin, name, partitions, lists)
        admin.create_partitions(
            {name: partitions},
            assignments=None if lists is None else {name: lists},
            validate_only=validate_only,
        )
    if as_json:
        doc: dict[str, Any] = {"topic": name, "partitions": partitions}
        if lists is not None:
            doc["assignments"] = lists
        if validate_only:
            doc["validate_only"] = True
        emit_json(doc)
        return
    if validate_only:
        click.echo(f"Valid: topic {name} can grow to {partitions} partition(s).")
        return
    click.echo(f"Topic {name} now has {partitions} partition(s).")
    click.echo(
        "Note: new records of a key may now go to another partition than its older "
        "records; per-key order holds only within each partition.",
        err=True,
    )


def _new_partitions_lists(
    admin: Admin, name: str, total: int, lists: list[list[int]]
) -> list[list[int]]:
    """The replica lists of the new partitions. kafka-topics --alter takes one list per
    partition and skips the existing partitions' lists: so is a list of ``total`` here
    (with a warning when a skipped list is not what the partition has: moving existing
    partitions is `logmq reassign`). Any other length goes as it is (the controller
    says what is wrong with it)."""
    current = sorted(admin.describe_topics([name])[name].partitions, key=lambda p: p.partition)
    if len(lists) != total or len(current) >= total:
        return lists
    skipped = lists[: len(current)]
    moved = [p.partition for p, want in zip(current, skipped, strict=True) if p.replicas != want]
    if moved:
        click.echo(
            f"Warning: the lists of existing partitions {moved} differ from their replicas "
            "and are ignored (to move partitions: logmq reassign).",
            err=True,
        )
    return lists[len(current) :]


@topic.command("alter-config")
@click.argument("name")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Set a config.")
@click.option("--delete", "deletes", multiple=True, metavar="KEY", help="Revert to default.")
@json_option
@click.pass_obj
@client_errors
def alter_config(
    ctx: CliContext, name: str, sets: tuple[str, ...], deletes: tuple[str, ...], as_json: bool
) -> None:
    """Set or delete config overrides of topic NAME."""
    if not sets and not deletes:
        raise click.UsageError("give at least one --set KEY=VALUE or --delete KEY")
    parsed = parse_key_values(sets, "--set")
    with open_admin(ctx) as admin:
        admin.alter_configs(name, set=parsed, delete=list(deletes))
    if as_json:
        emit_json({"topic": name, "set": parsed, "deleted": list(deletes)})
    else:
        click.echo(f"Altered configs of topic {name}.")
