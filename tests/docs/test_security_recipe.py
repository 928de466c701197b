"""docs/security.md's "From nothing to a secured broker", run as written (and the
blocks of later sections that say they run with its broker).

The blocks are read from the page itself (tests/docs/markdown_blocks.py), so the page and
this test cannot drift: each ``python`` and ``sh`` block of the section runs in order, in
one temp dir, against a real ``logmq-server``; the block that starts the broker (its
command is ``logmq-server``) runs in the background until its ready line. The only
change made to the text: the page's example ports (9092, 9093, 9192, as whole numbers)
become free ones. The output samples (blocks without an info string) are checked against
what the broker logs and what an anonymous ``logmq`` prints.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.docs.markdown_blocks import Block, fenced_blocks
from tests.harness import free_port

pytest.importorskip("confluent_kafka")
pytest.importorskip("cryptography")

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
SECTION = "From nothing to a secured broker"
# sections whose blocks say they run "with the recipe's broker running": after it
AFTER = ("logmq's own clients and the CLI",)
EXAMPLE_PORTS = ("9092", "9093", "9192")
BLOCK_TIMEOUT = 120  # seconds for one block
READY_TIMEOUT = 60


def recipe() -> list[Block]:
    blocks = [b for b in fenced_blocks(DOC) if b.section == SECTION]
    assert blocks, f"no section {SECTION!r} in {DOC}"
    return blocks


def with_ports(text: str, ports: dict[str, int]) -> str:
    """The page's example ports, as whole numbers only, replaced by free ones."""
    pattern = r"(?<![0-9])(" + "|".join(ports) + r")(?![0-9])"
    return re.sub(pattern, lambda m: str(ports[m.group(1)]), text)


def is_broker(block: Block) -> bool:
    return block.info == "sh" and block.text.lstrip().startswith("logmq-server")


def start_broker(text: str, cwd: Path, env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    """The broker block in the background (``exec``: its process is the broker's), once
    it prints its ready line; its log is the file returned."""
    log = cwd / "broker.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            ["bash", "-c", "exec " + text],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
        )
    deadline = time.monotonic() + READY_TIMEOUT
    seen = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        while b"logmq-server ready" not in seen:
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                stop(proc)
                raise AssertionError(f"the broker of the recipe did not start:\n{log.read_text()}")
            if sel.select(left):
                chunk = os.read(proc.stdout.fileno(), 4096)  # type: ignore[union-attr]
                seen += chunk
    return proc, log


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def run(block: Block, text: str, cwd: Path, env: dict[str, str]) -> str:
    command = [sys.executable, "-c", text] if block.info == "python" else ["bash", "-e", "-c", text]
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT
    )
    assert done.returncode == 0, (
        f"docs/security.md line {block.line} ({block.info}) exited {done.returncode}:\n"
        f"{text}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    )
    return done.stdout


def test_the_security_recipe_runs_as_written(tmp_path):
    ports = {p: free_port() for p in EXAMPLE_PORTS}
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOGMQ_")}
    # the commands of this environment (logmq, logmq-server) first on the PATH
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    blocks = recipe()
    commands = [b for b in blocks if b.info in ("sh", "python")]
    samples = [with_ports(b.text, ports).strip() for b in blocks if b.info == ""]
    assert sum(map(is_broker, commands)) == 1, "the recipe starts exactly one broker"
    outputs: list[str] = []
    broker = None
    try:
        for block in commands:
            text = with_ports(block.text, ports)
            if is_broker(block):
                broker, log = start_broker(text, tmp_path, env)
            else:
                outputs.append(run(block, text, tmp_path, env))
        certs, admin, admin_cli, alice_kafka, alice_native = outputs
        later = [
            run(b, with_ports(b.text, ports), tmp_path, env)
            for b in fenced_blocks(DOC)
            if b.section in AFTER and b.info in ("sh", "python")
        ]
        assert later and "orders" in later[0]  # the native Producer's RecordMetadata

        # what each step says it does
        assert certs.split() == ["pki/broker.keystore.pem", "pki/logmq-test-ca.crt"]
        assert "alice may write and read orders" in admin
        assert "orders" in admin_cli and "User:alice" in admin_cli  # describe; acl list
        assert alice_kafka.strip() == "b'order 1'"
        assert sorted(alice_native.split("\n")[:2]) == ["order 1", "order 2"]

        # the samples: the broker's line about its native listener, and what an
        # anonymous logmq is told on the native port
        native_line, refusal = samples
        assert native_line.removeprefix("INFO ") in log.read_text()
        anonymous = subprocess.run(
            ["logmq", "-b", f"localhost:{ports['9192']}", "topic", "list"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT,
        )
        assert anonymous.returncode == 1
        assert anonymous.stderr.strip() == refusal

        # and an anonymous Kafka client gets nothing from the Kafka port
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        kafka = AdminClient({"bootstrap.servers": f"localhost:{ports['9093']}"})
        with pytest.raises(KafkaException):
            kafka.list_topics(timeout=5)
    finally:
        if broker is not None:
            stop(broker)


def test_the_recipe_names_only_the_example_ports():
    """Whatever port the recipe uses must be one this test rewrites (else it would
    collide with anything listening there)."""
    blocks = [*recipe(), *(b for b in fenced_blocks(DOC) if b.section in AFTER)]
    text = "\n".join(b.text for b in blocks)
    used = set(re.findall(r"(?<![0-9]):([0-9]{4,5})(?![0-9])", text))
    assert used <= set(EXAMPLE_PORTS), used - set(EXAMPLE_PORTS)
