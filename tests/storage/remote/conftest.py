"""Fixtures for the remote stores: a session's moto S3 server, buckets, stores, a proxy.

Every test that asks for S3 skips (saying why) when moto's server is not installed.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from logmq.storage.remote.directory_store import DirectoryStore
from logmq.storage.remote.store import RemoteStore
from logmq.testing.s3 import (
    ACCESS_KEY_ID,
    SECRET_ACCESS_KEY,
    FaultyS3Proxy,
    MotoS3Server,
    moto_server_command,
)

MiB = 1 << 20
NO_MOTO = "moto_server is not installed (pip install 'moto[server]', in the dev extra)"

# small parts and quick retries, so multipart and backoff paths run in a test's time
TEST_S3_SETTINGS: dict[str, Any] = {
    "region": "us-east-1",
    "path_style": True,
    "access_key_id": ACCESS_KEY_ID,
    "secret_access_key": SECRET_ACCESS_KEY,
    "multipart_threshold": 5 * MiB,
    "part_size": 5 * MiB,
    "request_timeout_s": 10.0,
    "max_attempts": 4,
    "backoff_base_s": 0.01,
    "backoff_max_s": 0.05,
}


def s3_store_on(server: MotoS3Server, default_bucket: str, **overrides: Any) -> Any:
    """An S3Store with the test settings (``bucket=`` among ``overrides`` wins)."""
    from logmq.storage.remote.s3_store import S3Store

    settings = {"endpoint_url": server.endpoint_url, **TEST_S3_SETTINGS, **overrides}
    return S3Store(settings.pop("bucket", default_bucket), **settings)


def _require_moto() -> None:
    if moto_server_command() is None:
        pytest.skip(NO_MOTO)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoS3Server]:
    """One moto S3 server for the session (tests that pause it resume it)."""
    _require_moto()
    with MotoS3Server() as server:
        yield server


@pytest.fixture
def s3_bucket(moto_server: MotoS3Server) -> str:
    """A fresh, empty bucket on the session's server."""
    return moto_server.create_bucket(f"t-{uuid.uuid4().hex[:16]}")


@pytest.fixture
async def make_s3_store(
    moto_server: MotoS3Server, s3_bucket: str
) -> AsyncIterator[Callable[..., Any]]:
    """``make_s3_store(**overrides)``: an S3Store on the test's bucket, closed afterwards."""
    stores: list[Any] = []

    def make(**overrides: Any) -> Any:
        store = s3_store_on(moto_server, s3_bucket, **overrides)
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()


@pytest.fixture
async def directory_store(tmp_path: Path) -> AsyncIterator[DirectoryStore]:
    root = tmp_path / "remote"
    root.mkdir()
    store = DirectoryStore(root)
    yield store
    await store.close()


@pytest.fixture(params=["directory", "s3"])
async def remote_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[RemoteStore]:
    """Each back end in turn, for the contract every RemoteStore keeps."""
    store: RemoteStore
    if request.param == "directory":
        root = tmp_path / "remote"
        root.mkdir()
        store = DirectoryStore(root)
    else:
        _require_moto()
        server = request.getfixturevalue("moto_server")
        store = s3_store_on(server, request.getfixturevalue("s3_bucket"))
    yield store
    await store.close()


@pytest.fixture
async def faulty_s3_proxy(moto_server: MotoS3Server) -> AsyncIterator[FaultyS3Proxy]:
    """A proxy in front of the session's moto that fails requests when told to."""
    async with FaultyS3Proxy(moto_server.port) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def moto_auth_server() -> Iterator[dict[str, Any]]:
    """A moto server that checks credentials: a user with a key and an allow-all policy,
    and a bucket, made in moto's first 4 unauthenticated actions."""
    _require_moto()
    boto3 = pytest.importorskip("boto3")
    with MotoS3Server(env={"INITIAL_NO_AUTH_ACTION_COUNT": "4"}) as server:
        common = {
            "endpoint_url": server.endpoint_url,
            "region_name": "us-east-1",
            "aws_access_key_id": ACCESS_KEY_ID,
            "aws_secret_access_key": SECRET_ACCESS_KEY,
        }
        iam = boto3.client("iam", **common)
        iam.create_user(UserName="broker")
        key = iam.create_access_key(UserName="broker")["AccessKey"]
        iam.put_user_policy(
            UserName="broker",
            PolicyName="all",
            PolicyDocument='{"Version":"2012-10-17","Statement":'
            '[{"Effect":"Allow","Action":"*","Resource":"*"}]}',
        )
        boto3.client("s3", **common).create_bucket(Bucket="authed")
        yield {
            "server": server,
            "bucket": "authed",
            "access_key_id": key["AccessKeyId"],
            "secret_access_key": key["SecretAccessKey"],
        }
