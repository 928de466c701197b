"""The clickstream example (spark/examples) end to end: both sinks get the right counts."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path
from types import ModuleType

from logmq import Admin
from tests.spark.records import consume_all

EXAMPLES = Path(__file__).resolve().parents[2] / "spark" / "examples"
TIMEOUT = 180
NOW_MS = 1_700_000_025_000  # 45 s past a minute: the watermark is far from window edges


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_windowed_counts_reach_logmq_and_parquet(spark, spark_broker, topic_name, tmp_path):
    producer, job = example("clickstream_producer"), example("clickstream_job")
    clicks, counts_topic = f"{topic_name}-clicks", f"{topic_name}-counts"
    producer.ensure_topic(spark_broker.bootstrap, clicks, 4)
    with Admin(spark_broker.bootstrap) as admin:
        admin.create_topic(counts_topic, partitions=2)
    events = list(
        producer.click_events(3000, span_s=300, disorder_s=0, users=50, seed=1, now_ms=NOW_MS)
    )
    assert producer.produce(spark_broker.bootstrap, clicks, iter(events)) == 3000

    args = job.parse_args(
        [
            "--bootstrap", spark_broker.bootstrap,
            "--source", clicks,
            "--sink-topic", counts_topic,
            "--output", str(tmp_path / "parquet"),
            "--checkpoint", str(tmp_path / "checkpoint"),
            "--available-now",
        ]
    )  # fmt: skip
    for query in job.start_queries(spark, args):
        assert query.awaitTermination(TIMEOUT)

    # append mode emits a window once the watermark (max event time - 30 s) passes its end
    watermark = max(e["ts"] for e in events) - 30_000
    want = Counter()
    for e in events:
        start = e["ts"] - e["ts"] % 60_000
        if start + 60_000 <= watermark:
            want[(start, e["page"])] += 1
    assert want, "the test data should close some windows"

    parquet = spark.read.parquet(str(tmp_path / "parquet")).collect()
    got = {(int(r.window_start.timestamp() * 1000), r.page): r.clicks for r in parquet}
    assert got == dict(want)

    from_logmq = {}
    for record in consume_all(spark_broker.bootstrap, counts_topic, 2):
        row = json.loads(record.value)
        assert record.key == row["page"].encode()
        start = row["window_start"]
        from_logmq[(start, row["page"])] = row["clicks"]
    assert sorted(from_logmq.values()) == sorted(want.values())
    assert len(from_logmq) == len(want)
