"""atheris target: tiered storage's parsers of untrusted bytes (fuzz/remote_inputs.py).

The first byte picks the parser; checks.remote says what is a finding.
Run through ``python -m fuzz.run remote`` (docs/testing.md, "Fuzzing").
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["logmq", "fuzz"]):
    from fuzz.checks import remote as test_one_input


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
