"""What every ``logmq`` subcommand shares: the connection settings and error handling.

Client errors become one ``Error: ...`` line and exit status 1, never a traceback:
scripts test the exit status, people read the line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from logmq.errors import LogMQError

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(slots=True, frozen=True)
class CliContext:
    """What the group options give every subcommand."""

    bootstrap: str
    request_timeout_ms: int


def client_errors(fn: F) -> F:
    """Turn client-side failures into a clean ``Error:`` message and exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except LogMQError as e:
            msg = str(e)
            if e.code.name not in msg:
                msg = f"{e.code.name}: {msg}"
            raise click.ClickException(msg) from None
        except (ValueError, TimeoutError, OSError) as e:
            raise click.ClickException(str(e) or type(e).__name__) from None

    return wrapper  # type: ignore[return-value]
