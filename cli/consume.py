"""``logmq consume TOPIC``: print records as text or JSON lines until a limit is reached.

With ``--group`` it consumes as a member of a consumer group: it reads its share of the
partitions, starts where the group's committed offsets say, and commits what it printed
(automatically while it runs, and exactly up to the last printed record when it exits).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import click

from logmq.client import Admin, Consumer
from logmq_cli.common import CliContext, client_errors, topic_partitions
from logmq_cli.group import parse_datetime
from logmq_cli.output import BYTE_ENCODINGS, format_record

# Longest wait in one poll(): how long a Ctrl-C may take to be noticed.
POLL_SLICE = 0.25


class IdleTimer:
    """Decides when ``--timeout`` of silence has passed; fed the monotonic time."""

    def __init__(self, timeout: float | None, now: float) -> None:
        self.timeout = timeout
        self.last = now

    def arrived(self, now: float) -> None:
        self.last = now

    def remaining(self, now: float) -> float | None:
        """Seconds left before giving up (None: wait forever)."""
        if self.timeout is None:
            return None
        return max(0.0, self.last + self.timeout - now)


class Interrupts:
    """Ctrl-C (SIGINT) as a flag the record loop checks between polls.

    A KeyboardInterrupt could strike after a poll took records and before they were
    printed, and a group member would then commit past them; the flag lets the loop
    print what it took, then leave, close the consumer (committing) and exit 130. A
    second Ctrl-C raises KeyboardInterrupt as usual.
    """

    def __init__(self) -> None:
        self.seen = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: object) -> None:
        if self.seen:
            raise KeyboardInterrupt
        self.seen = True

    def __enter__(self) -> Interrupts:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)


def parse_time(text: str) -> int:
    """``--from-timestamp``: epoch milliseconds as digits, else ISO 8601."""
    if text.isdigit():
        return int(text)
    try:
        return parse_datetime(text)
    except click.BadParameter:
        raise click.BadParameter(
            f"{text!r} is neither milliseconds since the epoch nor an ISO 8601 date-time",
            param_hint="--from-timestamp",
        ) from None


def seek_to_time(consumer: Consumer, tps: list[tuple[str, int]], since_ms: int) -> None:
    """Each partition at its first record at or after ``since_ms`` (ListOffsets by
    time); a partition with none that recent starts at its end."""
    found = consumer.offsets_for_times(dict.fromkeys(tps, since_ms))
    past_end = [tp for tp in tps if found.get(tp) is None]
    for tp in tps:
        hit = found.get(tp)
        if hit is not None:
            consumer.seek(*tp, hit[0])
    if past_end:
        consumer.seek_to_end(*past_end)


def seek_to_last(consumer: Consumer, tps: list[tuple[str, int]], n: int) -> None:
    """Each partition ``n`` offsets before its end, never before its log start (rpk's
    and kcat's ``-o -N``). Offsets, not records: transaction markers take one each."""
    start = consumer.beginning_offsets(tps)
    end = consumer.end_offsets(tps)
    for tp in tps:
        consumer.seek(*tp, max(start[tp], end[tp] - n))


@click.command()
@click.argument("topic")
@click.option("--from-beginning", is_flag=True, help="Start at the log start, not the end.")
@click.option(
    "--partition",
    "-p",
    type=click.IntRange(min=0),
    default=None,
    help="Read only this partition (default: all partitions of TOPIC).",
)
@click.option(
    "--offset",
    type=click.IntRange(min=0),
    default=None,
    help="Start at this offset (in every partition read).",
)
@click.option(
    "--from-timestamp",
    metavar="TIME",
    default=None,
    help="Start at each partition's first record at or after TIME: milliseconds since "
    "the epoch, or ISO 8601 (2024-05-01T12:00:00Z; without a zone, local time).",
)
@click.option(
    "--last",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Start N offsets before the end of each partition (its last N records).",
)
@click.option(
    "--max-records",
    "-n",
    type=click.IntRange(min=1),
    default=None,
    help="Exit after this many records.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    help="Exit when no record arrives for this many seconds.",
)
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@click.option(
    "--bytes",
    "encoding",
    type=click.Choice(BYTE_ENCODINGS),
    default="utf8",
    show_default=True,
    help="How keys and values are turned into text: UTF-8 (undecodable bytes "
    "as \\xNN escapes) or base64.",
)
@click.option(
    "--group",
    "-g",
    "group_id",
    default=None,
    help="Consume as a member of this consumer group, committing what is printed.",
)
@click.option("--print-key", is_flag=True, help="Text format: print KEY<sep>VALUE.")
@click.option(
    "--key-separator",
    default="\t",
    show_default=False,  # click would print the tab itself, or a repr in parentheses
    help="Text printed between key and value with --print-key.  [default: \\t (a tab)]",
)
@click.pass_obj
@client_errors
def consume(
    ctx: CliContext,
    topic: str,
    from_beginning: bool,
    partition: int | None,
    offset: int | None,
    from_timestamp: str | None,
    last: int | None,
    max_records: int | None,
    timeout: float | None,
    fmt: str,
    encoding: str,
    group_id: str | None,
    print_key: bool,
    key_separator: str,
) -> None:
    """Print records of TOPIC, one per line, in offset order within each partition.

    By default it starts at the end of each partition, so it prints only records
    produced from then on; --from-beginning, --offset, --from-timestamp or --last start
    earlier. With --group, where to start is the group's committed offset;
    --from-beginning only applies to partitions the group has not committed yet. Ctrl-C
    stops it (exit status 130).
    """
    starts = {
        "--from-beginning": from_beginning,
        "--offset": offset is not None,
        "--from-timestamp": from_timestamp is not None,
        "--last": last is not None,
    }
    chosen = [name for name, given in starts.items() if given]
    if len(chosen) > 1:
        raise click.UsageError(f"{' and '.join(chosen)} are exclusive: give one start")
    if group_id is not None and (chosen not in ([], ["--from-beginning"]) or partition is not None):
        raise click.UsageError(
            "--group assigns partitions itself and starts at the group's offsets: no "
            "--partition, --offset, --from-timestamp or --last"
        )
    since = parse_time(from_timestamp) if from_timestamp is not None else None
    with Admin(
        ctx.bootstrap, request_timeout_ms=ctx.request_timeout_ms, security=ctx.security()
    ) as admin:
        partitions = topic_partitions(admin, topic, "consume from")
    if partition is not None:
        if partition not in partitions:
            raise click.ClickException(f"topic {topic} has no partition {partition}")
        partitions = [partition]
    out = sys.stdout
    count = 0
    group_options = {}
    if group_id is not None:
        group_options = {
            "group_id": group_id,
            "topics": [topic],
            "auto_offset_reset": "earliest" if from_beginning else "latest",
        }
    interrupts = Interrupts()
    try:
        with Consumer(
            ctx.bootstrap,
            request_timeout_ms=ctx.request_timeout_ms,
            security=ctx.security(),
            fetch_max_wait_ms=200,
            **group_options,
        ) as consumer:
            if group_id is None:
                tps = [(topic, p) for p in partitions]
                consumer.assign(tps)
                if offset is not None:
                    for tp in tps:
                        consumer.seek(*tp, offset)
                elif since is not None:
                    seek_to_time(consumer, tps, since)
                elif last is not None:
                    seek_to_last(consumer, tps, last)
                elif from_beginning:
                    consumer.seek_to_beginning(*tps)
                else:
                    consumer.seek_to_end(*tps)
            idle = IdleTimer(timeout, time.monotonic())
            try:
                with interrupts:
                    while not interrupts.seen and (max_records is None or count < max_records):
                        left = idle.remaining(time.monotonic())
                        if left == 0.0:
                            break
                        wait = POLL_SLICE if left is None else min(POLL_SLICE, left)
                        limit = None if max_records is None else max_records - count
                        records = consumer.poll(timeout=wait, max_records=limit)
                        if not records:
                            continue
                        idle.arrived(time.monotonic())
                        count += len(records)
                        out.write(
                            "\n".join(
                                format_record(
                                    r,
                                    fmt,
                                    encoding=encoding,
                                    print_key=print_key,
                                    key_separator=key_separator,
                                )
                                for r in records
                            )
                            + "\n"
                        )
                        out.flush()
            except BrokenPipeError:
                # The reader went away (``| head``); stop quietly like other Unix tools.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return
    except KeyboardInterrupt:
        # Ctrl-C while connecting, or a second one while closing: the clients cancel
        # and finish what they were doing; nothing is left to report but the count.
        interrupts.seen = True
    click.echo(f"Processed {count} records.", err=True)
    if interrupts.seen:
        sys.exit(130)
