"""Hostile inputs for the record codec (``_recordsv2``) and the calls that feed them.

Shared by the sanitizer driver (hypothesis-built inputs) and the atheris target
(coverage-guided inputs): valid batches made with the project's own encoder, mutations
of them (bit flips, cuts, lying lengths and counts, overlong and extreme varints, int32
and int64 extremes in header fields, runs of 0x00/0xff), and ``exercise``, which hands
one input to every entry point of the module and checks what comes back.
"""

from __future__ import annotations

import ctypes
import random
import struct
import tempfile
from pathlib import Path
from typing import Any

from logmq.errors import LogMQError
from logmq.records import Record
from logmq.storage import batch as b
from logmq.storage import batch_scan, records_py

INT32 = (-(2**31), -(2**31) + 1, -2, -1, 0, 1, 2, 7, 49, 2**31 - 13, 2**31 - 12, 2**31 - 1)
INT64 = (-(2**63), -(2**63) + 1, -1, 0, 1, 2**31, 2**62, 2**63 - 2, 2**63 - 1)
# header fields (position, struct format): base offset, length, leader epoch, magic,
# crc, attributes, last offset delta, first/max timestamp, producer id/epoch, sequence,
# record count
FIELDS = ((0, ">q"), (8, ">i"), (12, ">i"), (16, ">b"), (17, ">I"), (21, ">h"), (23, ">i"),
          (27, ">q"), (35, ">q"), (43, ">q"), (51, ">h"), (53, ">i"), (57, ">i"))  # fmt: skip
CODECS = (b.Compression.NONE, b.Compression.GZIP, b.Compression.SNAPPY, b.Compression.LZ4,
          b.Compression.ZSTD)  # fmt: skip


