"""Which Kafka APIs and versions the Kafka listener serves (the ApiVersions answer).

Ranges are chosen so every client we test picks its modern path (docs/kafka-compatibility.md):
librdkafka turns features on by probing exact versions (record batch v2 needs Produce 3
and Fetch 4; ZSTD Produce 7 and Fetch 10; its lz4 check wants Produce 0 inside the
range, so Produce is advertised from 0 and versions 0-2, which carry the old message
formats, are answered UNSUPPORTED_VERSION); kafka-python guesses the broker's release
from the list (ListOffsets 7 reads as Kafka 3.0: v2 batches and idempotence); aiokafka
takes the highest version inside each range it knows.
"""

from __future__ import annotations

import sys
from functools import cache

from kio.index import load_request_schema, load_response_schema

from logmq.errors import ErrorCode
from logmq.kafka.messages import NO_THROTTLE

API_VERSIONS_KEY = 18

# api key -> (min, max) advertised: every version Kafka 3.9 serves, except Fetch 0-3 (and
# Produce 0-2, see REFUSED), which carry the pre-v2 message formats; versions kio 0.6.5 no
# longer generates (Kafka 4.0 dropped them, KIP-896) are defined in legacy.py.
SUPPORTED: dict[int, tuple[int, int]] = {
    0: (0, 11),  # Produce (0-2: old message formats, refused)
    1: (4, 17),  # Fetch (0-3: old message formats, not served; 13+: topic ids)
    2: (0, 9),  # ListOffsets (v0: a list of offsets)
    3: (0, 12),  # Metadata
    8: (0, 9),  # OffsetCommit (v0/v1: legacy.py; Sarama 1.2x commits with v1)
    9: (0, 9),  # OffsetFetch
    10: (0, 6),  # FindCoordinator (v4+: batched keys)
    11: (0, 9),  # JoinGroup (v4+: KIP-394 member ids; v5+ static members)
    12: (0, 4),  # Heartbeat
    13: (0, 5),  # LeaveGroup
    14: (0, 5),  # SyncGroup
    15: (0, 5),  # DescribeGroups
    16: (0, 5),  # ListGroups (v5: group types)
    17: (0, 1),  # SaslHandshake (v0: raw tokens follow it, kafka/sasl.py)
    18: (0, 4),  # ApiVersions
    19: (0, 7),  # CreateTopics (v5+: configs in the answer; v7: topic ids)
    20: (0, 6),  # DeleteTopics (v6: by name or topic id)
    21: (0, 2),  # DeleteRecords
    22: (0, 5),  # InitProducerId
    23: (0, 4),  # OffsetForLeaderEpoch (librdkafka validates positions with v2)
    24: (0, 4),  # AddPartitionsToTxn (v4: batched, verify_only, from brokers: KIP-890)
    25: (0, 3),  # AddOffsetsToTxn
    26: (0, 4),  # EndTxn (v5 is KIP-890 part 2's epoch bump per transaction: not served)
    27: (1, 2),  # WriteTxnMarkers: an admin's abort (kafka/producers.py); v0 went in 4.0
    28: (0, 3),  # TxnOffsetCommit (v4+ is KIP-890 part 2: not served)
    29: (1, 3),  # DescribeAcls (v0, before pattern types, went in Kafka 4.0: KIP-896)
    30: (1, 3),  # CreateAcls
    31: (1, 3),  # DeleteAcls
    32: (0, 4),  # DescribeConfigs (v0: is_default, no synonyms)
    33: (0, 2),  # AlterConfigs (replaces a topic's overrides)
    35: (0, 4),  # DescribeLogDirs
    36: (0, 2),  # SaslAuthenticate (v1+: session lifetime, KIP-368)
    37: (0, 3),  # CreatePartitions
    42: (0, 2),  # DeleteGroups
    43: (0, 2),  # ElectLeaders
    44: (0, 1),  # IncrementalAlterConfigs
    45: (0, 1),  # AlterPartitionReassignments
    46: (0, 0),  # ListPartitionReassignments
    47: (0, 0),  # OffsetDelete
    48: (0, 1),  # DescribeClientQuotas
    49: (0, 1),  # AlterClientQuotas
    50: (0, 0),  # DescribeUserScramCredentials
    51: (0, 0),  # AlterUserScramCredentials
    60: (0, 1),  # DescribeCluster
    61: (0, 0),  # DescribeProducers (kafka/producers.py)
    65: (0, 0),  # DescribeTransactions
    66: (0, 1),  # ListTransactions (v2's transactional id pattern: not served)
    68: (0, 1),  # ConsumerGroupHeartbeat (KIP-848; librdkafka's group.protocol=consumer needs 1)
    69: (0, 1),  # ConsumerGroupDescribe
}

# Versions inside the advertised range that are refused anyway (the message format
# they carry is not Kafka's RecordBatch v2).
REFUSED: dict[int, int] = {0: 3}  # api key -> oldest version served


@cache
def kafka_api_name(api_key: int) -> str:
    """Kafka's name of an API in snake case (metrics and logs): ``produce``, ``fetch``…"""
    for version in range(20):
        try:
            return load_request_schema(api_key, version).__module__.split(".")[2]
        except Exception:  # kio has no such version (or no such API)
            continue
    return str(api_key)


def api_versions_response(version: int, error: ErrorCode = ErrorCode.NONE):
    """The ApiVersions answer at ``version`` (the error one is always v0, KIP-511)."""
    cls = load_response_schema(API_VERSIONS_KEY, version)
    entry = sys.modules[cls.__module__].ApiVersion
    keys = tuple(
        entry(api_key=k, min_version=lo, max_version=hi)
        for k, (lo, hi) in sorted(SUPPORTED.items())
    )
    from kio.schema.errors import ErrorCode as KioErrorCode

    fields = {"error_code": KioErrorCode(int(error)), "api_keys": keys}
    if version >= 1:
        fields["throttle_time"] = NO_THROTTLE
    if version >= 3:
        fields.update(
            supported_features=(),
            finalized_features_epoch=-1,
            finalized_features=(),
            zk_migration_ready=False,
        )
    return cls(**fields)
