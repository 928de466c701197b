"""``logmq storage remote status``: the remote tier of every tiered partition, as the
brokers see it (DescribeRemoteTier, native API 1001; docs/tiered-storage.md).

Each broker answers about the copies it holds, so the command asks every broker the
metadata lists and merges: a partition's row is its leader's (the leader copies, so its
copy lag is the one that matters), or a follower's while no leader answered. A broker
that cannot be reached or refuses is listed with its error and the others still count;
only when no broker answers is it a failure. ``remote_status`` is shared with ``logmq
topic describe``, which asks the leaders of one topic's partitions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import click

from logmq.client.cluster import ClusterClient
from logmq.errors import ErrorCode, LogMQError
from logmq.net.codec import ApiKey
from logmq_cli.common import CliContext, client_errors, error_text
from logmq_cli.output import emit_json, print_table

TopicPartition = tuple[str, int]

COLUMNS = [
    "topic",
    "partition",
    "tiered",
    "log start",
    "local log start",
    "local bytes",
    "remote segments",
    "remote bytes",
    "copy lag segments",
    "copy lag bytes",
    "pending deletes",
    "corrupt",
    "last error",
]
ROW_KEYS = [
    "topic",
    "partition",
    "tiered",
    "log_start_offset",
    "local_log_start_offset",
    "local_bytes",
    "remote_segments",
    "remote_bytes",
    "copy_lag_segments",
    "copy_lag_bytes",
    "pending_deletes",
    "corrupt_segments",
    "last_error",
]


@dataclass(slots=True)
class TierReport:
    """What the brokers answered: per broker whether it tiers (or its error), and one
    merged row per partition, naming the broker it came from."""

    brokers: list[dict[str, Any]] = field(default_factory=list)
    partitions: dict[TopicPartition, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "brokers": self.brokers,
            "partitions": [self.partitions[k] for k in sorted(self.partitions)],
        }


def merge(answers: Iterable[tuple[int, dict[str, Any] | Exception]]) -> TierReport:
    """Brokers' DescribeRemoteTier answers (or the error each gave) as one report."""
    report = TierReport()
    for node_id, answer in sorted(answers, key=lambda a: a[0]):
        if isinstance(answer, Exception):
            msg = error_text(answer) if isinstance(answer, LogMQError) else str(answer)
            report.brokers.append({"broker_id": node_id, "tiering": None, "error": msg})
            continue
        rows = _rows(answer)
        if rows is None:  # a broker's answer is untrusted input like any other
            report.brokers.append(
                {"broker_id": node_id, "tiering": None, "error": "a malformed answer"}
            )
            continue
        report.brokers.append(
            {"broker_id": node_id, "tiering": bool(answer.get("tiering")), "error": None}
        )
        for row in rows:
            key = (row["topic"], row["partition"])
            known = report.partitions.get(key)
            if known is None or (row.get("leader") and not known.get("leader")):
                report.partitions[key] = {**row, "broker_id": node_id}
    return report


def _rows(answer: Any) -> list[dict[str, Any]] | None:
    """An answer's partition rows, each with a str topic and an int partition (None:
    the answer is not DescribeRemoteTier's shape)."""
    if not isinstance(answer, dict):
        return None
    rows = answer.get("partitions") or []
    if not isinstance(rows, list):
        return None
    for row in rows:
        if not (
            isinstance(row, dict)
            and isinstance(row.get("topic"), str)
            and type(row.get("partition")) is int
        ):
            return None
    return rows


async def remote_status(
    ctx: CliContext,
    *,
    nodes: Iterable[int] | None = None,
    body: dict[str, Any] | None = None,
) -> TierReport:
    """DescribeRemoteTier of ``nodes`` (every broker the metadata lists when None)."""
    client = ClusterClient(
        ctx.bootstrap,
        client_id="logmq-cli",
        request_timeout_ms=ctx.request_timeout_ms,
        security=ctx.security(),
    )
    try:
        meta = await client.refresh_metadata()
        ids = sorted(meta.brokers) if nodes is None else sorted(set(nodes))

        async def ask(node_id: int) -> tuple[int, dict[str, Any] | Exception]:
            try:
                resp = await client.request_node(
                    node_id, ApiKey.DESCRIBE_REMOTE_TIER, dict(body or {})
                )
                return node_id, dict(resp.body)
            except (LogMQError, OSError, TimeoutError) as e:
                return node_id, e

        answers = await asyncio.gather(*(ask(n) for n in ids))
    finally:
        await client.close()
    return merge(answers)


@click.group()
def storage() -> None:
    """The storage tiers: the remote tier's status (docs/tiered-storage.md)."""


@storage.group()
def remote() -> None:
    """The remote tier (tiered storage): what is copied, what waits, what failed."""


@remote.command("status")
@click.option(
    "--topic", "topics", multiple=True, metavar="NAME", help="Only this topic (repeatable)."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_obj
@client_errors
def status(ctx: CliContext, topics: tuple[str, ...], as_json: bool) -> None:
    """Every tiered partition: log starts over both tiers and locally, local and remote
    bytes, the copy lag, pending deletes and the last error, from every broker."""
    report = asyncio.run(remote_status(ctx, body={"topics": list(topics) if topics else None}))
    answered = [b for b in report.brokers if b["error"] is None]
    if not answered:
        reasons = "; ".join(f"broker {b['broker_id']}: {b['error']}" for b in report.brokers)
        raise LogMQError(
            f"no broker answered DescribeRemoteTier ({reasons or 'no brokers'})",
            ErrorCode.BROKER_NOT_AVAILABLE,
        )
    if as_json:
        emit_json(report.to_json())
        return
    for b in report.brokers:
        if b["error"] is not None:
            click.echo(f"broker {b['broker_id']} did not answer: {b['error']}", err=True)
    if not any(b["tiering"] for b in answered):
        click.echo(
            "No broker tiers: remote.log.storage.system.enable is false on every broker "
            "that answered (docs/tiered-storage.md).",
            err=True,
        )
        return
    rows = [[report.partitions[k].get(c) for c in ROW_KEYS] for k in sorted(report.partitions)]
    if not rows:
        click.echo("No tiered partitions (topics with remote.storage.enable=true).", err=True)
        return
    print_table(COLUMNS, rows, title="Remote tier")
