"""``logmq cluster describe``: brokers, controller, quorum, unhealthy partitions."""

from __future__ import annotations

import asyncio
from typing import Any

import click

from logmq.client.admin import AsyncAdmin
from logmq_cli.common import CliContext, client_errors
from logmq_cli.output import emit_json, print_table


async def fetch_description(ctx: CliContext) -> dict[str, Any]:
    """DescribeCluster and DescribeQuorum, as one document (the ``--json`` output)."""
    async with AsyncAdmin(ctx.bootstrap, request_timeout_ms=ctx.request_timeout_ms) as admin:
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
    """Inspect the cluster: brokers, controller and metadata quorum."""


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
        ["broker", "host", "port", "state", "epoch", "controller"],
        [
            [
                b["node_id"],
                b["host"],
                b["port"],
                "fenced" if b["fenced"] else "active",
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
