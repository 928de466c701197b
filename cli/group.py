"""``logmq group``: list, describe (with lag), reset offsets of, and delete consumer groups.

``reset-offsets`` is a dry run unless ``--execute``: it prints the plan (current and new
offset per partition). New offsets are computed here (``plan_reset`` is pure) and clamped
into each partition's [log start, log end], as Kafka's tool does; the commit is an
administrative one, which the coordinator accepts only while the group has no members.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import click

from logmq.client import Admin, GroupDescription
from logmq.errors import ErrorCode, LogMQError
from logmq_cli.common import CliContext, client_errors
from logmq_cli.output import emit_json, print_table

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
EARLIEST, LATEST = -2, -1


def open_admin(ctx: CliContext) -> Admin:
    return Admin(ctx.bootstrap, request_timeout_ms=ctx.request_timeout_ms, security=ctx.security())


def describe_to_json(d: GroupDescription) -> dict[str, Any]:
    """The ``group describe --json`` document."""
    return {
        "group_id": d.group_id,
        "state": d.state,
        "group_epoch": d.group_epoch,
        "assignment_epoch": d.assignment_epoch,
        "assignor": d.assignor,
        "members": [
            {
                "member_id": m.member_id,
                "instance_id": m.instance_id,
                "member_epoch": m.member_epoch,
                "state": m.state,
                "left_temporarily": m.left_temporarily,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "subscribed_topics": m.subscribed_topics,
                "assignment": [[t, p] for t, p in m.assignment],
                "pending_revocation": [[t, p] for t, p in m.pending_revocation],
            }
            for m in d.members
        ],
        "partitions": [
            {
                "topic": p.topic,
                "partition": p.partition,
                "member_id": p.member_id,
                "committed_offset": p.committed_offset,
                "log_end_offset": p.log_end_offset,
                "lag": p.lag,
                "metadata": p.metadata,
            }
            for p in d.partitions
        ],
        "total_lag": sum(p.lag or 0 for p in d.partitions),
    }


@click.group()
def group() -> None:
    """List, describe, reset the offsets of and delete consumer groups."""


@group.command("list")
@json_option
@click.pass_obj
@client_errors
def list_(ctx: CliContext, as_json: bool) -> None:
    """Consumer groups with their state and member count."""
    with open_admin(ctx) as admin:
        groups = admin.list_groups()
    rows = [
        {"group_id": g.group_id, "type": g.type, "state": g.state, "members": g.members}
        for g in groups
    ]
    if as_json:
        emit_json(rows)
    else:
        print_table(["group", "type", "state", "members"], [list(r.values()) for r in rows])


@group.command("describe")
@click.argument("group_id")
@json_option
@click.pass_obj
@client_errors
def describe(ctx: CliContext, group_id: str, as_json: bool) -> None:
    """Members and their assignment; committed offset, log end offset and lag per partition."""
    with open_admin(ctx) as admin:
        d = admin.describe_group(group_id)
    doc = describe_to_json(d)
    if as_json:
        emit_json(doc)
        return
    click.echo(
        f"Group {d.group_id}: {d.state}, epoch {d.group_epoch}, assignor {d.assignor}, "
        f"{len(d.members)} member(s), total lag {doc['total_lag']}"
    )
    if d.members:
        print_table(
            ["member", "instance", "client", "host", "epoch", "state", "assignment"],
            [
                [
                    m.member_id,
                    m.instance_id,
                    m.client_id,
                    m.client_host,
                    m.member_epoch,
                    "left temporarily" if m.left_temporarily else m.state,
                    [f"{t}-{p}" for t, p in m.assignment],
                ]
                for m in d.members
            ],
            title="Members",
        )
    print_table(
        ["topic", "partition", "member", "committed offset", "log end offset", "lag"],
        [
            [p.topic, p.partition, p.member_id, p.committed_offset, p.log_end_offset, p.lag]
            for p in d.partitions
        ],
        title="Offsets",
    )


@group.command("delete")
@click.argument("group_ids", nargs=-1, required=True)
@json_option
@click.pass_obj
@client_errors
def delete(ctx: CliContext, group_ids: tuple[str, ...], as_json: bool) -> None:
    """Delete empty groups and their committed offsets."""
    with open_admin(ctx) as admin:
        for g in group_ids:
            _explain_non_empty(lambda g=g: admin.delete_group(g), g)
    if as_json:
        emit_json({"deleted": list(group_ids)})
    else:
        for g in group_ids:
            click.echo(f"Deleted group {g}.")


def _explain_non_empty(action: Any, group_id: str) -> None:
    try:
        action()
    except LogMQError as e:
        if e.code is ErrorCode.NON_EMPTY_GROUP:
            raise click.ClickException(
                f"NON_EMPTY_GROUP: group {group_id} has live members; stop its consumers first"
            ) from None
        raise


# -- reset-offsets --------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class PlannedReset:
    topic: str
    partition: int
    current: int | None  # committed now (None: nothing committed)
    new: int


def plan_reset(
    partitions: Iterable[tuple[str, int]],
    committed: Mapping[tuple[str, int], int],
    earliest: Mapping[tuple[str, int], int],
    latest: Mapping[tuple[str, int], int],
    *,
    to_offset: int | None = None,
    shift_by: int | None = None,
    by_time: Mapping[tuple[str, int], int] | None = None,
    to: int | None = None,
) -> list[PlannedReset]:
    """New committed offsets, clamped into [log start, log end] of each partition.

    Exactly one of: ``to`` (EARLIEST or LATEST), ``to_offset``, ``shift_by`` (from the
    committed offset, or the log start where none is committed), ``by_time`` (the first
    offset at or after a time per partition, -1 where no record is that recent: the end).
    """
    out = []
    for tp in sorted(partitions):
        low, high = earliest[tp], latest[tp]
        current = committed.get(tp)
        if to == EARLIEST:
            new = low
        elif to == LATEST:
            new = high
        elif to_offset is not None:
            new = to_offset
        elif shift_by is not None:
            new = (low if current is None else current) + shift_by
        elif by_time is not None:
            found = by_time[tp]
            new = high if found < 0 else found
        else:
            raise ValueError("no reset strategy given")
        out.append(PlannedReset(tp[0], tp[1], current, min(max(new, low), high)))
    return out


def parse_topic_partitions(specs: Iterable[str], admin: Admin) -> list[tuple[str, int]]:
    """``TOPIC`` (every partition) or ``TOPIC:0,2`` -> the (topic, partition) pairs."""
    out: list[tuple[str, int]] = []
    for spec in specs:
        topic, sep, parts = spec.partition(":")
        known = {p.partition for p in admin.describe_topics([topic])[topic].partitions}
        if not sep:
            out += [(topic, p) for p in sorted(known)]
            continue
        try:
            wanted = [int(p) for p in parts.split(",") if p.strip()]
        except ValueError:
            raise click.BadParameter(f"{spec!r}: use TOPIC or TOPIC:P[,P...]") from None
        missing = [p for p in wanted if p not in known]
        if missing or not wanted:
            raise click.BadParameter(f"{spec!r}: topic {topic} has no partition {missing}")
        out += [(topic, p) for p in wanted]
    return out


def parse_datetime(text: str) -> int:
    """ISO 8601 -> epoch milliseconds; without a zone it is local time (as in Kafka)."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not an ISO 8601 date-time") from None
    if when.tzinfo is None:
        when = when.astimezone()
    return int(when.timestamp() * 1000)


