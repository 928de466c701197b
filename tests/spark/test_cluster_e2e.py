"""The source and sink against a 3-broker replicated cluster: tasks read from each
partition's leader, wherever it is, and the sink writes through leader routing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from logmq import Admin
from tests.harness import BrokerCluster
from tests.spark.records import consume_all, from_rows, produce


@pytest.fixture(scope="module")
def cluster(spark) -> Iterator[BrokerCluster]:
    c = BrokerCluster(3, log_level="warning").start()
    try:
        yield c
    finally:
        c.close()


def test_batch_read_and_write_on_a_replicated_cluster(spark, cluster, topic_name) -> None:
    bootstrap = cluster.bootstrap
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    with Admin(bootstrap) as admin:
        admin.create_topic(source, partitions=4, replication_factor=3)
        admin.create_topic(sink, partitions=2, replication_factor=3)
        leaders = {p.leader for p in admin.describe_topics([source])[source].partitions}
    assert len(leaders) > 1, "leaders should be spread over the brokers"

    produced = produce(bootstrap, source, 2000, headers_every=7)
    df = spark.read.format("logmq").option("bootstrap", bootstrap).option("topic", source).load()
    assert from_rows(df.collect()) == produced

    df.select("key", "value", "headers").write.format("logmq").option(
        "bootstrap", bootstrap
    ).option("topic", sink).mode("append").save()
    copied = {(r.key, r.value) for r in consume_all(bootstrap, sink, 2)}
    assert copied == {(k, v) for k, v, _ in produced.values()}
