"""The records section codec of an uncompressed RecordBatch v2, compiled when possible.

``encode_rows``, ``encode_values`` and ``decode_rows`` come from the C extension
``_recordsv2`` because the per-record loop is the producer's and the consumer's hot path
and the same loop in Python (zigzag varints byte by byte) is 35-60x slower. When the
extension did not build (it is optional in setup.py) the pure-Python ``records_py`` stands
in, with the same behaviour; ``COMPILED`` tells which one is in use.
"""

from __future__ import annotations

try:
    from logmq.storage._recordsv2 import decode_rows, encode_rows, encode_values

    COMPILED = True
except ImportError:  # the optional extension did not build
    from logmq.storage.records_py import decode_rows, encode_rows, encode_values

    COMPILED = False

__all__ = ["COMPILED", "decode_rows", "encode_rows", "encode_values"]
