"""A real S3 server for tests: moto's standalone server as a subprocess on 127.0.0.1.

``MotoS3Server`` runs ``moto_server`` (PyPI ``moto[server]``) on a free port, waits until
it answers, and can stop, kill, pause (SIGSTOP) and resume (SIGCONT) it, so a test sees
what a store that hangs or vanishes does to its caller. ``FaultyS3Proxy`` stands in front
of it and answers the next requests with 503 SlowDown or 500, or drops the connection,
so retries are tested over real HTTP::

    with MotoS3Server() as s3:
        s3.create_bucket("tiered")
        async with FaultyS3Proxy(s3.port) as proxy:
            proxy.fail_next(2)              # two 503 SlowDown, then moto answers
            store = S3Store("tiered", endpoint_url=proxy.endpoint_url, ...)

Like the rest of logmq.testing it needs only the standard library (and moto's server).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = ["FaultyS3Proxy", "MotoS3Server", "MotoStartError", "moto_server_command"]

HOST = "127.0.0.1"
# dummy credentials: moto takes any unless told to check them (INITIAL_NO_AUTH_ACTION_COUNT)
ACCESS_KEY_ID = "testing"
SECRET_ACCESS_KEY = "testing"


class MotoStartError(RuntimeError):
    """moto_server exited or did not answer in time; the message has its log's tail."""


