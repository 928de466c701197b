"""Feed hostile batches to the sanitized ``_recordsv2`` (see build_sanitized.py).

    python -m fuzz.sanitized_driver MODULE_PATH [--examples N] [--seed S] [--last FILE]
    python -m fuzz.sanitized_driver MODULE_PATH --replay DIR [DIR...]

Must run with the environment ``build_sanitized.sanitizer_env()`` gives. Loads the
module at MODULE_PATH as ``logmq.storage._recordsv2`` before anything of logmq, runs the
regression inputs of earlier findings, then N hypothesis-built inputs
(codec_inputs.hostile) through every entry point; or, with --replay, every file of the
given atheris corpus directories. Exit status 0 and no sanitizer report
on stderr: nothing found.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
from pathlib import Path


def load(path: str):
    """Import the module at ``path`` in place of the installed extension."""
    spec = importlib.util.spec_from_file_location("_recordsv2", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules["logmq.storage._recordsv2"] = mod
    return mod


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("module")
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--last", help="write each input here first: a crash's input survives")
    parser.add_argument("--replay", nargs="+", default=[], help="atheris corpus directories")
    opts = parser.parse_args()
    mod = load(opts.module)

    from hypothesis import HealthCheck, given, seed, settings
    from hypothesis import strategies as st

    from fuzz import codec_inputs, regressions
    from logmq.storage import batch_scan, records_codec

    assert records_codec.COMPILED and batch_scan.COMPILED
    assert batch_scan.scan_batches is mod.scan_batches, "the installed module was loaded"

    for name, data in regressions.CODEC.items():
        for k in range(20):
            codec_inputs.exercise(mod, data, random.Random(k))
        print("regression", name, "ok", flush=True)
    codec_inputs.exercise_make_log_dirs(mod)
    if opts.replay:
        files = sorted(p for d in opts.replay for p in Path(d).iterdir() if p.is_file())
        for path in files:
            print("replay", path, flush=True)
            codec_inputs.exercise_fuzz_input(mod, path.read_bytes())
        print(f"{len(files)} corpus inputs: no finding", flush=True)
        return 0

    @seed(opts.seed)
    @settings(
        max_examples=opts.examples,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.randoms(use_true_random=False))
    def hostile_batches(rnd: random.Random) -> None:
        data = codec_inputs.hostile(rnd)
        if opts.last:
            with open(opts.last, "wb") as f:
                f.write(data)
        codec_inputs.exercise(mod, data, rnd)

    hostile_batches()
    print(f"{opts.examples} hostile inputs: no finding", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
