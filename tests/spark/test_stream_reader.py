"""The streaming reader's driver-side decisions, against a fake cluster view (no Spark, no
broker): initial offsets, read limits, Trigger.AvailableNow targets, data loss, group commits."""

from __future__ import annotations

import pickle

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from logmq.client.sync import Admin
from logmq_spark.cluster_view import LogBounds
from logmq_spark.offsets import DataLossError, OffsetRange, RangePartition
from logmq_spark.options import OptionError, source_options
from logmq_spark.stream_reader import LogMQStreamReader


class FakeView:
    def __init__(self, bounds: dict) -> None:
        self.logs = bounds
        self.commits: list[tuple[str, dict]] = []

    def bounds(self, subscription, *, must_exist: bool) -> dict:
        return {tp: b for tp, b in self.logs.items() if subscription.matches(tp[0])}

    def commit_group_offsets(self, group: str, offsets: dict) -> bool:
        self.commits.append((group, dict(offsets)))
        return True

    def close(self) -> None:
        pass


def reader(view: FakeView, **options: str) -> LogMQStreamReader:
    opts = CaseInsensitiveDict({"bootstrap": "127.0.0.1:1", "topic": "t", **options})
    r = LogMQStreamReader(source_options(opts, streaming=True))
    r._view = view  # type: ignore[assignment]
    return r


def logs(**ends: tuple[int, int]) -> dict:
    return {("t", int(p[1:])): LogBounds(*se) for p, se in ends.items()}


def test_initial_offsets() -> None:
    view = FakeView(logs(p0=(5, 50), p1=(0, 10)))
    assert reader(view, startingOffsets="earliest").initialOffset() == {"t": {"0": 5, "1": 0}}
    assert reader(view).initialOffset() == {"t": {"0": 50, "1": 10}}
    r = reader(view, startingOffsets='{"t": {"0": 7, "1": -1}}')
    assert r.initialOffset() == {"t": {"0": 7, "1": 10}}
    with pytest.raises(OptionError, match="missing: t-1"):
        reader(view, startingOffsets='{"t": {"0": 7}}').initialOffset()


def test_latest_offset_honours_read_limits_and_new_partitions() -> None:
    view = FakeView(logs(p0=(0, 100), p1=(0, 100)))
    r = reader(view, maxRecordsPerTrigger="50")
    assert r.getDefaultReadLimit() == ReadMaxRows(50)
    start = {"t": {"0": 0, "1": 0}}
    assert r.latestOffset(start, ReadMaxRows(50)) == {"t": {"0": 25, "1": 25}}
    assert r.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 100, "1": 100}}
    view.logs[("t", 2)] = LogBounds(0, 30)  # a partition appears: read from 0
    end = r.latestOffset({"t": {"0": 100, "1": 100}}, ReadAllAvailable())
    assert end == {"t": {"0": 100, "1": 100, "2": 30}}
    assert r.reportLatestOffset() == end
    parts = r.partitions({"t": {"0": 100, "1": 100}}, end)
    assert [p.range for p in parts if isinstance(p, RangePartition)] == [OffsetRange("t", 2, 0, 30)]


def test_no_new_data_returns_start_unchanged() -> None:
    view = FakeView(logs(p0=(0, 10)))
    start = {"t": {"0": 10}}
    assert reader(view).latestOffset(start, ReadAllAvailable()) == start


def test_available_now_stops_at_the_target() -> None:
    view = FakeView(logs(p0=(0, 100)))
    r = reader(view)
    r.prepareForTriggerAvailableNow()
    view.logs[("t", 0)] = LogBounds(0, 500)
    view.logs[("t", 1)] = LogBounds(0, 20)  # born after the trigger started: not read
    assert r.latestOffset({"t": {"0": 40}}, ReadAllAvailable()) == {"t": {"0": 100}}


def test_data_loss_fails_or_is_skipped() -> None:
    view = FakeView(logs(p0=(0, 10)))
    start, end = {"t": {"0": 50}}, {"t": {"0": 10}}  # the log went backwards
    with pytest.raises(DataLossError, match="failOnDataLoss"):
        reader(view).partitions(start, end)
    assert reader(view, failOnDataLoss="false").partitions(start, end) == []


def test_group_commits(monkeypatch) -> None:
    monkeypatch.setattr(Admin, "commit_group_offsets", lambda *a: None, raising=False)
    view = FakeView(logs(p0=(0, 10)))
    r = reader(view, groupId="pipeline")
    r.latestOffset({"t": {"0": 0}}, ReadAllAvailable())
    r.commit({"t": {"0": 10}})
    r.latestOffset({"t": {"0": 10}}, ReadAllAvailable())  # same offsets: not sent again
    assert view.commits == [("pipeline", {("t", 0): 0}), ("pipeline", {("t", 0): 10})]


def test_group_id_needs_the_client_method(monkeypatch) -> None:
    monkeypatch.delattr(Admin, "commit_group_offsets", raising=False)
    with pytest.raises(OptionError, match="commit_group_offsets"):
        reader(FakeView({}), groupId="g")


def test_pickled_reader_carries_no_client() -> None:
    r = reader(FakeView(logs(p0=(0, 1))))
    clone = pickle.loads(pickle.dumps(r))
    assert clone._view is None and clone.options == r.options
