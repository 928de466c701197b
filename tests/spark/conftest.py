"""Fixtures for the Spark source and sink tests: one local[2] SparkSession for the whole
run, one broker process per module, fresh topics per test.

Spark needs Java; without it the end-to-end tests skip with that reason (CI has Java 17).
The pure tests (options, offsets, arrow) need only the pyspark and pyarrow packages.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from tests.harness import BrokerProcess
from tests.spark.threaded_broker import ThreadedBroker


def java_available() -> bool:
    home = os.environ.get("JAVA_HOME")
    return bool(shutil.which("java") or (home and Path(home, "bin", "java").exists()))


_names = itertools.count()


@pytest.fixture(scope="session")
def spark(tmp_path_factory) -> Iterator[object]:
    if not java_available():
        pytest.skip("Spark needs Java 17: no java on PATH or in JAVA_HOME")
    # Executors start Python workers; they must run this interpreter (logmq_spark is here).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from logmq_spark import LogMQDataSource

    base = tmp_path_factory.mktemp("spark")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("logmq-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(base / "warehouse"))
        .config("spark.local.dir", str(base / "local"))
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(LogMQDataSource)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def spark_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    """A ``logmq-server`` process shared by a module's tests (each uses its own topics)."""
    b = BrokerProcess(tmp_path_factory.mktemp("spark-broker") / "data")
    b.start()
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def threaded_broker(tmp_path_factory) -> Iterator[ThreadedBroker]:
    """A broker whose storage the test can drive (run retention now)."""
    b = ThreadedBroker(tmp_path_factory.mktemp("spark-threaded-broker") / "data")
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def topic_name(request) -> str:
    return f"{request.node.name[:40].replace('[', '_').replace(']', '')}-{next(_names)}"
