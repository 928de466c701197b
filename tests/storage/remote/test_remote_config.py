from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logmq.errors import InvalidConfigError
from logmq.storage.remote.config import (
    AIVEN_RSM,
    FILESYSTEM,
    KAFKA_LOCAL_RSM,
    LONG_MAX,
    S3,
    RemoteStorageConfigError,
    RemoteStorageSettings,
)

AIVEN_S3 = "io.aiven.kafka.tieredstorage.storage.s3.S3Storage"
AIVEN_FS = "io.aiven.kafka.tieredstorage.storage.filesystem.FileSystemStorage"


def s3_props(**extra: str) -> dict[str, str]:
    props = {
        "remote.log.storage.system.enable": "true",
        "remote.log.storage.manager.class.name": AIVEN_RSM,
        "rsm.config.storage.backend.class": AIVEN_S3,
        "rsm.config.storage.s3.bucket.name": "tiered-logs",
        "rsm.config.storage.s3.region": "eu-west-1",
    }
    props.update(extra)
    return props


def test_defaults_are_kafka_39s_and_tiering_is_off():
    s = RemoteStorageSettings.from_properties({})
    assert not s.enabled and s.backend is None
    assert s.task_interval_ms == 30_000 and s.reader_max_pending_tasks == 100
    assert s.index_cache_bytes == 1 << 30 and s.chunk_size == 4 << 20
    assert s.copy_max_bytes_per_second == LONG_MAX and s.unlimited_fetch
    assert (s.thread_pool_size, s.copier_thread_pool_size, s.expiration_thread_pool_size) == (
        10,
        10,
        10,
    )
    assert s.s3_multipart_part_size == 25 << 20 and s.reader_threads == 10
    assert s == RemoteStorageSettings()


def test_an_aiven_s3_config_reads_as_is():
    s = RemoteStorageSettings.from_properties(
        s3_props(
            **{
                "rsm.config.storage.s3.endpoint.url": "http://127.0.0.1:9000",
                "rsm.config.storage.s3.path.style.access.enabled": "true",
                "rsm.config.storage.aws.access.key.id": "AKIDEXAMPLE",
                "rsm.config.storage.aws.secret.access.key": "s3cr3t-value",
                "rsm.config.storage.s3.multipart.upload.part.size": str(8 << 20),
                "rsm.config.storage.s3.api.call.timeout": "15000",
                "rsm.config.chunk.size": str(1 << 20),
                "rsm.config.key.prefix": "cluster-a/",
                "rsm.config.fetch.chunk.cache.class": (
                    "io.aiven.kafka.tieredstorage.fetch.cache.MemoryChunkCache"
                ),
                "rsm.config.fetch.chunk.cache.size": str(64 << 20),
                "rsm.config.metrics.num.samples": "2",  # Aiven's, not read here
                "remote.log.manager.copier.thread.pool.size": "-1",
                "remote.log.manager.thread.pool.size": "4",
                "remote.log.manager.expiration.thread.pool.size": "2",
                "remote.log.manager.fetch.max.bytes.per.second": "1048576",
                "remote.log.metadata.manager.class.name": (
                    "org.apache.kafka.server.log.remote.metadata.storage."
                    "TopicBasedRemoteLogMetadataManager"
                ),
                "listeners": "PLAINTEXT://127.0.0.1:9092",  # other broker settings ignored
            }
        )
    )
    assert s.enabled and s.is_s3 and s.backend == S3
    assert (s.s3_bucket, s.s3_region, s.s3_endpoint_url) == (
        "tiered-logs",
        "eu-west-1",
        "http://127.0.0.1:9000",
    )
    assert s.s3_path_style_access is True and s.s3_api_call_timeout_ms == 15_000
    assert s.aws_access_key_id == "AKIDEXAMPLE" and s.aws_secret_access_key == "s3cr3t-value"
    assert (s.chunk_size, s.key_prefix, s.chunk_cache_bytes) == (1 << 20, "cluster-a/", 64 << 20)
    assert (s.thread_pool_size, s.copier_thread_pool_size, s.expiration_thread_pool_size) == (
        4,
        4,
        2,
    )
    assert s.fetch_max_bytes_per_second == 1 << 20 and not s.unlimited_fetch
    assert s.unrecognised == ("rsm.config.metrics.num.samples",)


