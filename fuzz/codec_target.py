"""atheris target: every entry point of the C record codec (``_recordsv2``).

An input is one flags byte and a buffer of batches (codec_inputs.exercise_fuzz_input).
The pure-Python reference versions run beside the C ones (their results must agree),
and atheris instruments them. The C code's own edges are visible to the fuzzer only in
a clang build (``fuzz.run codec --clang``, which names it in LOGMQ_FUZZ_CODEC_MODULE);
otherwise the reference code's coverage stands in.

Run through ``python -m fuzz.run codec`` (docs/testing.md, "Fuzzing"), which with
``--sanitized`` replays the corpus it found on a build under AddressSanitizer and
UndefinedBehaviorSanitizer (sanitized_driver.py --replay): preloading libasan into the
fuzzer itself would hide the coverage atheris steers by.
"""

from __future__ import annotations

import os
import sys

import atheris

with atheris.instrument_imports(include=["logmq", "fuzz"]):
    from fuzz import checks
    from logmq.storage import batch, batch_scan, records_py  # noqa: F401  (instrumented)

_pending = os.environ.get("LOGMQ_FUZZ_CODEC_MODULE")


def _load_coverage_build(path: str) -> None:
    """Swap in clang's coverage build. It calls libFuzzer's hooks as it loads, and
    atheris loads its libFuzzer privately when fuzzing starts: so this runs at the
    first input, after making that library's symbols global."""
    import ctypes
    import sysconfig

    from fuzz.sanitized_driver import load

    core = "core_with_libfuzzer" + sysconfig.get_config_var("EXT_SUFFIX")
    path_core = os.path.join(os.path.dirname(atheris.__file__), core)
    ctypes.CDLL(path_core, os.RTLD_NOLOAD | os.RTLD_GLOBAL)
    checks._recordsv2 = load(path)


def test_one_input(data: bytes) -> None:
    global _pending
    if _pending:
        _load_coverage_build(_pending)
        _pending = None
    checks.codec(data)


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
