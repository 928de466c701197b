"""``logmq txn``: list, describe, see the producers of, find and abort transactions.

The commands of Kafka's kafka-transactions.sh. ``find-hanging`` reports open
transactions that hold a partition's last stable offset (and so every read_committed
consumer) back while no coordinator will ever end them; ``abort`` ends one such
transaction on one partition by having the leader write an ABORT marker, which needs
CLUSTER_ACTION when the broker's authorizer is on (a super user), as in Kafka.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import click

from logmq.client import Admin
from logmq.client.txn_admin import DEFAULT_MAX_AGE_MS, STATES
from logmq_cli.common import CliContext, client_errors
from logmq_cli.output import emit_json, print_table

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def open_admin(ctx: CliContext) -> Admin:
    return Admin(ctx.bootstrap, request_timeout_ms=ctx.request_timeout_ms, security=ctx.security())


def _time(ms: int) -> str:
    """A wall-clock time in ms as UTC ISO text; empty for -1 (none)."""
    if ms < 0:
        return ""
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="seconds")


@click.group()
def txn() -> None:
    """List, describe and abort transactions; show partitions' producers; find hanging
    transactions."""


@txn.command("list")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(STATES, case_sensitive=False),
    help="Only transactions in this state (repeatable).",
)
@click.option(
    "--producer-id",
    "producer_ids",
    multiple=True,
    type=click.IntRange(min=0),
    help="Only this producer id (repeatable).",
)
@click.option(
    "--min-duration-ms",
    type=click.IntRange(min=0),
    default=None,
    help="Only transactions open for longer than this.",
)
@json_option
@click.pass_obj
@client_errors
def list_(
    ctx: CliContext,
    states: tuple[str, ...],
    producer_ids: tuple[int, ...],
    min_duration_ms: int | None,
    as_json: bool,
) -> None:
    """Transactional ids of every coordinator, with producer id and state."""
    wanted = [next(s for s in STATES if s.lower() == x.lower()) for x in states]
    with open_admin(ctx) as admin:
        listed = admin.list_transactions(wanted, producer_ids, min_duration_ms)
    rows = [dataclasses.asdict(t) for t in listed]
    if as_json:
        emit_json(rows)
        return
    print_table(
        ["transactional id", "producer id", "state", "coordinator"],
        [[t.transactional_id, t.producer_id, t.state, t.coordinator_id] for t in listed],
    )


@txn.command("describe")
@click.argument("transactional_ids", nargs=-1, required=True)
@json_option
@click.pass_obj
@client_errors
def describe(ctx: CliContext, transactional_ids: tuple[str, ...], as_json: bool) -> None:
    """State, producer, timeout, start time and partitions of transactional ids."""
    with open_admin(ctx) as admin:
        found = admin.describe_transactions(transactional_ids)
    if as_json:
        emit_json(
            [
                {**dataclasses.asdict(d), "partitions": [[t, p] for t, p in d.partitions]}
                for d in found
            ]
        )
        return
    for d in found:
        click.echo(f"Transaction {d.transactional_id}: {d.state} (coordinator {d.coordinator_id})")
        click.echo(
            f"  producer id {d.producer_id}, epoch {d.producer_epoch}, "
            f"timeout {d.timeout_ms} ms, started {_time(d.start_ms) or '-'}"
        )
        click.echo(f"  partitions: {', '.join(f'{t}-{p}' for t, p in d.partitions) or '-'}")


@txn.command("producers")
@click.argument("topic")
@click.option(
    "--partition",
    "partitions",
    multiple=True,
    type=click.IntRange(min=0),
    help="Only this partition (repeatable; default: all).",
)
@json_option
@click.pass_obj
@client_errors
def producers(ctx: CliContext, topic: str, partitions: tuple[int, ...], as_json: bool) -> None:
    """Active producers of a topic's partitions, from their leaders."""
    with open_admin(ctx) as admin:
        found = admin.describe_producers(topic, partitions or None)
    rows: list[dict[str, Any]] = [
        {"topic": topic, "partition": p, **dataclasses.asdict(s)}
        for p, states in sorted(found.items())
        for s in states
    ]
    if as_json:
        emit_json(rows)
        return
    print_table(
        [
            "partition",
            "producer id",
            "epoch",
            "last sequence",
            "last timestamp",
            "current txn start offset",
        ],
        [
            [
                r["partition"],
                r["producer_id"],
                r["producer_epoch"],
                r["last_sequence"],
                _time(r["last_timestamp"]),
                r["current_txn_start_offset"] if r["current_txn_start_offset"] >= 0 else "",
            ]
            for r in rows
        ],
    )


@txn.command("abort")
@click.option("--topic", required=True, help="The partition's topic.")
@click.option("--partition", required=True, type=click.IntRange(min=0))
@click.option("--producer-id", required=True, type=click.IntRange(min=0))
@click.option("--producer-epoch", required=True, type=click.IntRange(min=0))
@click.option(
    "--coordinator-epoch",
    type=click.IntRange(min=0),
    default=None,
    help="The coordinator epoch the marker carries [default: that of the producer's "
    "last marker on the partition, from DescribeProducers].",
)
@json_option
@click.pass_obj
@client_errors
def abort(
    ctx: CliContext,
    topic: str,
    partition: int,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int | None,
    as_json: bool,
) -> None:
    """End a hanging transaction on one partition with an ABORT marker.

    Take the producer id and epoch from `logmq txn find-hanging` or `logmq txn
    producers`. Needs CLUSTER_ACTION on the cluster when the authorizer is on."""
    with open_admin(ctx) as admin:
        admin.abort_transaction(topic, partition, producer_id, producer_epoch, coordinator_epoch)
    doc = {
        "topic": topic,
        "partition": partition,
        "producer_id": producer_id,
        "producer_epoch": producer_epoch,
        "aborted": True,
    }
    if as_json:
        emit_json(doc)
    else:
        click.echo(f"Aborted producer {producer_id}'s transaction on {topic}-{partition}.")


@txn.command("find-hanging")
@click.option(
    "--topic",
    "topics",
    multiple=True,
    help="Only this topic (repeatable; default: every non-internal topic).",
)
@click.option(
    "--max-age-ms",
    type=click.IntRange(min=0),
    default=DEFAULT_MAX_AGE_MS,
    show_default=True,
    help="An open transaction older than this hangs (the coordinators' largest "
    "transaction.max.timeout.ms).",
)
@json_option
@click.pass_obj
@client_errors
def find_hanging(ctx: CliContext, topics: tuple[str, ...], max_age_ms: int, as_json: bool) -> None:
    """Open transactions on partitions that no coordinator will end."""
    with open_admin(ctx) as admin:
        found = admin.find_hanging(list(topics) or None, max_age_ms)
    if as_json:
        emit_json([dataclasses.asdict(h) for h in found])
        return
    if not found:
        click.echo("No hanging transactions.")
        return
    print_table(
        [
            "topic",
            "partition",
            "producer id",
            "epoch",
            "txn start offset",
            "last timestamp",
            "transactional ids",
            "why",
        ],
        [
            [
                h.topic,
                h.partition,
                h.producer_id,
                h.producer_epoch,
                h.current_txn_start_offset,
                _time(h.last_timestamp),
                h.transactional_ids,
                h.reason,
            ]
            for h in found
        ],
    )
    click.echo(
        "Abort one with: logmq txn abort --topic T --partition P --producer-id N --producer-epoch E"
    )