def test_secrets_stay_out_of_repr_and_describe():
    s = RemoteStorageSettings.from_properties(
        s3_props(
            **{
                "rsm.config.storage.aws.access.key.id": "AKIDEXAMPLE",
                "rsm.config.storage.aws.secret.access.key": "s3cr3t-value",
            }
        )
    )
    assert "s3cr3t-value" not in repr(s) and "AKIDEXAMPLE" not in repr(s)
    described = dict(s.describe())
    assert "s3cr3t-value" not in str(described)
    secret = "rsm.config.storage.aws.secret.access.key"
    assert described[secret] is None and s.is_sensitive(secret)
    assert not s.is_sensitive("rsm.config.storage.s3.bucket.name")
    assert described["remote.log.storage.system.enable"] == "true"
    assert described["rsm.config.storage.backend.class"] == AIVEN_S3
    assert described["rsm.config.storage.s3.bucket.name"] == "tiered-logs"
    assert described["remote.log.manager.fetch.max.bytes.per.second"] == str(LONG_MAX)
    names = [name for name, _ in s.describe()]
    assert len(names) == len(set(names))


def test_filesystem_back_end_by_aiven_name_short_name_and_kafkas_local_tiered_storage(tmp_path):
    for backend in (AIVEN_FS, "filesystem"):
        s = RemoteStorageSettings.from_properties(
            {
                "remote.log.storage.system.enable": "true",
                "rsm.config.storage.backend.class": backend,
                "rsm.config.storage.root": str(tmp_path),
            }
        )
        assert s.backend == FILESYSTEM and s.root == tmp_path
    local = RemoteStorageSettings.from_properties(
        {
            "remote.log.storage.system.enable": "true",
            "remote.log.storage.manager.class.name": KAFKA_LOCAL_RSM,
            "rsm.config.dir": str(tmp_path),
        }
    )
    assert local.backend == FILESYSTEM and local.root == Path(tmp_path)
    assert local.unrecognised == ()


def test_the_rsm_prefix_is_kafkas_impl_prefix():
    s = RemoteStorageSettings.from_properties(
        {
            "remote.log.storage.system.enable": "true",
            "remote.log.storage.manager.impl.prefix": "rsm.s3.",
            "rsm.s3.storage.backend.class": "s3",
            "rsm.s3.storage.s3.bucket.name": "b-1.logs",
        }
    )
    assert s.s3_bucket == "b-1.logs" and s.rsm_prefix == "rsm.s3."
    assert "rsm.s3.storage.s3.bucket.name" in dict(s.describe())
    with pytest.raises(RemoteStorageConfigError, match=r"rsm\.s3\.storage\.s3\.bucket\.name"):
        RemoteStorageSettings.from_properties(
            {
                "remote.log.storage.system.enable": "true",
                "remote.log.storage.manager.impl.prefix": "rsm.s3.",
                "rsm.s3.storage.backend.class": "s3",
                "rsm.config.storage.s3.bucket.name": "ignored-under-another-prefix",
            }
        )