def zigzag_varint(v: int) -> bytes:
    u = ((v << 1) ^ (v >> 63)) & (2**64 - 1)
    out = bytearray()
    while u >= 0x80:
        out.append(u & 0x7F | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


# varints a record may lie with: extremes, -1 (null), overlong and unterminated forms
VARINTS = (
    *(zigzag_varint(v) for v in (*INT32, *INT64)),
    b"\x80\x80\x80\x80\x00",
    b"\xff\xff\xff\xff\x0f",
    b"\xff\xff\xff\xff\x7f",
    b"\xff" * 9 + b"\x01",
    b"\xff" * 10,
    b"\x80" * 11,
)


def batch(rnd: random.Random, codec: int | None = None, base_offset: int = 0) -> bytes:
    """A valid batch of a few records (keys, values, headers may be null or empty)."""

    def data() -> bytes | None:
        k = rnd.randrange(6)
        return None if k == 0 else b"" if k == 1 else rnd.randbytes(rnd.randrange(1, 40))

    n = rnd.randrange(1, 6)
    ts = rnd.choice((0, 1_700_000_000_000, 2**62))
    recs = []
    for _ in range(n):
        hs = [(f"h{i}", data()) for i in range(rnd.randrange(3))]
        recs.append((ts + rnd.randrange(-5, 100), data(), data(), hs or None))
    gaps = rnd.random() < 0.3
    deltas = sorted(rnd.sample(range(3 * n), n)) if gaps else None
    return b.encode_batch(
        recs,
        compression=rnd.choice(CODECS) if codec is None else codec,
        base_offset=base_offset,
        leader_epoch=rnd.randrange(3),
        producer_id=rnd.choice((-1, 7)),
        offset_deltas=deltas,
    )


def log(rnd: random.Random) -> bytes:
    """A few batches with chained offsets, as a log or a fetch response holds them."""
    out, offset = bytearray(), rnd.choice((0, 100, 2**62))
    for _ in range(rnd.randrange(1, 4)):
        one = batch(rnd, base_offset=offset)
        offset += struct.unpack_from(">i", one, 23)[0] + 1
        out += one
    return bytes(out)


def fix_crc(buf: bytearray, pos: int = 0) -> None:
    """Recompute the CRC of the batch at ``pos`` when its length fits the buffer, so the
    mutation reaches the checks behind the CRC."""
    if len(buf) - pos < b.HEADER_SIZE:
        return
    size = struct.unpack_from(">i", buf, pos + 8)[0] + b.LOG_OVERHEAD
    if b.HEADER_SIZE <= size <= len(buf) - pos:
        crc = b.crc32c(memoryview(buf)[pos + 21 : pos + size])
        struct.pack_into(">I", buf, pos + 17, crc)


def fix_length(buf: bytearray, pos: int = 0) -> None:
    """Make the batch at ``pos`` claim exactly the rest of the buffer."""
    if len(buf) - pos >= b.HEADER_SIZE:
        struct.pack_into(">i", buf, pos + 8, len(buf) - pos - b.LOG_OVERHEAD)


def mutate(buf: bytearray, rnd: random.Random) -> None:
    """One random mutation, in place."""
    n = len(buf)
    op = rnd.randrange(9)
    if op == 0 and n:  # flip a bit
        buf[rnd.randrange(n)] ^= 1 << rnd.randrange(8)
    elif op == 1 and n:  # cut short
        del buf[rnd.randrange(n) :]
    elif op == 2 and n >= b.HEADER_SIZE:  # a header field set to an extreme
        pos, fmt = rnd.choice(FIELDS)
        if fmt == ">q":
            v = rnd.choice(INT64)
        elif fmt == ">b":
            v = rnd.choice((-128, -1, 0, 1, 2, 3, 127))
        elif fmt == ">h":
            v = rnd.choice((-32768, -1, 0, 1, 4, 5, 7, 8, 32767))
        elif fmt == ">I":
            v = rnd.randrange(2**32)
        else:
            v = rnd.choice(INT32)
        struct.pack_into(fmt, buf, pos, v)
    elif op == 3 and n >= b.HEADER_SIZE:  # a record count that lies
        struct.pack_into(">i", buf, 57, rnd.choice((*INT32, rnd.randrange(1, 40))))
    elif op == 4 and n:  # a varint that lies, written over or inserted
        where = rnd.randrange(b.HEADER_SIZE if n > b.HEADER_SIZE else 0, n)
        v = rnd.choice(VARINTS)
        if rnd.random() < 0.5:
            buf[where : where + len(v)] = v
        else:
            buf[where:where] = v
    elif op == 5 and n:  # a run of 0x00 or 0xff
        where = rnd.randrange(n)
        buf[where : where + rnd.randrange(1, 16)] = bytes([rnd.choice((0, 0xFF))]) * 15
    elif op == 6:  # random bytes inserted
        where = rnd.randrange(n + 1)
        buf[where:where] = rnd.randbytes(rnd.randrange(1, 8))
    elif op == 7 and n > 1:  # a span deleted
        where = rnd.randrange(n)
        del buf[where : where + rnd.randrange(1, 8)]
    elif n:  # a span duplicated (e.g. a record repeated)
        where = rnd.randrange(n)
        buf[where:where] = buf[where : where + rnd.randrange(1, 32)]


def hostile(rnd: random.Random) -> bytes:
    """A valid log, then one to four mutations, with the CRC (and length) often fixed."""
    buf = bytearray(log(rnd) if rnd.random() < 0.5 else batch(rnd))
    for _ in range(rnd.randrange(1, 5)):
        mutate(buf, rnd)
    if rnd.random() < 0.3:
        fix_length(buf)
    if rnd.random() < 0.7:
        fix_crc(buf)
    return bytes(buf)


def tight(data: bytes) -> memoryview:
    """``data`` at the very end of its own heap block, so a read past it hits
    AddressSanitizer's redzone (a bytes object keeps a NUL after its data, and ctypes
    keeps arrays of up to 16 bytes inside the object)."""
    pad = 32
    block = (ctypes.c_char * (pad + len(data)))()
    ctypes.memmove(ctypes.addressof(block) + pad, data, len(data))
    return memoryview(block).cast("B")[pad:]


def _decode(fn: Any, buf: Any, count: int) -> tuple[str, Any]:
    try:
        return "ok", fn(buf, count)
    except ValueError as e:  # the only error a malformed records section may raise
        return "error", str(e)


def exercise(mod: Any, data: bytes, rnd: random.Random) -> None:
    """Feed ``data`` to every entry point of ``mod`` (the C module); the pure-Python
    versions must agree where the two promise the same result. Raises AssertionError
    (or an unexpected exception) on a finding."""
    buf = tight(data)
    n = len(data)
    # CRC-32C: the SSE4.2 path and the tables agree
    assert mod.crc32c(buf) == mod.crc32c(buf, False) == b.crc32c(data)
    # a records section on its own, and one behind a batch header
    for part in (data, data[b.HEADER_SIZE :]):
        for count in {0, 1, 2, rnd.choice((3, 5, 50)), len(part) // 7, len(part) // 7 + 1}:
            c = _decode(mod.decode_rows, tight(part), count)
            assert c == _decode(records_py.decode_rows, part, count), (part, count)
            if c[0] == "ok":  # what decodes, encodes back to the same rows
                assert mod.decode_rows(mod.encode_rows(c[1]), count) == c[1]
                values = [row[3] for row in c[1]]
                keys = [row[2] for row in c[1]]
                again = mod.decode_rows(mod.encode_values(values, keys), len(values))
                assert [(r[2], r[3]) for r in again] == list(zip(keys, values, strict=True))
    # a compressed first batch's records, inflated (within a budget) as a consumer does
    try:
        h = b.validate(data, 0, contiguous=False)
        payload = b.decompress(h.compression, memoryview(data)[b.HEADER_SIZE : h.size], 1 << 20)
    except (LogMQError, ValueError):
        payload = None
    if payload is not None and h.compression:
        payload = bytes(payload)
        c = _decode(mod.decode_rows, tight(payload), h.record_count)
        assert c == _decode(records_py.decode_rows, payload, h.record_count), payload
    # whole batches: scan (log recovery), end (a consumer's next offset), take (records)
    pos = rnd.choice((0, 0, 0, rnd.randrange(n + 1)))
    end = rnd.choice((-1, n, rnd.randrange(n + 1), n + 5))
    expect = rnd.choice((-1, 0, rnd.randrange(2**63)))
    epoch = rnd.choice((-1, 0, 2**31 - 1))
    gaps, contiguous = rnd.random() < 0.5, rnd.random() < 0.5
    args = (pos, end, expect, epoch, gaps, contiguous, rnd.choice((0, 4096)))
    if 0 <= pos <= (n if end < 0 or end > n else end):
        assert mod.scan_batches(buf, *args) == batch_scan.py_scan_batches(data, *args)
    else:
        for fn, d in ((mod.scan_batches, buf), (batch_scan.py_scan_batches, data)):
            try:
                fn(d, *args)
            except ValueError:
                pass
            else:
                raise AssertionError("a position outside the buffer was accepted")
    at = rnd.choice((0, 0, rnd.randrange(n + 1), -1, n + 3))
    last = mod.batches_end(buf, at)
    if at >= 0:  # (Python would index a negative position from the end)
        assert last == batch_scan.py_batches_end(data, at), (at, last)
    position = rnd.choice((0, 0, -1, 2**62, rnd.randrange(200), 2**63 - 1, -(2**63)))
    most = rnd.choice((1, 3, 1000, 0, -1))
    taken = mod.take_records(buf, at, position, most, "t", 0, Record)
    if at >= 0 and taken[3] in ("", "compressed"):
        theirs = batch_scan.py_take_records(data, at, position, most, "t", 0, Record)
        if theirs[3] in ("", "compressed"):  # C skips records before position unread
            assert taken == theirs, (taken, theirs)


def exercise_fuzz_input(mod: Any, data: bytes) -> None:
    """``exercise`` on an atheris input: a flags byte, then a buffer of batches. Flags
    bit 0: make the first batch's length claim the whole buffer; bit 1: recompute its CRC,
    so mutations reach the record parser behind the checksum; the rest seeds the choice
    of positions and counts."""
    if not data:
        return
    flags, buf = data[0], bytearray(data[1:])
    if flags & 1:
        fix_length(buf)
    if flags & 2:
        fix_crc(buf)
    exercise(mod, bytes(buf), random.Random(flags >> 2))


def exercise_make_log_dirs(mod: Any) -> None:
    """``make_log_dirs`` takes paths from the broker, not bytes from outside: only its
    argument checks and one real call are exercised."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp, "t-0")
        mod.make_log_dirs([bytes(d)], [bytes(d / "0.log")])
        mod.make_log_dirs([bytes(d)], [bytes(d / "0.log")])  # exists: no error
        assert (d / "0.log").exists()
        for bad in (([b"x"], []), ([b"x"], ["y"]), ("x", [])):
            try:
                mod.make_log_dirs(*bad)
            except (TypeError, ValueError):
                pass
            else:
                raise AssertionError(f"make_log_dirs{bad!r} was accepted")
