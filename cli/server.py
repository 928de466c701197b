"""``logmq-server``: run one broker on uvloop until SIGTERM/SIGINT.

Options come from flags, then ``LOGMQ_<OPTION>`` environment variables, then a TOML file
given with ``--config``, then defaults (docs/configuration.md). When the broker listens
it prints one line ``logmq-server ready HOST:PORT kafka HOST:PORT listeners
NAME=HOST:PORT,...`` on stdout (the Kafka parts only with a Kafka listener: the first one,
then all of them by name), which scripts, the test harness and ``logmq.testing`` wait for
instead of polling the port.
"""

from __future__ import annotations

import sys
from pathlib import Path

if (__name__ == "__main__" or Path(sys.argv[0]).name == "logmq-server") and (
    "kio" not in sys.modules
):
    # kio (the Kafka message types) imports hypothesis whenever it is installed, only to
    # register test strategies for its types (kio/static/_phantom.py): about 0.2 s of a
    # broker's start, which a test broker (logmq.testing) pays on every start, for nothing
    # the server uses. A None entry makes that import fail at once, as if hypothesis were
    # not installed. Only in the server's own process: a test process that imports this
    # module keeps its hypothesis.
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]

import asyncio
import gc
import logging
import os
import signal
import tomllib
from typing import Any

import click
import uvloop

from logmq.broker.config import BrokerConfig
from logmq.cluster.meta_properties import ClusterIdentityError
from logmq.errors import LogMQError
from logmq.net.bind_check import ListenerUnavailableError
from logmq.server import Broker
from logmq.storage.dir_lock import DataDirLockedError

READY_PREFIX = "logmq-server ready"


