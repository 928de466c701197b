"""atheris target: the native door's msgpack frame decoder (net/codec.py).

A frame is what follows the 4-byte size prefix; checks.native says what is a finding.
Run through ``python -m fuzz.run native`` (docs/testing.md, "Fuzzing").
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["logmq", "fuzz"]):
    from fuzz.checks import native as test_one_input


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