def moto_server_command() -> list[str] | None:
    """How to run moto's server here (the venv's script first), or None if not installed."""
    script = Path(sys.executable).with_name("moto_server")
    if script.exists():
        return [str(script)]
    found = shutil.which("moto_server")
    if found:
        return [found]
    if importlib.util.find_spec("moto") is not None and importlib.util.find_spec("flask"):
        return [sys.executable, "-m", "moto.server"]
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class MotoS3Server:
    """One moto server process; ``env`` adds environment (e.g. moto's auth switch)."""

    def __init__(
        self,
        *,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        start_timeout_s: float = 30.0,
    ) -> None:
        self._want_port = port
        self._env = dict(env or {})
        self._start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._log_path: Path | None = None
        self.port = 0
        self.paused = False

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])

    def start(self) -> MotoS3Server:
        command = moto_server_command()
        if command is None:
            raise MotoStartError("moto_server is not installed (pip install 'moto[server]')")
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="logmq-moto-")
            self._log_path = Path(self._dir.name) / "moto.log"
        self.port = self._want_port or _free_port()
        env = {**os.environ, **self._env}
        assert self._log_path is not None
        with open(self._log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [*command, "-H", HOST, "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # a ^C of the test run is not sent to it too
            )
        self.paused = False
        self._wait_ready(time.monotonic() + self._start_timeout_s)
        return self

    def _wait_ready(self, deadline: float) -> None:
        delay = 0.02
        while True:
            if not self.running:
                raise MotoStartError(f"moto_server exited:\n{self.log_tail()}")
            try:
                # the moto API answers without counting as an (authenticated) action
                with urllib.request.urlopen(f"{self.endpoint_url}/moto-api/data.json", timeout=2):
                    return
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise MotoStartError(f"moto_server not answering in time:\n{self.log_tail()}")
            time.sleep(delay)  # polling a subprocess: there is no event to wait on
            delay = min(delay * 2, 0.2)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Terminate (resuming it first if paused), then kill if it lingers."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            if self.paused:
                self.resume()
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._proc = None

    def kill(self) -> None:
        """SIGKILL: the store vanishes mid-request, as after a crash."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self._proc = None
        self.paused = False

    def pause(self) -> None:
        """SIGSTOP: connections stay open and requests hang unanswered (a stalled store)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)
        self.paused = False

    @contextlib.contextmanager
    def paused_for(self) -> Iterator[None]:
        """Paused inside the block, resumed however it ends."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def restart(self) -> None:
        """Kill and start again on the same port (moto keeps no state: buckets are gone)."""
        port = self.port
        self.kill()
        self._want_port = port
        self.start()

    def create_bucket(self, name: str) -> str:
        """Create ``name`` (an unsigned request: moto takes it while auth is off)."""
        request = urllib.request.Request(f"{self.endpoint_url}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=10):
            return name

    def reset(self) -> None:
        """Forget every bucket and object (moto's reset API)."""
        request = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def __enter__(self) -> MotoS3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stop()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __repr__(self) -> str:
        return f"MotoS3Server({self.endpoint_url}, pid={self.pid})"


class FaultyS3Proxy:
    """An HTTP/1.1 proxy on 127.0.0.1 that can fail the next requests on purpose.

    ``fail_next(n, status, code)`` answers the next n requests with an S3 error (503
    SlowDown by default) without passing them on; ``drop_next(n)`` closes the connection
    once the request is read; otherwise requests go to the upstream and back, one at a
    time per connection (keep-alive kept). ``requests`` counts every request seen.
    """

    def __init__(self, upstream_port: int, *, upstream_host: str = HOST) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._server: asyncio.Server | None = None
        self._faults: list[tuple[str, int, str, str]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0
        self.requests = 0
        self.request_lines: list[str] = []  # "PUT /bucket/key?partNumber=1&... HTTP/1.1"
        self.faults_served = 0

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def fail_next(
        self, n: int, status: int = 503, code: str = "SlowDown", *, match: str = ""
    ) -> None:
        """Answer the next ``n`` requests (whose request line ``match``es, a regex) with
        ``status`` and the S3 error ``code``."""
        self._faults.extend([("fail", status, code, match)] * n)

    def drop_next(self, n: int, *, match: str = "") -> None:
        """Close the connection on the next ``n`` (matching) requests, unanswered."""
        self._faults.extend([("drop", 0, "", match)] * n)

    def _take_fault(self, request_line: bytes) -> tuple[str, int, str] | None:
        line = request_line.decode("latin-1")
        for i, (kind, status, code, match) in enumerate(self._faults):
            if re.search(match, line):
                del self._faults[i]
                self.faults_served += 1
                return kind, status, code
        return None

    def clear(self) -> None:
        self._faults.clear()

    @property
    def pending_faults(self) -> int:
        return len(self._faults)

    async def start(self) -> FaultyS3Proxy:
        self._server = await asyncio.start_server(self._serve, HOST, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            # closing the sockets ends each handler (cancelling them would make asyncio
            # log the cancelled handler tasks as errors)
            for writer in list(self._writers):
                writer.transport.abort()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> FaultyS3Proxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                request = await _read_message(reader, request=True, writer=writer)
                if request is None:
                    return
                head, body, method = request
                self.requests += 1
                self.request_lines.append(head.split(b"\r\n", 1)[0].decode("latin-1"))
                fault = self._take_fault(head.split(b"\r\n", 1)[0])
                if fault is not None:
                    kind, status, code = fault
                    if kind == "drop":
                        return  # the finally closes the client's connection unanswered
                    writer.write(_error_response(status, code))
                    await writer.drain()
                    continue
                if upstream is None:
                    upstream = await asyncio.open_connection(*self._upstream)
                    self._writers.add(upstream[1])
                up_reader, up_writer = upstream
                up_writer.write(head + body)
                await up_writer.drain()
                response = await _read_message(up_reader, request=False, method=method)
                if response is None:
                    return
                writer.write(response[0] + response[1])
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            self._tasks.discard(task)
            for w in (writer, upstream[1] if upstream else None):
                if w is not None:
                    self._writers.discard(w)
                    w.close()


async def _read_message(
    reader: asyncio.StreamReader,
    *,
    request: bool,
    method: str = "",
    writer: asyncio.StreamWriter | None = None,
) -> tuple[bytes, bytes, str] | None:
    """One HTTP/1.1 message: (head, body, request method); None at a clean EOF.

    A request's ``Expect: 100-continue`` is answered here (and dropped from the head
    passed on): the whole body is read before the upstream sees the request.
    """
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    lines = head.decode("latin-1").split("\r\n")
    first = lines[0].split(" ")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if request:
        method = first[0]
        if headers.get("expect", "").lower() == "100-continue" and writer is not None:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            kept = [ln for ln in lines[:-2] if not ln.lower().startswith("expect:")]
            head = ("\r\n".join(kept) + "\r\n\r\n").encode("latin-1")
    elif method == "HEAD" or first[1] in ("204", "304") or first[1].startswith("1"):
        return head, b"", method
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            body += size_line
            size = int(size_line.split(b";")[0], 16)
            body += await reader.readexactly(size + 2)
            if size == 0:
                break  # no trailers from S3 or botocore
        return head, bytes(body), method
    length = int(headers.get("content-length", "0"))
    if length < 0 or length > 6 << 30:
        raise ValueError(f"bad content-length {length}")
    return head, await reader.readexactly(length), method


def _error_response(status: int, code: str) -> bytes:
    reason = {500: "Internal Server Error", 503: "Service Unavailable"}.get(status, "Error")
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>injected by FaultyS3Proxy</Message>"
        "<RequestId>faulty</RequestId></Error>"
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body