def _load_toml(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """Eager --config callback: the file's values become the defaults of every option."""
    if value is None:
        return None
    try:
        with open(value, "rb") as f:
            doc = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise click.BadParameter(f"cannot read {value}: {e}") from None
    section = doc.get("server", doc)
    defaults: dict[str, Any] = {}
    properties: list[str] = []
    for key, val in section.items():
        if key in ("topic_defaults", "topic-defaults") and isinstance(val, dict):
            defaults["topic_config"] = [f"{k}={v}" for k, v in val.items()]
        elif isinstance(val, dict) or "." in key or key in KAFKA_BARE_PROPERTIES:
            # Kafka's property names: ssl.keystore.location = "..." is a nested table
            # in TOML, "listeners" a plain key; both end up as KEY=VALUE overrides
            properties += [f"{k}={v}" for k, v in _flatten(key, val)]
        else:
            defaults[key.replace("-", "_")] = val
    if properties:
        defaults["override"] = properties
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


# Kafka broker properties without a dot, read as properties in the TOML file
KAFKA_BARE_PROPERTIES = frozenset({"listeners"})


def _flatten(prefix: str, value: Any) -> list[tuple[str, str]]:
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            out += _flatten(f"{prefix}.{k}", v)
        return out
    if isinstance(value, bool):
        return [(prefix, "true" if value else "false")]
    if isinstance(value, list):
        return [(prefix, ",".join(str(v) for v in value))]
    return [(prefix, str(value))]


def _parse_overrides(items: tuple[str, ...]) -> dict[str, str]:
    """--override KEY=VALUE (Kafka's property names), the last one of a key winning."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--override")
        out[key.strip()] = value.strip()
    return out


def _parse_topic_configs(items: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise click.BadParameter(
                f"expected key=value, got {item!r}", param_hint="--topic-config"
            )
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


async def serve(config: BrokerConfig, *, stop_on_stdin_close: bool = False) -> None:
    broker = Broker(config)
    # A start allocates the objects of every log and partition at once, and nearly all
    # of them live until shutdown: the collector would rescan that growing heap again
    # and again (0.3 s of a 10,000-partition restart) to find next to no garbage.
    gc.disable()
    try:
        await broker.start()
    finally:
        gc.enable()
    # Everything allocated so far (modules, classes, loaded logs) lives until shutdown:
    # frozen, it is never rescanned, so full collections stay short (latency p99).
    # No collection first: a start leaves about a hundred cyclic garbage objects (a few
    # KB, then frozen for good), and finding them scans the whole heap: 0.1 s of a
    # 10,000-partition start, before the broker could answer anyone.
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stdin_fd = sys.stdin.fileno() if stop_on_stdin_close else None
    if stdin_fd is not None:
        loop.add_reader(stdin_fd, _on_stdin, stdin_fd, stop)
    ready = f"{READY_PREFIX} {config.host}:{broker.port}"
    if broker.kafka_port is not None:
        ready += f" kafka {config.kafka_host or config.host}:{broker.kafka_port}"
        # every Kafka listener (the one above is only the first), for a parent that
        # asked for secured listeners on port 0 (logmq.testing)
        ports = broker.kafka_ports()
        hosts = {lst.name: lst.host for lst in broker.security.kafka}
        ready += " listeners " + ",".join(
            f"{name}={hosts.get(name) or config.kafka_host or config.host}:{port}"
            for name, port in ports.items()
        )
    print(ready, flush=True)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if stdin_fd is not None:
            loop.remove_reader(stdin_fd)
        await broker.stop()


def _on_stdin(fd: int, stop: asyncio.Event) -> None:
    """End of stdin = the parent is gone (its end of the pipe closed, even on kill -9)."""
    try:
        data = os.read(fd, 4096)
    except OSError:
        data = b""
    if not data:
        asyncio.get_running_loop().remove_reader(fd)
        stop.set()


@click.command(
    context_settings={
        "auto_envvar_prefix": "LOGMQ",
        "show_default": True,
        "help_option_names": ["-h", "--help"],
    }
)
# not from the environment: LOGMQ_VERSION=... (an image's own label, say) must not turn
# every start into a version print
@click.version_option(package_name="logmq", prog_name="logmq-server", allow_from_autoenv=False)
@click.option(
    "--config",
    type=click.Path(dir_okay=False),
    callback=_load_toml,
    is_eager=True,
    expose_value=False,
    help="TOML file with option values (a [server] table or top level).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("./logmq-data"),
    help="Where logs and metadata live.",
)
@click.option("--host", default="127.0.0.1", help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=9192,
    show_default=True,
    help="The native protocol's port (logmq clients and CLI); 0 = any free port.",
)
@click.option(
    "--kafka-port",
    type=click.IntRange(0, 65535),
    default=9092,
    show_default=True,
    envvar="LOGMQ_KAFKA_PORT",
    help="The Kafka protocol's port; 0 = any free port.",
)
@click.option("--no-kafka", is_flag=True, help="Serve no Kafka listener.")
@click.option("--kafka-host", default=None, help="Address of the Kafka listener (default: --host).")
@click.option(
    "--advertised-kafka-host", default=None, help="Host given to Kafka clients (default: its host)."
)
@click.option(
    "--advertised-kafka-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Port given to Kafka clients (default: the Kafka listener's).",
)
@click.option("--node-id", type=click.IntRange(0), default=1, help="This broker's id.")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus metrics on this port; 0 = any free port; unset = off.",
)
@click.option("--metrics-host", default="127.0.0.1")
@click.option("--advertised-host", default=None, help="Host given to clients (default: --host).")
@click.option("--max-connections", type=click.IntRange(1), default=1000)
@click.option("--idle-timeout-ms", type=click.IntRange(1), default=600_000)
@click.option(
    "--max-in-flight",
    type=click.IntRange(1),
    default=64,
    help="Queued requests per connection before the broker stops reading it.",
)
@click.option("--max-frame-size", type=click.IntRange(1024, 0xFFFFFFFF), default=100 * 1024 * 1024)
@click.option("--socket-buffer-bytes", type=click.IntRange(0), default=4 * 1024 * 1024)
@click.option("--auto-create-topics/--no-auto-create-topics", default=False)
@click.option("--default-partitions", type=click.IntRange(1), default=1)
@click.option("--zero-copy/--no-zero-copy", default=True, help="os.sendfile for fetches.")
@click.option("--max-fetch-wait-ms", type=click.IntRange(0), default=30_000)
@click.option("--shutdown-grace-ms", type=click.IntRange(0), default=10_000)
@click.option(
    "--offsets-topic-partitions",
    type=click.IntRange(1, 10_000),
    default=50,
    help="Partitions of __consumer_offsets when the broker creates it.",
)
@click.option(
    "--transaction-state-partitions",
    type=click.IntRange(1, 10_000),
    default=50,
    help="Partitions of __transaction_state when the broker creates it.",
)
@click.option(
    "--transaction-max-timeout-ms",
    type=click.IntRange(1),
    default=900_000,
    help="The longest transaction.timeout.ms a producer may ask for.",
)
@click.option(
    "--transactional-id-expiration-ms",
    type=click.IntRange(1),
    default=604_800_000,
    help="A transactional id idle this long is forgotten.",
)
@click.option("--group-session-timeout-ms", type=click.IntRange(1), default=45_000)
@click.option("--group-min-session-timeout-ms", type=click.IntRange(1), default=6_000)
@click.option("--group-max-session-timeout-ms", type=click.IntRange(1), default=300_000)
@click.option("--group-heartbeat-interval-ms", type=click.IntRange(1), default=5_000)
@click.option("--group-rebalance-timeout-ms", type=click.IntRange(1), default=300_000)
@click.option(
    "--group-initial-rebalance-delay-ms",
    type=click.IntRange(0),
    default=3_000,
    help="How long the first rebalance of an empty classic group waits for more members.",
)
@click.option("--offset-metadata-max-bytes", type=click.IntRange(0), default=4096)
@click.option("--offset-commit-max-bytes", type=click.IntRange(4096), default=1 << 20)
@click.option(
    "--offsets-commit-timeout-ms",
    type=click.IntRange(1),
    default=5_000,
    help="A group write (offset commit, join, ...) fails with a retriable error if it is "
    "not replicated to the ISR of its __consumer_offsets partition within this time.",
)
@click.option(
    "--quorum-voters",
    default=None,
    metavar="ID@HOST:PORT,...",
    help="The metadata quorum: each voter's node id and Raft listener address "
    "(one port per voter, apart from --port). Unset: a quorum of this node alone.",
)
@click.option(
    "--default-replication-factor",
    type=click.IntRange(1),
    default=1,
    help="Replication factor of topics created without one.",
)
@click.option(
    "--broker-session-timeout-ms",
    type=click.IntRange(1),
    default=2_000,
    help="The controller fences a broker that has not heartbeaten for this long.",
)
@click.option("--broker-heartbeat-interval-ms", type=click.IntRange(1), default=250)
@click.option(
    "--peer-addresses",
    default=None,
    metavar="ID@HOST:PORT,...",
    help="Where this broker dials a peer's client port (replica fetching, the controller), "
    "e.g. through a proxy or another interface. Unlisted peers: their advertised address.",
)
@click.option(
    "--replica-lag-time-max-ms",
    type=click.IntRange(1),
    default=30_000,
    help="A follower not caught up for this long leaves the ISR.",
)
@click.option(
    "--min-free-bytes",
    type=click.IntRange(0),
    default=None,
    help="Refuse produce (disk full error) when the data dir's file system has less free "
    "space than this, keeping room for offset commits, checkpoints and the metadata log. "
    "[default: the smaller of 1 GiB and 5% of the disk]",
)
@click.option(
    "--stop-on-stdin-close",
    is_flag=True,
    help="Stop (as on SIGTERM) when stdin reaches its end: a parent that holds the other end "
    "of a pipe takes the broker down with it, even when it is killed (logmq.testing).",
)
@click.option(
    "--topic-config",
    multiple=True,
    metavar="KEY=VALUE",
    help="Broker-wide default for a topic config (repeatable).",
)
@click.option(
    "--add-scram",
    "bootstrap_scram",
    multiple=True,
    metavar="SPEC",
    help="A SCRAM user written with the cluster id on the cluster's first start, as "
    "kafka-storage format --add-scram: 'SCRAM-SHA-512=[name=admin,password=...]' "
    "(repeatable). On a cluster that exists, created if the user does not exist yet; "
    "an existing user is kept as it is.",
)
@click.option(
    "--override",
    multiple=True,
    metavar="KEY=VALUE",
    help="A Kafka broker property by its Kafka name, as kafka-server-start.sh --override "
    "(repeatable): listeners, listener.security.protocol.map, ssl.*, sasl.*, super.users, "
    "authorizer.class.name... (docs/security.md). The native listener (--port) takes the "
    "protocol and settings of the first secured Kafka listener unless "
    "listener.security.protocol.map names it (NATIVE:SASL_SSL).",
)
def main(
    log_level: str,
    max_in_flight: int,
    topic_config: tuple[str, ...],
    override: tuple[str, ...],
    no_kafka: bool,
    stop_on_stdin_close: bool,
    **opts: Any,
) -> None:
    """Run a logmq broker."""
    if no_kafka:
        opts["kafka_port"] = None
    logging.basicConfig(
        level=log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = BrokerConfig(
            max_in_flight_per_connection=max_in_flight,
            topic_defaults=_parse_topic_configs(topic_config),
            properties=_parse_overrides(override),
            **opts,
        )
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    try:
        uvloop.run(serve(config, stop_on_stdin_close=stop_on_stdin_close))
    except (ClusterIdentityError, DataDirLockedError) as e:
        click.echo(f"logmq-server: refusing to start: {e}", err=True)
        sys.exit(2)
    except ListenerUnavailableError as e:
        click.echo(f"logmq-server: cannot start: {e}", err=True)
        sys.exit(1)
    except LogMQError as e:
        click.echo(f"logmq-server: {e}", err=True)
        sys.exit(2)
    except OSError as e:
        click.echo(f"logmq-server: cannot start: {e}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
