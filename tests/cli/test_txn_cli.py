"""``logmq txn`` against a real (in-process) broker holding a confluent-kafka transaction
open: list, describe, producers, find-hanging and abort, as tables and --json."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from click.testing import CliRunner

from logmq_cli.main import cli
from tests.broker.test_txn_admin import (
    finish,
    open_transaction,
    plain_produce,
    read_committed,
    txn_broker,  # noqa: F401  (the fixture)
)

pytest.importorskip("confluent_kafka")


async def logmq(b: Any, *args: str, code: int = 0) -> str:
    """``logmq ARGS`` in a thread (the broker runs on this test's loop)."""

    def run() -> Any:
        wide = {"COLUMNS": "200"}  # rich tables unwrapped
        return CliRunner().invoke(cli, ["-b", f"127.0.0.1:{b.port}", *args], env=wide)

    result = await asyncio.to_thread(run)
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    return result.output


async def logmq_json(b: Any, *args: str) -> Any:
    return json.loads(await logmq(b, *args, "--json"))


async def test_txn_commands(txn_broker):  # noqa: F811
    b = txn_broker
    kafka = f"127.0.0.1:{b.kafka_port}"
    await logmq(b, "topic", "create", "orders", "--partitions", "2")
    producer = await asyncio.to_thread(open_transaction, kafka, "orders-tx", "orders", [b"a"])
    try:
        (listed,) = await logmq_json(b, "txn", "list")
        assert (listed["transactional_id"], listed["state"]) == ("orders-tx", "Ongoing")
        pid = listed["producer_id"]
        assert await logmq_json(b, "txn", "list", "--state", "CompleteCommit") == []
        assert await logmq_json(b, "txn", "list", "--state", "ongoing", "--producer-id", str(pid))
        assert await logmq_json(b, "txn", "list", "--min-duration-ms", "600000") == []
        table = await logmq(b, "txn", "list")
        assert "orders-tx" in table and "Ongoing" in table

        (d,) = await logmq_json(b, "txn", "describe", "orders-tx")
        assert d["state"] == "Ongoing" and d["partitions"] == [["orders", 0]]
        assert d["producer_id"] == pid and d["timeout_ms"] == 60_000
        text = await logmq(b, "txn", "describe", "orders-tx")
        assert "orders-tx: Ongoing" in text and "partitions: orders-0" in text

        rows = await logmq_json(b, "txn", "producers", "orders")
        assert [
            (r["partition"], r["producer_id"], r["current_txn_start_offset"]) for r in rows
        ] == [(0, pid, 0)]
        epoch = rows[0]["producer_epoch"]
        assert "current txn start offset" in await logmq(b, "txn", "producers", "orders")

        assert await logmq_json(b, "txn", "find-hanging") == []
        assert "No hanging transactions." in await logmq(b, "txn", "find-hanging")
        (old,) = await logmq_json(
            b, "txn", "find-hanging", "--topic", "orders", "--max-age-ms", "0"
        )
        assert (old["partition"], old["producer_id"]) == (0, pid)
        assert "txn abort" in await logmq(b, "txn", "find-hanging", "--max-age-ms", "0")

        await asyncio.to_thread(plain_produce, kafka, "orders", b"after")
        done = await logmq_json(
            b, "txn", "abort", "--topic", "orders", "--partition", "0",
            "--producer-id", str(pid), "--producer-epoch", str(epoch),
        )  # fmt: skip
        assert done["aborted"] is True
        rows = await logmq_json(b, "txn", "producers", "orders", "--partition", "0")
        assert rows[0]["current_txn_start_offset"] == -1
        assert await asyncio.to_thread(read_committed, kafka, "orders", 1, 10) == [b"after"]
    finally:
        await asyncio.to_thread(finish, producer)


async def test_txn_errors_are_clear(txn_broker):  # noqa: F811
    b = txn_broker
    out = await logmq(b, "txn", "describe", "nobody", code=1)
    assert "TRANSACTIONAL_ID_NOT_FOUND" in out and "Traceback" not in out
    out = await logmq(b, "txn", "producers", "missing", code=1)
    assert "UNKNOWN_TOPIC_OR_PARTITION" in out
    out = await logmq(
        b, "txn", "abort", "--topic", "missing", "--partition", "0", "--producer-id", "1",
        "--producer-epoch", "0", code=1,
    )  # fmt: skip
    assert "UNKNOWN_TOPIC_OR_PARTITION" in out


def test_usage_errors_need_no_broker():
    runner = CliRunner()
    bad = runner.invoke(cli, ["txn", "list", "--state", "Sleeping"])
    assert bad.exit_code == 2 and "Sleeping" in bad.output
    missing = runner.invoke(cli, ["txn", "abort", "--topic", "t", "--partition", "0"])
    assert missing.exit_code == 2 and "--producer-id" in missing.output
    none = runner.invoke(cli, ["txn", "describe"])
    assert none.exit_code == 2
