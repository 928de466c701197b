"""What each fuzz target does with one input, and what counts as a finding.

Kept apart from the atheris entry points (``*_target.py``) so the tests can replay the
seed corpus and earlier findings without atheris installed.
"""

from __future__ import annotations

from fuzz import codec_inputs, remote_inputs
from logmq.errors import InvalidFrameError
from logmq.kafka.registry import kafka_wire
from logmq.net import codec as native_codec

try:
    from logmq.storage import _recordsv2
except ImportError:  # the optional extension did not build: nothing to fuzz
    _recordsv2 = None

_wire = kafka_wire()


def codec(data: bytes) -> None:
    """Every entry point of the C record codec (codec_inputs.exercise_fuzz_input)."""
    if _recordsv2 is None:
        raise RuntimeError("the C record codec (_recordsv2) is not built")
    codec_inputs.exercise_fuzz_input(_recordsv2, data)


def kafka(data: bytes) -> None:
    """A Kafka request frame (after its size prefix). Only an InvalidFrameError, which
    the listener answers and keeps the connection, may come out; a crash (kio's native
    reader aborted on a huge array count before the decoder checked counts itself) or
    any other exception is a finding."""
    try:
        _wire.decode_request(memoryview(data))
    except InvalidFrameError:
        pass
    _wire.peek_correlation_id(memoryview(data))


def native(data: bytes) -> None:
    """A native frame (after its size prefix), read as a request (the broker's side) and
    as a response (a client's side). Only InvalidFrameError may come out."""
    for decode in (native_codec.decode_request, native_codec.decode_response):
        try:
            decode(memoryview(data))
        except InvalidFrameError:
            pass
    native_codec.peek_correlation_id(data)


def remote(data: bytes) -> None:
    """Tiered storage's parsers of untrusted bytes (metadata records and snapshots, the
    remote store's objects, the native tiered-storage bodies): the first byte picks one
    (remote_inputs.py says which, and what each may raise)."""
    remote_inputs.exercise(data)


CHECKS = {"codec": codec, "kafka": kafka, "native": native, "remote": remote}


def main(argv: list[str]) -> int:
    """``python -m fuzz.checks TARGET PATH...``: run each file (or each file of each
    folder) through TARGET's check, without atheris; exit status 0 when nothing fails."""
    from pathlib import Path

    check = CHECKS[argv[0]]
    paths = [Path(p) for p in argv[1:]]
    files = sorted(f for p in paths for f in (p.iterdir() if p.is_dir() else [p]))
    for f in files:
        check(f.read_bytes())
    print(f"{len(files)} inputs: no finding")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
