"""Reaching a cluster: a wrong or dead bootstrap fails fast, a known cluster is retried.

Before a broker has answered, nothing says the addresses are right, so a client must say
so at once (BootstrapError, naming every address) instead of retrying silently until
its request timeout. The request timeouts here are 10 minutes: a test that finishes at
all (each has a pytest timeout far below that) shows nothing waited for them.
"""

from __future__ import annotations

import asyncio

import pytest

from logmq import Admin, Consumer, Producer
from logmq.client import AsyncAdmin
from logmq.client.cluster import ClusterClient
from logmq.errors import BootstrapError
from tests.harness import free_port

PATIENT = 600_000  # ms: a request timeout no test here may wait for


@pytest.mark.timeout(60)
@pytest.mark.parametrize("client", [Admin, Producer, Consumer], ids=lambda c: c.__name__)
def test_a_blocking_client_fails_at_once_on_a_closed_port(client):
    port = free_port()
    with pytest.raises(BootstrapError) as info:
        client(f"127.0.0.1:{port}", request_timeout_ms=PATIENT)
    assert f"127.0.0.1:{port}" in str(info.value)
    assert "Connection refused" in str(info.value)


@pytest.mark.timeout(60)
async def test_every_bootstrap_address_is_tried_and_named():
    ports = [free_port(), free_port()]
    bootstrap = ",".join(f"127.0.0.1:{p}" for p in ports)
    with pytest.raises(BootstrapError) as info:
        async with AsyncAdmin(bootstrap, request_timeout_ms=PATIENT):
            pass
    for p in ports:
        assert f"127.0.0.1:{p}" in str(info.value)


@pytest.mark.timeout(60)
async def test_a_closed_address_before_a_live_one_is_skipped(shared_broker):
    bootstrap = f"127.0.0.1:{free_port()},{shared_broker.bootstrap}"
    async with AsyncAdmin(bootstrap, request_timeout_ms=PATIENT) as admin:
        assert isinstance(await admin.list_topics(), list)


@pytest.mark.timeout(60)
async def test_a_silent_address_holds_up_neither_the_next_nor_the_verdict(
    shared_broker, monkeypatch
):
    """An address that never answers the connect (a host that is down) costs the
    stagger, not the connect timeout; if it is the only one, the bootstrap timeout."""
    real_open = ClusterClient._open

    async def open_or_hang(self, host, port, node_id):
        if host == "192.0.2.1":  # TEST-NET-1: stands for an unreachable host
            await asyncio.Event().wait()
        return await real_open(self, host, port, node_id)

    monkeypatch.setattr(ClusterClient, "_open", open_or_hang)
    client = ClusterClient(f"192.0.2.1:9092,{shared_broker.bootstrap}", request_timeout_ms=PATIENT)
    try:
        md = await client.refresh_metadata()
        assert md.brokers
    finally:
        await client.close()

    client = ClusterClient("192.0.2.1:9092", request_timeout_ms=PATIENT, bootstrap_timeout_ms=300)
    try:
        with pytest.raises(BootstrapError, match=r"192\.0\.2\.1:9092: timed out"):
            await client.refresh_metadata()
    finally:
        await client.close()


@pytest.mark.timeout(120)
async def test_a_known_cluster_is_still_retried_while_its_broker_restarts(broker):
    async with AsyncAdmin(broker.bootstrap, request_timeout_ms=60_000) as admin:
        await admin.create_topic("kept")
        broker.stop()
        listing = asyncio.create_task(admin.list_topics())
        await asyncio.to_thread(broker.restart)
        assert "kept" in await listing
