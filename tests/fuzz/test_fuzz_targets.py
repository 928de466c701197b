"""The coverage-guided fuzz targets (fuzz/*_target.py, docs/testing.md "Fuzzing").

Every seed of the checked-in corpus passes its target's check (no atheris needed), and,
where atheris is installed, each target runs for a few seconds from that corpus in a
subprocess and finds nothing; the codec's run steers by the C code's coverage where clang
is installed and ends with a replay of what it found on the sanitized build. ``--soak``
runs each for five minutes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fuzz import build_sanitized, checks, regressions, run

CORPUS = Path(run.ROOT, "fuzz", "corpus")
TARGETS = ("codec", "kafka", "native", "remote")
REGRESSIONS = {
    "codec": regressions.CODEC,
    "kafka": regressions.KAFKA,
    "native": regressions.NATIVE,
    "remote": regressions.REMOTE,
}


def needs_codec(target: str) -> None:
    if target == "codec" and checks._recordsv2 is None:
        pytest.skip("the C record codec is not built")


@pytest.mark.parametrize("target", TARGETS)
def test_every_seed_passes_its_check(target, tmp_path):
    """In a subprocess: an input that crashes a decoder (the kafka corpus holds one that
    aborted the process) must fail the test, not end the test run."""
    needs_codec(target)
    seeds = CORPUS / target
    assert len(list(seeds.iterdir())) >= 5, f"the {target} seed corpus is missing"
    found = REGRESSIONS[target]
    for i, (name, data) in enumerate(found.items()):
        flags = b"\x02" if target == "codec" else b""  # the CRC fixed, as fuzzing does
        (tmp_path / f"{i}-{name}").write_bytes(flags + data)
    r = subprocess.run(
        [sys.executable, "-m", "fuzz.checks", target, str(seeds), str(tmp_path)],
        cwd=run.ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "inputs: no finding" in r.stdout


@pytest.mark.parametrize("target", TARGETS)
def test_the_target_finds_nothing_in_a_bounded_run(target, request, tmp_path):
    pytest.importorskip("atheris", reason="atheris is not installed (pip install atheris)")
    needs_codec(target)
    seconds = 300 if request.config.getoption("--soak") else 5
    sanitized = target == "codec" and build_sanitized.missing() is None
    clang = target == "codec" and build_sanitized.clang() is not None
    status, output, stats = run.run(
        target,
        seconds=seconds,
        sanitized=sanitized,
        clang=clang,
        extra=[f"-artifact_prefix={tmp_path}/"],
        timeout=seconds + 300,
    )
    crashes = [p.name + ": " + p.read_bytes()[:512].hex() for p in tmp_path.glob("crash-*")]
    assert status == 0, f"{target}: status {status}, {crashes}\n{output[-6000:]}"
    assert stats["runs"] > 0, output[-3000:]
    print(f"{target}: {stats['runs']:.0f} runs, {stats['runs_per_second']:.0f}/s")
