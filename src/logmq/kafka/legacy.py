"""Message types of the Kafka versions kio no longer generates (Kafka 4.0 dropped them,
KIP-896) but Kafka 3.9 still serves, so clients pinned to them work (Sarama 1.2x commits
with OffsetCommit v1 and describes configs with DescribeConfigs v0).

They are kio-style entities (frozen dataclasses whose fields carry ``kafka_type``), so
kio's compiled reader and writer handle them like its own. Every version here is
non-flexible: request header v1, response header v0. A request type names the module of
its answer in ``__response_module__`` (messages.response_module reads it); where a
version's layout is the same as the next one's, kio's classes of that version are used.
No ``from __future__ import annotations``: kio resolves field types at runtime.
"""

import datetime
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kio.schema.describe_configs.v1.request as describe_configs_v1
import kio.schema.describe_log_dirs.v1.request as describe_log_dirs_v1_request
import kio.schema.describe_log_dirs.v1.response as describe_log_dirs_v1_response
import kio.schema.offset_commit.v2.response as offset_commit_v2_response
import kio.schema.offset_fetch.v1.request as offset_fetch_v1_request
import kio.schema.offset_fetch.v1.response as offset_fetch_v1_response
from kio.schema.create_topics.v2.request import CreatableTopic
from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader
from kio.schema.response_header.v0.header import ResponseHeader
from kio.schema.types import BrokerId, GroupId, TopicName
from kio.static.constants import EntityType
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

_TIMEOUT_60S = i32Timedelta.parse(datetime.timedelta(milliseconds=60000))


def _entity(api_key: int, version: int, kind: EntityType) -> Callable[[type], type]:
    """A kio entity of ``api_key`` at ``version`` (``kind``: request, response, nested)."""

    def wrap(cls: type) -> type:
        cls = dataclass(frozen=True, slots=True, kw_only=True)(cls)
        cls.__type__ = kind  # type: ignore[attr-defined]
        cls.__version__ = i16(version)  # type: ignore[attr-defined]
        cls.__flexible__ = False  # type: ignore[attr-defined]
        cls.__api_key__ = i16(api_key)  # type: ignore[attr-defined]
        header = RequestHeader if kind is EntityType.request else ResponseHeader
        cls.__header_schema__ = header  # type: ignore[attr-defined]
        return cls

    return wrap


def _module(**classes: type) -> types.SimpleNamespace:
    return types.SimpleNamespace(**classes)


def _f(kafka_type: str, **kw: Any) -> Any:
    return field(metadata={"kafka_type": kafka_type}, **kw)


_REQ, _RESP, _NESTED = EntityType.request, EntityType.response, EntityType.nested

# -- OffsetCommit (8) v0, v1: answered in v2's layout ----------------------------------


@_entity(8, 0, _NESTED)
class OffsetCommitRequestPartitionV0:
    partition_index: i32 = _f("int32")
    committed_offset: i64 = _f("int64")
    committed_metadata: str | None = _f("string")


@_entity(8, 0, _NESTED)
class OffsetCommitRequestTopicV0:
    name: TopicName = _f("string")
    partitions: tuple[OffsetCommitRequestPartitionV0, ...]


@_entity(8, 0, _REQ)
class OffsetCommitRequestV0:
    group_id: GroupId = _f("string")
    topics: tuple[OffsetCommitRequestTopicV0, ...]


@_entity(8, 1, _NESTED)
class OffsetCommitRequestPartitionV1:
    partition_index: i32 = _f("int32")
    committed_offset: i64 = _f("int64")
    commit_timestamp: i64 = _f("int64", default=i64(-1))
    committed_metadata: str | None = _f("string")


@_entity(8, 1, _NESTED)
class OffsetCommitRequestTopicV1:
    name: TopicName = _f("string")
    partitions: tuple[OffsetCommitRequestPartitionV1, ...]


@_entity(8, 1, _REQ)
class OffsetCommitRequestV1:
    group_id: GroupId = _f("string")
    generation_id_or_member_epoch: i32 = _f("int32", default=i32(-1))
    member_id: str = _f("string")
    topics: tuple[OffsetCommitRequestTopicV1, ...]


# -- ListOffsets (2) v0: a list of offsets per partition --------------------------------


@_entity(2, 0, _NESTED)
class ListOffsetsPartitionV0:
    partition_index: i32 = _f("int32")
    timestamp: i64 = _f("int64")
    max_num_offsets: i32 = _f("int32", default=i32(1))


@_entity(2, 0, _NESTED)
class ListOffsetsTopicV0:
    name: TopicName = _f("string")
    partitions: tuple[ListOffsetsPartitionV0, ...]


