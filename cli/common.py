"""What every ``logmq`` subcommand shares: the connection settings and error handling.

Client errors become one ``Error: ...`` line and exit status 1, never a traceback:
scripts test the exit status, people read the line.
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from logmq.client import Admin
from logmq.errors import BootstrapError, LogMQError, UnknownTopicOrPartitionError

DEFAULT_BOOTSTRAP = "127.0.0.1:9192"
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(slots=True, frozen=True)
class CliContext:
    """What the group options give every subcommand."""

    bootstrap: str
    request_timeout_ms: int


def error_text(e: LogMQError) -> str:
    """The error's message, led by its code name unless the message names it already."""
    msg = str(e)
    return msg if e.code.name in msg else f"{e.code.name}: {msg}"


def client_errors(fn: F) -> F:
    """Turn client-side failures into a clean ``Error:`` message and exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except LogMQError as e:
            msg = error_text(e)
            if isinstance(e, BootstrapError):
                msg += ". Is a broker running there? (--bootstrap or LOGMQ_BOOTSTRAP name it)"
            raise click.ClickException(msg) from None
        except (ValueError, TimeoutError, OSError) as e:
            raise click.ClickException(str(e) or type(e).__name__) from None

    return wrapper  # type: ignore[return-value]


def topic_partitions(admin: Admin, topic: str, action: str) -> list[int]:
    """TOPIC's partition numbers; a missing topic is an error naming what the user
    tried (``action``: "produce to", "consume from"), not the describe call under it."""
    try:
        desc = admin.describe_topics([topic])[topic]
    except UnknownTopicOrPartitionError:
        # Whether the broker auto-creates topics is not visible to a client, and these
        # commands never ask it to: say what is true either way.
        raise click.ClickException(
            f"cannot {action} topic {topic!r}: it does not exist (UNKNOWN_TOPIC_OR_PARTITION)."
            f" Create it with `logmq topic create {shlex.quote(topic)}`: logmq produce and"
            " consume never create topics, whatever the broker's auto-create setting."
        ) from None
    except LogMQError as e:
        raise click.ClickException(f"cannot {action} topic {topic!r}: {error_text(e)}") from None
    return sorted(p.partition for p in desc.partitions)
