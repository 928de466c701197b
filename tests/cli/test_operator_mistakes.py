"""Operator mistakes a new user makes (issue 27): connection options after the
subcommand, and the CLI pointed at a broker's Kafka port."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from typing import Any

import click
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from logmq.client.kafka_probe import api_versions_request, is_api_versions_answer
from logmq_cli import topic as topic_cli
from logmq_cli.main import cli

DEADLINE = 120  # seconds; a hung CLI fails the test instead of hanging the suite


@pytest.fixture
def admins(monkeypatch) -> list[tuple[str, int]]:
    """The (bootstrap, request_timeout_ms) of every Admin ``logmq topic`` opens."""
    opened: list[tuple[str, int]] = []

    class RecordingAdmin:
        def __init__(self, bootstrap: str, *, request_timeout_ms: int, security=None) -> None:
            opened.append((bootstrap, request_timeout_ms))

        def __enter__(self) -> RecordingAdmin:
            return self

        def __exit__(self, *exc: Any) -> None:
            pass

        def list_topic_listings(self, internal: bool = False) -> list:
            return []

    monkeypatch.setattr(topic_cli, "Admin", RecordingAdmin)
    return opened


@pytest.mark.parametrize(
    ("args", "env", "want"),
    [
        (["topic", "list", "--bootstrap", "sub:1"], {}, ("sub:1", 30_000)),
        (["topic", "list", "-b", "sub:1", "--request-timeout", "2"], {}, ("sub:1", 2_000)),
        (["-b", "group:1", "topic", "list"], {}, ("group:1", 30_000)),
        (["-b", "group:1", "--request-timeout", "5", "topic", "list"], {}, ("group:1", 5_000)),
        # the subcommand's wins, over the group's option and over the environment
        (["-b", "group:1", "topic", "list", "-b", "sub:1"], {}, ("sub:1", 30_000)),
        (["topic", "list", "-b", "sub:1"], {"LOGMQ_BOOTSTRAP": "env:1"}, ("sub:1", 30_000)),
        (["topic", "list"], {"LOGMQ_BOOTSTRAP": "env:1"}, ("env:1", 30_000)),
        (["topic", "-b", "mid:1", "list"], {}, ("mid:1", 30_000)),
        (["topic", "-b", "mid:1", "list", "-b", "sub:1"], {}, ("sub:1", 30_000)),
    ],
)
def test_connection_options_before_or_after_the_subcommand(admins, args, env, want):
    result = CliRunner().invoke(cli, args, env={"LOGMQ_BOOTSTRAP": None, **env})
    assert result.exit_code == 0, result.output
    assert admins == [want]


def test_every_command_that_connects_takes_the_connection_options():
    def leaves(cmd: click.Command, path: tuple[str, ...]):
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                yield from leaves(sub, (*path, name))
        else:
            yield path, cmd

    for path, cmd in leaves(cli, ()):
        names = [o for p in cmd.params for o in getattr(p, "opts", ())]
        opts = set(names)
        assert len(opts) == len(names), f"{path}: an option named twice (-b is taken)"
        if path[0] == "dev":  # starts brokers, connects to none
            assert "--bootstrap" not in opts, path
        else:
            assert {"--bootstrap", "-b", "--request-timeout"} <= opts, path


def test_a_bad_request_timeout_after_the_subcommand_is_a_usage_error(admins):
    result = CliRunner().invoke(cli, ["topic", "list", "--request-timeout", "0"])
    assert result.exit_code == 2 and "--request-timeout" in result.output
    assert admins == []


def test_the_probe_is_an_api_versions_v0_request():
    frame = api_versions_request()
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    assert struct.unpack_from(">hh", frame, 4) == (18, 0)  # ApiVersions, v0


def test_the_probe_accepts_only_an_exact_api_versions_answer():
    (corr,) = struct.unpack_from(">i", api_versions_request(), 8)
    answer = struct.pack(">ihi", corr, 0, 2) + struct.pack(">hhhhhh", 0, 3, 9, 18, 0, 3)
    assert is_api_versions_answer(answer)
    assert not is_api_versions_answer(answer[:-1])  # array short of its count
    assert not is_api_versions_answer(answer + b"\0")
    assert not is_api_versions_answer(struct.pack(">i", corr + 1) + answer[4:])


@given(st.binary(max_size=64))
def test_the_probe_rejects_random_bytes(data):
    (corr,) = struct.unpack_from(">i", api_versions_request(), 8)
    # the echoed correlation id and an array ending exactly at the end: never by chance
    assert not is_api_versions_answer(struct.pack(">i", corr ^ 1) + data)


def logmq(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LOGMQ_BOOTSTRAP"}
    return subprocess.run(
        [sys.executable, "-m", "logmq_cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=DEADLINE,
    )


async def test_a_peer_that_resets_the_connection_does_not_hang_the_probe():
    """A port that accepts, then resets (a cut link, a dying broker): the client, which
    probes an address that failed its handshake, used to wait for ever on the probe's
    ``wait_closed`` (the fault suite's cut-link test hung on it under uvloop)."""
    import asyncio
    import socket

    from logmq.client.kafka_probe import PROBE_TIMEOUT, diagnose, speaks_kafka, speaks_tls

    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    server = await asyncio.start_server(reset, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, asyncio.timeout(4 * PROBE_TIMEOUT):
        assert await speaks_tls("127.0.0.1", port) is False
        assert await speaks_kafka("127.0.0.1", port) is False
        assert await diagnose("127.0.0.1", port, "PLAINTEXT") is None


def test_connection_options_after_the_subcommand_e2e(broker):
    created = logmq("topic", "create", "after", "--bootstrap", broker.bootstrap)
    assert created.returncode == 0, created.stderr
    listed = logmq("topic", "list", "--json", "-b", broker.bootstrap, "--request-timeout", "20")
    assert listed.returncode == 0, listed.stderr
    assert "after" in [t["topic"] for t in json.loads(listed.stdout)]


def test_the_cli_pointed_at_the_kafka_port_says_so_e2e(broker):
    proc = logmq("topic", "list", "-b", broker.kafka_bootstrap)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"Error: NETWORK_EXCEPTION: {broker.kafka_bootstrap} is a Kafka listener; logmq's native "
        "port (for logmq clients and the logmq CLI) is the broker's --port, default 9192: try "
        "127.0.0.1:9192. Kafka clients (kcat, confluent-kafka, ...) use the Kafka port."
    ], proc.stderr
    assert "msgpack" not in proc.stderr
    # the native port next to it answers
    assert logmq("topic", "list", "-b", broker.bootstrap).returncode == 0
