"""The RemoteStore contract, kept by the directory store and the S3 store alike (S3 on a
real moto server), and each store's own failure paths."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from logmq.storage.remote.keys import validate_key, validate_prefix
from logmq.storage.remote.store import RemoteObjectNotFound, RemoteStorageError, RemoteStore

MiB = 1 << 20
BAD_KEYS = ["", "/abs", "a//b", "a/", "../x", "a/../b", "./a", "a/.", ".logmq-tmp/x", "a\x00b"]


async def keys_of(store: RemoteStore, prefix: str) -> list[str]:
    return [k async for k in store.list(prefix)]


# -- the contract, over both stores ----------------------------------------------


async def test_put_bytes_then_get(remote_store: RemoteStore) -> None:
    await remote_store.put_bytes("t-0/manifest", b"first")
    assert await remote_store.get("t-0/manifest") == b"first"
    await remote_store.put_bytes("t-0/manifest", b"second, longer")  # overwrite
    assert await remote_store.get("t-0/manifest") == b"second, longer"
    await remote_store.put_bytes("t-0/empty", b"")
    assert await remote_store.get("t-0/empty") == b""


async def test_put_file_small(remote_store: RemoteStore, tmp_path: Path) -> None:
    data = os.urandom(100_000)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(data)
    assert await remote_store.put_file("t-0/00000000000000000000.log", path) == len(data)
    assert await remote_store.get("t-0/00000000000000000000.log") == data


async def test_put_file_multipart_sized(remote_store: RemoteStore, tmp_path: Path) -> None:
    data = os.urandom(11 * MiB + 12_345)  # three 5 MiB parts in the test's S3 settings
    path = tmp_path / "seg.log"
    path.write_bytes(data)
    assert await remote_store.put_file("t-1/seg.log", path) == len(data)
    assert await remote_store.get("t-1/seg.log") == data
    assert (
        await remote_store.get_range("t-1/seg.log", 5 * MiB - 3, 5 * MiB + 3)
        == (data[5 * MiB - 3 : 5 * MiB + 3])
    )


async def test_get_range(remote_store: RemoteStore) -> None:
    data = bytes(range(256)) * 4
    await remote_store.put_bytes("k", data)
    assert await remote_store.get_range("k", 0, 10) == data[:10]
    assert await remote_store.get_range("k", 500, 600) == data[500:600]
    assert await remote_store.get_range("k", 1000, 5000) == data[1000:]  # past the end
    assert await remote_store.get_range("k", 1024, 2000) == b""  # starts at the end
    assert await remote_store.get_range("k", 4000, 5000) == b""  # starts past it
    assert await remote_store.get_range("k", 7, 7) == b""
    with pytest.raises(RemoteStorageError) as bad:
        await remote_store.get_range("k", 10, 5)
    assert not bad.value.retriable


async def test_missing_key_is_not_found(remote_store: RemoteStore) -> None:
    for read in (
        remote_store.get("nope/x"),
        remote_store.get_range("nope/x", 0, 10),
        remote_store.get_range("nope/x", 3, 3),
    ):
        with pytest.raises(RemoteObjectNotFound) as missing:
            await read
        assert not missing.value.retriable


async def test_list_with_prefix_in_key_order(remote_store: RemoteStore) -> None:
    keys = ["a/b/2", "a/b/10", "a/b-c", "a/c/x", "b/1", "a/b/1", "a/bb/deep/er/k"]
    for key in keys:
        await remote_store.put_bytes(key, key.encode())
    assert await keys_of(remote_store, "") == sorted(keys)
    assert await keys_of(remote_store, "a/b/") == ["a/b/1", "a/b/10", "a/b/2"]
    assert await keys_of(remote_store, "a/b") == [
        "a/b-c",
        "a/b/1",
        "a/b/10",
        "a/b/2",
        "a/bb/deep/er/k",
    ]
    assert await keys_of(remote_store, "a/b/1") == ["a/b/1", "a/b/10"]
    assert await keys_of(remote_store, "zzz") == []
    assert await keys_of(remote_store, "b/1/none/") == []


async def test_delete_is_idempotent(remote_store: RemoteStore) -> None:
    await remote_store.put_bytes("p/1", b"1")
    await remote_store.put_bytes("p/2", b"2")
    await remote_store.put_bytes("q/3", b"3")
    await remote_store.delete(["p/1", "p/2", "p/never"])
    await remote_store.delete(["p/1", "p/2"])  # a retried delete
    await remote_store.delete([])
    assert await keys_of(remote_store, "") == ["q/3"]
    with pytest.raises(RemoteObjectNotFound):
        await remote_store.get("p/1")


@pytest.mark.parametrize("key", BAD_KEYS)
async def test_bad_keys_refused(remote_store: RemoteStore, key: str, tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    for call in (
        remote_store.put_bytes(key, b"x"),
        remote_store.put_file(key, path),
        remote_store.get(key),
        remote_store.get_range(key, 0, 1),
        remote_store.delete(["fine", key]),
    ):
        with pytest.raises(RemoteStorageError) as refused:
            await call
        assert not refused.value.retriable
    assert await keys_of(remote_store, "") == []


@pytest.mark.parametrize("prefix", ["/a", "a//", "../", "a/../", ".logmq-tmp/"])
async def test_bad_prefixes_refused(remote_store: RemoteStore, prefix: str) -> None:
    with pytest.raises(RemoteStorageError) as refused:
        await keys_of(remote_store, prefix)
    assert not refused.value.retriable


async def test_check_passes_and_close(remote_store: RemoteStore) -> None:
    await remote_store.check()
    await remote_store.close()
    with pytest.raises(RemoteStorageError):
        await remote_store.get("k")


# -- the directory store ---------------------------------------------------------


async def test_directory_check_names_the_root_setting(tmp_path: Path) -> None:
    from logmq.storage.remote.directory_store import DirectoryStore

    missing = DirectoryStore(tmp_path / "not-mounted")
    (tmp_path / "a-file").write_bytes(b"")
    not_a_dir = DirectoryStore(tmp_path / "a-file")
    for store in (missing, not_a_dir):
        with pytest.raises(RemoteStorageError, match=r"rsm\.config\.storage\.root") as bad:
            await store.check()
        assert not bad.value.retriable
        with pytest.raises(RemoteStorageError, match=r"rsm\.config\.storage\.root"):
            await store.put_bytes("k", b"x")
        await store.close()


async def test_directory_writes_are_whole_or_absent(directory_store, tmp_path: Path) -> None:
    tmp = directory_store.root / ".logmq-tmp"
    # a write that fails (its local file vanished) leaves neither the key nor a temp file
    with pytest.raises(RemoteStorageError) as gone:
        await directory_store.put_file("t/seg", tmp_path / "vanished.log")
    assert not gone.value.retriable
    assert not (directory_store.root / "t" / "seg").exists()
    assert list(tmp.iterdir()) == []
    # a crash's leftover temp file is never listed, and check() sweeps it once old
    leftover = tmp / "123-crashed"
    leftover.write_bytes(b"half an object")
    await directory_store.put_bytes("t/seg", b"whole")
    assert await keys_of(directory_store, "") == ["t/seg"]
    await directory_store.check()
    assert leftover.exists()  # young: maybe another broker's write in flight
    os.utime(leftover, (time.time() - 7200, time.time() - 7200))
    await directory_store.check()
    assert not leftover.exists()


async def test_directory_delete_prunes_empty_folders(directory_store) -> None:
    await directory_store.put_bytes("topic-0/seg/1.log", b"1")
    await directory_store.put_bytes("topic-0/keep", b"k")
    await directory_store.delete(["topic-0/seg/1.log"])
    assert not (directory_store.root / "topic-0" / "seg").exists()
    assert (directory_store.root / "topic-0" / "keep").exists()
    await directory_store.delete(["topic-0/keep"])
    assert not (directory_store.root / "topic-0").exists()
    assert directory_store.root.is_dir()
    await directory_store.put_bytes("topic-0/seg/2.log", b"2")  # the folders come back
    assert await directory_store.get("topic-0/seg/2.log") == b"2"


async def test_directory_many_concurrent_writers(directory_store) -> None:
    await asyncio.gather(
        *(directory_store.put_bytes(f"p/{i:03d}", str(i).encode()) for i in range(50))
    )
    assert await keys_of(directory_store, "p/") == [f"p/{i:03d}" for i in range(50)]


async def test_directory_file_and_folder_cannot_share_a_name(directory_store) -> None:
    await directory_store.put_bytes("a/b", b"object")
    with pytest.raises(RemoteObjectNotFound):
        await directory_store.get("a/b/c")
    with pytest.raises(RemoteObjectNotFound):
        await directory_store.get("a")
    with pytest.raises(RemoteStorageError) as clash:
        await directory_store.put_bytes("a/b/c", b"x")
    assert not clash.value.retriable


# -- the S3 store: retries, stalls, settings at fault -------------------------------


async def test_s3_multipart_upload_is_used(make_s3_store, moto_server, tmp_path: Path) -> None:
    boto3 = pytest.importorskip("boto3")
    store = make_s3_store(prefix="tenant-a")
    path = tmp_path / "seg.log"
    path.write_bytes(os.urandom(11 * MiB))
    await store.put_file("t-0/seg.log", path)
    raw = boto3.client(
        "s3",
        endpoint_url=moto_server.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    head = raw.head_object(Bucket=store.bucket, Key="tenant-a/t-0/seg.log")
    assert head["ETag"].strip('"').endswith("-3")  # three parts
    assert head["ContentLength"] == 11 * MiB
    # the prefix keeps stores apart in one bucket
    other = make_s3_store(prefix="tenant-b/")
    await other.put_bytes("t-0/seg.log", b"b's")
    assert await keys_of(store, "") == ["t-0/seg.log"]
    assert await other.get("t-0/seg.log") == b"b's"


async def test_s3_retries_injected_errors(make_s3_store, faulty_s3_proxy) -> None:
    store = make_s3_store(endpoint_url=faulty_s3_proxy.endpoint_url)
    faulty_s3_proxy.fail_next(2)  # 503 SlowDown twice
    await store.put_bytes("k", b"v")
    assert faulty_s3_proxy.faults_served == 2
    assert faulty_s3_proxy.requests == 3
    faulty_s3_proxy.fail_next(1, 500, "InternalError")
    faulty_s3_proxy.drop_next(1)
    assert await store.get("k") == b"v"
    assert faulty_s3_proxy.pending_faults == 0
    faulty_s3_proxy.fail_next(2, 503, "ServiceUnavailable")
    assert await keys_of(store, "") == ["k"]
    faulty_s3_proxy.fail_next(3)
    await store.delete(["k"])
    assert await keys_of(store, "") == []


async def test_s3_retries_are_bounded(make_s3_store, faulty_s3_proxy) -> None:
    store = make_s3_store(endpoint_url=faulty_s3_proxy.endpoint_url, max_attempts=3)
    faulty_s3_proxy.fail_next(10)
    with pytest.raises(RemoteStorageError, match="after 3 attempts") as failed:
        await store.put_bytes("k", b"v")
    assert failed.value.retriable
    assert faulty_s3_proxy.requests == 3


async def test_s3_refusals_are_not_retried(make_s3_store, faulty_s3_proxy) -> None:
    store = make_s3_store(endpoint_url=faulty_s3_proxy.endpoint_url)
    faulty_s3_proxy.fail_next(1, 403, "AccessDenied")
    with pytest.raises(RemoteStorageError, match=r"aws\.access\.key\.id") as refused:
        await store.get("k")
    assert not refused.value.retriable
    assert faulty_s3_proxy.requests == 1


async def test_s3_multipart_part_retried(make_s3_store, faulty_s3_proxy, tmp_path) -> None:
    store = make_s3_store(endpoint_url=faulty_s3_proxy.endpoint_url, upload_concurrency=1)
    data = os.urandom(11 * MiB)
    path = tmp_path / "seg.log"
    path.write_bytes(data)
    faulty_s3_proxy.drop_next(1, match=r"partNumber=2\b")
    faulty_s3_proxy.fail_next(1, match=r"partNumber=2\b")
    faulty_s3_proxy.fail_next(1, 500, "InternalError", match="^POST ")  # create or complete
    assert await store.put_file("seg", path) == len(data)
    assert faulty_s3_proxy.pending_faults == 0
    parts = [line for line in faulty_s3_proxy.request_lines if "partNumber=" in line]
    assert len(parts) == 5  # parts 1 and 3 once, part 2 three times
    assert await store.get("seg") == data


async def test_s3_failed_multipart_is_aborted(make_s3_store, faulty_s3_proxy, tmp_path) -> None:
    store = make_s3_store(endpoint_url=faulty_s3_proxy.endpoint_url, max_attempts=2)
    path = tmp_path / "seg.log"
    path.write_bytes(os.urandom(11 * MiB))
    faulty_s3_proxy.fail_next(2, match=r"partNumber=3\b")
    with pytest.raises(RemoteStorageError) as failed:
        await store.put_file("seg", path)
    assert failed.value.retriable
    assert any(line.startswith("DELETE ") for line in faulty_s3_proxy.request_lines)
    with pytest.raises(RemoteObjectNotFound):
        await store.get("seg")


async def test_s3_stalled_server_fails_retriably_in_bounded_time(
    make_s3_store, moto_server
) -> None:
    store = make_s3_store(request_timeout_s=1.0, max_attempts=2)
    await store.put_bytes("k", b"v")  # a pooled connection, then the server freezes
    with moto_server.paused_for():
        started = time.monotonic()
        with pytest.raises(RemoteStorageError, match="timed out") as stalled:
            await asyncio.wait_for(store.get("k"), 30)
        elapsed = time.monotonic() - started
    assert stalled.value.retriable
    assert elapsed < 5, elapsed
    assert await store.get("k") == b"v"  # resumed: the store works again


async def test_s3_unreachable_endpoint_is_retriable(make_s3_store) -> None:
    import socket

    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = make_s3_store(endpoint_url=f"http://127.0.0.1:{port}", max_attempts=2)
    with pytest.raises(RemoteStorageError, match=r"s3\.endpoint\.url") as down:
        await store.check()
    assert down.value.retriable


async def test_s3_missing_bucket_names_the_setting(make_s3_store) -> None:
    store = make_s3_store(bucket="no-such-bucket-here")
    for call in (store.check(), store.put_bytes("k", b"v"), store.get("k")):
        with pytest.raises(RemoteStorageError, match=r"s3\.bucket\.name") as missing:
            await call
        assert not missing.value.retriable
        assert not isinstance(missing.value, RemoteObjectNotFound)


async def test_s3_checked_credentials(moto_auth_server) -> None:
    from logmq.storage.remote.s3_store import S3Store

    server = moto_auth_server["server"]

    def store(key_id: str, secret: str) -> S3Store:
        return S3Store(
            moto_auth_server["bucket"],
            endpoint_url=server.endpoint_url,
            path_style=True,
            access_key_id=key_id,
            secret_access_key=secret,
            max_attempts=2,
            backoff_base_s=0.01,
        )

    good = store(moto_auth_server["access_key_id"], moto_auth_server["secret_access_key"])
    await good.check()
    await good.put_bytes("k", b"v")
    assert await good.get("k") == b"v"
    wrong_key = store("AKIAWRONGWRONGWRONG0", moto_auth_server["secret_access_key"])
    with pytest.raises(RemoteStorageError, match=r"aws\.access\.key\.id") as bad_key:
        await wrong_key.check()
    wrong_secret = store(moto_auth_server["access_key_id"], "not-the-secret")
    with pytest.raises(RemoteStorageError, match=r"aws\.secret\.access\.key") as bad_secret:
        await wrong_secret.check()
    assert not bad_key.value.retriable and not bad_secret.value.retriable
    for s in (good, wrong_key, wrong_secret):
        await s.close()


# -- the error mapping and the settings, unit-level --------------------------------


def _client_error(code: str, status: int) -> Exception:
    import botocore.exceptions as bce

    return bce.ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "GetObject",
    )


@pytest.mark.parametrize(
    ("code", "status", "retriable", "names"),
    [
        ("SlowDown", 503, True, ""),
        ("InternalError", 500, True, ""),
        ("ServiceUnavailable", 503, True, ""),
        ("RequestTimeout", 400, True, ""),
        ("", 502, True, ""),
        ("TooManyRequests", 429, True, ""),
        ("InvalidAccessKeyId", 403, False, "rsm.config.storage.aws.access.key.id"),
        ("SignatureDoesNotMatch", 403, False, "rsm.config.storage.aws.secret.access.key"),
        ("AccessDenied", 403, False, "rsm.config.storage.aws.access.key.id"),
        ("NoSuchBucket", 404, False, "rsm.config.storage.s3.bucket.name"),
        ("PermanentRedirect", 301, False, "rsm.config.storage.s3.region"),
        ("InvalidArgument", 400, False, ""),
    ],
)
def test_s3_error_mapping(code: str, status: int, retriable: bool, names: str) -> None:
    from logmq.storage.remote.s3_errors import map_s3_error

    err = map_s3_error(
        _client_error(code, status), what="get 'k'", attempts=1, bucket="b", endpoint_url=None
    )
    assert type(err) is RemoteStorageError
    assert err.retriable is retriable
    assert names in str(err)


def test_s3_error_mapping_of_network_and_credentials() -> None:
    import botocore.exceptions as bce

    from logmq.storage.remote.s3_errors import map_s3_error

    def mapped(exc: Exception) -> RemoteStorageError:
        return map_s3_error(exc, what="put", attempts=3, bucket="b", endpoint_url="http://x")

    not_found = mapped(_client_error("NoSuchKey", 404))
    assert isinstance(not_found, RemoteObjectNotFound) and not not_found.retriable
    for exc in (
        bce.EndpointConnectionError(endpoint_url="http://x"),
        bce.ReadTimeoutError(endpoint_url="http://x"),
        bce.ConnectionClosedError(endpoint_url="http://x"),
        TimeoutError(),
        ConnectionResetError(),
    ):
        err = mapped(exc)
        assert err.retriable, exc
        assert "rsm.config.storage.s3.endpoint.url" in str(err)
        assert "after 3 attempts" in str(err)
    no_keys = (bce.NoCredentialsError(), bce.PartialCredentialsError(provider="e", cred_var="x"))
    for exc in no_keys:
        err = mapped(exc)
        assert not err.retriable
        assert "rsm.config.storage.aws.access.key.id" in str(err)


def test_s3_settings_checked_at_construction() -> None:
    from logmq.errors import InvalidConfigError
    from logmq.storage.remote.s3_store import S3Store

    with pytest.raises(InvalidConfigError, match=r"s3\.bucket\.name"):
        S3Store("")
    with pytest.raises(InvalidConfigError, match=r"aws\.secret\.access\.key"):
        S3Store("b", access_key_id="only-the-id")
    with pytest.raises(InvalidConfigError, match=r"aws\.access\.key\.id"):
        S3Store("b", secret_access_key="only-the-secret")
    with pytest.raises(InvalidConfigError, match=r"part\.size"):
        S3Store("b", part_size=1 << 20)
    with pytest.raises(RemoteStorageError):
        S3Store("b", prefix="../escape")
    assert S3Store("b", prefix="tiered").prefix == "tiered/"
    assert S3Store("b").prefix == ""


# -- key validation, as a property --------------------------------------------------

_part = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\\"),
    min_size=1,
    max_size=12,
).filter(lambda p: p not in (".", "..", ".logmq-tmp"))
valid_keys = st.lists(_part, min_size=1, max_size=6).map("/".join)


@given(st.text(max_size=40) | st.text(alphabet="a./\\\x00", max_size=12))
def test_any_text_is_a_safe_key_or_refused(key: str) -> None:
    """Whatever a key is, it either names a path strictly below the root or is refused
    (non-retriable): never the root itself, never outside it, never a temp file."""
    from logmq.storage.remote.directory_store import DirectoryStore

    root = Path("/remote-root")
    try:
        validate_key(key)
    except RemoteStorageError as refused:
        assert not refused.retriable
        return
    path = DirectoryStore(root)._path(key)
    assert root in path.parents
    assert os.path.normpath(path) == str(path)  # no '.', '..' or '//' left to resolve
    assert path.relative_to(root).parts[0] != ".logmq-tmp"
    assert "/".join(path.relative_to(root).parts) == key


@given(valid_keys)
def test_valid_keys_and_their_prefixes_are_accepted(key: str) -> None:
    assert validate_key(key) == key
    for i in range(len(key) + 1):
        assert validate_prefix(key[:i]) == key[:i]
