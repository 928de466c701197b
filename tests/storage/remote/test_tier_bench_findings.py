"""Two faults bench_tiered.py ran into, pinned until the integrator fixes them (xfail:
the fixes belong to files other helpers may not edit)."""

from __future__ import annotations

import pytest

from logmq.cluster.controller_api import RemoteSegmentChange
from logmq.native.cluster_api import remote_segment_change, remote_segment_change_body
from logmq.storage.remote.config import RemoteStorageSettings
from logmq.storage.remote.segment_metadata import RemoteSegment


@pytest.mark.xfail(
    strict=False,
    reason="native/cluster_api.py: remote_segment_change_body omits the segment's topic "
    "and remote_segment_change never reads it, so the image holds topic='' and deleting "
    "a deleted topic's remote data builds keys without the topic's name",
)
def test_the_segment_topic_crosses_the_alter_remote_segments_wire():
    seg = RemoteSegment("tid", 0, "a", 0, 99, 5_000, 1 << 20, ((3, 0),), 3, 1, topic="orders")
    change = remote_segment_change(
        remote_segment_change_body(RemoteSegmentChange.copy_started(seg, 3))
    )
    assert change.segment is not None and change.segment.topic == "orders"


@pytest.mark.xfail(
    strict=False,
    reason="broker/replica/remote_log.py build_store: settings.s3_api_call_timeout_ms is "
    "None unless rsm.config.storage.s3.api.call.timeout is set, and None / 1000 raises",
)
def test_an_s3_store_builds_without_an_api_call_timeout():
    from logmq.broker.replica.remote_log import build_store

    settings = RemoteStorageSettings.from_properties(
        {
            "remote.log.storage.system.enable": "true",
            "rsm.config.storage.backend.class": "io.aiven.kafka.tieredstorage.storage.s3.S3Storage",
            "rsm.config.storage.s3.bucket.name": "bench",
            "rsm.config.storage.s3.region": "us-east-1",
            "rsm.config.storage.s3.endpoint.url": "http://127.0.0.1:9",
        }
    )
    build_store(settings)
