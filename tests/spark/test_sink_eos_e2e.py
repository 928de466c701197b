"""The exactly-once sink (issue 29) and the read_committed source.

Three layers:

- pure: option parsing, the ids, the driver's ending of transactions, and a hypothesis
  model of the whole protocol (tasks that fail mid-write and are retried, drivers that
  crash part way through their commits and re-run the batch) against a fake
  transactional broker: every row must land exactly once;
- local[2] (the shared session): a failing task's partial write stays invisible to
  read_committed, and a streaming copy with exactlyOnce holds exact counts, also when a
  batch is re-run after its commit-log entry is lost (the driver "crashed" after ending
  the transactions);
- a real standalone cluster (a master, two workers, PySpark's own ``spark-class``)
  whose driver runs in a subprocess: an executor JVM is killed with kill -9 mid-write,
  the job succeeds by task retry, and a read_committed read has every record once.

Run as ``python -m tests.spark.test_sink_eos_e2e ...`` this module is that driver.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logmq import Admin, Consumer
from logmq.errors import ErrorCode, LogMQError
from logmq_spark import writer as sink
from logmq_spark.cluster_view import ClusterView, LogBounds
from logmq_spark.options import OptionError, sink_options, source_options
from logmq_spark.stream_reader import hold_back

TIMEOUT = 120


# -- pure: options and ids --------------------------------------------------------------
def _opts(**kw: str) -> dict[str, str]:
    from pyspark.sql.datasource import CaseInsensitiveDict

    return CaseInsensitiveDict({"bootstrap": "127.0.0.1:1", **kw})


def test_sink_options() -> None:
    o = sink_options(_opts(topic="t"))
    assert not o.exactly_once and o.transactional_id_prefix == "logmq-spark"
    o = sink_options(
        _opts(
            topic="t",
            exactlyonce="TRUE",
            transactionalIdPrefix=" etl ",
            transactionTimeoutMs="5000",
        )
    )
    assert o.exactly_once and o.transactional_id_prefix == "etl"
    assert o.transaction_timeout_ms == 5000
    for bad, mentions in (
        ({"exactlyOnce": "yes"}, "exactlyOnce"),
        ({"exactlyOnce": "true", "acks": "1"}, "acks=all"),
        ({"transactionalIdPrefix": " "}, "transactionalIdPrefix"),
        ({"transactionTimeoutMs": "0"}, "transactionTimeoutMs"),
    ):
        with pytest.raises(OptionError, match=mentions):
            sink_options(_opts(topic="t", **bad))
    stream = sink_options(_opts(exactlyOnce="true"))  # no topic option: routed by column
    sink.check_exactly_once(stream, streaming=False)
    with pytest.raises(OptionError, match="needs the option 'topic'"):
        sink.check_exactly_once(stream, streaming=True)


def test_source_isolation_level() -> None:
    assert source_options(_opts(topic="t"), streaming=True).read_committed
    o = source_options(_opts(topic="t", isolationLevel="READ_UNCOMMITTED"), streaming=False)
    assert o.isolation_level == "read_uncommitted" and not o.read_committed
    o = source_options(
        _opts(topic="t", **{"kafka.isolation.level": "read_uncommitted"}), streaming=True
    )
    assert not o.read_committed
    with pytest.raises(OptionError, match="isolationLevel"):
        source_options(_opts(topic="t", isolationLevel="serializable"), streaming=True)


def test_ids_are_one_per_task_and_epoch() -> None:
    o = sink_options(_opts(topic="out", exactlyOnce="true", transactionalIdPrefix="etl"))
    t = sink.stream_task_txn(o, "q1", 7, 3)
    assert t.transactional_id == "etl-q1-3"  # the query's, for every micro-batch
    assert (t.marker_group, t.marker_topic, t.batch_id) == ("etl-q1-3", "out", 7)
    later = sink.stream_task_txn(o, "q1", 8, 3)
    assert (later.transactional_id, later.marker_group) == (t.transactional_id, t.marker_group)
    b = sink.batch_task_txn(o, "w9", 2)
    assert b.transactional_id == "etl-w9-2" and b.marker_group is None


def test_hold_back_waits_at_a_start_past_the_lso() -> None:
    bounds = {
        ("t", 0): LogBounds(0, 10, 15),
        ("t", 1): LogBounds(0, 10, 15),
        ("t", 2): LogBounds(0, 4),
    }
    # p0: a checkpoint (read uncommitted) at 12 <= HW waits; p1: 20 > HW is a real loss
    # and stays visible as such; p2: no HW known (read_uncommitted view).
    begin = {("t", 0): 12, ("t", 1): 20, ("t", 2): 9}
    assert hold_back(begin, bounds) == {("t", 0): 12, ("t", 1): 10, ("t", 2): 4}
    assert hold_back({}, bounds) == {("t", 0): 10, ("t", 1): 10, ("t", 2): 4}


# -- pure: a fake transactional broker, to model the protocol ---------------------------
class TaskCrash(Exception):
    """A task dies mid-write (its executor is gone)."""


class FakeBroker:
    """Transactions as the contract describes them, in memory: InitProducerId fences the
    previous producer of an id and aborts its open (or prepared) transaction; EndTxn from
    anyone with the right (id, producer id, epoch); committed offsets become visible with
    the transaction."""

    def __init__(self) -> None:
        self.log: list[bytes] = []
        self.offsets: dict[tuple[str, tuple[str, int]], int] = {}
        self.epochs: dict[str, int] = {}
        self.open: dict[str, tuple[int, list[bytes], dict, str]] = {}  # id -> epoch, ...
        self.done: dict[tuple[str, int], bool] = {}  # (id, epoch) -> committed?
        self.crash_after_sends: int | None = None
        self.hard_crash = False

    def init(self, tid: str) -> int:
        old = self.open.pop(tid, None)
        if old is not None:
            self.done[(tid, old[0])] = False
        self.epochs[tid] = self.epochs.get(tid, -1) + 1
        return self.epochs[tid]

    def end(self, tid: str, epoch: int, commit: bool) -> None:
        if (tid, epoch) in self.done:
            if self.done[(tid, epoch)] != commit:
                raise LogMQError("ended the other way", ErrorCode.INVALID_TXN_STATE)
            return
        cur = self.open.get(tid)
        if cur is None or cur[0] != epoch or cur[3] != "prepared":
            raise LogMQError("fenced", ErrorCode.PRODUCER_FENCED)
        del self.open[tid]
        self.done[(tid, epoch)] = commit
        if commit:
            self.log.extend(cur[1])
            self.offsets.update(cur[2])


class _Done(concurrent.futures.Future):
    def __init__(self) -> None:
        super().__init__()
        self.set_result([])


class FakeProducer:
    def __init__(self, broker: FakeBroker, bootstrap: str, **config: Any) -> None:
        self.b = broker
        self.tid: str = config["transactional_id"]
        self.epoch = -1

    def _live(self) -> tuple[int, list[bytes], dict, str]:
        cur = self.b.open.get(self.tid)
        if self.b.epochs.get(self.tid) != self.epoch:
            raise LogMQError("fenced", ErrorCode.PRODUCER_FENCED)
        assert cur is not None
        return cur

    def init_transactions(self) -> None:
        self.epoch = self.b.init(self.tid)

    def begin_transaction(self) -> None:
        self.b.open[self.tid] = (self.epoch, [], {}, "ongoing")

    def send_batch(self, topic: str, values: list, keys: Any = None, partition: Any = None):
        if self.b.crash_after_sends is not None:
            if self.b.crash_after_sends == 0:
                self.b.crash_after_sends = None
                raise TaskCrash()
            self.b.crash_after_sends -= 1
        self._live()[1].extend(values)
        return _Done()

    def send_offsets_to_transaction(self, offsets: dict, group_id: str) -> None:
        cur = self._live()
        cur[2].update({(group_id, tp): o for tp, o in offsets.items()})

    def flush(self, timeout: float | None = None) -> None:
        pass

    def prepare_transaction(self) -> tuple[str, int, int]:
        e, records, offsets, _ = self._live()
        self.b.open[self.tid] = (e, records, offsets, "prepared")
        return self.tid, 1000, self.epoch

    def abort_transaction(self) -> None:
        if self.b.hard_crash:  # kill -9: the attempt aborts nothing, its retry must
            raise LogMQError("connection lost", ErrorCode.NETWORK_EXCEPTION)
        self._live()
        cur = self.b.open.pop(self.tid)
        self.b.done[(self.tid, cur[0])] = False

    def close(self) -> None:
        pass

    def __enter__(self) -> FakeProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class FakeAdmin:
    def __init__(self, broker: FakeBroker, bootstrap: str) -> None:
        self.b = broker

    def __enter__(self) -> FakeAdmin:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def group_offsets(self, group: str, tps: list) -> dict:
        out = {}
        for tp in tps:
            if (group, tp) in self.b.offsets:
                out[tp] = type("OM", (), {"offset": self.b.offsets[(group, tp)]})()
        return out

    def complete_transaction(self, tid: str, pid: int, epoch: int, *, commit: bool) -> None:
        self.b.end(tid, epoch, commit)


def _arrow_batches(rows: list[bytes], size: int) -> list[Any]:
    import pyarrow as pa

    return [
        pa.RecordBatch.from_arrays([pa.array(rows[i : i + size], pa.binary())], ["value"])
        for i in range(0, len(rows), size)
    ]


def _install(monkeypatch: pytest.MonkeyPatch) -> FakeBroker:
    broker = FakeBroker()
    monkeypatch.setattr(sink, "Producer", lambda *a, **k: FakeProducer(broker, *a, **k))
    monkeypatch.setattr(sink, "Admin", lambda *a, **k: FakeAdmin(broker, *a, **k))
    return broker


@pytest.fixture
def fake_broker(monkeypatch: pytest.MonkeyPatch) -> FakeBroker:
    return _install(monkeypatch)


COLUMNS = sink.SinkColumns(key=False, topic=False, partition=False, headers=False)
EOS = sink_options(_opts(topic="out", exactlyOnce="true"))


def _run_task(txn: sink.TaskTxn, rows: list[bytes]) -> sink.LogMQCommitMessage:
    return sink._TxnTaskWriter(EOS, COLUMNS, txn).write_all_in_txn(iter(_arrow_batches(rows, 3)))


def test_task_prepares_and_the_driver_commits(fake_broker: FakeBroker) -> None:
    txn = sink.batch_task_txn(EOS, "w", 0)
    m = _run_task(txn, [b"a", b"b", b"c", b"d"])
    assert (m.records, m.transactional_id, m.skipped) == (4, "logmq-spark-w-0", False)
    assert fake_broker.log == []  # a task never commits
    sink.end_transactions("x", [m, None], commit=True)
    assert fake_broker.log == [b"a", b"b", b"c", b"d"]
    sink.end_transactions("x", [m], commit=True)  # again: already done the same way
    assert (
        sink._TxnTaskWriter(EOS, COLUMNS, txn).write_all_in_txn(iter([])).transactional_id is None
    )


def test_commit_tries_every_transaction_then_raises(fake_broker: FakeBroker) -> None:
    ms = [_run_task(sink.batch_task_txn(EOS, "w", p), [bytes([p])]) for p in range(3)]
    fake_broker.init("logmq-spark-w-1")  # a newer attempt fenced partition 1's
    with pytest.raises(LogMQError, match="other way"):
        sink.end_transactions("x", ms, commit=True)
    assert sorted(fake_broker.log) == [b"\x00", b"\x02"]
    sink.end_transactions("x", ms, commit=False)  # abort only logs what it cannot end


def test_abort_ends_prepared_and_fences_silent_tasks(fake_broker: FakeBroker) -> None:
    """Partition 1's task died without a word (its transaction still open): the driver's
    abort fences its id, which aborts it; partition 0's prepared one is aborted."""
    done = _run_task(sink.batch_task_txn(EOS, "w", 0), [b"a"])
    fake_broker.hard_crash, fake_broker.crash_after_sends = True, 1
    with pytest.raises(TaskCrash):
        _run_task(sink.batch_task_txn(EOS, "w", 1), [b"b", b"c", b"d", b"e"])
    assert set(fake_broker.open) == {"logmq-spark-w-0", "logmq-spark-w-1"}
    fake_broker.hard_crash = False
    sink.abort_write(EOS, [done, None], "w")
    assert fake_broker.open == {} and fake_broker.log == []


