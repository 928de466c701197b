"""logmq as a PySpark source and sink (PySpark 4's Python Data Source API).

    from logmq_spark import LogMQDataSource
    spark.dataSource.register(LogMQDataSource)
    df = spark.readStream.format("logmq").option("bootstrap", "127.0.0.1:9192") \\
        .option("topic", "clicks").load()

Module map: source (the DataSource), options (parsing and checks), offsets (offset JSON
and range planning, pure), positions (startingOffsets/endingOffsets resolution),
cluster_view (the driver's admin queries), batch_reader and stream_reader (the Spark
reader APIs), partition_reader (a task reading one offset range), arrow (the schema and
Arrow conversion), writer (the sink). docs/spark.md has the user guide.
"""

from logmq_spark.arrow import SCHEMA
from logmq_spark.offsets import DataLossError
from logmq_spark.options import OptionError
from logmq_spark.source import LogMQDataSource

__all__ = ["SCHEMA", "DataLossError", "LogMQDataSource", "OptionError"]
