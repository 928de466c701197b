"""``logmq produce TOPIC``: one record per stdin line, exit 0 only when all are acknowledged."""

from __future__ import annotations

import collections
import concurrent.futures
import sys
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import click

from logmq.client import Admin, Producer
from logmq.storage.compression import Compression
from logmq_cli.common import CliContext, client_errors, topic_partitions

ACKS_CHOICES = ("0", "1", "all", "-1")


class MissingKeyError(ValueError):
    """A line lacks the key separator although --key-separator was given."""


def parse_lines(
    lines: Iterable[bytes], key_separator: bytes | None
) -> Iterator[tuple[bytes | None, bytes]]:
    """``(key, value)`` per input line; the line ending (``\\n`` or ``\\r\\n``) is dropped."""
    for number, line in enumerate(lines, 1):
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        if key_separator is None:
            yield None, line
            continue
        key, sep, value = line.partition(key_separator)
        if not sep:
            raise MissingKeyError(f"line {number} has no key separator {key_separator!r}")
        yield key, value


def parse_headers(items: Iterable[str]) -> list[tuple[str, bytes]]:
    """``--header name=value`` (repeatable, kept in order; a name may repeat, as Kafka
    headers may): split at the first ``=``, the value taken as UTF-8 bytes."""
    headers = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"expected NAME=VALUE, got {item!r}", param_hint="--header")
        headers.append((name, value.encode()))
    return headers


def acks_value(acks: str) -> int | str:
    return "all" if acks in ("all", "-1") else int(acks)


class AckTracker:
    """Counts acknowledged and failed sends without holding every future forever."""

    def __init__(self) -> None:
        self.pending: collections.deque[concurrent.futures.Future] = collections.deque()
        self.acked = 0
        self.failed = 0
        self.first_error: BaseException | None = None

    def add(self, fut: concurrent.futures.Future) -> None:
        self.pending.append(fut)
        if len(self.pending) > 4096:
            self.reap(block=False)

    def reap(self, block: bool) -> None:
        pending = self.pending
        while pending and (block or pending[0].done()):
            err = pending.popleft().exception()
            if err is None:
                self.acked += 1
            else:
                self.failed += 1
                if self.first_error is None:
                    self.first_error = err


@click.command()
@click.argument("topic")
@click.option(
    "--key-separator",
    metavar="SEP",
    default=None,
    help="Split each line at the first SEP into key and value.",
)
@click.option("--acks", type=click.Choice(ACKS_CHOICES), default="1", show_default=True)
@click.option(
    "--partition",
    "-p",
    type=click.IntRange(min=0),
    default=None,
    help="Send every record to this partition (default: by key, else spread).",
)
@click.option("--linger-ms", type=click.FloatRange(min=0), default=5, show_default=True)
@click.option(
    "--compression",
    type=click.Choice(list(Compression.NAMES)),
    default="none",
    show_default=True,
    help="Batch compression codec (Kafka's).",
)
@click.option(
    "--header",
    "-H",
    "header_items",
    multiple=True,
    metavar="NAME=VALUE",
    help="A header on every record (repeatable; NAME= gives an empty value).",
)
@click.option(
    "--tombstone",
    "-Z",
    is_flag=True,
    help="Send an empty value as null (a tombstone: compaction deletes the key), as "
    "kcat -Z and rpk --tombstone do; with --key-separator, 'KEY<SEP>' deletes KEY.",
)
@click.pass_obj
@client_errors
def produce(
    ctx: CliContext,
    topic: str,
    key_separator: str | None,
    acks: str,
    partition: int | None,
    linger_ms: float,
    compression: str,
    header_items: tuple[str, ...],
    tombstone: bool,
) -> None:
    """Send each line of stdin to TOPIC as one record.

    Exits 0 once every record is acknowledged; otherwise prints what failed and exits 1.
    """
    if key_separator == "":
        raise click.BadParameter("must not be empty", param_hint="--key-separator")
    sep = key_separator.encode() if key_separator is not None else None
    headers = parse_headers(header_items) or None
    stdin: BinaryIO = click.get_binary_stream("stdin")
    tracker = AckTracker()
    sent = 0
    input_error: Exception | None = None
    with Admin(
        ctx.bootstrap, request_timeout_ms=ctx.request_timeout_ms, security=ctx.security()
    ) as admin:
        partitions = len(topic_partitions(admin, topic, "produce to"))  # fails fast if missing
    if partition is not None and partition >= partitions:
        raise click.ClickException(f"topic {topic} has no partition {partition}")
    with Producer(
        ctx.bootstrap,
        security=ctx.security(),
        acks=acks_value(acks),
        linger_ms=linger_ms,
        compression=compression,
        request_timeout_ms=ctx.request_timeout_ms,
        max_block_ms=ctx.request_timeout_ms,
        delivery_timeout_ms=max(ctx.request_timeout_ms, 120000),
    ) as producer:
        try:
            for key, value in parse_lines(stdin, sep):
                fut = producer.send(
                    topic,
                    None if tombstone and not value else value,
                    key=key,
                    partition=partition,
                    headers=headers,
                )
                tracker.add(fut)
                sent += 1
        except (MissingKeyError, KeyboardInterrupt) as e:
            input_error = e  # still flush and account for what was already sent
        producer.flush()
        tracker.reap(block=True)
    if tracker.failed:
        raise click.ClickException(
            f"{tracker.failed} of {sent} records to {topic} failed: {tracker.first_error}"
        )
    if isinstance(input_error, MissingKeyError):
        raise click.ClickException(f"{input_error}; the {sent} records before it were sent")
    if isinstance(input_error, KeyboardInterrupt):
        click.echo(f"Interrupted; {tracker.acked} records acknowledged.", err=True)
        sys.exit(130)
    click.echo(f"Produced {tracker.acked} records to {topic}.", err=True)