@_entity(2, 0, _REQ)
class ListOffsetsRequestV0:
    replica_id: BrokerId = _f("int32")
    topics: tuple[ListOffsetsTopicV0, ...]


@_entity(2, 0, _NESTED)
class ListOffsetsPartitionResponseV0:
    partition_index: i32 = _f("int32")
    error_code: ErrorCode = _f("error_code")
    old_style_offsets: tuple[i64, ...] = _f("int64", default=())


@_entity(2, 0, _NESTED)
class ListOffsetsTopicResponseV0:
    name: TopicName = _f("string")
    partitions: tuple[ListOffsetsPartitionResponseV0, ...]


@_entity(2, 0, _RESP)
class ListOffsetsResponseV0:
    topics: tuple[ListOffsetsTopicResponseV0, ...]


# -- CreateTopics (19) v0 (no validate_only), v1; answers without throttle time ---------


@_entity(19, 0, _REQ)
class CreateTopicsRequestV0:
    topics: tuple[CreatableTopic, ...]
    timeout: i32Timedelta = _f("timedelta_i32", default=_TIMEOUT_60S)


@_entity(19, 1, _REQ)
class CreateTopicsRequestV1:
    topics: tuple[CreatableTopic, ...]
    timeout: i32Timedelta = _f("timedelta_i32", default=_TIMEOUT_60S)
    validate_only: bool = _f("bool", default=False)


@_entity(19, 0, _NESTED)
class CreatableTopicResultV0:
    name: TopicName = _f("string")
    error_code: ErrorCode = _f("error_code")


@_entity(19, 0, _RESP)
class CreateTopicsResponseV0:
    topics: tuple[CreatableTopicResultV0, ...]


@_entity(19, 1, _NESTED)
class CreatableTopicResultV1:
    name: TopicName = _f("string")
    error_code: ErrorCode = _f("error_code")
    error_message: str | None = _f("string")


@_entity(19, 1, _RESP)
class CreateTopicsResponseV1:
    topics: tuple[CreatableTopicResultV1, ...]


# -- DeleteTopics (20) v0: v1's request, an answer without throttle time ----------------


@_entity(20, 0, _REQ)
class DeleteTopicsRequestV0:
    topic_names: tuple[TopicName, ...] = _f("string", default=())
    timeout: i32Timedelta = _f("timedelta_i32")


@_entity(20, 0, _NESTED)
class DeletableTopicResultV0:
    name: TopicName = _f("string")
    error_code: ErrorCode = _f("error_code")


@_entity(20, 0, _RESP)
class DeleteTopicsResponseV0:
    responses: tuple[DeletableTopicResultV0, ...]


# -- OffsetForLeaderEpoch (23) v0, v1: no current leader epoch, no throttle time --------


@_entity(23, 0, _NESTED)
class OffsetForLeaderPartitionV0:
    partition: i32 = _f("int32")
    leader_epoch: i32 = _f("int32")


@_entity(23, 0, _NESTED)
class OffsetForLeaderTopicV0:
    topic: TopicName = _f("string")
    partitions: tuple[OffsetForLeaderPartitionV0, ...]


@_entity(23, 0, _REQ)
class OffsetForLeaderEpochRequestV0:
    topics: tuple[OffsetForLeaderTopicV0, ...]


@_entity(23, 1, _REQ)
class OffsetForLeaderEpochRequestV1:
    topics: tuple[OffsetForLeaderTopicV0, ...]


@_entity(23, 0, _NESTED)
class EpochEndOffsetV0:
    error_code: ErrorCode = _f("error_code")
    partition: i32 = _f("int32")
    end_offset: i64 = _f("int64", default=i64(-1))


@_entity(23, 0, _NESTED)
class OffsetForLeaderTopicResultV0:
    topic: TopicName = _f("string")
    partitions: tuple[EpochEndOffsetV0, ...]


@_entity(23, 0, _RESP)
class OffsetForLeaderEpochResponseV0:
    topics: tuple[OffsetForLeaderTopicResultV0, ...]


@_entity(23, 1, _NESTED)
class EpochEndOffsetV1:
    error_code: ErrorCode = _f("error_code")
    partition: i32 = _f("int32")
    leader_epoch: i32 = _f("int32", default=i32(-1))
    end_offset: i64 = _f("int64", default=i64(-1))


@_entity(23, 1, _NESTED)
class OffsetForLeaderTopicResultV1:
    topic: TopicName = _f("string")
    partitions: tuple[EpochEndOffsetV1, ...]


@_entity(23, 1, _RESP)
class OffsetForLeaderEpochResponseV1:
    topics: tuple[OffsetForLeaderTopicResultV1, ...]


# -- DescribeConfigs (32) v0: no synonyms; is_default instead of a config source -------


