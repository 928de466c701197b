"""``LogMQDataSource``: the ``logmq`` format, registered with ``spark.dataSource.register``.

Spark instantiates the data source with the user's options wherever it needs one
(driver planning, the streaming driver process, write planning); each method parses
and checks the options it needs. ``schema()`` is the one call Spark makes at ``load()``
(batch and streaming alike), so it checks the source options there and a bad one fails
at ``load()`` with a message naming it; only an option that is wrong for the mode alone
(``endingOffsets`` on a stream, ``startingOffsets=latest`` in a batch) waits for the
reader. A sink is called first when the write runs: ``save()`` for a batch write, the
query's first batch for a stream (``start()`` has returned by then; the query stops
with the error).
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from logmq_spark.arrow import SCHEMA
from logmq_spark.batch_reader import LogMQBatchReader
from logmq_spark.options import OptionError, sink_options, source_options
from logmq_spark.stream_reader import LogMQStreamReader
from logmq_spark.writer import (
    LogMQBatchWriter,
    LogMQStreamWriter,
    check_exactly_once,
    check_topic,
    sink_columns,
)


def check_source_options(options: Mapping[str, str]) -> None:
    """Raise the OptionError of options no read could take, batch or streaming."""
    try:
        source_options(options, streaming=False)
    except OptionError as batch_error:
        try:
            source_options(options, streaming=True)
        except OptionError:
            raise batch_error from None


def _check_schema(schema: StructType) -> None:
    if schema != SCHEMA:
        raise OptionError(
            "the logmq source has a fixed schema and cannot be read with another one: "
            f"{SCHEMA.simpleString()}"
        )


class LogMQDataSource(DataSource):
    """Read logmq topics into Spark and write DataFrames to logmq, batch or streaming."""

    @classmethod
    def name(cls) -> str:
        return "logmq"

    def schema(self) -> StructType:
        # Spark asks for the schema at load(), and only of a source: check its options
        # now. The mode is not known yet, so options valid in either mode pass here.
        check_source_options(self.options)
        return SCHEMA

    def reader(self, schema: StructType) -> LogMQBatchReader:
        _check_schema(schema)
        return LogMQBatchReader(source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> LogMQStreamReader:
        _check_schema(schema)
        return LogMQStreamReader(source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> LogMQBatchWriter:
        if overwrite:
            raise OptionError(
                "a logmq topic is an append-only log: save mode 'overwrite' is not supported "
                "(use mode 'append')"
            )
        options = sink_options(self.options)
        columns = sink_columns(schema, options)
        check_topic(options)
        return LogMQBatchWriter(options, columns)

    def streamWriter(self, schema: StructType, overwrite: bool) -> LogMQStreamWriter:
        # Complete output mode asks to overwrite; like Kafka's sink, logmq appends the
        # whole result table each trigger instead.
        options = sink_options(self.options)
        columns = sink_columns(schema, options)
        check_exactly_once(options, streaming=True)
        check_topic(options)
        return LogMQStreamWriter(options, columns)
