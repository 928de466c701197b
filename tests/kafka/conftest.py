"""One real broker per test module, with its Kafka listener on a free port."""

from __future__ import annotations

import pytest

from tests.harness import BrokerProcess


@pytest.fixture(scope="module")
def kbroker(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("kafka") / "data")
    broker.start()
    yield broker
    broker.stop()
