"""commit(end) mirrors a streaming query's progress into a logmq consumer group."""

from __future__ import annotations

import pytest

from logmq import Admin
from tests.spark.records import produce

pytestmark = pytest.mark.skipif(
    not hasattr(Admin, "commit_group_offsets"),
    reason="needs Admin.commit_group_offsets (consumer groups, issue 4), not in the client",
)

TIMEOUT = 120


def test_progress_is_committed_to_the_group(spark, spark_broker, topic_name, tmp_path) -> None:
    with Admin(spark_broker.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)
    produced = produce(spark_broker.bootstrap, topic_name, 400)
    ends = {(topic_name, p): 1 + max(o for q, o in produced if q == p) for p in (0, 1)}
    group = f"spark-{topic_name}"
    query = (
        spark.readStream.format("logmq")
        .option("bootstrap", spark_broker.bootstrap)
        .option("topic", topic_name)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "150")
        .option("groupId", group)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(TIMEOUT)
    # the final position of the availableNow run is committed, not just the one before it
    with Admin(spark_broker.bootstrap) as admin:
        committed = admin.group_offsets(group, list(ends))
    assert {tp: c.offset for tp, c in committed.items()} == ends