@pytest.mark.parametrize(
    ("props", "named"),
    [
        ({"remote.log.storage.system.enable": "yes"}, "remote.log.storage.system.enable"),
        (
            {"remote.log.storage.manager.class.name": "com.example.Rsm"},
            "remote.log.storage.manager.class.name",
        ),
        (
            {"remote.log.metadata.manager.class.name": "com.example.Rlmm"},
            "remote.log.metadata.manager.class.name",
        ),
        ({"remote.log.manager.task.interval.ms": "0"}, "remote.log.manager.task.interval.ms"),
        ({"remote.log.manager.task.interval.ms": "soon"}, "remote.log.manager.task.interval.ms"),
        ({"remote.log.manager.thread.pool.size": "0"}, "remote.log.manager.thread.pool.size"),
        (
            {"remote.log.manager.copier.thread.pool.size": "-2"},
            "remote.log.manager.copier.thread.pool.size",
        ),
        (
            {"remote.log.manager.expiration.thread.pool.size": "0"},
            "remote.log.manager.expiration.thread.pool.size",
        ),
        (
            {"remote.log.manager.copy.max.bytes.per.second": "0"},
            "remote.log.manager.copy.max.bytes.per.second",
        ),
        (
            {"remote.log.manager.fetch.max.bytes.per.second": str(LONG_MAX + 1)},
            "remote.log.manager.fetch.max.bytes.per.second",
        ),
        ({"remote.log.reader.threads": "0"}, "remote.log.reader.threads"),
        ({"remote.log.reader.max.pending.tasks": "-1"}, "remote.log.reader.max.pending.tasks"),
        (
            {"remote.log.index.file.cache.total.size.bytes": "0"},
            "remote.log.index.file.cache.total.size.bytes",
        ),
        ({"remote.log.manager.task.retry.jitter": "0.6"}, "remote.log.manager.task.retry.jitter"),
        (
            {
                "remote.log.manager.task.retry.backoff.ms": "1000",
                "remote.log.manager.task.retry.backoff.max.ms": "999",
            },
            "remote.log.manager.task.retry.backoff.max.ms",
        ),
        ({"rsm.config.chunk.size": "0"}, "rsm.config.chunk.size"),
        ({"rsm.config.chunk.size": str(1 << 30)}, "rsm.config.chunk.size"),
        ({"rsm.config.fetch.chunk.cache.size": "-1"}, "rsm.config.fetch.chunk.cache.size"),
        (
            {"rsm.config.fetch.chunk.cache.class": "io.aiven.kafka.tieredstorage.X"},
            "rsm.config.fetch.chunk.cache.class",
        ),
        (
            {"rsm.config.storage.s3.multipart.upload.part.size": str(1 << 20)},
            "rsm.config.storage.s3.multipart.upload.part.size",
        ),
        ({"rsm.config.storage.s3.api.call.timeout": "0"}, "rsm.config.storage.s3.api.call.timeout"),
        (
            {"rsm.config.storage.s3.endpoint.url": "minio:9000"},
            "rsm.config.storage.s3.endpoint.url",
        ),
        (
            {"rsm.config.storage.s3.endpoint.url": "http://127.0.0.1:99999"},
            "rsm.config.storage.s3.endpoint.url",
        ),
        (
            {"rsm.config.storage.s3.path.style.access.enabled": "sometimes"},
            "rsm.config.storage.s3.path.style.access.enabled",
        ),
        ({"rsm.config.storage.s3.bucket.name": "Bad_Bucket"}, "rsm.config.storage.s3.bucket.name"),
        (
            {"rsm.config.storage.aws.access.key.id": "AKIDEXAMPLE"},
            "rsm.config.storage.aws.secret.access.key",
        ),
        ({"rsm.config.key.prefix": "/abs"}, "rsm.config.key.prefix"),
        ({"rsm.config.key.prefix": "a/../b"}, "rsm.config.key.prefix"),
        ({"rsm.config.key.prefix": "a//b"}, "rsm.config.key.prefix"),
        ({"rsm.config.encryption.enabled": "true"}, "rsm.config.encryption.enabled"),
    ],
)
def test_each_bad_value_names_its_property(props, named):
    with pytest.raises(ValueError, match=named.replace(".", r"\.")) as e:
        RemoteStorageSettings.from_properties(props)
    assert isinstance(e.value, InvalidConfigError)  # the start-up path's error too


