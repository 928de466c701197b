"""The segment's topic name crosses AlterRemoteSegments (found by bench_tiered.py: the
objects' keys hold it, and a deleted topic's remote data is deleted by it)."""

from __future__ import annotations

from logmq.cluster.controller_api import RemoteSegmentChange
from logmq.native.cluster_api import remote_segment_change, remote_segment_change_body
from logmq.storage.remote.segment_metadata import RemoteSegment


def test_the_segment_topic_crosses_the_alter_remote_segments_wire():
    seg = RemoteSegment("tid", 0, "a", 0, 99, 5_000, 1 << 20, ((3, 0),), 3, 1, topic="orders")
    change = remote_segment_change(
        remote_segment_change_body(RemoteSegmentChange.copy_started(seg, 3))
    )
    assert change.segment is not None and change.segment.topic == "orders"
