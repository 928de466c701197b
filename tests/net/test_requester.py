"""Whose request a controller change is: the client's connection, or the client a
broker names for it (``on_behalf_of``), never a name a client gives itself."""

from __future__ import annotations

import pytest

from logmq.errors import ErrorCode, LogMQError
from logmq.net.pipeline import ConnectionContext
from logmq.net.requester import ON_BEHALF_OF, on_behalf_of, requester

ALICE = ConnectionContext("10.0.0.7:51234", "10.0.0.7", "SASL_SSL", "User:alice")
BROKER = ConnectionContext("10.0.0.2:40000", "10.0.0.2", "NATIVE", "User:broker")


def test_a_clients_own_request_is_its_connections_whatever_it_claims():
    body = {ON_BEHALF_OF: on_behalf_of(BROKER)}
    assert requester(ALICE, body) is ALICE


def test_a_forwarded_request_is_the_client_the_broker_names():
    body = {"forwarded_by": 2, ON_BEHALF_OF: on_behalf_of(ALICE)}
    assert requester(BROKER, body) == ALICE
    # run by the controller's own broker (no connection) for a client of its Kafka door
    assert requester(None, {ON_BEHALF_OF: on_behalf_of(ALICE)}) == ALICE


def test_a_brokers_own_change_is_the_broker():
    assert requester(None, {}) is None
    assert requester(BROKER, {"forwarded_by": 2}) is BROKER


@pytest.mark.parametrize(
    "bad", ["alice", {"principal": "User:alice"}, {**on_behalf_of(ALICE), "peer": 1}]
)
def test_a_malformed_identity_is_refused(bad):
    with pytest.raises(LogMQError) as e:
        requester(BROKER, {"forwarded_by": 2, ON_BEHALF_OF: bad})
    assert e.value.code is ErrorCode.INVALID_REQUEST
