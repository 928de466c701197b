"""Option parsing of the logmq format: every bad value is refused with the option's name."""

from __future__ import annotations

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict

from logmq_spark.options import OptionError, sink_options, source_options


def opts(**kw: str) -> CaseInsensitiveDict:
    return CaseInsensitiveDict({"bootstrap": "127.0.0.1:9092", **kw})


def test_defaults_follow_the_kafka_source() -> None:
    stream = source_options(opts(topic="t"), streaming=True)
    assert stream.starting.kind == "latest" and stream.ending.kind == "latest"
    assert stream.fail_on_data_loss is True and stream.max_records_per_trigger is None
    batch = source_options(opts(topic="t"), streaming=False)
    assert batch.starting.kind == "earliest" and batch.ending.kind == "latest"


def test_names_are_case_insensitive_and_aliases_work() -> None:
    o = source_options(
        opts(TOPICS="a, b,a", maxoffsetspertrigger="10", FAILONDATALOSS="False"), streaming=True
    )
    assert o.subscription.topics == ("a", "b")
    assert o.max_records_per_trigger == 10
    assert o.fail_on_data_loss is False


def test_offsets_json() -> None:
    o = source_options(
        opts(
            topic="t",
            startingOffsets='{"t": {"0": 5, "1": -2}}',
            endingOffsets='{"t": {"0": -1, "1": 7}}',
        ),
        streaming=False,
    )
    assert o.starting.specific() == {("t", 0): 5, ("t", 1): -2}
    assert o.ending.specific() == {("t", 0): -1, ("t", 1): 7}


def test_starting_timestamp_wins() -> None:
    o = source_options(
        opts(topic="t", startingTimestamp="1000", startingOffsets="earliest"), streaming=True
    )
    assert o.starting.kind == "timestamp" and o.starting.timestamp_ms == 1000


@pytest.mark.parametrize(
    ("options", "streaming", "mentions"),
    [
        ({"topic": "t", "bootstrap": " "}, True, "bootstrap"),
        ({}, True, "exactly one"),
        ({"topic": "a", "pattern": "a.*"}, True, "exactly one"),
        ({"topic": "a,b"}, True, "'topics'"),
        ({"topics": " , "}, True, "no topic"),
        ({"pattern": "("}, True, "pattern"),
        ({"topic": "t", "startingOffsets": "{oops"}, True, "startingOffsets"),
        ({"topic": "t", "startingOffsets": '{"t": {"x": 1}}'}, True, "partition number"),
        ({"topic": "t", "startingOffsets": '{"t": {"0": -3}}'}, True, ">= -2"),
        ({"topic": "t", "startingOffsets": '{"t": {"0": true}}'}, True, ">= -2"),
        ({"topic": "t", "startingOffsets": '{"u": {"0": 1}}'}, True, "not subscribed"),
        ({"topic": "t", "endingOffsets": "latest"}, True, "batch reads only"),
        ({"topic": "t", "endingOffsets": "earliest"}, False, "endingOffsets"),
        ({"topic": "t", "endingOffsets": '{"t": {"0": -2}}'}, False, "not allowed"),
        ({"topic": "t", "startingOffsets": "latest"}, False, "streaming only"),
        ({"topic": "t", "maxRecordsPerTrigger": "0"}, True, "maxRecordsPerTrigger"),
        ({"topic": "t", "minPartitions": "many"}, True, "minPartitions"),
        ({"topic": "t", "failOnDataLoss": "yes"}, True, "failOnDataLoss"),
        ({"topic": "t", "startingTimestamp": "noon"}, True, "startingTimestamp"),
        ({"topic": "t", "groupId": " "}, True, "groupId"),
        ({"topic": "t", "startingOffsetsByTimestampStrategy": "x"}, True, "Strategy"),
    ],
)
def test_bad_source_options(options: dict, streaming: bool, mentions: str) -> None:
    given = CaseInsensitiveDict({"bootstrap": "127.0.0.1:9092"})
    given.update(options)
    with pytest.raises(OptionError, match=mentions):
        source_options(given, streaming=streaming)


def test_sink_options() -> None:
    o = sink_options(opts(topic="out", compression="GZIP", acks="1", lingerMs="20"))
    assert (o.topic, o.compression, o.acks, o.producer) == ("out", "gzip", "1", {"linger_ms": 20})
    assert sink_options(opts()).topic is None  # a topic column may name it
    # keys placed as before murmur2 became the default
    assert sink_options(opts(partitioner="XXH3")).producer == {"partitioner": "xxh3"}


@pytest.mark.parametrize(
    ("options", "mentions"),
    [
        ({"topic": "a,b"}, "exactly one"),
        ({"acks": "0"}, "acks"),
        ({"compression": "brotli"}, "compression"),
        ({"batchSize": "-1"}, "batchSize"),
        ({"partitioner": "crc32"}, "partitioner"),
    ],
)
def test_bad_sink_options(options: dict, mentions: str) -> None:
    with pytest.raises(OptionError, match=mentions):
        sink_options(opts(**options))
