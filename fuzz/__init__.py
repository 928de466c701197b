"""Fuzzing of the decoders that read untrusted bytes (docs/testing.md, "Fuzzing").

Not installed with logmq: run from a checkout, e.g. ``python -m fuzz.codec_target``.
"""
