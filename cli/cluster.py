"""``logmq cluster``: describe the cluster; decommission a broker, rebalance replicas.

``decommission`` and ``rebalance`` plan with logmq.cluster.reassignment_plan and run the
plan like ``logmq reassign execute`` + ``verify`` (cli/reassign.py).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from logmq.client.admin import AsyncAdmin
from logmq.cluster.reassignment_plan import ReassignmentPlan, decommission, rebalance
from logmq.errors import ErrorCode
from logmq_cli.common import CliContext, client_errors
from logmq_cli.output import emit_json, print_table
from logmq_cli.reassign import (
    OneLineErrors,
    brokers_of,
    no_wait_option,
    parse_rate,
    plan_summary,
    planning_view,
    start_plan,
    throttle_option,
)
from logmq_cli.reassign_progress import (
    DONE,
    EXIT_DONE,
    EXIT_STUCK,
    Report,
    explain_stuck,
    follow,
    print_report,
)


async def fetch_description(ctx: CliContext) -> dict[str, Any]:
    """DescribeCluster and DescribeQuorum, as one document (the ``--json`` output)."""
    async with AsyncAdmin(
        ctx.bootstrap, request_timeout_ms=ctx.request_timeout_ms, security=ctx.security()
    ) as admin:
        cluster = await admin.describe_cluster()
        quorum = await admin.describe_quorum()
    for key in ("error", "message", "image_offset"):
        cluster.pop(key, None)
    for key in ("error", "message", "node_id"):
        quorum.pop(key, None)
    cluster["quorum"] = quorum
    return cluster


@click.group()
def cluster() -> None:
    """Inspect the cluster; move every replica off a broker; even out replicas and leaders."""


@cluster.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_obj
@client_errors
def describe(ctx: CliContext, as_json: bool) -> None:
    """Brokers, controller, quorum state, under-replicated and offline partitions."""
    doc = asyncio.run(fetch_description(ctx))
    if as_json:
        emit_json(doc)
        return
    quorum = doc["quorum"]
    click.echo(
        f"cluster {doc['cluster_id']}  controller {doc['controller_id']}  "
        f"quorum leader {quorum['leader_id']} (epoch {quorum['leader_epoch']}, "
        f"committed {quorum['high_watermark']})  "
        f"{doc['topics']} topic(s), {doc['partitions']} partition(s)"
    )
    print_table(
        ["broker", "host", "port", "state", "disk", "epoch", "controller"],
        [
            [
                b["node_id"],
                b["host"],
                b["port"],
                "fenced" if b["fenced"] else "active",
                "FULL" if b.get("storage_full") else "ok",  # older brokers do not say
                b["broker_epoch"],
                "*" if b["node_id"] == doc["controller_id"] else "",
            ]
            for b in doc["brokers"]
        ],
        title="Brokers",
    )
    print_table(
        ["voter", "log end offset"],
        [[v["node_id"], v["log_end_offset"]] for v in quorum["voters"]],
        title="Quorum voters",
    )
    for key, title in (("under_replicated", "Under-replicated"), ("offline", "Offline")):
        rows = doc[key]
        if rows:
            print_table(
                ["topic", "partition", "leader", "replicas", "isr"],
                [[r["topic"], r["partition"], r["leader"], r["replicas"], r["isr"]] for r in rows],
                title=f"{title} partitions",
            )
        else:
            click.echo(f"{title} partitions: none")


# -- moving replicas ---------------------------------------------------------------------------


def move_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options of every command that runs a plan: throttle, wait, dry run, save, JSON."""
    for option in (
        click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts."),
        click.option(
            "--save-plan",
            type=click.Path(dir_okay=False, writable=True),
            default=None,
            help="Also write the plan to this file (for `logmq reassign verify` / `cancel`).",
        ),
        click.option("--dry-run", is_flag=True, help="Print the plan; move nothing."),
        no_wait_option,
        throttle_option,
    ):
        command = option(command)
    return command


@cluster.command("decommission", cls=OneLineErrors)
@click.argument("broker", type=int)
@move_options
@click.pass_obj
@client_errors
def decommission_cmd(
    ctx: CliContext,
    broker: int,
    throttle: str | None,
    no_wait: bool,
    dry_run: bool,
    save_plan: str | None,
    as_json: bool,
) -> None:
    """Move every replica off BROKER (each onto the least loaded live broker without a
    copy), and wait until it holds none. Then it can be stopped for good."""
    rate = None if throttle is None else parse_rate(throttle)
    run = RunOptions(rate, not no_wait, dry_run, save_plan, as_json)
    sys.exit(asyncio.run(_decommission(ctx, broker, run)))


async def _decommission(ctx: CliContext, broker: int, run: RunOptions) -> int:
    async with AsyncAdmin(
        ctx.bootstrap, request_timeout_ms=ctx.request_timeout_ms, security=ctx.security()
    ) as admin:
        registered = await brokers_of(admin)
        if broker not in registered:
            raise click.ClickException(
                f"BROKER_NOT_AVAILABLE: unknown broker {broker}; the cluster has "
                + ",".join(map(str, sorted(registered)))
            )
        live = [b for b, fenced in registered.items() if not fenced and b != broker]
        listing = await admin.list_partition_reassignments()
        involved = sorted(tp for tp, m in listing.partitions.items() if broker in m.replicas)
        if involved:
            raise click.ClickException(
                f"REASSIGNMENT_IN_PROGRESS: {_names(involved)} moving to or from broker "
                f"{broker}; wait for the moves (`logmq reassign verify`) or cancel them first"
            )
        current = await planning_view(admin)
        plan = decommission(current, broker, live)
        what = f"broker {broker} holds no replicas"
        return await _run_plan(admin, plan, current, run, what)