def test_an_enabled_tier_needs_its_back_end_and_where_to_put_things():
    on = {"remote.log.storage.system.enable": "true"}
    with pytest.raises(RemoteStorageConfigError, match=r"storage\.backend\.class") as e:
        RemoteStorageSettings.from_properties(on)
    assert AIVEN_S3 in str(e.value) and "filesystem" in str(e.value)
    with pytest.raises(RemoteStorageConfigError, match="not available") as e:
        RemoteStorageSettings.from_properties(
            {**on, "rsm.config.storage.backend.class": "io.aiven.kafka.tieredstorage.gcs.Gcs"}
        )
    assert AIVEN_S3 in str(e.value) and AIVEN_FS in str(e.value)
    with pytest.raises(RemoteStorageConfigError, match=r"rsm\.config\.storage\.s3\.bucket\.name"):
        RemoteStorageSettings.from_properties({**on, "rsm.config.storage.backend.class": "s3"})
    with pytest.raises(RemoteStorageConfigError, match=r"rsm\.config\.storage\.root"):
        RemoteStorageSettings.from_properties(
            {**on, "rsm.config.storage.backend.class": "filesystem"}
        )
    with pytest.raises(RemoteStorageConfigError, match=r"rsm\.config\.dir"):
        RemoteStorageSettings.from_properties(
            {**on, "remote.log.storage.manager.class.name": KAFKA_LOCAL_RSM}
        )
    with pytest.raises(RemoteStorageConfigError, match="directory"):
        RemoteStorageSettings.from_properties(
            {
                **s3_props(),
                "remote.log.storage.manager.class.name": KAFKA_LOCAL_RSM,
            }
        )
    # while tiering is off, a half-written back end does not stop the broker
    off = RemoteStorageSettings.from_properties({"rsm.config.storage.backend.class": "s3"})
    assert not off.enabled and off.backend == S3


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "remote.log.storage.system.enable",
                "remote.log.manager.task.interval.ms",
                "remote.log.manager.copier.thread.pool.size",
                "remote.log.reader.threads",
                "rsm.config.storage.backend.class",
                "rsm.config.storage.s3.bucket.name",
                "rsm.config.storage.root",
                "rsm.config.chunk.size",
                "rsm.config.storage.s3.endpoint.url",
            ]
        ),
        st.one_of(
            st.sampled_from(["true", "false", "-1", "0", "1", "s3", "filesystem", "x", ""]),
            st.text(max_size=8),
        ),
    )
)
def test_any_input_gives_settings_or_a_named_error(props):
    try:
        s = RemoteStorageSettings.from_properties(props)
    except RemoteStorageConfigError as e:
        assert re.search(r"\b(remote|rsm)\.[a-z.]+[a-z]", str(e)), e  # names a property
    else:
        assert not s.enabled or s.backend in (S3, FILESYSTEM)
        assert len(s.describe()) > 20


async def test_the_key_prefix_is_a_folder_in_the_directory_store(tmp_path):
    """Aiven's key.prefix applies to every back end: the directory store puts the
    objects under ROOT/PREFIX/, made at start, as S3 puts them under PREFIX/."""
    from logmq.storage.remote.stores import build_store

    settings = RemoteStorageSettings.from_properties(
        {
            "remote.log.storage.system.enable": "true",
            "rsm.config.storage.backend.class": AIVEN_FS,
            "rsm.config.storage.root": str(tmp_path),
            "rsm.config.key.prefix": "cluster-a/tier",
        }
    )
    store = build_store(settings)
    try:
        await store.check()
        await store.put_bytes("t-id/0/x.manifest", b"m")
        assert (tmp_path / "cluster-a" / "tier" / "t-id" / "0" / "x.manifest").read_bytes() == b"m"
        assert [k async for k in store.list("t-id/")] == ["t-id/0/x.manifest"]
    finally:
        await store.close()
