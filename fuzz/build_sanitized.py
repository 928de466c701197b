"""Build ``_recordsv2.c`` under AddressSanitizer and UndefinedBehaviorSanitizer.

The module keeps its name (``_recordsv2``), so a driver that puts it in ``sys.modules``
as ``logmq.storage._recordsv2`` before importing logmq runs every caller (batch_scan,
records_codec) on the sanitized code. Python itself is not instrumented, so the process
must start with gcc's libasan preloaded (``sanitizer_env``); leaks are not checked
(CPython keeps objects alive until exit on purpose).

    python -m fuzz.build_sanitized OUT_DIR   # prints the path of the built module

``build_for_coverage`` makes the other build fuzzing wants: clang's coverage
instrumentation for libFuzzer, so atheris sees the C code's edges (fuzz.run --clang).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src" / "logmq" / "storage" / "_recordsv2.c"
FLAGS = [
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=undefined",
    "-fno-omit-frame-pointer",
    "-g",
    "-O1",
]


def _runtime(cc: str, name: str) -> str | None:
    """The path of a sanitizer runtime gcc links against, or None when it is missing."""
    try:
        out = subprocess.run(
            [cc, f"-print-file-name={name}"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    # gcc prints the bare name back when it has no such file
    return out if os.path.isabs(out) and os.path.exists(out) else None


def missing() -> str | None:
    """Why a sanitized build cannot be made here, or None when it can."""
    cc = shutil.which("gcc")
    if cc is None:
        return "gcc is not installed"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        return "the Python headers (Python.h) are not installed"
    for lib in ("libasan.so", "libubsan.so"):
        if _runtime(cc, lib) is None:
            return f"gcc has no {lib} (Debian: apt-get install libasan8 libubsan1)"
    return None


def build(out_dir: str | os.PathLike) -> Path:
    """Compile the sanitized module into ``out_dir``; returns its path."""
    reason = missing()
    if reason:
        raise RuntimeError(f"cannot build the sanitized codec: {reason}")
    out = Path(out_dir) / ("_recordsv2" + sysconfig.get_config_var("EXT_SUFFIX"))
    include = sysconfig.get_paths()["include"]
    cmd = ["gcc", "-shared", "-fPIC", *FLAGS, f"-I{include}", str(SOURCE), "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def clang() -> str | None:
    """A clang on PATH (Debian names it clang-14 and so on), or None."""
    for name in ("clang", *(f"clang-{v}" for v in range(20, 13, -1))):
        if shutil.which(name):
            return name
    return None


def build_for_coverage(out_dir: str | os.PathLike) -> Path:
    """Compile the module with clang's coverage instrumentation for libFuzzer (no
    sanitizer) into ``out_dir``; atheris must have loaded libFuzzer before it is imported."""
    cc = clang()
    if cc is None:
        raise RuntimeError("no clang on PATH (Debian: apt-get install clang)")
    out = Path(out_dir) / ("_recordsv2" + sysconfig.get_config_var("EXT_SUFFIX"))
    include = sysconfig.get_paths()["include"]
    # fuzzer-no-link's set less stack-depth, whose __sancov_lowest_stack atheris's
    # libFuzzer does not export
    cover = "-fsanitize-coverage=inline-8bit-counters,pc-table,trace-cmp,indirect-calls"
    cmd = [cc, "-shared", "-fPIC", cover, "-O1", "-g", f"-I{include}", str(SOURCE), "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def sanitizer_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a Python process needs to load the sanitized module.

    PYTHONMALLOC=malloc sends every allocation to libasan's malloc, so a read past a
    buffer Python allocated is caught instead of landing in a pymalloc arena. An
    allocation of more than 256 MB is reported as an error: fuzz inputs are a few KB,
    so only a count or length taken on trust can ask for that much.
    """
    env = dict(os.environ if base is None else base)
    asan = _runtime("gcc", "libasan.so")
    if asan is None:
        raise RuntimeError("gcc has no libasan.so")
    env["LD_PRELOAD"] = os.path.realpath(asan)
    env["ASAN_OPTIONS"] = "detect_leaks=0:exitcode=86:max_allocation_size_mb=256"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1:exitcode=87"
    env["PYTHONMALLOC"] = "malloc"
    return env


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else "."))
