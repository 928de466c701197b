"""What every ``logmq`` subcommand shares: the connection settings and error handling.

Client errors become one ``Error: ...`` line and exit status 1, never a traceback:
scripts test the exit status, people read the line.
"""

from __future__ import annotations

import dataclasses
import functools
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from logmq.client import Admin
from logmq.client.kafka_probe import ListenerMismatchError
from logmq.client.security import ClientSecurity
from logmq.errors import BootstrapError, LogMQError, UnknownTopicOrPartitionError
from logmq_cli.client_security import ENV_VARS, client_security, parse_property

DEFAULT_BOOTSTRAP = "127.0.0.1:9192"
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(slots=True, frozen=True)
class CliContext:
    """What the group options give every subcommand."""

    bootstrap: str
    request_timeout_ms: int
    properties: tuple[tuple[str, str], ...] = ()  # -X, in the order given
    command_config: str | None = None

    def security(self) -> ClientSecurity | None:
        """TLS and SASL: -X over --command-config over LOGMQ_* (client_security.py)."""
        return client_security(self.properties, self.command_config)


SECURITY_HELP = (
    "TLS and SASL for a secured native listener (docs/security.md): -X key=value "
    "(repeatable) or --command-config FILE with Kafka's client property names, else the "
    "environment: " + ", ".join(ENV_VARS) + ". -X wins over the file, the file over the "
    "environment."
)
X_HELP = (
    "A client security property by its Kafka name (repeatable): security.protocol, "
    "ssl.ca.location, sasl.mechanism, sasl.username, sasl.password, ..."
)
COMMAND_CONFIG_HELP = (
    "A Kafka client properties file, as kafka-*.sh --command-config takes (security.protocol, "
    "sasl.mechanism, sasl.jaas.config, ssl.truststore.location, ...)."
)


def parse_properties(
    _ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]
) -> tuple[tuple[str, str], ...]:
    return tuple(parse_property(v) for v in values)


def _add_properties(ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> None:
    """A subcommand's -X: after (so over) the group's."""
    if values and isinstance(ctx.obj, CliContext):
        extra = tuple(parse_property(v) for v in values)
        ctx.obj = dataclasses.replace(ctx.obj, properties=ctx.obj.properties + extra)


def _override(field: str, convert: Callable[[Any], Any]) -> Callable[..., Any]:
    """A subcommand-level option's callback: given, it replaces the group's value for
    this command only (click hands each subcommand its parent's ``obj``)."""

    def callback(ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
        if value is not None and isinstance(ctx.obj, CliContext):
            ctx.obj = dataclasses.replace(ctx.obj, **{field: convert(value)})
        return value

    return callback


def add_connection_options(command: click.Command) -> None:
    """``--bootstrap/-b``, ``--request-timeout``, ``-X`` and ``--command-config`` on
    ``command`` and every command under it, as rpk and kcat users type them (``logmq
    topic list -b HOST:PORT``).

    The group-level options (before the subcommand) keep their environment variable and
    default; these have neither, so they only count when given, and then win."""
    command.params.extend(
        [
            click.Option(
                ["--bootstrap", "-b"],
                default=None,
                expose_value=False,
                callback=_override("bootstrap", str),
                help="Broker address(es), host:port[,...] (overrides the one given before "
                "the subcommand).",
            ),
            click.Option(
                ["--request-timeout"],
                type=click.FloatRange(min=0.1),
                default=None,
                expose_value=False,
                callback=_override("request_timeout_ms", lambda s: int(s * 1000)),
                help="Seconds to wait for the cluster before giving up on a request.",
            ),
            click.Option(
                ["-X", "properties"],
                multiple=True,
                metavar="KEY=VALUE",
                expose_value=False,
                callback=_add_properties,
                help=X_HELP + " Env: LOGMQ_SECURITY_PROTOCOL, LOGMQ_SASL_USERNAME, ...",
            ),
            click.Option(
                ["--command-config"],
                type=click.Path(exists=True, dir_okay=False),
                default=None,
                expose_value=False,
                callback=_override("command_config", str),
                help=COMMAND_CONFIG_HELP,
            ),
        ]
    )
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            add_connection_options(sub)


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
            if isinstance(e, BootstrapError) and not isinstance(e, ListenerMismatchError):
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