@_entity(32, 0, _REQ)
class DescribeConfigsRequestV0:
    resources: tuple[describe_configs_v1.DescribeConfigsResource, ...]


@_entity(32, 0, _NESTED)
class DescribeConfigsResourceResultV0:
    name: str = _f("string")
    value: str | None = _f("string")
    read_only: bool = _f("bool")
    is_default: bool = _f("bool")
    is_sensitive: bool = _f("bool")


@_entity(32, 0, _NESTED)
class DescribeConfigsResultV0:
    error_code: ErrorCode = _f("error_code")
    error_message: str | None = _f("string")
    resource_type: i8 = _f("int8")
    resource_name: str = _f("string")
    configs: tuple[DescribeConfigsResourceResultV0, ...]


@_entity(32, 0, _RESP)
class DescribeConfigsResponseV0:
    throttle_time: i32Timedelta = _f("timedelta_i32")
    results: tuple[DescribeConfigsResultV0, ...]


# -- the index ---------------------------------------------------------------------------

_OFFSET_COMMIT_ANSWER = _module(
    OffsetCommitResponse=offset_commit_v2_response.OffsetCommitResponse,
    OffsetCommitResponseTopic=offset_commit_v2_response.OffsetCommitResponseTopic,
    OffsetCommitResponsePartition=offset_commit_v2_response.OffsetCommitResponsePartition,
)

# (api key, version) -> (request type, answer module)
_LEGACY: dict[tuple[int, int], tuple[type, Any]] = {
    (2, 0): (
        ListOffsetsRequestV0,
        _module(
            ListOffsetsResponse=ListOffsetsResponseV0,
            ListOffsetsTopicResponse=ListOffsetsTopicResponseV0,
            ListOffsetsPartitionResponse=ListOffsetsPartitionResponseV0,
        ),
    ),
    (8, 0): (OffsetCommitRequestV0, _OFFSET_COMMIT_ANSWER),
    (8, 1): (OffsetCommitRequestV1, _OFFSET_COMMIT_ANSWER),
    (9, 0): (offset_fetch_v1_request.OffsetFetchRequest, offset_fetch_v1_response),
    (19, 0): (
        CreateTopicsRequestV0,
        _module(
            CreateTopicsResponse=CreateTopicsResponseV0, CreatableTopicResult=CreatableTopicResultV0
        ),
    ),
    (19, 1): (
        CreateTopicsRequestV1,
        _module(
            CreateTopicsResponse=CreateTopicsResponseV1, CreatableTopicResult=CreatableTopicResultV1
        ),
    ),
    (20, 0): (
        DeleteTopicsRequestV0,
        _module(
            DeleteTopicsResponse=DeleteTopicsResponseV0, DeletableTopicResult=DeletableTopicResultV0
        ),
    ),
    (23, 0): (
        OffsetForLeaderEpochRequestV0,
        _module(
            OffsetForLeaderEpochResponse=OffsetForLeaderEpochResponseV0,
            OffsetForLeaderTopicResult=OffsetForLeaderTopicResultV0,
            EpochEndOffset=EpochEndOffsetV0,
        ),
    ),
    (23, 1): (
        OffsetForLeaderEpochRequestV1,
        _module(
            OffsetForLeaderEpochResponse=OffsetForLeaderEpochResponseV1,
            OffsetForLeaderTopicResult=OffsetForLeaderTopicResultV1,
            EpochEndOffset=EpochEndOffsetV1,
        ),
    ),
    (32, 0): (
        DescribeConfigsRequestV0,
        _module(
            DescribeConfigsResponse=DescribeConfigsResponseV0,
            DescribeConfigsResult=DescribeConfigsResultV0,
            DescribeConfigsResourceResult=DescribeConfigsResourceResultV0,
        ),
    ),
    (35, 0): (describe_log_dirs_v1_request.DescribeLogDirsRequest, describe_log_dirs_v1_response),
}


def _response_type(module: Any) -> type:
    return next(
        v
        for k, v in vars(module).items()
        if k.endswith("Response") and getattr(v, "__type__", None) is EntityType.response
    )


for _request, _answer in _LEGACY.values():
    if _request.__module__ == __name__:  # kio's own classes find theirs by module name
        _request.__response_module__ = _answer  # type: ignore[attr-defined]


def legacy_request(api_key: int, version: int) -> type | None:
    """The request type of a version kio lacks, or None."""
    found = _LEGACY.get((api_key, version))
    return found[0] if found else None


def legacy_response(api_key: int, version: int) -> type | None:
    """The response type of a version kio lacks, or None."""
    found = _LEGACY.get((api_key, version))
    return _response_type(found[1]) if found else None
