"""Small crash-safe files: offset checkpoints, the clean-shutdown marker, overrides.

Every write goes to a temp file that is fsynced, renamed over the target, and then
the directory is fsynced: after a crash a reader sees either the old or the new file,
never a torn one. Offset checkpoints use Kafka's text layout (version, count, one
``topic partition offset`` line each) so they are easy to inspect by hand.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from logmq.errors import StorageError

CHECKPOINT_VERSION = 0

# Indirection so tests that simulate crashes by editing files can skip real fsyncs.
fsync = os.fsync
fdatasync = os.fdatasync


def fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync(fd)
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


def write_offsets(path: str | Path, offsets: dict[tuple[str, int], int]) -> None:
    lines = [str(CHECKPOINT_VERSION), str(len(offsets))]
    lines += [f"{t} {p} {o}" for (t, p), o in sorted(offsets.items())]
    atomic_write(path, ("\n".join(lines) + "\n").encode())


def read_offsets(path: str | Path) -> dict[tuple[str, int], int]:
    """Read a checkpoint; a missing file is empty, a malformed one is a StorageError."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return {}
    lines = text.splitlines()
    try:
        if int(lines[0]) != CHECKPOINT_VERSION:
            raise ValueError(f"unknown version {lines[0]}")
        count = int(lines[1])
        out: dict[tuple[str, int], int] = {}
        for line in lines[2 : 2 + count]:
            topic, part, off = line.rsplit(" ", 2)
            out[(topic, int(part))] = int(off)
        if len(out) != count:
            raise ValueError(f"expected {count} entries, found {len(out)}")
        return out
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
