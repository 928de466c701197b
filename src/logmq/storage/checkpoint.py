"""Small crash-safe files: offset checkpoints, the clean-shutdown marker, overrides.

Every write goes to a temp file that is fsynced, renamed over the target, and then
the directory is fsynced: after a crash a reader sees either the old or the new file,
never a torn one. Offset checkpoints use Kafka's text layout (version, count, one
``topic partition offset`` line each) so they are easy to inspect by hand.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from logmq.errors import StorageError

CHECKPOINT_VERSION = 0
POSITIONS_VERSION = 1  # offset lines carry the active segment's base and size too
_NO_POSITION = (-1, -1)

# Indirection so tests that simulate crashes by editing files can skip real fsyncs.
fsync = os.fsync
fdatasync = os.fdatasync


def fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync(fd)
    finally:
        os.close(fd)


def read_small(path: str | Path) -> bytes:
    """A small file's bytes with three system calls (no buffered file object): start-up
    reads several per partition."""
    fd = os.open(path, os.O_RDONLY)
    try:
        parts = []
        while chunk := os.read(fd, 1 << 16):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new content."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        # ENOSPC and friends: the old file stays as it was, and the partial temp file
        # goes so it holds no space (readers and the next start ignore it anyway).
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_offsets(
    path: str | Path,
    offsets: dict[tuple[str, int], int],
    positions: Mapping[tuple[str, int], tuple[int, int]] | None = None,
) -> None:
    """Write an offset checkpoint; with ``positions``, version 1 (two more columns).

    ``positions``: per partition, the base offset and size in bytes of its active
    segment at the offset (-1 -1 where unknown): recovery-point-checkpoint's way of
    saying "the log ended here", so a start needs no scan to know it (log_loader.py).
    """
    if positions is None:
        lines = [str(CHECKPOINT_VERSION), str(len(offsets))]
        lines += [f"{t} {p} {o}" for (t, p), o in sorted(offsets.items())]
    else:
        lines = [str(POSITIONS_VERSION), str(len(offsets))]
        for (t, p), o in sorted(offsets.items()):
            base, pos = positions.get((t, p), _NO_POSITION)
            lines.append(f"{t} {p} {o} {base} {pos}")
    atomic_write(path, ("\n".join(lines) + "\n").encode())


def read_offsets(path: str | Path) -> dict[tuple[str, int], int]:
    """Read a checkpoint; a missing file is empty, a malformed one is a StorageError."""
    return read_offsets_and_positions(path)[0]


def read_offsets_and_positions(
    path: str | Path,
) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], tuple[int, int]]]:
    """Offsets and (version 1 only) the known (segment base, size) positions."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return {}, {}
    lines = text.splitlines()
    try:
        version = int(lines[0])
        if version not in (CHECKPOINT_VERSION, POSITIONS_VERSION):
            raise ValueError(f"unknown version {lines[0]}")
        count = int(lines[1])
        out: dict[tuple[str, int], int] = {}
        positions: dict[tuple[str, int], tuple[int, int]] = {}
        for line in lines[2 : 2 + count]:
            if version == CHECKPOINT_VERSION:
                topic, part, off = line.rsplit(" ", 2)
            else:
                topic, part, off, base, pos = line.rsplit(" ", 4)
                if int(base) >= 0 and int(pos) >= 0:
                    positions[(topic, int(part))] = (int(base), int(pos))
            out[(topic, int(part))] = int(off)
        if len(out) != count:
            raise ValueError(f"expected {count} entries, found {len(out)}")
        return out, positions
    except (ValueError, IndexError) as e:
        raise StorageError(f"malformed checkpoint file {path}: {e}") from None


def write_json(path: str | Path, value: object) -> None:
    atomic_write(path, json.dumps(value, sort_keys=True).encode())


def read_json(path: str | Path, default: object) -> object:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return default
    except ValueError as e:
        raise StorageError(f"malformed file {path}: {e}") from None
