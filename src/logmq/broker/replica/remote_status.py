"""What operators see of the remote tier: each partition's two tiers and its copy lag
(DescribeRemoteTier, ``logmq storage remote status``, ``logmq topic describe``) and the
tier's Prometheus metrics, read from the manager's state when asked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from logmq.broker.replica.remote_log import local_segments
from logmq.storage.remote import planner

if TYPE_CHECKING:
    from logmq.broker.replica.remote_log import RemoteLogManager
    from logmq.storage.partition_log import PartitionLog


class RemoteTierStatus:
    """Status rows and metric samples of one broker's remote tier."""

    def __init__(self, manager: RemoteLogManager) -> None:
        self.manager = manager
        self.node_id = manager.node_id

    def partition_status(self, plog: PartitionLog) -> dict[str, Any]:
        """Both tiers of one local partition: starts, bytes, and what waits to be copied
        (the copy lag: closed local segments above the highest copied offset, below the
        HW) or deleted (segments being deleted, orphans)."""
        remote = self.manager.remote_segments(plog.topic, plog.partition)
        copied = planner.highest_copied_offset(remote)
        lag_segments = lag_bytes = 0
        for seg in local_segments(plog):
            if seg.closed and seg.end_offset > copied and seg.end_offset < plog.high_watermark:
                lag_segments += 1
                lag_bytes += seg.size_bytes
        readable = [s for s in remote if s.readable]
        return {
            "topic": plog.topic,
            "partition": plog.partition,
            "tiered": plog.remote_managed,
            "log_start_offset": self.manager.log_start_offset(plog),
            "local_log_start_offset": plog.log_start_offset,
            "local_bytes": plog.size_bytes(),
            "remote_segments": len(readable),
            "remote_bytes": sum(s.size_bytes for s in readable),
            "highest_copied_offset": copied,
            "copy_lag_segments": lag_segments,
            "copy_lag_bytes": lag_bytes,
            "pending_deletes": sum(1 for s in remote if not s.finished),
            "corrupt_segments": sum(1 for s in remote if s.corrupt and s.finished),
            "last_error": self.manager.last_error.get((plog.topic, plog.partition)),
        }

    def status(self) -> list[dict[str, Any]]:
        """``partition_status`` of every tiered partition here (``logmq storage remote status``)."""
        return [
            self.partition_status(plog)
            for plog in self.manager.logs.logs()
            if not plog.closed and plog.remote_managed
        ]

    def metric_samples(self) -> list[tuple[str, str, str, list[tuple[dict[str, str], float]]]]:
        st = self.manager.stats
        rs = self.manager.reader.stats
        lag_bytes = lag_segments = 0
        for row in self.status():
            lag_bytes += row["copy_lag_bytes"]
            lag_segments += row["copy_lag_segments"]
        return [
            (
                "logmq_remote_copy_segments",
                "Segments copied to the remote tier",
                "counter",
                [({}, st.segments_copied)],
            ),
            (
                "logmq_remote_copy_bytes",
                "Bytes copied to the remote tier",
                "counter",
                [({}, st.bytes_copied)],
            ),
            (
                "logmq_remote_delete_segments",
                "Remote segments deleted",
                "counter",
                [({}, st.segments_deleted)],
            ),
            (
                "logmq_remote_local_segments_deleted",
                "Local segments deleted once copied",
                "counter",
                [({}, st.local_segments_deleted)],
            ),
            (
                "logmq_remote_copy_lag_bytes",
                "Bytes of closed local segments not yet copied",
                "gauge",
                [({}, lag_bytes)],
            ),
            (
                "logmq_remote_copy_lag_segments",
                "Closed local segments not yet copied",
                "gauge",
                [({}, lag_segments)],
            ),
            (
                "logmq_remote_corrupt_segments_marked",
                "Remote segments this broker's reads found corrupt and marked so",
                "counter",
                [({}, st.corrupt_segments)],
            ),
            (
                "logmq_remote_segments_recopied",
                "Corrupt remote segments' offsets this broker copied again as a follower",
                "counter",
                [({}, st.segments_recopied)],
            ),
            (
                "logmq_remote_fetch_requests",
                "Fetches answered from the remote tier",
                "counter",
                [({}, st.fetch_requests)],
            ),
            (
                "logmq_remote_fetch_bytes",
                "Bytes answered from the remote tier",
                "counter",
                [({}, st.fetch_bytes)],
            ),
            (
                "logmq_remote_errors",
                "Remote tier errors by kind",
                "counter",
                [({"kind": k}, v) for k, v in sorted(self._errors().items())]
                or [({"kind": "none"}, 0)],
            ),
            (
                "logmq_remote_cache_hits",
                "Remote chunk cache hits",
                "counter",
                [({}, getattr(rs, "cache_hits", 0))],
            ),
            (
                "logmq_remote_cache_misses",
                "Remote chunk cache misses",
                "counter",
                [({}, getattr(rs, "cache_misses", 0))],
            ),
        ]

    def _errors(self) -> dict[str, int]:
        out = dict(self.manager.stats.errors_by_kind)
        out["copy"] = self.manager.stats.copy_errors
        out["delete"] = self.manager.stats.delete_errors
        out["fetch"] = self.manager.stats.fetch_errors
        corrupt = getattr(self.manager.reader.stats, "corrupt", 0)
        out["corrupt"] = corrupt
        return out
