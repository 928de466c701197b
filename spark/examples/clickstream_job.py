"""The clickstream streaming job: clicks per page per time window, to logmq and to parquet.

Reads the click events from logmq, counts clicks per page in event-time windows
(``--window``, default 1 minute) with a watermark (``--watermark``, default 30 s: events
later than that are dropped), and writes each window's final count, once the watermark
has passed its end (append mode), to two sinks:

- the logmq topic ``--sink-topic`` (key: the page; value: JSON
  ``{"window_start", "window_end", "page", "clicks"}``), created if missing;
- parquet files under ``--output``.

Each sink is its own streaming query with its own checkpoint under ``--checkpoint``, so
each restarts where it stopped. ``--available-now`` processes what is in the topic and
exits; otherwise the job runs until Ctrl-C, triggering every ``--interval``.

    python spark/examples/clickstream_job.py --output /tmp/clicks/parquet \\
        --checkpoint /tmp/clicks/checkpoint --available-now

See docs/spark.md for the whole pipeline.
"""

from __future__ import annotations

import argparse
import os
import sys

CLICK_SCHEMA = "user string, page string, ts long, referrer string"


def page_counts(spark, bootstrap: str, topic: str, window: str, watermark: str, group: str | None):
    """The windowed count of clicks per page, as a streaming DataFrame."""
    from pyspark.sql import functions as F

    reader = (
        spark.readStream.format("logmq")
        .option("bootstrap", bootstrap)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
    )
    if group:
        reader = reader.option("groupId", group)
    clicks = (
        reader.load()
        .select(F.from_json(F.col("value").cast("string"), CLICK_SCHEMA).alias("click"))
        .select("click.*")
        .where(F.col("page").isNotNull())  # skip events that are not valid JSON clicks
        .withColumn("event_time", F.timestamp_millis("ts"))
    )
    return (
        clicks.withWatermark("event_time", watermark)
        .groupBy(F.window("event_time", window), "page")
        .agg(F.count(F.lit(1)).alias("clicks"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "page",
            "clicks",
        )
    )


def start_queries(spark, args) -> list:
    """Start the two sink queries; returns them (the caller waits for them)."""
    from pyspark.sql import functions as F

    def counts(group: str | None):
        return page_counts(spark, args.bootstrap, args.source, args.window, args.watermark, group)

    def trigger(writer):
        if args.available_now:
            return writer.trigger(availableNow=True)
        return writer.trigger(processingTime=args.interval)

    # Only the logmq-bound query reports to the consumer group: two queries committing
    # their own positions to one group would make its lag meaningless.
    to_logmq = trigger(
        counts(args.group)
        .select(
            F.col("page").alias("key"),
            F.to_json(F.struct("window_start", "window_end", "page", "clicks")).alias("value"),
        )
        .writeStream.format("logmq")
        .outputMode("append")
        .option("bootstrap", args.bootstrap)
        .option("topic", args.sink_topic)
        .option("checkpointLocation", os.path.join(args.checkpoint, "to-logmq"))
    ).start()
    to_parquet = trigger(
        counts(None)
        .writeStream.format("parquet")
        .outputMode("append")
        .option("path", args.output)
        .option("checkpointLocation", os.path.join(args.checkpoint, "to-parquet"))
    ).start()
    return [to_logmq, to_parquet]


def session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from logmq_spark import LogMQDataSource

    spark = (
        SparkSession.builder.appName("logmq-clickstream")
        .master(os.environ.get("SPARK_MASTER", "local[2]"))
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(LogMQDataSource)
    return spark


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--bootstrap",
        default=os.environ.get("LOGMQ_BOOTSTRAP", "127.0.0.1:9192"),
        help="native port(s), as for the logmq CLI (default: $LOGMQ_BOOTSTRAP or 127.0.0.1:9192)",
    )
    parser.add_argument("--source", default="clicks", help="topic of click events")
    parser.add_argument("--sink-topic", default="page-counts")
    parser.add_argument("--sink-partitions", type=int, default=4, help="when creating it")
    parser.add_argument("--output", required=True, help="parquet output directory")
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory")
    parser.add_argument("--window", default="1 minute")
    parser.add_argument("--watermark", default="30 seconds")
    parser.add_argument(
        "--group", help="commit the logmq sink query's progress to this consumer group"
    )
    parser.add_argument("--available-now", action="store_true", help="process and exit")
    parser.add_argument("--interval", default="10 seconds", help="trigger interval")
    return parser.parse_args(argv)


def main() -> None:
    from logmq import Admin

    args = parse_args()
    with Admin(args.bootstrap) as admin:
        if args.sink_topic not in admin.list_topics():
            admin.create_topic(args.sink_topic, partitions=args.sink_partitions)
    spark = session()
    queries = start_queries(spark, args)
    try:
        for q in queries:
            q.awaitTermination()
    except KeyboardInterrupt:
        for q in queries:
            q.stop()
    finally:
        spark.stop()
    print(f"done: window counts in topic {args.sink_topic!r} and under {args.output}")


if __name__ == "__main__":
    main()