@group.command("reset-offsets")
@click.argument("group_id")
@click.option(
    "--topic",
    "topics",
    multiple=True,
    required=True,
    metavar="TOPIC[:P,...]",
    help="Topic (all partitions) or TOPIC:0,2; repeat for several.",
)
@click.option("--to-earliest", is_flag=True, help="To each partition's log start offset.")
@click.option("--to-latest", is_flag=True, help="To each partition's log end offset.")
@click.option("--to-offset", type=click.IntRange(min=0), default=None, help="To this offset.")
@click.option(
    "--to-datetime",
    default=None,
    metavar="ISO",
    help="To the first record at or after this time, e.g. 2024-05-01T12:00:00+00:00.",
)
@click.option("--shift-by", type=int, default=None, help="Move the committed offset by N.")
@click.option("--execute", is_flag=True, help="Commit the new offsets (default: dry run).")
@json_option
@click.pass_obj
@client_errors
def reset_offsets(
    ctx: CliContext,
    group_id: str,
    topics: tuple[str, ...],
    to_earliest: bool,
    to_latest: bool,
    to_offset: int | None,
    to_datetime: str | None,
    shift_by: int | None,
    execute: bool,
    as_json: bool,
) -> None:
    """Plan (and with --execute, commit) new offsets for GROUP_ID; its consumers must be
    stopped."""
    chosen = [to_earliest, to_latest, to_offset is not None, to_datetime is not None]
    chosen.append(shift_by is not None)
    if sum(chosen) != 1:
        raise click.UsageError(
            "give exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime, --shift-by"
        )
    with open_admin(ctx) as admin:
        tps = parse_topic_partitions(topics, admin)
        committed = {tp: o.offset for tp, o in admin.group_offsets(group_id, tps).items()}
        earliest = {tp: o for tp, (o, _) in admin.list_offsets(dict.fromkeys(tps, -2)).items()}
        latest = {tp: o for tp, (o, _) in admin.list_offsets(dict.fromkeys(tps, -1)).items()}
        by_time = None
        if to_datetime is not None:
            ts = parse_datetime(to_datetime)
            by_time = {tp: o for tp, (o, _) in admin.list_offsets(dict.fromkeys(tps, ts)).items()}
        plan = plan_reset(
            tps,
            committed,
            earliest,
            latest,
            to=EARLIEST if to_earliest else LATEST if to_latest else None,
            to_offset=to_offset,
            shift_by=shift_by,
            by_time=by_time,
        )
        if execute:
            offsets = {(r.topic, r.partition): r.new for r in plan}
            _explain_non_empty(lambda: admin.alter_group_offsets(group_id, offsets), group_id)
    if as_json:
        emit_json(
            {
                "group_id": group_id,
                "executed": execute,
                "partitions": [
                    {
                        "topic": r.topic,
                        "partition": r.partition,
                        "current_offset": r.current,
                        "new_offset": r.new,
                    }
                    for r in plan
                ],
            }
        )
        return
    print_table(
        ["topic", "partition", "current offset", "new offset"],
        [[r.topic, r.partition, r.current, r.new] for r in plan],
        title=f"Offsets of group {group_id}" + ("" if execute else " (dry run)"),
    )
    if execute:
        click.echo(f"Committed new offsets for {len(plan)} partition(s).")
    else:
        click.echo("Dry run: nothing changed. Add --execute to commit these offsets.")
