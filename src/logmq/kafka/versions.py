"""The ApiVersions answer and Kafka's names of its APIs.

Which APIs and versions the Kafka listener serves is its registry's (kafka/registry.py).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from functools import cache

from kio.index import load_request_schema, load_response_schema

from logmq.errors import ErrorCode
from logmq.kafka.messages import NO_THROTTLE

API_VERSIONS_KEY = 18


@cache
def kafka_api_name(api_key: int) -> str:
    """Kafka's name of an API in snake case (metrics and logs): ``produce``, ``fetch``…"""
    for version in range(20):
        try:
            return load_request_schema(api_key, version).__module__.split(".")[2]
        except Exception:  # kio has no such version (or no such API)
            continue
    return str(api_key)


def api_versions_response(
    version: int, advertised: Mapping[int, tuple[int, int]], error: ErrorCode = ErrorCode.NONE
):
    """The ApiVersions answer at ``version`` listing ``advertised`` (api key -> (min,
    max)); the error one is always v0 (KIP-511)."""
    cls = load_response_schema(API_VERSIONS_KEY, version)
    entry = sys.modules[cls.__module__].ApiVersion
    keys = tuple(
        entry(api_key=k, min_version=lo, max_version=hi)
        for k, (lo, hi) in sorted(advertised.items())
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