def test_failed_task_aborts_its_transaction(fake_broker: FakeBroker) -> None:
    fake_broker.crash_after_sends = 1
    with pytest.raises(TaskCrash):
        _run_task(sink.batch_task_txn(EOS, "w", 0), [b"a", b"b", b"c", b"d"])
    assert fake_broker.open == {} and fake_broker.log == []


def test_streaming_rerun_skips_a_committed_partition(fake_broker: FakeBroker) -> None:
    first = _run_task(sink.stream_task_txn(EOS, "q", 5, 0), [b"x"])
    sink.end_transactions("x", [first], commit=True)
    again = _run_task(sink.stream_task_txn(EOS, "q", 5, 0), [b"x"])
    assert again.skipped and again.transactional_id is None
    assert fake_broker.log == [b"x"]
    nxt = _run_task(sink.stream_task_txn(EOS, "q", 6, 0), [b"y"])  # the next batch writes
    sink.end_transactions("x", [nxt], commit=True)
    assert fake_broker.log == [b"x", b"y"]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(  # per micro-batch: crash points of the driver's commit loop, task failures
        st.tuples(
            st.lists(st.integers(0, 3), max_size=2),  # the driver dies after k commits
            st.lists(  # (partition, sends before it dies, killed without aborting?)
                st.tuples(st.integers(0, 2), st.integers(0, 2), st.booleans()), max_size=3
            ),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_model_every_row_once(monkeypatch: pytest.MonkeyPatch, batches: list) -> None:
    """Micro-batches over 3 Spark partitions. Tasks die mid-write (aborting, or killed
    with their transaction left open) and are retried, the retry fencing the attempt;
    the driver may die after ending only some transactions, and the query then re-runs
    the same batch. Every row lands exactly once."""
    with monkeypatch.context() as m:
        broker = _install(m)
        want: list[bytes] = []
        for batch_id, (crashes, failures) in enumerate(batches):
            rows = {p: [f"{batch_id}-{p}-{i}".encode() for i in range(4)] for p in range(3)}
            want += [r for p in range(3) for r in rows[p]]
            failing = list(failures)
            for crash_after in [*crashes, None]:  # each driver crash re-runs the batch
                messages = [
                    _task_with_retries(broker, batch_id, p, rows[p], failing) for p in range(3)
                ]
                ended = messages if crash_after is None else messages[:crash_after]
                sink.end_transactions("x", ended, commit=True)
        assert Counter(broker.log) == Counter(want)


def _task_with_retries(
    broker: FakeBroker, batch_id: int, p: int, rows: list[bytes], failing: list
) -> sink.LogMQCommitMessage:
    while True:
        fail = next((f for f in failing if f[0] == p), None)
        if fail is not None:
            failing.remove(fail)
            broker.crash_after_sends, broker.hard_crash = fail[1], fail[2]
        try:
            return _run_task(sink.stream_task_txn(EOS, "q", batch_id, p), rows)
        except TaskCrash:
            continue
        finally:
            broker.crash_after_sends, broker.hard_crash = None, False


# -- helpers for the end-to-end tests ---------------------------------------------------
def log_ends(bootstrap: str, topic: str, partitions: int, *, committed: bool) -> list[int]:
    """Each partition's LSO (committed) or high watermark."""
    tps = [(topic, p) for p in range(partitions)]
    if committed:
        view = ClusterView(bootstrap, read_committed=True)
        try:
            stable = view.stable_offsets(tps)
        finally:
            view.close()
        return [stable[tp] for tp in tps]
    with Admin(bootstrap) as admin:
        got = admin.list_offsets(dict.fromkeys(tps, -1))
    return [got[tp][0] for tp in tps]


def read_topic(bootstrap: str, topic: str, partitions: int, *, committed: bool = True) -> list:
    """Every record of ``topic`` up to its LSO (read_committed) or high watermark."""
    ends = log_ends(bootstrap, topic, partitions, committed=committed)
    isolation = "read_committed" if committed else "read_uncommitted"
    records: list = []
    with Consumer(bootstrap, auto_offset_reset="earliest", isolation_level=isolation) as c:
        tps = [(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning()
        deadline = time.monotonic() + 60
        while any(c.position(t, p) < ends[p] for t, p in tps):
            assert time.monotonic() < deadline, f"read {len(records)} records of {topic}"
            records.extend(r for r in c.poll(timeout=1.0) if r.offset < ends[r.partition])
    return records


def wait_for(condition: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


# -- local[2]: a failed write, a streaming copy ------------------------------------------
def test_failed_task_write_is_invisible_to_read_committed(spark, spark_broker, topic_name) -> None:
    """Task 1 dies after its records are in the log: the job fails, nothing is visible to
    read_committed (the finished task's transaction is aborted by the driver, the failed
    one's by itself), and no transaction is left holding the LSO back. The same write
    again succeeds with every row once."""
    bootstrap = spark_broker.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)

    def fail_task_1(batches: Iterator[Any]) -> Iterator[Any]:
        # Self-contained: it runs in a Spark Python worker, which cannot import this module.
        import time

        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark import TaskContext

        from logmq import Admin

        for b in batches:  # 1 KB values: Spark's pipe buffers pass each batch on at once
            value = pc.utf8_rpad(pc.cast(b.column(0), pa.string()), 1000, ".")
            yield pa.RecordBatch.from_arrays([value], ["value"])
        if TaskContext.get().partitionId() == 1:
            deadline = time.monotonic() + 60
            with Admin(bootstrap) as admin:  # wait until its records are in the log
                while admin.list_offsets({(topic_name, 1): -1})[(topic_name, 1)][0] == 0:
                    assert time.monotonic() < deadline, "no record of task 1 in the log"
                    time.sleep(0.05)
            raise RuntimeError("task 1 dies mid-write")

    def frame(fail: bool):
        df = spark.range(0, 2000, numPartitions=2)
        if fail:
            df = df.mapInArrow(fail_task_1, "value string")
        else:
            df = df.selectExpr("rpad(cast(id as string), 1000, '.') as value")
        return df.selectExpr("value", "cast(spark_partition_id() as int) as partition")

    def write(df) -> None:
        df.write.format("logmq").option("bootstrap", bootstrap).option("topic", topic_name).option(
            "exactlyOnce", "true"
        ).mode("append").save()

    # Small Arrow batches, so the sink gets rows while the failing function still runs.
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "100")
    try:
        with pytest.raises(Exception, match="task 1 dies mid-write"):
            write(frame(fail=True))
    finally:
        spark.conf.set(key, before)
    assert read_topic(bootstrap, topic_name, 2) == []
    dirty = read_topic(bootstrap, topic_name, 2, committed=False)
    assert dirty, "the failed attempt's records are in the log, aborted"
    wait_for(
        lambda: (
            log_ends(bootstrap, topic_name, 2, committed=True)
            == log_ends(bootstrap, topic_name, 2, committed=False)
        ),
        "no transaction left open",
    )

    write(frame(fail=False))
    got = Counter(r.value.rstrip(b".") for r in read_topic(bootstrap, topic_name, 2))
    assert got == Counter(str(i).encode() for i in range(2000))


def _last_commit(checkpoint: Path) -> Path:
    commits = [f for f in (checkpoint / "commits").iterdir() if f.name.isdigit()]
    return max(commits, key=lambda f: int(f.name))


def test_streaming_copy_exactly_once_across_a_rerun(
    spark, spark_broker, topic_name, tmp_path
) -> None:
    """A read_committed stream copied with exactlyOnce holds every record once; a batch
    re-run because its commit-log entry is lost (the driver died after ending the
    transactions) writes nothing again; a later run adds exactly the new records."""
    bootstrap = spark_broker.bootstrap
    src, dst = f"{topic_name}-src", f"{topic_name}-dst"
    with Admin(bootstrap) as admin:
        admin.create_topic(src, partitions=2)
        admin.create_topic(dst, partitions=3)
    checkpoint = tmp_path / "checkpoint"

    def produce(first: int, n: int) -> None:  # transactional too: markers in the source
        spark.range(first, first + n, numPartitions=2).selectExpr(
            "cast(id as string) as key", "concat('v', id) as value"
        ).write.format("logmq").option("bootstrap", bootstrap).option("topic", src).option(
            "exactlyOnce", "true"
        ).mode("append").save()

    def run() -> str:
        query = (
            spark.readStream.format("logmq")
            .option("bootstrap", bootstrap)
            .option("topic", src)
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", "250")
            .load()
            .select("key", "value")
            .writeStream.format("logmq")
            .option("bootstrap", bootstrap)
            .option("topic", dst)
            .option("exactlyOnce", "true")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(TIMEOUT)
        assert query.exception() is None
        return str(query.id)

    def values(committed: bool = True) -> Counter:
        return Counter(r.value for r in read_topic(bootstrap, dst, 3, committed=committed))

    def producer_epoch(query_id: str) -> int:
        with Admin(bootstrap) as admin:
            (txn,) = admin.describe_transactions([f"logmq-spark-{query_id}-0"])
        return txn.producer_epoch

    produce(0, 600)
    first_id = run()
    want = Counter(f"v{i}".encode() for i in range(600))
    assert values() == want
    before = producer_epoch(first_id)

    last = _last_commit(checkpoint)
    last.unlink()  # as if the driver died after ending the transactions
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    query_id = run()
    assert values() == want
    assert values(committed=False) == want, "the re-run wrote nothing again"
    assert query_id == first_id  # the checkpoint keeps the query's id
    assert producer_epoch(query_id) == before + 1  # the batch did run again: re-initialized

    produce(600, 300)
    run()
    assert values() == want + Counter(f"v{i}".encode() for i in range(600, 900))


# -- a real standalone cluster: kill -9 an executor mid-write ---------------------------
RECORDS = 20_000
PARTITIONS = 4  # Spark partition p writes sink partition p
ARROW_ROWS = 500  # rows per Arrow batch into the sink; one pause per batch: ~5 s a task
PAUSE_MS = 500
VALUE_BYTES = 1000  # big enough that Spark's pipe buffers pass each Arrow batch at once


class Standalone:
    """A Spark standalone master and two one-core workers started with PySpark's own
    ``spark-class``, everything bound to 127.0.0.1, state in a temp dir."""

    def __init__(self, base: Path) -> None:
        import pyspark

        from tests.harness import free_port

        self.base = base
        self.home = os.path.dirname(pyspark.__file__)
        self.port, self.ui_port = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "SPARK_HOME": self.home,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(base / "logs"),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
        self.procs: list[subprocess.Popen] = []
        self.workers: list[subprocess.Popen] = []

    def _spawn(self, name: str, *args: str) -> subprocess.Popen:
        out = open(self.base / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [os.path.join(self.home, "bin", "spark-class"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.base,
        )
        out.close()
        self.procs.append(proc)
        return proc

    def alive_workers(self) -> int:
        import json
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                return int(json.load(r).get("aliveworkers", 0))
        except OSError:
            return 0

    def start(self) -> Standalone:
        from tests.harness import free_port

        master = ["--host", "127.0.0.1", "--port", str(self.port)]
        master += ["--webui-port", str(self.ui_port)]
        self._spawn("master", "org.apache.spark.deploy.master.Master", *master)
        for i in range(2):
            work = self.base / f"worker-{i}"
            work.mkdir()
            args = [self.url, "--host", "127.0.0.1", "--cores", "1", "--memory", "1g"]
            args += ["--webui-port", str(free_port()), "--work-dir", str(work)]
            worker = self._spawn(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", *args)
            self.workers.append(worker)
        wait_for(lambda: self.alive_workers() == 2, "two live Spark workers", timeout=90)
        return self

    def executors(self, app_id: str) -> list[int]:
        """Pids of this app's executor JVMs: children of our workers (from /proc)."""
        workers = {w.pid for w in self.workers}
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                args = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:  # gone meanwhile
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            decoded = [a.decode(errors="replace") for a in args]
            executor = any(a.endswith("CoarseGrainedExecutorBackend") for a in decoded)
            if ppid in workers and executor and app_id in decoded:
                found.append(int(entry.name))
        return found

    def stop(self) -> None:
        for proc in reversed(self.procs):  # workers first: they take their executors along
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def standalone(tmp_path) -> Iterator[Standalone]:
    from tests.spark.conftest import java_available

    if not java_available():
        pytest.skip("Spark needs Java 17: no java on PATH or in JAVA_HOME")
    cluster = Standalone(tmp_path)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def test_kill_executor_mid_write_on_a_standalone_cluster(
    standalone: Standalone, spark_broker, topic_name, tmp_path
) -> None:
    bootstrap = spark_broker.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=PARTITIONS)
    driver_log = tmp_path / "driver.log"
    with open(driver_log, "wb") as out:
        driver = subprocess.Popen(
            [
                *(sys.executable, "-m", "tests.spark.test_sink_eos_e2e", standalone.url),
                *(bootstrap, topic_name, str(tmp_path / "driver-local")),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=standalone.env,
            cwd=Path(__file__).resolve().parents[2],
        )
    try:

        def app_id() -> str | None:
            for line in driver_log.read_text(errors="replace").splitlines():
                if line.startswith("APP "):
                    return line.split()[1]
            assert driver.poll() is None, driver_log.read_text(errors="replace")[-3000:]
            return None

        wait_for(lambda: app_id() is not None, "the driver to start", timeout=90)
        app = app_id()
        assert app is not None
        # Both first-wave tasks are writing (their records are in the log, uncommitted).
        wait_for(
            lambda: (
                min(log_ends(bootstrap, topic_name, PARTITIONS, committed=False)[:2]) > 0
                or driver.poll() is not None
            ),
            "two tasks writing",
            timeout=90,
        )
        assert driver.poll() is None, "the write finished before an executor was killed"
        executors = standalone.executors(app)
        assert executors, f"no executor of {app} found"
        os.kill(executors[0], signal.SIGKILL)
        assert driver.wait(TIMEOUT) == 0, driver_log.read_text(errors="replace")[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)
    text = driver_log.read_text(errors="replace")
    assert "DONE" in text, text[-3000:]
    got = Counter(r.value.rstrip(b".") for r in read_topic(bootstrap, topic_name, PARTITIONS))
    assert got == Counter(str(i).encode() for i in range(RECORDS))
    # The killed attempt's records are in the log too, aborted: the kill hit mid-write.
    assert len(read_topic(bootstrap, topic_name, PARTITIONS, committed=False)) > RECORDS


def main(argv: list[str]) -> None:
    """The standalone test's driver: write RECORDS with exactlyOnce, print DONE."""
    master, bootstrap, topic, local_dir = argv
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from logmq_spark import LogMQDataSource

    spark = (
        SparkSession.builder.master(master)
        .appName("logmq-eos-kill-test")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .config("spark.local.dir", local_dir)
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(ARROW_ROWS))
        .getOrCreate()
    )
    spark.dataSource.register(LogMQDataSource)
    print("APP", spark.sparkContext.applicationId, flush=True)
    pause = f"reflect('java.lang.Thread', 'sleep', cast({PAUSE_MS} as bigint))"
    (
        spark.range(0, RECORDS, numPartitions=PARTITIONS)
        .selectExpr(
            f"rpad(cast(id as string), {VALUE_BYTES}, '.') as value",
            "cast(spark_partition_id() as int) as partition",
            f"case when id % {ARROW_ROWS} = 0 then {pause} end as pace",  # slows the write
        )
        .write.format("logmq")
        .option("bootstrap", bootstrap)
        .option("topic", topic)
        .option("exactlyOnce", "true")
        .mode("append")
        .save()
    )
    print("DONE", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
