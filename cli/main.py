"""The ``logmq`` command: topics, consumer groups, transactions, the storage tiers, console
produce/consume and benchmarks.

Every subcommand reaches the cluster through ``--bootstrap`` (or ``LOGMQ_BOOTSTRAP``),
given before the subcommand or after it (``logmq topic list -b HOST:PORT``; there it wins),
with the TLS and SASL settings of ``-X``, ``--command-config`` or the environment.
"""

from __future__ import annotations

import click

from logmq_cli.bench import bench
from logmq_cli.cluster import cluster
from logmq_cli.common import (
    COMMAND_CONFIG_HELP,
    DEFAULT_BOOTSTRAP,
    SECURITY_HELP,
    X_HELP,
    CliContext,
    add_connection_options,
    parse_properties,
)
from logmq_cli.consume import consume
from logmq_cli.dev import dev
from logmq_cli.group import group
from logmq_cli.produce import produce
from logmq_cli.reassign import reassign
from logmq_cli.security import acl, quota, user
from logmq_cli.storage import storage
from logmq_cli.topic import topic
from logmq_cli.txn import txn


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=SECURITY_HELP)
@click.option(
    "--bootstrap",
    "-b",
    envvar="LOGMQ_BOOTSTRAP",
    default=DEFAULT_BOOTSTRAP,
    show_default=True,
    help="Broker address(es), host:port[,host:port...]. Env: LOGMQ_BOOTSTRAP. Also accepted "
    "after the subcommand, where it wins.",
)
@click.option(
    "--request-timeout",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Seconds to wait for the cluster before giving up on a request.",
)
@click.option(
    "-X",
    "properties",
    multiple=True,
    metavar="KEY=VALUE",
    callback=parse_properties,
    help=X_HELP + " Also accepted after the subcommand.",
)
@click.option(
    "--command-config",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help=COMMAND_CONFIG_HELP,
)
@click.version_option(package_name="logmq", prog_name="logmq")
@click.pass_context
def cli(
    ctx: click.Context,
    bootstrap: str,
    request_timeout: float,
    properties: tuple[tuple[str, str], ...],
    command_config: str | None,
) -> None:
    """logmq: manage topics and consumer groups, produce and consume from the console, run
    benchmarks."""
    ctx.obj = CliContext(
        bootstrap=bootstrap,
        request_timeout_ms=int(request_timeout * 1000),
        properties=properties,
        command_config=command_config,
    )


_COMMANDS = (
    topic,
    group,
    produce,
    consume,
    bench,
    cluster,
    reassign,
    acl,
    user,
    quota,
    txn,
    storage,
    dev,
)
for _command in _COMMANDS:
    cli.add_command(_command)
    if _command is not dev:  # dev starts brokers; it connects to none
        add_connection_options(_command)

if __name__ == "__main__":  # pragma: no cover
    cli()
