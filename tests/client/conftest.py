"""Fixtures for client tests: one broker per module, fresh topics per test."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.harness import BrokerProcess

_names = itertools.count()


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    """A broker shared by a module's tests (each test uses its own topics)."""
    b = BrokerProcess(tmp_path_factory.mktemp("client-broker") / "data")
    b.start()
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def topic_name(request) -> str:
    return f"{request.node.name[:60].replace('[', '_').replace(']', '')}-{next(_names)}"
