"""A remote store on S3 or any S3-compatible service (MinIO, Ceph RGW, R2, GCS's S3 API).

Built on aiobotocore (docs/design.md, "Remote tier: why aiobotocore"): its errors carry
S3's own code (``NoSuchBucket``, ``SignatureDoesNotMatch``...), which is what lets a
wrong setting be named in the error the broker logs at start.

One retry loop of ours wraps every request (botocore's own retries are off, so there is
one budget to reason about): a bounded number of attempts, each under its own timeout,
with exponential backoff and jitter between them, only for what may pass (unreachable,
timed out, 5xx, SlowDown). Large files go up in parts read one at a time from the file
(a few parts in flight at once), each with its MD5 so a part damaged on the way is
refused by the store rather than kept.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import logging
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import botocore.exceptions as bce
from aiobotocore.session import AioSession, get_session
from botocore.config import Config

from logmq.errors import InvalidConfigError
from logmq.storage.remote.keys import validate_key, validate_prefix
from logmq.storage.remote.s3_errors import (
    ACCESS_KEY_SETTING,
    BUCKET_SETTING,
    PART_SIZE_SETTING,
    SECRET_KEY_SETTING,
    TIMEOUT_SETTING,
    map_s3_error,
)
from logmq.storage.remote.store import RemoteStorageError, RemoteStore

log = logging.getLogger("logmq.storage.remote")

T = TypeVar("T")

MiB = 1 << 20
MIN_PART_SIZE = 5 * MiB  # S3's floor for every part but the last
MAX_PART_SIZE = 5 * 1024 * MiB
MAX_PARTS = 10_000
DELETE_BATCH = 1000  # DeleteObjects' limit


class S3Store(RemoteStore):
    """Objects ``prefix + key`` in one bucket.

    No credentials given: botocore's usual chain (environment, profile, container or
    instance role). ``region`` may be left out with a custom endpoint (``us-east-1``,
    what MinIO and most S3 clones expect).
    """

    def __init__(
        self,
        bucket: str,
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
        path_style: bool = False,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        prefix: str = "",
        multipart_threshold: int = 32 * MiB,
        part_size: int = 16 * MiB,
        upload_concurrency: int = 4,
        request_timeout_s: float = 30.0,
        connect_timeout_s: float = 10.0,
        max_attempts: int = 5,
        backoff_base_s: float = 0.1,
        backoff_max_s: float = 10.0,
        max_connections: int = 32,
        batch_delete: bool = True,
        max_get_bytes: int = 256 * MiB,
        rng: random.Random | None = None,
    ) -> None:
        if not bucket:
            raise InvalidConfigError(f"{BUCKET_SETTING} is required for the S3 store")
        if (access_key_id is None) != (secret_access_key is None):
            missing = ACCESS_KEY_SETTING if access_key_id is None else SECRET_KEY_SETTING
            raise InvalidConfigError(f"{missing} is missing (give both keys, or neither)")
        if not MIN_PART_SIZE <= part_size <= MAX_PART_SIZE:
            raise InvalidConfigError(
                f"{PART_SIZE_SETTING}={part_size}: S3 parts are {MIN_PART_SIZE}..{MAX_PART_SIZE}"
            )
        if multipart_threshold < 1 or upload_concurrency < 1 or max_attempts < 1:
            raise InvalidConfigError(
                "multipart threshold, upload concurrency and attempts must be >= 1"
            )
        if request_timeout_s <= 0 or connect_timeout_s <= 0:
            raise InvalidConfigError(f"{TIMEOUT_SETTING} must be > 0")
        prefix = validate_prefix(prefix)
        self._bucket = bucket
        self._prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self._endpoint_url = endpoint_url
        self._region = region or ("us-east-1" if endpoint_url else None)
        self._path_style = path_style
        self._credentials = (access_key_id, secret_access_key, session_token)
        self._threshold = multipart_threshold
        self._part_size = part_size
        self._upload_concurrency = upload_concurrency
        self._timeout_s = request_timeout_s
        self._connect_timeout_s = min(connect_timeout_s, request_timeout_s)
        self._max_attempts = max_attempts
        self._backoff_base_s = backoff_base_s
        self._backoff_max_s = backoff_max_s
        self._max_connections = max_connections
        self._batch_delete = batch_delete
        self._max_get_bytes = max_get_bytes
        self._rng = rng or random.Random()
        self._client: Any = None
        self._client_lock = asyncio.Lock()
        self._stack = contextlib.AsyncExitStack()
        self._closed = False

    def __repr__(self) -> str:
        where = self._endpoint_url or "AWS"
        return f"S3Store(s3://{self._bucket}/{self._prefix} at {where})"

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def prefix(self) -> str:
        return self._prefix

    # -- the client and the retry loop -------------------------------------------

    async def _get_client(self) -> Any:
        if self._client is not None:
            return self._client
        async with self._client_lock:
            if self._closed:
                raise RemoteStorageError(f"{self!r} is closed", retriable=False)
            if self._client is None:
                session = get_session()
                # botocore parses its JSON models synchronously: ~80 ms off the loop
                await asyncio.to_thread(_warm_loader, session)
                key_id, secret, token = self._credentials
                config = Config(
                    region_name=self._region,
                    signature_version="s3v4",
                    s3={
                        "addressing_style": "path" if self._path_style else "auto",
                        # no SHA-256 of each body on the loop (botocore does it for
                        # http endpoints): the signed Content-MD5 vouches for the body
                        "payload_signing_enabled": False,
                    },
                    connect_timeout=self._connect_timeout_s,
                    read_timeout=self._timeout_s,
                    retries={"total_max_attempts": 1},  # the retries are ours
                    max_pool_connections=self._max_connections,
                    tcp_keepalive=True,
                    # S3 clones (older MinIO, Ceph, GCS) refuse the newer default
                    # checksums; Content-MD5 covers the bodies instead
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                )
                try:
                    self._client = await self._stack.enter_async_context(
                        session.create_client(
                            "s3",
                            endpoint_url=self._endpoint_url,
                            aws_access_key_id=key_id,
                            aws_secret_access_key=secret,
                            aws_session_token=token,
                            config=config,
                        )
                    )
                except (ValueError, bce.BotoCoreError) as exc:
                    raise self._error(exc, "connect", "", 1) from exc
        return self._client

    def _backoff(self, attempt: int) -> float:
        """Exponential with jitter: half fixed, half random, so clients spread out."""
        ceiling = min(self._backoff_max_s, self._backoff_base_s * 2 ** (attempt - 1))
        return ceiling / 2 + self._rng.uniform(0, ceiling / 2)

    async def _call(self, op: str, key: str, request: Callable[[Any], Awaitable[T]]) -> T:
        """``request(client)``, each attempt bounded in time, retried while it may pass."""
        client = await self._get_client()
        attempt = 1
        while True:
            try:
                async with asyncio.timeout(self._timeout_s):
                    return await request(client)
            except Exception as exc:
                err = self._error(exc, op, key, attempt)
                if not err.retriable or attempt >= self._max_attempts:
                    if err is exc:
                        raise
                    raise err from exc
                delay = self._backoff(attempt)
                log.debug(
                    "%s %r: attempt %d failed (%s); again in %.2fs", op, key, attempt, exc, delay
                )
            attempt += 1
            await asyncio.sleep(delay)

    def _error(self, exc: BaseException, op: str, key: str, attempts: int) -> RemoteStorageError:
        return map_s3_error(
            exc,
            what=f"S3 {op} {key!r} in s3://{self._bucket}/{self._prefix}",
            attempts=attempts,
            bucket=self._bucket,
            endpoint_url=self._endpoint_url,
        )

    def _full(self, key: str) -> str:
        return self._prefix + validate_key(key)

    # -- writes ------------------------------------------------------------------

    async def put_bytes(self, key: str, data: bytes) -> None:
        full = self._full(key)
        md5 = await asyncio.to_thread(_md5, data) if len(data) > MiB else _md5(data)
        put = functools.partial(_put_object, Bucket=self._bucket, Key=full, Body=data, md5=md5)
        await self._call("put", key, put)

    async def put_file(self, key: str, path: Path) -> int:
        full = self._full(key)
        try:
            size = await asyncio.to_thread(os.path.getsize, path)
            if size < self._threshold:
                data, md5 = await asyncio.to_thread(_read_part, path, 0, size)
        except OSError as exc:
            raise RemoteStorageError(
                f"put {key!r}: cannot read the local file {str(path)!r}: {exc}", retriable=False
            ) from exc
        if size < self._threshold:
            put = functools.partial(_put_object, Bucket=self._bucket, Key=full, Body=data, md5=md5)
            await self._call("put", key, put)
        else:
            await self._multipart(key, full, path, size)
        return size

    async def _multipart(self, key: str, full: str, path: Path, size: int) -> None:
        part_size = max(self._part_size, -(-size // MAX_PARTS))
        count = -(-size // part_size)
        created = await self._call(
            "put",
            key,
            lambda c: c.create_multipart_upload(Bucket=self._bucket, Key=full),
        )
        upload_id = created["UploadId"]
        etags: list[str] = [""] * count
        numbers = iter(range(count))  # shared by the workers: each takes the next part

        async def worker() -> None:
            for i in numbers:
                offset = i * part_size
                try:
                    body, md5 = await asyncio.to_thread(
                        _read_part, path, offset, min(part_size, size - offset)
                    )
                except OSError as exc:
                    raise RemoteStorageError(
                        f"put {key!r}: reading the local file {str(path)!r}: {exc}",
                        retriable=False,
                    ) from exc
                upload = functools.partial(
                    _upload_part,
                    Bucket=self._bucket,
                    Key=full,
                    UploadId=upload_id,
                    PartNumber=i + 1,
                    Body=body,
                    md5=md5,
                )
                etags[i] = (await self._call("put", key, upload))["ETag"]

        try:
            try:
                async with asyncio.TaskGroup() as tg:
                    for _ in range(min(self._upload_concurrency, count)):
                        tg.create_task(worker())
            except BaseExceptionGroup as group:
                raise group.exceptions[0] from None
            parts = [{"ETag": e, "PartNumber": i + 1} for i, e in enumerate(etags)]
            await self._call(
                "put",
                key,
                lambda c: c.complete_multipart_upload(
                    Bucket=self._bucket,
                    Key=full,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                ),
            )
        except BaseException:
            await self._abort_upload(full, upload_id)
            raise

    async def _abort_upload(self, full: str, upload_id: str) -> None:
        """Best effort, one attempt: a bucket lifecycle rule should sweep what is left."""
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._client.abort_multipart_upload(
                    Bucket=self._bucket, Key=full, UploadId=upload_id
                )
        except Exception as exc:
            log.warning("S3 abort of upload %s of %r failed: %r", upload_id, full, exc)

    # -- reads -------------------------------------------------------------------

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        full = self._full(key)
        if start < 0 or end < start:
            raise RemoteStorageError(f"get {key!r}: bad range [{start}, {end})", retriable=False)
        # one byte at least, so a missing key is reported even for an empty range
        header = f"bytes={start}-{max(end - 1, start)}"

        async def request(client: Any) -> bytes:
            try:
                resp = await client.get_object(Bucket=self._bucket, Key=full, Range=header)
            except bce.ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "InvalidRange":
                    return b""  # start is at or past the end
                raise
            async with resp["Body"] as body:
                data = await body.read()
            if "ContentRange" not in resp:  # a store that ignored Range sent it all
                data = data[start:]
            return data[: end - start]

        return await self._call("get", key, request)

    async def get(self, key: str) -> bytes:
        full = self._full(key)

        async def request(client: Any) -> bytes:
            resp = await client.get_object(Bucket=self._bucket, Key=full)
            async with resp["Body"] as body:
                if int(resp.get("ContentLength") or 0) > self._max_get_bytes:
                    raise RemoteStorageError(
                        f"get {key!r}: {resp['ContentLength']} bytes is over the "
                        f"{self._max_get_bytes}-byte limit of a whole-object get",
                        retriable=False,
                    )
                return await body.read()

        return await self._call("get", key, request)

    async def list(self, prefix: str) -> AsyncIterator[str]:
        full = self._prefix + validate_prefix(prefix)
        cut = len(self._prefix)
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self._bucket, "Prefix": full}
            if token:
                kwargs["ContinuationToken"] = token
            page = await self._call("list", prefix, functools.partial(_list_page, kwargs=kwargs))
            for obj in page.get("Contents", ()):
                yield obj["Key"][cut:]
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    # -- deletes -----------------------------------------------------------------

    async def delete(self, keys: list[str]) -> None:
        fulls = [self._full(k) for k in keys]  # all checked before any is deleted
        for i in range(0, len(fulls), DELETE_BATCH):
            batch = fulls[i : i + DELETE_BATCH]
            if self._batch_delete:
                if await self._delete_batch(keys[i], batch):
                    continue
                log.info("%r has no DeleteObjects: deleting keys one by one", self)
                self._batch_delete = False
            for full in batch:  # S3's DeleteObject answers 204 for a missing key too
                await self._call(
                    "delete",
                    full[len(self._prefix) :],
                    lambda c, full=full: c.delete_object(Bucket=self._bucket, Key=full),
                )

    async def _delete_batch(self, first: str, batch: list[str]) -> bool:
        """One DeleteObjects; False if the store has none (GCS's S3 API, some clones)."""
        body = {"Objects": [{"Key": k} for k in batch], "Quiet": True}

        async def request(client: Any) -> Any:
            try:
                return await client.delete_objects(Bucket=self._bucket, Delete=body)
            except bce.ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "NotImplemented":
                    return None
                raise

        resp = await self._call("delete", first, request)
        if resp is None:
            return False
        failed = [e for e in resp.get("Errors", ()) if e.get("Code") != "NoSuchKey"]
        if failed:
            code = str(failed[0].get("Code", ""))
            raise self._error(
                bce.ClientError(
                    {"Error": {"Code": code, "Message": failed[0].get("Message", "")}},
                    "DeleteObjects",
                ),
                f"delete ({len(failed)} of {len(batch)} keys failed)",
                str(failed[0].get("Key", ""))[len(self._prefix) :],
                1,
            )
        return True

    # -- lifecycle ---------------------------------------------------------------

    async def check(self) -> None:
        """One real list request: wrong credentials, bucket, region or endpoint fail here."""
        await self._call(
            "check",
            "",
            lambda c: c.list_objects_v2(Bucket=self._bucket, Prefix=self._prefix, MaxKeys=1),
        )

    async def close(self) -> None:
        self._closed = True
        async with self._client_lock:
            self._client = None
            await self._stack.aclose()


def _warm_loader(session: AioSession) -> None:
    loader = session.get_component("data_loader")
    loader.load_service_model("s3", "service-2")
    loader.load_service_model("s3", "endpoint-rule-set-1")
    for name in ("endpoints", "partitions", "sdk-default-configuration"):
        with contextlib.suppress(Exception):
            loader.load_data(name)


def _md5(data: bytes | memoryview) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


def _read_part(path: Path, offset: int, length: int) -> tuple[bytes, str]:
    """One part of the file and its Content-MD5 (in a thread: both block)."""
    with open(path, "rb") as f:
        data = os.pread(f.fileno(), length, offset)
    if len(data) != length:
        raise OSError(f"{path} is shorter than expected ({offset + len(data)} bytes)")
    return data, _md5(data)


async def _put_object(client: Any, *, md5: str, **kwargs: Any) -> Any:
    return await client.put_object(ContentMD5=md5, **kwargs)


async def _upload_part(client: Any, *, md5: str, **kwargs: Any) -> Any:
    return await client.upload_part(ContentMD5=md5, **kwargs)


async def _list_page(client: Any, *, kwargs: dict[str, Any]) -> Any:
    return await client.list_objects_v2(**kwargs)
