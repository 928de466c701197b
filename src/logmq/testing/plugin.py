"""pytest fixtures for a real Kafka-compatible broker (docs/testing-with-logmq.md).

pytest loads this module in every project that installs logmq (the ``pytest11`` entry
point). Loading it only defines fixtures and one ini option: no broker starts unless a
test asks for one, so a suite that uses none pays nothing.

- ``logmq_broker``: one broker for the whole session (about half a second to start).
- ``logmq_cluster``: three brokers forming one cluster, for the whole session.
- ``logmq_secure_broker``: one broker with a SASL_SSL listener (SCRAM-SHA-512, user
  ``test``/``test-secret``, a throwaway CA) for the whole session: ``.client_config()``.
- ``logmq_topic``: a new, uniquely named one-partition topic on ``logmq_broker``, per test.

Session scope because a broker is cheap to share and tests isolate themselves by name:
topics, committed offsets and groups stay for the rest of the session, so give each test
its own topic (``logmq_topic``) and group ids. A test that needs a broker of its own uses
``LogmqBroker`` directly. Extra ``logmq-server`` arguments for every broker fixture go in
the ``logmq_server_args`` ini option, e.g. ``logmq_server_args = --no-auto-create-topics``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import pytest

from logmq.testing import LogmqBroker

_topic_numbers = itertools.count(1)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "logmq_server_args",
        "extra logmq-server arguments for the logmq_broker, logmq_cluster and "
        "logmq_secure_broker fixtures",
        type="args",
        default=[],
    )


@pytest.fixture(scope="session")
def logmq_broker(pytestconfig: pytest.Config) -> Iterator[LogmqBroker]:
    """A single logmq broker shared by the session: ``.bootstrap_servers`` for Kafka
    clients, ``.create_topic(...)``. Stopped and removed at the end of the session."""
    with LogmqBroker(server_args=pytestconfig.getini("logmq_server_args")) as broker:
        yield broker


@pytest.fixture(scope="session")
def logmq_cluster(pytestconfig: pytest.Config) -> Iterator[LogmqBroker]:
    """Three logmq brokers in one cluster, shared by the session; topics with
    ``replication_factor=3`` are replicated on all of them."""
    with LogmqBroker(3, server_args=pytestconfig.getini("logmq_server_args")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def logmq_secure_broker(pytestconfig: pytest.Config) -> Iterator[LogmqBroker]:
    """A single broker whose secured listener takes SASL_SSL with SCRAM-SHA-512, shared by
    the session: ``Producer(logmq_secure_broker.client_config())`` for confluent-kafka,
    ``KafkaProducer(**logmq_secure_broker.kafka_python_config())`` for kafka-python. One
    user, ``test`` (password ``test-secret``); TLS with a CA made for the session
    (``.ca_path``). ``.bootstrap_servers`` is its PLAINTEXT listener."""
    with LogmqBroker(
        server_args=pytestconfig.getini("logmq_server_args"),
        security="SASL_SSL",
        mechanism="SCRAM-SHA-512",
    ) as broker:
        yield broker


@pytest.fixture
def logmq_topic(logmq_broker: LogmqBroker, request: pytest.FixtureRequest) -> str:
    """The name of a new one-partition topic on ``logmq_broker``, made from the test's
    name, so tests sharing the broker never read each other's records."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name).strip("-.")[:150]
    return logmq_broker.create_topic(f"{stem or 'topic'}-{next(_topic_numbers)}")
