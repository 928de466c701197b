"""Shared fixtures: real brokers (see tests/harness.py)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from tests.harness import BrokerProcess, compile_sources, inprocess_broker

# Brokers started by other launchers (fault harness, dev cluster, CLI tests) serve Kafka
# on a free port instead of contending for 9092.
os.environ.setdefault("LOGMQ_KAFKA_PORT", "0")


def pytest_sessionstart(session: pytest.Session) -> None:
    compile_sources()  # broker subprocesses then start without compiling the package


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak", action="store_true", default=False, help="run tests marked soak (long)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``soak`` run only with ``--soak``, and then with a timeout that fits
    LOGMQ_SOAK_SECONDS plus their setup and final checks (the suite's per-test timeout,
    300 s, is shorter than a default soak)."""
    if config.getoption("--soak"):
        seconds = float(os.environ.get("LOGMQ_SOAK_SECONDS", "300"))
        for item in items:
            if "soak" in item.keywords and item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(seconds + 600))
        return
    skip = pytest.mark.skip(reason="soak test: run with --soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def broker_factory(tmp_path_factory) -> Iterator[Callable[..., BrokerProcess]]:
    """Start extra brokers: ``broker_factory(extra_args=["--auto-create-topics"])``.

    Every broker started through it is stopped at teardown.
    """
    started: list[BrokerProcess] = []

    def make(**kwargs: Any) -> BrokerProcess:
        kwargs.setdefault("data_dir", tmp_path_factory.mktemp("broker") / "data")
        b = BrokerProcess(**kwargs)
        started.append(b)
        return b.start()

    yield make
    for b in started:
        b.close()


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    """A started single-node ``logmq-server`` subprocess on 127.0.0.1 with a temp data dir."""
    return broker_factory()


@pytest.fixture
async def inproc_broker(tmp_path) -> AsyncIterator[Any]:
    """A logmq.broker.Broker running in the test's event loop (``.port`` is its port)."""
    async with inprocess_broker(tmp_path / "data") as b:
        yield b


@pytest.fixture
def sendfile_calls(monkeypatch) -> list[int]:
    """``os.sendfile`` still sends, and each call's byte count is recorded here: the
    zero-copy tests prove from it which bytes left by sendfile (or that none did)."""
    sent: list[int] = []
    real_sendfile = os.sendfile

    def counting_sendfile(out_fd, in_fd, offset, count):
        n = real_sendfile(out_fd, in_fd, offset, count)
        sent.append(n)
        return n

    monkeypatch.setattr(os, "sendfile", counting_sendfile)
    return sent
