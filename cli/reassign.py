"""``logmq reassign``: move partitions between brokers with a plan file.

``generate`` writes a balanced plan (the planning is pure: logmq.cluster.reassignment_plan),
``execute`` hands a plan to the controller, ``verify`` shows where it stands and follows it
to the end, ``cancel`` sends moving partitions back to their original replicas. ``logmq
cluster decommission`` and ``rebalance`` reuse the steps here.

Bad input (a plan file, a broker list, a rate) is one ``Error:`` line and exit status 1,
usage errors included: ``verify`` keeps 2 for "a partition is neither done nor moving".
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from logmq.client.admin import AsyncAdmin
from logmq.cluster.reassignment_plan import (
    PlanError,
    ReassignmentPlan,
    assignment_plan,
    generate,
    parse_plan,
)
from logmq.errors import ErrorCode, ReassignmentError
from logmq_cli.common import CliContext, client_errors
from logmq_cli.output import emit_json, print_table
from logmq_cli.reassign_progress import (
    EXIT_DONE,
    EXIT_STUCK,
    current_replicas,
    echo_timeout,
    explain_stuck,
    follow,
    format_rate,
    print_report,
)

TopicPartition = tuple[str, int]

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
throttle_option = click.option(
    "--throttle",
    metavar="RATE",
    default=None,
    help="Limit reassignment traffic per broker, e.g. 50MB/s, 10MiB/s, 500KB/s or 1048576 "
    "(bytes/s); 0 removes the limit. Removed by itself when the last move ends.",
)
no_wait_option = click.option(
    "--no-wait", is_flag=True, help="Start the moves and return; follow with `reassign verify`."
)

_RATE_UNITS = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
}
_RATE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*(?:/\s*s)?", re.IGNORECASE)


def parse_rate(text: str) -> int:
    """``50MB/s`` (decimal units), ``10MiB/s`` (binary), ``500KB/s``, ``1048576`` -> bytes/s."""
    m = _RATE.fullmatch(text.strip())
    unit = (m.group(2) or "b").lower() if m else ""
    if m is None or unit not in _RATE_UNITS:
        raise click.ClickException(
            f"invalid rate {text!r}: use bytes per second like 50MB/s, 10MiB/s, 500KB/s or 1048576"
        )
    return round(float(m.group(1)) * _RATE_UNITS[unit])


def parse_ids(text: str, what: str) -> list[int]:
    """``2,3,4`` -> [2, 3, 4]."""
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.ClickException(f"{what} must be comma-separated broker ids, got {text!r}")
    if not ids or any(i < 0 for i in ids):
        raise click.ClickException(f"{what} must be comma-separated broker ids, got {text!r}")
    return ids


def read_plan(path: str) -> ReassignmentPlan:
    """The plan in file ``path`` (``-``: stdin); an unusable one is an error naming the file."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        plan = parse_plan(text)
    except OSError as e:
        raise click.ClickException(f"cannot read plan {path}: {e.strerror or e}")
    except (PlanError, UnicodeDecodeError) as e:
        raise click.ClickException(f"{path}: {e}")
    if not plan:
        raise click.ClickException(f"{path}: the plan has no partitions")
    return plan