@cluster.command("rebalance", cls=OneLineErrors)
@move_options
@click.pass_obj
@client_errors
def rebalance_cmd(
    ctx: CliContext,
    throttle: str | None,
    no_wait: bool,
    dry_run: bool,
    save_plan: str | None,
    as_json: bool,
) -> None:
    """Even out replicas and preferred leaders over the live brokers with as few moves
    as possible, wait for the moves, then elect the preferred leaders."""
    rate = None if throttle is None else parse_rate(throttle)
    run = RunOptions(rate, not no_wait, dry_run, save_plan, as_json)
    sys.exit(asyncio.run(_rebalance(ctx, run)))


async def _rebalance(ctx: CliContext, run: RunOptions) -> int:
    async with AsyncAdmin(
        ctx.bootstrap, request_timeout_ms=ctx.request_timeout_ms, security=ctx.security()
    ) as admin:
        registered = await brokers_of(admin)
        moving = sorted((await admin.list_partition_reassignments()).partitions)
        if moving:
            raise click.ClickException(
                f"REASSIGNMENT_IN_PROGRESS: {_names(moving)} moving; wait for the moves "
                "(`logmq reassign verify`) or cancel them first"
            )
        current = await planning_view(admin)
        down = sorted({b for rs in current.values() for b in rs if registered.get(b, True)})
        if down:
            raise click.ClickException(
                f"broker(s) {','.join(map(str, down))} hold replicas but are down: bring them "
                "back, or move their replicas off with `logmq cluster decommission`"
            )
        live = [b for b, fenced in registered.items() if not fenced]
        plan = rebalance(current, live)
        code = await _run_plan(admin, plan, current, run, "balanced")
        if run.dry_run or code != EXIT_DONE or not plan:
            return code
        # completion already hands leadership to each target's first replica; electing
        # the preferred leaders also covers leaders that moved since (a broker restart)
        if run.wait:
            done = list(plan.partitions)
        else:
            done = _done((await follow(admin, plan, wait=False, show_progress=False))[0])
        if done:
            results = await admin.elect_leaders(done)
            failed = {
                tp: r
                for tp, r in results.items()
                if r[0] not in (ErrorCode.NONE, ErrorCode.ELECTION_NOT_NEEDED)
            }
            for (t, p), (err, message) in sorted(failed.items()):
                click.echo(
                    f"Warning: {t}-{p}: preferred leader not elected: {err.name} {message}",
                    err=True,
                )
        return code


def _names(partitions: list[tuple[str, int]]) -> str:
    shown = ", ".join(f"{t}-{p}" for t, p in partitions[:5])
    more = f" and {len(partitions) - 5} more" if len(partitions) > 5 else ""
    verb = "is" if len(partitions) == 1 else "are"
    return f"{shown}{more} {verb}"


def _done(report: Report) -> list[tuple[str, int]]:
    return [(p.topic, p.partition) for p in report.partitions if p.state == DONE]


@dataclass(slots=True, frozen=True)
class RunOptions:
    """How decommission and rebalance run their plan."""

    rate: int | None  # the throttle, bytes/s
    wait: bool
    dry_run: bool
    save_plan: str | None
    as_json: bool


async def _run_plan(
    admin: AsyncAdmin, plan: ReassignmentPlan, current: dict, run: RunOptions, done_text: str
) -> int:
    """Show the plan, start it (unless a dry run), and follow it (unless told not to)."""
    as_json, dry_run, wait = run.as_json, run.dry_run, run.wait
    if run.save_plan is not None:
        try:
            Path(run.save_plan).write_text(plan.dumps(), encoding="utf-8")
        except OSError as e:
            raise click.ClickException(f"cannot write {run.save_plan}: {e.strerror or e}")
    doc: dict = {"plan": plan.to_json(), "dry_run": dry_run}
    if not plan:
        if as_json:
            emit_json({**doc, "complete": True})
        else:
            click.echo(f"Nothing to move: {done_text} already.")
        return EXIT_DONE
    if not as_json:
        print_table(
            ["topic", "partition", "replicas", "target", "moves"],
            plan_summary(plan, current),
            title=f"Plan: {len(plan)} partition(s)" + (" (dry run)" if dry_run else ""),
        )
    if dry_run:
        if as_json:
            emit_json(doc)
        else:
            click.echo("Dry run: nothing moved.")
        return EXIT_DONE
    await start_plan(admin, plan, run.rate)
    report, _ = await follow(admin, plan, wait=wait, show_progress=not as_json)
    if as_json:
        emit_json({**doc, **report.to_json()})
    else:
        print_report(report)
    if report.exit_code == EXIT_STUCK:
        click.echo("Error: " + explain_stuck(report), err=True)
    elif report.complete and not as_json:
        click.echo(f"Done: {done_text}.")
    elif not as_json:
        where = run.save_plan or "PLAN.json (see --save-plan)"
        click.echo(f"Moves started; follow them with `logmq reassign verify {where}`.")
    return report.exit_code if wait or report.exit_code == EXIT_STUCK else EXIT_DONE
