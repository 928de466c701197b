"""The C record codec under AddressSanitizer and UndefinedBehaviorSanitizer (issue 27).

A build of ``_recordsv2.c`` with both sanitizers runs in a subprocess with libasan
preloaded (fuzz/build_sanitized.py) and gets hypothesis-built hostile batches through
every entry point (fuzz/sanitized_driver.py); the run passes when the subprocess exits
0 with no sanitizer report. Then each earlier finding (fuzz/regressions.py) is pinned
to the answer it must now give, from the C module and the pure-Python versions alike.
``--soak`` runs many more inputs; LOGMQ_FUZZ_SEED picks other ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz import build_sanitized, regressions
from logmq.records import Record
from logmq.storage import batch_scan

ROOT = Path(__file__).resolve().parents[2]
SANITIZER_REPORTS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer")

if batch_scan.COMPILED:
    from logmq.storage import _recordsv2
else:
    _recordsv2 = None


@pytest.fixture(scope="module")
def sanitized_codec(tmp_path_factory) -> Path:
    reason = build_sanitized.missing()
    if reason:
        pytest.skip(f"no sanitized build of the C codec: {reason}")
    return build_sanitized.build(tmp_path_factory.mktemp("sanitized"))


def run_sanitized(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=build_sanitized.sanitizer_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_harness_catches_a_read_past_a_buffer(sanitized_codec):
    """A sanitizer that reports nothing proves nothing: a read one byte past an input
    buffer (codec_inputs.tight) must be reported."""
    code = (
        "import ctypes\n"
        "from fuzz.codec_inputs import tight\n"
        "mv = tight(b'x' * 5)\n"
        "addr = ctypes.addressof(ctypes.c_char.from_buffer(mv))\n"
        "ctypes.string_at(addr, 6)\n"
    )
    r = run_sanitized(["-c", code], timeout=120)
    assert r.returncode != 0 and "ERROR: AddressSanitizer: heap-buffer-overflow" in r.stderr


def test_hostile_batches_under_asan_and_ubsan(sanitized_codec, request, tmp_path):
    examples = 20_000 if request.config.getoption("--soak") else 1000
    seed = os.environ.get("LOGMQ_FUZZ_SEED", "27")
    last = tmp_path / "last-input.bin"
    r = run_sanitized(
        ["-m", "fuzz.sanitized_driver", str(sanitized_codec), "--examples", str(examples),
         "--seed", seed, "--last", str(last)],
        timeout=3600 if examples > 1000 else 600,
    )  # fmt: skip
    reports = [s for s in SANITIZER_REPORTS if s in r.stderr]
    if r.returncode != 0 or reports:
        held = last.read_bytes().hex() if last.exists() else "?"
        pytest.fail(
            f"exit status {r.returncode}, reports {reports}\nlast input: {held}\n"
            f"stdout tail:\n{r.stdout[-2000:]}\nstderr tail:\n{r.stderr[-6000:]}"
        )
    assert f"{examples} hostile inputs: no finding" in r.stdout
    for name in regressions.CODEC:
        assert f"regression {name} ok" in r.stdout


IMPLS = [
    pytest.param(
        (_recordsv2.scan_batches, _recordsv2.batches_end, _recordsv2.take_records)
        if _recordsv2
        else None,
        id="c",
        marks=pytest.mark.skipif(_recordsv2 is None, reason="C extension not built"),
    ),
    pytest.param(
        (batch_scan.py_scan_batches, batch_scan.py_batches_end, batch_scan.py_take_records),
        id="python",
    ),
]
OVERFLOW = "offsets overflow: base offset 9223372036854775806, last offset delta 1"


@pytest.mark.parametrize("impl", IMPLS)
def test_a_next_offset_past_int64_ends_the_header_walk(impl):
    """Found by UBSan: batches_end summed base offset and last offset delta in int64."""
    _, batches_end, _ = impl
    valid = regressions.raw_batch([(0, 0, b"k", b"v", None)], base_offset=5, last_offset_delta=0)
    assert batches_end(valid, 0) == 6
    assert batches_end(regressions.CODEC["next-offset-overflow"], 0) == -1
    assert batches_end(valid + regressions.CODEC["next-offset-overflow"], 0) == 6


@pytest.mark.parametrize("impl", IMPLS)
def test_a_batch_whose_offsets_pass_int64_is_refused(impl):
    scan_batches, _, take_records = impl
    data = regressions.CODEC["batch-offsets-overflow"]
    assert scan_batches(data, 0, -1, -1, -1, True, False) == ([], 0, 0, OVERFLOW)
    assert take_records(data, 0, 0, 10, "t", 0, Record) == ([], 0, 0, OVERFLOW)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("record-offset-overflow", "record 0: offset delta 5 overflows the base offset"),
        ("record-timestamp-overflow", "record 0: timestamp delta 2 overflows the first timestamp"),
    ],
)
def test_a_record_whose_offset_or_timestamp_passes_int64_is_refused(impl, name, why):
    _, _, take_records = impl
    good = regressions.raw_batch([(0, 0, b"a", b"b", None)], base_offset=0, last_offset_delta=0)
    records, pos, position, stop = take_records(
        good + regressions.CODEC[name], 0, 0, 10, "t", 0, Record
    )
    assert [r[2] for r in records] == [0] and pos == len(good) and position == 1
    assert stop == f"cannot decode records: {why}"


@pytest.mark.parametrize("impl", IMPLS)
def test_a_batch_ending_below_int64_is_skipped_as_before_any_position(impl):
    _, _, take_records = impl
    data = regressions.CODEC["next-offset-underflow"]
    assert take_records(data, 0, 0, 10, "t", 0, Record) == ([], len(data), 0, "")