class OneLineErrors(click.Command):
    """Usage errors as one ``Error:`` line with exit status 1 (see the module docstring)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            if ctx.resilient_parsing:
                raise
            raise click.ClickException(e.format_message()) from None


def open_admin(ctx: CliContext) -> AsyncAdmin:
    return AsyncAdmin(
        ctx.bootstrap, request_timeout_ms=ctx.request_timeout_ms, security=ctx.security()
    )


async def brokers_of(admin: AsyncAdmin) -> dict[int, bool]:
    """Registered brokers -> fenced (not heartbeating)?"""
    cluster = await admin.describe_cluster()
    return {b["node_id"]: bool(b["fenced"]) for b in cluster["brokers"]}


async def planning_view(admin: AsyncAdmin, topics: set[str] | None = None) -> dict:
    """Replicas per partition to plan from: a moving partition counts as where it was."""
    current = await current_replicas(admin, topics)
    listing = await admin.list_partition_reassignments()
    for tp, move in listing.partitions.items():
        if tp in current:
            current[tp] = [r for r in move.replicas if r not in move.adding_replicas]
    return {tp: tuple(rs) for tp, rs in current.items()}


# -- executing and cancelling (shared with ``logmq cluster``) ---------------------------------


async def start_plan(
    admin: AsyncAdmin, plan: ReassignmentPlan, throttle: int | None
) -> tuple[ReassignmentPlan, bool]:
    """Start ``plan``; returns the rollback plan and whether it was already running.

    A plan whose every partition is already moving to its target is not an error when a
    throttle is given (as with Kafka's tool, re-running ``execute`` changes the throttle).
    """
    current = await planning_view(admin, {t for t, _ in plan.partitions})
    unknown = [tp for tp in plan.partitions if tp not in current]
    if unknown:
        names = ", ".join(f"{t}-{p}" for t, p in unknown)
        raise click.ClickException(f"UNKNOWN_TOPIC_OR_PARTITION: no partition {names}")
    rollback = assignment_plan(current, plan.partitions)
    listing = await admin.list_partition_reassignments(list(plan.partitions))
    running = {tp: tuple(m.target_replicas) for tp, m in listing.partitions.items()}
    if running and all(running.get(tp) == rs for tp, rs in plan.partitions.items()):
        if throttle is None:
            raise click.ClickException(
                "REASSIGNMENT_IN_PROGRESS: this plan is already running; follow it with "
                "`logmq reassign verify`, or give --throttle to change the throttle"
            )
        await admin.set_reassignment_throttle(throttle)
        return rollback, True
    await admin.alter_partition_reassignments(
        dict(plan.partitions), throttle_bytes_per_sec=throttle
    )
    return rollback, False


async def cancel_moves(
    admin: AsyncAdmin, partitions: Sequence[TopicPartition] | None
) -> dict[TopicPartition, list[int]]:
    """Cancel the moves of ``partitions`` (None: every move); returns each cancelled
    partition's original replicas. A move that ends while we ask is left out."""
    for _attempt in range(5):
        listing = await admin.list_partition_reassignments(partitions)
        moving = {
            tp: [r for r in m.replicas if r not in m.adding_replicas]
            for tp, m in listing.partitions.items()
        }
        if not moving:
            return {}
        try:
            await admin.alter_partition_reassignments(dict.fromkeys(moving))
        except ReassignmentError as e:
            finished = {c for c, _ in e.partitions.values()} == {
                ErrorCode.NO_REASSIGNMENT_IN_PROGRESS
            }
            if not finished:
                raise
            continue  # some completed meanwhile: ask again
        return moving
    raise click.ClickException("the moves kept changing while cancelling; try again")


# -- commands ---------------------------------------------------------------------------------


@click.group()
def reassign() -> None:
    """Move partitions between brokers: generate a plan, execute it, verify, cancel.

    \b
      logmq reassign generate --topics orders --brokers 2,3,4 > plan.json 2> rollback.json
      logmq reassign execute plan.json --throttle 50MB/s
      logmq reassign verify plan.json
    """


@reassign.command("generate", cls=OneLineErrors)
@click.option("--topics", required=True, metavar="T1,T2", help="Topics to place.")
@click.option("--brokers", required=True, metavar="ID,ID", help="Brokers to place them on.")
@json_option
@click.pass_obj
@client_errors
def generate_cmd(ctx: CliContext, topics: str, brokers: str, as_json: bool) -> None:
    """Print a balanced plan for TOPICS over BROKERS on stdout (save it to a file) and
    the current assignment of the partitions it moves on stderr (the rollback plan)."""
    names = [t.strip() for t in topics.split(",") if t.strip()]
    if not names:
        raise click.ClickException("--topics needs at least one topic name")
    ids = parse_ids(brokers, "--brokers")
    plan, rollback = asyncio.run(_generate(ctx, names, ids))
    if as_json:
        emit_json({"proposed": plan.to_json(), "current": rollback.to_json()})
        return
    sys.stdout.write(plan.dumps())
    if plan:
        _echo_rollback(rollback)
    else:
        click.echo("Nothing to move: the topics are already balanced over those brokers.", err=True)


def _echo_rollback(rollback: ReassignmentPlan) -> None:
    """The current assignment on stderr; only JSON unless a person reads it, so
    ``2> rollback.json`` gives a plan file that rolls the move back."""
    if sys.stderr.isatty():
        click.echo("Current assignment (execute it to roll back):", err=True)
    click.echo(rollback.dumps(), err=True, nl=False)


async def _generate(
    ctx: CliContext, topics: list[str], brokers: list[int]
) -> tuple[ReassignmentPlan, ReassignmentPlan]:
    async with open_admin(ctx) as admin:
        registered = await brokers_of(admin)
        unknown = sorted(set(brokers) - set(registered))
        if unknown:
            raise click.ClickException(
                f"BROKER_NOT_AVAILABLE: unknown broker(s) {_ids(unknown)}; the cluster has "
                f"{_ids(sorted(registered))}"
            )
        fenced = [b for b in brokers if registered[b]]
        if fenced:
            click.echo(f"Warning: broker(s) {_ids(fenced)} are down (fenced)", err=True)
        current = await planning_view(admin, set(topics))
    plan = generate(current, topics, brokers)
    return plan, assignment_plan(current, plan.partitions)


@reassign.command("execute", cls=OneLineErrors)
@click.argument("plan_file", metavar="PLAN.json")
@throttle_option
@json_option
@click.pass_obj
@client_errors
def execute(ctx: CliContext, plan_file: str, throttle: str | None, as_json: bool) -> None:
    """Start moving the partitions of PLAN.json (- for stdin) to their target replicas.

    All or nothing: if any partition cannot move (unknown, already moving, a broker twice,
    fewer replicas than min.insync.replicas...) nothing starts.
    """
    plan = read_plan(plan_file)
    rate = None if throttle is None else parse_rate(throttle)
    rollback, already = asyncio.run(_execute(ctx, plan, rate))
    if as_json:
        emit_json(
            {
                "started": not already,
                "partitions": len(plan),
                "throttle_bytes_per_sec": rate,
                "rollback": rollback.to_json(),
            }
        )
        return
    _echo_rollback(rollback)
    if already:
        click.echo(f"The plan is already running; reassignment traffic {_throttle_text(rate)}.")
        return
    click.echo(
        f"Started moving {len(plan)} partition(s)"
        + ("" if rate is None else f"; reassignment traffic {_throttle_text(rate)}")
        + f". Follow with: logmq reassign verify {plan_file}"
    )


async def _execute(
    ctx: CliContext, plan: ReassignmentPlan, rate: int | None
) -> tuple[ReassignmentPlan, bool]:
    async with open_admin(ctx) as admin:
        return await start_plan(admin, plan, rate)


@reassign.command("verify", cls=OneLineErrors)
@click.argument("plan_file", metavar="PLAN.json")
@click.option(
    "--no-wait",
    is_flag=True,
    help="Look once: exit 0 if complete, 1 if still moving, 2 if a partition is neither.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    help="Give up waiting after this many seconds (exit 1; the moves go on).",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.05),
    default=1.0,
    show_default=True,
    help="Seconds between looks.",
)
@json_option
@click.pass_obj
@client_errors
def verify(
    ctx: CliContext,
    plan_file: str,
    no_wait: bool,
    timeout: float | None,
    interval: float,
    as_json: bool,
) -> None:
    """Show each partition of PLAN.json (done, moving, not started or cancelled) and the
    bytes copied, and wait until all are done (exit 0).

    Exit 2 when a partition is neither done nor moving (it was cancelled, never started,
    or moves elsewhere): waiting would not help.
    """
    plan = read_plan(plan_file)
    code = asyncio.run(_verify(ctx, plan, not no_wait, timeout, interval, as_json))
    sys.exit(code)


async def _verify(
    ctx: CliContext,
    plan: ReassignmentPlan,
    wait: bool,
    timeout: float | None,
    interval: float,
    as_json: bool,
) -> int:
    async with open_admin(ctx) as admin:
        report, timed_out = await follow(
            admin,
            plan,
            wait=wait,
            interval_s=interval,
            timeout_s=timeout,
            show_progress=not as_json,
        )
    if as_json:
        emit_json(report.to_json())
    else:
        print_report(report)
    if report.exit_code == EXIT_STUCK:
        click.echo("Error: " + explain_stuck(report), err=True)
    elif timed_out:
        echo_timeout(timeout or 0)
    elif report.exit_code == EXIT_DONE and not as_json:
        click.echo("Every partition is on its target replicas.")
    return report.exit_code


@reassign.command("cancel", cls=OneLineErrors)
@click.argument("plan_file", metavar="[PLAN.json]", required=False)
@json_option
@click.pass_obj
@client_errors
def cancel(ctx: CliContext, plan_file: str | None, as_json: bool) -> None:
    """Send the moving partitions of PLAN.json (no plan: every moving partition) back to
    their original replicas; what the new replicas copied is deleted. Partitions already
    done stay where they are."""
    plan = read_plan(plan_file) if plan_file is not None else None
    cancelled = asyncio.run(_cancel(ctx, plan))
    if as_json:
        emit_json(
            {
                "cancelled": [
                    {"topic": t, "partition": p, "replicas": rs}
                    for (t, p), rs in sorted(cancelled.items())
                ]
            }
        )
        return
    if not cancelled:
        click.echo(
            "Nothing to cancel: no partition " + ("of the plan " if plan else "") + "is moving."
        )
        return
    print_table(
        ["topic", "partition", "back to replicas"],
        [[t, p, rs] for (t, p), rs in sorted(cancelled.items())],
        title=f"Cancelled {len(cancelled)} move(s)",
    )


async def _cancel(
    ctx: CliContext, plan: ReassignmentPlan | None
) -> Mapping[TopicPartition, list[int]]:
    async with open_admin(ctx) as admin:
        return await cancel_moves(admin, None if plan is None else list(plan.partitions))


def _throttle_text(rate: int | None) -> str:
    if rate is None:
        return "unchanged"
    return "unthrottled" if rate == 0 else f"throttled to {format_rate(rate)} per broker"


def _ids(ids: Sequence[int]) -> str:
    return ",".join(str(i) for i in ids)


def plan_summary(plan: ReassignmentPlan, current: Mapping[TopicPartition, Any]) -> list[list]:
    """Rows for a plan table: partition, replicas now, target, data moved or reorder only."""
    return [
        [
            t,
            p,
            list(current.get((t, p), ())),
            list(rs),
            "reorder" if set(rs) == set(current.get((t, p), ())) else "copy",
        ]
        for (t, p), rs in plan.partitions.items()
    ]
