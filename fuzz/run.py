"""Run one atheris target for a bounded time or number of inputs.

    python -m fuzz.run TARGET [--seconds N] [--runs N] [--sanitized] [--clang]
                              [--keep DIR] [-- LIBFUZZER_ARGS...]

TARGET is codec, kafka, native or remote. The target starts from its seed corpus in
fuzz/corpus/TARGET (kafka: and tests/kafka/corpus; never written to) and keeps the
inputs it finds new coverage with in a temporary directory (``--keep DIR``: that
directory, to resume a long run later). A crash's input is written to ``crash-*`` in
the current directory; replay it with ``python -m fuzz.checks TARGET crash-FILE``.

``--sanitized`` (codec only): afterwards, every input of the seed corpus and of the
corpus the run found is replayed on a build of the codec under AddressSanitizer and
UndefinedBehaviorSanitizer (the fuzzer itself runs without: libasan preloaded into it
would hide atheris's coverage). ``--clang`` (codec only, needs clang): the fuzzer runs
on a build of the codec with clang's coverage instrumentation, so the C code's edges
steer it too.

Prints libFuzzer's report and, last, ``runs=N seconds=S runs_per_second=R``; the exit
status is the target's (0: nothing found).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fuzz import build_sanitized

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("codec", "kafka", "native", "remote")


def command(
    target: str, corpus: Path, seconds: int | None, runs: int | None, extra: list[str]
) -> list[str]:
    cmd = [sys.executable, "-m", f"fuzz.{target}_target", "-print_final_stats=1"]
    if seconds is not None:
        cmd.append(f"-max_total_time={seconds}")
    if runs is not None:
        cmd.append(f"-runs={runs}")
    seeds = [ROOT / "fuzz" / "corpus" / target]
    if target == "kafka":  # frames recorded from real clients (tests/kafka/record_corpus.py)
        seeds.append(ROOT / "tests" / "kafka" / "corpus")
    return [*cmd, *extra, str(corpus), *(str(s) for s in seeds if s.is_dir())]


def run(
    target: str,
    *,
    seconds: int | None = None,
    runs: int | None = None,
    sanitized: bool = False,
    clang: bool = False,
    keep: str | None = None,
    extra: tuple[str, ...] | list[str] = (),
    timeout: float | None = None,
) -> tuple[int, str, dict[str, float]]:
    """Run ``target``: (exit status, its output, {"runs", "seconds", "runs_per_second"})."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}: one of {', '.join(TARGETS)}")
    with tempfile.TemporaryDirectory(prefix=f"logmq-fuzz-{target}-") as tmp:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        if (sanitized or clang) and target != "codec":
            raise ValueError("only the codec target has sanitized and clang builds")
        if clang:
            Path(tmp, "clang").mkdir()
            built = build_sanitized.build_for_coverage(Path(tmp, "clang"))
            env["LOGMQ_FUZZ_CODEC_MODULE"] = str(built)
        corpus = Path(keep) if keep else Path(tmp, "corpus")
        corpus.mkdir(parents=True, exist_ok=True)
        cmd = command(target, corpus, seconds, runs, list(extra))
        start = time.monotonic()
        proc = subprocess.run(cmd, env=env, cwd=os.getcwd(), capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
        elapsed = time.monotonic() - start
        output, status = proc.stdout + proc.stderr, proc.returncode
        if sanitized and status == 0:
            env.pop("LOGMQ_FUZZ_CODEC_MODULE", None)
            module = build_sanitized.build(tmp)
            replay = subprocess.run(
                [sys.executable, "-m", "fuzz.sanitized_driver", str(module), "--replay",
                 str(corpus), str(ROOT / "fuzz" / "corpus" / target)],
                env=build_sanitized.sanitizer_env(env), cwd=ROOT, capture_output=True,
                text=True, timeout=timeout,
            )  # fmt: skip
            lines = replay.stdout.splitlines()
            output += "\n".join(lines[-3:]) + "\n" + replay.stderr
            status = replay.returncode
    stats = {"runs": 0.0, "seconds": elapsed, "runs_per_second": 0.0}
    done = re.findall(r"stat::number_of_executed_units:\s*(\d+)", output)
    if done:
        stats["runs"] = float(done[-1])
    rate = re.findall(r"stat::average_exec_per_sec:\s*(\d+)", output)
    if rate and float(rate[-1]) > 0:
        stats["runs_per_second"] = float(rate[-1])
    else:  # libFuzzer reports 0 for a run of under a second
        stats["runs_per_second"] = stats["runs"] / elapsed
    return status, output, stats


def main() -> int:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(prog="python -m fuzz.run")
    parser.add_argument("target", choices=TARGETS)
    parser.add_argument("--seconds", type=int, default=None)
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--sanitized", action="store_true")
    parser.add_argument("--clang", action="store_true")
    parser.add_argument("--keep", default=None)
    opts = parser.parse_args(argv)
    if opts.seconds is None and opts.runs is None:
        opts.seconds = 60
    status, output, stats = run(opts.target, seconds=opts.seconds, runs=opts.runs,
                                sanitized=opts.sanitized, clang=opts.clang, keep=opts.keep,
                                extra=extra)  # fmt: skip
    print(output)
    print(f"runs={stats['runs']:.0f} seconds={stats['seconds']:.1f} "
          f"runs_per_second={stats['runs_per_second']:.0f}")  # fmt: skip
    return status


if __name__ == "__main__":
    sys.exit(main())
