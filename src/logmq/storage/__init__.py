"""The storage engine: record batches, segments, partition logs and the log manager."""

from logmq.storage.config import TOPIC_CONFIG_KEYS, LogConfig
from logmq.storage.leader_epoch import LeaderEpochCache
from logmq.storage.log_manager import LogManager
from logmq.storage.partition_log import AppendInfo, FileSlice, PartitionLog

__all__ = [
    "TOPIC_CONFIG_KEYS",
    "AppendInfo",
    "FileSlice",
    "LeaderEpochCache",
    "LogConfig",
    "LogManager",
    "PartitionLog",
]
