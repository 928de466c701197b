"""``LogMQDataSource``: the ``logmq`` format, registered with ``spark.dataSource.register``.

Spark instantiates the data source with the user's options wherever it needs one
(driver planning, the streaming driver process, write planning); each method parses
and checks the options it needs, so a bad option fails at ``load()``/``start()`` with
a message naming it.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from logmq_spark.arrow import SCHEMA
from logmq_spark.batch_reader import LogMQBatchReader
from logmq_spark.options import OptionError, sink_options, source_options
from logmq_spark.stream_reader import LogMQStreamReader
from logmq_spark.writer import LogMQBatchWriter, LogMQStreamWriter, check_topic, sink_columns


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
        check_topic(options)
        return LogMQStreamWriter(options, columns)
