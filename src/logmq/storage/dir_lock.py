"""The data directory's lock: one broker process per data dir, like Kafka's ``.lock``.

Two brokers on one directory would both recover, append to and checkpoint the same
files, and each would write ``.clean-shutdown`` at its own stop: silent corruption. A
broker therefore takes an exclusive ``flock`` on ``DATA_DIR/.lock`` before it reads or
writes anything else there, holds it for the life of the process, and writes its pid
into the file so that a refused second start can name the holder.

``flock`` rather than a pid file alone: the kernel drops the lock when the holder exits
in any way (kill -9 included), so a stale file never blocks a restart. The file stays
on disk after release; deleting it would let a third process lock a new inode while a
second still holds the old one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from logmq.errors import LogMQError

LOCK_FILE = ".lock"


class DataDirLockedError(LogMQError):
    """Another process holds the data directory's lock."""

    def __init__(self, data_dir: Path, holder_pid: int | None):
        self.holder_pid = holder_pid
        who = f"pid {holder_pid}" if holder_pid is not None else "an unknown pid"
        super().__init__(
            f"data dir {data_dir} is in use by another logmq-server ({who}; lock file "
            f"{data_dir / LOCK_FILE}): stop it first or give this one another --data-dir"
        )


class DataDirLock:
    """An exclusive, non-blocking lock on one data directory, held until ``release``."""

    def __init__(self, data_dir: str | os.PathLike[str]):
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise DataDirLockedError at once (never waits)."""
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise DataDirLockedError(self.data_dir, holder) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # the pid is only for the message; the lock itself is held
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (closing the descriptor unlocks); a second call does nothing."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> DataDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    """The holder's pid as it wrote it; None while it has not yet (a start in progress)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
