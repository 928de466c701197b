"""Small crash-safe files: offset checkpoints, the clean-shutdown marker, overrides.

Every write goes to a temp file that is fsynced, renamed over the target, and then
the directory is fsynced: after a crash a reader sees either the old or the new file,
never a torn one. Offset checkpoints use Kafka's text layout (version, count, one
``topic partition offset`` line each) so they are easy to inspect by hand.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
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
    try:
        _write_file(tmp, data, sync=True)
        os.replace(tmp, path)
    except BaseException:
        # ENOSPC and friends: the old file stays as it was, and the partial temp file
        # goes so it holds no space (readers and the next start ignore it anyway).
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


# Fewer files than this are each fsynced (atomic_write_many).
SYNCFS_MIN_FILES = 32


@cache
def _libc_syncfs() -> Callable[[int], int] | None:
    """syncfs(2) where it reports write-back errors (Linux 5.8 and later), else None."""
    if sys.platform != "linux":
        return None
    try:
        major, minor = (int(x) for x in platform.release().split(".")[:2])
    except ValueError:
        return None
    if (major, minor) < (5, 8):  # older kernels' syncfs says nothing of failed writes
        return None
    import ctypes  # only here: nothing else in the broker needs it

    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int

    def call(fd: int) -> int:
        return 0 if fn(fd) == 0 else ctypes.get_errno()

    return call


def syncfs(fd: int) -> None:
    """Write back everything dirty in the file system holding ``fd``; raises OSError if
    any write-back there failed since ``fd`` was opened."""
    fn = _libc_syncfs()
    assert fn is not None
    err = fn(fd)
    if err:
        raise OSError(err, os.strerror(err))


def atomic_write_many(
    items: Sequence[tuple[str | Path, bytes]], directory: str | Path, *, workers: int = 16
) -> dict[int, OSError]:
    """``atomic_write`` for many files on the file system of ``directory``, with two
    file-system syncs in all instead of two fsyncs per file.

    A clean stop with 10,000 partitions writes an epoch checkpoint and a producer
    snapshot for each: 40,000 fsyncs, 9 to 14 s here. Instead every temp file is written
    (by ``workers`` threads), one ``syncfs`` makes them durable, the renames follow, and
    a second makes those durable: no target is replaced before its new content is on
    disk, as with ``atomic_write``. The sync's descriptor is opened before the first
    write, so a failed write-back of any of them is reported. Without such a syncfs (not Linux, or
    a kernel before 5.8) each file goes through ``atomic_write``, and so do fewer than
    ``SYNCFS_MIN_FILES``: a syncfs also writes back whatever else is dirty on that file
    system, worth it only against many fsyncs.

    Returns the items that failed, by index (the others are durably replaced); raises
    OSError if a sync fails (then no target was replaced).
    """
    failed: dict[int, OSError] = {}
    if len(items) < SYNCFS_MIN_FILES or _libc_syncfs() is None:
        for i, (path, data) in enumerate(items):
            try:
                atomic_write(path, data)
            except OSError as e:
                failed[i] = e
        return failed
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        targets = [os.fspath(path) for path, _ in items]
        chunks = [range(i, min(i + 64, len(items))) for i in range(0, len(items), 64)]

        def write_chunk(chunk: range) -> list[tuple[int, OSError]]:
            errors = []
            for i in chunk:
                try:
                    _write_file(targets[i] + ".tmp", items[i][1])
                except OSError as e:
                    errors.append((i, e))
                    _unlink_quietly(targets[i] + ".tmp")
            return errors

        # Side by side: making a file costs 0.1-0.5 ms of file-system work on some
        # machines, and different directories' creations proceed in parallel.
        with ThreadPoolExecutor(workers, thread_name_prefix="atomic-write") as pool:
            for errors in pool.map(write_chunk, chunks):
                failed.update(errors)
        written = [(i, t + ".tmp", t) for i, t in enumerate(targets) if i not in failed]
        try:
            syncfs(fd)  # the new contents
        except OSError:
            for _, tmp, _ in written:
                _unlink_quietly(tmp)
            raise
        for i, tmp, target in written:
            try:
                os.replace(tmp, target)
            except OSError as e:
                failed[i] = e
                _unlink_quietly(tmp)
        syncfs(fd)  # the renames
    finally:
        os.close(fd)
    return failed


def _write_file(path: str | Path, data: bytes, *, sync: bool = False) -> None:
    """Write ``data`` as the whole of ``path`` (made or truncated); ``sync``: fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


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
