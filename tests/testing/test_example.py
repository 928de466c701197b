"""The example of docs/testing-with-logmq.md runs as documented: the guide shows the files
of examples/testing/ as they are, and that suite passes with nothing but logmq installed
(pytest finds the fixtures through logmq's ``pytest11`` entry point)."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "testing-with-logmq.md"
EXAMPLE = ROOT / "examples" / "testing"
# a file shown in the guide: a line "`examples/testing/PATH`:", then its fenced block
SHOWN_FILE = re.compile(r"^`(examples/testing/[^`]+)`:\n\n```[a-z]*\n(.*?)^```$", re.M | re.S)


def _pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest as a user runs it in their project (no cache dir or bytecode left behind)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "LOGMQ_"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.fixture(scope="module", autouse=True)
def plugin_installed() -> None:
    names = {e.value for e in importlib.metadata.entry_points(group="pytest11")}
    assert "logmq.testing.plugin" in names, (
        "logmq's pytest11 entry point is not installed: run pip install -e '.[dev]'"
    )


def test_the_guide_shows_the_example_files_as_they_are():
    shown = dict(SHOWN_FILE.findall(GUIDE.read_text()))
    files = sorted(
        str(p.relative_to(ROOT))
        for p in EXAMPLE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert sorted(shown) == files
    for name, text in shown.items():
        assert text == (ROOT / name).read_text(), f"{name} differs from the guide"


def test_the_example_suite_passes():
    result = _pytest(EXAMPLE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"\b3 passed\b", result.stdout), result.stdout


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc")
def test_the_plugin_starts_nothing_unasked_and_takes_server_args(tmp_path):
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nlogmq_server_args = --topic-config retention.ms=12345\n"
    )
    (tmp_path / "test_uses_it.py").write_text(
        textwrap.dedent(
            """
            import logmq.testing

            def test_a_test_without_the_fixtures_starts_no_broker():
                assert not list(logmq.testing._live)

            def test_the_ini_option_reaches_the_server(logmq_broker):
                (node,) = logmq_broker.nodes
                cmdline = open(f"/proc/{node.pid}/cmdline", "rb").read().split(b"\\0")
                assert b"retention.ms=12345" in cmdline
            """
        )
    )
    result = _pytest(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"\b2 passed\b", result.stdout), result.stdout
