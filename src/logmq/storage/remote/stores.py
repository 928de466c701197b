"""The remote store a broker's settings name (``rsm.config.storage.backend.class``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from logmq.storage.remote.store import RemoteStore


def build_store(settings: Any) -> RemoteStore:
    """The store ``rsm.config.storage.backend.class`` names, from its settings."""
    if settings.is_s3:
        from logmq.storage.remote.s3_store import S3Store

        optional: dict[str, Any] = {}
        if settings.s3_multipart_part_size:
            optional["part_size"] = settings.s3_multipart_part_size
        if settings.s3_api_call_timeout_ms:
            optional["request_timeout_s"] = settings.s3_api_call_timeout_ms / 1000
        return S3Store(
            settings.s3_bucket,
            region=settings.s3_region,
            endpoint_url=settings.s3_endpoint_url,
            path_style=bool(settings.s3_path_style_access),
            access_key_id=settings.aws_access_key_id,
            secret_access_key=settings.aws_secret_access_key,
            prefix=settings.key_prefix or "",
            **optional,
        )
    from logmq.storage.remote.directory_store import DirectoryStore

    assert settings.root is not None
    root = Path(settings.root)
    if settings.key_prefix:
        # as S3's: the prefix names a folder (its own, under the root, made at start
        # when the root is there; a missing root is still the start error it names)
        parts = [p for p in settings.key_prefix.split("/") if p]  # checked by config.py
        sub = root.joinpath(*parts)
        if root.is_dir():
            sub.mkdir(parents=True, exist_ok=True)
        root = sub
    return DirectoryStore(root, max_threads=max(1, settings.thread_pool_size))
