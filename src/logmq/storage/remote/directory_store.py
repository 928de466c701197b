"""A remote store that is a directory: a mounted NFS/NAS volume shared by the brokers.

The analogue of Kafka's LocalTieredStorage and Aiven's FileSystemStorage: the object
``key`` is the file ``root/key``. Every broker of a cluster may write below the same root,
so an object appears only whole: it is written to a uniquely named file in
``root/.logmq-tmp/``, fsynced, renamed onto its key and the key's directory fsynced; a
crash leaves at most a temp file, never half an object under the real key. File work
runs on a small thread pool of the store's own, so neither the event loop nor the loop's
default executor waits on a slow or hung mount.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from logmq.storage.remote.keys import RESERVED_FIRST_PART, validate_key, validate_prefix
from logmq.storage.remote.store import RemoteObjectNotFound, RemoteStorageError, RemoteStore

T = TypeVar("T")

ROOT_SETTING = "rsm.config.storage.root"
_COPY_CHUNK = 1 << 20
_STALE_TEMP_S = 3600.0  # another broker's write in flight is never this old
# errors no retry can mend: the mount is read-only or refuses us
_PERMANENT_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


class DirectoryStore(RemoteStore):
    """Objects as files below ``root`` (which must exist: a mount is not ours to create)."""

    def __init__(self, root: Path, *, max_threads: int = 4) -> None:
        self._root = Path(root)
        self._tmp = self._root / RESERVED_FIRST_PART
        self._pool = ThreadPoolExecutor(max_threads, thread_name_prefix="logmq-dirstore")
        self._closed = False

    @property
    def root(self) -> Path:
        return self._root

    def __repr__(self) -> str:
        return f"DirectoryStore({str(self._root)!r})"

    # -- the thread hop ----------------------------------------------------------

    async def _run(self, what: str, key: str, fn: Callable[[], T]) -> T:
        if self._closed:
            raise RemoteStorageError(f"{self!r} is closed", retriable=False)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._mapped, what, key, fn)

    def _mapped(self, what: str, key: str, fn: Callable[[], T]) -> T:
        """``fn()`` with its OSError as a RemoteStorageError (in the thread: even telling
        the cases apart touches the mount, which may hang)."""
        try:
            return fn()
        except RemoteStorageError:
            raise
        except OSError as exc:
            if exc.errno in _PERMANENT_ERRNOS or not self._root.is_dir():
                raise self._root_error(f"{what} {key!r}", exc) from exc
            if isinstance(exc, FileNotFoundError) or (
                what == "get" and isinstance(exc, NotADirectoryError | IsADirectoryError)
            ):
                raise RemoteObjectNotFound(f"{what} {key!r}: no such object in {self!r}") from exc
            if isinstance(exc, NotADirectoryError | IsADirectoryError | FileExistsError):
                # S3 holds "a" and "a/b" side by side; a directory cannot
                raise RemoteStorageError(
                    f"{what} {key!r} in {self!r}: a file and a folder would share a name ({exc})",
                    retriable=False,
                ) from exc
            # EIO, ENOSPC, ESTALE, ETIMEDOUT...: an NFS server may come back, space be freed
            raise RemoteStorageError(f"{what} {key!r} in {self!r} failed: {exc}") from exc

    def _root_error(self, what: str, exc: BaseException) -> RemoteStorageError:
        return RemoteStorageError(
            f"{what}: the remote storage directory {str(self._root)!r} "
            f"({ROOT_SETTING}) is missing, not a directory or not writable: {exc}",
            retriable=False,
        )

    def _path(self, key: str) -> Path:
        return self._root.joinpath(*validate_key(key).split("/"))

    # -- writes ------------------------------------------------------------------

    def _temp_file(self) -> Path:
        self._tmp.mkdir(exist_ok=True)
        return self._tmp / f"{os.getpid()}-{uuid.uuid4().hex}"

    def _publish(self, tmp: Path, dest: Path) -> None:
        """Rename the finished temp file onto its key, durably."""
        for attempt in range(3):
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(tmp, dest)
                break
            except FileNotFoundError:
                # a concurrent delete pruned the now-empty key directory: make it again
                if attempt == 2 or not tmp.exists():
                    raise
        _fsync_dir(dest.parent)

    def _write(self, key: str, fill: Callable[[int], int]) -> int:
        dest = self._path(key)
        tmp = self._temp_file()
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                size = fill(fd)
                os.fsync(fd)
            finally:
                os.close(fd)
            self._publish(tmp, dest)
            return size
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise

    async def put_file(self, key: str, path: Path) -> int:
        validate_key(key)

        def fill(fd: int) -> int:
            try:
                src = open(path, "rb")  # noqa: SIM115 (closed below, inside the thread)
            except FileNotFoundError as exc:
                raise RemoteStorageError(
                    f"put {key!r}: the local file {str(path)!r} is gone", retriable=False
                ) from exc
            with src, open(fd, "wb", closefd=False) as dst:
                shutil.copyfileobj(src, dst, _COPY_CHUNK)  # sendfile on Linux
                return dst.tell()

        return await self._run("put", key, lambda: self._write(key, fill))

    async def put_bytes(self, key: str, data: bytes) -> None:
        validate_key(key)
        view = memoryview(data)

        def fill(fd: int) -> int:
            done = 0
            while done < len(view):
                done += os.write(fd, view[done:])
            return done

        await self._run("put", key, lambda: self._write(key, fill))

    # -- reads -------------------------------------------------------------------

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        path = self._path(key)
        if start < 0 or end < start:
            raise RemoteStorageError(f"get {key!r}: bad range [{start}, {end})", retriable=False)

        def read() -> bytes:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                stop = min(end, size)  # never allocate more than the object holds
                if stop <= start:
                    return b""
                f.seek(start)
                return f.read(stop - start)

        return await self._run("get", key, read)

    async def get(self, key: str) -> bytes:
        path = self._path(key)
        return await self._run("get", key, path.read_bytes)

    async def list(self, prefix: str) -> AsyncIterator[str]:
        validate_prefix(prefix)
        keys = await self._run("list", prefix, lambda: self._list(prefix))
        for key in keys:
            yield key

    def _list(self, prefix: str) -> list[str]:
        head, _, name_start = prefix.rpartition("/")
        base = self._root.joinpath(*head.split("/")) if head else self._root
        if not self._root.is_dir():
            raise FileNotFoundError(errno.ENOENT, "no remote storage root", str(self._root))
        found: list[str] = []
        try:
            entries = list(os.scandir(base))
        except (FileNotFoundError, NotADirectoryError):
            return found
        for entry in entries:
            if not entry.name.startswith(name_start):
                continue
            if not head and entry.name == RESERVED_FIRST_PART:
                continue
            rel = f"{head}/{entry.name}" if head else entry.name
            if entry.is_dir(follow_symlinks=False):
                for dirpath, _dirs, files in os.walk(entry.path):
                    sub = os.path.relpath(dirpath, self._root).replace(os.sep, "/")
                    found.extend(f"{sub}/{f}" for f in files)
            else:
                found.append(rel)
        found.sort()  # key order: a walk's order is not ("a/b" sorts after "a-c")
        return found

    # -- deletes -----------------------------------------------------------------

    async def delete(self, keys: list[str]) -> None:
        paths = [self._path(k) for k in keys]  # all checked before any is deleted
        if paths:
            await self._run("delete", keys[0], lambda: self._delete(paths))

    def _delete(self, paths: list[Path]) -> None:
        parents: set[Path] = set()
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            parents.add(path.parent)
        # prune directories the deletes emptied (a partition's folder once all is gone)
        for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
            while parent != self._root and self._root in parent.parents:
                try:
                    parent.rmdir()
                except OSError:
                    break  # not empty (or just refilled by another writer)
                parent = parent.parent

    # -- lifecycle ---------------------------------------------------------------

    async def check(self) -> None:
        await self._run("check", "", self._check)

    def _check(self) -> None:
        if not self._root.is_dir():
            raise self._root_error("check", FileNotFoundError(str(self._root)))
        try:
            probe = self._temp_file()
            with open(probe, "wb") as f:
                f.write(b"logmq")
                os.fsync(f.fileno())
            probe.unlink()
        except OSError as exc:
            raise self._root_error("check", exc) from exc
        # temp files of writes that crashed long ago (young ones may be another broker's)
        now = time.time()
        with contextlib.suppress(OSError):
            for entry in os.scandir(self._tmp):
                with contextlib.suppress(OSError):
                    if now - entry.stat().st_mtime > _STALE_TEMP_S:
                        os.unlink(entry.path)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown, True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
