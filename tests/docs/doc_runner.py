"""Run a document's command blocks as a reader would, against real brokers.

The convention the docs follow (docs/testing.md, "Docs whose commands run"):

- ``sh``/``bash``/``shell`` blocks run in bash (``set -eo pipefail``), ``python``/``py``
  blocks in a fresh interpreter that accepts top-level ``await`` (as ``python -m asyncio``
  does). Any other info string (``text``, ``json``, ``toml``, none) is output or a file
  and is not run. A block right after a caption "`path`:" is that file: it is written to
  the document's directory, not run.
- The blocks of one document run in order in one temp directory, as in one shell session:
  what a block exports and where it ``cd``-s hold for the blocks after it.
- A line that starts a server in the foreground (``logmq-server ...`` or ``logmq dev
  cluster ...``, not ending in ``&``) runs in the background, as the reader's other
  shell: the runner waits for its ready line and stops it with Ctrl-C's SIGINT when the
  document ends or another server starts (one broker or cluster at a time).
- ``<!-- doc-test: needs broker -->`` above a block: a broker started as README.md's
  first command does (``logmq-server`` in the document's directory) runs before the
  block; ``needs cluster N``: ``logmq dev cluster --brokers N``.
  ``<!-- doc-test: input: TEXT -->``: the block's stdin (``\\n`` for newlines), for a
  prompt. ``<!-- doc-test: skip: REASON -->``: the block is not run, for REASON.
- Ports: each document gets one offset D (free ports), and every example port
  9000-9999 written as ``:PORT``, ``--...port PORT`` or ``--...port=PORT`` becomes
  PORT + D; defaults get the same shift through ``LOGMQ_BOOTSTRAP``, ``LOGMQ_PORT`` and
  ``LOGMQ_KAFKA_PORT`` and, for a ``logmq dev cluster`` line without one, ``--base-port``.
- ``PATH`` starts with the test interpreter's directory, as after ``source
  .venv/bin/activate``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.docs.markdown_blocks import Block, fenced_blocks

SHELL = {"sh", "bash", "shell"}
PYTHON = {"python", "py", "python3"}
BLOCK_TIMEOUT_S = 150.0  # one block; a Spark job is the longest
SERVER_READY_S = 60.0
SERVER_STOP_S = 30.0
EXAMPLE_PORT = re.compile(r"(?:(?<=:)|(?<=port )|(?<=port=))(9\d{3})\b")
# ports the docs' brokers use by default: 9092.., 9192.. and Raft 9292.. for up to 9 brokers
DEFAULT_PORTS = [base + i for base in (9092, 9192, 9292) for i in range(9)]
LOCAL_ONLY = {"logmq-data", "logmq-cluster", "build", "dist", "__pycache__"}
CAPTION_FILE = re.compile(r"^`(?P<path>[\w./-]+)`:$")
READY_LINE = re.compile(rb"^logmq(-server| dev cluster) ready", re.M)

# Python blocks: top-level await allowed, __main__ semantics, sys.path[0] = the cwd.
PYTHON_BOOT = """\
import ast, asyncio, inspect, sys
path = sys.argv[1]
code = compile(open(path).read(), path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
namespace = {"__name__": "__main__", "__builtins__": __builtins__}
sys.argv = [path]
if code.co_flags & inspect.CO_COROUTINE:
    asyncio.run(eval(code, namespace))
else:
    exec(code, namespace)
"""


class DocTestError(AssertionError):
    """A block failed, or a directive is malformed: the message names doc and line."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do with one block, from its language, caption and directives."""

    block: Block
    action: str  # "shell", "python", "file", "skip", "none" (output, config...)
    reason: str = ""  # for a skip
    needs: tuple[str, int] | None = None  # ("broker", 1) or ("cluster", N)
    stdin: bytes | None = None
    path: str = ""  # for a file


def plan_block(doc: Path, block: Block) -> Plan:
    """Read a block's directives; a malformed one raises DocTestError."""
    where = f"{doc}:{block.line}"
    reason, needs, stdin = None, None, None
    for directive in block.directives:
        word, _, rest = directive.partition(" ")
        if directive.startswith("skip:"):
            reason = directive[len("skip:") :].strip()
            if not reason:
                raise DocTestError(f"{where}: 'doc-test: skip:' needs a reason")
        elif word == "needs":
            parts = rest.split()
            if parts == ["broker"]:
                needs = ("broker", 1)
            elif len(parts) == 2 and parts[0] == "cluster" and parts[1].isdigit():
                needs = ("cluster", int(parts[1]))
            else:
                raise DocTestError(f"{where}: unknown 'doc-test: {directive}'")
        elif directive.startswith("input:"):
            text = directive[len("input:") :].strip()
            stdin = (text.replace("\\n", "\n") + "\n").encode()
        else:
            raise DocTestError(f"{where}: unknown 'doc-test: {directive}'")
    if reason is not None:
        return Plan(block, "skip", reason=reason)
    caption = CAPTION_FILE.match(block.caption)
    if caption:
        return Plan(block, "file", path=caption["path"])
    if block.language in SHELL:
        return Plan(block, "shell", needs=needs, stdin=stdin)
    if block.language in PYTHON:
        return Plan(block, "python", needs=needs, stdin=stdin)
    if needs or stdin is not None:
        raise DocTestError(f"{where}: a doc-test directive on a block that is not run")
    return Plan(block, "none")


def plan_document(doc: Path) -> list[Plan]:
    return [plan_block(doc, block) for block in fenced_blocks(doc)]


def pick_port_offset(example_ports: set[int]) -> int:
    """An offset D such that every example port + D can be bound on 127.0.0.1 now."""
    rng = random.Random()
    for _ in range(200):
        offset = rng.randrange(1_000, 20_000)
        if all(_bindable(port + offset) for port in sorted(example_ports)):
            return offset
    raise RuntimeError("no free port range for the document's example ports")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def shift_ports(text: str, offset: int) -> str:
    return EXAMPLE_PORT.sub(lambda m: str(int(m[1]) + offset), text)


@dataclass
class Server:
    kind: tuple[str, int]
    command: str
    proc: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class Timing:
    line: int
    action: str
    seconds: float


@dataclass
class DocumentRun:
    """One document's blocks, run in order in ``workdir``; ``run()`` then ``close()``."""

    doc: Path
    workdir: Path
    root: Path
    offset: int = 0
    timings: list[Timing] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)
    _server: Server | None = None
    _servers_started: int = 0

    def __post_init__(self) -> None:
        self.plans = plan_document(self.doc)
        self.control = self.workdir / ".doc-test"
        self.home = self.workdir / "doc"
        self.control.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        _link_checkout(self.root, self.home)
        self.state = self.control / "shell-state.sh"
        ports = set(DEFAULT_PORTS)
        for plan in self.plans:
            ports.update(int(p) for p in EXAMPLE_PORT.findall(plan.block.text))
        self.offset = self.offset or pick_port_offset(ports)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LOGMQ_", "PYTEST_"))}
        # as after `source .venv/bin/activate`: the test's interpreter, logmq and
        # logmq-server come first on PATH (CI runs .venv/bin/python without activating)
        bin_dir = str(Path(sys.executable).parent)
        env.update(
            PATH=os.pathsep.join([bin_dir, env.get("PATH", "")]),
            PYTHONUNBUFFERED="1",
            LOGMQ_BOOTSTRAP=f"127.0.0.1:{9192 + self.offset}",
            LOGMQ_PORT=str(9192 + self.offset),
            LOGMQ_KAFKA_PORT=str(9092 + self.offset),
        )
        self.env = env
        self.state.write_text(f"cd {shlex.quote(str(self.home))}\n")

    # -- the document ---------------------------------------------------------------
    def run(self) -> None:
        for plan in self.plans:
            started = time.monotonic()
            if plan.action == "skip":
                self.skipped.append((plan.block.line, plan.reason))
                continue
            if plan.action == "none":
                continue
            if plan.action == "file":
                self._write_file(plan)
                continue
            if plan.needs:
                self._ensure(plan.needs, plan.block.line)
            if plan.action == "shell":
                self._run_shell(plan)
            else:
                self._run_python(plan)
            self.timings.append(Timing(plan.block.line, plan.action, time.monotonic() - started))

    def _write_file(self, plan: Plan) -> None:
        """A file the document shows: the repository's own must be shown as it is; any
        other is written where the reader would create it."""
        target = self.home / plan.path
        if target.resolve().is_relative_to(self.root):
            if not target.is_file() or target.read_text() != plan.block.text:
                raise DocTestError(
                    f"{self.doc}:{plan.block.line}: the block shows {plan.path}, which "
                    "differs from (or is missing in) the repository"
                )
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(plan.block.text)

    def close(self) -> None:
        self._stop_server()

    # -- shell blocks ---------------------------------------------------------------
    def _run_shell(self, plan: Plan) -> None:
        """Run the block's commands; a foreground server line goes to the background."""
        segment: list[tuple[int, str]] = []
        for number, command in _shell_commands(plan.block.text, plan.block.line + 1):
            server = _server_kind(command)
            if server is None:
                segment.append((number, command))
                continue
            self._shell_segment(plan, segment)
            segment = []
            self._start_server(server, _server_command(command, server, self.offset), number)
        self._shell_segment(plan, segment)

    def _shell_segment(self, plan: Plan, commands: list[tuple[int, str]]) -> None:
        """One bash script for these commands; each one's status is checked, since
        ``set -e`` lets a failure inside ``a && b`` pass."""
        if not any(_is_command(command) for _, command in commands):
            return
        first = commands[0][0]
        where = f"{self.doc.name} line $__doc_line"
        lines = [
            "set -eo pipefail",
            f"source {shlex.quote(str(self.state))}",
            f"trap 'echo \"doc-test: exit status $? at {where}\" >&2' ERR",
            f'__doc_check() {{ [ "$1" -eq 0 ] || {{ echo "doc-test: exit status $1 at {where}" >&2;'
            ' exit "$1"; }; }',
        ]
        for number, command in commands:
            lines += [f"__doc_line={number}", shift_ports(command, self.offset), "__doc_check $?"]
        lines.append(f'{{ export -p; printf "cd %q\\n" "$PWD"; }} > {shlex.quote(str(self.state))}')
        script = self.control / f"block-{plan.block.line}-{first}.sh"
        script.write_text("\n".join(lines) + "\n")
        self._execute(["bash", str(script)], plan, first)

    # -- python blocks --------------------------------------------------------------
    def _run_python(self, plan: Plan) -> None:
        source = self.control / f"block-{plan.block.line}.py"
        # blank lines first, so a traceback's line numbers are the document's
        source.write_text("\n" * plan.block.line + shift_ports(plan.block.text, self.offset))
        command = (
            f"source {shlex.quote(str(self.state))}; "
            f"exec python -c {shlex.quote(PYTHON_BOOT)} {shlex.quote(str(source))}"
        )
        self._execute(["bash", "-c", command], plan, plan.block.line + 1)

    # -- processes ------------------------------------------------------------------
    def _execute(self, argv: list[str], plan: Plan, line: int) -> None:
        output = self.control / f"output-{plan.block.line}-{line}.txt"
        with open(output, "wb") as out:
            proc = subprocess.Popen(
                argv,
                cwd=self.home,
                env=self.env,
                stdin=subprocess.PIPE if plan.stdin is not None else subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                proc.communicate(plan.stdin, timeout=BLOCK_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                self._fail(plan, line, f"still running after {BLOCK_TIMEOUT_S:.0f} s", output)
            finally:
                _kill_group(proc)  # whatever the block left running in the background
        if proc.returncode != 0:
            self._fail(plan, line, f"exit status {proc.returncode}", output)

    def _fail(self, plan: Plan, line: int, what: str, output: Path) -> None:
        text = output.read_text(errors="replace")
        tail = "\n".join(text.splitlines()[-60:])
        message = (
            f"{self.doc}:{line}: the {plan.block.info or 'unnamed'} block at line "
            f"{plan.block.line} failed ({what}); ports shifted by {self.offset}\n"
            f"--- its output ---\n{tail}\n"
        )
        if self._server is not None:
            message += f"--- the server ({self._server.command}) ---\n{self._server.tail()}\n"
        raise DocTestError(message)

    def _ensure(self, kind: tuple[str, int], line: int) -> None:
        if self._server is not None and self._server.kind == kind and self._server.alive():
            return
        command = "logmq-server"
        if kind[0] == "cluster":
            command = f"logmq dev cluster --brokers {kind[1]}"
        self._start_server(kind, _server_command(command, kind, self.offset), line)

    def _start_server(self, kind: tuple[str, int], command: str, line: int) -> None:
        self._stop_server()
        self._servers_started += 1
        log = self.control / f"server-{self._servers_started}.log"
        script = f"source {shlex.quote(str(self.state))}; exec {command}"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["bash", "-c", script],
                cwd=self.home,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = Server(kind, command, proc, log)
        self._server = server
        deadline = time.monotonic() + SERVER_READY_S
        while not READY_LINE.search(log.read_bytes()):
            if not server.alive():
                raise DocTestError(
                    f"{self.doc}:{line}: `{command}` exited with status "
                    f"{proc.returncode} before it was ready:\n{server.tail()}"
                )
            if time.monotonic() > deadline:
                raise DocTestError(
                    f"{self.doc}:{line}: `{command}` not ready in {SERVER_READY_S:.0f} s:\n"
                    f"{server.tail()}"
                )
            time.sleep(0.05)  # polling a log file for a line: there is nothing to wait on

    def _stop_server(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        with _suppress_lookup():
            os.killpg(server.proc.pid, signal.SIGINT)  # Ctrl-C in its shell
        try:
            server.proc.wait(timeout=SERVER_STOP_S)
        except subprocess.TimeoutExpired:
            pass
        _kill_group(server.proc)


def _link_checkout(root: Path, home: Path) -> None:
    """Make ``home`` look like the reader's clone: the repository's top-level files and
    folders linked in (``python spark/examples/...`` works), what commands write stays in
    ``home`` (data dirs, plan files, outputs)."""
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".") or entry.name in LOCAL_ONLY or entry.suffix == ".egg-info":
            continue
        (home / entry.name).symlink_to(entry)


def _shell_commands(text: str, first: int) -> list[tuple[int, str]]:
    """The block cut into complete shell commands (a line, or the lines a continuation,
    a loop or a here-document spans, as ``bash -n`` judges), each with its line number."""
    commands: list[tuple[int, str]] = []
    pending: list[str] = []
    start = first
    for number, line in enumerate(text.splitlines(), first):
        if not pending:
            start = number
        pending.append(line)
        chunk = "\n".join(pending) + "\n"
        if line.endswith("\\") or not _complete(chunk):
            continue
        commands.append((start, chunk.rstrip("\n")))
        pending = []
    if pending:
        commands.append((start, "\n".join(pending)))
    return commands


def _complete(chunk: str) -> bool:
    result = subprocess.run(["bash", "-n"], input=chunk.encode(), capture_output=True, check=False)
    return result.returncode == 0


def _is_command(chunk: str) -> bool:
    return any(line.strip() and not line.strip().startswith("#") for line in chunk.splitlines())


def _server_kind(line: str) -> tuple[str, int] | None:
    """("broker", 1) or ("cluster", N) for a line that runs a server in the foreground."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    if not words or words[-1] == "&" or line.rstrip().endswith("&"):
        return None
    if words[0] == "logmq-server" or words[0].endswith("/logmq-server"):
        return ("broker", 1)
    if words[:3] == ["logmq", "dev", "cluster"]:
        brokers = 3
        for flag, value in itertools.pairwise(words):
            if flag in ("--brokers", "-n") and value.isdigit():
                brokers = int(value)
        return ("cluster", brokers)
    return None


def _server_command(line: str, kind: tuple[str, int], offset: int) -> str:
    """The server line without its comment, ports shifted; a dev cluster gets the
    shifted default base port when the line names none (a broker's ports come from the
    environment: LOGMQ_PORT, LOGMQ_KAFKA_PORT)."""
    words = shlex.split(shift_ports(line, offset), comments=True)
    if kind[0] == "cluster" and not any(w.startswith("--base-port") for w in words):
        words += ["--base-port", str(9192 + offset)]
    return shlex.join(words)


def _kill_group(proc: subprocess.Popen) -> None:
    with _suppress_lookup():
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _suppress_lookup() -> contextlib.AbstractContextManager[None]:
    """Ignore a process group that is already gone."""
    return contextlib.suppress(ProcessLookupError, PermissionError)
